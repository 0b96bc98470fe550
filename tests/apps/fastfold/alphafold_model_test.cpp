// The whole model with recycling against DeepMind's AlphaFold 2.3 (golden model.npz and grads.npz: d1crj's
// first 24 residues, a synthetic MSA, three iterations with the MSA resampled in each, the loss on the
// last), and the parameter file written back as AlphaFold's.
#include <gtest/gtest.h>

#include <iostream>

#include <torch/torch.h>

#include "apps/fastfold/alphafold_losses.h"
#include "apps/fastfold/alphafold_model.h"
#include "apps/fastfold/structure_labels.h"
#include "tests/apps/fastfold/alphafold_golden.h"

namespace kuafu::fold {
namespace {
using testing::expect_like_alphafold;

// The tiny model of the golden config.json.
AlphaFoldSizes tiny_alphafold() {
  AlphaFoldSizes s;
  s.msa_channels = 16;
  s.pair_channels = 8;
  s.single_channels = 16;
  s.extra_msa_channels = 8;
  s.evoformer_blocks = 2;
  s.extra_msa_blocks = 1;
  s.msa_heads = s.pair_heads = 2;
  s.outer_channels = 4;
  s.triangle_channels = 8;
  s.structure.ipa = {16, 8, 2, 4, 4, 2, 3};
  s.structure.layers = 2;
  s.structure.angle_channels = 8;
  s.plddt_channels = 8;
  return s;
}

torch::Tensor feature(const std::string& name, int64_t iteration = 0) {
  return testing::alphafold_golden("model.npz").at("feat/" + name)[iteration];
}

AlphaFoldFeatures golden_features(int64_t i) {
  const auto longs = [&](const std::string& name) { return feature(name, i).to(torch::kInt64); };
  return {longs("aatype"),          longs("residue_index"), feature("seq_mask", i),        feature("target_feat", i),
          feature("msa_feat", i),   feature("msa_mask", i), longs("extra_msa"),            feature("extra_has_deletion", i),
          feature("extra_deletion_value", i),                feature("extra_msa_mask", i)};
}

AlphaFoldLabels golden_labels(const ResidueGeometry& geometry, int64_t last) {
  AlphaFoldLabels labels;
  labels.positions = feature("all_atom_positions", last);
  labels.mask = feature("all_atom_mask", last);
  const torch::Tensor aatype = feature("aatype", last).to(torch::kInt64);
  labels.structure = structure_labels(geometry, aatype, labels.positions, labels.mask, feature("seq_mask", last),
                                      feature("use_clamped_fape", last).item<double>());
  std::tie(labels.pseudo_beta, labels.pseudo_beta_mask) = pseudo_beta(aatype, labels.positions, labels.mask);
  labels.true_msa = feature("true_msa", last).to(torch::kInt64);
  labels.bert_mask = feature("bert_mask", last);
  labels.resolution = feature("resolution", last).item<double>();
  return labels;
}

TEST(AlphaFoldModelTest, WithRecyclingIsAlphaFoldsInValueAndLoss) {
  const io::NpzArrays& golden = testing::alphafold_golden("model.npz");
  AlphaFold model(tiny_alphafold());
  load_alphafold(*model, testing::alphafold_golden("params/params_model_tiny.npz"));
  const ResidueGeometry geometry = testing::alphafold_residue_geometry();
  const int64_t iterations = golden.at("feat/aatype").size(0);
  Recycled previous = Recycled::zeros(24, model->sizes, torch::TensorOptions(torch::kFloat32));
  AlphaFoldOutputs out;
  for (int64_t i = 0; i < iterations; ++i) {
    const bool last = i + 1 == iterations;
    torch::AutoGradMode grad(last);
    out = model->iteration(golden_features(i), previous, geometry);
    previous = out.recycled();
    const std::string it = "iter" + std::to_string(i) + "/";
    expect_like_alphafold(previous.msa_first_row, golden.at(it + "prev_msa_first_row"), it + "first MSA row");
    expect_like_alphafold(previous.pair, golden.at(it + "prev_pair"), it + "pair");
    expect_like_alphafold(previous.positions, golden.at(it + "prev_pos"), it + "atoms");
  }
  expect_like_alphafold(out.msa.detach(), golden.at("out/representations/msa"), "msa");
  expect_like_alphafold(out.single.detach(), golden.at("out/representations/single"), "single");
  expect_like_alphafold(out.structure.single.detach(), golden.at("out/representations/structure_module"), "structure single");
  expect_like_alphafold(out.distogram_logits.detach(), golden.at("out/distogram/logits"), "distogram logits");
  expect_like_alphafold(out.masked_msa_logits.detach(), golden.at("out/masked_msa/logits"), "masked MSA logits");
  expect_like_alphafold(out.plddt_logits.detach(), golden.at("out/predicted_lddt/logits"), "pLDDT logits");
  expect_like_alphafold(plddt_of_logits(out.plddt_logits.detach()), golden.at("out/plddt"), "pLDDT");
  const torch::Tensor traj = golden.at("out/structure_module/traj");
  expect_like_alphafold(out.structure.translations.detach(), traj.narrow(-1, 4, 3), "backbone origins");

  const AlphaFoldLoss loss = alphafold_loss(out, golden_labels(geometry, iterations - 1), geometry, model->sizes, {});
  expect_like_alphafold(loss.distogram.detach(), golden.at("loss/distogram"), "distogram loss");
  expect_like_alphafold(loss.masked_msa.detach(), golden.at("loss/masked_msa"), "masked MSA loss");
  expect_like_alphafold(loss.plddt.detach(), golden.at("loss/predicted_lddt"), "pLDDT loss");
  expect_like_alphafold(loss.structure.loss.detach(), golden.at("loss/structure_module/loss"), "structure loss");
  expect_like_alphafold(loss.total.detach(), golden.at("loss/total"), "total loss");

  loss.total.backward();
  const io::NpzArrays& grads = testing::alphafold_golden("grads.npz");
  double worst = 0;
  for (const AlphaFoldParameter& p : alphafold_parameters(*model)) {
    ASSERT_TRUE(grads.count(p.key)) << p.key;
    const torch::Tensor expected = p.block >= 0 ? grads.at(p.key)[p.block] : grads.at(p.key);
    const double scale = expected.abs().max().item<double>();
    const double difference = (p.tensor.grad() - expected).abs().max().item<double>();
    if (scale > 1e-4) worst = std::max(worst, difference / scale);
  }
  std::cout << "  worst relative gradient difference: " << worst << "\n";
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
}  // namespace kuafu::fold
