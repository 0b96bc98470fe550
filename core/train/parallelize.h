// Applies the configured strategies to a model written as maths (hooks::BlockModel), always in this order:
//   1. tensor parallelism: chosen when the model is built, its layers coming from the parallel::
//      factories with runtime.model_options() (the one strategy a model file names, through the factories only);
//   2. sequence parallelism: every nn::AttentionCore gets the "sequence" group, and the stream is cut
//      along its positions after the head;
//   3. pipeline staging: this rank keeps the head, blocks and tail of its stages (cut uniformly, by
//      parameters or by measured time) and frees the rest;
//   4. activation checkpointing: each block's forward (or those matching memory.checkpoint_blocks) is
//      recomputed in its backward;
//   5. the memory strategy (ZeRO, Gemini): installed by the trainer once the optimizer exists, through
//      the block hooks each part runs under (set_block_hooks).
// Steps 4 and 5 act on the model's block sites (hooks::BlockSites): the head, each block and the tail,
// as they act on the blocks of any model (core/train/block_strategies.h).
// ParallelModel then runs the model: the loss of a batch, a pipeline step, evaluation sums.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/hooks/block_hooks.h"
#include "core/hooks/block_model.h"
#include "core/parallel/pipeline/engine.h"
#include "core/parallel/pipeline/partition.h"
#include "core/train/runtime.h"
#include "core/train/tied_copies.h"

namespace kuafu::train {

// One micro-batch: named features (a one-stream model's inputs and targets).
using hooks::Batch;

struct ParallelOptions {
  parallel::sequence::SequenceParallel sequence;  // off: whole sequences
  parallel::pipeline::ScheduleSpec schedule;       // stages 1: no pipeline
  parallel::pipeline::StagePlan plan;              // this rank's parts (empty chunks: the whole model)
  dist::GroupPtr pipeline;                         // the "pipeline" axis (null without stages)
  dist::GroupPtr ends;  // this rank's first and last stage when it is one of them (tied weights)
  bool checkpoint_activations = false;
  std::vector<std::string> checkpoint_blocks;  // block-name globs to checkpoint; empty: every block
};

class ParallelModel {
 public:
  // Applies `options` to `model` (steps 2-4 above); `model` must outlive this.
  ParallelModel(hooks::BlockModel& model, ParallelOptions options);

  hooks::BlockModel& model() { return model_; }
  const ParallelOptions& options() const { return options_; }
  bool pipelined() const { return options_.schedule.stages > 1; }

  // Not pipelined: the mean loss of this rank's share of `batch` (its chunk of the positions under
  // sequence parallelism; gradients then average over the sequence ranks), after the model's recycling
  // iterations without gradient.
  torch::Tensor loss(const Batch& batch);
  // Pipelined: a step's micro-batches through the schedule, gradients accumulated as for their mean
  // loss x loss_scale (each copy of a tied weight its own stage's: the caller sums them, tied_copies());
  // the mean loss (unscaled) on every rank. The block hooks hear of the end of each micro-batch's backward.
  double pipeline_step(const std::vector<Batch>& micro_batches, double loss_scale);
  // Evaluation sums of `batch` (float64 [loss sum, items, right]), whole-batch figures on every rank of
  // the model's group.
  torch::Tensor evaluate(const Batch& batch);

  // The weights the head and the tail share, held on the first and the last stage (pipelined): the first
  // stage's copy counts.
  TiedCopies tied_copies() const;
  void set_block_hooks(hooks::BlockHooks* hooks) { model_.set_block_hooks(hooks); }

 private:
  // Head, blocks and tail on this rank (no stages), after any recycling iterations, the stream cut along its
  // positions under sequence parallelism: the loss of this rank's share, or its evaluation sums.
  torch::Tensor run_unstaged(const Batch& batch, bool sums);
  // What a pipeline rank runs for a micro-batch's chunk: the head first, its blocks, the tail last.
  torch::Tensor stage_forward(int chunk, const torch::Tensor& input, const Batch& micro_batch, bool sums);
  void keep_planned_parts();

  hooks::BlockModel& model_;
  ParallelOptions options_;
  std::set<std::string> tied_;  // parameters both the head and the tail compute with
  std::unique_ptr<parallel::pipeline::PipelineEngine> train_engine_, eval_engine_;
};

// The module paths of `model`'s parts (head, blocks, tail) that `plan`'s stage holds, and all of them;
// the empty plan of an unpipelined model holds every part.
struct StageParts {
  std::set<std::string> held, all;
  // Whether parameter `name` (a path under the model) lies in a held part, or in none of the parts.
  bool holds(const std::string& name) const;
};
StageParts stage_parts(hooks::BlockModel& model, const parallel::pipeline::StagePlan& plan);

// What sequence parallelism needs of a model and its rows, checked at the keys before any work: rows of
// `positions` positions (set by `positions_key`) cut into equal chunks; with all_to_all, the heads of
// every attention of `model` (nn::AttentionCore; set by `heads_key`) shared out among the ranks; with
// ring, no dropout on the attention probabilities (set by `dropout_key`).
void check_sequence_parallel(const config::Config& config, torch::nn::Module& model,
                             const parallel::sequence::SequenceParallel& sequence, const std::string& positions_key,
                             int64_t positions, const std::string& heads_key, const std::string& dropout_key);

// For programs whose models train data parallel only (with ZeRO or Gemini): kuafu::Error naming the keys
// when `runtime` (none: no check) pipelines, cuts sequences or `options` cut tensors. `who` begins the
// message ("kuafu-sd train").
void require_data_parallel(const config::Config& config, const Runtime* runtime, const parallel::ModelOptions& options,
                           const std::string& who);

// Activation checkpointing from the config on any model's blocks (memory.activation_checkpointing): the
// blocks memory.checkpoint_blocks names, or `default_blocks` (globs) when it names none.
void checkpoint_from_config(const config::Config& config, hooks::BlockSites& sites,
                            const std::vector<std::string>& default_blocks);

// 2D, 2.5D and 3D tensor parallelism cut every batch into row blocks: each of `keys` (row counts such as
// train.micro_batch_size) must be a multiple of their number. Checked at the key before any work.
void check_row_blocks(const config::Config& config, const parallel::TensorParallel& tp,
                      const std::vector<std::string>& keys);

// What each part costs, for partitions: parameters of the head, block 0 and the tail; or their forward
// + backward seconds on `sample` (median of 3 after a warm-up; the random streams and gradients are
// left as they were).
parallel::pipeline::StageCosts parameter_costs(hooks::BlockModel& model);
parallel::pipeline::StageCosts measured_costs(hooks::OneStreamModel& model, const Batch& sample);

// The options the config and runtime ask for: the pipeline's schedule over the step's accumulation
// micro-steps and this rank's stage plan (parallel.partition; "time" measures on `sample`, rank 0's figures
// shared), sequence parallelism, activation checkpointing. Checked at the keys before any work.
ParallelOptions parallel_options(hooks::BlockModel& model, const config::Config& config, const Runtime& runtime,
                                 const Batch& sample);

}  // namespace kuafu::train
