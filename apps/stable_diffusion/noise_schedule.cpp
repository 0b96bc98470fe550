#include "apps/stable_diffusion/noise_schedule.h"

#include <cmath>

#include "core/util/error.h"

namespace kuafu::sd {

namespace {

constexpr double kPi = 3.14159265358979323846;

// Betas [T] (float64) of the config's schedule.
torch::Tensor betas_of(const SchedulerConfig& c) {
  const int64_t n = c.num_train_timesteps;
  const auto f64 = torch::TensorOptions(torch::kFloat64);
  switch (c.beta_schedule) {
    case BetaSchedule::kLinear:
      return torch::linspace(c.beta_start, c.beta_end, n, f64);
    case BetaSchedule::kScaledLinear:  // linear in √β (latent diffusion's)
      return torch::linspace(std::sqrt(c.beta_start), std::sqrt(c.beta_end), n, f64).square();
    case BetaSchedule::kSquaredCosCapV2: {  // Glide's: ᾱ(s) = cos²((s + 0.008) / 1.008 · π/2), each β at most 0.999
      auto alpha_bar = [](double s) { return std::pow(std::cos((s + 0.008) / 1.008 * kPi / 2), 2); };
      torch::Tensor betas = torch::empty({n}, f64);
      for (int64_t i = 0; i < n; ++i) {
        const double a = static_cast<double>(i) / static_cast<double>(n), b = static_cast<double>(i + 1) / static_cast<double>(n);
        betas[i] = std::min(1 - alpha_bar(b) / alpha_bar(a), 0.999);
      }
      return betas;
    }
  }
  fail("unknown beta schedule");
}

// Lin et al. 2023, algorithm 1: √ᾱ shifted so that its last value is 0 and scaled so that its first
// stays, then back to betas.
torch::Tensor rescaled_to_zero_terminal_snr(const torch::Tensor& betas) {
  torch::Tensor root = torch::cumprod(1 - betas, 0).sqrt();
  const double first = root[0].item<double>(), last = root[-1].item<double>();
  root = (root - last) * (first / (first - last));
  const torch::Tensor alphas_cumprod = root.square();
  const torch::Tensor alphas = torch::cat({alphas_cumprod.narrow(0, 0, 1),
                                           alphas_cumprod.narrow(0, 1, betas.size(0) - 1) / alphas_cumprod.narrow(0, 0, betas.size(0) - 1)});
  return 1 - alphas;
}

// NumPy's round (half to even), which diffusers' timestep lists use.
int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

}  // namespace

NoiseSchedule::NoiseSchedule(SchedulerConfig config) : config_(config) {
  KUAFU_CHECK(config_.num_train_timesteps >= 2, "num_train_timesteps must be at least 2, got ", config_.num_train_timesteps);
  torch::Tensor betas = betas_of(config_);
  if (config_.rescale_betas_zero_snr) betas = rescaled_to_zero_terminal_snr(betas);
  alphas_cumprod_ = torch::cumprod(1 - betas, 0);
}

double NoiseSchedule::alpha_cumprod(int64_t t) const {
  KUAFU_CHECK(t >= 0 && t < train_timesteps(), "timestep ", t, " is outside the schedule's [0, ", train_timesteps(), ")");
  return alphas_cumprod_[t].item<double>();
}

torch::Tensor NoiseSchedule::at(const torch::Tensor& t, const torch::Tensor& like) const {
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[0] = t.size(0);
  return alphas_cumprod_.index_select(0, t.to(torch::kCPU, torch::kInt64)).to(like.device()).view(shape);
}

torch::Tensor NoiseSchedule::add_noise(const torch::Tensor& x0, const torch::Tensor& noise, const torch::Tensor& t) const {
  const torch::Tensor a = at(t, x0);
  return (a.sqrt() * x0 + (1 - a).sqrt() * noise).to(x0.scalar_type());
}

torch::Tensor NoiseSchedule::training_target(const torch::Tensor& x0, const torch::Tensor& noise, const torch::Tensor& t) const {
  switch (config_.prediction_type) {
    case Prediction::kEpsilon:
      return noise;
    case Prediction::kSample:
      return x0;
    case Prediction::kVPrediction: {
      const torch::Tensor a = at(t, x0);
      return (a.sqrt() * noise - (1 - a).sqrt() * x0).to(x0.scalar_type());
    }
  }
  fail("unknown prediction type");
}

torch::Tensor NoiseSchedule::snr(const torch::Tensor& t) const {
  const torch::Tensor a = alphas_cumprod_.index_select(0, t.to(torch::kCPU, torch::kInt64));
  return a / (1 - a);
}

torch::Tensor NoiseSchedule::min_snr_weights(const torch::Tensor& t, double gamma) const {
  KUAFU_CHECK(gamma > 0, "Min-SNR's gamma must be positive, got ", gamma);
  const torch::Tensor s = snr(t), clipped = s.clamp_max(gamma);
  switch (config_.prediction_type) {
    case Prediction::kEpsilon:  // min(SNR, γ) / SNR: 1 below γ (0/0 at zero SNR has that limit), γ / SNR above
      return torch::where(s < gamma, torch::ones_like(s), gamma / s);
    case Prediction::kVPrediction:
      return clipped / (s + 1);
    case Prediction::kSample:
      return clipped;
  }
  fail("unknown prediction type");
}

Estimates NoiseSchedule::estimates(const torch::Tensor& model_output, int64_t t, const torch::Tensor& sample) const {
  const double a = alpha_cumprod(t), b = 1 - a;
  Estimates e;
  switch (config_.prediction_type) {
    case Prediction::kEpsilon:
      e.x0 = (sample - std::sqrt(b) * model_output) / std::sqrt(a);
      e.epsilon = model_output;
      break;
    case Prediction::kSample:
      e.x0 = model_output;
      e.epsilon = (sample - std::sqrt(a) * model_output) / std::sqrt(b);
      break;
    case Prediction::kVPrediction:
      e.x0 = std::sqrt(a) * sample - std::sqrt(b) * model_output;
      e.epsilon = std::sqrt(a) * model_output + std::sqrt(b) * sample;
      break;
  }
  if (config_.clip_sample) e.x0 = e.x0.clamp(-config_.clip_sample_range, config_.clip_sample_range);
  return e;
}

std::vector<double> spaced_timesteps(int64_t total, int64_t count, TimestepSpacing spacing, int64_t offset, bool round_linspace) {
  KUAFU_CHECK(count >= 1, "a schedule of ", count, " timesteps");
  std::vector<double> out;
  switch (spacing) {
    case TimestepSpacing::kLinspace: {  // linspace(0, T − 1, N), descending; rounded, or float32 as Euler keeps it
      const double step = count > 1 ? static_cast<double>(total - 1) / static_cast<double>(count - 1) : 0.0;
      for (int64_t i = count - 1; i >= 0; --i) {
        const double t = i == count - 1 && count > 1 ? static_cast<double>(total - 1) : static_cast<double>(i) * step;
        out.push_back(round_linspace ? static_cast<double>(round_half_even(t)) : static_cast<double>(static_cast<float>(t)));
      }
      break;
    }
    case TimestepSpacing::kLeading: {  // (N − 1 .. 0) · ⌊T / N⌋ + offset
      const int64_t ratio = total / count;
      // The offset cut where it would push the first timestep past the schedule (1,000 steps with
      // offset 1: diffusers indexes ᾱ_1000 there), so every N in [1, T] runs.
      const int64_t cut = std::min(offset, total - 1 - (count - 1) * ratio);
      for (int64_t i = count - 1; i >= 0; --i) out.push_back(static_cast<double>(i * ratio + cut));
      break;
    }
    case TimestepSpacing::kTrailing: {  // round(arange(T, 0, −T/N)) − 1, as NumPy's arange counts it
      const double ratio = static_cast<double>(total) / static_cast<double>(count), start = static_cast<double>(total);
      const double delta = (start - ratio) - start;  // NumPy's arange steps by its second value minus its first
      const auto n = static_cast<int64_t>(std::ceil(start / ratio));
      for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<double>(round_half_even(start + static_cast<double>(i) * delta) - 1));
      break;
    }
  }
  for (const double t : out) {
    KUAFU_CHECK(t >= 0 && t <= static_cast<double>(total - 1), "inference timestep ", t, " of ", count, " falls outside [0, ",
                total, ")");
  }
  return out;
}

