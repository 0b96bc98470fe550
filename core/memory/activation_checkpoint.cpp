#include "core/memory/activation_checkpoint.h"

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
  RecomputeBackward(std::function<torch::Tensor(const torch::Tensor&)> body, torch::Tensor input,
                    torch::Tensor rng_state, torch::Device device)
      : body_(std::move(body)), input_(std::move(input)), rng_state_(std::move(rng_state)), device_(device) {}

  variable_list apply(variable_list&& grads) override {
    KUAFU_CHECK(input_.defined(), "a checkpointed block ran backward twice (retain_graph is not supported)");
    torch::Tensor x = input_.detach();
    const bool input_needs_grad = input_.requires_grad() && x.is_floating_point();
    if (input_needs_grad) x.requires_grad_(true);
    torch::Tensor y;
    {
      // Replay the forward's random draws, then put the generator back where backward found it.
      const torch::Tensor now = generator_state(device_);
      set_generator_state(device_, rng_state_);
      torch::AutoGradMode enable(true);
      y = body_(x);
      set_generator_state(device_, now);
    }
    torch::autograd::backward({y}, {grads[0]});
    input_ = torch::Tensor();  // the saved input goes with the step
    return {input_needs_grad ? x.grad() : torch::Tensor()};
  }

 private:
  std::function<torch::Tensor(const torch::Tensor&)> body_;
  torch::Tensor input_;
  torch::Tensor rng_state_;
  torch::Device device_;
};

}  // namespace

torch::Tensor checkpointed(const torch::Tensor& input, std::function<torch::Tensor(const torch::Tensor&)> body) {
  if (!torch::GradMode::is_enabled()) return body(input);
  const torch::Device device = input.device();
  torch::Tensor rng_state = generator_state(device);
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = body(input);
  }
  auto node = std::make_shared<RecomputeBackward>(std::move(body), input, std::move(rng_state), device);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace kuafu::memory
