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
