// The element types the project's CUDA kernels take (their headers include no LibTorch header).
#pragma once

namespace kuafu::ops::cuda {

enum class RowType { kFloat32, kBFloat16, kFloat16 };

}  // namespace kuafu::ops::cuda
