#include "apps/vit/commands.h"

#include <iostream>
#include <optional>
#include <sstream>

#include "apps/vit/hugging_face.h"
#include "core/dist/collectives.h"
#include "core/optim/mixed_precision.h"
#include "core/train/held_model.h"
#include "core/train/model_app.h"

namespace kuafu::vit {

namespace {

class VitApp : public train::ModelApp<ViTForImageClassification> {
 public:
  explicit VitApp(const config::Config& config) : ModelApp(config), settings_(read_settings(config)) {}

  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override {
    return make_image_task(config_, settings_, options, runtime);
  }
  std::string describe(train::RunTask& task) override {
    const ViTConfig& m = settings_.model;
    std::ostringstream line;
    line << "ViT: " << m.num_hidden_layers << " layers, " << m.num_attention_heads << " heads, H = " << m.hidden_size
         << ", patch " << m.patch_size << " of " << m.image_size << " px, "
         << static_cast<double>(m.parameter_count()) / 1e6 << "M parameters; " << task.steps_per_epoch()
         << " steps per epoch";
    return line.str();
  }
  // Top-1, top-5 and per-class accuracy.
  nlohmann::json evaluate(train::RunTask& task, const train::Runtime& runtime) override;
  // The class names as the evaluation set has them become the folder's id2label.
  nlohmann::json export_model(const std::string& out, io::HfWriteOptions options, const config::ParsedCommand&) override {
    const std::vector<std::string> names = open_dataset(config_, settings_.model, /*train=*/false)->class_names();
    export_hf_vit(model(), out, names, options);
    return {{"classes", names}};
  }
  nlohmann::json benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) override;

 private:
  train::ModelRecipe<ViTForImageClassification> recipe() const override { return vit_recipe(config_, settings_); }

  VitSettings settings_;
};

nlohmann::json VitApp::evaluate(train::RunTask& model_task, const train::Runtime& runtime) {
  auto& task = dynamic_cast<ImageTask&>(model_task);
  torch::NoGradGuard no_grad;
  task.model().eval();
  // Per class: images, top-1 hits, top-5 hits; summed over the data ranks' shares.
  const int64_t classes = settings_.model.num_labels, n = task.val_set().size();
  const auto& data = *runtime.mesh->group("data");
  torch::Tensor counts = torch::zeros({3, classes}, torch::TensorOptions(torch::kFloat64).device(data.device()));
  task.for_each_eval_batch(n * data.rank() / data.size(), n * (data.rank() + 1) / data.size(),
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
  const auto names = task.val_set().class_names();
  for (int64_t c = 0; c < classes; ++c) {
    const double seen = counts[0][c].item<double>();
    per_class[names[static_cast<size_t>(c)]] = seen > 0 ? counts[1][c].item<double>() / seen : 0.0;
  }
  return {{"images", images},
          {"top1", counts[1].sum().item<double>() / images},
          {"top5", counts[2].sum().item<double>() / images},
          {"per_class_top1", per_class}};
}

nlohmann::json VitApp::benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) {
  const ViTConfig& m = settings_.model;
  const int64_t batch = settings_.train.micro_batch_size;
  const auto on_device = torch::TensorOptions().device(runtime.device);
  const torch::Tensor pixels = torch::randn({batch, m.num_channels, m.image_size, m.image_size},
                                            on_device.dtype(train::compute_dtype(config_, runtime.device)));
  const torch::Tensor targets =
      smoothed_targets(torch::randint(m.num_labels, {batch}, on_device.dtype(torch::kInt64)), m.num_labels, 0.1);
  train::BenchmarkSpec spec;
  spec.app = "vit";
  spec.deferred = deferred();
  spec.item_name = "images";
  spec.flops_per_item = m.flops_per_image();
  spec.parameters = m.parameter_count();
  spec.fields = {{"image_size", m.image_size}};
  return train::benchmark_training(config_, runtime, *model(), {pixels, targets}, spec, memory);
}

}  // namespace

std::unique_ptr<train::App> make_vit_app(const config::Config& config) { return std::make_unique<VitApp>(config); }

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
  return train::train_app(*make_vit_app(config), config);
}

int run_vit_app(int argc, const char* const argv[]) {
  train::AppDefinition app;
  app.program = "kuafu-vit";
  app.description = "Vision Transformer training (large-batch LAMB/LARS), evaluation, benchmark";
  app.schema = vit_schema();
  app.make_app = make_vit_app;
  app.before = {{"prepare", "check the training and evaluation sets and print a summary",
                 [](const config::Config& config, const config::ParsedCommand&) { prepare_command(config); }}};
  app.item_help = "random images";
  app.export_help = "ViTForImageClassification.from_pretrained loads it";
  app.eval_help = "top-1, top-5 and per-class accuracy of a checkpoint";
  return train::run_app(app, argc, argv);
}

}  // namespace kuafu::vit
