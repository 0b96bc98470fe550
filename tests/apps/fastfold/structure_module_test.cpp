// Invariant point attention against DeepMind's AlphaFold 2.3 (the golden files of evoformer_test.cpp), and
// invariant under a global motion of the frames in double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>

#include <torch/torch.h>

#include "apps/fastfold/heads.h"
#include "apps/fastfold/structure_losses.h"
#include "apps/fastfold/structure_module.h"
#include "core/io/npz.h"
#include "tests/apps/fastfold/alphafold_golden.h"

namespace kuafu::fold {
namespace {
using testing::expect_like_alphafold;
using testing::flat12;
using testing::golden_structure_labels;
using testing::rigid_of_flat12;

const std::string kIpa = "alphafold/alphafold_iteration/structure_module/fold_iteration/invariant_point_attention";

// The tiny model's IPA (golden config.json): c_s 16, c_z 8, 2 heads, 4 scalar q/k and v, 2 q/k points, 3 value points.
const IpaSizes kTinyIpa{16, 8, 2, 4, 4, 2, 3};

// The frames of AlphaFold's affine tensor [R, 7] (quaternion w, x, y, z then translation) as its
// QuatAffine.from_tensor reads it: the quaternion not normalised, so the rotation is |q|² times a proper one.
Rigid frames_of_affine(const torch::Tensor& affine) {
  const torch::Tensor q = affine.narrow(-1, 0, 4);
  return {quaternion_to_rotation(q) * q.square().sum(-1).view({-1, 1, 1}), affine.narrow(-1, 4, 3)};
}


TEST(InvariantPointAttentionTest, IsAlphaFoldsInValueAndGradient) {
  const io::NpzArrays& params = testing::alphafold_golden("params/params_model_tiny.npz");
  const io::NpzArrays& golden = testing::alphafold_golden("structure.npz");
  const std::string t = "invariant_point_attention/";
  InvariantPointAttention ipa(kTinyIpa);
  load_alphafold_parameters(*ipa, params, kIpa);
  const torch::Tensor s = golden.at(t + "in/inputs_1d").clone().requires_grad_();
  const torch::Tensor z = golden.at(t + "in/inputs_2d").clone().requires_grad_();
  const torch::Tensor affine = golden.at(t + "in/affine").clone().requires_grad_();
  const torch::Tensor out = ipa->forward(s, z, frames_of_affine(affine), golden.at(t + "in/mask").squeeze(-1));
  expect_like_alphafold(out.detach(), golden.at(t + "out/out"), "output");
  (out * golden.at(t + "dout/out")).sum().backward();
  expect_like_alphafold(s.grad(), golden.at(t + "grad/inputs_1d"), "d/d inputs_1d");
  expect_like_alphafold(z.grad(), golden.at(t + "grad/inputs_2d"), "d/d inputs_2d");
  expect_like_alphafold(affine.grad(), golden.at(t + "grad/affine"), "d/d affine");
  testing::expect_parameter_gradients_like_alphafold(*ipa, golden, "invariant_point_attention", kIpa);
}

// The tiny model's structure module (golden config.json): c_s 16, 2 layers, 3 transition layers, angle ResNet 8
// wide with 2 blocks.
StructureModuleSizes tiny_structure_module() {
  StructureModuleSizes sizes;
  sizes.single_channels = 16;
  sizes.ipa = kTinyIpa;
  sizes.layers = 2;
  sizes.angle_channels = 8;
  return sizes;
}

// The golden tiny model's structure module with DeepMind's parameters, in `dtype`.
StructureModule golden_structure_module(torch::Dtype dtype = torch::kFloat32) {
  StructureModule module(tiny_structure_module());
  load_alphafold_parameters(*module, testing::alphafold_golden("params/params_model_tiny.npz"), "alphafold/alphafold_iteration/structure_module");
  module->to(dtype);
  return module;
}

// The structure module on random single and pair representations, run on AlphaFold's residue tables.
TEST(StructureModuleTest, IsAlphaFoldsInValue) {
  const io::NpzArrays& golden = testing::alphafold_golden("structure.npz");
  const std::string t = "structure_module/";
  StructureModule module = golden_structure_module();
  const ResidueGeometry geometry = testing::alphafold_residue_geometry();
  const torch::Tensor aatype = golden.at(t + "in/aatype").to(torch::kInt64);
  const StructureOutputs out =
      module->forward(golden.at(t + "in/single"), golden.at(t + "in/pair"), aatype, golden.at(t + "in/seq_mask"), geometry);
  expect_like_alphafold(out.single.detach(), golden.at(t + "out/act"), "single");
  const torch::Tensor traj = golden.at(t + "out/traj");  // [L, R, 7]
  expect_like_alphafold(out.quaternions.detach(), traj.narrow(-1, 0, 4), "quaternions");
  expect_like_alphafold(out.translations.detach(), traj.narrow(-1, 4, 3), "translations");
  expect_like_alphafold(out.unnormalized_angles.detach(), golden.at(t + "out/sidechains/unnormalized_angles_sin_cos"),
                        "unnormalised angles");
  expect_like_alphafold(out.angles.detach(), golden.at(t + "out/sidechains/angles_sin_cos"), "angles");
  expect_like_alphafold(flat12(out.frames).detach(), golden.at(t + "out/sidechains/frames"), "frames");
  expect_like_alphafold(out.atom14.detach(), golden.at(t + "out/sidechains/atom_pos"), "atom14");
  const torch::Tensor atom37 = atom14_to_atom37(geometry, aatype, out.atom14.select(0, -1));
  expect_like_alphafold(atom37.detach(), golden.at(t + "out/final_atom_positions"), "atom37");
}

// The losses against the chain's truth, and the gradient of their sum with respect to the inputs and every
// parameter (violations are not computed: their weight is 0 in AlphaFold's initial training). In float32
// against AlphaFold's float32, values to 1e-5 and gradients to 1e-4 of their largest entry: AlphaFold's own
// float32 gradients through the backbone frames differ from its float64 ones by up to 7.7e-5 (those of the
// side-chain path by 1e-6); in float64 against AlphaFold's float64 (structure_float64.npz), to 1e-6 (measured
// 1.2e-7: the truth's quaternions are float32, unit to ~1e-7, and AlphaFold does not renormalise them).
TEST(StructureModuleTest, LossesAndGradientsAreAlphaFolds) {
  const io::NpzArrays& golden32 = testing::alphafold_golden("structure.npz");
  const io::NpzArrays& golden64 = testing::alphafold_golden("structure_float64.npz");
  const std::string t = "structure_module/";
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kFloat64}) {
    const bool single_precision = dtype == torch::kFloat32;
    const io::NpzArrays& golden = single_precision ? golden32 : golden64;
    const double gradient_tolerance = single_precision ? 1e-4 : 1e-6;
    std::cout << (single_precision ? "float32\n" : "float64\n");
    const auto options = torch::TensorOptions(dtype);
    StructureModule module = golden_structure_module(dtype);
    const ResidueGeometry geometry = testing::alphafold_residue_geometry().to(options);
    const StructureLabels labels = golden_structure_labels(golden32, t + "in/").to(options);
    const torch::Tensor single = golden32.at(t + "in/single").to(dtype).clone().requires_grad_();
    const torch::Tensor pair = golden32.at(t + "in/pair").to(dtype).clone().requires_grad_();
    const StructureOutputs out = module->forward(single, pair, labels.aatype, labels.residue_mask, geometry);
    const StructureLoss loss = structure_module_loss(out, labels, geometry, StructureLossSettings{});
    if (single_precision) {
      EXPECT_TRUE(torch::equal(loss.alt_naming_is_better, golden.at(t + "out/alt_naming_is_better")));
      std::cout << "  symmetric side chains renamed: " << loss.alt_naming_is_better.sum().item<float>() << "\n";
      expect_like_alphafold(loss.renamed_positions, golden.at(t + "out/renamed_atom14_gt_positions"), "renamed truth");
      expect_like_alphafold(loss.renamed_exists, golden.at(t + "out/renamed_atom14_gt_exists"), "renamed mask");
    }
    expect_like_alphafold(loss.fape.detach(), golden.at(t + "loss/fape"), "fape");
    expect_like_alphafold(loss.sidechain_fape.detach(), golden.at(t + "loss/sidechain_fape"), "side-chain fape");
    expect_like_alphafold(loss.chi.detach(), golden.at(t + "loss/chi_loss"), "chi loss");
    expect_like_alphafold(loss.angle_norm.detach(), golden.at(t + "loss/angle_norm_loss"), "angle norm loss");
    expect_like_alphafold(loss.loss.detach(), golden.at(t + "loss/loss"), "loss");
    loss.loss.backward();
    expect_like_alphafold(single.grad(), golden.at(t + "grad/single"), "d/d single", gradient_tolerance);
    expect_like_alphafold(pair.grad(), golden.at(t + "grad/pair"), "d/d pair", gradient_tolerance);
    testing::expect_parameter_gradients_like_alphafold(*module, golden, "structure_module",
                                                       "alphafold/alphafold_iteration/structure_module", gradient_tolerance);
  }
}

