// The training loop shared by every app: micro-steps with gradient accumulation, data parallelism,
// the configured optimizer and schedule, mixed precision with float32 masters and loss scaling,
// clipping, evaluation, progress, JSONL metrics, checkpoints, exact resume, stop on SIGINT/SIGTERM and
// on a non-finite loss.
#pragma once

#include <memory>
#include <string>

#include <optional>

#include "core/config/config.h"
#include "core/hooks/block_hooks.h"
#include "core/train/checkpoint.h"
#include "core/train/model_state.h"
#include "core/train/run_folder.h"
#include "core/train/runtime.h"
#include "core/train/train_settings.h"

namespace kuafu::train {

// train.*, optim.*, precision.* and memory.* keys.
void add_trainer_schema(config::Schema& schema);

// Sums over this rank's share of an evaluation set.
struct LossSum {
  double loss_sum = 0.0;  // sum of per-item losses (nats)
  double count = 0.0;     // number of items (tokens, images)
  double correct = 0.0;   // items whose top prediction is right (classification tasks)
  std::vector<double> extra;  // a task's own sums (the same number on every rank), for its eval_metrics
};

// One figure an evaluation reports, computed from the sums over every rank.
struct EvalMetric {
  std::string key;      // its metrics.jsonl field, e.g. "val_ppl"
  std::string label;    // its words in the progress line, e.g. "perplexity"
  double value = 0.0;
  bool percent = false;  // shown as a percentage
};

// What an app gives the trainer.
class TrainTask {
 public:
  virtual ~TrainTask() = default;
  virtual torch::nn::Module& model() = 0;
  // Mean loss over this rank's rows [first_row, first_row + rows) of optimizer step `step`'s global batch.
  virtual torch::Tensor loss(int64_t step, int64_t first_row, int64_t rows) = 0;
  // This rank's share (`rank` of `ranks`) of the fixed evaluation set.
  virtual LossSum evaluate(int rank, int ranks) = 0;
  // Model FLOPs (forward + backward) per item, for MFU; items are tokens for language models.
  virtual double flops_per_item() const = 0;
  virtual int64_t items_per_row() const = 0;
  virtual std::string item_name() const { return "tokens"; }
  // Optimizer steps per pass over the training set; 0 for a task without epochs (a token stream).
  // When known, metrics.jsonl rows carry "epoch" (fractional), for curves against epochs.
  virtual int64_t steps_per_epoch() const { return 0; }
  // What evaluation reports beside the mean loss, from the sums over every rank: perplexity unless the
  // task says otherwise (classifiers: accuracy from LossSum::correct; others from LossSum::extra).
  virtual std::vector<EvalMetric> eval_metrics(const LossSum& sums) const;
  // Config keys whose values a checkpoint must match to be resumed (e.g. "model." keys).
  virtual std::vector<std::string> checkpoint_keys() const = 0;

  // Pipeline parallelism: a task whose model is cut into stages runs all of a step's micro-batches
  // through its schedule at once. pipeline_step runs micro-batches of `rows` rows starting at
  // `first_rows` (this data rank's), accumulating gradients as for their mean loss x `loss_scale`, and
  // returns that mean loss (unscaled) on every rank.
  virtual bool pipelined() const { return false; }
  virtual double pipeline_step(int64_t step, const std::vector<int64_t>& first_rows, int64_t rows,
                               double loss_scale);
  // False for a parameter this rank holds as a second copy (a pipeline's tied embedding on the last
  // stage): the global gradient norm counts the other one.
  virtual bool counts_in_global_norm(const std::string& /*name*/) const { return true; }
  // Installs (null: removes) hooks around each of the model's blocks (memory.strategy = "gemini"); false
  // when the model does not run its blocks through the block-call interface.
  virtual bool set_block_hooks(hooks::BlockHooks* hooks);
};

// Evaluates `task` on every rank of `data` (each its share) and returns the sums over all ranks.
LossSum evaluate_task(TrainTask& task, const dist::ProcessGroup& data);

struct TrainSummary {
  int64_t steps_done = 0;
  int64_t skipped_steps = 0;  // overflowed steps the loss scaler skipped
  double last_loss = 0.0;
  double val_loss = 0.0;
  double val_accuracy = 0.0;  // the "val_accuracy" metric, for tasks that report one
  bool stopped_by_signal = false;
};

// The single-model training loop: one ModelState stepped over the task's micro-batches.
class Trainer {
 public:
  Trainer(const config::Config& config, Runtime& runtime, TrainTask& task);
  ~Trainer();

  TrainSummary run();
  LossSum evaluate();  // all ranks together; returns the global sums

  int64_t start_step() const { return start_step_; }
  double learning_rate(int64_t step) const { return state_->learning_rate(step); }
  optim::Optimizer& optimizer() { return state_->optimizer(); }
  const optim::DynamicLossScaler* loss_scaler() const { return state_->loss_scaler(); }

 private:
  void save_checkpoint(int64_t step);

  const config::Config& config_;
  Runtime& runtime_;
  TrainTask& task_;
  std::unique_ptr<RunFolder> run_;
  const TrainSettings settings_;
  std::unique_ptr<ModelState> state_;
  int64_t accumulation_;
  int64_t start_step_ = 0;
};

}  // namespace kuafu::train
