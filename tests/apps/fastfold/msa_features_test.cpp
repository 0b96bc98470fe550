// The MSA and target features against those AlphaFold's pipeline made for the golden model (the
// deterministic part: cluster profiles from the sampled, masked rows), and the sampling's rules and rates.
#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "apps/fastfold/msa_features.h"
#include "tests/apps/fastfold/alphafold_golden.h"

namespace kuafu::fold {
namespace {
using testing::expect_like_alphafold;

torch::Tensor golden_feature(const std::string& name, int64_t iteration) {
  return testing::alphafold_golden("model.npz").at("feat/" + name)[iteration];
}

template <typename T>
std::vector<T> values(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::vector<T>(c.data_ptr<T>(), c.data_ptr<T>() + c.numel());
}

// d from 2/π atan(d/3).
torch::Tensor deletions_of_value(const torch::Tensor& value) { return torch::round(torch::tan(value * (M_PI / 2)) * 3.0); }

// Each recycling iteration's msa_feat from its own sampled, masked cluster rows and extra rows (recovered
// from the features themselves): within 1e-5 of the largest entry (float32 divisions, atan).
TEST(MsaFeaturesTest, ClusterProfilesAreAlphaFolds) {
  for (int64_t i = 0; i < 3; ++i) {
    const torch::Tensor msa_feat = golden_feature("msa_feat", i);  // [S, R, 49]
    const torch::Tensor clusters = msa_feat.narrow(-1, 0, 23).argmax(-1);
    const torch::Tensor cluster_deletions = deletions_of_value(msa_feat.select(-1, 24));
    const torch::Tensor extra = golden_feature("extra_msa", i).to(torch::kInt64);
    const torch::Tensor ours = cluster_msa_feat(clusters, cluster_deletions, golden_feature("msa_mask", i), extra,
                                                deletions_of_value(golden_feature("extra_deletion_value", i)),
                                                golden_feature("extra_msa_mask", i));
    expect_like_alphafold(ours, msa_feat, "msa_feat, iteration " + std::to_string(i));
    EXPECT_TRUE(torch::equal(target_feat(golden_feature("aatype", i).to(torch::kInt64)), golden_feature("target_feat", i)));
  }
}

TEST(MsaFeaturesTest, AnAlignmentInAlphaFoldsNumbers) {
  const Msa msa = parse_a3m(">q\nARND-X\n>a\nBZUJ-O\n>dup\nARND-X\n>b\nA-kkN-DX\n", "test.a3m");
  const MsaTensors t = msa_tensors(msa);
  ASSERT_EQ(t.rows.size(0), 3);  // the duplicate of the query dropped
  EXPECT_EQ(values<int64_t>(t.rows[0]), (std::vector<int64_t>{0, 1, 2, 3, 21, 20}));
  EXPECT_EQ(values<int64_t>(t.rows[1]), (std::vector<int64_t>{3, 6, 4, 20, 21, 20}));  // B as D, Z as E, U as C
  EXPECT_EQ(values<int64_t>(t.rows[2]), (std::vector<int64_t>{0, 21, 2, 21, 3, 20}));
  EXPECT_EQ(values<float>(t.deletions[2]), (std::vector<float>{0, 0, 2, 0, 0, 0}));
}

// The query is always the first cluster; clusters and extra rows partition the alignment; positions are
// replaced at 15% and a replaced position is masked 70% of the time (binomial bounds at ~5 standard
// deviations over 40,000 positions).
TEST(MsaFeaturesTest, SamplingKeepsTheQueryFirstAndMasksAtAlphaFoldsRates) {
  auto generator = at::detail::createCPUGenerator(5);
  const int64_t rows = 50, residues = 100;
  MsaTensors msa{torch::randint(0, 22, {rows, residues}, generator, torch::kInt64),
                 torch::randint(0, 3, {rows, residues}, generator, torch::kFloat32)};
  const torch::Tensor aatype = msa.rows[0].clamp_max(19);
  msa.rows[0] = aatype;
  const MsaSampling sampling{8, 30};
  double replaced = 0, masked = 0, positions = 0;
  for (int trial = 0; trial < 50; ++trial) {
    const MsaSample sample = sample_msa_features(aatype, torch::arange(residues), msa, sampling, generator);
    ASSERT_EQ(sample.true_msa.size(0), 8);
    ASSERT_EQ(sample.features.extra_msa.size(0), 30);
    EXPECT_TRUE(torch::equal(sample.true_msa[0], aatype));
    const torch::Tensor classes = sample.features.msa_feat.narrow(-1, 0, 23).argmax(-1);
    replaced += sample.bert_mask.sum().item<double>();
    masked += ((classes == kMsaMask).to(torch::kFloat32) * sample.bert_mask).sum().item<double>();
    positions += static_cast<double>(sample.bert_mask.numel());
    // Where nothing was replaced, the row is the alignment's.
    EXPECT_TRUE(torch::equal(classes.masked_select(sample.bert_mask == 0), sample.true_msa.masked_select(sample.bert_mask == 0)));
  }
  EXPECT_NEAR(replaced / positions, 0.15, 0.01);
  EXPECT_NEAR(masked / replaced, 0.7, 0.025);
}

}  // namespace
}  // namespace kuafu::fold