// FAPE compares each structure in its own frames: moving the prediction (frames and points) or the truth by
// a global rotation and translation leaves it unchanged, and the atoms Algorithm 24 places from moved
// backbone frames are the moved atoms (double precision: 1e-10).
TEST(StructureModuleTest, FapeIsInvariantAndAtomPlacementEquivariantUnderAGlobalMotion) {
  auto g = at::detail::createCPUGenerator(11);
  const auto f64 = torch::TensorOptions(torch::kFloat64);
  const int64_t frames = 12, points = 30;
  const auto random_frames = [&](int64_t n) {
    return Rigid{quaternion_to_rotation(torch::randn({n, 4}, g, torch::kFloat64)), torch::randn({n, 3}, g, torch::kFloat64) * 10};
  };
  const Rigid predicted = random_frames(frames), truth = random_frames(frames);
  const torch::Tensor predicted_points = torch::randn({points, 3}, g, torch::kFloat64) * 10;
  const torch::Tensor true_points = torch::randn({points, 3}, g, torch::kFloat64) * 10;
  const torch::Tensor frames_mask = (torch::rand({frames}, g, torch::kFloat64) > 0.2).to(torch::kFloat64);
  const torch::Tensor points_mask = (torch::rand({points}, g, torch::kFloat64) > 0.2).to(torch::kFloat64);
  const Rigid motion{quaternion_to_rotation(torch::randn({4}, g, torch::kFloat64)), torch::randn({3}, g, torch::kFloat64) * 20};
  const auto moved = [&](const Rigid& f) {
    return Rigid{motion.rotation.expand({f.rotation.size(0), 3, 3}), motion.translation.expand({f.rotation.size(0), 3})}.compose(f);
  };
  for (const std::optional<double> clamp : {std::optional<double>(), std::optional<double>(10.0)}) {
    const double before = frame_aligned_point_error(predicted, truth, frames_mask, predicted_points, true_points, points_mask, 10.0, clamp)
                              .item<double>();
    const double prediction_moved = frame_aligned_point_error(moved(predicted), truth, frames_mask, motion.apply(predicted_points),
                                                              true_points, points_mask, 10.0, clamp).item<double>();
    const double truth_moved = frame_aligned_point_error(predicted, moved(truth), frames_mask, predicted_points,
                                                         motion.apply(true_points), points_mask, 10.0, clamp).item<double>();
    EXPECT_NEAR(prediction_moved, before, 1e-10 * before);
    EXPECT_NEAR(truth_moved, before, 1e-10 * before);
  }
  const ResidueGeometry geometry = ideal_residue_geometry().to(f64);
  const torch::Tensor aatype = torch::arange(kResidueTypes, torch::kInt64);
  const Rigid backbone = random_frames(kResidueTypes);
  const torch::Tensor angles = torch::nn::functional::normalize(torch::randn({kResidueTypes, kTorsions, 2}, g, torch::kFloat64),
                                                                torch::nn::functional::NormalizeFuncOptions().dim(-1));
  const torch::Tensor atoms = frames_to_atom14(geometry, aatype, torsions_to_frames(geometry, aatype, backbone, angles));
  const torch::Tensor moved_atoms = frames_to_atom14(geometry, aatype, torsions_to_frames(geometry, aatype, moved(backbone), angles));
  const torch::Tensor exists = geometry.atom14_exists.index_select(0, aatype).unsqueeze(-1);
  EXPECT_LT((moved_atoms - motion.apply(atoms) * exists).abs().max().item<double>(), 1e-10 * atoms.abs().max().item<double>());
}

