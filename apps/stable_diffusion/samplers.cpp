#include "apps/stable_diffusion/samplers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/util/error.h"

namespace kuafu::sd {

namespace {

std::vector<double> as_doubles(const std::vector<int64_t>& values) { return {values.begin(), values.end()}; }

// DPM-Solver's lists: N + 1 points of linspace or leading spacing with the last (0) dropped; trailing as DDIM's.
std::vector<double> dpm_timesteps(const NoiseSchedule& schedule, int64_t steps) {
  const SchedulerConfig& c = schedule.config();
  KUAFU_CHECK(steps >= 1 && steps <= c.num_train_timesteps, "inference steps must be in [1, ", c.num_train_timesteps, "], got ", steps);
  if (c.timestep_spacing == TimestepSpacing::kTrailing) return as_doubles(schedule.timesteps(steps));
  std::vector<double> t = spaced_timesteps(c.num_train_timesteps, steps + 1, c.timestep_spacing, c.steps_offset);
  t.pop_back();
  return t;
}

// Euler's lists: DDIM's, but linspace's left unrounded (float32).
std::vector<double> euler_timesteps(const NoiseSchedule& schedule, int64_t steps) {
  const SchedulerConfig& c = schedule.config();
  if (c.timestep_spacing != TimestepSpacing::kLinspace) return as_doubles(schedule.timesteps(steps));
  KUAFU_CHECK(steps >= 1 && steps <= c.num_train_timesteps, "inference steps must be in [1, ", c.num_train_timesteps, "], got ", steps);
  return spaced_timesteps(c.num_train_timesteps, steps, c.timestep_spacing, c.steps_offset, /*round_linspace=*/false);
}

// σ = √((1 − ᾱ)/ᾱ) at every training timestep [T]; a zero-SNR schedule's last ᾱ taken as 2⁻²⁴ (σ finite), as
// diffusers does.
std::vector<double> training_sigmas(const NoiseSchedule& schedule) {
  const int64_t total = schedule.train_timesteps();
  std::vector<double> sigmas;
  for (int64_t t = 0; t < total; ++t) {
    const double a = t == total - 1 && schedule.config().rescale_betas_zero_snr ? std::pow(2.0, -24) : schedule.alpha_cumprod(t);
    sigmas.push_back(std::sqrt((1 - a) / a));
  }
  return sigmas;
}

// σ at each (fractional) timestep, linear in t between the integer timesteps around it.
std::vector<double> sigmas_at(const std::vector<double>& training, const std::vector<double>& timesteps) {
  std::vector<double> out;
  const auto last = static_cast<int64_t>(training.size()) - 1;
  for (const double t : timesteps) {
    const auto below = static_cast<int64_t>(std::floor(t));
    const int64_t above = std::min(below + 1, last);
    const double w = t - static_cast<double>(below);
    out.push_back((1 - w) * training.at(below) + w * training.at(above));
  }
  return out;
}

// Karras et al. 2022, eq. 5 with ρ = 7: n σ from σ_max down to σ_min, evenly spaced in σ^(1/ρ).
std::vector<double> karras_sigmas(double sigma_max, double sigma_min, int64_t n) {
  constexpr double rho = 7.0;
  const double from = std::pow(sigma_max, 1 / rho), to = std::pow(sigma_min, 1 / rho);
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) {
    const double ramp = n == 1 ? 0.0 : static_cast<double>(i) / static_cast<double>(n - 1);
    out.push_back(std::pow(from + ramp * (to - from), rho));
  }
  return out;
}

// The values rounded to float32. diffusers keeps the training σ and their logs in float32, and where a
// Karras σ equals a training σ (σ_max always does) the rounding decides which side of it the timestep
// falls: under zero SNR, whose σ is not monotonic at the end (σ_998 = 15,406 > σ_999 = 4,096), that
// is 999 or 995.3.
std::vector<double> as_float32(std::vector<double> values) {
  for (double& v : values) v = static_cast<float>(v);
  return values;
}

// log σ of each training timestep as float32 values [T], the table timestep_of_sigma reads.
std::vector<double> float32_logs(const std::vector<double>& training) {
  std::vector<double> logs;
  for (const double sigma : training) logs.push_back(static_cast<float>(std::log(sigma)));
  return logs;
}

// The fractional timestep of σ: log σ interpolated linearly between the two training timesteps around it
// (the last whose σ is at most σ and the next, clamped to the schedule), diffusers' _sigma_to_t over the
// float32 log σ of the training timesteps [T].
double timestep_of_sigma(double sigma, const std::vector<double>& log_sigmas) {
  const double log_sigma = std::log(std::max(sigma, 1e-10));
  const auto n = static_cast<int64_t>(log_sigmas.size());
  int64_t low = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (log_sigma - log_sigmas[t] >= 0) low = t;
  }
  low = std::min(low, n - 2);
  const double lo = log_sigmas[low], hi = log_sigmas[low + 1];
  const double w = std::clamp((lo - log_sigma) / (lo - hi), 0.0, 1.0);
  return (1 - w) * static_cast<double>(low) + w * static_cast<double>(low + 1);
}

