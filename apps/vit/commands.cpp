#include "apps/vit/commands.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <random>

#include "apps/vit/hugging_face.h"
#include "core/config/cli.h"
#include "core/dist/collectives.h"
#include "core/memory/memory_meter.h"
#include "core/optim/mixed_precision.h"
#include "core/optim/optim_config.h"
#include "core/train/app.h"
#include "core/train/benchmark.h"
#include "core/train/hf_interop.h"
#include "core/train/model_memory.h"
#include "core/util/device.h"
#include "core/util/logging.h"

namespace kuafu::vit {
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kModelSizeKeys = {"model.num_hidden_layers", "model.hidden_size",
                                                 "model.intermediate_size"};

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

ImageTask::ImageTask(ViTForImageClassification model, const train::ParallelOptions& options,
                     std::unique_ptr<io::ImageDataset> train, std::unique_ptr<io::ImageDataset> val, const config::Config& config,
                     const train::TrainSettings& settings)
    : ModelTask(std::make_unique<train::ParallelModel>(*model, options), settings.micro_batch_size, model->tp.batch_blocks()),
      model_(std::move(model)),
      train_(std::move(train)),
      val_(std::move(val)),
      global_batch_(settings.batch_size),
      seed_(settings.seed),
      label_smoothing_(config.get_float("augment.label_smoothing")),
      mixup_alpha_(config.get_float("augment.mixup")) {
  if (steps_per_epoch() < 1) {
    config.fail_at("train.batch_size", "(" + std::to_string(global_batch_) + ") is larger than the training set (" +
                                           std::to_string(train_->size()) + " images)");
  }
}

std::vector<size_t> ImageTask::training_items(int64_t step, int64_t first_row, int64_t rows) {
  const int64_t epoch = step / steps_per_epoch();
  if (epoch != epoch_) {
    order_.resize(static_cast<size_t>(train_->size()));
    std::iota(order_.begin(), order_.end(), size_t{0});
    std::mt19937_64 rng(seed_ * 7919ull + static_cast<uint64_t>(epoch));
    std::shuffle(order_.begin(), order_.end(), rng);
    epoch_ = epoch;
  }
  const int64_t first = (step % steps_per_epoch()) * global_batch_ + first_row;
  return {order_.begin() + first, order_.begin() + first + rows};
}

train::Batch ImageTask::train_batch(int64_t step, int64_t first_row, int64_t rows) {
  const std::vector<size_t> items = training_items(step, first_row, rows);
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

namespace {

std::unique_ptr<ImageTask> build_image_task(const config::Config& config, const parallel::TensorParallel& tp,
                                            const train::Runtime* runtime) {
  const ViTConfig model = model_config(config);
  auto train = open_dataset(config, model, /*train=*/true, tp.device);
  auto val = open_dataset(config, model, /*train=*/false, tp.device);
  train::check_row_blocks(config, tp, {"train.micro_batch_size"});
  const train::TrainSettings settings = train::read_train_settings(config);
  torch::manual_seed(settings.seed);
  ViTForImageClassification vit(model, tp);
  if (const std::string folder = train::init_from(config); !folder.empty()) {
    load_hf_weights(vit, io::read_hf_folder(folder), config.get_bool("model.new_classifier"));
    log::infof("initial weights from ", folder, config.get_bool("model.new_classifier") ? " (a new classifier)" : "");
  }
  train::ParallelOptions options;
  auto task = [&] { return std::make_unique<ImageTask>(vit, options, std::move(train), std::move(val), config, settings); };
  if (!runtime) return task();
  // "time" partitions time a micro-batch of blank images.
  const int64_t micro_batch = settings.micro_batch_size;
  const torch::Tensor pixels = torch::zeros({micro_batch, model.num_channels, model.image_size, model.image_size},
                                            torch::TensorOptions().device(tp.device));  // no random draws
  const torch::Tensor targets = smoothed_targets(torch::zeros({micro_batch}, torch::TensorOptions(torch::kInt64).device(tp.device)),
                                                 model.num_labels, 0.0);
  options = train::parallel_options(*vit, config, *runtime, {pixels, targets});
  return task();
}

}  // namespace

std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const parallel::TensorParallel& tp) {
  return build_image_task(config, tp, nullptr);
}

std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const train::Runtime& runtime) {
  return build_image_task(config, runtime.tensor, &runtime);
}

