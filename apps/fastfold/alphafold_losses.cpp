#include "apps/fastfold/alphafold_losses.h"

#include <torch/torch.h>

#include "core/util/error.h"

namespace kuafu::fold {
namespace {

// −Σ labels · log softmax(logits) over the last axis.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& classes) {
  return -torch::log_softmax(logits, -1).gather(-1, classes.unsqueeze(-1)).squeeze(-1);
}

torch::Tensor pairwise_distances(const torch::Tensor& points) {  // [B, N, 3] -> [B, N, N]
  return torch::sqrt(1e-10 + (points.unsqueeze(2) - points.unsqueeze(1)).square().sum(-1));
}

}  // namespace

AlphaFoldLabels AlphaFoldLabels::to(const torch::TensorOptions& options) const {
  AlphaFoldLabels l = *this;
  l.structure = structure.to(options);
  l.true_msa = true_msa.to(options.device());
  for (torch::Tensor* t : {&l.positions, &l.mask, &l.pseudo_beta, &l.pseudo_beta_mask, &l.bert_mask}) *t = t->to(options.device(), options.dtype());
  if (l.residue_index.defined()) l.residue_index = l.residue_index.to(options.device());
  if (l.recorded_atoms.defined()) l.recorded_atoms = l.recorded_atoms.to(options.device(), options.dtype());
  return l;
}

torch::Tensor lddt(const torch::Tensor& predicted, const torch::Tensor& truth, const torch::Tensor& mask, double cutoff,
                   bool per_residue) {
  const torch::Tensor true_distances = pairwise_distances(truth), predicted_distances = pairwise_distances(predicted);
  const int64_t n = truth.size(1);
  const torch::Tensor scored = (true_distances < cutoff).to(truth.scalar_type()) * mask * mask.transpose(1, 2) *
                               (1 - torch::eye(n, truth.options()));  // [B, N, N], no self pairs
  const torch::Tensor error = (true_distances - predicted_distances).abs();
  const torch::Tensor score = 0.25 * ((error < 0.5).to(truth.scalar_type()) + (error < 1.0).to(truth.scalar_type()) +
                                      (error < 2.0).to(truth.scalar_type()) + (error < 4.0).to(truth.scalar_type()));
  const std::vector<int64_t> axes = per_residue ? std::vector<int64_t>{-1} : std::vector<int64_t>{-2, -1};
  return (1e-10 + (scored * score).sum(axes)) / (1e-10 + scored.sum(axes));
}

torch::Tensor experimentally_resolved_loss(const torch::Tensor& logits, const AlphaFoldLabels& labels, const ResidueGeometry& geometry) {
  const StructureLabels& s = labels.structure;
  torch::Tensor weight = geometry.atom37_exists.index_select(0, s.aatype).to(logits.scalar_type()) *
                         s.residue_mask.to(logits.scalar_type()).unsqueeze(-1);  // [R, 37]: padding has no atoms
  if (labels.recorded_atoms.defined()) weight = weight * labels.recorded_atoms.to(logits.scalar_type());
  const torch::Tensor cross_entropy = torch::binary_cross_entropy_with_logits(
      logits, labels.mask.to(logits.scalar_type()), {}, {}, at::Reduction::None);  // [R, 37]
  return (cross_entropy * weight).sum() / (1e-8 + weight.sum());
}

AlphaFoldLoss alphafold_loss(const AlphaFoldOutputs& out, const AlphaFoldLabels& labels, const ResidueGeometry& geometry,
                             const AlphaFoldSizes& sizes, const AlphaFoldLossSettings& settings) {
  AlphaFoldLoss loss;
  // Distogram (1.9.8): the true pseudo-beta distance's bin.
  const torch::Tensor edges = torch::linspace(sizes.distogram_first, sizes.distogram_last, sizes.distogram_bins - 1,
                                              labels.pseudo_beta.options());
  const torch::Tensor d2 = (labels.pseudo_beta.unsqueeze(1) - labels.pseudo_beta.unsqueeze(0)).square().sum(-1, true);  // [R, R, 1]
  const torch::Tensor true_bins = (d2 > edges.square()).sum(-1);                                                        // [R, R]
  const torch::Tensor pair_mask = labels.pseudo_beta_mask.unsqueeze(1) * labels.pseudo_beta_mask.unsqueeze(0);
  loss.distogram = (cross_entropy(out.distogram_logits, true_bins) * pair_mask).sum() / (1e-6 + pair_mask.sum());
  // Masked MSA (1.9.9): the residue behind each BERT mask.
  loss.masked_msa = (cross_entropy(out.masked_msa_logits, labels.true_msa) * labels.bert_mask).sum() /
                    (1e-8 + labels.bert_mask.sum());
  // pLDDT (1.9.6): the bin of each residue's true lDDT-Cα of the prediction.
  const int64_t ca = 1;
  torch::Tensor lddt_ca;
  {
    torch::NoGradGuard no_grad;
    lddt_ca = lddt(out.atom37.select(1, ca).unsqueeze(0), labels.positions.select(1, ca).unsqueeze(0),
                   labels.mask.narrow(1, ca, 1).unsqueeze(0), 15.0, true)[0];  // [R]
  }
  const torch::Tensor bins = torch::clamp_max(torch::floor(lddt_ca * sizes.plddt_bins), sizes.plddt_bins - 1).to(torch::kInt64);
  const torch::Tensor ca_mask = labels.mask.select(1, ca);
  loss.plddt = (cross_entropy(out.plddt_logits, bins) * ca_mask).sum() / (ca_mask.sum() + 1e-8);
  if (labels.resolution < settings.plddt_min_resolution || labels.resolution > settings.plddt_max_resolution)
    loss.plddt = loss.plddt * 0.0;
  loss.structure = structure_module_loss(out.structure, labels.structure, geometry, settings.structure);
  loss.total = settings.distogram_weight * loss.distogram + settings.masked_msa_weight * loss.masked_msa +
               settings.structure_weight * loss.structure.loss + settings.plddt_weight * loss.plddt;
  if (out.experimentally_resolved_logits.defined()) {
    // Added at a weight of 0 too, so the head's parameters always have a gradient.
    loss.experimentally_resolved = experimentally_resolved_loss(out.experimentally_resolved_logits, labels, geometry);
    if (labels.resolution < settings.experimentally_resolved_min_resolution ||
        labels.resolution > settings.experimentally_resolved_max_resolution)
      loss.experimentally_resolved = loss.experimentally_resolved * 0.0;
    loss.total = loss.total + settings.experimentally_resolved_weight * loss.experimentally_resolved;
  } else {
    KUAFU_CHECK(settings.experimentally_resolved_weight == 0,
                "AlphaFold's experimentally-resolved loss has a weight but the model has no experimentally-resolved head");
  }
  if (settings.violation_weight > 0) {
    // 1.9.11, added to the structure module's loss as AlphaFold does (so under its weight too).
    KUAFU_CHECK(labels.residue_index.defined(), "AlphaFold's violation loss: the labels carry no residue_index");
    const StructureLabels& s = labels.structure;
    const StructuralViolations violations =
        structural_violations(out.structure.atom14.select(0, -1), s.atom14_type_exists, s.aatype, labels.residue_index,
                              atom14_distance_bounds(settings.violation), settings.violation);
    loss.violation = violation_loss(violations, s.atom14_type_exists);
    loss.total = loss.total + settings.structure_weight * settings.violation_weight * loss.violation;
  }
  return loss;
}

}  // namespace kuafu::fold
