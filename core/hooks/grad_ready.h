// A hook that runs each time autograd has accumulated one backward's gradient into a parameter's .grad:
// what data parallelism, ZeRO and Gemini start their gradient reductions from. And Megatron's main_grad
// built on it: a float32 buffer that bf16/fp16 gradients are added into as they arrive.
#pragma once

#include <functional>
#include <memory>

#include <torch/csrc/autograd/function.h>

namespace kuafu::hooks {

// Adds `on_ready` as a post-hook of `param`'s AccumulateGrad node and returns that node: the hook fires
// only while the node lives, so keep it as long as the hook should.
std::shared_ptr<torch::autograd::Node> on_grad_accumulated(const torch::Tensor& param, std::function<void()> on_ready);

// From now on, each backward's gradient of `param` (in its own dtype, e.g. bf16) is added into `main_grad`
// (param's shape, e.g. float32) as soon as autograd has accumulated it, and .grad is dropped: nothing
// accumulates in the parameter's precision. Register it before the on_grad_accumulated hooks that expect
// the gradient in `main_grad` (hooks run in registration order). Returns the node, as on_grad_accumulated.
std::shared_ptr<torch::autograd::Node> accumulate_into_main_grad(const torch::Tensor& param, torch::Tensor main_grad);

// The gradient of `param` as training keeps it: its main gradient where accumulate_into_main_grad gave it
// one (and the node lives), else its .grad.
torch::Tensor grad_of(const torch::Tensor& param);

}  // namespace kuafu::hooks
