// The VAE's training objective, as latent diffusion trains its autoencoder less the perceptual and
// adversarial terms: images through the encoder's Gaussian, a sample of it decoded, the reconstruction's
// squared error plus a weight times the KL divergence of the Gaussian from N(0, I).
#pragma once

#include "apps/stable_diffusion/vae.h"

namespace kuafu::sd {

struct VaeLosses {
  torch::Tensor reconstruction;  // [B] float32: the mean over pixels of (x̂ − x)²
  torch::Tensor kl;              // [B] float32: the mean over latent elements of ½(μ² + σ² − 1 − log σ²)
};

// images [B, C, H, W] in [−1, 1]; posterior_noise [B, latent, h, w] (the sample μ + σ·noise is decoded;
// undefined: μ is, as evaluation does).
VaeLosses vae_row_losses(AutoencoderKL& vae, const torch::Tensor& images, const torch::Tensor& posterior_noise);

// PSNR in dB of a mean squared error on images in [−1, 1] (peak-to-peak 2).
double psnr_of(double mean_squared_error);

}  // namespace kuafu::sd
