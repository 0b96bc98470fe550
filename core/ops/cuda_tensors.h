// What the ops' .cpp files need to hand tensors to the project's CUDA kernels: the kernels' name for a
// tensor's element type, and the stream LibTorch runs the tensor's device on.
#pragma once

#ifdef KUAFU_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "core/ops/cuda_row_type.h"

namespace kuafu::ops::cuda {

// Whether the kernels take `type` (float32, bfloat16, float16).
inline bool has_row_type(torch::ScalarType type) {
  return type == torch::kFloat32 || type == torch::kBFloat16 || type == torch::kHalf;
}

inline RowType row_type(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat32 ? RowType::kFloat32
         : t.scalar_type() == torch::kBFloat16 ? RowType::kBFloat16
                                                : RowType::kFloat16;
}

inline void* stream_of(const torch::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

}  // namespace kuafu::ops::cuda
#endif
