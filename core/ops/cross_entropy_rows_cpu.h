// The row pass of the fused cross-entropy on the CPU, float32 (bfloat16 through float32 rows): each row's
// max, its sum of exponentials and (when asked) its gradient in three passes over the row while it sits in
// the core's cache, with one exponential per value. LibTorch's operations take about seven passes over the
// whole chunk, each out of cache (logsumexp's, then the softmax's exp again). linear_cross_entropy.cpp calls it.
#pragma once

#include <cstdint>

#include "core/util/cpu_features.h"

namespace kuafu::ops::cpu {

// The same contract as cuda::cross_entropy_rows: for each of `rows` rows of `logits` (`row_stride` floats
// apart, the first `columns` valid, the rest padding): loss[r] = logsumexp(row) - row[target[r]], or 0
// where target[r] == ignored. With `write_gradient` the row becomes (softmax(row) - onehot(target[r])) *
// scale[r] over the valid columns and 0 over the padding. Sums of exponentials are taken in float64.
// Throws kuafu::Error naming the row of a target outside [0, columns) that is not `ignored`.
void cross_entropy_rows(float* logits, int64_t rows, int64_t row_stride, int64_t columns, const int64_t* targets,
                        int64_t ignored, const float* scale, float* loss, bool write_gradient,
                        CpuPath path = CpuPath::kBest);

// The same for bfloat16 logits (their 16 bits, c10::BFloat16's layout; `row_stride` values apart): each row is
// widened to float32 into a buffer, passed as above, and its gradient rounded back to nearest even as
// LibTorch's copy to bfloat16 rounds. The loss is float32. Where LibTorch's operations would make a float32
// copy of the whole chunk and pass over it about seven times, this reads and writes each row once.
void cross_entropy_rows_bf16(uint16_t* logits, int64_t rows, int64_t row_stride, int64_t columns, const int64_t* targets,
                             int64_t ignored, const float* scale, float* loss, bool write_gradient,
                             CpuPath path = CpuPath::kBest);

}  // namespace kuafu::ops::cpu
