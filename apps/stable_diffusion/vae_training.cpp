#include "apps/stable_diffusion/vae_training.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <sstream>

#include "apps/stable_diffusion/pipeline.h"
#include "apps/stable_diffusion/unet_folder.h"
#include "apps/stable_diffusion/vae_folder.h"
#include "core/train/hf_interop.h"
#include "core/train/model_app.h"
#include "core/train/parallelize.h"
#include "core/util/error.h"
#include "core/util/seed_mix.h"

namespace kuafu::sd {

namespace {

constexpr int64_t kVaeDraws = 11;

// [rows, C, h, w] posterior draws of rows first_row.. of step `step`.
torch::Tensor posterior_draws(uint64_t seed, int64_t step, int64_t first_row, int64_t rows, const std::vector<int64_t>& shape) {
  std::vector<torch::Tensor> draws;
  for (int64_t r = 0; r < rows; ++r) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed, step, first_row + r, kVaeDraws));
    draws.push_back(torch::randn(shape, generator, torch::TensorOptions().dtype(torch::kFloat32)));
  }
  return torch::stack(draws);
}

}  // namespace

VaeTask::VaeTask(AutoencoderKL vae, SdSettings settings, int64_t image_size, std::unique_ptr<io::ImageDataset> train,
                 std::unique_ptr<io::ImageDataset> val, const torch::Device& device)
    : vae_(std::move(vae)), settings_(std::move(settings)), train_(std::move(train)), val_(std::move(val)),
      order_(train_->size(), settings_.train.batch_size, settings_.train.seed), device_(device) {
  const int64_t factor = vae_->config.scale_factor();
  latent_shape_ = {vae_->config.latent_channels, image_size / factor, image_size / factor};
}

std::vector<train::RunModel> VaeTask::models() {
  train::RunModel vae;
  vae.name = "vae";
  vae.module = vae_.get();
  vae.deferred = weights_;
  return {vae};
}

std::map<std::string, torch::Tensor> VaeTask::losses(int64_t step, int64_t first_row, int64_t rows) {
  const std::vector<size_t> items = order_.rows(step, first_row, rows);
  const torch::Tensor images =
      io::batch_replacing_unreadable(*train_, items, true, mix_seed(settings_.train.seed, step, 0, kVaeDraws)).pixels;
  const torch::Dtype dtype = vae_->quant_conv->weight.scalar_type();
  const VaeLosses l = vae_row_losses(vae_, images.to(device_, dtype),
                                     posterior_draws(settings_.train.seed, step, first_row, rows, latent_shape_).to(device_));
  return {{"vae", (l.reconstruction + settings_.vae.kl_weight * l.kl).mean()}};
}

train::LossSum VaeTask::evaluate(int rank, int ranks) {
  torch::NoGradGuard no_grad;
  const auto [begin, end] = evaluation_share(val_->size(), settings_.train.eval_rows, rank, ranks);
  train::LossSum sums;
  for_each_chunk(begin, end, settings_.train.micro_batch_size, [&](const std::vector<size_t>& items) {
    const torch::Tensor images =
        io::batch_replacing_unreadable(*val_, items, false, 0).pixels.to(device_, vae_->quant_conv->weight.scalar_type());
    sums.loss_sum += vae_row_losses(vae_, images, {}).reconstruction.sum().item<double>();
    sums.count += static_cast<double>(items.size());
  });
  return sums;
}

std::vector<train::EvalMetric> VaeTask::eval_metrics(const train::LossSum& sums) const {
  return {{"val_psnr", "PSNR (dB)", psnr_of(sums.loss_sum / std::max(1.0, sums.count)), false}};
}

double latent_scaling_factor(AutoencoderKL& vae, io::ImageDataset& set, int64_t images, int64_t batch, uint64_t seed) {
  torch::NoGradGuard no_grad;
  const int64_t n = std::min(images, set.size());
  KUAFU_CHECK(n > 0, "no images to measure the VAE's latents on");
  double sum = 0, sum_squares = 0, count = 0;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed, -1, 0, kVaeDraws));
  for_each_chunk(0, n, batch, [&](const std::vector<size_t>& items) {
    const auto posterior = vae->encode(set.batch(items, false, 0).pixels);
    const torch::Tensor noise = torch::randn(posterior.mean.sizes(), generator, torch::TensorOptions().dtype(torch::kFloat32));
    const torch::Tensor z = posterior.sample(noise).to(torch::kFloat64);
    sum += z.sum().item<double>();
    sum_squares += z.square().sum().item<double>();
    count += static_cast<double>(z.numel());
  });
  const double mean = sum / count, variance = sum_squares / count - mean * mean;
  KUAFU_CHECK(variance > 0, "the VAE's latents do not vary; cannot scale them");
  return 1.0 / std::sqrt(variance);
}

