// The structure scores against Zhang & Skolnick's TMscore program (Debian's tm-align, 20190822) on a real
// chain and copies of it moved, bent and blurred by known amounts, and the superposition on a hand-worked
// motion.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <regex>

#include <torch/torch.h>

#include "apps/fastfold/chain_atoms.h"
#include "apps/fastfold/pdb_file.h"
#include "apps/fastfold/residue_types.h"
#include "apps/fastfold/structure_metrics.h"
#include "apps/fastfold/subprocess.h"
#include "apps/fastfold/alphafold_losses.h"
#include "tests/apps/fastfold/alphafold_golden.h"

namespace kuafu::fold {
namespace {

// A chain of Cα atoms at `ca` [N, 3] named by `names`, numbered from 1.
Structure ca_structure(const torch::Tensor& ca, const std::string& sequence) {
  Chain chain{"A", {}, {}, {}};
  for (int64_t i = 0; i < ca.size(0); ++i) {
    Residue residue;
    residue.name = residue_types()[residue_type_index(sequence[i])].name;
    residue.number = static_cast<int>(i + 1);
    Atom atom{"CA", "C", {ca[i][0].item<double>(), ca[i][1].item<double>(), ca[i][2].item<double>()}, 1.0, 0.0};
    residue.atoms.push_back(atom);
    chain.residues.push_back(residue);
  }
  Structure structure;
  structure.chains.push_back(chain);
  return structure;
}

double field(const std::string& output, const std::string& pattern) {
  std::smatch match;
  const std::regex re(pattern + R"(\s*=\s*([0-9.]+))");
  EXPECT_TRUE(std::regex_search(output, match, re)) << pattern << " not in\n" << output;
  return match.empty() ? -1 : std::stod(match[1]);
}

// lDDT equals alphafold.model.lddt (lddt.npz: the golden prediction's Cα against the truth's, per residue
// and whole, with the truth's mask and with every other residue left out), float64 both sides: 1e-12.
TEST(StructureMetricsTest, LddtIsAlphaFolds) {
  const io::NpzArrays& golden = testing::alphafold_golden("lddt.npz");
  for (const std::string mask : {"mask", "sparse"}) {
    const torch::Tensor m = golden.at(mask + "/mask");
    const torch::Tensor per_residue = lddt(golden.at("predicted"), golden.at("truth"), m, 15.0, true);
    const torch::Tensor whole = lddt(golden.at("predicted"), golden.at("truth"), m, 15.0, false);
    EXPECT_LT((per_residue - golden.at(mask + "/per_residue")).abs().max().item<double>(), 1e-12) << mask;
    EXPECT_LT((whole - golden.at(mask + "/whole")).abs().max().item<double>(), 1e-12) << mask;
  }
}

// The ideal helix's consecutive Cα lie 3.8 Å apart (the α-helix's), and i to i+3 about 5 Å.
TEST(StructureMetricsTest, TheIdealHelixHasAHelixsDistances) {
  const torch::Tensor ca = ideal_helix_ca(10);
  EXPECT_NEAR((ca[1] - ca[0]).norm().item<double>(), 3.8, 0.05);
  EXPECT_NEAR((ca[3] - ca[0]).norm().item<double>(), 5.0, 0.25);
}

TEST(StructureMetricsTest, SuperpositionUndoesAKnownMotion) {
  auto g = at::detail::createCPUGenerator(2);
  const torch::Tensor points = torch::randn({20, 3}, g, torch::kFloat64) * 5;
  const Rigid motion{quaternion_to_rotation(torch::randn({4}, g, torch::kFloat64)), torch::randn({3}, g, torch::kFloat64) * 10};
  const Rigid found = superposition(points, motion.apply(points), torch::ones({20}, torch::kFloat64));
  EXPECT_LT((found.rotation - motion.rotation).abs().max().item<double>(), 1e-10);
  EXPECT_LT((found.translation - motion.translation).abs().max().item<double>(), 1e-9);
}

// TM-score and GDT-TS within 0.01 of TMscore's (both search superpositions; the searches differ a little),
// the Cα RMSD within 0.002 Å (TMscore prints three decimals).
TEST(StructureMetricsTest, AgreeWithTheTMscoreProgram) {
  ASSERT_FALSE(find_program("TMscore").empty()) << "TMscore (Debian's tm-align) is not installed: scripts/setup installs it";
  const Structure read = read_pdb("/usr/share/doc/theseus/examples/cytochromes/d1crj__.pdb.gz");
  const ChainAtoms chain = chain_atoms(read.chains.at(0));
  const torch::Tensor truth = chain.positions.select(1, 1).to(torch::kFloat64);  // [N, 3]
  const int64_t n = truth.size(0);
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "tmscore";
  std::filesystem::create_directories(dir);
  write_pdb(ca_structure(truth, chain.sequence), (dir / "native.pdb").string());
  auto g = at::detail::createCPUGenerator(4);
  for (const double blur : {0.5, 2.0, 5.0}) {
    // A moved copy, its second half turned 30° about an axis through its middle, blurred by `blur` Å.
    const Rigid motion{quaternion_to_rotation(torch::randn({4}, g, torch::kFloat64)), torch::randn({3}, g, torch::kFloat64) * 20};
    torch::Tensor model = truth.clone();
    const torch::Tensor hinge = truth[n / 2];
    const double angle = 30.0 * M_PI / 180.0;
    const Rigid bend{quaternion_to_rotation(torch::tensor({std::cos(angle / 2), std::sin(angle / 2), 0.0, 0.0}, torch::kFloat64)),
                     torch::zeros({3}, torch::kFloat64)};
    model.narrow(0, n / 2, n - n / 2).copy_(bend.apply(model.narrow(0, n / 2, n - n / 2) - hinge) + hinge);
    model = motion.apply(model + torch::randn({n, 3}, g, torch::kFloat64) * blur);
    write_pdb(ca_structure(model, chain.sequence), (dir / "model.pdb").string());
    const std::string output = run_program({"TMscore", (dir / "model.pdb").string(), (dir / "native.pdb").string()});
    const StructureScores ours = structure_scores(model, truth, torch::ones({n}));
    const double tm = field(output, "TM-score"), gdt = field(output, "GDT-TS-score"), rmsd = field(output, "RMSD of  the common residues");
    std::cout << "  blur " << blur << " Å: TM-score " << ours.tm_score << " (TMscore " << tm << "), GDT-TS " << ours.gdt_ts
              << " (" << gdt << "), RMSD " << ours.rmsd_ca << " (" << rmsd << "), lDDT-Ca " << ours.lddt_ca << "\n";
    EXPECT_NEAR(ours.tm_score, tm, 0.01);
    EXPECT_NEAR(ours.gdt_ts, gdt, 0.01);
    EXPECT_NEAR(ours.rmsd_ca, rmsd, 0.002);
  }
}

}  // namespace
}  // namespace kuafu::fold
