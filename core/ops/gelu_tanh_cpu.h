// GPT-2's tanh GELU on the CPU, float32 (bfloat16 through float32 blocks): gelu(x) = x/2 (1 + tanh(u)),
// u = √(2/π) (x + 0.044715 x³), taken as x σ(2u) = x / (1 + exp(-2u)), one exponential per value where
// LibTorch's kernel takes a tanh (three times slower on this machine: 4.9 against 1.6 ms for 2M values).
// Forward and backward, each one pass.
#pragma once

#include <cstdint>

#include "core/util/cpu_features.h"

namespace kuafu::ops::cpu {

// y[i] = gelu(x[i]) for i < count (y may be x).
void gelu_tanh(const float* x, float* y, int64_t count, CpuPath path = CpuPath::kBest);

// grad_x[i] = grad_y[i] gelu'(x[i]), with gelu'(x) = s + x s (1 - s) 2u', s = σ(2u) (grad_x may be grad_y).
void gelu_tanh_backward(const float* grad_y, const float* x, float* grad_x, int64_t count, CpuPath path = CpuPath::kBest);

// The same for bfloat16 values (their 16 bits, c10::BFloat16's layout): blocks widened to float32, computed as
// above and rounded once to nearest even, as LibTorch's bfloat16 GELU computes in float32 and rounds.
void gelu_tanh_bf16(const uint16_t* x, uint16_t* y, int64_t count, CpuPath path = CpuPath::kBest);
void gelu_tanh_backward_bf16(const uint16_t* grad_y, const uint16_t* x, uint16_t* grad_x, int64_t count,
                             CpuPath path = CpuPath::kBest);

}  // namespace kuafu::ops::cpu
