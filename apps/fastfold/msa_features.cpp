#include "apps/fastfold/msa_features.h"

#include <cmath>
#include <set>

#include <torch/torch.h>

#include "apps/fastfold/residue_types.h"

namespace kuafu::fold {
namespace {

int64_t msa_class(char c) {
  switch (c) {
    case '-': return kMsaGap;
    case 'B': return residue_type_index('D');
    case 'Z': return residue_type_index('E');
    case 'U': return residue_type_index('C');
    default: return residue_type_index(c);  // 20 for J, O, X and anything else
  }
}

torch::Tensor float_one_hot(const torch::Tensor& classes, int64_t n, const torch::TensorOptions& options) {
  return torch::one_hot(classes, n).to(options.dtype());
}

}  // namespace

MsaTensors msa_tensors(const Msa& msa) {
  std::set<std::string> seen;
  std::vector<torch::Tensor> rows, deletions;
  for (size_t i = 0; i < msa.size(); ++i) {
    const std::string& row = msa.sequences[i];
    if (!seen.insert(row).second) continue;
    std::vector<int64_t> classes(row.size());
    for (size_t j = 0; j < row.size(); ++j) classes[j] = msa_class(row[j]);
    rows.push_back(torch::tensor(classes, torch::kInt64));
    std::vector<float> d(msa.deletion_matrix[i].begin(), msa.deletion_matrix[i].end());
    deletions.push_back(torch::tensor(d, torch::kFloat32));
  }
  return {torch::stack(rows), torch::stack(deletions)};
}

torch::Tensor deletion_value(const torch::Tensor& deletions) { return torch::atan(deletions / 3.0) * (2.0 / M_PI); }

torch::Tensor target_feat(const torch::Tensor& aatype) {
  const auto options = torch::TensorOptions(torch::kFloat32).device(aatype.device());
  return torch::cat({torch::zeros({aatype.size(0), 1}, options), float_one_hot(aatype, kResidueTypes + 1, options)}, -1);
}

torch::Tensor cluster_msa_feat(const torch::Tensor& clusters, const torch::Tensor& cluster_deletions,
                               const torch::Tensor& cluster_mask, const torch::Tensor& extra, const torch::Tensor& extra_deletions,
                               const torch::Tensor& extra_mask) {
  const auto options = cluster_deletions.options();
  const int64_t s = clusters.size(0), r = clusters.size(1);
  const torch::Tensor cluster_one_hot = float_one_hot(clusters, 23, options);  // [S, R, 23]
  const torch::Tensor extra_one_hot = float_one_hot(extra, 23, options);       // [E, R, 23]
  // Agreement counts only the 21 residue classes (unknown included).
  const torch::Tensor agreement = torch::einsum("erc,src->es", {(extra_one_hot * extra_mask.unsqueeze(-1)).narrow(-1, 0, 21),
                                                                (cluster_one_hot * cluster_mask.unsqueeze(-1)).narrow(-1, 0, 21)});
  const torch::Tensor assignment = agreement.argmax(1);  // [E]
  const torch::Tensor counts = torch::zeros({s, r}, options).index_add_(0, assignment, extra_mask) + cluster_mask + 1e-6;
  const torch::Tensor profile =
      (torch::zeros({s, r, 23}, options).index_add_(0, assignment, extra_one_hot * extra_mask.unsqueeze(-1)) + cluster_one_hot) /
      counts.unsqueeze(-1);
  const torch::Tensor mean_deletion =
      (torch::zeros({s, r}, options).index_add_(0, assignment, extra_deletions * extra_mask) + cluster_deletions) / counts;
  return torch::cat({cluster_one_hot, torch::clamp(cluster_deletions, 0, 1).unsqueeze(-1),
                     deletion_value(cluster_deletions).unsqueeze(-1), profile, deletion_value(mean_deletion).unsqueeze(-1)},
                    -1);
}

torch::Tensor msa_column_profile(const MsaTensors& msa) {
  return float_one_hot(msa.rows, 22, torch::TensorOptions(torch::kFloat32)).mean(0);
}

MsaSample sample_msa_features(const torch::Tensor& aatype, const torch::Tensor& residue_index, const MsaTensors& msa,
                              const MsaSampling& sampling, torch::Generator& generator, const torch::Tensor& column_profile) {
  const int64_t n = msa.rows.size(0), r = msa.rows.size(1);
  const auto floats = torch::TensorOptions(torch::kFloat32);
  const torch::Tensor profile = column_profile.defined() ? column_profile : msa_column_profile(msa);  // [R, 22]
  // The query, then the others in a random order: the first max_clusters are the clusters.
  const torch::Tensor order = torch::cat({torch::zeros({1}, torch::kInt64), torch::randperm(n - 1, generator, torch::kInt64) + 1});
  const int64_t s = std::min(sampling.max_clusters, n);
  const torch::Tensor chosen = order.narrow(0, 0, s), others = order.narrow(0, s, n - s);
  const torch::Tensor true_msa = msa.rows.index_select(0, chosen);
  // BERT: a position chosen with replace_fraction takes a class drawn from uniform / profile / same / mask.
  torch::Tensor probabilities = torch::cat({torch::full({20}, 0.05, floats), torch::zeros({2}, floats)}) * sampling.uniform +
                                profile.unsqueeze(0) * sampling.profile + float_one_hot(true_msa, 22, floats) * sampling.same;
  const double mask_probability = 1.0 - sampling.uniform - sampling.profile - sampling.same;
  probabilities = torch::cat({probabilities, torch::full({s, r, 1}, mask_probability, floats)}, -1);  // [S, R, 23]
  const torch::Tensor drawn = torch::multinomial(probabilities.reshape({-1, 23}), 1, true, generator).view({s, r});
  const torch::Tensor replace = torch::rand({s, r}, generator) < sampling.replace_fraction;
  const torch::Tensor masked = torch::where(replace, drawn, true_msa);
  // The extra MSA: every row not chosen joins a cluster; then a random subset of max_extra is kept.
  const torch::Tensor extra = msa.rows.index_select(0, others);
  const torch::Tensor extra_deletions = msa.deletions.index_select(0, others);
  const torch::Tensor cluster_deletions = msa.deletions.index_select(0, chosen);
  const torch::Tensor cluster_mask = torch::ones({s, r}, floats), extra_mask = torch::ones({n - s, r}, floats);
  MsaSample sample;
  AlphaFoldFeatures& f = sample.features;
  f.aatype = aatype;
  f.residue_index = residue_index;
  f.seq_mask = torch::ones({r}, floats);
  f.target_feat = target_feat(aatype);
  f.msa_feat = cluster_msa_feat(masked, cluster_deletions, cluster_mask, extra, extra_deletions, extra_mask);
  f.msa_mask = cluster_mask;
  const int64_t e = std::min(sampling.max_extra, n - s);
  const torch::Tensor kept = torch::randperm(n - s, generator, torch::kInt64).narrow(0, 0, e);
  f.extra_msa = extra.index_select(0, kept);
  const torch::Tensor kept_deletions = extra_deletions.index_select(0, kept);
  f.extra_has_deletion = torch::clamp(kept_deletions, 0, 1);
  f.extra_deletion_value = deletion_value(kept_deletions);
  f.extra_msa_mask = torch::ones({e, r}, floats);
  sample.true_msa = true_msa;
  sample.bert_mask = replace.to(torch::kFloat32);
  return sample;
}

}  // namespace kuafu::fold
