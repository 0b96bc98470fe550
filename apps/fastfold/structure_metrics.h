// How close a predicted structure is to the truth, as structure prediction reports it: lDDT-Cα (no
// superposition; alphafold_losses.h's lddt), Cα RMSD after the least-squares superposition, TM-score and
// GDT-TS (each the best over a search of superpositions, as Zhang & Skolnick's TMscore program searches).
// Residues correspond by index; `mask` [N] marks those the truth has. Computed in float64 on the CPU.
#pragma once

#include <string>

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

// A backbone built from its dihedrals with ideal bond lengths and angles (Engh & Huber): phi, psi, omega
// [n] radians (phi of the first residue and psi, omega of the last unused) -> N, CA, C [n, 3, 3].
torch::Tensor backbone_from_dihedrals(const torch::Tensor& phi, const torch::Tensor& psi, const torch::Tensor& omega);

// The Cα [n, 3] of a chain that knows only each residue's DSSP state: every residue at its state's ideal
// dihedrals (helix H/G/I -57°/-47°, strand E/B -119°/113°, else polyproline II -75°/145°), trans peptides.
// The baseline beyond the helix: right local structure, no tertiary fold.
torch::Tensor secondary_structure_ca(const std::string& dssp);

// predicted, truth [N, 3] Cα positions; mask [N].
StructureScores structure_scores(const torch::Tensor& predicted, const torch::Tensor& truth, const torch::Tensor& mask);

}  // namespace kuafu::fold
