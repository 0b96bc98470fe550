// OPT fine-tuning as the trainer sees it: the model and its batches, from instruction examples (the
// loss on the responses only) or from windows of plain text.
#pragma once

#include <functional>
#include <memory>

#include "apps/opt_finetune/model.h"
#include "core/config/config.h"
#include "core/io/token_loader.h"
#include "core/train/model_task.h"
#include "core/train/runtime.h"

namespace kuafu::opt {

// Where batches come from, whatever the data's kind.
struct BatchSource {
  std::function<io::TokenBatch(int64_t step, int64_t first_row, int64_t rows)> train;
  std::function<io::TokenBatch(int64_t first_row, int64_t rows)> eval;
  int64_t eval_rows = 0;
  double tokens_per_row = 0;  // mean tokens of a training row, for throughput and MFU
};

class OptTask : public train::ModelTask {
 public:
  OptTask(OPTForCausalLM model, const train::ParallelOptions& options, BatchSource batches, int64_t micro_batch);
  train::Batch train_batch(int64_t step, int64_t first_row, int64_t rows) override;
  int64_t eval_rows() const override { return batches_.eval_rows; }
  train::Batch eval_batch(int64_t first_row, int64_t rows) override;
  double flops_per_item() const override;
  int64_t items_per_row() const override { return static_cast<int64_t>(batches_.tokens_per_row + 0.5); }
  std::vector<std::string> checkpoint_keys() const override { return {"model.", "lora.", "data.kind"}; }
  OPTForCausalLM& opt() { return model_; }

 private:
  // The run's device, where the model was built (a frozen weight offloaded to the host is no guide).
  torch::Device device() const { return model_->tp.device; }
  OPTForCausalLM model_;
  BatchSource batches_;
};

// The config's model on `tp`, seeded from train.seed: model.init_from's weights when it names a folder,
// then the config's LoRA (lora.*), so checkpoints of a LoRA run load into it.
OPTForCausalLM build_model(const config::Config& config, const parallel::TensorParallel& tp);

// The task of a config laid out on a runtime's mesh (tensor parallelism, this rank's pipeline stage).
std::unique_ptr<OptTask> make_task(const config::Config& config, const train::Runtime& runtime);
// The same with the whole model on `device` (evaluation).
std::unique_ptr<OptTask> make_serial_task(const config::Config& config, const torch::Device& device);

}  // namespace kuafu::opt
