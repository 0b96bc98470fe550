#include "apps/fastfold/embedders.h"

#include <torch/torch.h>

namespace kuafu::fold {

InputEmbedderImpl::InputEmbedderImpl(int64_t c_m, int64_t c_z, int64_t relative, const torch::Device& device)
    : max_relative(relative) {
  preprocess_1d = register_module("preprocess_1d", AfLinear(kTargetFeatures, c_m, device));
  preprocess_msa = register_module("preprocess_msa", AfLinear(kMsaFeatures, c_m, device));
  left_single = register_module("left_single", AfLinear(kTargetFeatures, c_z, device));
  right_single = register_module("right_single", AfLinear(kTargetFeatures, c_z, device));
  pair_activiations = register_module("pair_activiations", AfLinear(2 * relative + 1, c_z, device));
}

std::pair<torch::Tensor, torch::Tensor> InputEmbedderImpl::forward(const torch::Tensor& target_feat, const torch::Tensor& msa_feat,
                                                                   const torch::Tensor& residue_index) {
  const torch::Tensor m = preprocess_1d(target_feat).unsqueeze(0) + preprocess_msa(msa_feat);  // [S, R, c_m]
  torch::Tensor z = left_single(target_feat).unsqueeze(1) + right_single(target_feat).unsqueeze(0);  // [R, R, c_z]
  const torch::Tensor offset =
      torch::clamp(residue_index.unsqueeze(1) - residue_index.unsqueeze(0) + max_relative, 0, 2 * max_relative);  // [R, R]
  // The one-hot offsets times the weights, as the rows they pick (the same values): no [R, R, 2·max + 1]
  // one-hot, which at 2,048 residues held more memory than the Evoformer block.
  z = z + torch::embedding(pair_activiations->weights, offset).add_(pair_activiations->bias);
  return {m, z};
}

RecyclingEmbedderImpl::RecyclingEmbedderImpl(int64_t c_m, int64_t c_z, int64_t n, double low, double high, const torch::Device& device)
    : bins(n), min_bin(low), max_bin(high) {
  prev_pos_linear = register_module("prev_pos_linear", AfLinear(n, c_z, device));
  prev_msa_first_row_norm = register_module("prev_msa_first_row_norm", AfLayerNorm(c_m, device));
  prev_pair_norm = register_module("prev_pair_norm", AfLayerNorm(c_z, device));
}

std::pair<torch::Tensor, torch::Tensor> RecyclingEmbedderImpl::forward(const torch::Tensor& prev_msa_first_row,
                                                                       const torch::Tensor& prev_pair,
                                                                       const torch::Tensor& prev_pseudo_beta) {
  // The bins in the positions' dtype (float32 where the trunk runs in bf16), then exact 0/1 in the weights'.
  const torch::Tensor bins_hit = distance_bins(prev_pseudo_beta, bins, min_bin, max_bin).to(prev_pos_linear->weights.scalar_type());
  const torch::Tensor z = prev_pos_linear(bins_hit) + prev_pair_norm(prev_pair);
  return {prev_msa_first_row_norm(prev_msa_first_row), z};
}

torch::Tensor distance_bins(const torch::Tensor& points, int64_t bins, double min_bin, double max_bin) {
  const torch::Tensor lower = torch::linspace(min_bin, max_bin, bins, points.options()).square();  // [bins] Å²
  const torch::Tensor upper = torch::cat({lower.narrow(0, 1, bins - 1), torch::full({1}, 1e8, points.options())});
  const torch::Tensor d2 = (points.unsqueeze(1) - points.unsqueeze(0)).square().sum(-1, true);    // [R, R, 1]
  return ((d2 > lower) & (d2 < upper)).to(points.scalar_type());
}

torch::Tensor extra_msa_features(const torch::Tensor& extra_msa, const torch::Tensor& has_deletion,
                                 const torch::Tensor& deletion_value) {
  constexpr int64_t kMsaClasses = 23;  // 20 amino acids, unknown, gap, mask
  return torch::cat({torch::one_hot(extra_msa, kMsaClasses).to(has_deletion.scalar_type()), has_deletion.unsqueeze(-1),
                     deletion_value.unsqueeze(-1)}, -1);
}

}  // namespace kuafu::fold
