// Reverse-process samplers over a NoiseSchedule: DDIM (Song et al. 2021, eq. 12, with η's noise), DDPM (Ho
// et al. 2020: the posterior mean plus fixed-small variance noise), Euler discrete (Karras et al. 2022's ODE
// in σ = √((1 − ᾱ)/ᾱ)) and its ancestral variant (k-diffusion's: a step down to σ_down, then noise up to
// σ_{i+1}), Heun's method over Euler's σ (Karras et al. 2022, Algorithm 1 without churn: an Euler step, then
// the slope averaged with the one at its end, two model calls per step but the last), and DPM-Solver++(2M)
// (Lu et al. 2022, multistep, second order, first order at the start and the end) and UniPC (Zhao et al.
// 2023: its B(h) = e^h − 1 predictor of order 2 with a corrector after each step's model call), each with
// diffusers' timestep lists and conventions. DDIM steps from timestep i to
// timestep i + 1 of its own list: not to t − T/N as diffusers' DDIM does, which under linspace spacing
// lands off the list.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "apps/stable_diffusion/noise_schedule.h"

namespace kuafu::sd {

enum class SamplerKind { kDdim, kDdpm, kEuler, kEulerAncestral, kHeun, kDpmSolverPlusPlus2M, kUniPc };

class Sampler {
 public:
  virtual ~Sampler() = default;

  // The timesteps the model is called at, in order (fractional for Euler under linspace spacing).
  const std::vector<double>& timesteps() const { return timesteps_; }
  // The initial noise's standard deviation: latents start as init_noise_sigma() × N(0, 1).
  virtual double init_noise_sigma() const { return 1.0; }
  // What the model is given at step i: the sample, or Euler's x / √(σ² + 1).
  virtual torch::Tensor scale_model_input(const torch::Tensor& sample, size_t /*i*/) const { return sample; }
  // x at step i and the model's output there -> x at step i + 1 (x₀ after the last). Steps run in order
  // from first_step() (DPM-Solver keeps the previous step's estimate). `noise` (like `sample`): the step's Gaussian
  // draw where the sampler adds one (stochastic()), else unused.
  virtual torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                             const torch::Tensor& noise = {}) = 0;
  virtual bool stochastic() const { return false; }

  // img2img (diffusers' StableDiffusionImg2ImgPipeline): the first step the loop takes (0 unless begun later)
  // and, before any step, starting there instead.
  size_t first_step() const { return first_step_; }
  void begin_at(size_t i);
  // Model calls per step of the schedule (Heun: 2), which img2img's first step is counted in.
  virtual size_t calls_per_step() const { return 1; }
  // The clean latents x₀ noised to where step i starts, with `noise` shaped as x₀ (the schedulers' add_noise at
  // their begin index): √ᾱ_t x₀ + √(1 − ᾱ_t) ε for DDIM and DDPM.
  virtual torch::Tensor add_noise(const torch::Tensor& x0, const torch::Tensor& noise, size_t i) const;

 protected:
  Sampler(const NoiseSchedule& schedule, std::vector<double> timesteps) : schedule_(schedule), timesteps_(std::move(timesteps)) {}
  // Steps run in order from first_step() (samplers that keep earlier steps' results check it).
  void check_in_order(size_t i, const char* sampler);
  int64_t timestep_at(size_t i) const;  // an integer timestep's value (DDIM, DDPM)
  // ᾱ at the timestep after step i; `last` after the final step.
  double alpha_cumprod_after(size_t i, double last) const;

  const NoiseSchedule& schedule_;
  std::vector<double> timesteps_;

 private:
  size_t first_step_ = 0, next_step_ = 0;
};

