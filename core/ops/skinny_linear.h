// Linear layers of a few rows on the CPU (decoding: one new token per row of a batch), y = x wᵀ + b with w
// [out, in]. BLAS packs the whole weight matrix on every call, so for a handful of rows it reads and writes
// the weights twice more than the product needs; this streams each weight row once, dotting it with every
// input row while they sit in L1 (AVX2 + FMA, a scalar path elsewhere). At 8 rows, OPT-125m's and OPT-1.3b's
// layers take 2.1-3.7x less time than through OpenBLAS (build/benchmarks/skinny_linear_benchmark, 2026-12-01).
#pragma once

namespace kuafu::ops {

constexpr int64_t kSkinnyRowsMax = 32;  // rows up to which it is taken: 1.1-1.4x BLAS at 32, even at 64

// Whether skinny_linear serves this call: switched on (runtime.skinny_linear, fused_kernels.h), float32 on
// the CPU, contiguous weight [out, in] (and bias [out]), at most kSkinnyRowsMax rows of `in` features, under
// no_grad (it has no backward; a training step's frozen layers keep BLAS, so their results stay its own).
bool skinny_linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// x [..., in] · weightᵀ (+ bias) -> [..., out]. `vector`: the AVX2 path where the CPU has it (false: scalar,
// for tests).
torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, bool vector = true);

}  // namespace kuafu::ops
