// The residue tables as tensors indexed by aatype (AlphaFold's residue numbering, row 20 the unknown residue,
// which has no atoms), for placing atoms from frames (Algorithm 24) and for the losses' atom layouts.
#pragma once

#include <array>
#include <vector>

#include <torch/types.h>

#include "apps/fastfold/residue_types.h"
#include "apps/fastfold/rigid.h"

namespace kuafu::fold {

struct ResidueGeometry {
  Rigid default_frames;            // [21, 8]: each rigid group in its parent's frame at a zero torsion
  torch::Tensor atom14_group;      // [21, 14] int64: the rigid group of each atom14 slot
  torch::Tensor atom14_exists;     // [21, 14] 0/1
  torch::Tensor atom14_positions;  // [21, 14, 3]: each atom in its group's frame, Å
  torch::Tensor atom14_to_atom37;  // [21, 14] int64 (0 in empty slots)
  torch::Tensor atom37_to_atom14;  // [21, 37] int64 (0 in empty slots)
  torch::Tensor atom37_exists;     // [21, 37] 0/1
  torch::Tensor chi_exists;        // [21, 4] 0/1
  torch::Tensor chi_pi_periodic;   // [21, 4] 0/1: the angle is defined up to π
  torch::Tensor atom14_ambiguous;  // [21, 14] 0/1: one of a pair a symmetric side chain names either way
  torch::Tensor renaming;          // [21, 14, 14]: the permutation swapping those pairs (x_alt[j] = Σ_i x[i] P[i, j])
  // The truth's frames and torsions (AlphaFold's atom37_to_frames and atom37_to_torsion_angles):
  torch::Tensor chi_atoms;         // [21, 4, 4] int64: atom37 index of each chi angle's atoms (0 where none)
  torch::Tensor group_base_atoms;  // [21, 8, 3] int64: atom37 index of the atoms a group's frame is built on
                                   //   (behind the origin along x, the origin, in the xy plane); 0 for groups
                                   //   without atoms of their own (pre-omega, phi)
  torch::Tensor group_exists;      // [21, 8] 0/1: backbone, psi and the chi groups a type has
  torch::Tensor group_ambiguous;   // [21, 8] 0/1: the last chi group of a symmetric side chain (turned by π)

  // The floating tables in `options`' dtype and all on its device.
  ResidueGeometry to(const torch::TensorOptions& options) const;
};

// The tables of atoms placed in their groups (per residue type, atom14 order); default frames from them.
ResidueGeometry residue_geometry(const std::array<std::vector<GroupedAtom>, kResidueTypes>& grouped);

// A table's rows for each residue: table [21, ...], aatype [R] -> [R, ...].
torch::Tensor per_residue(const torch::Tensor& table, const torch::Tensor& aatype);

// Kuafu's tables, from the geometry measured in real structures (ideal_grouped_atoms): float32, CPU.
const ResidueGeometry& ideal_residue_geometry();

// Algorithm 24, lines 1-10: every rigid group's frame in the global frame, from each residue's backbone frame
// and its seven torsions (ω, φ, ψ, χ1..χ4) as (sin, cos). aatype [R] int64, backbone [R], sin_cos [R, 7, 2]
// -> [R, 8].
Rigid torsions_to_frames(const ResidueGeometry& geometry, const torch::Tensor& aatype, const Rigid& backbone,
                         const torch::Tensor& sin_cos);

// Algorithm 24, line 11: each atom14 position from its group's frame [R, 8] -> [R, 14, 3] (0 in empty slots).
torch::Tensor frames_to_atom14(const ResidueGeometry& geometry, const torch::Tensor& aatype, const Rigid& frames);

// Per-atom values between the two layouts: [R, 14, *] -> [R, 37, *] and back, 0 where a type has no atom.
torch::Tensor atom14_to_atom37(const ResidueGeometry& geometry, const torch::Tensor& aatype, const torch::Tensor& atom14);
torch::Tensor atom37_to_atom14(const ResidueGeometry& geometry, const torch::Tensor& aatype, const torch::Tensor& atom37);

}  // namespace kuafu::fold
