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

// The dihedral a-b-c-d (IUPAC's sign), radians in (-π, π]: atan2(|b2| b1·(b2 × b3), (b1 × b2)·(b2 × b3)).
double dihedral_of(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& d) {
  const torch::Tensor b1 = b - a, b2 = c - b, b3 = d - c;
  const torch::Tensor n1 = torch::cross(b1, b2, 0), n2 = torch::cross(b2, b3, 0);
  return std::atan2((b2.norm() * b1.dot(n2)).item<double>(), n1.dot(n2).item<double>());
}

double angle_difference(double x, double y) { return std::abs(std::remainder(x - y, 2 * M_PI)); }

// A backbone built from dihedrals has exactly those dihedrals and Engh & Huber's bonds; a real stretch
// (d1crj's first 20 residues) rebuilt from its own dihedrals lies within 1.5 Å of itself and far closer than
// its mirror image; the secondary-structure baseline's helix fits a real α-helix within 0.5 Å.
TEST(StructureMetricsTest, BackbonesBuiltFromDihedralsHaveThem) {
  auto g = at::detail::createCPUGenerator(4);
  const int64_t n = 12;
  const torch::Tensor phi = (torch::rand({n}, g, torch::kFloat64) * 2 - 1) * M_PI, psi = (torch::rand({n}, g, torch::kFloat64) * 2 - 1) * M_PI;
  torch::Tensor omega = torch::full({n}, M_PI, torch::kFloat64);
  omega[5] = 0.0;  // one cis peptide
  const torch::Tensor bb = backbone_from_dihedrals(phi, psi, omega);  // [n, 3 (N, CA, C), 3]
  for (int64_t r = 0; r + 1 < n; ++r) {
    const auto atom = [&](int64_t i, int a) { return bb[i][a]; };
    EXPECT_NEAR((atom(r, 1) - atom(r, 0)).norm().item<double>(), 1.458, 1e-9);
    EXPECT_NEAR((atom(r, 2) - atom(r, 1)).norm().item<double>(), 1.525, 1e-9);
    EXPECT_NEAR((atom(r + 1, 0) - atom(r, 2)).norm().item<double>(), 1.329, 1e-9);
    EXPECT_LT(angle_difference(dihedral_of(atom(r, 0), atom(r, 1), atom(r, 2), atom(r + 1, 0)), psi[r].item<double>()), 1e-9);
    EXPECT_LT(angle_difference(dihedral_of(atom(r, 1), atom(r, 2), atom(r + 1, 0), atom(r + 1, 1)), omega[r].item<double>()), 1e-9);
    EXPECT_LT(angle_difference(dihedral_of(atom(r, 2), atom(r + 1, 0), atom(r + 1, 1), atom(r + 1, 2)), phi[r + 1].item<double>()), 1e-9);
  }

  // d1crj's first 20 residues (its N-terminal helix and the loop after it) from their own dihedrals.
  const ChainAtoms chain = chain_atoms(read_pdb("/usr/share/doc/theseus/examples/cytochromes/d1crj__.pdb.gz").chains.at(0));
  const int64_t m = 20;
  const torch::Tensor x = chain.positions.narrow(0, 0, m).to(torch::kFloat64);  // [m, 37, 3]: N, CA, C first
  torch::Tensor true_phi = torch::zeros({m}, torch::kFloat64), true_psi = torch::zeros({m}, torch::kFloat64);
  torch::Tensor true_omega = torch::full({m}, M_PI, torch::kFloat64);
  for (int64_t r = 0; r + 1 < m; ++r) {
    true_psi[r] = dihedral_of(x[r][0], x[r][1], x[r][2], x[r + 1][0]);
    true_omega[r] = dihedral_of(x[r][1], x[r][2], x[r + 1][0], x[r + 1][1]);
    true_phi[r + 1] = dihedral_of(x[r][2], x[r + 1][0], x[r + 1][1], x[r + 1][2]);
  }
  const torch::Tensor rebuilt = backbone_from_dihedrals(true_phi, true_psi, true_omega).select(1, 1);
  const StructureScores back = structure_scores(rebuilt, x.select(1, 1), torch::ones({m}));
  const torch::Tensor mirror = backbone_from_dihedrals(-true_phi, -true_psi, true_omega).select(1, 1);
  const double mirror_rmsd = structure_scores(mirror, x.select(1, 1), torch::ones({m})).rmsd_ca;
  std::cout << "d1crj 1-20 rebuilt from its dihedrals: Ca RMSD " << back.rmsd_ca << " A (its mirror image's: " << mirror_rmsd
            << " A)" << std::endl;
  // Only the bond angles are ideal (their few degrees of error add up along 20 residues: ~1 Å).
  EXPECT_LT(back.rmsd_ca, 1.5);
  EXPECT_GT(mirror_rmsd, 3 * back.rmsd_ca);

  // The secondary-structure baseline's helix over a real α-helix (the first of >= 12 residues in the
  // database's chains by their DSSP): right-handed, a helix's rise and turn.
  const FoldChain db = testing::database_chains(1)[0];
  const size_t start = db.dssp.find("HHHHHHHHHHHH");
  ASSERT_NE(start, std::string::npos) << db.dssp;
  const torch::Tensor true_helix = db.positions.select(1, 1).narrow(0, static_cast<int64_t>(start), 12).to(torch::kFloat64);
  const StructureScores helix_fit = structure_scores(secondary_structure_ca(std::string(12, 'H')), true_helix, torch::ones({12}));
  std::cout << "ideal helix over a real one: Ca RMSD " << helix_fit.rmsd_ca << " A" << std::endl;
  EXPECT_LT(helix_fit.rmsd_ca, 0.5);
  const torch::Tensor strand = secondary_structure_ca(std::string(6, 'E'));
  EXPECT_NEAR((strand[2] - strand[0]).norm().item<double>(), 6.6, 0.4);  // a β-strand's i, i+2 span
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
