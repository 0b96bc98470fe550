// LayerNorm over the last dimension with a weight and a bias: LibTorch's on the CPU, and on a GPU
// Kuafu's kernels (layer_norm_cuda.cu) where they take the shape and runtime.fused_layer_norm is on:
// one warp per row forward; backward, dx per row and each warp's running sums of the weight and bias
// gradients in one pass, where LibTorch reduces those columns in a separate, slower kernel.
#pragma once

#include <cstdint>

namespace kuafu::ops {

torch::Tensor layer_norm(const torch::Tensor& x,       // [..., C]
                         const torch::Tensor& weight,  // [C]
                         const torch::Tensor& bias,    // [C]
                         double eps);

// Whether `layer_norm` would take the GPU kernels for x (whatever runtime.fused_layer_norm says).
bool layer_norm_kernel_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace kuafu::ops
