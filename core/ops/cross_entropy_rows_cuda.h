// The row pass of a fused cross-entropy on a GPU, as one kernel with a plain C++ signature (the .cu file
// includes no LibTorch header, so nvcc compiles it in seconds). linear_cross_entropy.cpp calls it.
#pragma once

#include <cstdint>

#include "core/ops/cuda_row_type.h"

namespace kuafu::ops::cuda {

// For each of `rows` rows of `logits` (`row_stride` elements apart, the first `columns` of each valid,
// the rest padding): loss[r] = logsumexp(row) - row[target[r]], or 0 where target[r] == ignored. With
// `write_gradient`, the row is overwritten in place by (softmax(row) - onehot(target[r])) * scale[r]
// over the valid columns and 0 over the padding. Softmax and loss are computed in float32.
// Needs logits 16-byte aligned and row_stride * element size a multiple of 16 (the caller pads).
// Runs on `stream` (a cudaStream_t); returns false if the launch failed.
bool cross_entropy_rows(void* logits, RowType type, int64_t rows, int64_t row_stride, int64_t columns,
                        const int64_t* targets, int64_t ignored, const float* scale, float* loss, bool write_gradient,
                        void* stream);

}  // namespace kuafu::ops::cuda
