// kuafu-vit's subcommands: prepare (checks and summarises the data), train, eval (top-1, top-5 and
// per-class accuracy), benchmark. run_vit_app parses the command line and catches errors.
#pragma once

#include <memory>

#include "apps/vit/app_config.h"
#include "apps/vit/dataset.h"
#include "core/train/model_task.h"

namespace kuafu::vit {

// Image classification: the trainer's view of a ViT and its data. Each step's global batch is the next
// slice of a per-epoch shuffle of the training set (drop-last), so a run resumes exactly.
class ImageTask : public train::ModelTask {
 public:
  ImageTask(ViTForImageClassification model, const train::ParallelOptions& options,
            std::unique_ptr<io::ImageDataset> train, std::unique_ptr<io::ImageDataset> val, const config::Config& config,
            const train::TrainSettings& settings);
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
  int64_t steps_per_epoch() const override { return train_->size() / global_batch_; }
  // The logits of evaluation items [begin, end) in batches of the micro-batch size.
  void for_each_eval_batch(int64_t begin, int64_t end,
                           const std::function<void(const torch::Tensor& logits, const torch::Tensor& labels)>& use);

 private:
  std::vector<size_t> training_items(int64_t step, int64_t first_row, int64_t rows);

  ViTForImageClassification model_;
  std::unique_ptr<io::ImageDataset> train_, val_;
  int64_t global_batch_;
  uint64_t seed_;
  double label_smoothing_, mixup_alpha_;
  int64_t epoch_ = -1;
  std::vector<size_t> order_;  // the current epoch's shuffle
};

// The ViT (tensor-parallel as `tp` says) and its training and evaluation sets.
std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const parallel::TensorParallel& tp = {});
// The same laid out on a runtime's mesh: tensor parallelism, sequence parallelism, this rank's pipeline
// stage, activation checkpointing.
std::unique_ptr<ImageTask> make_image_task(const config::Config& config, const train::Runtime& runtime);

void prepare_command(const config::Config& config);
train::TrainSummary train_command(const config::Config& config);
void eval_command(const config::Config& config, const std::string& checkpoint);
// The checkpoint (default: the latest) as a new Hugging Face folder `out`, with the classes' names.
void export_command(const config::Config& config, const std::string& checkpoint, const std::string& out);
void benchmark_command(const config::Config& config);

// The whole program; returns the exit code.
int run_vit_app(int argc, const char* const argv[]);

}  // namespace kuafu::vit
