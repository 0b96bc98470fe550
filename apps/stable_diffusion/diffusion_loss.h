// The latent diffusion training objective (Rombach et al. 2022, as diffusers' train_text_to_image.py
// computes it): noise clean latents to a timestep, have the UNet predict the schedule's target (ε, v or
// x₀) from the noisy latents and the text, and take the mean squared error, each row optionally
// weighted by Min-SNR-γ. The random draws are the caller's, so a test can give another tool's.
#pragma once

#include "apps/stable_diffusion/noise_schedule.h"
#include "apps/stable_diffusion/unet.h"

namespace kuafu::sd {

// One batch of the objective's inputs: clean latents x₀ [B, C, h, w] (scaled as the UNet sees them),
// the text encodings [B, M, D] (compute dtype), the noise ε [B, C, h, w] (float32; a noise offset
// already added) and each row's timestep t [B] (int64).
struct DiffusionInputs {
  torch::Tensor latents, text, noise, timesteps;
  AddedConditions added;  // SDXL: each row's pooled text and time ids
};

// The mean over rows of each row's mean squared error (float32), times min(SNR, γ)/SNR-style weights
// when min_snr_gamma > 0 (NoiseSchedule::min_snr_weights for the schedule's prediction).
torch::Tensor diffusion_loss(UNet2DCondition& unet, const NoiseSchedule& schedule, const DiffusionInputs& inputs,
                             double min_snr_gamma = 0);

// Per-row squared errors before the mean over rows: [B] float32 (evaluation sums them).
torch::Tensor diffusion_row_losses(UNet2DCondition& unet, const NoiseSchedule& schedule, const DiffusionInputs& inputs,
                                   double min_snr_gamma = 0);

// DreamBooth's objective with prior preservation (train_dreambooth.py): the instance rows and the class rows
// (as many) in one UNet call (two when aspect buckets give them other shapes); the instance rows' mean (Min-SNR-weighted when γ > 0) plus `prior_weight` × the
// class rows' plain mean (the script weights the prior term by nothing else).
torch::Tensor prior_preservation_loss(UNet2DCondition& unet, const NoiseSchedule& schedule, const DiffusionInputs& instance,
                                      const DiffusionInputs& prior, double prior_weight, double min_snr_gamma = 0);

}  // namespace kuafu::sd
