// Kuafu's residue tables against AlphaFold 2.3's (golden/alphafold_residue_tables.npz): the names, groups and
// layouts equal, the default frames derived from the positions as AlphaFold derives them, and the geometry
// measured in Debian's PDB files within a stated distance of AlphaFold's literature values.
#include <gtest/gtest.h>

#include <iostream>

#include <torch/torch.h>

#include "apps/fastfold/residue_geometry.h"
#include "tests/apps/fastfold/alphafold_golden.h"

namespace kuafu::fold {
namespace {

TEST(ResidueGeometryTest, NamesGroupsAndLayoutsAreAlphaFolds) {
  const ResidueGeometry ours = ideal_residue_geometry();
  const ResidueGeometry alphafold = testing::alphafold_residue_geometry();
  EXPECT_TRUE(torch::equal(ours.atom14_group, alphafold.atom14_group));
  EXPECT_TRUE(torch::equal(ours.atom14_exists, alphafold.atom14_exists));
  EXPECT_TRUE(torch::equal(ours.atom14_to_atom37, alphafold.atom14_to_atom37));
  EXPECT_TRUE(torch::equal(ours.atom37_to_atom14, alphafold.atom37_to_atom14));
  EXPECT_TRUE(torch::equal(ours.atom37_exists, alphafold.atom37_exists));
  EXPECT_TRUE(torch::equal(ours.chi_exists, alphafold.chi_exists));
  EXPECT_TRUE(torch::equal(ours.chi_pi_periodic, alphafold.chi_pi_periodic));
  EXPECT_TRUE(torch::equal(ours.renaming, alphafold.renaming));
  EXPECT_TRUE(torch::equal(ours.atom14_ambiguous, alphafold.atom14_ambiguous));
}

// AlphaFold's atom positions through Kuafu's derivation give AlphaFold's default frames: 1e-6 is float32
// rounding of unit vectors (the frames of groups a residue lacks are identity here, zeros there).
TEST(ResidueGeometryTest, DefaultFramesFollowFromThePositionsAsAlphaFoldsDo) {
  const ResidueGeometry alphafold = testing::alphafold_residue_geometry();
  std::array<std::vector<GroupedAtom>, kResidueTypes> grouped;
  for (int t = 0; t < kResidueTypes; ++t) {
    const ResidueType& type = residue_types()[t];
    for (size_t i = 0; i < type.atoms.size(); ++i) {
      const torch::Tensor p = alphafold.atom14_positions[t][static_cast<int64_t>(i)].to(torch::kFloat64);
      grouped[t].push_back({type.atoms[i], static_cast<int>(alphafold.atom14_group[t][static_cast<int64_t>(i)].item<int64_t>()),
                            {p[0].item<double>(), p[1].item<double>(), p[2].item<double>()}});
    }
  }
  const ResidueGeometry derived = residue_geometry(grouped);
  int compared = 0;
  for (int t = 0; t < kResidueTypes; ++t)
    for (int g = 0; g < kRigidGroups; ++g) {
      const bool exists = g < 4 || static_cast<size_t>(g - 4) < residue_types()[t].chis.size();
      const torch::Tensor expected = alphafold.default_frames.rotation[t][g];
      if (!exists) {
        EXPECT_EQ(expected.abs().max().item<float>(), 0.0f);
        continue;
      }
      EXPECT_LT((derived.default_frames.rotation[t][g] - expected).abs().max().item<float>(), 1e-6) << t << " " << g;
      EXPECT_LT((derived.default_frames.translation[t][g] - alphafold.default_frames.translation[t][g]).abs().max().item<float>(),
                1e-6) << t << " " << g;
      ++compared;
    }
  EXPECT_EQ(compared, 4 * kResidueTypes + 39);  // backbone, pre-omega, phi, psi; and the 39 chi angles
}

// The medians of real structures (data/ideal_residues.inc) against AlphaFold's values: every atom within
// 0.04 Å (measured 0.032) but proline's CD, 0.13 Å (measured 0.127: its ring puckers two ways and the median
// sits between); the mean under 0.01 Å (measured 0.006). Measured figures printed.
TEST(ResidueGeometryTest, TheMeasuredGeometryIsNearAlphaFolds) {
  const torch::Tensor ours = ideal_residue_geometry().atom14_positions;
  const torch::Tensor alphafold = testing::alphafold_residue_geometry().atom14_positions;
  const torch::Tensor distance = (ours - alphafold).norm(2, -1);  // [21, 14]
  const int proline = residue_type_index('P');
  const int64_t proline_cd = 6;
  ASSERT_EQ(residue_types()[proline].atoms[proline_cd], "CD");
  const double proline_cd_distance = distance[proline][proline_cd].item<double>();
  distance[proline][proline_cd] = 0;
  const torch::Tensor exists = ideal_residue_geometry().atom14_exists;
  const double mean = ((distance * exists).sum() / exists.sum()).item<double>();
  std::cout << "  max distance " << distance.max().item<double>() << " Å, proline CD " << proline_cd_distance
            << " Å, mean " << mean << " Å\n";
  EXPECT_LT(distance.max().item<double>(), 0.04);
  EXPECT_LT(proline_cd_distance, 0.13);
  EXPECT_LT(mean, 0.01);
}

// atom37 -> atom14 -> atom37 gives back every atom a residue has, and zeros elsewhere.
TEST(ResidueGeometryTest, Atom14AndAtom37RoundTrip) {
  auto g = at::detail::createCPUGenerator(3);
  const ResidueGeometry& geometry = ideal_residue_geometry();
  const torch::Tensor aatype = torch::arange(kResidueTypes + 1, torch::kInt64);
  const torch::Tensor atom37 = torch::randn({kResidueTypes + 1, kAtom37, 3}, g);
  const torch::Tensor exists37 = geometry.atom37_exists.index_select(0, aatype).unsqueeze(-1);
  const torch::Tensor back = atom14_to_atom37(geometry, aatype, atom37_to_atom14(geometry, aatype, atom37));
  EXPECT_TRUE(torch::equal(back, atom37 * exists37));
  EXPECT_EQ(exists37.sum().item<float>(), 167.0f);  // the 20 residues' heavy atoms, OXT aside
}

}  // namespace
}  // namespace kuafu::fold
