// GPT-2's tanh GELU ("gelu_new"): on the CPU in float32 and bfloat16 through Kuafu's kernels
// (ops/gelu_tanh_cpu.h, one exponential per value where LibTorch's takes a tanh) while runtime.fused_gelu is
// on; elsewhere LibTorch's torch::gelu(x, "tanh"). The kernel's backward is not itself differentiable (no
// double backward).
#pragma once

#include <torch/torch.h>

namespace kuafu::ops {

torch::Tensor gelu_tanh(const torch::Tensor& x);

// Whether `gelu_tanh` would take Kuafu's CPU kernels for x (whatever runtime.fused_gelu says).
bool gelu_tanh_kernel_takes(const torch::Tensor& x);

}  // namespace kuafu::ops