class DdimSampler : public Sampler {
 public:
  // η ∈ [0, 1]: 0 deterministic, 1 DDPM's variance (diffusers' `eta`).
  DdimSampler(const NoiseSchedule& schedule, int64_t steps, double eta = 0.0);
  // x_prev = √ᾱ_prev x̂₀ + √(1 − ᾱ_prev − s²) ε̂ + s z, s = η √((1 − ᾱ_prev)/(1 − ᾱ_t) (1 − ᾱ_t/ᾱ_prev)); after the
  // last step ᾱ_prev is 1 (set_alpha_to_one) or ᾱ_0.
  torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                     const torch::Tensor& noise = {}) override;
  bool stochastic() const override { return eta_ > 0; }

 private:
  double eta_;
};

class DdpmSampler : public Sampler {
 public:
  DdpmSampler(const NoiseSchedule& schedule, int64_t steps);
  // The posterior mean of x_prev given x̂₀ and x_t, plus σ noise, σ² = (1 − ᾱ_prev)/(1 − ᾱ_t) · β_t with
  // β_t = 1 − ᾱ_t/ᾱ_prev (no noise at timestep 0; ᾱ after the final step is 1).
  torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                     const torch::Tensor& noise = {}) override;
  bool stochastic() const override { return true; }
};

// The timesteps a σ sampler calls the model at and its σ there [steps].
struct SigmaPath {
  std::vector<double> timesteps, sigmas;
};

// The samplers that walk σ: σ_i interpolated (linearly in t) from the schedule at each timestep, then 0.
// A zero-SNR schedule's last ᾱ is taken as 2⁻²⁴ here (σ finite), as diffusers does. With karras_sigmas,
// σ_i follow Karras et al. 2022 (ρ = 7) between the path's ends and each timestep is the one whose σ it
// is (log σ interpolated), as diffusers' use_karras_sigmas.
class SigmaSampler : public Sampler {
 public:
  const std::vector<double>& sigmas() const { return sigmas_; }  // [steps + 1]
  // The variance-preserving x at σ_i (DPM-Solver's and UniPC's): α_σ x₀ + σ α_σ ε, α_σ = 1/√(σ² + 1).
  torch::Tensor add_noise(const torch::Tensor& x0, const torch::Tensor& noise, size_t i) const override;

 protected:
  SigmaSampler(const NoiseSchedule& schedule, SigmaPath path);
  std::vector<double> sigmas_;
};

class EulerSampler : public SigmaSampler {
 public:
  EulerSampler(const NoiseSchedule& schedule, int64_t steps);
  double init_noise_sigma() const override;  // σ_max, or √(σ_max² + 1) under leading spacing
  // Euler's x is x₀ + σ ε.
  torch::Tensor add_noise(const torch::Tensor& x0, const torch::Tensor& noise, size_t i) const override;
  torch::Tensor scale_model_input(const torch::Tensor& sample, size_t i) const override;
  // x̂₀ from the output at σ_i, then x + (σ_{i+1} − σ_i) (x − x̂₀)/σ_i.
  torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                     const torch::Tensor& noise = {}) override;

 protected:
  torch::Tensor denoised(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample) const;  // x̂₀ at σ_i
};

class EulerAncestralSampler : public EulerSampler {
 public:
  using EulerSampler::EulerSampler;
  // σ_up = √(σ_{i+1}² (σ_i² − σ_{i+1}²)/σ_i²), σ_down = √(σ_{i+1}² − σ_up²): an Euler step to σ_down, then σ_up z.
  torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                     const torch::Tensor& noise = {}) override;
  bool stochastic() const override { return true; }
};

// diffusers' HeunDiscreteScheduler: Euler's σ_0..σ_{N−1} with each after the first called twice, so its
// timesteps are [t_0, t_1, t_1, ..., t_{N−1}, t_{N−1}] (2N − 1 model calls) and σ [σ_0, σ_1, σ_1, ..., 0].
// Odd calls correct the Euler step the call before made. No zero-SNR schedule (diffusers' Heun has none).
class HeunSampler : public EulerSampler {
 public:
  HeunSampler(const NoiseSchedule& schedule, int64_t steps);
  // First of a pair: d = (x − x̂₀)/σ_i, an Euler step to σ_{i+1}, remembered. Second: the step taken again
  // from where it started with the mean of d and the slope at its end, (x − x̂₀)/σ_i at the new x.
  torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                     const torch::Tensor& noise = {}) override;
  size_t calls_per_step() const override { return 2; }

 private:
  torch::Tensor start_, slope_;  // the pending Euler step's start and slope (undefined: none pending)
  double dt_ = 0;
};

