// The reference for gradient accumulation and averaging in reduced precision: the exact (float64) sum of a
// model's per-micro-batch gradients, each as autograd gives it in the parameters' own dtype (e.g. bf16),
// and a result's distance from that sum measured in units of the summed magnitudes.
#pragma once

#include <functional>
#include <map>
#include <string>

#include <torch/nn/module.h>

namespace kuafu::testing {

struct GradientSums {
  std::map<std::string, torch::Tensor> sum;        // float64, by parameter name: the sum of the gradients
  std::map<std::string, torch::Tensor> magnitude;  // float64: the sum of their absolute values
};

// Runs `loss(micro)`'s backward for every micro in [0, micro_batches) on `model`, one at a time from an
// empty .grad, and adds each micro-batch's gradients into float64 sums, then divides the sums by `ranks`
// (the average over ranks that data parallelism forms).
inline GradientSums gradient_sums(torch::nn::Module& model, int64_t micro_batches, int64_t ranks,
                                  const std::function<torch::Tensor(int64_t micro)>& loss) {
  GradientSums sums;
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
    loss(micro).backward();
    for (const auto& item : model.named_parameters()) {
      const torch::Tensor g = item.value().grad().to(torch::kFloat64);
      sums.sum.try_emplace(item.key(), torch::zeros_like(g)).first->second.add_(g);
      sums.magnitude.try_emplace(item.key(), torch::zeros_like(g)).first->second.add_(g.abs());
    }
  }
  for (auto& [name, t] : sums.sum) t.div_(static_cast<double>(ranks));
  for (auto& [name, t] : sums.magnitude) t.div_(static_cast<double>(ranks));
  for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
  return sums;
}

// The largest |actual - expected| / magnitude over the elements: a sum of n terms rounded in float32 stays
// below about n * 2^-24 (6e-8) of it; rounded in bf16, each addition may err by 2^-9 (2e-3).
inline double error_in_magnitudes(const torch::Tensor& actual, const torch::Tensor& expected,
                                  const torch::Tensor& magnitude) {
  const torch::Tensor error = (actual.to(torch::kFloat64).reshape(expected.sizes()) - expected).abs();
  return (error / magnitude.clamp_min(1e-30)).max().item<double>();
}

}  // namespace kuafu::testing