// Euler's path: σ at its timesteps, or with Karras σ from the first to the last of them, each called at the
// timestep of its σ (σ and timesteps float32 values, as diffusers keeps them).
SigmaPath euler_path(const NoiseSchedule& schedule, int64_t steps) {
  const std::vector<double> training = training_sigmas(schedule);
  std::vector<double> timesteps = euler_timesteps(schedule, steps);
  if (!schedule.config().karras_sigmas) return {timesteps, sigmas_at(training, timesteps)};
  const std::vector<double> training32 = as_float32(training), log_sigmas = float32_logs(training32);
  const std::vector<double> spaced = sigmas_at(training32, timesteps);
  const std::vector<double> sigmas = karras_sigmas(spaced.front(), spaced.back(), steps);
  for (size_t i = 0; i < sigmas.size(); ++i) timesteps[i] = static_cast<float>(timestep_of_sigma(sigmas[i], log_sigmas));
  return {timesteps, as_float32(sigmas)};
}

// DPM-Solver's path: σ at its timesteps, or with Karras σ over the whole schedule (σ at T − 1 down to σ at 0,
// float32 values), each called at its σ's timestep rounded (truncated under the cosine schedule unless
// `always_round`: UniPC rounds there too), as diffusers does.
SigmaPath dpm_path(const NoiseSchedule& schedule, int64_t steps, bool always_round = false) {
  const std::vector<double> training = training_sigmas(schedule);
  std::vector<double> timesteps = dpm_timesteps(schedule, steps);
  if (!schedule.config().karras_sigmas) return {timesteps, sigmas_at(training, timesteps)};
  const std::vector<double> training32 = as_float32(training), log_sigmas = float32_logs(training32);
  const std::vector<double> sigmas = karras_sigmas(training32.back(), training32.front(), steps);
  const bool cosine = !always_round && schedule.config().beta_schedule == BetaSchedule::kSquaredCosCapV2;
  timesteps.resize(sigmas.size());
  for (size_t i = 0; i < sigmas.size(); ++i) {
    const double t = timestep_of_sigma(sigmas[i], log_sigmas);
    timesteps[i] = cosine ? std::trunc(t) : std::nearbyint(t);  // numpy's round: half to even
  }
  return {timesteps, as_float32(sigmas)};
}

// α_σ = 1/√(σ² + 1) and σ·α_σ: the signal and noise scales of the variance-preserving x at σ.
std::pair<double, double> alpha_sigma(double sigma) {
  const double alpha = 1 / std::sqrt(sigma * sigma + 1);
  return {alpha, sigma * alpha};
}

// λ = log(α/σ) at σ (+∞ at σ = 0).
double lambda_at(double sigma) {
  const auto [alpha, noise] = alpha_sigma(sigma);
  return std::log(alpha) - std::log(noise);
}

// An earlier estimate's place in λ relative to a step: (λ(σ_earlier) − λ(σ_from)) / (λ(σ_to) − λ(σ_from)).
double lambda_ratio(double sigma_earlier, double sigma_from, double sigma_to) {
  return (lambda_at(sigma_earlier) - lambda_at(sigma_from)) / (lambda_at(sigma_to) - lambda_at(sigma_from));
}

// x̂₀ from a model output at σ of the variance-preserving x (DPM-Solver++'s and UniPC's data prediction).
torch::Tensor estimate_x0(const torch::Tensor& model_output, const torch::Tensor& sample, double sigma, Prediction prediction) {
  const auto [alpha, noise] = alpha_sigma(sigma);
  switch (prediction) {
    case Prediction::kEpsilon:
      return (sample - noise * model_output) / alpha;
    case Prediction::kVPrediction:
      return alpha * sample - noise * model_output;
    case Prediction::kSample:
      return model_output;
  }
  fail("unknown prediction type");
}

