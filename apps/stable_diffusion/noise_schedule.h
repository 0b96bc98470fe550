// The forward diffusion process as diffusers' scheduler configs describe it: the betas (linear, scaled
// linear, Glide's squared cosine; optionally rescaled to zero terminal SNR), ᾱ_t, noising and the
// training target for ε-, v- or x₀-prediction, the SNR and Min-SNR loss weights, and the inference
// timesteps of each spacing (leading, trailing, linspace). ᾱ is kept in float64 (diffusers keeps float32).
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

namespace kuafu::sd {

enum class BetaSchedule { kLinear, kScaledLinear, kSquaredCosCapV2 };
enum class TimestepSpacing { kLeading, kTrailing, kLinspace };
enum class Prediction { kEpsilon, kVPrediction, kSample };

// diffusers' scheduler_config.json fields, with diffusers' defaults.
struct SchedulerConfig {
  int64_t num_train_timesteps = 1000;
  double beta_start = 0.0001, beta_end = 0.02;
  BetaSchedule beta_schedule = BetaSchedule::kLinear;
  bool rescale_betas_zero_snr = false;  // Lin et al. 2023: ᾱ_T = 0 (then v-prediction is needed)
  TimestepSpacing timestep_spacing = TimestepSpacing::kLeading;
  int64_t steps_offset = 0;             // leading: added to every inference timestep (SD uses 1)
  bool set_alpha_to_one = true;         // DDIM: ᾱ after the last step is 1, else ᾱ_0
  Prediction prediction_type = Prediction::kEpsilon;
  bool clip_sample = true;              // clamp x̂₀ to ±clip_sample_range (off for latents)
  double clip_sample_range = 1.0;
  bool karras_sigmas = false;           // Euler, DPM-Solver: σ spaced as Karras et al. 2022 (use_karras_sigmas)
};

// x̂₀ and ε̂ from a model's output at ᾱ_t.
struct Estimates {
  torch::Tensor x0, epsilon;
};

class NoiseSchedule {
 public:
  explicit NoiseSchedule(SchedulerConfig config);

  const SchedulerConfig& config() const { return config_; }
  int64_t train_timesteps() const { return config_.num_train_timesteps; }
  const torch::Tensor& alphas_cumprod() const { return alphas_cumprod_; }  // [T] float64
  double alpha_cumprod(int64_t t) const;  // kuafu::Error naming t outside [0, T)

  // x_t = √ᾱ_t x₀ + √(1 − ᾱ_t) ε for each row's timestep t [B] (x₀, ε [B, ...]).
  torch::Tensor add_noise(const torch::Tensor& x0, const torch::Tensor& noise, const torch::Tensor& t) const;
  // What the model learns to output at t: ε, v = √ᾱ_t ε − √(1 − ᾱ_t) x₀, or x₀.
  torch::Tensor training_target(const torch::Tensor& x0, const torch::Tensor& noise, const torch::Tensor& t) const;
  // SNR(t) = ᾱ_t / (1 − ᾱ_t) [B], float64.
  torch::Tensor snr(const torch::Tensor& t) const;
  // Min-SNR-γ loss weights [B] (Hang et al. 2023) for the config's prediction: ε min(SNR, γ)/SNR,
  // v min(SNR, γ)/(SNR + 1), x₀ min(SNR, γ); finite at a zero-SNR terminal step (ε's limit there is 1).
  torch::Tensor min_snr_weights(const torch::Tensor& t, double gamma) const;

  // The model output at t (a scalar timestep) read as x̂₀ and ε̂, x̂₀ clamped when clip_sample.
  Estimates estimates(const torch::Tensor& model_output, int64_t t, const torch::Tensor& sample) const;

  // The `steps` inference timesteps, descending, in the config's spacing (diffusers' lists exactly, but
  // for leading spacing's offset, cut where it would pass the last timestep); kuafu::Error when steps is
  // not in [1, T].
  std::vector<int64_t> timesteps(int64_t steps) const;

 private:
  torch::Tensor at(const torch::Tensor& t, const torch::Tensor& like) const;  // ᾱ_t per row, shaped to broadcast over `like`

  SchedulerConfig config_;
  torch::Tensor alphas_cumprod_;
};

// `count` timesteps of [0, total), descending, in `spacing` as diffusers lays them out: linspace rounded
// (or float32, as Euler keeps it), leading ⌊total/count⌋ apart plus `offset` (cut where it would pass the
// end), trailing total/count apart counted from the end.
std::vector<double> spaced_timesteps(int64_t total, int64_t count, TimestepSpacing spacing, int64_t offset,
                                     bool round_linspace = true);

// The names diffusers' configs use ("scaled_linear", "trailing", "v_prediction", ...); kuafu::Error
// listing the known ones.
BetaSchedule beta_schedule_named(const std::string& name);
TimestepSpacing timestep_spacing_named(const std::string& name);
Prediction prediction_named(const std::string& name);

}  // namespace kuafu::sd
