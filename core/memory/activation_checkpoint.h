// Activation checkpointing (Chen et al., 2016): a block's forward runs without keeping its
// intermediate activations, and its backward first runs the forward again (with the same random
// draws, so dropout masks repeat) to get them. Memory per block falls to its inputs; compute grows by
// one forward.
#pragma once

#include <string>
#include <vector>

#include "core/hooks/block_sites.h"

namespace kuafu::memory {

// body(inputs) whose backward recomputes body from `inputs`. The parameters body uses receive their
// gradients during that recomputation's backward (their gradient hooks fire then, as usual). Every
// tensor the block differentiates through must be one of `inputs`: body may capture other values
// (flags, sizes, tensors that need no gradient), never a tensor that needs one. Outputs that need no
// gradient (ids, masks) pass as they are. Without gradient mode it is body(inputs).
hooks::Tensors checkpointed(const hooks::Tensors& inputs, hooks::BlockBody body);
// The one-tensor form.
torch::Tensor checkpointed(const torch::Tensor& input, hooks::TensorBody body);

// Activation checkpointing by module: every block of `sites` whose name matches one of `patterns`
// (globs such as "down_blocks.*") runs checkpointed. A pattern matching no block is an error.
void checkpoint_blocks(hooks::BlockSites& sites, const std::vector<std::string>& patterns);

}  // namespace kuafu::memory
