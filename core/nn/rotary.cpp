#include "core/nn/rotary.h"

#include <cmath>

#include <torch/torch.h>

#include "core/util/error.h"

namespace kuafu::nn {
namespace {

// 1 / base^(2i / dim), i < dim / 2: transformers' default schedule (a Python float base).
torch::Tensor default_frequencies(double base, int64_t dim, const torch::Device& device) {
  const torch::Tensor exponents = torch::arange(0, dim, 2, torch::TensorOptions(torch::kInt64).device(device)).to(torch::kFloat32) /
                                  static_cast<double>(dim);
  return torch::reciprocal(torch::pow(base, exponents));
}

// Llama 3.1's: wavelengths past original / low_freq_factor slowed by `factor`, those below
// original / high_freq_factor kept, a linear ramp in original / wavelength between.
torch::Tensor llama3_frequencies(const RotarySpec& s, const torch::Device& device) {
  const torch::Tensor inv = default_frequencies(s.theta, s.head_dim, device);
  const double original = static_cast<double>(s.original_max_positions);
  const double low_wavelength = original / s.low_freq_factor, high_wavelength = original / s.high_freq_factor;
  const torch::Tensor wavelength = torch::reciprocal(inv) * (2 * M_PI);
  const torch::Tensor slowed = torch::where(wavelength > low_wavelength, inv / s.factor, inv);
  const torch::Tensor smooth = (torch::reciprocal(wavelength) * original - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const torch::Tensor ramp = (1 - smooth) * slowed / s.factor + smooth * slowed;
  const torch::Tensor medium = (wavelength < high_wavelength).logical_not().logical_and((wavelength > low_wavelength).logical_not());
  return torch::where(medium, ramp, slowed);
}

// Dynamic NTK past the context: base x (factor x length / context - (factor - 1))^(dim / (dim - 2)),
// in float32 tensors as transformers grows it during a forward.
torch::Tensor dynamic_frequencies(const RotarySpec& s, int64_t length, const torch::Device& device) {
  const auto f32 = torch::TensorOptions(torch::kFloat32).device(device);
  const double dim = static_cast<double>(s.head_dim);
  const torch::Tensor scale = torch::scalar_tensor(length, torch::TensorOptions(torch::kInt64).device(device)) * s.factor /
                                  static_cast<double>(s.max_positions) -
                              (s.factor - 1);
  const torch::Tensor base = s.theta * scale.to(f32).pow(dim / (dim - 2));
  const torch::Tensor exponents =
      torch::arange(0, s.head_dim, 2, torch::TensorOptions(torch::kInt64).device(device)).to(torch::kFloat32) / dim;
  return torch::reciprocal(torch::pow(base, exponents));
}

}  // namespace

void validate(const RotarySpec& s, const std::string& where) {
  KUAFU_CHECK(s.head_dim > 0 && s.head_dim % 2 == 0, where, "head_dim must be a positive even number, found ", s.head_dim);
  KUAFU_CHECK(s.theta > 0, where, "rope_theta must be positive, found ", s.theta);
  const bool known = s.type == "default" || s.type == "linear" || s.type == "dynamic" || s.type == "llama3";
  KUAFU_CHECK(known, where, "rope_type \"", s.type, "\" is not one Kuafu computes (default, linear, dynamic, llama3)");
  if (s.type != "default") KUAFU_CHECK(s.factor > 0, where, "rope factor must be positive, found ", s.factor);
  if (s.type == "dynamic") KUAFU_CHECK(s.max_positions > 0, where, "dynamic rope needs max_position_embeddings");
  if (s.type == "llama3") {
    KUAFU_CHECK(s.original_max_positions > 0, where, "llama3 rope needs original_max_position_embeddings");
    KUAFU_CHECK(s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0, where,
                "llama3 rope needs 0 < low_freq_factor < high_freq_factor, found ", s.low_freq_factor, " and ", s.high_freq_factor);
  }
}

torch::Tensor inverse_frequencies(const RotarySpec& s, int64_t longest, const torch::Device& device) {
  if (s.type == "linear") return default_frequencies(s.theta, s.head_dim, device) / s.factor;
  if (s.type == "llama3") return llama3_frequencies(s, device);
  if (s.type == "dynamic" && longest + 1 > s.max_positions) return dynamic_frequencies(s, longest + 1, device);
  return default_frequencies(s.theta, s.head_dim, device);
}

std::pair<torch::Tensor, torch::Tensor> rotary_angles(const RotarySpec& s, const torch::Tensor& positions, torch::Dtype dtype) {
  // Only the dynamic schedule reads the longest position, which costs a host sync.
  const int64_t longest = s.type == "dynamic" ? positions.max().item<int64_t>() : 0;
  const torch::Tensor inv = inverse_frequencies(s, longest, positions.device());
  const torch::Tensor angles = positions.unsqueeze(-1).to(torch::kFloat32) * inv;  // [B, T, D / 2]
  const torch::Tensor both = torch::cat({angles, angles}, -1);                      // [B, T, D]
  return {both.cos().to(dtype), both.sin().to(dtype)};
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(2) + rotated * sin.unsqueeze(2);
}

}  // namespace kuafu::nn
