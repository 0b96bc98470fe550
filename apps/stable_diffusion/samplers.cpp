#include "apps/stable_diffusion/samplers.h"

#include <cmath>

#include "core/util/error.h"

namespace kuafu::sd {

double Sampler::next_alpha_cumprod(size_t i, double last) const {
  KUAFU_CHECK(i < timesteps_.size(), "step ", i, " of a ", timesteps_.size(), "-step schedule");
  return i + 1 < timesteps_.size() ? schedule_.alpha_cumprod(timesteps_[i + 1]) : last;
}

torch::Tensor DdimSampler::step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                                const torch::Tensor& /*noise*/) const {
  const double first = schedule_.config().set_alpha_to_one ? 1.0 : schedule_.alpha_cumprod(0);
  const double previous = next_alpha_cumprod(i, first);
  const Estimates e = schedule_.estimates(model_output, timesteps_[i], sample);
  return std::sqrt(previous) * e.x0 + std::sqrt(1 - previous) * e.epsilon;
}

torch::Tensor DdpmSampler::step(const torch::Tensor& model_output, size_t i, const torch::Tensor& sample,
                                const torch::Tensor& noise) const {
  const int64_t t = timesteps_.at(i);
  const double a = schedule_.alpha_cumprod(t), previous = next_alpha_cumprod(i, 1.0);
  const double beta = 1 - a / previous;  // this step's β (over however many training steps it spans)
  const Estimates e = schedule_.estimates(model_output, t, sample);
  const torch::Tensor mean = (std::sqrt(previous) * beta / (1 - a)) * e.x0 + (std::sqrt(1 - beta) * (1 - previous) / (1 - a)) * sample;
  if (t == 0) return mean;
  KUAFU_CHECK(noise.defined(), "DDPM's step at timestep ", t, " adds noise: give it");
  const double variance = std::max((1 - previous) / (1 - a) * beta, 1e-20);
  return mean + std::sqrt(variance) * noise;
}

}  // namespace kuafu::sd