// UniPC's step from σ_s to σ_t (λ step h) with B(h) = e^{−h} − 1 (bh2, data prediction): the first-order
// part x' = (σ_t/σ_s) x − α_t (e^{−h} − 1) m0, and b_k = φ_k(−h) k!/B(h) for k = 1, 2 with
// φ_1 = (e^{−h} − 1)/(−h) − 1, φ_{k+1} = φ_k/(−h) − 1/(k + 1)!: the weights of the higher-order terms.
struct UniPcStep {
  double first_order_scale = 0, first_order_x0 = 0, alpha_t = 0, b_h = 0;
  double b[2] = {0, 0};
};

UniPcStep unipc_step(double sigma_s, double sigma_t) {
  const double noise_s = alpha_sigma(sigma_s).second;
  const auto [alpha_t, noise_t] = alpha_sigma(sigma_t);
  const double hh = -(lambda_at(sigma_t) - lambda_at(sigma_s));  // −h: −∞ at the final σ = 0
  const double h_phi_1 = std::expm1(hh);
  UniPcStep step;
  step.first_order_scale = noise_t / noise_s;
  step.first_order_x0 = alpha_t * h_phi_1;
  step.alpha_t = alpha_t;
  step.b_h = h_phi_1;
  double h_phi_k = h_phi_1 / hh - 1, factorial = 1;
  for (int k = 1; k <= 2; ++k) {
    step.b[k - 1] = h_phi_k * factorial / step.b_h;
    factorial *= k + 1;
    h_phi_k = h_phi_k / hh - 1 / factorial;
  }
  return step;
}

}  // namespace

void Sampler::begin_at(size_t i) {
  KUAFU_CHECK(next_step_ == first_step_, "a sampler begins before its first step");
  KUAFU_CHECK(i < timesteps_.size(), "step ", i, " of a ", timesteps_.size(), "-call schedule");
  first_step_ = next_step_ = i;
}

void Sampler::check_in_order(size_t i, const char* sampler) {
  KUAFU_CHECK(i == next_step_, sampler, " steps in order: step ", i, " after step ", next_step_, " was due");
  ++next_step_;
}

torch::Tensor Sampler::add_noise(const torch::Tensor& x0, const torch::Tensor& noise, size_t i) const {
  const double a = schedule_.alpha_cumprod(timestep_at(i));
  return std::sqrt(a) * x0 + std::sqrt(1 - a) * noise;
}

size_t img2img_first_step(const Sampler& sampler, int64_t steps, double strength) {
  KUAFU_CHECK(strength > 0 && strength <= 1, "img2img's strength ", strength, " is not in (0, 1]");
  const int64_t taken = std::min(static_cast<int64_t>(static_cast<double>(steps) * strength), steps);
  KUAFU_CHECK(taken >= 1, "img2img's strength ", strength, " takes none of ", steps, " steps: raise the strength or the steps");
  return static_cast<size_t>(steps - taken) * sampler.calls_per_step();
}

int64_t Sampler::timestep_at(size_t i) const {
  KUAFU_CHECK(i < timesteps_.size(), "step ", i, " of a ", timesteps_.size(), "-step schedule");
  return static_cast<int64_t>(timesteps_[i]);
}

double Sampler::alpha_cumprod_after(size_t i, double last) const {
  return i + 1 < timesteps_.size() ? schedule_.alpha_cumprod(timestep_at(i + 1)) : last;
}

DdimSampler::DdimSampler(const NoiseSchedule& schedule, int64_t steps, double eta)
    : Sampler(schedule, as_doubles(schedule.timesteps(steps))), eta_(eta) {
  KUAFU_CHECK(eta >= 0 && eta <= 1, "DDIM's eta ", eta, " is not in [0, 1]");
}

torch::Tensor DdimSampler::step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample, const torch::Tensor& noise) {
  const int64_t t = timestep_at(i);
  const double last = schedule_.config().set_alpha_to_one ? 1.0 : schedule_.alpha_cumprod(0);
  const double previous = alpha_cumprod_after(i, last);
  const Estimates e = schedule_.estimates(model_output, t, sample);
  if (eta_ == 0) return std::sqrt(previous) * e.x0 + std::sqrt(1 - previous) * e.epsilon;
  const double a = schedule_.alpha_cumprod(t);
  const double spread = eta_ * std::sqrt((1 - previous) / (1 - a) * (1 - a / previous));
  KUAFU_CHECK(noise.defined(), "DDIM's step with eta ", eta_, " adds noise: give it");
  return std::sqrt(previous) * e.x0 + std::sqrt(1 - previous - spread * spread) * e.epsilon + spread * noise;
}

