#include "core/memory/activation_checkpoint.h"

#include <set>

#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "core/util/device.h"
#include "core/util/error.h"

namespace kuafu::memory {
namespace {

using torch::autograd::variable_list;

// The backward of a checkpointed block: recompute, then backpropagate through the recomputed graph
// (a backward inside a backward, as PyTorch's reentrant checkpoint does).
class RecomputeBackward : public torch::autograd::Node {
 public:
  // `tracked`: the indices of the outputs whose history is this node, in the order of its gradients.
  RecomputeBackward(hooks::BlockBody body, hooks::Tensors inputs, std::vector<size_t> tracked, torch::Tensor rng_state,
                    torch::Device device)
      : body_(std::move(body)),
        inputs_(std::move(inputs)),
        tracked_(std::move(tracked)),
        rng_state_(std::move(rng_state)),
        device_(device) {}

  variable_list apply(variable_list&& grads) override {
    KUAFU_CHECK(!done_, "a checkpointed block ran backward twice (retain_graph is not supported)");
    hooks::Tensors x;
    x.reserve(inputs_.size());
    for (const auto& input : inputs_) {
      if (!input.defined()) {
        x.emplace_back();
        continue;
      }
      torch::Tensor leaf = input.detach();
      if (input.requires_grad()) leaf.requires_grad_(true);
      x.push_back(leaf);
    }
    hooks::Tensors y;
    {
      // Replay the forward's random draws, then put the generator back where backward found it.
      const torch::Tensor now = generator_state(device_);
      set_generator_state(device_, rng_state_);
      torch::AutoGradMode enable(true);
      y = body_(x);
      set_generator_state(device_, now);
    }
    KUAFU_CHECK(y.size() > tracked_.back(), "a checkpointed block returned fewer tensors when recomputed");
    variable_list roots, root_grads;
    for (size_t k = 0; k < tracked_.size(); ++k) {
      const torch::Tensor& out = y[tracked_[k]];
      if (!grads[k].defined() || !hooks::needs_grad(out)) continue;  // an output nothing used
      roots.push_back(out);
      root_grads.push_back(grads[k]);
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    done_ = true;
    inputs_.clear();  // the saved inputs go with the step
    variable_list input_grads;
    for (const auto& leaf : x) input_grads.push_back(hooks::needs_grad(leaf) ? leaf.grad() : torch::Tensor());
    return input_grads;
  }

 private:
  hooks::BlockBody body_;
  hooks::Tensors inputs_;
  std::vector<size_t> tracked_;
  torch::Tensor rng_state_;
  torch::Device device_;
  bool done_ = false;
};

torch::Device device_of(const hooks::Tensors& inputs) {
  for (const auto& t : inputs) {
    if (t.defined()) return t.device();
  }
  return torch::kCPU;
}

}  // namespace

hooks::Tensors checkpointed(const hooks::Tensors& inputs, hooks::BlockBody body) {
  if (!torch::GradMode::is_enabled()) return body(inputs);
  const torch::Device device = device_of(inputs);
  torch::Tensor rng_state = generator_state(device);
  hooks::Tensors y;
  {
    torch::NoGradGuard no_grad;
    y = body(inputs);
  }
  std::vector<size_t> tracked;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!y[i].defined() || !y[i].is_floating_point()) continue;
    // An input returned as it is keeps its own history: its alias gets the node's.
    for (const auto& input : inputs) {
      if (input.defined() && input.unsafeGetTensorImpl() == y[i].unsafeGetTensorImpl()) y[i] = y[i].detach();
    }
    tracked.push_back(i);
  }
  // Every floating output gets the node's history, even when no input needs a gradient: the block's
  // parameters may (the first block after token ids).
  if (tracked.empty()) return y;
  auto node = std::make_shared<RecomputeBackward>(std::move(body), inputs, tracked, std::move(rng_state), device);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  for (size_t i : tracked) torch::autograd::set_history(y[i], node);
  return y;
}

torch::Tensor checkpointed(const torch::Tensor& input, hooks::TensorBody body) {
  return checkpointed(hooks::Tensors{input}, hooks::as_block_body(std::move(body))).front();
}

void checkpoint_blocks(hooks::BlockSites& sites, const std::vector<std::string>& patterns) {
  std::set<std::string> chosen;
  for (const auto& pattern : patterns) {
    for (const auto& name : sites.matching(pattern)) chosen.insert(name);
  }
  for (const auto& name : sites.names()) {
    if (!chosen.count(name)) continue;
    sites.wrap(name, [](const hooks::BlockCall&, const hooks::Tensors& inputs, const hooks::BlockBody& next) {
      return checkpointed(inputs, next);
    });
  }
}

}  // namespace kuafu::memory