namespace {

class VaeApp : public train::ModelApp<AutoencoderKL> {
 public:
  explicit VaeApp(const config::Config& config) : ModelApp(config), settings_(read_sd_settings(config)) {
    const std::filesystem::path root = settings_.pipeline;
    vae_config_ = read_vae_config(io::read_hf_config((root / "vae").string()), (root / "vae" / "config.json").string());
    image_size_ = read_unet_config(io::read_hf_config((root / "unet").string()), (root / "unet" / "config.json").string()).sample_size *
                  vae_config_.scale_factor();
  }

  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override {
    train::require_data_parallel(config_, runtime, options, "kuafu-sd (VAE)");
    // The VAE trains in float32, or is left described for its sharded strategy to fill from the folder
    // (training only: an evaluation runs it whole).
    auto [vae, deferred] = train::build(recipe(), config_, {runtime ? train::Purpose::train : train::Purpose::evaluate, options});
    auto task = std::make_unique<VaeTask>(vae, settings_, image_size_,
                                          open_captioned_images(config_, true, vae_config_.in_channels, image_size_),
                                          open_captioned_images(config_, false, vae_config_.in_channels, image_size_), options.device);
    task->defer_weights(std::move(deferred));
    return task;
  }

  std::string describe(train::RunTask& task) override {
    std::ostringstream line;
    line << "Stable Diffusion VAE (from " << settings_.pipeline << "): widths";
    for (const int64_t w : vae_config_.block_out_channels) line << ' ' << w;
    line << ", " << model_size().parameters / 1e6 << "M parameters, " << image_size_ << " px images to " << vae_config_.latent_channels
         << " latent channels; KL weight " << settings_.vae.kl_weight << "; " << task.steps_per_epoch() << " steps per epoch";
    return line.str();
  }

  std::string model_part() const override { return config_.get_float("optim.ema_decay") > 0 ? "vae.ema" : "vae"; }

  // The pipeline folder with the trained VAE, its scaling factor measured on the training images.
  nlohmann::json export_model(const std::string& out, io::HfWriteOptions options, const config::ParsedCommand&) override {
    auto images = open_captioned_images(config_, true, vae_config_.in_channels, image_size_);
    model()->eval();
    model()->config.scaling_factor = latent_scaling_factor(model(), *images, settings_.vae.scale_images,
                                                        std::max<int64_t>(1, settings_.train.micro_batch_size), settings_.train.seed);
    write_pipeline(settings_.pipeline, out, {{"vae", [&](const std::string& dir) { save_vae(model(), dir, options); }}});
    return {{"vae", model_part()}, {"scaling_factor", model()->config.scaling_factor}, {"pipeline", settings_.pipeline}};
  }

  nlohmann::json benchmark(const train::Runtime&, train::BenchmarkMemory&) override {
    fail("kuafu-sd benchmark times the UNet's training; set model.train = \"unet\" in " + config_.path());
  }

 private:
  // Every weight comes from the pipeline's vae/ folder, read as its draws; the run trains it.
  train::ModelRecipe<AutoencoderKL> recipe() const override {
    train::ModelRecipe<AutoencoderKL> recipe = vae_folder_recipe(vae_folder(), "vae", /*trained=*/true);
    recipe.size_keys = {"model.pipeline"};
    return recipe;
  }
  std::string vae_folder() const { return (std::filesystem::path(settings_.pipeline) / "vae").string(); }

  SdSettings settings_;
  VaeConfig vae_config_;
  int64_t image_size_ = 0;
};

}  // namespace

std::unique_ptr<train::App> make_vae_app(const config::Config& config) { return std::make_unique<VaeApp>(config); }

}  // namespace kuafu::sd