DdpmSampler::DdpmSampler(const NoiseSchedule& schedule, int64_t steps) : Sampler(schedule, as_doubles(schedule.timesteps(steps))) {}

torch::Tensor DdpmSampler::step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample, const torch::Tensor& noise) {
  const int64_t t = timestep_at(i);
  const double a = schedule_.alpha_cumprod(t);
  const double previous = alpha_cumprod_after(i, 1.0);
  const double beta = 1 - a / previous;  // this step's β (over however many training steps it spans)
  const Estimates e = schedule_.estimates(model_output, t, sample);
  const torch::Tensor mean = (std::sqrt(previous) * beta / (1 - a)) * e.x0 + (std::sqrt(1 - beta) * (1 - previous) / (1 - a)) * sample;
  if (t == 0) return mean;
  KUAFU_CHECK(noise.defined(), "DDPM's step at timestep ", t, " adds noise: give it");
  const double variance = std::max((1 - previous) / (1 - a) * beta, 1e-20);
  return mean + std::sqrt(variance) * noise;
}

SigmaSampler::SigmaSampler(const NoiseSchedule& schedule, SigmaPath path)
    : Sampler(schedule, std::move(path.timesteps)), sigmas_(std::move(path.sigmas)) {
  sigmas_.push_back(0.0);
}

torch::Tensor SigmaSampler::add_noise(const torch::Tensor& x0, const torch::Tensor& noise, size_t i) const {
  const auto [alpha, sigma] = alpha_sigma(sigmas_.at(i));
  return alpha * x0 + sigma * noise;
}

EulerSampler::EulerSampler(const NoiseSchedule& schedule, int64_t steps) : SigmaSampler(schedule, euler_path(schedule, steps)) {}

torch::Tensor EulerSampler::add_noise(const torch::Tensor& x0, const torch::Tensor& noise, size_t i) const {
  return x0 + sigmas_.at(i) * noise;
}

double EulerSampler::init_noise_sigma() const {
  const double largest = *std::max_element(sigmas_.begin(), sigmas_.end());
  return schedule_.config().timestep_spacing == TimestepSpacing::kLeading ? std::sqrt(largest * largest + 1) : largest;
}

torch::Tensor EulerSampler::scale_model_input(const torch::Tensor& sample, size_t i) const {
  return sample / std::sqrt(sigmas_.at(i) * sigmas_.at(i) + 1);
}

torch::Tensor EulerSampler::denoised(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample) const {
  const double sigma = sigmas_.at(i);
  switch (schedule_.config().prediction_type) {
    case Prediction::kEpsilon:
      return sample - sigma * model_output;
    case Prediction::kVPrediction:
      return model_output * (-sigma / std::sqrt(sigma * sigma + 1)) + sample / (sigma * sigma + 1);
    case Prediction::kSample:
      return model_output;
  }
  fail("unknown prediction type");
}

torch::Tensor EulerSampler::step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample, const torch::Tensor&) {
  const double sigma = sigmas_.at(i);
  return sample + (sample - denoised(model_output, i, sample)) / sigma * (sigmas_.at(i + 1) - sigma);
}

torch::Tensor EulerAncestralSampler::step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                                          const torch::Tensor& noise) {
  const double from = sigmas_.at(i), to = sigmas_.at(i + 1);
  const double up = std::sqrt(to * to * (from * from - to * to) / (from * from));
  const double down = std::sqrt(to * to - up * up);
  const torch::Tensor moved = sample + (sample - denoised(model_output, i, sample)) / from * (down - from);
  KUAFU_CHECK(noise.defined(), "the ancestral Euler step adds noise: give it");
  return moved + up * noise;
}

