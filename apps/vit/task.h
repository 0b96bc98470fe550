// Image classification as the trainer sees it: a ViT and its data, built from the config's settings
// (read once). Each step's global batch is the next slice of a per-epoch shuffle of the training set
// (io::EpochOrder), so a run resumes exactly.
#pragma once

#include <functional>
#include <memory>

#include "apps/vit/app_config.h"
#include "apps/vit/dataset.h"
#include "core/io/epoch_order.h"
#include "core/train/model_recipe.h"
#include "core/train/model_task.h"
#include "core/train/train_settings.h"

namespace kuafu::vit {

// What a command reads of the config, read once and handed on.
struct VitSettings {
  ViTConfig model;
  train::TrainSettings train;
  double label_smoothing = 0, mixup_alpha = 0;  // augment.*
};
VitSettings read_settings(const config::Config& config);

// The configured ViT: described with the run's layout, drawn from train.seed, then model.init_from's
// weights when it names a folder (a new classifier under model.new_classifier).
train::ModelRecipe<ViTForImageClassification> vit_recipe(const config::Config& config, const VitSettings& settings);

class ImageTask : public train::ModelTask {
 public:
  ImageTask(ViTForImageClassification model, const train::ParallelOptions& options,
            std::unique_ptr<io::ImageDataset> train, std::unique_ptr<io::ImageDataset> val, const config::Config& config,
            const VitSettings& settings);
  // Soft targets [B, classes] (label smoothing and mixup applied) for training, labels [B] for evaluation.
  train::Batch train_batch(int64_t step, int64_t first_row, int64_t rows) override;
  int64_t eval_rows() const override { return val_->size(); }
  train::Batch eval_batch(int64_t first_row, int64_t rows) override;
  double flops_per_item() const override { return model_->config.flops_per_image(); }
  int64_t items_per_row() const override { return 1; }
  std::string item_name() const override { return "images"; }
  std::vector<std::string> checkpoint_keys() const override { return {"model."}; }
  std::vector<train::EvalMetric> eval_metrics(const train::LossSum& sums) const override {
    return {{"val_accuracy", "accuracy", sums.correct / std::max(1.0, sums.count), /*percent=*/true}};
  }

  ViTForImageClassification& vit() { return model_; }
  io::ImageDataset& val_set() { return *val_; }
  int64_t steps_per_epoch() const override { return order_.steps_per_epoch(); }
  // The logits of evaluation items [begin, end) in batches of the micro-batch size.
  void for_each_eval_batch(int64_t begin, int64_t end,
                           const std::function<void(const torch::Tensor& logits, const torch::Tensor& labels)>& use);

 private:
  ViTForImageClassification model_;
  std::unique_ptr<io::ImageDataset> train_, val_;
  io::EpochOrder order_;
  uint64_t seed_;
  double label_smoothing_, mixup_alpha_;
};

// The ViT (built with `options`: cuts and device) and its training and evaluation sets.
std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const parallel::ModelOptions& options = {});
// The same laid out on a runtime's mesh: tensor parallelism, sequence parallelism, this rank's pipeline
// stage, activation checkpointing.
std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const train::Runtime& runtime);
// Either of the above from settings already read.
std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const VitSettings& settings,
                                           const parallel::ModelOptions& options, const train::Runtime* runtime);

}  // namespace kuafu::vit
