// AlphaFold 2's training loss (supplement 1.9, Algorithm 2 line 23 and 1.11's weights): the structure
// module's losses, the distogram, masked MSA and pLDDT losses; and lDDT, which pLDDT learns. Maths only.
#pragma once

#include <torch/types.h>

#include "apps/fastfold/alphafold_model.h"
#include "apps/fastfold/structure_losses.h"

namespace kuafu::fold {

// What the whole model is trained against, beside the structure labels.
struct AlphaFoldLabels {
  StructureLabels structure;
  torch::Tensor positions, mask;          // [R, 37, 3], [R, 37]: the truth's atoms (lDDT of CA)
  torch::Tensor pseudo_beta, pseudo_beta_mask;  // [R, 3], [R]
  torch::Tensor true_msa;                 // [S, R] int64: the cluster rows before BERT masking
  torch::Tensor bert_mask;                // [S, R]: 1 where a position was masked
  torch::Tensor residue_index;            // [R] int64, the feature's: the violation loss checks peptide bonds
                                          //   only between residues numbered one after the other
  double resolution = 0.0;                // Å; pLDDT is trained on structures from 0.1 to 3 Å only
  torch::Tensor recorded_atoms;           // [37] 0/1: the atom types the source records (undefined: all, as
                                          //   AlphaFold's full-atom files; a backbone-only database chain records
                                          //   N, CA, C and O): an atom it never records is not "unresolved"

  AlphaFoldLabels to(const torch::TensorOptions& options) const;  // the floating labels in its dtype
};

struct AlphaFoldLoss {
  torch::Tensor total;
  torch::Tensor distogram, masked_msa, plddt;
  torch::Tensor violation;  // [] where settings.violation_weight > 0, else undefined
  torch::Tensor experimentally_resolved;  // [] where the outputs have the head's logits, else undefined
  StructureLoss structure;
};

AlphaFoldLoss alphafold_loss(const AlphaFoldOutputs& out, const AlphaFoldLabels& labels, const ResidueGeometry& geometry,
                             const AlphaFoldSizes& sizes, const AlphaFoldLossSettings& settings);

// 1.9.10: the sigmoid cross-entropy of each atom's resolved logit against whether the truth has the atom, over
// the atoms the residue's type has and the source records, averaged. logits [R, 37] -> [].
torch::Tensor experimentally_resolved_loss(const torch::Tensor& logits, const AlphaFoldLabels& labels, const ResidueGeometry& geometry);

// lDDT (Mariani et al. 2013) of points without stereochemistry checks, as alphafold.model.lddt computes it:
// distances under `cutoff` in the truth, the fraction within 0.5, 1, 2 and 4 Å of the true distance.
// predicted, truth [B, N, 3], mask [B, N, 1] -> [B, N] per residue, or [B].
torch::Tensor lddt(const torch::Tensor& predicted, const torch::Tensor& truth, const torch::Tensor& mask,
                   double cutoff = 15.0, bool per_residue = false);

}  // namespace kuafu::fold