// Inference reads the pair and runs the attention's queries a chunk of rows at a time: in float64, with and
// without gradients, chunks of 5 and 7 rows (neither divides the golden chain's length) give the whole run's
// atoms and single activations within 1e-12 of their largest entry and (with gradients) every input's and
// parameter's gradient within 1e-12 of the largest gradient. A bf16 pair (a bf16 trunk's) is read as its float32 values: within 1e-5 of the run on the
// pair converted whole (float32 rounding of products summed in another order), and so is the distogram.
TEST(StructureModuleTest, ChunkedEqualsWholeAndABf16PairIsReadAsItsFloat32Values) {
  const io::NpzArrays& golden = testing::alphafold_golden("structure.npz");
  const std::string t = "structure_module/";
  StructureModule module = golden_structure_module();
  const torch::Tensor aatype = golden.at(t + "in/aatype").to(torch::kInt64);
  const torch::Tensor mask = golden.at(t + "in/seq_mask");
  const int64_t residues = aatype.size(0);
  ASSERT_NE(residues % 5, 0);
  ASSERT_NE(residues % 7, 0);
  const auto relative = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
  };
  {
    StructureModule module64 = golden_structure_module(torch::kFloat64);
    const ResidueGeometry geometry = testing::alphafold_residue_geometry().to(torch::TensorOptions(torch::kFloat64));
    const auto run = [&](int64_t chunk, bool gradients) {
      torch::AutoGradMode mode(gradients);
      module64->zero_grad();
      const torch::Tensor single = golden.at(t + "in/single").to(torch::kFloat64).requires_grad_(gradients);
      const torch::Tensor pair = golden.at(t + "in/pair").to(torch::kFloat64).requires_grad_(gradients);
      const StructureOutputs out = module64->forward(single, pair, aatype, mask.to(torch::kFloat64), geometry, chunk);
      std::vector<torch::Tensor> values{out.atom14.detach(), out.single.detach()};
      if (gradients) {
        (out.atom14.square().sum() + out.single.sum()).backward();
        values.push_back(single.grad());
        values.push_back(pair.grad());
        for (const auto& p : module64->parameters()) values.push_back(p.grad().clone());
      }
      return values;
    };
    for (const bool gradients : {false, true}) {
      const std::vector<torch::Tensor> whole = run(0, gradients);
      double largest_gradient = 0;
      for (size_t i = 2; i < whole.size(); ++i) largest_gradient = std::max(largest_gradient, whole[i].abs().max().item<double>());
      for (const int64_t chunk : {5, 7}) {
        const std::vector<torch::Tensor> chunked = run(chunk, gradients);
        ASSERT_EQ(chunked.size(), whole.size());
        for (size_t i = 0; i < whole.size(); ++i) {
          // Gradients against the largest of them all: the pair bias's is zero but for rounding (softmax
          // ignores a bias shared by every key).
          const double scale = i < 2 ? whole[i].abs().max().item<double>() : largest_gradient;
          EXPECT_LT((chunked[i] - whole[i]).abs().max().item<double>() / scale, 1e-12)
              << "chunk " << chunk << ", gradients " << gradients << ", value " << i;
        }
      }
    }
  }
  torch::NoGradGuard no_grad;
  const ResidueGeometry geometry = testing::alphafold_residue_geometry();
  const torch::Tensor pair16 = golden.at(t + "in/pair").to(torch::kBFloat16);
  const StructureOutputs from_bf16 = module->forward(golden.at(t + "in/single"), pair16, aatype, mask, geometry, 5);
  const StructureOutputs from_float = module->forward(golden.at(t + "in/single"), pair16.to(torch::kFloat32), aatype, mask, geometry);
  EXPECT_EQ(from_bf16.atom14.scalar_type(), torch::kFloat32);
  EXPECT_LT(relative(from_bf16.atom14, from_float.atom14), 1e-5);
  DistogramHead distogram(8, 6);
  for (auto& p : distogram->parameters()) p.normal_();
  const torch::Tensor logits = distogram->forward(pair16, 5);
  EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
  EXPECT_LT(relative(logits, distogram->forward(pair16.to(torch::kFloat32))), 1e-6);
}

