// A hook that runs each time autograd has accumulated one backward's gradient into a parameter's .grad:
// what data parallelism, ZeRO and Gemini start their gradient reductions from.
#pragma once

#include <functional>
#include <memory>

#include <torch/csrc/autograd/function.h>

namespace kuafu::nn {

// Adds `on_ready` as a post-hook of `param`'s AccumulateGrad node and returns that node: the hook fires
// only while the node lives, so keep it as long as the hook should.
std::shared_ptr<torch::autograd::Node> on_grad_accumulated(const torch::Tensor& param, std::function<void()> on_ready);

}  // namespace kuafu::nn
