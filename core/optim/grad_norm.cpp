#include "core/optim/grad_norm.h"

#include <algorithm>
#include <cmath>

#include "core/dist/collectives.h"

namespace kuafu::optim {

double global_grad_norm(const std::vector<Param>& params, const dist::GroupPtr& across,
                        const std::vector<torch::Tensor>& known) {
  return global_grad_norm_tensor(params, across, known).item<double>();
}

torch::Tensor global_grad_norm_tensor(const std::vector<Param>& params, const dist::GroupPtr& across,
                                      const std::vector<torch::Tensor>& known) {
  std::vector<torch::Tensor> grads, squares;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (!p.counts_in_global_norm || !p.tensor.grad().defined()) continue;
    if (i < known.size() && known[i].defined()) {
      squares.push_back(known[i]);
    } else {
      grads.push_back(p.tensor.grad());
      squares.push_back(torch::Tensor());
    }
  }
  // Summed where the gradients live, then on the group's device for the all-reduce.
  const torch::Device device = across ? across->device() : torch::Device(torch::kCPU);
  torch::Tensor total;
  if (squares.empty()) {
    total = torch::zeros({1}, torch::TensorOptions(torch::kFloat64).device(device));
  } else if (grads.size() == squares.size()) {
    total = squared_norms(grads, std::vector<dist::GroupPtr>(grads.size())).sum().view({1});
  } else {
    // The known squares take their places among the computed ones: the same terms in the same order.
    const torch::Tensor computed = squared_norms(grads, std::vector<dist::GroupPtr>(grads.size()));
    int64_t next = 0;
    for (auto& square : squares) {
      if (!square.defined()) square = computed[next++];
      square = square.to(computed.device());
    }
    total = torch::stack(squares).sum().view({1});
  }
  if (across) total = total.to(across->device());
  if (across && across->size() > 1) dist::all_reduce(total, *across);
  return total.sqrt();  // correctly rounded, as std::sqrt
}

double clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
}

torch::Tensor clip_coefficient(const torch::Tensor& norm, double max_norm) {
  if (max_norm <= 0) return torch::ones_like(norm);
  // A true division (a scalar over a tensor would be a reciprocal times the scalar, rounded twice).
  return torch::full_like(norm, max_norm).div(norm + 1e-6).clamp_max(1.0);
}

void scale_grads(const std::vector<Param>& params, double factor) {
  if (factor == 1.0) return;
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (p.tensor.grad().defined()) p.tensor.mutable_grad().mul_(factor);
  }
}

double clip_grad_norm(const std::vector<Param>& params, double max_norm, const dist::GroupPtr& across) {
  const double norm = global_grad_norm(params, across);
  if (std::isfinite(norm)) scale_grads(params, clip_coefficient(norm, max_norm));
  return norm;
}

}  // namespace kuafu::optim
