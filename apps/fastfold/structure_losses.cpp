#include "apps/fastfold/structure_losses.h"

#include <torch/torch.h>

namespace kuafu::fold {
namespace {

// The mean of `value` over where `mask` is set, a mask broadcast along axes where it has size 1 counting
// each of them (AlphaFold's utils.mask_mean).
torch::Tensor mask_mean(const torch::Tensor& mask, const torch::Tensor& value) {
  double broadcast = 1.0;
  for (int64_t d = 0; d < value.dim(); ++d)
    if (mask.size(d) == 1 && value.size(d) != 1) broadcast *= static_cast<double>(value.size(d));
  return (mask * value).sum() / (mask.sum() * broadcast + 1e-10);
}

// Pairwise distances between every atom of every residue [R, 14, 3] -> [R, R, 14, 14].
torch::Tensor atom_distances(const torch::Tensor& atoms) {
  const torch::Tensor d = atoms.unsqueeze(1).unsqueeze(3) - atoms.unsqueeze(0).unsqueeze(2);
  return torch::sqrt(1e-10 + d.square().sum(-1));
}

// Algorithm 26: per residue, whether naming its symmetric atoms the other way brings the true distances to
// the unambiguous atoms of every residue closer to the predicted ones. -> [R] 0/1, no gradient.
torch::Tensor alt_naming_is_better(const StructureLabels& labels, const torch::Tensor& predicted) {
  torch::NoGradGuard no_grad;
  const torch::Tensor predicted_distances = atom_distances(predicted);
  const torch::Tensor error = torch::sqrt(1e-10 + (predicted_distances - atom_distances(labels.atom14_positions)).square());
  const torch::Tensor alt_error =
      torch::sqrt(1e-10 + (predicted_distances - atom_distances(labels.atom14_alt_positions)).square());
  const torch::Tensor& exists = labels.atom14_exists;
  const torch::Tensor& ambiguous = labels.atom14_ambiguous;
  const torch::Tensor mask = (exists * ambiguous).unsqueeze(1).unsqueeze(3) * (exists * (1 - ambiguous)).unsqueeze(0).unsqueeze(2);
  return ((mask * alt_error).sum({1, 2, 3}) < (mask * error).sum({1, 2, 3})).to(predicted.scalar_type());
}

// x where `alt` is 0, the alternative where it is 1 (per residue, leading axis).
torch::Tensor choose(const torch::Tensor& alt, const torch::Tensor& x, const torch::Tensor& alternative) {
  torch::Tensor a = alt;
  while (a.dim() < x.dim()) a = a.unsqueeze(-1);
  return (1 - a) * x + a * alternative;
}

Rigid flattened(const Rigid& frames) { return {frames.rotation.reshape({-1, 3, 3}), frames.translation.reshape({-1, 3})}; }

}  // namespace

StructureLabels StructureLabels::to(const torch::TensorOptions& options) const {
  const auto floats = [&](const torch::Tensor& t) { return t.to(options.device(), options.dtype()); };
  StructureLabels out = *this;
  out.aatype = aatype.to(options.device());
  for (torch::Tensor* t : {&out.residue_mask, &out.atom14_positions, &out.atom14_exists, &out.atom14_alt_positions,
                           &out.atom14_alt_exists, &out.atom14_ambiguous, &out.atom14_type_exists, &out.group_exists,
                           &out.backbone_mask, &out.chi_angles, &out.chi_mask})
    *t = floats(*t);
  out.group_frames = group_frames.to(options);
  out.alt_group_frames = alt_group_frames.to(options);
  out.backbone = backbone.to(options);
  return out;
}

torch::Tensor frame_aligned_point_error(const Rigid& predicted_frames, const Rigid& true_frames,
                                        const torch::Tensor& frames_mask, const torch::Tensor& predicted_positions,
                                        const torch::Tensor& true_positions, const torch::Tensor& positions_mask,
                                        double length_scale, std::optional<double> clamp_distance, double epsilon) {
  const int64_t frame_axis = frames_mask.dim();  // frames [*, F] -> [*, F, 1] against points [*, 1, P]
  const torch::Tensor local_predicted =
      predicted_frames.inverse().unsqueeze(frame_axis).apply(predicted_positions.unsqueeze(-3));  // [*, F, P, 3]
  const torch::Tensor local_true = true_frames.inverse().unsqueeze(frame_axis).apply(true_positions.unsqueeze(-3));
  torch::Tensor error = torch::sqrt((local_predicted - local_true).square().sum(-1) + epsilon);  // [*, F, P]
  if (clamp_distance) error = torch::clamp(error, 0.0, *clamp_distance);
  error = error / length_scale * frames_mask.unsqueeze(-1) * positions_mask.unsqueeze(-2);
  const torch::Tensor normalization = frames_mask.sum(-1) * positions_mask.sum(-1);
  return error.sum({-2, -1}) / (epsilon + normalization);
}

StructureLoss structure_module_loss(const StructureOutputs& out, const StructureLabels& labels,
                                    const ResidueGeometry& geometry, const StructureLossSettings& settings) {
  StructureLoss loss;
  // Backbone FAPE of every layer, CA positions against the frames: clamped for a fraction of samples.
  const int64_t layers = out.quaternions.size(0);
  const Rigid trajectory{quaternion_to_rotation(out.quaternions), out.translations};  // [L, R]
  const Rigid truth{labels.backbone.rotation.expand({layers, -1, 3, 3}), labels.backbone.translation.expand({layers, -1, 3})};
  const torch::Tensor mask = labels.backbone_mask.expand({layers, -1});
  const auto backbone_fape = [&](std::optional<double> clamp) {
    return frame_aligned_point_error(trajectory, truth, mask, trajectory.translation, truth.translation, mask,
                                     settings.fape_scale, clamp);  // [L]
  };
  const double clamped = labels.clamped_fape_fraction;
  torch::Tensor fape = backbone_fape(settings.fape_clamp) * clamped;
  if (clamped != 1.0) fape = fape + backbone_fape(std::nullopt) * (1.0 - clamped);
  loss.fape = fape[-1];

  // Side-chain FAPE of the last layer: all frames against all atoms, the truth renamed to fit best.
  const torch::Tensor last_atoms = out.atom14[-1];  // [R, 14, 3]
  loss.alt_naming_is_better = alt_naming_is_better(labels, last_atoms);
  loss.renamed_positions = choose(loss.alt_naming_is_better, labels.atom14_positions, labels.atom14_alt_positions);
  loss.renamed_exists = choose(loss.alt_naming_is_better, labels.atom14_exists, labels.atom14_alt_exists);
  const Rigid renamed_frames{choose(loss.alt_naming_is_better, labels.group_frames.rotation, labels.alt_group_frames.rotation),
                             choose(loss.alt_naming_is_better, labels.group_frames.translation, labels.alt_group_frames.translation)};
  const Rigid last_frames{out.frames.rotation[-1], out.frames.translation[-1]};  // [R, 8]
  loss.sidechain_fape = frame_aligned_point_error(
      flattened(last_frames), flattened(renamed_frames), labels.group_exists.reshape({-1}), last_atoms.reshape({-1, 3}),
      loss.renamed_positions.reshape({-1, 3}), loss.renamed_exists.reshape({-1}), settings.sidechain_scale,
      settings.sidechain_clamp);

  // Algorithm 27: chi angles of every layer against the truth, a π-periodic angle against either of its values.
  const torch::Tensor predicted_chi = out.angles.narrow(2, 3, 4);  // [L, R, 4, 2]
  const torch::Tensor true_chi = torch::stack({torch::sin(labels.chi_angles), torch::cos(labels.chi_angles)}, -1).unsqueeze(0);
  const torch::Tensor flip = (1 - 2 * geometry.chi_pi_periodic.index_select(0, labels.aatype)).unsqueeze(-1).unsqueeze(0);
  const torch::Tensor chi_error = torch::minimum((true_chi - predicted_chi).square().sum(-1),
                                                 (true_chi * flip - predicted_chi).square().sum(-1));  // [L, R, 4]
  loss.chi = mask_mean(labels.chi_mask.unsqueeze(0), chi_error);
  const torch::Tensor norms = torch::sqrt(out.unnormalized_angles.square().sum(-1) + 1e-6);  // [L, R, 7]
  loss.angle_norm = mask_mean(labels.residue_mask.view({1, -1, 1}), (norms - 1).abs());

  loss.loss = (1 - settings.sidechain_fraction) * fape.mean() + settings.sidechain_fraction * loss.sidechain_fape +
              settings.chi_weight * loss.chi + settings.angle_norm_weight * loss.angle_norm;
  return loss;
}

}  // namespace kuafu::fold