HeunSampler::HeunSampler(const NoiseSchedule& schedule, int64_t steps) : EulerSampler(schedule, steps) {
  KUAFU_CHECK(!schedule.config().rescale_betas_zero_snr, "Heun's sampler (diffusers' HeunDiscreteScheduler) has no "
              "zero-SNR schedule (rescale_betas_zero_snr): choose euler, euler_a, dpm++2m or ddim for this model");
  // [t_0, t_1, t_1, ...] and [σ_0, σ_1, σ_1, ..., σ_{N−1}, σ_{N−1}, 0] from Euler's lists.
  const std::vector<double> timesteps = timesteps_, sigmas = sigmas_;
  timesteps_ = {timesteps.front()};
  sigmas_ = {sigmas.front()};
  for (size_t k = 1; k < timesteps.size(); ++k) {
    timesteps_.insert(timesteps_.end(), 2, timesteps[k]);
    sigmas_.insert(sigmas_.end(), 2, sigmas[k]);
  }
  sigmas_.push_back(0.0);
}

torch::Tensor HeunSampler::step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample, const torch::Tensor&) {
  check_in_order(i, "Heun's sampler");
  const torch::Tensor slope = (sample - denoised(model_output, i, sample)) / sigmas_.at(i);
  if (!start_.defined()) {  // an Euler step to the next σ, corrected by the next call (but at the end)
    dt_ = sigmas_.at(i + 1) - sigmas_.at(i);
    start_ = sample;
    slope_ = slope;
    return sample + slope * dt_;
  }
  torch::Tensor corrected = start_ + (slope_ + slope) / 2 * dt_;
  start_ = slope_ = torch::Tensor();
  return corrected;
}

DpmSolverSampler::DpmSolverSampler(const NoiseSchedule& schedule, int64_t steps) : SigmaSampler(schedule, dpm_path(schedule, steps)) {}

torch::Tensor DpmSolverSampler::step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample, const torch::Tensor&) {
  check_in_order(i, "DPM-Solver");
  const auto [alpha_s, sigma_s] = alpha_sigma(sigmas_.at(i));
  const auto [alpha_t, sigma_t] = alpha_sigma(sigmas_.at(i + 1));
  // DPM-Solver++ works on x̂₀.
  const torch::Tensor x0 = estimate_x0(model_output, sample, sigmas_.at(i), schedule_.config().prediction_type);
  const double h = lambda_at(sigmas_.at(i + 1)) - lambda_at(sigmas_.at(i));
  const double decay = std::exp(-h) - 1;  // −1 at the final σ = 0: the step lands on x̂₀
  const bool last = i + 1 == timesteps_.size();
  torch::Tensor next = (sigma_t / sigma_s) * sample - (alpha_t * decay) * x0;
  if (previous_x0_.defined() && !last) {  // second order: the previous estimate gives the slope in λ
    const double h_previous = lambda_at(sigmas_.at(i)) - lambda_at(sigmas_.at(i - 1));
    next = next - 0.5 * (alpha_t * decay) * (h / h_previous) * (x0 - previous_x0_);
  }
  previous_x0_ = x0;
  return next;
}

UniPcSampler::UniPcSampler(const NoiseSchedule& schedule, int64_t steps)
    : SigmaSampler(schedule, dpm_path(schedule, steps, /*always_round=*/true)) {}

torch::Tensor UniPcSampler::step(const torch::Tensor& model_output, size_t i, const torch::Tensor& given, const torch::Tensor&) {
  check_in_order(i, "UniPC");
  const torch::Tensor x0 = estimate_x0(model_output, given, sigmas_.at(i), schedule_.config().prediction_type);
  torch::Tensor sample = given;
  if (last_sample_.defined()) {
    // UniC: the step from σ_{i−1} taken again with this call's x̂₀ (m_t) beside the estimates it used.
    const UniPcStep c = unipc_step(sigmas_.at(i - 1), sigmas_.at(i));
    const torch::Tensor& m0 = estimates_[1];
    const torch::Tensor base = c.first_order_scale * last_sample_ - c.first_order_x0 * m0;
    if (order_ == 1) {
      sample = base - c.alpha_t * c.b_h * (0.5 * (x0 - m0));
    } else {
      // ρ solves [1 1; r 1] ρ = b, r the previous estimate's λ offset over h.
      const double r = lambda_ratio(sigmas_.at(i - 2), sigmas_.at(i - 1), sigmas_.at(i));
      const double rho0 = (c.b[0] - c.b[1]) / (1 - r), rho1 = c.b[0] - rho0;
      const torch::Tensor d1 = (estimates_[0] - m0) / r;
      sample = base - c.alpha_t * c.b_h * (rho0 * d1 + rho1 * (x0 - m0));
    }
  }
  estimates_[0] = estimates_[1];
  estimates_[1] = x0;
  // Order 2 once two estimates exist, 1 at the last step (lower_order_final).
  order_ = std::min<int>({2, static_cast<int>(timesteps_.size() - i), warm_steps_ + 1});
  last_sample_ = sample;
  warm_steps_ = std::min(warm_steps_ + 1, 2);
  // UniP: the first-order step, plus half the slope between the last two estimates at order 2.
  const UniPcStep p = unipc_step(sigmas_.at(i), sigmas_.at(i + 1));
  torch::Tensor next = p.first_order_scale * sample - p.first_order_x0 * x0;
  if (order_ == 2) {
    const double r = lambda_ratio(sigmas_.at(i - 1), sigmas_.at(i), sigmas_.at(i + 1));
    next = next - p.alpha_t * p.b_h * (0.5 * ((estimates_[0] - x0) / r));
  }
  return next;
}

