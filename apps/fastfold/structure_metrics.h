// How close a predicted structure is to the truth, as structure prediction reports it: lDDT-Cα (no
// superposition; alphafold_losses.h's lddt), Cα RMSD after the least-squares superposition, TM-score and
// GDT-TS (each the best over a search of superpositions, as Zhang & Skolnick's TMscore program searches).
// Residues correspond by index; `mask` [N] marks those the truth has. Computed in float64 on the CPU.
#pragma once

#include <torch/types.h>

#include "apps/fastfold/rigid.h"

namespace kuafu::fold {

// The rigid motion taking `moving` [N, 3] closest to `target` [N, 3] in the least-squares sense over the
// points with weight > 0 (Kabsch, a proper rotation).
Rigid superposition(const torch::Tensor& moving, const torch::Tensor& target, const torch::Tensor& weights);

struct StructureScores {
  double lddt_ca = 0;  // [0, 1]
  double rmsd_ca = 0;  // Å, after superposing all marked Cα
  double tm_score = 0;  // [0, 1], normalised by the marked residues
  double gdt_ts = 0;    // [0, 1]: mean fraction within 1, 2, 4, 8 Å
  int64_t residues = 0;
};

// The Cα of an ideal α-helix of n residues [n, 3] (100° and 1.5 Å a residue on a 2.3 Å radius): the
// baseline a prediction should beat.
torch::Tensor ideal_helix_ca(int64_t n);

// predicted, truth [N, 3] Cα positions; mask [N].
StructureScores structure_scores(const torch::Tensor& predicted, const torch::Tensor& truth, const torch::Tensor& mask);

}  // namespace kuafu::fold
