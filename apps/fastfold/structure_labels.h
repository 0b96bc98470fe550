// From a chain's true atoms (atom37 layout) to what the structure losses compare against, as AlphaFold's
// data pipeline makes it (all_atom.atom37_to_frames, atom37_to_torsion_angles, the atom14 truth and its
// renamed twin, pseudo-beta). Maths only; the atoms come from the readers (pdb_file, mmcif_file,
// structure_db).
#pragma once

#include <torch/types.h>

#include "apps/fastfold/residue_geometry.h"
#include "apps/fastfold/rigid.h"
#include "apps/fastfold/structure_losses.h"

namespace kuafu::fold {

// Every rigid group's true frame [R, 8], and its twin with the last chi group of a symmetric side chain
// turned by π; `exists` where the group's three atoms are all present.
struct TrueFrames {
  Rigid frames, alt_frames;       // [R, 8]
  torch::Tensor exists;           // [R, 8]
  torch::Tensor group_exists;     // [R, 8] the type has the group
  torch::Tensor ambiguous;        // [R, 8]
};
TrueFrames true_frames(const ResidueGeometry& geometry, const torch::Tensor& aatype, const torch::Tensor& positions,
                       const torch::Tensor& mask);

// The seven torsions (ω, φ, ψ, χ1..χ4) as unit (sin, cos) [R, 7, 2], the twin of a π-periodic chi, and
// where all four atoms (the previous residue's for ω and φ) are present [R, 7].
struct TrueTorsions {
  torch::Tensor sin_cos, alt_sin_cos;  // [R, 7, 2]
  torch::Tensor mask;                  // [R, 7]
};
TrueTorsions true_torsions(const ResidueGeometry& geometry, const torch::Tensor& aatype, const torch::Tensor& positions,
                           const torch::Tensor& mask);

// CB, or CA for glycine, [R, 3], and whether it is present [R].
std::pair<torch::Tensor, torch::Tensor> pseudo_beta(const torch::Tensor& aatype, const torch::Tensor& positions,
                                                    const torch::Tensor& mask);

// The structure losses' labels: aatype [R] int64, positions [R, 37, 3] Å, mask [R, 37] (1 where an atom is
// present), residue_mask [R] (0 for padding).
StructureLabels structure_labels(const ResidueGeometry& geometry, const torch::Tensor& aatype,
                                 const torch::Tensor& positions, const torch::Tensor& mask,
                                 const torch::Tensor& residue_mask, double clamped_fape_fraction);

}  // namespace kuafu::fold
