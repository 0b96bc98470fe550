// The structure module's losses as AlphaFold 2 trains them (supplement 1.9.2-1.9.3, Algorithms 27-28):
// backbone FAPE over every layer, side-chain FAPE on the last layer after choosing each symmetric side
// chain's naming, the torsion-angle loss and the angle-norm penalty. Maths only.
#pragma once

#include <optional>

#include <torch/types.h>

#include "apps/fastfold/residue_geometry.h"
#include "apps/fastfold/rigid.h"
#include "apps/fastfold/structure_module.h"
#include "apps/fastfold/violations.h"

namespace kuafu::fold {

// Algorithm 28: the mean over frames f and points p of |T_f⁻¹ x_p − T̂_f⁻¹ x̂_p| (plus ε under the square
// root), clamped at `clamp_distance` when given, in units of `length_scale`. Frames [*, F], masks [*, F]
// and [*, P], positions [*, P, 3] -> [*].
torch::Tensor frame_aligned_point_error(const Rigid& predicted_frames, const Rigid& true_frames,
                                        const torch::Tensor& frames_mask, const torch::Tensor& predicted_positions,
                                        const torch::Tensor& true_positions, const torch::Tensor& positions_mask,
                                        double length_scale, std::optional<double> clamp_distance, double epsilon = 1e-4);

// A chain's truth in AlphaFold's training layouts (make_structure_labels builds it from atom37).
struct StructureLabels {
  torch::Tensor aatype;                 // [R] int64
  torch::Tensor residue_mask;           // [R] (seq_mask)
  torch::Tensor atom14_positions;       // [R, 14, 3] (atom14_gt_positions)
  torch::Tensor atom14_exists;          // [R, 14] the atoms the truth has (atom14_gt_exists)
  torch::Tensor atom14_alt_positions;   // [R, 14, 3] symmetric side chains named the other way
  torch::Tensor atom14_alt_exists;      // [R, 14]
  torch::Tensor atom14_ambiguous;       // [R, 14] (atom14_atom_is_ambiguous)
  torch::Tensor atom14_type_exists;     // [R, 14] the atoms the residue type has (atom14_atom_exists)
  Rigid group_frames, alt_group_frames;  // [R, 8] (rigidgroups_gt_frames, rigidgroups_alt_gt_frames)
  torch::Tensor group_exists;           // [R, 8]
  Rigid backbone;                       // [R] (backbone_affine_tensor)
  torch::Tensor backbone_mask;          // [R]
  torch::Tensor chi_angles, chi_mask;   // [R, 4] radians
  double clamped_fape_fraction = 0.9;   // use_clamped_fape: 1 clamped, 0 not; AlphaFold draws 0/1 per sample

  StructureLabels to(const torch::TensorOptions& options) const;  // floating labels in its dtype, all on its device
};

// AlphaFold's heads.structure_module settings.
struct StructureLossSettings {
  double fape_clamp = 10.0, fape_scale = 10.0;
  double sidechain_clamp = 10.0, sidechain_scale = 10.0;
  double sidechain_fraction = 0.5;  // of the loss that is side-chain FAPE (weight_frac)
  double chi_weight = 0.5, angle_norm_weight = 0.01;
};

// The whole model's loss weights (supplement 1.9 and 1.11), the structure module's among them.
struct AlphaFoldLossSettings {
  double distogram_weight = 0.3, masked_msa_weight = 2.0, structure_weight = 1.0, plddt_weight = 0.01;
  double plddt_min_resolution = 0.1, plddt_max_resolution = 3.0;
  double violation_weight = 0.0;  // AlphaFold's fine-tuning stage: 1 (supplement 1.11.3), initial training: 0
  // The experimentally-resolved head's loss (1.9.10): AlphaFold's fine-tuning stage 0.01, initial training 0;
  // like pLDDT's, only on structures solved at 0.1 to 3 Å.
  double experimentally_resolved_weight = 0.0;
  double experimentally_resolved_min_resolution = 0.1, experimentally_resolved_max_resolution = 3.0;
  StructureLossSettings structure;
  ViolationSettings violation;
};

struct StructureLoss {
  torch::Tensor loss;              // the weighted sum
  torch::Tensor fape;              // backbone FAPE of the last layer
  torch::Tensor sidechain_fape;
  torch::Tensor chi, angle_norm;
  torch::Tensor alt_naming_is_better;   // [R] 1 where the other naming of a symmetric side chain fits better
  torch::Tensor renamed_positions;      // [R, 14, 3] the truth in the naming chosen
  torch::Tensor renamed_exists;         // [R, 14]
};

StructureLoss structure_module_loss(const StructureOutputs& out, const StructureLabels& labels,
                                    const ResidueGeometry& geometry, const StructureLossSettings& settings);

}  // namespace kuafu::fold
