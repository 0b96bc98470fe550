// The training loop shared by every app, for one model or several (PPO's actor and critic beside a
// frozen reference and reward model; a UNet beside a frozen VAE and text encoder): micro-steps with
// gradient accumulation, data parallelism, each trained model's optimizer, schedule, precision and memory
// strategy from its own config section (models.<name>.*, the top-level keys as defaults), frozen models
// in their compute dtype (optionally offloaded), clipping, evaluation, progress, JSONL metrics, one
// checkpoint of every part, exact resume, stop on SIGINT/SIGTERM (between micro-steps too) and on a
// non-finite loss. An app with one model gives a TrainTask: the case of one trained model named "".
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/config/config.h"
#include "core/hooks/block_hooks.h"
#include "core/hooks/block_sites.h"
#include "core/train/checkpoint.h"
#include "core/train/frozen_model.h"
#include "core/train/model_state.h"
#include "core/train/run_folder.h"
#include "core/train/runtime.h"
#include "core/train/train_settings.h"

namespace kuafu::train {

// train.*, optim.*, precision.* and memory.* keys.
void add_trainer_schema(config::Schema& schema);
// models.<name>.optim.*, .precision.* and .memory.* for each of `models` (a run of several models):
// add after every optim/precision/memory key is in `schema`.
void add_model_sections(config::Schema& schema, const std::vector<std::string>& models);

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

// One model of a run, as the trainer drives it.
struct RunModel {
  std::string name;                     // its section models.<name> and checkpoint part; "" for an app's one model
  torch::nn::Module* module = nullptr;  // its parameters on the run's device
  bool trained = true;                  // false: a FrozenModel (no optimizer, no gradients)
  bool saved = true;                    // frozen: checkpoints hold it (trained models are always saved)
  // Installs (null: removes) hooks around the model's blocks; null or false: it cannot (memory.strategy =
  // "gemini", memory.offload_frozen need it).
  std::function<bool(hooks::BlockHooks*)> set_block_hooks;
  // Parameters with copies on other ranks (a pipeline's tied embedding): gradients summed, one counted.
  TiedCopies tied;
  // Trained weights left on the meta device for the sharded strategy to fill (lazy construction).
  DeferredWeights deferred;
};

// RunModel::set_block_hooks of a model whose blocks run through its own sites (it must outlive the run).
inline std::function<bool(hooks::BlockHooks*)> hooks_through_sites(hooks::SiteModel& model) {
  return [&model](hooks::BlockHooks* hooks) {
    model.set_block_hooks(hooks);
    return true;
  };
}

// A trained model of a run whose blocks run through its own sites (the memory strategies reach them),
// with its weights left for its strategy to fill when `deferred` is set.
RunModel trained_run_model(std::string name, hooks::SiteModel& model, DeferredWeights deferred = {});
// A frozen model of a run, not kept in checkpoints; with `sites`, its blocks take hooks (offload_frozen).
RunModel frozen_run_model(std::string name, torch::nn::Module& module, hooks::SiteModel* sites = nullptr);

// What a run gives the trainer: its models and its data.
class RunTask {
 public:
  virtual ~RunTask() = default;
  // The run's models, trained and frozen (cheap: called when the trainer is made and around evaluations).
  virtual std::vector<RunModel> models() = 0;
  // The mean loss of each trained model, by name, over this rank's rows [first_row, first_row + rows)
  // of optimizer step `step`'s global batch (a micro-step). A model's loss may depend on the others
  // (rollouts, rewards); one backward of their sum reaches each.
  virtual std::map<std::string, torch::Tensor> losses(int64_t step, int64_t first_row, int64_t rows) = 0;
  // True: trained model `name` sits step `step` out (the same on every rank): no loss is asked of it, it has
  // no backward, and its optimizer does not step (a PPO critic's warm-up before the actor learns).
  virtual bool sits_out(const std::string& /*name*/, int64_t /*step*/) const { return false; }
  // Separate backwards per micro-step (1 unless a loss needs a second pass of a model: Gemini gathers a
  // part once per backward). Pass 0 is losses(); pass p > 0's losses, of the models that take part in it,
  // come from further_losses after the previous pass's backward. The gradients of the passes add up.
  virtual int backward_passes() const { return 1; }
  virtual std::map<std::string, torch::Tensor> further_losses(int pass, int64_t step, int64_t first_row, int64_t rows);
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
  // The task's own figures of step `step`, just done (RLHF: the rollout's reward, KL, response length),
  // numbers by name: added to the step's metrics.jsonl line and progress line. Every rank calls it; the
  // main rank's are written, so a task gives figures that are the same on every rank.
  virtual std::map<std::string, double> step_figures(int64_t /*step*/) { return {}; }
  // After each evaluation (the models holding their moving averages, where optim.ema_decay is set), on
  // every rank: a task writes what a person looks at, e.g. samples, under `out_dir` (`main`: the rank that writes).
  virtual void after_evaluation(int64_t /*step*/, const std::string& /*out_dir*/, bool /*main*/) {}
  // What the task holds between steps that a resumed run needs to go on exactly as this one would
  // (RLHF: the rollout being trained on, the adaptive KL coefficient): this rank's, saved with every
  // checkpoint beside its random state.
  virtual io::NamedTensors task_state() const { return {}; }
  // Restores task_state() from the checkpoint resumed from: this rank's, or empty when the checkpoint has
  // none for it (written by another number of ranks, or by a task that kept none).
  virtual void restore_task_state(const io::NamedTensors& /*state*/) {}

