#include "apps/fastfold/structure_labels.h"

#include <torch/torch.h>

namespace kuafu::fold {
namespace {

// positions [R, 37, 3] picked per residue by atom37 index [R, *] -> [R, *, 3]; masks [R, 37] -> [R, *].
torch::Tensor pick_positions(const torch::Tensor& positions, const torch::Tensor& index) {
  const torch::Tensor flat = index.reshape({index.size(0), -1});                                   // [R, K]
  const torch::Tensor picked = positions.gather(1, flat.unsqueeze(-1).expand({-1, -1, 3}));        // [R, K, 3]
  std::vector<int64_t> shape(index.sizes().begin(), index.sizes().end());
  shape.push_back(3);
  return picked.reshape(shape);
}
torch::Tensor pick_mask(const torch::Tensor& mask, const torch::Tensor& index) {
  return mask.gather(1, index.reshape({index.size(0), -1})).reshape(index.sizes());
}

// Rotations [*, 3, 3] that turn by π about x where `turn` [*] is 1.
torch::Tensor half_turns(const torch::Tensor& turn) {
  const torch::Tensor sign = 1 - 2 * turn;
  const torch::Tensor one = torch::ones_like(turn), zero = torch::zeros_like(turn);
  return torch::stack({torch::stack({one, zero, zero}, -1), torch::stack({zero, sign, zero}, -1),
                       torch::stack({zero, zero, sign}, -1)}, -2);
}

}  // namespace

TrueFrames true_frames(const ResidueGeometry& geometry, const torch::Tensor& aatype, const torch::Tensor& positions,
                       const torch::Tensor& mask) {
  const torch::Tensor base = per_residue(geometry.group_base_atoms, aatype);  // [R, 8, 3]
  const torch::Tensor atoms = pick_positions(positions, base);         // [R, 8, 3, 3]
  Rigid frames = rigid_from_points(atoms.select(2, 0), atoms.select(2, 1), atoms.select(2, 2));
  // The backbone frame is built from C, CA, N with x pointing away from C: turning it by π about y gives
  // Algorithm 21's (x towards C, N in the xy plane).
  const torch::Tensor flip = torch::tensor({-1.0, 1.0, -1.0}, positions.options());
  frames.rotation = torch::cat({(frames.rotation.narrow(1, 0, 1) * flip), frames.rotation.narrow(1, 1, kRigidGroups - 1)}, 1);
  TrueFrames out;
  out.frames = frames;
  out.group_exists = per_residue(geometry.group_exists, aatype);
  out.exists = std::get<0>(pick_mask(mask, base).min(-1)) * out.group_exists;
  out.ambiguous = per_residue(geometry.group_ambiguous, aatype);
  out.alt_frames = {torch::matmul(frames.rotation, half_turns(out.ambiguous)), frames.translation};
  return out;
}

TrueTorsions true_torsions(const ResidueGeometry& geometry, const torch::Tensor& aatype, const torch::Tensor& positions,
                           const torch::Tensor& mask) {
  // atom37: N 0, CA 1, C 2, O 4. The residue before the first is missing (zeros).
  const torch::Tensor previous = torch::cat({torch::zeros_like(positions.narrow(0, 0, 1)), positions.narrow(0, 0, positions.size(0) - 1)});
  const torch::Tensor previous_mask = torch::cat({torch::zeros_like(mask.narrow(0, 0, 1)), mask.narrow(0, 0, mask.size(0) - 1)});
  const auto atom = [](const torch::Tensor& p, int64_t i) { return p.select(1, i); };  // [R, 3] or [R]
  const torch::Tensor omega = torch::stack({atom(previous, 1), atom(previous, 2), atom(positions, 0), atom(positions, 1)}, 1);
  const torch::Tensor phi = torch::stack({atom(previous, 2), atom(positions, 0), atom(positions, 1), atom(positions, 2)}, 1);
  const torch::Tensor psi = torch::stack({atom(positions, 0), atom(positions, 1), atom(positions, 2), atom(positions, 4)}, 1);
  const torch::Tensor chi_index = per_residue(geometry.chi_atoms, aatype);  // [R, 4, 4]
  const torch::Tensor chis = pick_positions(positions, chi_index);   // [R, 4, 4, 3]
  const torch::Tensor quads = torch::cat({omega.unsqueeze(1), phi.unsqueeze(1), psi.unsqueeze(1), chis}, 1);  // [R, 7, 4, 3]
  const torch::Tensor omega_mask = atom(previous_mask, 1) * atom(previous_mask, 2) * atom(mask, 0) * atom(mask, 1);
  const torch::Tensor phi_mask = atom(previous_mask, 2) * atom(mask, 0) * atom(mask, 1) * atom(mask, 2);
  const torch::Tensor psi_mask = atom(mask, 0) * atom(mask, 1) * atom(mask, 2) * atom(mask, 4);
  const torch::Tensor chi_mask = per_residue(geometry.chi_exists, aatype) * pick_mask(mask, chi_index).prod(-1);  // [R, 4]
  TrueTorsions out;
  out.mask = torch::cat({torch::stack({omega_mask, phi_mask, psi_mask}, -1), chi_mask}, -1);
  // The fourth atom in the frame of the other three (x along the axis): its z and y are sin and cos.
  const Rigid frames = rigid_from_points(quads.select(2, 1), quads.select(2, 2), quads.select(2, 0));  // [R, 7]
  const torch::Tensor fourth = frames.inverse().apply(quads.select(2, 3));                          // [R, 7, 3]
  torch::Tensor sin_cos = torch::stack({fourth.select(-1, 2), fourth.select(-1, 1)}, -1);
  sin_cos = sin_cos / torch::sqrt(sin_cos.square().sum(-1, true) + 1e-8);
  // ψ is measured to O, which lies opposite the next residue's N.
  sin_cos = sin_cos * torch::tensor({1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0}, sin_cos.options()).view({1, 7, 1});
  out.sin_cos = sin_cos;
  const torch::Tensor mirror =
      torch::cat({torch::ones({aatype.size(0), 3}, sin_cos.options()), 1 - 2 * per_residue(geometry.chi_pi_periodic, aatype)}, -1);
  out.alt_sin_cos = sin_cos * mirror.unsqueeze(-1);
  return out;
}

std::pair<torch::Tensor, torch::Tensor> pseudo_beta(const torch::Tensor& aatype, const torch::Tensor& positions,
                                                    const torch::Tensor& mask) {
  const torch::Tensor glycine = (aatype == residue_type_index('G'));  // [R]
  const int64_t ca = atom37_index("CA"), cb = atom37_index("CB");
  const torch::Tensor position = torch::where(glycine.unsqueeze(-1), positions.select(1, ca), positions.select(1, cb));
  const torch::Tensor present = torch::where(glycine, mask.select(1, ca), mask.select(1, cb));
  return {position, present};
}

StructureLabels structure_labels(const ResidueGeometry& geometry, const torch::Tensor& aatype,
                                 const torch::Tensor& positions, const torch::Tensor& mask,
                                 const torch::Tensor& residue_mask, double clamped_fape_fraction) {
  StructureLabels labels;
  labels.aatype = aatype;
  labels.residue_mask = residue_mask;
  labels.atom14_positions = atom37_to_atom14(geometry, aatype, positions);
  labels.atom14_exists = atom37_to_atom14(geometry, aatype, mask);
  const torch::Tensor renaming = per_residue(geometry.renaming, aatype);  // [R, 14, 14]
  labels.atom14_alt_exists = torch::einsum("ri,rij->rj", {labels.atom14_exists, renaming});
  labels.atom14_alt_positions =
      torch::einsum("ric,rij->rjc", {labels.atom14_positions, renaming}) * labels.atom14_alt_exists.unsqueeze(-1);
  labels.atom14_ambiguous = per_residue(geometry.atom14_ambiguous, aatype);
  labels.atom14_type_exists = per_residue(geometry.atom14_exists, aatype);
  const TrueFrames frames = true_frames(geometry, aatype, positions, mask);
  labels.group_frames = frames.frames;
  labels.alt_group_frames = frames.alt_frames;
  labels.group_exists = frames.exists;
  labels.backbone = {frames.frames.rotation.select(1, 0), frames.frames.translation.select(1, 0)};
  labels.backbone_mask = frames.exists.select(1, 0);
  const TrueTorsions torsions = true_torsions(geometry, aatype, positions, mask);
  const torch::Tensor chi = torsions.sin_cos.narrow(1, 3, 4);  // [R, 4, 2]
  labels.chi_angles = torch::atan2(chi.select(-1, 0), chi.select(-1, 1));
  labels.chi_mask = torsions.mask.narrow(1, 3, 4);
  labels.clamped_fape_fraction = clamped_fape_fraction;
  return labels;
}

}  // namespace kuafu::fold
