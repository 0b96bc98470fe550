#include "apps/fastfold/structure_metrics.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "apps/fastfold/alphafold_losses.h"
#include "core/util/error.h"

namespace kuafu::fold {
namespace {

// TM-score's length scale d0 for a target of `length` residues (Zhang & Skolnick 2004).
double tm_d0(int64_t length) {
  const double d0 = length > 21 ? 1.24 * std::cbrt(static_cast<double>(length) - 15.0) - 1.8 : 0.5;
  return std::max(d0, 0.5);
}

torch::Tensor distances_after(const Rigid& motion, const torch::Tensor& moving, const torch::Tensor& target) {
  return (motion.apply(moving) - target).norm(2, -1);  // [N]
}

}  // namespace

Rigid superposition(const torch::Tensor& moving, const torch::Tensor& target, const torch::Tensor& weights) {
  const torch::Tensor w = (weights / weights.sum()).unsqueeze(-1);  // [N, 1]
  const torch::Tensor moving_centre = (moving * w).sum(0), target_centre = (target * w).sum(0);
  const torch::Tensor p = moving - moving_centre, q = target - target_centre;
  const torch::Tensor covariance = torch::matmul((p * w).transpose(0, 1), q);  // [3, 3]
  auto [u, s, vh] = torch::linalg_svd(covariance, /*full_matrices=*/false);
  // A reflection would fit better when det < 0: flip the weakest axis instead.
  const double sign = torch::det(torch::matmul(vh.transpose(0, 1), u.transpose(0, 1))).item<double>() < 0 ? -1.0 : 1.0;
  const torch::Tensor d = torch::diag(torch::tensor({1.0, 1.0, sign}, moving.options()));
  const torch::Tensor rotation = torch::matmul(torch::matmul(vh.transpose(0, 1), d), u.transpose(0, 1));
  return {rotation, target_centre - torch::matmul(rotation, moving_centre)};
}

torch::Tensor ideal_helix_ca(int64_t n) {
  const torch::Tensor i = torch::arange(n, torch::kFloat64);
  const torch::Tensor angle = i * (100.0 * M_PI / 180.0);
  return torch::stack({2.3 * torch::cos(angle), 2.3 * torch::sin(angle), 1.5 * i}, -1);
}

namespace {

// The atom placed at `bond` Å from c, with angle b-c-d = `angle` and dihedral a-b-c-d = `torsion` (NeRF).
torch::Tensor place_atom(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, double bond, double angle,
                         double torsion) {
  const torch::Tensor bc = torch::nn::functional::normalize(c - b, torch::nn::functional::NormalizeFuncOptions().dim(0));
  const torch::Tensor n = torch::nn::functional::normalize(torch::cross(b - a, bc, 0), torch::nn::functional::NormalizeFuncOptions().dim(0));
  const torch::Tensor m = torch::cross(n, bc, 0);
  const double x = -bond * std::cos(angle), y = bond * std::sin(angle) * std::cos(torsion), z = bond * std::sin(angle) * std::sin(torsion);
  return c + x * bc + y * m + z * n;
}

}  // namespace

torch::Tensor backbone_from_dihedrals(const torch::Tensor& phi, const torch::Tensor& psi, const torch::Tensor& omega) {
  // Engh & Huber's bond lengths (Å) and angles.
  const double n_ca = 1.458, ca_c = 1.525, c_n = 1.329;
  const double deg = M_PI / 180.0, n_ca_c = 111.2 * deg, ca_c_n = 116.2 * deg, c_n_ca = 121.7 * deg;
  const int64_t n = phi.size(0);
  const auto f64 = torch::TensorOptions(torch::kFloat64);
  const auto p = phi.to(torch::kFloat64), s = psi.to(torch::kFloat64), w = omega.to(torch::kFloat64);
  std::vector<torch::Tensor> atoms;  // N, CA, C of each residue in turn
  atoms.push_back(torch::zeros({3}, f64));
  atoms.push_back(torch::tensor({n_ca, 0.0, 0.0}, f64));
  atoms.push_back(atoms[1] + ca_c * torch::tensor({-std::cos(n_ca_c), std::sin(n_ca_c), 0.0}, f64));
  for (int64_t r = 1; r < n; ++r) {
    const size_t last = atoms.size();
    const torch::Tensor &nb = atoms[last - 3], &ca = atoms[last - 2], &c = atoms[last - 1];
    const torch::Tensor next_n = place_atom(nb, ca, c, c_n, ca_c_n, s[r - 1].item<double>());
    const torch::Tensor next_ca = place_atom(ca, c, next_n, n_ca, c_n_ca, w[r - 1].item<double>());
    const torch::Tensor next_c = place_atom(c, next_n, next_ca, ca_c, n_ca_c, p[r].item<double>());
    atoms.insert(atoms.end(), {next_n, next_ca, next_c});
  }
  return torch::stack(atoms).view({n, 3, 3});
}

torch::Tensor secondary_structure_ca(const std::string& dssp) {
  const int64_t n = static_cast<int64_t>(dssp.size());
  std::vector<double> phi(n), psi(n);
  for (int64_t r = 0; r < n; ++r) {
    const char state = dssp[static_cast<size_t>(r)];
    const bool helix = state == 'H' || state == 'G' || state == 'I', strand = state == 'E' || state == 'B';
    phi[r] = (helix ? -57.0 : strand ? -119.0 : -75.0) * M_PI / 180.0;
    psi[r] = (helix ? -47.0 : strand ? 113.0 : 145.0) * M_PI / 180.0;
  }
  const auto f64 = torch::TensorOptions(torch::kFloat64);
  return backbone_from_dihedrals(torch::tensor(phi, f64), torch::tensor(psi, f64), torch::full({n}, M_PI, f64)).select(1, 1);
}

StructureScores structure_scores(const torch::Tensor& predicted_in, const torch::Tensor& truth_in, const torch::Tensor& mask_in) {
  const torch::Tensor marked = mask_in.to(torch::kCPU) > 0;
  const torch::Tensor predicted = predicted_in.detach().to(torch::kCPU, torch::kFloat64).index({marked});
  const torch::Tensor truth = truth_in.detach().to(torch::kCPU, torch::kFloat64).index({marked});
  const int64_t n = predicted.size(0);
  KUAFU_CHECK(n >= 3, "structure scores need at least 3 residues with coordinates, got ", n);
  StructureScores scores;
  scores.residues = n;
  scores.lddt_ca = lddt(predicted.unsqueeze(0), truth.unsqueeze(0), torch::ones({1, n, 1}, truth.options()))[0].item<double>();
  const torch::Tensor all = torch::ones({n}, truth.options());
  scores.rmsd_ca = distances_after(superposition(predicted, truth, all), predicted, truth).square().mean().sqrt().item<double>();

  // TMscore's search: superpose on fragments of n, n/2, n/4, ... residues (at least 4), then repeatedly on
  // the residues within a cut; keep the best TM-score and, for each GDT cutoff, the most residues within
  // it over every superposition tried. The TM-score search cuts at d0_search; GDT's searches once more
  // cutting at each of its cutoffs.
  const double d0 = tm_d0(n), d0_search = std::clamp(d0, 4.5, 8.0);
  const std::array<double, 4> cutoffs = {1.0, 2.0, 4.0, 8.0};
  std::array<int64_t, 4> best_within{};
  double best_tm = 0;
  const auto score = [&](const Rigid& motion) {
    const torch::Tensor d = distances_after(motion, predicted, truth);
    best_tm = std::max(best_tm, (1.0 / (1.0 + (d / d0).square())).sum().item<double>() / static_cast<double>(n));
    for (size_t c = 0; c < cutoffs.size(); ++c) best_within[c] = std::max(best_within[c], (d < cutoffs[c]).sum().item<int64_t>());
    return d;
  };
  const auto search = [&](double search_cut) {
    for (int64_t length = n; length >= std::min<int64_t>(4, n); length /= 2) {
      const int64_t step = std::max<int64_t>(1, length / 2);
      for (int64_t start = 0; start + length <= n; start += step) {
        torch::Tensor selected = torch::zeros({n}, truth.options());
        selected.narrow(0, start, length).fill_(1.0);
        for (int iteration = 0; iteration < 20; ++iteration) {
          const torch::Tensor d = score(superposition(predicted, truth, selected));
          double cut = search_cut;
          torch::Tensor next = (d < cut).to(torch::kFloat64);
          while (next.sum().item<double>() < 3) next = (d < (cut += 0.5)).to(torch::kFloat64);
          if (torch::equal(next, selected)) break;
          selected = next;
        }
      }
    }
  };
  search(d0_search);
  for (const double cutoff : cutoffs) search(cutoff);
  scores.tm_score = best_tm;
  double gdt = 0;
  for (int64_t within : best_within) gdt += static_cast<double>(within) / static_cast<double>(n);
  scores.gdt_ts = gdt / 4.0;
  return scores;
}

}  // namespace kuafu::fold
