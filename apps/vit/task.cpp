#include "apps/vit/task.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "apps/vit/hugging_face.h"
#include "core/train/hf_interop.h"
#include "core/train/lazy_model.h"
#include "core/util/device.h"
#include "core/util/logging.h"

namespace kuafu::vit {
namespace {

// A host batch on the model's device (asynchronously through page-locked memory on a GPU), pixels in
// the model's dtype.
io::ImageTensors on_model_device(io::ImageTensors batch, torch::nn::Module& model) {
  const torch::Tensor weight = model.parameters().front();
  batch.pixels = to_device(batch.pixels, weight.device()).to(weight.scalar_type());
  batch.labels = to_device(batch.labels, weight.device());
  return batch;
}

// λ ~ Beta(α, α) as G1 / (G1 + G2) with G ~ Gamma(α, 1), from the step's own stream.
double mixup_weight(double alpha, uint64_t seed, int64_t step) {
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(step));
  std::gamma_distribution<double> gamma(alpha, 1.0);
  const double a = gamma(rng), b = gamma(rng);
  return a / (a + b);
}

}  // namespace

VitSettings read_settings(const config::Config& config) {
  return {model_config(config), train::read_train_settings(config), config.get_float("augment.label_smoothing"),
          config.get_float("augment.mixup")};
}

train::ModelRecipe<ViTForImageClassification> vit_recipe(const config::Config& config, const VitSettings& settings) {
  using Vit = ViTForImageClassification;
  train::ModelRecipe<Vit> recipe;
  recipe.describe = train::described<Vit>(settings.model);
  recipe.draw = train::seeded_initialization<Vit>(settings.train.seed);
  recipe.load = train::init_from_load<Vit>(config, [new_classifier = config.get_bool("model.new_classifier")](Vit& vit, const std::string& folder) {
    load_hf_weights(vit, io::read_hf_folder(folder), new_classifier);
  });
  recipe.parameters = static_cast<double>(settings.model.parameter_count());
  recipe.size_keys = {"model.num_hidden_layers", "model.hidden_size", "model.intermediate_size"};
  return recipe;
}

namespace {

io::EpochOrder epoch_order(const config::Config& config, const io::ImageDataset& train, const VitSettings& settings) {
  if (train.size() < settings.train.batch_size) {
    config.fail_at("train.batch_size", "(" + std::to_string(settings.train.batch_size) + ") is larger than the training set (" +
                                           std::to_string(train.size()) + " images)");
  }
  return io::EpochOrder(train.size(), settings.train.batch_size, settings.train.seed);
}

}  // namespace

ImageTask::ImageTask(ViTForImageClassification model, const train::ParallelOptions& options,
                     std::unique_ptr<io::ImageDataset> train, std::unique_ptr<io::ImageDataset> val, const config::Config& config,
                     const VitSettings& settings)
    : ModelTask(std::make_unique<train::ParallelModel>(*model, options), settings.train.micro_batch_size,
                model->tp.batch_blocks()),
      model_(std::move(model)),
      train_(std::move(train)),
      val_(std::move(val)),
      order_(epoch_order(config, *train_, settings)),
      seed_(settings.train.seed),
      label_smoothing_(settings.label_smoothing),
      mixup_alpha_(settings.mixup_alpha) {}

train::Batch ImageTask::train_batch(int64_t step, int64_t first_row, int64_t rows) {
  const std::vector<size_t> items = order_.rows(step, first_row, rows);
  const io::ImageTensors batch =
      on_model_device(train_->batch(items, /*train=*/true, seed_ * 1000003ull + static_cast<uint64_t>(step)), *model_);
  torch::Tensor pixels = batch.pixels;
  torch::Tensor targets = smoothed_targets(batch.labels, model_->config.num_labels, label_smoothing_);
  if (mixup_alpha_ > 0) {
    // Mixup pairs each image with the batch's reversed order (rows and weight alike on every rank).
    const double lambda = mixup_weight(mixup_alpha_, seed_, step);
    pixels = lambda * pixels + (1 - lambda) * pixels.flip(0);
    targets = lambda * targets + (1 - lambda) * targets.flip(0);
  }
  return {pixels, targets};
}

train::Batch ImageTask::eval_batch(int64_t first_row, int64_t rows) {
  std::vector<size_t> items(static_cast<size_t>(rows));
  std::iota(items.begin(), items.end(), static_cast<size_t>(first_row));
  const io::ImageTensors batch = on_model_device(val_->batch(items, /*train=*/false, 0), *model_);
  return {batch.pixels, batch.labels};
}

void ImageTask::for_each_eval_batch(
    int64_t begin, int64_t end, const std::function<void(const torch::Tensor&, const torch::Tensor&)>& use) {
  for (int64_t first = begin; first < end; first += micro_batch()) {
    const train::Batch batch = eval_batch(first, std::min(micro_batch(), end - first));
    use(model_->forward(batch.inputs), batch.targets);
  }
}

std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const VitSettings& settings,
                                           const parallel::ModelOptions& options, const train::Runtime* runtime) {
  const ViTConfig& model = settings.model;
  auto train = open_dataset(config, model, /*train=*/true, options.device);
  auto val = open_dataset(config, model, /*train=*/false, options.device);
  train::check_row_blocks(config, options.tp, {"train.micro_batch_size"});
  const train::ModelRecipe<ViTForImageClassification> recipe = vit_recipe(config, settings);
  ViTForImageClassification vit = recipe.describe(options);
  // "time" partitions time a micro-batch of blank images (no random draws).
  const auto blank_micro_batch = [&]() -> train::Batch {
    const int64_t micro_batch = settings.train.micro_batch_size;
    const auto on_device = torch::TensorOptions().device(options.device);
    const torch::Tensor labels = torch::zeros({micro_batch}, on_device.dtype(torch::kInt64));
    return {torch::zeros({micro_batch, model.num_channels, model.image_size, model.image_size}, on_device),
            smoothed_targets(labels, model.num_labels, 0.0)};
  };
  train::LaidOut laid = train::lay_out(recipe, vit, config, options, runtime, blank_micro_batch);
  auto task = std::make_unique<ImageTask>(vit, laid.layout, std::move(train), std::move(val), config, settings);
  task->defer_weights(std::move(laid.deferred));
  return task;
}

std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const parallel::ModelOptions& options) {
  return make_image_task(config, read_settings(config), options, nullptr);
}

std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const train::Runtime& runtime) {
  return make_image_task(config, read_settings(config), runtime.model_options(), &runtime);
}

}  // namespace kuafu::vit