std::vector<int64_t> NoiseSchedule::timesteps(int64_t steps) const {
  const int64_t total = train_timesteps();
  KUAFU_CHECK(steps >= 1 && steps <= total, "inference steps must be in [1, ", total, "] (the training timesteps), got ", steps);
  std::vector<int64_t> out;
  for (const double t : spaced_timesteps(total, steps, config_.timestep_spacing, config_.steps_offset)) {
    out.push_back(static_cast<int64_t>(t));
  }
  return out;
}

BetaSchedule beta_schedule_named(const std::string& name) {
  if (name == "linear") return BetaSchedule::kLinear;
  if (name == "scaled_linear") return BetaSchedule::kScaledLinear;
  if (name == "squaredcos_cap_v2") return BetaSchedule::kSquaredCosCapV2;
  fail("beta_schedule \"" + name + "\" is not one of linear, scaled_linear, squaredcos_cap_v2");
}

TimestepSpacing timestep_spacing_named(const std::string& name) {
  if (name == "leading") return TimestepSpacing::kLeading;
  if (name == "trailing") return TimestepSpacing::kTrailing;
  if (name == "linspace") return TimestepSpacing::kLinspace;
  fail("timestep_spacing \"" + name + "\" is not one of leading, trailing, linspace");
}

Prediction prediction_named(const std::string& name) {
  if (name == "epsilon") return Prediction::kEpsilon;
  if (name == "v_prediction") return Prediction::kVPrediction;
  if (name == "sample") return Prediction::kSample;
  fail("prediction_type \"" + name + "\" is not one of epsilon, v_prediction, sample");
}

}  // namespace kuafu::sd
