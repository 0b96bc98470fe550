// The language-model loss fused with its output layer: the mean cross-entropy of logits = hidden Wᵀ,
// computed in chunks of rows so that the logits [N, V] are never whole and their float32 copy never
// exists, with the gradients of hidden and W formed chunk by chunk during the forward (the loss ends the
// graph, so backward only scales them). On a GPU each chunk's softmax, loss and gradient are one kernel
// over the bfloat16 logits (cross_entropy_rows_cuda.cu), and W's rows are padded to a multiple of 64 for
// the matrix products (GPT-2's 50,257 rows make every product unaligned). On the CPU float32 and bfloat16
// rows take one pass each (cross_entropy_rows_cpu.h).
#pragma once

#include <cstdint>

namespace kuafu::ops {

struct LinearCrossEntropyOptions {
  int64_t chunk_bytes = 0;     // float32 logits per chunk of rows; 0: the device's default
  int64_t vocab_multiple = 0;  // pad W's rows for the products to a multiple of this; 0: 64 on a GPU, 1 on the CPU
};

// mean over the learned rows of cross_entropy(float(hidden Wᵀ), targets), as
// F::cross_entropy(matmul(hidden, W.t()).to(float32), targets, ignore_index = ignored) / learned count
// computes it (0, with zero gradients, where no row is learned). Returns float32 (float64 for float64
// inputs). float16 inputs take that unfused formula: their gradients would underflow before the loss
// scale reaches them.
torch::Tensor linear_cross_entropy(const torch::Tensor& hidden,   // [N, C]
                                   const torch::Tensor& weight,   // [V, C]
                                   const torch::Tensor& targets,  // [N] int64
                                   int64_t ignored, const LinearCrossEntropyOptions& options = {});

// The mean cross-entropy of logits [N, V] over the rows whose target is not `ignored`: a sum, then divided
// by their count (0, with zero gradients, where none is learned; torch's mean would be 0/0).
torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t ignored);

// The same loss through the unfused formula above (the reference the fused path is tested against).
torch::Tensor plain_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                         const torch::Tensor& targets, int64_t ignored);

}  // namespace kuafu::ops
