// AlphaFold 2's input and recycling embedders (supplement 1.5 and 1.10, Algorithms 3-5 and 32), maths only.
// Shapes: R residues, S MSA cluster rows, E extra MSA rows; m [S, R, c_m], z [R, R, c_z].
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "apps/fastfold/evoformer.h"

namespace kuafu::fold {

// Feature widths: target_feat, msa_feat and the extra MSA's (AlphaFold's monomer features).
constexpr int64_t kTargetFeatures = 22, kMsaFeatures = 49, kExtraMsaFeatures = 25;

// Algorithms 3-4: the MSA stream from the MSA features and the target; the pair stream from the target's
// outer sum and the relative positions (|i - j| clipped at `max_relative`, one-hot).
struct InputEmbedderImpl : torch::nn::Module {
  InputEmbedderImpl(int64_t msa_channels, int64_t pair_channels, int64_t max_relative, const torch::Device& device = torch::kCPU);
  // target_feat [R, 22], msa_feat [S, R, 49], residue_index [R] int64 -> (m [S, R, c_m], z [R, R, c_z]).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& target_feat, const torch::Tensor& msa_feat,
                                                  const torch::Tensor& residue_index);
  int64_t max_relative;
  AfLinear preprocess_1d{nullptr}, preprocess_msa{nullptr}, left_single{nullptr}, right_single{nullptr};
  AfLinear pair_activiations{nullptr};  // sic: AlphaFold's parameter name
};
TORCH_MODULE(InputEmbedder);

// Algorithm 32: the previous iteration's first MSA row, pair and predicted pseudo-beta distances (binned)
// added to this iteration's streams.
struct RecyclingEmbedderImpl : torch::nn::Module {
  RecyclingEmbedderImpl(int64_t msa_channels, int64_t pair_channels, int64_t bins, double min_bin, double max_bin,
                        const torch::Device& device = torch::kCPU);
  // prev_msa_first_row [R, c_m], prev_pair [R, R, c_z], prev_pseudo_beta [R, 3] -> updates of m's first
  // row [R, c_m] and of z [R, R, c_z].
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& prev_msa_first_row, const torch::Tensor& prev_pair,
                                                  const torch::Tensor& prev_pseudo_beta);
  int64_t bins;
  double min_bin, max_bin;
  AfLinear prev_pos_linear{nullptr};
  AfLayerNorm prev_msa_first_row_norm{nullptr}, prev_pair_norm{nullptr};
};
TORCH_MODULE(RecyclingEmbedder);

// Binned distances between points [R, 3] -> one-hot [R, R, bins]: bins' lower edges evenly from min_bin to
// max_bin (Å), the last open above (AlphaFold's dgram_from_positions).
torch::Tensor distance_bins(const torch::Tensor& points, int64_t bins, double min_bin, double max_bin);

// The extra MSA's features [E, R, kExtraMsaFeatures]: one-hot residue (23 classes), has-deletion, deletion value.
torch::Tensor extra_msa_features(const torch::Tensor& extra_msa, const torch::Tensor& has_deletion,
                                 const torch::Tensor& deletion_value);

}  // namespace kuafu::fold
