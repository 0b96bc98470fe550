// Training a pipeline folder's VAE (model.train = "vae"), the first stage of a model trained from scratch:
// the reconstruction + KL objective (vae_loss.h) on the captioned image set's pictures at the pipeline's
// resolution, each row's posterior draw from (seed, step, row); evaluation reports the reconstruction's
// PSNR from the posterior mean. Export writes the pipeline folder with the new VAE, its scaling_factor
// set to 1 / the standard deviation of its latents over training images (as Stable Diffusion's 0.18215
// was found), so the UNet trained next sees unit-variance latents.
#pragma once

#include <memory>

#include "apps/stable_diffusion/sd_settings.h"
#include "apps/stable_diffusion/vae_loss.h"
#include "core/config/config.h"
#include "core/io/epoch_order.h"
#include "core/train/app.h"

namespace kuafu::sd {

class VaeTask : public train::RunTask {
 public:
  VaeTask(AutoencoderKL vae, SdSettings settings, int64_t image_size, std::unique_ptr<io::ImageDataset> train,
          std::unique_ptr<io::ImageDataset> val, const torch::Device& device);

  // The VAE left described for its sharded strategy (ZeRO, Gemini) to fill from `weights`.
  void defer_weights(DeferredWeights weights) { weights_ = std::move(weights); }

  std::vector<train::RunModel> models() override;
  std::map<std::string, torch::Tensor> losses(int64_t step, int64_t first_row, int64_t rows) override;
  // Sums of each evaluation image's reconstruction error from the posterior mean.
  train::LossSum evaluate(int rank, int ranks) override;
  std::vector<train::EvalMetric> eval_metrics(const train::LossSum& sums) const override;
  double flops_per_item() const override { return 0; }  // not counted for the VAE
  int64_t items_per_row() const override { return 1; }
  std::string item_name() const override { return "images"; }
  int64_t steps_per_epoch() const override { return order_.steps_per_epoch(); }
  std::vector<std::string> checkpoint_keys() const override { return {"model.", "vae."}; }

 private:
  AutoencoderKL vae_;
  DeferredWeights weights_;  // empty: the VAE is materialised
  SdSettings settings_;
  std::vector<int64_t> latent_shape_;  // [C, h, w]
  std::unique_ptr<io::ImageDataset> train_, val_;
  io::EpochOrder order_;
  torch::Device device_;
};

// 1 / the standard deviation of `vae`'s latents (posterior samples, seeded by `seed`) over the first
// `images` images of `set`, in batches of `batch`.
double latent_scaling_factor(AutoencoderKL& vae, io::ImageDataset& set, int64_t images, int64_t batch, uint64_t seed);

// The App of the shared commands for model.train = "vae".
std::unique_ptr<train::App> make_vae_app(const config::Config& config);

}  // namespace kuafu::sd
