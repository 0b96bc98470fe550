// AlphaFold's matrix-product FLOPs (2 per multiply-add) worked out from its sizes and the example's shape:
// the numerator of kuafu-fold's MFU. LayerNorms, softmaxes, gates' elementwise products and the structure
// module's 3x3 rigid-body products are left out, as MFU counts leave them; AlphaFoldFlopsTest holds the
// count to the products LibTorch's profiler sees in a forward pass.
#pragma once

#include <cstdint>

#include "apps/fastfold/alphafold_model.h"

namespace kuafu::fold {

struct FoldShape {
  int64_t residues = 0;    // R
  int64_t msa_rows = 0;    // S: the clustered MSA's rows
  int64_t extra_rows = 0;  // E: the extra MSA's rows
};

// One Evoformer (or extra-MSA) block's forward on `rows` MSA rows of `residues` residues.
double evoformer_block_flops(const EvoformerSizes& sizes, int64_t rows, int64_t residues);
// One recycling iteration's forward: embedders, both stacks, the structure module and the heads.
double alphafold_iteration_flops(const AlphaFoldSizes& sizes, const FoldShape& shape);
// A training example's: `iterations` forward passes on average, the last with its backward (twice its
// forward, the usual count for matrix products).
double alphafold_training_flops(const AlphaFoldSizes& sizes, const FoldShape& shape, double iterations);

}  // namespace kuafu::fold
