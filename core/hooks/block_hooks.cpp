#include "core/hooks/block_hooks.h"

#include <torch/autograd.h>

namespace kuafu::hooks {

torch::Tensor run_block(BlockHooks* hooks, const BlockCall& call, const torch::Tensor& input,
                        const std::function<torch::Tensor(const torch::Tensor&)>& body) {
  if (!hooks) return body(input);
  const bool track = torch::GradMode::is_enabled();
  torch::Tensor x = input;
  if (track && input.requires_grad()) {
    // A view of its own, so this hook runs before the hooks on `input` (the previous block's
    // pre_backward): this block lets go of its chunks before the next one gathers.
    x = input.view_as(input);
    x.register_hook([hooks, call](const torch::Tensor&) { hooks->post_backward(call); });
  }
  hooks->pre_forward(call);
  torch::Tensor y = body(x);
  hooks->post_forward(call);
  if (track && y.requires_grad()) {
    y.register_hook([hooks, call](const torch::Tensor&) { hooks->pre_backward(call); });
  }
  return y;
}

}  // namespace kuafu::hooks
