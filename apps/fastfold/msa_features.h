// AlphaFold 2's MSA and target features (supplement 1.2.6-1.2.9, Table 1), as its data pipeline makes them:
// the alignment as numbers, cluster sampling, BERT-style masking, nearest-cluster profiles, the extra MSA,
// msa_feat [S, R, 49] and target_feat [R, 22]. The random choices draw from a torch::Generator.
#pragma once

#include <torch/types.h>

#include "apps/fastfold/alignment_files.h"
#include "apps/fastfold/alphafold_model.h"

namespace kuafu::fold {

constexpr int64_t kMsaGap = 21;    // MSA classes: 0..19 residues, 20 unknown, 21 gap, 22 the BERT mask
constexpr int64_t kMsaMask = 22;

// An alignment in AlphaFold's numbering: rows [N, R] int64, deletions [N, R] float32 (residues the row
// inserts before each column). Rows repeating an earlier one are dropped, as AlphaFold drops them; the
// query stays first. Ambiguity codes: B as D, Z as E, U as C; J, O, X and others unknown.
struct MsaTensors {
  torch::Tensor rows, deletions;
};
MsaTensors msa_tensors(const Msa& msa);

// AlphaFold's data config (common.masked_msa, eval.masked_msa_replace_fraction, max_msa_clusters,
// max_extra_msa): the training values.
struct MsaSampling {
  int64_t max_clusters = 128;
  int64_t max_extra = 1024;
  double replace_fraction = 0.15;  // positions chosen for BERT
  double uniform = 0.1, profile = 0.1, same = 0.1;  // of those: a random residue, one drawn from the
                                                    // column's profile, the same residue; the rest masked
};

// One sample of a chain's features, and what the masked-MSA loss needs.
struct MsaSample {
  AlphaFoldFeatures features;
  torch::Tensor true_msa;   // [S, R] int64: the cluster rows before masking
  torch::Tensor bert_mask;  // [S, R]
};

// The alignment's column profile over every row [R, 22] (AlphaFold's hhblits_profile): what BERT masking
// draws from.
torch::Tensor msa_column_profile(const MsaTensors& msa);

// Samples clusters (the query first, then a random order), masks them, assigns the other rows to their
// nearest cluster and keeps up to max_extra of them (a random subset) as the extra MSA.
// aatype, residue_index [R] int64; `profile`: msa_column_profile(msa), worked out here when undefined
// (pass it when sampling the same alignment several times).
MsaSample sample_msa_features(const torch::Tensor& aatype, const torch::Tensor& residue_index, const MsaTensors& msa,
                              const MsaSampling& sampling, torch::Generator& generator, const torch::Tensor& profile = {});

// The deterministic part, given the (masked) cluster rows [S, R], their deletions and mask, and every
// extra row [E, R] with its deletions and mask: each extra row joins the cluster it agrees with at the
// most residue columns (gaps, unknowns and masks aside; the first on ties), and msa_feat is the cluster
// row one-hot (23), has-deletion, deletion value (2/π atan(d/3)), the cluster's profile (23) and its mean
// deletion value. -> [S, R, 49].
torch::Tensor cluster_msa_feat(const torch::Tensor& clusters, const torch::Tensor& cluster_deletions,
                               const torch::Tensor& cluster_mask, const torch::Tensor& extra, const torch::Tensor& extra_deletions,
                               const torch::Tensor& extra_mask);

// [R, 22]: 0 (no chain break: one chain), then the residue one-hot over 21 classes.
torch::Tensor target_feat(const torch::Tensor& aatype);

// 2/π atan(d/3): a deletion count squashed into [0, 1).
torch::Tensor deletion_value(const torch::Tensor& deletions);

}  // namespace kuafu::fold
