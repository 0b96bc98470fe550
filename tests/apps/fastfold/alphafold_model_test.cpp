// The whole model with recycling against DeepMind's AlphaFold 2.3 (golden model.npz and grads.npz: d1crj's
// first 24 residues, a synthetic MSA, three iterations with the MSA resampled in each, the loss on the
// last), and the parameter file written back as AlphaFold's.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "apps/fastfold/alphafold_losses.h"
#include "apps/fastfold/alphafold_model.h"
#include "apps/fastfold/residue_types.h"
#include "apps/fastfold/structure_labels.h"
#include "apps/fastfold/violations.h"
#include "core/util/error.h"
#include "tests/apps/fastfold/alphafold_golden.h"
#include "tests/support/devices.h"
#include "tests/support/run_command.h"
#include "tests/support/test_util.h"

namespace kuafu::fold {
namespace {
using testing::expect_like_alphafold;

const std::string kInitialStage = "alphafold_tiny", kFineTuningStage = "alphafold_tiny_finetune";

torch::Tensor feature(const std::string& name, int64_t iteration = 0, const std::string& stage = kInitialStage) {
  return testing::alphafold_golden("model.npz", stage).at("feat/" + name)[iteration];
}

AlphaFoldFeatures golden_features(int64_t i, const std::string& stage = kInitialStage) {
  const auto floats = [&](const std::string& name) { return feature(name, i, stage); };
  const auto longs = [&](const std::string& name) { return floats(name).to(torch::kInt64); };
  return {longs("aatype"),          longs("residue_index"), floats("seq_mask"),            floats("target_feat"),
          floats("msa_feat"),       floats("msa_mask"),     longs("extra_msa"),            floats("extra_has_deletion"),
          floats("extra_deletion_value"),                   floats("extra_msa_mask")};
}

// Features and labels in another floating dtype.
AlphaFoldFeatures converted(AlphaFoldFeatures f, torch::Dtype dtype) {
  for (torch::Tensor* t : {&f.seq_mask, &f.target_feat, &f.msa_feat, &f.msa_mask, &f.extra_has_deletion,
                           &f.extra_deletion_value, &f.extra_msa_mask})
    *t = t->to(dtype);
  return f;
}

AlphaFoldLabels golden_labels(const ResidueGeometry& geometry, int64_t last, torch::Dtype dtype = torch::kFloat32,
                              const std::string& stage = kInitialStage) {
  const auto feature = [&stage](const std::string& name, int64_t i) { return fold::feature(name, i, stage); };
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
AlphaFoldOutputs run_like_alphafold(AlphaFoldImpl& model, const io::NpzArrays& golden, const ResidueGeometry& geometry,
                                    const std::string& stage = kInitialStage) {
  const int64_t iterations = testing::alphafold_golden("model.npz", stage).at("feat/aatype").size(0);
  const auto options = torch::TensorOptions(torch::kFloat32).device(geometry.atom14_positions.device());
  Recycled previous = Recycled::zeros(24, model.sizes, options);
  AlphaFoldOutputs out;
  for (int64_t i = 0; i < iterations; ++i) {
    const bool last = i + 1 == iterations;
    torch::AutoGradMode grad(last);
    out = model.iteration(golden_features(i, stage).to(options), previous, geometry);
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

// AlphaFold's fine-tuning stage (golden alphafold_tiny_finetune: its parameters carry the experimentally-resolved
// head, the structural violation loss weighs 1 and the experimentally-resolved loss 0.01): the head's logits,
// the two losses, the total and d(total)/d(parameter) for all 265 parameters, at the initial stage's tolerances
// (float32 both sides; the measured figures are printed).
TEST(AlphaFoldModelTest, TheFineTuningStageIsAlphaFoldsInValueLossAndGradient) {
  const io::NpzArrays& golden = testing::alphafold_golden("model.npz", kFineTuningStage);
  AlphaFoldSizes sizes = testing::golden_tiny_sizes();
  sizes.experimentally_resolved_head = true;
  AlphaFold model(sizes);
  const io::NpzArrays& params = testing::alphafold_golden("params/params_model_tiny.npz", kFineTuningStage);
  load_alphafold(*model, params);
  EXPECT_TRUE(unused_alphafold_arrays(*model, params).empty());
  const ResidueGeometry geometry = testing::alphafold_residue_geometry();
  const AlphaFoldOutputs out = run_like_alphafold(*model, golden, geometry, kFineTuningStage);
  expect_like_alphafold(out.experimentally_resolved_logits.detach(), golden.at("out/experimentally_resolved/logits"),
                        "experimentally-resolved logits");

  const int64_t last = golden.at("feat/aatype").size(0) - 1;
  AlphaFoldLabels labels = golden_labels(geometry, last, torch::kFloat32, kFineTuningStage);
  labels.residue_index = feature("residue_index", last, kFineTuningStage).to(torch::kInt64);
  // AlphaFold's atom37_atom_exists is the residue types' table, which the loss reads from the geometry.
  EXPECT_TRUE(torch::equal(geometry.atom37_exists.index_select(0, labels.structure.aatype).to(torch::kFloat32),
                           feature("atom37_atom_exists", last, kFineTuningStage)));
  AlphaFoldLossSettings settings;
  settings.experimentally_resolved_weight = 0.01;
  const AlphaFoldLoss loss = alphafold_loss(out, labels, geometry, model->sizes, settings);
  expect_like_alphafold(loss.experimentally_resolved.detach(), golden.at("loss/experimentally_resolved"), "experimentally-resolved loss");
  // The violation loss at weight 1 with AlphaFold's constants and bounds (Kuafu's own are measured from Debian's
  // PDB files: ViolationsTest), which AlphaFold adds into the structure module's loss.
  const StructureLabels& s = labels.structure;
  const torch::Tensor atom14 = out.structure.atom14.select(0, -1);  // [R, 14, 3]
  torch::Tensor violation = violation_loss(structural_violations(atom14, s.atom14_type_exists, s.aatype, labels.residue_index,
                                                                 testing::alphafold_distance_bounds(),
                                                                 testing::alphafold_violation_settings()),
                                           s.atom14_type_exists);
  // AlphaFold spares every pair of atoms in cysteine SG's atom14 slot (5) from the clash check, whatever their
  // residues; Kuafu spares only two cysteines' SG. What Kuafu adds for the others' pairs, worked here (each pair's
  // overlap counts for both atoms), is taken off to compare: d1crj's crop has such pairs (0.27 Å of overlap).
  {
    constexpr int64_t kSlot = 5;
    const torch::Tensor exists = s.atom14_type_exists.select(1, kSlot);                                   // [R]
    const torch::Tensor radius = atom14_radii().index_select(0, s.aatype).select(1, kSlot) * exists;     // [R]
    const torch::Tensor points = atom14.select(1, kSlot);                                                 // [R, 3]
    const torch::Tensor distance = torch::sqrt(1e-10 + (points.unsqueeze(1) - points.unsqueeze(0)).square().sum(-1));  // [R, R]
    const torch::Tensor cys = (s.aatype == residue_type_index('C')).to(torch::kFloat32);
    const torch::Tensor pairs = exists.unsqueeze(1) * exists.unsqueeze(0) * (1 - cys.unsqueeze(1) * cys.unsqueeze(0)) *
                                (labels.residue_index.unsqueeze(1) < labels.residue_index.unsqueeze(0)).to(torch::kFloat32);
    const torch::Tensor overlap =
        pairs * torch::relu(radius.unsqueeze(1) + radius.unsqueeze(0) - testing::alphafold_violation_settings().clash_overlap - distance);
    std::cout << "  overlap of non-cysteine pairs in SG's slot: " << overlap.sum().item<double>() << " Å\n";
    EXPECT_GT(overlap.sum().item<double>(), 0.01);  // the difference is there to be taken off
    violation = violation - 2 * overlap.sum() / (1e-6 + s.atom14_type_exists.sum());
  }
  expect_like_alphafold((loss.structure.loss + violation).detach(), golden.at("loss/structure_module/loss"),
                        "structure and violation loss");
  const torch::Tensor total = loss.total + violation;
  expect_like_alphafold(total.detach(), golden.at("loss/total"), "total loss");

  total.backward();
  const io::NpzArrays& grads = testing::alphafold_golden("grads.npz", kFineTuningStage);
  const std::vector<AlphaFoldParameter> parameters = alphafold_parameters(*model);
  std::set<std::string> keys;
  for (const AlphaFoldParameter& p : parameters) keys.insert(p.key);
  EXPECT_EQ(keys.size(), 265u);
  double worst = 0;
  for (const AlphaFoldParameter& p : parameters) {
    ASSERT_TRUE(grads.count(p.key)) << p.key;
    const torch::Tensor expected = p.block >= 0 ? grads.at(p.key)[p.block] : grads.at(p.key);
    const double scale = expected.abs().max().item<double>();
    const double difference = (p.tensor.grad() - expected).abs().max().item<double>();
    if (scale > 1e-4) worst = std::max(worst, difference / scale);
  }
  for (const std::string head_key : {"alphafold/alphafold_iteration/experimentally_resolved_head/logits//weights",
                                     "alphafold/alphafold_iteration/experimentally_resolved_head/logits//bias"})
    EXPECT_GT(grads.at(head_key).abs().max().item<double>(), 1e-4) << head_key << ": the head's gradient must be compared";
  std::cout << "  worst relative gradient difference: " << worst << "\n";
  EXPECT_LT(worst, 1e-4);
}

// The experimentally-resolved loss worked by hand on three residues (alanine, glycine, a padded one) whose source
// records the backbone only (N, CA, C, O, as ProMod3's database does): the sigmoid cross-entropy of each logit
// against the truth's mask, averaged over the atoms the residue's type has and the source records, so neither
// alanine's CB nor the padding counts (float64, 1e-12: the same sums in another order).
TEST(AlphaFoldLossTest, TheExperimentallyResolvedLossCountsTheAtomsTheSourceRecords) {
  const ResidueGeometry geometry = testing::alphafold_residue_geometry().to(torch::kFloat64);
  torch::manual_seed(3);
  const torch::Tensor logits = torch::randn({3, kAtom37}, torch::kFloat64);
  AlphaFoldLabels labels;
  labels.structure.aatype = torch::tensor({residue_type_index('A'), residue_type_index('G'), residue_type_index('A')}, torch::kInt64);
  labels.structure.residue_mask = torch::tensor({1.0, 1.0, 0.0}, torch::kFloat64);
  labels.mask = torch::zeros({3, kAtom37}, torch::kFloat64);
  const int64_t n = atom37_index("N"), ca = atom37_index("CA"), c = atom37_index("C"), o = atom37_index("O"), cb = atom37_index("CB");
  for (const int64_t a : {n, ca, c, o}) labels.mask[0][a] = 1.0;
  for (const int64_t a : {n, ca, c}) labels.mask[1][a] = 1.0;  // glycine's O unresolved
  labels.recorded_atoms = torch::zeros({kAtom37}, torch::kFloat64);
  for (const int64_t a : {n, ca, c, o}) labels.recorded_atoms[a] = 1.0;

  const auto cross_entropy = [&](int64_t r, int64_t a) {
    const double x = logits[r][a].item<double>(), y = labels.mask[r][a].item<double>();
    const double p = 1.0 / (1.0 + std::exp(-x));
    return -(y * std::log(p) + (1 - y) * std::log(1 - p));
  };
  double sum = 0;
  for (const int64_t r : {0, 1})
    for (const int64_t a : {n, ca, c, o}) sum += cross_entropy(r, a);
  // AlphaFold's 1e-8 beside the count of atoms.
  EXPECT_NEAR(experimentally_resolved_loss(logits, labels, geometry).item<double>(), sum / (8.0 + 1e-8), 1e-12);
  // A full-atom source (every type recorded) counts alanine's CB as unresolved too.
  labels.recorded_atoms = torch::Tensor();
  EXPECT_NEAR(experimentally_resolved_loss(logits, labels, geometry).item<double>(), (sum + cross_entropy(0, cb)) / (9.0 + 1e-8), 1e-12);
}

// predict's bf16 inference (precision.dtype = "bf16"): the trunk (embedders, both stacks) in bfloat16, the
// structure module and the heads in float32, against AlphaFold's float32 values on the golden batch with
// recycling. bf16 keeps 8 bits of mantissa (a relative rounding of 2^-9 per operation); the golden model's
// random weights (noise on every parameter) amplify it: after one iteration the pair is 3.2% of its largest
// entry off, after three the backbone origins 0.87 Å (of 34 Å), pLDDT 0.15 and the distogram logits 11% of the
// largest. The bounds are about three times those: a mask or feature left in the wrong dtype, or a stage
// skipped, is off by far more. The outputs must come out in float32, the pair (what is recycled) in bf16.
TEST(AlphaFoldModelTest, ATrunkInBf16StaysNearAlphaFoldsFloat32) {
  const io::NpzArrays& golden = testing::alphafold_golden("model.npz");
  for (const torch::Device& device : kuafu::testing::devices_to_test()) {  // the GPU's bf16 kernels too, where one is visible
    SCOPED_TRACE(device.str());
    AlphaFold model(testing::golden_tiny_sizes());
    load_alphafold(*model, testing::alphafold_golden("params/params_model_tiny.npz"));
    model->to(device);
    model->evoformer->to(torch::kBFloat16);
    ASSERT_EQ(model->trunk_dtype(), torch::kBFloat16);
    ASSERT_EQ(model->output_dtype(), torch::kFloat32);
    torch::NoGradGuard no_grad;
    const auto options = torch::TensorOptions(torch::kFloat32).device(device);
    std::vector<AlphaFoldFeatures> iterations;
    for (int64_t i = 0; i < golden.at("feat/aatype").size(0); ++i) iterations.push_back(golden_features(i).to(options));
    const AlphaFoldOutputs out = model->forward(iterations, testing::alphafold_residue_geometry().to(options));
    EXPECT_EQ(out.pair.scalar_type(), torch::kBFloat16);  // recycled into the trunk; the tail reads it in chunks
    EXPECT_EQ(out.atom37.scalar_type(), torch::kFloat32);
    EXPECT_EQ(out.distogram_logits.scalar_type(), torch::kFloat32);
    const auto largest_difference = [](const torch::Tensor& actual, const torch::Tensor& expected) {
      return (actual.cpu().to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
    };
    const double origins = largest_difference(out.structure.translations, golden.at("out/structure_module/traj").narrow(-1, 4, 3));
    const double plddt = largest_difference(plddt_of_logits(out.plddt_logits), golden.at("out/plddt"));
    const torch::Tensor distogram = golden.at("out/distogram/logits");
    const double logits = largest_difference(out.distogram_logits, distogram) / distogram.abs().max().item<double>();
    std::cout << "  " << device << ", bf16 trunk: backbone origins within " << origins << " Å, pLDDT within " << plddt
              << ", distogram logits within " << logits << " of the largest\n";
    EXPECT_LT(origins, 2.5);
    EXPECT_LT(plddt, 0.5);
    EXPECT_LT(logits, 0.3);
  }
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
