#include "apps/fastfold/alphafold_batch.h"

#include <torch/torch.h>

#include "core/util/error.h"

namespace kuafu::fold {
namespace {

const std::string kIterations = "iterations.";

using Named = std::vector<std::pair<std::string, torch::Tensor*>>;

Named feature_fields(AlphaFoldFeatures& f) {
  return {{"aatype", &f.aatype},
          {"residue_index", &f.residue_index},
          {"seq_mask", &f.seq_mask},
          {"target_feat", &f.target_feat},
          {"msa_feat", &f.msa_feat},
          {"msa_mask", &f.msa_mask},
          {"extra_msa", &f.extra_msa},
          {"extra_has_deletion", &f.extra_has_deletion},
          {"extra_deletion_value", &f.extra_deletion_value},
          {"extra_msa_mask", &f.extra_msa_mask}};
}

// The labels' tensors; their two numbers travel as 0-dim float64 tensors (resolution, use_clamped_fape).
Named label_fields(AlphaFoldLabels& l) {
  StructureLabels& s = l.structure;
  return {{"all_atom_positions", &l.positions},
          {"all_atom_mask", &l.mask},
          {"pseudo_beta", &l.pseudo_beta},
          {"pseudo_beta_mask", &l.pseudo_beta_mask},
          {"true_msa", &l.true_msa},
          {"bert_mask", &l.bert_mask},
          {"structure_aatype", &s.aatype},
          {"structure_seq_mask", &s.residue_mask},
          {"atom14_gt_positions", &s.atom14_positions},
          {"atom14_gt_exists", &s.atom14_exists},
          {"atom14_alt_gt_positions", &s.atom14_alt_positions},
          {"atom14_alt_gt_exists", &s.atom14_alt_exists},
          {"atom14_atom_is_ambiguous", &s.atom14_ambiguous},
          {"atom14_atom_exists", &s.atom14_type_exists},
          {"rigidgroups_gt_frames.rotation", &s.group_frames.rotation},
          {"rigidgroups_gt_frames.translation", &s.group_frames.translation},
          {"rigidgroups_alt_gt_frames.rotation", &s.alt_group_frames.rotation},
          {"rigidgroups_alt_gt_frames.translation", &s.alt_group_frames.translation},
          {"rigidgroups_gt_exists", &s.group_exists},
          {"backbone_frame.rotation", &s.backbone.rotation},
          {"backbone_frame.translation", &s.backbone.translation},
          {"backbone_affine_mask", &s.backbone_mask},
          {"chi_angles", &s.chi_angles},
          {"chi_mask", &s.chi_mask}};
}

torch::Tensor number(double value) { return torch::scalar_tensor(value, torch::kFloat64); }

}  // namespace

hooks::Batch alphafold_batch(const std::vector<AlphaFoldFeatures>& iterations, const AlphaFoldLabels* labels) {
  KUAFU_CHECK(!iterations.empty(), "AlphaFold: no iteration's features");
  hooks::Batch batch;
  std::vector<AlphaFoldFeatures> copies = iterations;
  std::vector<Named> fields;
  for (AlphaFoldFeatures& f : copies) fields.push_back(feature_fields(f));
  for (size_t k = 0; k < fields.front().size(); ++k) {
    std::vector<torch::Tensor> each;  // [N] of the iterations' feature k
    for (const Named& f : fields) each.push_back(*f[k].second);
    batch.features[kIterations + fields.front()[k].first] = torch::stack(each);
  }
  if (labels) {
    AlphaFoldLabels l = *labels;
    for (const auto& [name, tensor] : label_fields(l)) batch.features[name] = *tensor;
    if (l.recorded_atoms.defined()) batch.features["atom37_recorded"] = l.recorded_atoms;
    batch.features["resolution"] = number(l.resolution);
    batch.features["use_clamped_fape"] = number(l.structure.clamped_fape_fraction);
  }
  return batch;
}

int64_t batch_iterations(const hooks::Batch& batch) {
  const auto stacked = batch.features.find(kIterations + "msa_feat");
  return stacked == batch.features.end() ? 1 : stacked->second.size(0);
}

hooks::Batch iteration_features(const hooks::Batch& batch, int64_t i) {
  hooks::Batch one;
  for (const auto& [name, tensor] : batch.features) {
    if (name.rfind(kIterations, 0) == 0) {
      one.features[name.substr(kIterations.size())] = tensor[i];
    } else {
      one.features[name] = tensor;
    }
  }
  return one;
}

AlphaFoldFeatures features_of(const hooks::Batch& batch) {
  AlphaFoldFeatures f;
  for (const auto& [name, tensor] : feature_fields(f)) *tensor = batch[name];
  return f;
}

AlphaFoldLabels labels_of(const hooks::Batch& batch) {
  AlphaFoldLabels l;
  for (const auto& [name, tensor] : label_fields(l)) *tensor = batch[name];
  l.resolution = batch["resolution"].item<double>();
  if (batch.features.count("atom37_recorded")) l.recorded_atoms = batch["atom37_recorded"];
  // The residue numbers are a feature, the same in every iteration: one iteration's, or the first of the stacked.
  if (batch.features.count("residue_index")) {
    l.residue_index = batch["residue_index"];
  } else if (batch.features.count(kIterations + "residue_index")) {
    l.residue_index = batch[kIterations + "residue_index"][0];
  }
  l.structure.clamped_fape_fraction = batch["use_clamped_fape"].item<double>();
  return l;
}

}  // namespace kuafu::fold
