// Rigid frames against hand-worked cases and against themselves under a global rotation and
// translation, in double precision; the virtual CB against the CB atoms of real structures.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>

#include <torch/torch.h>

#include "apps/fastfold/pdb_file.h"
#include "apps/fastfold/rigid.h"

namespace kuafu::fold {
namespace {
namespace fs = std::filesystem;

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);
// Double precision: every identity here holds to rounding, ~1e-15 a step.
constexpr double kExact = 1e-12;

torch::Tensor vec(double x, double y, double z) { return torch::tensor({x, y, z}, kF64); }

torch::Tensor rotation_z90() { return torch::tensor({0.0, -1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0}, kF64).view({3, 3}); }
torch::Tensor rotation_x90() { return torch::tensor({1.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 1.0, 0.0}, kF64).view({3, 3}); }

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_LT((actual - expected).abs().max().item<double>(), tolerance) << what << "\n" << actual << "\n" << expected;
}

// A random rotation (from a random quaternion) and translation of `batch` frames.
Rigid random_rigid(int64_t batch, uint64_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  return {quaternion_to_rotation(torch::randn({batch, 4}, generator, torch::kFloat64)),
          torch::randn({batch, 3}, generator, torch::kFloat64) * 10};
}

TEST(RigidTest, HandWorkedFramesMapComposeAndInvert) {
  const Rigid turn{rotation_z90(), vec(1, 0, 0)};
  // (1, 0, 0) turned a quarter about z is (0, 1, 0), moved by (1, 0, 0): (1, 1, 0).
  expect_close(turn.apply(vec(1, 0, 0)), vec(1, 1, 0), kExact, "apply");
  expect_close(turn.invert_apply(vec(1, 1, 0)), vec(1, 0, 0), kExact, "invert_apply");
  expect_close(turn.inverse().apply(vec(1, 1, 0)), vec(1, 0, 0), kExact, "inverse");
  // inner: (0, 1, 0) about x is (0, 0, 1), + (0, 0, 1) = (0, 0, 2); then outer: about z (0, 0, 2), + (1, 0, 0).
  const Rigid inner{rotation_x90(), vec(0, 0, 1)};
  expect_close(turn.compose(inner).apply(vec(0, 1, 0)), vec(1, 0, 2), kExact, "compose");
  const Rigid identity = turn.compose(turn.inverse());
  expect_close(identity.rotation, torch::eye(3, kF64), kExact, "T ∘ T⁻¹ rotation");
  expect_close(identity.translation, vec(0, 0, 0), kExact, "T ∘ T⁻¹ translation");
  const Rigid none = Rigid::identity({2, 5}, kF64);
  EXPECT_EQ(none.rotation.sizes(), torch::IntArrayRef({2, 5, 3, 3}));
  expect_close(none.apply(torch::ones({2, 5, 3}, kF64)), torch::ones({2, 5, 3}, kF64), kExact, "identity");
}

TEST(RigidTest, QuaternionsAndUpdatesAreHandWorkedRotations) {
  // (1, 0, 0, 1)/√2 is a quarter turn about z; (1, 0, 0, 0) none; (0, 1, 0, 0) a half turn about x.
  expect_close(quaternion_to_rotation(torch::tensor({1.0, 0.0, 0.0, 1.0}, kF64)), rotation_z90(), kExact, "z 90");
  expect_close(quaternion_to_rotation(torch::tensor({3.0, 0.0, 0.0, 0.0}, kF64)), torch::eye(3, kF64), kExact, "none");
  expect_close(quaternion_to_rotation(torch::tensor({0.0, 1.0, 0.0, 0.0}, kF64)),
               torch::diag(torch::tensor({1.0, -1.0, -1.0}, kF64)), kExact, "x 180");
  // Algorithm 23: (b, c, d) = (0, 0, 1) makes (1, 0, 0, 1).
  const Rigid update = rigid_from_update(torch::tensor({0.0, 0.0, 1.0, 1.0, 2.0, 3.0}, kF64));
  expect_close(update.rotation, rotation_z90(), kExact, "update rotation");
  expect_close(update.translation, vec(1, 2, 3), kExact, "update translation");
  // Any quaternion gives a proper rotation: R Rᵀ = I, det R = 1.
  const torch::Tensor r = random_rigid(64, 3).rotation;
  expect_close(torch::matmul(r, r.transpose(-1, -2)), torch::eye(3, kF64).expand({64, 3, 3}), kExact, "orthogonal");
  expect_close(torch::linalg_det(r), torch::ones({64}, kF64), kExact, "determinant");
}

TEST(RigidTest, ABackboneFrameIsGramSchmidtOfItsAtoms) {
  // CA at (1, 2, 3), C along x, N in the xy plane: the frame is the identity rotation at CA.
  const torch::Tensor ca = vec(1, 2, 3);
  const Rigid frame = rigid_from_3_points(ca + vec(1, 1, 0), ca, ca + vec(2, 0, 0));
  expect_close(frame.rotation, torch::eye(3, kF64), kExact, "rotation");
  expect_close(frame.translation, ca, kExact, "translation");
  // C along y, N at (0, -0.5, 2) from CA: only N's part orthogonal to CA->C counts, so y' = (0, 0, 1),
  // and z' = x' × y' = (1, 0, 0).
  const Rigid tilted = rigid_from_3_points(ca + vec(0, -0.5, 2), ca, ca + vec(0, 3, 0));
  expect_close(tilted.rotation, torch::tensor({0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0}, kF64).view({3, 3}), kExact,
               "tilted");
}

