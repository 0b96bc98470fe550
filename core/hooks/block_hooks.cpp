#include "core/hooks/block_hooks.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "core/util/error.h"

namespace kuafu::hooks {
namespace {

using torch::autograd::variable_list;

// One node in the backward graph joining several tensors: autograd runs it once, when the gradients of
// all of them have arrived, so a hook on it fires once per backward however many tensors cross the
// boundary. Gradients pass through unchanged.
class BoundaryBackward : public torch::autograd::Node {
 public:
  explicit BoundaryBackward(std::function<void()> on_backward) : on_backward_(std::move(on_backward)) {}
  variable_list apply(variable_list&& grads) override {
    on_backward_();
    return std::move(grads);
  }

 private:
  std::function<void()> on_backward_;
};

// The tensors of `tensors` that need gradients, replaced by aliases whose backward goes through one
// BoundaryBackward running `on_backward`; the others as they are.
Tensors through_boundary(const Tensors& tensors, std::function<void()> on_backward) {
  std::vector<torch::Tensor> crossing;
  for (const auto& t : tensors) {
    if (needs_grad(t)) crossing.push_back(t);
  }
  if (crossing.empty()) return tensors;
  auto node = std::make_shared<BoundaryBackward>(std::move(on_backward));
  node->set_next_edges(torch::autograd::collect_next_edges(crossing));
  Tensors out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!needs_grad(t)) {
      out.push_back(t);
      continue;
    }
    torch::Tensor alias = t.detach();  // shares the storage; its history is the boundary's
    torch::autograd::set_history(alias, node);
    out.push_back(alias);
  }
  return out;
}

}  // namespace

Tensors run_block(BlockHooks* hooks, const BlockCall& call, const Tensors& inputs, const BlockBody& body) {
  if (!hooks) return body(inputs);
  const bool track = torch::GradMode::is_enabled();
  // The inputs' boundary runs before the previous block's pre_backward (it sits between them in the
  // graph): this block lets go of its chunks before the next one gathers.
  const Tensors in = track ? through_boundary(inputs, [hooks, call] { hooks->post_backward(call); }) : inputs;
  hooks->pre_forward(call);
  Tensors out = body(in);
  hooks->post_forward(call);
  return track ? through_boundary(out, [hooks, call] { hooks->pre_backward(call); }) : out;
}

torch::Tensor run_block(BlockHooks* hooks, const BlockCall& call, const torch::Tensor& input, const TensorBody& body) {
  return run_block(hooks, call, Tensors{input}, as_block_body(body)).front();
}

BlockBody as_block_body(TensorBody body) {
  return [body = std::move(body)](const Tensors& inputs) {
    KUAFU_CHECK(inputs.size() == 1, "a one-tensor block got ", inputs.size(), " tensors");
    return Tensors{body(inputs.front())};
  };
}

}  // namespace kuafu::hooks
