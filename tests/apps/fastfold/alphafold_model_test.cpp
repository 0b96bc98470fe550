// The whole model with recycling against DeepMind's AlphaFold 2.3 (golden model.npz and grads.npz: d1crj's
// first 24 residues, a synthetic MSA, three iterations with the MSA resampled in each, the loss on the
// last), and the parameter file written back as AlphaFold's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "apps/fastfold/alphafold_losses.h"
#include "apps/fastfold/alphafold_model.h"
#include "apps/fastfold/structure_labels.h"
#include "core/util/error.h"
#include "tests/apps/fastfold/alphafold_golden.h"
#include "tests/support/devices.h"
#include "tests/support/run_command.h"
#include "tests/support/test_util.h"

namespace kuafu::fold {
namespace {
using testing::expect_like_alphafold;

torch::Tensor feature(const std::string& name, int64_t iteration = 0) {
  return testing::alphafold_golden("model.npz").at("feat/" + name)[iteration];
}

AlphaFoldFeatures golden_features(int64_t i) {
  const auto longs = [&](const std::string& name) { return feature(name, i).to(torch::kInt64); };
  return {longs("aatype"),          longs("residue_index"), feature("seq_mask", i),        feature("target_feat", i),
          feature("msa_feat", i),   feature("msa_mask", i), longs("extra_msa"),            feature("extra_has_deletion", i),
          feature("extra_deletion_value", i),                feature("extra_msa_mask", i)};
}

// Features and labels in another floating dtype.
AlphaFoldFeatures converted(AlphaFoldFeatures f, torch::Dtype dtype) {
  for (torch::Tensor* t : {&f.seq_mask, &f.target_feat, &f.msa_feat, &f.msa_mask, &f.extra_has_deletion,
                           &f.extra_deletion_value, &f.extra_msa_mask})
    *t = t->to(dtype);
  return f;
}

AlphaFoldLabels golden_labels(const ResidueGeometry& geometry, int64_t last, torch::Dtype dtype = torch::kFloat32) {
  AlphaFoldLabels labels;
  labels.positions = feature("all_atom_positions", last).to(dtype);
  labels.mask = feature("all_atom_mask", last).to(dtype);
  const torch::Tensor aatype = feature("aatype", last).to(torch::kInt64);
  labels.structure = structure_labels(geometry, aatype, labels.positions, labels.mask, feature("seq_mask", last).to(dtype),
                                      feature("use_clamped_fape", last).item<double>());
  std::tie(labels.pseudo_beta, labels.pseudo_beta_mask) = pseudo_beta(aatype, labels.positions, labels.mask);
  labels.true_msa = feature("true_msa", last).to(torch::kInt64);
  labels.bert_mask = feature("bert_mask", last).to(dtype);
  labels.resolution = feature("resolution", last).item<double>();
  return labels;
}

// The golden batch's iterations through `model` (gradients on the last) on the device of `geometry`, each
// iteration's recycled values and the last one's representations and logits against `golden`'s (AlphaFold's
// on the same parameters).
AlphaFoldOutputs run_like_alphafold(AlphaFoldImpl& model, const io::NpzArrays& golden, const ResidueGeometry& geometry) {
  const int64_t iterations = testing::alphafold_golden("model.npz").at("feat/aatype").size(0);
  const auto options = torch::TensorOptions(torch::kFloat32).device(geometry.atom14_positions.device());
  Recycled previous = Recycled::zeros(24, model.sizes, options);
  AlphaFoldOutputs out;
  for (int64_t i = 0; i < iterations; ++i) {
    const bool last = i + 1 == iterations;
    torch::AutoGradMode grad(last);
    out = model.iteration(golden_features(i).to(options), previous, geometry);
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
  return out;
}

void expect_alphafolds_values_and_loss_on(const torch::Device& device) {
  const io::NpzArrays& golden = testing::alphafold_golden("model.npz");
  AlphaFold model(testing::golden_tiny_sizes());
  load_alphafold(*model, testing::alphafold_golden("params/params_model_tiny.npz"));
  model->to(device);
  const auto options = torch::TensorOptions(torch::kFloat32).device(device);
  const ResidueGeometry geometry = testing::alphafold_residue_geometry().to(options);
  const int64_t iterations = golden.at("feat/aatype").size(0);
  const AlphaFoldOutputs out = run_like_alphafold(*model, golden, geometry);
  expect_like_alphafold(plddt_of_logits(out.plddt_logits.detach()), golden.at("out/plddt"), "pLDDT");
  const torch::Tensor traj = golden.at("out/structure_module/traj");
  expect_like_alphafold(out.structure.translations.detach(), traj.narrow(-1, 4, 3), "backbone origins");

  const AlphaFoldLabels labels = golden_labels(testing::alphafold_residue_geometry(), iterations - 1).to(options);
  const AlphaFoldLoss loss = alphafold_loss(out, labels, geometry, model->sizes, {});
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
    const double difference = (p.tensor.grad().cpu() - expected).abs().max().item<double>();
    if (scale > 1e-4) worst = std::max(worst, difference / scale);
  }
  std::cout << "  worst relative gradient difference: " << worst << "\n";
  EXPECT_LT(worst, 1e-4);
}

// On every device the machine has (the CPU, and a GPU where one is visible: the CUDA path against the same
// golden values, at the same tolerances).
TEST(AlphaFoldModelTest, WithRecyclingIsAlphaFoldsInValueAndLoss) {
  for (const torch::Device& device : kuafu::testing::devices_to_test()) {
    SCOPED_TRACE(device.str());
    expect_alphafolds_values_and_loss_on(device);
  }
}

// predict's bf16 inference (precision.dtype = "bf16"): the trunk (embedders, both stacks) in bfloat16, the
// structure module and the heads in float32, against AlphaFold's float32 values on the golden batch with
// recycling. bf16 keeps 8 bits of mantissa (a relative rounding of 2^-9 per operation); the golden model's
// random weights (noise on every parameter) amplify it: after one iteration the pair is 3.2% of its largest
// entry off, after three the backbone origins 0.87 Å (of 34 Å), pLDDT 0.15 and the distogram logits 11% of the
// largest. The bounds are about three times those: a mask or feature left in the wrong dtype, or a stage
// skipped, is off by far more. The outputs must come out in float32.
TEST(AlphaFoldModelTest, ATrunkInBf16StaysNearAlphaFoldsFloat32) {
  const io::NpzArrays& golden = testing::alphafold_golden("model.npz");
  AlphaFold model(testing::golden_tiny_sizes());
  load_alphafold(*model, testing::alphafold_golden("params/params_model_tiny.npz"));
  model->evoformer->to(torch::kBFloat16);
  ASSERT_EQ(model->trunk_dtype(), torch::kBFloat16);
  ASSERT_EQ(model->output_dtype(), torch::kFloat32);
  torch::NoGradGuard no_grad;
  std::vector<AlphaFoldFeatures> iterations;
  for (int64_t i = 0; i < golden.at("feat/aatype").size(0); ++i) iterations.push_back(golden_features(i));
  const AlphaFoldOutputs out = model->forward(iterations, testing::alphafold_residue_geometry());
  EXPECT_EQ(out.pair.scalar_type(), torch::kFloat32);
  EXPECT_EQ(out.atom37.scalar_type(), torch::kFloat32);
  const auto largest_difference = [](const torch::Tensor& actual, const torch::Tensor& expected) {
    return (actual.to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
  };
  const double origins = largest_difference(out.structure.translations, golden.at("out/structure_module/traj").narrow(-1, 4, 3));
  const double plddt = largest_difference(plddt_of_logits(out.plddt_logits), golden.at("out/plddt"));
  const torch::Tensor distogram = golden.at("out/distogram/logits");
  const double logits = largest_difference(out.distogram_logits, distogram) / distogram.abs().max().item<double>();
  std::cout << "  bf16 trunk: backbone origins within " << origins << " Å, pLDDT within " << plddt
            << ", distogram logits within " << logits << " of the largest\n";
  EXPECT_LT(origins, 2.5);
  EXPECT_LT(plddt, 0.5);
  EXPECT_LT(logits, 0.3);
}

// In float64 against AlphaFold run in float64 (model_float64.npz, alphafold_reference_float64.py) on the
// same float32 batch and labels: the total loss within 1e-9 (measured 4e-10) and all 263 parameters'
// gradients within 1e-6 of the largest entry (measured 2.6e-7: AlphaFold does not renormalise the labels'
// float32 quaternions). Float32's 2.5e-5 above is AlphaFold's own float32 rounding through the structure
// module's frames.
TEST(AlphaFoldModelTest, GradientsInFloat64AreAlphaFoldsInFloat64) {
  const io::NpzArrays& golden = testing::alphafold_golden("model_float64.npz");
  AlphaFold model(testing::golden_tiny_sizes());
  load_alphafold(*model, testing::alphafold_golden("params/params_model_tiny.npz"));
  model->to(torch::kFloat64);
  const auto options = torch::TensorOptions(torch::kFloat64);
  const ResidueGeometry geometry = testing::alphafold_residue_geometry().to(options);
  std::vector<AlphaFoldFeatures> iterations;
  for (int64_t i = 0; i < 3; ++i) iterations.push_back(converted(golden_features(i), torch::kFloat64));
  const AlphaFoldOutputs out = model->forward(iterations, geometry);
  AlphaFoldLabels labels = golden_labels(geometry, 2, torch::kFloat64);
  // AlphaFold's labels were worked out in float32: the same values, not ours from the atoms in float64.
  labels.structure = testing::golden_structure_labels(testing::alphafold_golden("model.npz"), "feat/", 2).to(options);
  const AlphaFoldLoss loss = alphafold_loss(out, labels, geometry, model->sizes, {});
  expect_like_alphafold(loss.total.detach(), golden.at("loss/total"), "total loss", 1e-9);
  loss.total.backward();
  double worst = 0;
  for (const AlphaFoldParameter& p : alphafold_parameters(*model)) {
    ASSERT_TRUE(golden.count(p.key)) << p.key;
    const torch::Tensor expected = p.block >= 0 ? golden.at(p.key)[p.block] : golden.at(p.key);
    const double scale = expected.abs().max().item<double>();
    if (scale > 1e-4) worst = std::max(worst, (p.tensor.grad() - expected).abs().max().item<double>() / scale);
  }
  std::cout << "  worst relative gradient difference: " << worst << "\n";
  EXPECT_LT(worst, 1e-6);
}

// The parameters written back in params_model_*.npz's layout are the file read: the same 263 keys, shapes and
// values, so AlphaFold's loader reads Kuafu's export as it reads DeepMind's files.
TEST(AlphaFoldModelTest, WritesBackTheParameterFileItRead) {
  const io::NpzArrays& params = testing::alphafold_golden("params/params_model_tiny.npz");
  AlphaFold model(testing::golden_tiny_sizes());
  load_alphafold(*model, params);
  const std::string path = ::testing::TempDir() + "/params_model_tiny.npz";
  io::write_npz(path, alphafold_arrays(*model));
  const io::NpzArrays back = io::read_npz(path);
  ASSERT_EQ(back.size(), params.size());
  for (const auto& [key, value] : params) {
    ASSERT_TRUE(back.count(key)) << key;
    EXPECT_TRUE(torch::equal(back.at(key), value)) << key;
  }
}

// What `kuafu-fold export` writes runs in DeepMind's AlphaFold as in Kuafu. The golden kuafu_export
// (kuafu_export_reference.sh) is a model kuafu-fold trained 40 steps from its own initial values and
// exported, and AlphaFold's outputs on it (read by its own loader, which found exactly its 263 parameters at
// its shapes). Here `kuafu-fold export` starting from that file writes it back unchanged, and Kuafu's
// recycled run on it gives AlphaFold's values and losses within 1e-5 of the largest entry (float32, as above).
TEST(AlphaFoldModelTest, AlphaFoldRunsKuafusExportAsKuafuDoes) {
  const std::filesystem::path golden_dir = std::filesystem::path(KUAFU_SOURCE_DIR) / "tests/apps/fastfold/golden/alphafold_tiny";
  const std::string params_path = (golden_dir / "kuafu_export/params/params_model_kuafu.npz").string();
  const std::filesystem::path dir = kuafu::testing::temp_dir("fold_export");
  std::ofstream config(dir / "c.toml");
  config << "[model]\n";
  const nlohmann::json sizes = nlohmann::json::parse(std::ifstream(golden_dir / "kuafu_export/kuafu_fold_model.json"));
  for (const auto& [key, value] : sizes.items())
    config << key.substr(key.find('.') + 1) << " = " << value.get<int64_t>() << "\n";
  config.close();
  const kuafu::testing::CommandResult exported = kuafu::testing::run_command(
      std::string(KUAFU_FOLD_PATH) + " export --config " + (dir / "c.toml").string() + " --set model.init_from=" + params_path +
      " --checkpoint init --out " + (dir / "export").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const io::NpzArrays read = io::read_npz(params_path), written = io::read_npz((dir / "export/params_model_kuafu.npz").string());
  ASSERT_EQ(written.size(), read.size());
  for (const auto& [key, value] : read) {
    ASSERT_TRUE(written.count(key)) << key;
    EXPECT_TRUE(torch::equal(written.at(key), value)) << key;
  }

  const io::NpzArrays& golden = testing::alphafold_golden("kuafu_export/model.npz");
  AlphaFold model(testing::golden_tiny_sizes());
  load_alphafold(*model, read);
  const ResidueGeometry geometry = testing::alphafold_residue_geometry();
  const AlphaFoldOutputs out = run_like_alphafold(*model, golden, geometry);
  expect_like_alphafold(out.atom37.detach(), golden.at("out/structure_module/final_atom_positions"), "atoms");
  const AlphaFoldLoss loss = alphafold_loss(out, golden_labels(geometry, 2), geometry, model->sizes, {});
  expect_like_alphafold(loss.structure.loss.detach(), golden.at("loss/structure_module/loss"), "structure loss");
  expect_like_alphafold(loss.total.detach(), golden.at("loss/total"), "total loss");
}

// A parameter file of another model is refused naming the array.
TEST(AlphaFoldModelTest, RefusesAParameterFileOfAnotherShape) {
  AlphaFoldSizes wider = testing::golden_tiny_sizes();
  wider.msa_channels = 32;
  AlphaFold model(wider);
  try {
    load_alphafold(*model, testing::alphafold_golden("params/params_model_tiny.npz"));
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("alphafold/alphafold_iteration/evoformer/"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kuafu::fold