void prepare_command(const config::Config& config) {
  // Nothing to convert: every format is read as it is. Opening both sets checks them (files, shapes,
  // labels, channels) and the summary shows what training will see.
  const ViTConfig model = model_config(config);
  nlohmann::json summary = {{"format", config.get_string("data.format")}};
  for (bool train : {true, false}) {
    auto set = open_dataset(config, model, train);
    summary[train ? "train_images" : "val_images"] = set->size();
    if (train) summary["classes"] = set->class_names();
  }
  summary["steps_per_epoch"] = summary["train_images"].get<int64_t>() / train::read_train_settings(config).batch_size;
  std::cout << summary.dump() << std::endl;
}

train::TrainSummary train_command(const config::Config& config) {
  train::Runtime runtime = train::start_runtime(config);
  train::check_model_fits(config, runtime, static_cast<double>(model_config(config).parameter_count()), kModelSizeKeys);
  std::unique_ptr<ImageTask> task = make_image_task(config, runtime);
  if (runtime.is_main()) {
    const ViTConfig& m = task->vit()->config;
    log::infof("ViT: ", m.num_hidden_layers, " layers, ", m.num_attention_heads, " heads, H = ", m.hidden_size,
               ", patch ", m.patch_size, " of ", m.image_size, " px, ", static_cast<double>(m.parameter_count()) / 1e6,
               "M parameters; ", task->steps_per_epoch(), " steps per epoch; ", runtime.world->size(), " rank(s) x ",
               runtime.threads, " thread(s)");
  }
  train::Trainer trainer(config, runtime, *task);
  return trainer.run();
}

void eval_command(const config::Config& config, const std::string& checkpoint) {
  train::Runtime runtime = train::start_runtime(config);
  // The whole model on this rank's device (checkpoints hold whole tensors), each rank a share of the images.
  std::unique_ptr<ImageTask> task = make_image_task(config, parallel::TensorParallel::serial_on(runtime.device));
  const std::string folder = train::checkpoint_to_read(train::read_train_settings(config).out_dir, checkpoint);
  train::CheckpointStore::load_model(folder, task->model());
  torch::NoGradGuard no_grad;
  task->model().eval();
  // Per class: images, top-1 hits, top-5 hits; summed over the data ranks' shares.
  const int64_t classes = task->vit()->config.num_labels, n = task->val_set().size();
  const auto& data = *runtime.mesh->group("data");
  torch::Tensor counts = torch::zeros({3, classes}, torch::TensorOptions(torch::kFloat64).device(data.device()));
  task->for_each_eval_batch(n * data.rank() / data.size(), n * (data.rank() + 1) / data.size(),
                            [&](const torch::Tensor& logits, const torch::Tensor& labels) {
                              const torch::Tensor top = std::get<1>(logits.topk(std::min<int64_t>(5, classes), 1));
                              const torch::Tensor hit1 = top.select(1, 0).eq(labels).to(torch::kFloat64);
                              const torch::Tensor hit5 = top.eq(labels.unsqueeze(1)).any(1).to(torch::kFloat64);
                              counts[0].index_add_(0, labels, torch::ones_like(hit1));
                              counts[1].index_add_(0, labels, hit1);
                              counts[2].index_add_(0, labels, hit5);
                            });
  dist::all_reduce(counts, data);
  const double images = counts[0].sum().item<double>();
  nlohmann::json per_class = nlohmann::json::object();
  const auto names = task->val_set().class_names();
  for (int64_t c = 0; c < classes; ++c) {
    const double seen = counts[0][c].item<double>();
    per_class[names[static_cast<size_t>(c)]] = seen > 0 ? counts[1][c].item<double>() / seen : 0.0;
  }
  if (runtime.is_main()) {
    std::cout << nlohmann::json{{"checkpoint", folder},
                                {"images", images},
                                {"top1", counts[1].sum().item<double>() / images},
                                {"top5", counts[2].sum().item<double>() / images},
                                {"per_class_top1", per_class}}
                     .dump()
              << std::endl;
  }
}