TEST(RigidTest, FramesAndLocalCoordinatesFollowAGlobalMotion) {
  auto generator = at::detail::createCPUGenerator(11);
  const int64_t residues = 32;
  const torch::Tensor n = torch::randn({residues, 3}, generator, torch::kFloat64) * 5;
  const torch::Tensor ca = torch::randn({residues, 3}, generator, torch::kFloat64) * 5;
  const torch::Tensor c = torch::randn({residues, 3}, generator, torch::kFloat64) * 5;
  const torch::Tensor points = torch::randn({residues, residues, 3}, generator, torch::kFloat64) * 5;  // [i, j, 3]
  const Rigid motion = random_rigid(1, 5);
  const Rigid global{motion.rotation[0], motion.translation[0]};
  const Rigid frames = rigid_from_3_points(n, ca, c);
  const Rigid moved = rigid_from_3_points(global.apply(n), global.apply(ca), global.apply(c));
  // Equivariance: the moved atoms' frames are the motion composed with the frames.
  const Rigid expected = Rigid{global.rotation.expand({residues, 3, 3}), global.translation.expand({residues, 3})}.compose(frames);
  expect_close(moved.rotation, expected.rotation, kExact, "rotation");
  expect_close(moved.translation, expected.translation, 1e-11, "translation");
  // Invariance: every point in every residue's frame is where it was.
  expect_close(moved.unsqueeze(1).invert_apply(global.apply(points)), frames.unsqueeze(1).invert_apply(points), 1e-11, "local");
  // And the virtual CB moves with its atoms.
  expect_close(virtual_beta(global.apply(n), global.apply(ca), global.apply(c)), global.apply(virtual_beta(n, ca, c)), 1e-11,
               "virtual CB");
}

// The virtual CB has the ideal geometry it is built from, and lies where real CB atoms lie: over the
// non-glycine residues of theseus's LDH chains (X-ray structures at 1.8-3 Å), within a few hundredths
// of an Ångström on average.
TEST(RigidTest, TheVirtualBetaIsWhereRealStructuresHaveTheirCB) {
  std::vector<torch::Tensor> n, ca, c, cb;
  const fs::path folder = "/usr/share/doc/theseus/examples/ldh";
  ASSERT_TRUE(fs::is_directory(folder)) << folder << ": install Debian's theseus-examples (scripts/setup)";
  for (const char* name : {"1a5z_A.pdb.gz", "1b8p_A.pdb.gz", "1bdm_A.pdb.gz", "1civ_A.pdb.gz"}) {
    const Structure structure = read_pdb((folder / name).string());
    for (const Chain& chain : structure.chains) {
      for (const Residue& residue : chain.residues) {
        if (residue.hetero || residue.name == "GLY") continue;
        std::map<std::string, torch::Tensor> atoms;
        for (const Atom& atom : residue.atoms) atoms[atom.name] = torch::tensor({atom.position[0], atom.position[1], atom.position[2]}, kF64);
        if (!atoms.count("N") || !atoms.count("CA") || !atoms.count("C") || !atoms.count("CB")) continue;
        n.push_back(atoms["N"]);
        ca.push_back(atoms["CA"]);
        c.push_back(atoms["C"]);
        cb.push_back(atoms["CB"]);
      }
    }
  }
  ASSERT_GT(cb.size(), 1000u);
  const torch::Tensor N = torch::stack(n), CA = torch::stack(ca), C = torch::stack(c), CB = torch::stack(cb);
  const torch::Tensor virtual_cb = virtual_beta(N, CA, C);
  const auto unit = [](const torch::Tensor& v) { return v / v.norm(2, -1, true); };
  const auto angle = [&](const torch::Tensor& a, const torch::Tensor& b) {
    return torch::rad2deg(torch::acos((unit(a) * unit(b)).sum(-1)));
  };
  expect_close((virtual_cb - CA).norm(2, -1), torch::full({N.size(0)}, 1.530, kF64), 1e-9, "CA-CB length");
  expect_close(angle(N - CA, virtual_cb - CA), torch::full({N.size(0)}, 110.5, kF64), 1e-6, "N-CA-CB angle");
  expect_close(angle(C - CA, virtual_cb - CA), torch::full({N.size(0)}, 110.1, kF64), 1e-6, "C-CA-CB angle");
  const torch::Tensor error = (virtual_cb - CB).norm(2, -1);
  const double mean = error.mean().item<double>(), median = error.median().item<double>();
  std::cout << cb.size() << " residues: virtual CB from the real one mean " << mean << " Å, median " << median << " Å, max "
            << error.max().item<double>() << " Å\n";
  // The wrong hand (the mirror image) would put it ~2.5 Å away.
  EXPECT_LT(mean, 0.1);
  EXPECT_LT(median, 0.1);
}

}  // namespace
}  // namespace kuafu::fold
