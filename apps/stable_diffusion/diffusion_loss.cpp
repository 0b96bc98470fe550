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

}  // namespace kuafu::sd