// Moving every frame by one global rotation and translation changes nothing IPA outputs (double precision).
TEST(InvariantPointAttentionTest, IsInvariantUnderAGlobalMotion) {
  auto g = at::detail::createCPUGenerator(9);
  InvariantPointAttention ipa(kTinyIpa);
  ipa->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  for (auto& p : ipa->parameters()) p.normal_(0, 0.5, g);
  const int64_t residues = 10;
  const torch::Tensor s = torch::randn({residues, 16}, g, torch::kFloat64);
  const torch::Tensor z = torch::randn({residues, residues, 8}, g, torch::kFloat64);
  const Rigid frames{quaternion_to_rotation(torch::randn({residues, 4}, g, torch::kFloat64)),
                     torch::randn({residues, 3}, g, torch::kFloat64) * 10};
  const Rigid motion{quaternion_to_rotation(torch::randn({4}, g, torch::kFloat64)).expand({residues, 3, 3}),
                     (torch::randn({3}, g, torch::kFloat64) * 10).expand({residues, 3})};
  const torch::Tensor mask = torch::ones({residues}, torch::kFloat64);
  const torch::Tensor before = ipa->forward(s, z, frames, mask);
  const torch::Tensor after = ipa->forward(s, z, motion.compose(frames), mask);
  EXPECT_LT((after - before).abs().max().item<double>(), 1e-10 * before.abs().max().item<double>());
}

}  // namespace
}  // namespace kuafu::fold
