#include "apps/stable_diffusion/diffusion_loss.h"

namespace kuafu::sd {

torch::Tensor diffusion_row_losses(UNet2DCondition& unet, const NoiseSchedule& schedule, const DiffusionInputs& in,
                                   double min_snr_gamma) {
  const torch::Tensor x0 = in.latents.to(torch::kFloat32);
  const torch::Tensor noisy = schedule.add_noise(x0, in.noise, in.timesteps);                // [B, C, h, w] float32
  const torch::Tensor target = schedule.training_target(x0, in.noise, in.timesteps);        // [B, C, h, w]
  const torch::Tensor prediction = unet->forward(noisy.to(in.text.scalar_type()), in.timesteps, in.text, in.added).to(torch::kFloat32);
  torch::Tensor rows = (prediction - target).square().flatten(1).mean(1);                   // [B]
  if (min_snr_gamma > 0) rows = rows * schedule.min_snr_weights(in.timesteps, min_snr_gamma).to(rows.options());
  return rows;
}

torch::Tensor diffusion_loss(UNet2DCondition& unet, const NoiseSchedule& schedule, const DiffusionInputs& inputs,
                             double min_snr_gamma) {
  return diffusion_row_losses(unet, schedule, inputs, min_snr_gamma).mean();
}

torch::Tensor prior_preservation_loss(UNet2DCondition& unet, const NoiseSchedule& schedule, const DiffusionInputs& instance,
                                      const DiffusionInputs& prior, double prior_weight, double min_snr_gamma) {
  torch::Tensor own, others;  // [B] and [B'] plain squared errors
  if (instance.latents.sizes() == prior.latents.sizes()) {  // one UNet call for both
    const auto both = [](const torch::Tensor& a, const torch::Tensor& b) { return a.defined() ? torch::cat({a, b}) : a; };
    const DiffusionInputs joined{both(instance.latents, prior.latents), both(instance.text, prior.text), both(instance.noise, prior.noise),
                                 both(instance.timesteps, prior.timesteps),
                                 {both(instance.added.text_embeds, prior.added.text_embeds), both(instance.added.time_ids, prior.added.time_ids)}};
    const torch::Tensor rows = diffusion_row_losses(unet, schedule, joined);  // [2B]
    const int64_t b = instance.latents.size(0);
    own = rows.narrow(0, 0, b);
    others = rows.narrow(0, b, rows.size(0) - b);
  } else {  // an aspect bucket other than the class images'
    own = diffusion_row_losses(unet, schedule, instance);
    others = diffusion_row_losses(unet, schedule, prior);
  }
  if (min_snr_gamma > 0) own = own * schedule.min_snr_weights(instance.timesteps, min_snr_gamma).to(own.options());
  return own.mean() + prior_weight * others.mean();
}

}  // namespace kuafu::sd
