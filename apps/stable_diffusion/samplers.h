// Reverse-process steps over a NoiseSchedule's inference timesteps: DDIM (η = 0, Song et al. 2021,
// eq. 12) and DDPM (Ho et al. 2020, the posterior mean plus fixed-small variance noise). Each step goes
// from the schedule's timestep i to timestep i + 1 of the same list: not to t − T/N as diffusers' DDIM
// does, which under linspace spacing lands off the list.
#pragma once

#include <vector>

#include "apps/stable_diffusion/noise_schedule.h"

namespace kuafu::sd {

class Sampler {
 public:
  Sampler(const NoiseSchedule& schedule, int64_t steps) : schedule_(schedule), timesteps_(schedule.timesteps(steps)) {}
  virtual ~Sampler() = default;

  const std::vector<int64_t>& timesteps() const { return timesteps_; }
  // x at timesteps()[i] and the model's output there -> x at the next timestep (or x₀ after the last).
  // `noise` (like `sample`): the step's Gaussian draw where the sampler adds one (DDPM), else unused.
  virtual torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                             const torch::Tensor& noise = {}) const = 0;
  // Whether step adds noise (then `noise` must be given for every step but the last).
  virtual bool stochastic() const = 0;

 protected:
  // ᾱ at the timestep after timesteps()[i]; `last` is ᾱ after the final step.
  double next_alpha_cumprod(size_t i, double last) const;

  const NoiseSchedule& schedule_;
  std::vector<int64_t> timesteps_;
};

class DdimSampler : public Sampler {
 public:
  using Sampler::Sampler;
  // x_prev = √ᾱ_prev x̂₀ + √(1 − ᾱ_prev) ε̂; after the last step ᾱ_prev is 1 (set_alpha_to_one) or ᾱ_0.
  torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                     const torch::Tensor& noise = {}) const override;
  bool stochastic() const override { return false; }
};

class DdpmSampler : public Sampler {
 public:
  using Sampler::Sampler;
  // The posterior mean of x_prev given x̂₀ and x_t, plus σ noise, σ² = (1 − ᾱ_prev)/(1 − ᾱ_t) · β_t with
  // β_t = 1 − ᾱ_t/ᾱ_prev (no noise at timestep 0; ᾱ after the final step is 1).
  torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                     const torch::Tensor& noise = {}) const override;
  bool stochastic() const override { return true; }
};

}  // namespace kuafu::sd