  // Pipeline parallelism (one trained model): a task whose model is cut into stages runs all of a
  // step's micro-batches through its schedule at once. pipeline_step runs micro-batches of `rows` rows
  // starting at `first_rows` (this data rank's), accumulating gradients as for their mean loss x
  // `loss_scale`, and returns that mean loss (unscaled) on every rank.
  virtual bool pipelined() const { return false; }
  virtual double pipeline_step(int64_t step, const std::vector<int64_t>& first_rows, int64_t rows,
                               double loss_scale);
};

// What an app with one trained model gives the trainer.
class TrainTask : public RunTask {
 public:
  virtual torch::nn::Module& model() = 0;
  // Mean loss over this rank's rows [first_row, first_row + rows) of optimizer step `step`'s global batch.
  virtual torch::Tensor loss(int64_t step, int64_t first_row, int64_t rows) = 0;
  virtual TiedCopies tied_copies() const { return {}; }
  // Installs (null: removes) hooks around each of the model's blocks (memory.strategy = "gemini"); false
  // when the model does not run its blocks through the block-call interface.
  virtual bool set_block_hooks(hooks::BlockHooks* hooks);
  // The model was left on the meta device: ModelState fills it through `weights` (a task built for
  // memory.strategy zero1, zero2 or gemini; see core/train/lazy_model.h). A task wrapping another
  // forwards deferred_weights().
  void defer_weights(DeferredWeights weights) { deferred_ = std::move(weights); }
  virtual DeferredWeights deferred_weights() const { return deferred_; }

  // Frozen models the loss reads beside the trained one (DPO's reference), each from its own section.
  virtual std::vector<RunModel> frozen_models() { return {}; }

  std::vector<RunModel> models() final;  // one trained model named "", then frozen_models()

 private:
  DeferredWeights deferred_;
  std::map<std::string, torch::Tensor> losses(int64_t step, int64_t first_row, int64_t rows) final;
};

// Evaluates `task` on every rank of `data` (each its share) and returns the sums over all ranks.
LossSum evaluate_task(RunTask& task, const dist::ProcessGroup& data);

struct TrainSummary {
  int64_t steps_done = 0;
  int64_t skipped_steps = 0;  // overflowed steps the loss scaler skipped
  double last_loss = 0.0;
  double val_loss = 0.0;
  double val_accuracy = 0.0;  // the "val_accuracy" metric, for tasks that report one
  bool stopped_by_signal = false;
};

class Trainer {
 public:
  // Makes each model's state: trained models read their view of `config` (Config::model_view), frozen
  // ones theirs, and everything resumes from the run folder's checkpoint when there is one.
  Trainer(const config::Config& config, Runtime& runtime, RunTask& task);
  ~Trainer();

  TrainSummary run();
  // All ranks together, on the moving averages where optim.ema_decay is set (what a checkpoint exports);
  // returns the global sums.
  LossSum evaluate();

  int64_t start_step() const { return start_step_; }
  // The first trained model's figures.
  double learning_rate(int64_t step) const { return trained_.front().state->learning_rate(step); }
  optim::Optimizer& optimizer() { return trained_.front().state->optimizer(); }
  const optim::DynamicLossScaler* loss_scaler() const { return trained_.front().state->loss_scaler(); }
  // Saves every model's state now as the checkpoint of `step` (collective), as run() does at its
  // intervals: e.g. a resumed checkpoint written again in this run's layout. Complete on return, also
  // under train.async_save.
  void save_checkpoint(int64_t step) { save_checkpoint(step, /*wait=*/true); }

 private:
  TrainSummary run_steps();
  // `wait` false under train.async_save: the files are written while training goes on, and the
  // checkpoint is sealed once every rank has written its part (the steps agree on that).
  void save_checkpoint(int64_t step, bool wait);
  struct Trained {
    std::string name;
    std::unique_ptr<ModelState> state;
  };
  // `body` with every trained model's moving average swapped in (optim.ema_decay), then the live weights back.
  void with_moving_averages(const std::function<void()>& body);
  // A stop between micro-steps: the partial step is dropped on every model.
  void drop_partial_step(const std::vector<bool>& active);  // the models taking part in the step

  const config::Config& config_;
  Runtime& runtime_;
  RunTask& task_;
  std::unique_ptr<RunFolder> run_;
  const TrainSettings settings_;
  std::vector<RunModel> models_;
  std::deque<config::Config> views_;  // each model's view of the config (the states refer to them)
  std::vector<Trained> trained_;      // in models() order
  std::vector<std::unique_ptr<FrozenModel>> frozen_;
  int64_t accumulation_;
  int64_t start_step_ = 0;
  int64_t last_saved_step_ = -1;  // the step this run last checkpointed
};

}  // namespace kuafu::train
