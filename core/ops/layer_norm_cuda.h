// LayerNorm over rows on a GPU, forward and backward, as kernels with plain C++ signatures (the .cu file
// includes no LibTorch header). layer_norm.cpp calls them.
#pragma once

#include <cstdint>

#include "core/ops/cuda_row_type.h"

namespace kuafu::ops::cuda {

// Whether the kernels take rows of `columns` elements of `type`: 16-byte loads by 32 lanes a warp, at
// most 64 values a lane (columns a multiple of 256 for bf16/fp16, 128 for float32; up to 2,048).
bool layer_norm_takes(RowType type, int64_t columns);

// y = (x - mean) * rstd * gamma + beta per row of x [rows, columns]; mean and rstd [rows] in float32.
bool layer_norm_forward(RowType type, const void* x, const void* gamma, const void* beta, void* y, float* mean,
                        float* rstd, int64_t rows, int64_t columns, float eps, void* stream);

// dx [rows, columns], and each of `partial_rows` warps' sums of dy * xhat and dy into
// partials [2, partial_rows, columns] (float32; the caller sums them over the warps for dgamma, dbeta).
bool layer_norm_backward(RowType type, const void* dy, const void* x, const float* mean, const float* rstd,
                         const void* gamma, void* dx, float* partials, int64_t partial_rows, int64_t rows,
                         int64_t columns, void* stream);

// The number of warps (partial rows) layer_norm_backward runs for `rows` rows.
int64_t layer_norm_backward_warps(int64_t rows);

}  // namespace kuafu::ops::cuda