class DpmSolverSampler : public SigmaSampler {
 public:
  DpmSolverSampler(const NoiseSchedule& schedule, int64_t steps);
  // With λ = log(α/σ), h = λ_{i+1} − λ_i: first order x' = (σ_{i+1}/σ_i) x − α_{i+1}(e^{−h} − 1) x̂₀ at the
  // first step taken and the last; between, second order with D₁ = (x̂₀ − x̂₀_prev) h / h_prev (midpoint).
  torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                     const torch::Tensor& noise = {}) override;

 private:
  torch::Tensor previous_x0_;  // undefined before the first step taken
};

// diffusers' UniPCMultistepScheduler as configured by default (solver_order 2, bh2, x̂₀ prediction, lower
// orders at the start and the end, a corrector at every step but the first): DPM-Solver's σ and timesteps
// (rounded under Karras σ whatever the schedule). Each call first corrects the previous step's result with
// the x̂₀ estimated at it (UniC), then predicts the next x (UniP) from the last two estimates.
class UniPcSampler : public SigmaSampler {
 public:
  UniPcSampler(const NoiseSchedule& schedule, int64_t steps);
  torch::Tensor step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                     const torch::Tensor& noise = {}) override;

 private:
  torch::Tensor estimates_[2];   // x̂₀ of the previous step and of the latest ([1]); [0] undefined at first
  torch::Tensor last_sample_;    // the x the latest prediction started from
  int order_ = 1;                // the latest prediction's order (the corrector uses the same)
  int warm_steps_ = 0;           // steps taken, up to the solver's order (its warm-up)
};

// Classifier-free guidance (Ho & Salimans 2022): ε_u + g (ε_c − ε_u) for g > 1. At g ≤ 1 the conditional
// output itself (ε_u + (ε_c − ε_u) rounds away from it at g = 1), with no unconditional pass, as diffusers'
// pipelines do.
torch::Tensor classifier_free_guidance(const torch::Tensor& unconditional, const torch::Tensor& conditional, double scale);
inline bool needs_unconditional(double scale) { return scale > 1.0; }

// Guidance rescale (Lin et al. 2024, "Common diffusion noise schedules and sample steps are flawed", 3.4;
// diffusers' guidance_rescale): the guided prediction [B, ...] scaled to each row's standard deviation of the
// conditional one, mixed with the guided one as rescale · scaled + (1 − rescale) · guided. 0: unchanged.
torch::Tensor rescale_guidance(const torch::Tensor& guided, const torch::Tensor& conditional, double rescale);

// img2img's first step (diffusers' get_timesteps): of `steps`, the last ⌊steps · strength⌋ are taken, so the
// loop starts at step steps − that, counted in the sampler's model calls. kuafu::Error for a strength outside
// (0, 1] or one that leaves no step.
size_t img2img_first_step(const Sampler& sampler, int64_t steps, double strength);

// The sampler `kind` over `steps` steps of `schedule` (which must outlive it).
std::unique_ptr<Sampler> make_sampler(SamplerKind kind, const NoiseSchedule& schedule, int64_t steps, double ddim_eta = 0.0);
// diffusers' class names (DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler, EulerAncestralDiscreteScheduler,
// DPMSolverMultistepScheduler)
// and Kuafu's short ones (ddim, ddpm, euler, euler_a, dpm++2m); kuafu::Error listing them.
SamplerKind sampler_named(const std::string& name);
// The samplers that walk σ (Euler's family, DPM-Solver, UniPC), and those of them Karras σ apply to.
bool walks_sigma(SamplerKind kind);
bool takes_karras_sigmas(SamplerKind kind);

}  // namespace kuafu::sd
