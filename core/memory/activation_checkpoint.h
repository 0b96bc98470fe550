// Activation checkpointing (Chen et al., 2016): a block's forward runs without keeping its
// intermediate activations, and its backward first runs the forward again (with the same random
// draws, so dropout masks repeat) to get them. Memory per block falls to its input; compute grows by
// one forward.
#pragma once

#include <functional>

#include <torch/types.h>

namespace kuafu::memory {

// body(input) whose backward recomputes body from `input`. The parameters body uses receive their
// gradients during that recomputation's backward (their gradient hooks fire then, as usual). Without
// gradient mode it is body(input).
torch::Tensor checkpointed(const torch::Tensor& input, std::function<torch::Tensor(const torch::Tensor&)> body);

}  // namespace kuafu::memory
