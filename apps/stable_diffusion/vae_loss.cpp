#include "apps/stable_diffusion/vae_loss.h"

#include <cmath>

namespace kuafu::sd {

VaeLosses vae_row_losses(AutoencoderKL& vae, const torch::Tensor& images, const torch::Tensor& posterior_noise) {
  const auto posterior = vae->encode(images);
  const torch::Tensor mean = posterior.mean.to(torch::kFloat32), logvar = posterior.logvar.to(torch::kFloat32);
  const torch::Tensor latents = posterior_noise.defined() ? AutoencoderKLImpl::Posterior{mean, logvar}.sample(posterior_noise) : mean;
  const torch::Tensor decoded = vae->decode(latents.to(images.scalar_type())).to(torch::kFloat32);  // [B, C, H, W]
  VaeLosses out;
  out.reconstruction = (decoded - images.to(torch::kFloat32)).square().flatten(1).mean(1);
  out.kl = 0.5 * (mean.square() + logvar.exp() - 1 - logvar).flatten(1).mean(1);
  return out;
}

double psnr_of(double mean_squared_error) { return 10 * std::log10(4.0 / std::max(mean_squared_error, 1e-20)); }

}  // namespace kuafu::sd