void benchmark_command(const config::Config& config) {
  train::Runtime runtime = train::start_runtime(config);
  train::check_model_fits(config, runtime, static_cast<double>(model_config(config).parameter_count()), kModelSizeKeys);
  const ViTConfig m = model_config(config);
  train::BenchmarkMemory memory(runtime.device);  // before any model state
  const train::TrainSettings settings = train::read_train_settings(config);
  torch::manual_seed(settings.seed);
  ViTForImageClassification model(m, parallel::TensorParallel::serial_on(runtime.device));
  const int64_t batch = settings.micro_batch_size;
  const auto on_device = torch::TensorOptions().device(runtime.device);
  const torch::Tensor pixels =
      torch::randn({batch, m.num_channels, m.image_size, m.image_size}, on_device.dtype(optim::compute_dtype(config, runtime.device)));
  const torch::Tensor targets =
      smoothed_targets(torch::randint(m.num_labels, {batch}, on_device.dtype(torch::kInt64)), m.num_labels, 0.1);
  train::BenchmarkSpec spec;
  spec.app = "vit";
  spec.item_name = "images";
  spec.flops_per_item = m.flops_per_image();
  spec.parameters = m.parameter_count();
  spec.fields = {{"image_size", m.image_size}};
  const nlohmann::json line = train::benchmark_training(config, runtime, *model, {pixels, targets}, spec, memory);
  if (runtime.is_main()) std::cout << line.dump() << std::endl;
}

void export_command(const config::Config& config, const std::string& checkpoint, const std::string& out) {
  KUAFU_CHECK(!out.empty(), "export needs --out DIR (a new folder)");
  ViTForImageClassification model(model_config(config));
  const std::string folder = train::checkpoint_to_read(train::read_train_settings(config).out_dir, checkpoint);
  train::CheckpointStore::load_model(folder, *model);
  // The class names as the evaluation set has them become the folder's id2label.
  const std::vector<std::string> names = open_dataset(config, model->config, /*train=*/false)->class_names();
  export_hf_vit(model, out, names, train::export_options(config));
  std::cout << nlohmann::json{{"checkpoint", folder}, {"exported", out}, {"classes", names}}.dump() << std::endl;
}

int run_vit_app(int argc, const char* const argv[]) {
  config::CommandLine cli("kuafu-vit", "Vision Transformer training (large-batch LAMB/LARS), evaluation, benchmark");
  cli.subcommand("prepare", "check the training and evaluation sets and print a summary")
      .subcommand("train", "train (resumes from the latest checkpoint in train.out_dir)")
      .subcommand("eval", "top-1, top-5 and per-class accuracy of a checkpoint")
      .subcommand("export", "a checkpoint as a Hugging Face folder (ViTForImageClassification.from_pretrained loads it)")
      .subcommand("benchmark", "time training steps on random images; prints one JSON line");
  for (const char* sub : {"eval", "export"}) {
    cli.option(sub, "checkpoint", "DIR", "", "checkpoint folder (default: the latest in train.out_dir)");
  }
  cli.option("export", "out", "DIR", "", "the new folder to write");
  using Command = config::ParsedCommand;
  return train::run_app("kuafu-vit", cli, vit_schema(),
                        {{"prepare", [](const config::Config& c, const Command&) { prepare_command(c); }},
                         {"train", [](const config::Config& c, const Command&) { train_command(c); }},
                         {"eval", [](const config::Config& c, const Command& cmd) { eval_command(c, cmd.option("checkpoint")); }},
                         {"export",
                          [](const config::Config& c, const Command& cmd) {
                            export_command(c, cmd.option("checkpoint"), cmd.option("out"));
                          }},
                         {"benchmark", [](const config::Config& c, const Command&) { benchmark_command(c); }}},
                        argc, argv);
}

}  // namespace kuafu::vit
