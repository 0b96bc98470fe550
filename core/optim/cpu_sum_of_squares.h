// The sum of the squares of float32 values in host memory, accumulated in float64 without a float64 copy
// (LibTorch's norm with dtype = float64 first copies the tensor to float64: 128 ms for GPT-2's embedding
// gradient where reading it takes 7). The base of every CPU gradient norm (optim::squared_norm).
#pragma once

#include <cstdint>

#include "core/util/cpu_features.h"

namespace kuafu::optim {

// Each square is exact in float64; they are added in fixed blocks, in an order that depends on neither
// the thread count nor the path, so every call on the same values gives the same bits.
double cpu_sum_of_squares(const float* values, int64_t count, CpuPath path = CpuPath::kBest);

}  // namespace kuafu::optim