torch::Tensor classifier_free_guidance(const torch::Tensor& unconditional, const torch::Tensor& conditional, double scale) {
  if (!needs_unconditional(scale)) return conditional;
  return unconditional + scale * (conditional - unconditional);
}

torch::Tensor rescale_guidance(const torch::Tensor& guided, const torch::Tensor& conditional, double rescale) {
  if (rescale == 0.0) return guided;
  const auto row_std = [](const torch::Tensor& t) {  // [B, ...] -> [B, 1, ...], the unbiased estimate
    std::vector<int64_t> shape(static_cast<size_t>(t.dim()), 1);
    shape[0] = t.size(0);
    return t.flatten(1).std(1, /*unbiased=*/true).view(shape);
  };
  const torch::Tensor scaled = guided * (row_std(conditional) / row_std(guided));
  return rescale * scaled + (1 - rescale) * guided;
}

std::unique_ptr<Sampler> make_sampler(SamplerKind kind, const NoiseSchedule& schedule, int64_t steps, double ddim_eta) {
  KUAFU_CHECK(ddim_eta == 0 || kind == SamplerKind::kDdim, "eta ", ddim_eta, " is DDIM's: the sampler is another");
  switch (kind) {
    case SamplerKind::kDdim:
      return std::make_unique<DdimSampler>(schedule, steps, ddim_eta);
    case SamplerKind::kDdpm:
      return std::make_unique<DdpmSampler>(schedule, steps);
    case SamplerKind::kEuler:
      return std::make_unique<EulerSampler>(schedule, steps);
    case SamplerKind::kEulerAncestral:
      return std::make_unique<EulerAncestralSampler>(schedule, steps);
    case SamplerKind::kHeun:
      return std::make_unique<HeunSampler>(schedule, steps);
    case SamplerKind::kDpmSolverPlusPlus2M:
      return std::make_unique<DpmSolverSampler>(schedule, steps);
    case SamplerKind::kUniPc:
      return std::make_unique<UniPcSampler>(schedule, steps);
  }
  fail("unknown sampler");
}

bool walks_sigma(SamplerKind kind) { return kind != SamplerKind::kDdim && kind != SamplerKind::kDdpm; }

bool takes_karras_sigmas(SamplerKind kind) { return walks_sigma(kind) && kind != SamplerKind::kEulerAncestral; }

SamplerKind sampler_named(const std::string& name) {
  if (name == "ddim" || name == "DDIMScheduler") return SamplerKind::kDdim;
  if (name == "ddpm" || name == "DDPMScheduler") return SamplerKind::kDdpm;
  if (name == "euler" || name == "EulerDiscreteScheduler") return SamplerKind::kEuler;
  if (name == "euler_a" || name == "EulerAncestralDiscreteScheduler") return SamplerKind::kEulerAncestral;
  if (name == "heun" || name == "HeunDiscreteScheduler") return SamplerKind::kHeun;
  if (name == "dpm++2m" || name == "DPMSolverMultistepScheduler") return SamplerKind::kDpmSolverPlusPlus2M;
  if (name == "unipc" || name == "UniPCMultistepScheduler") return SamplerKind::kUniPc;
  fail("sampler \"" + name + "\" is not one of ddim (DDIMScheduler), ddpm (DDPMScheduler), euler (EulerDiscreteScheduler), "
       "euler_a (EulerAncestralDiscreteScheduler), heun (HeunDiscreteScheduler), dpm++2m (DPMSolverMultistepScheduler), "
       "unipc (UniPCMultistepScheduler)");
}

}  // namespace kuafu::sd
