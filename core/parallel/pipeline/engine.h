// Runs a pipeline schedule (schedule.h) on this rank: the forwards and backwards of its model chunks,
// with activations and their gradients moved to the neighbouring stages by point-to-point messages.
#pragma once

#include <functional>
#include <vector>

#include "core/dist/process_mesh.h"
#include "core/parallel/pipeline/schedule.h"

namespace kuafu::parallel::pipeline {

// This rank's part of the model. Chunk c is virtual stage c p + s. For virtual stage 0 `input` is the
// micro-batch (whatever the model's first stage takes, e.g. token ids); for the others it is the
// previous virtual stage's output. The last virtual stage returns the micro-batch's loss, a scalar.
using ChunkForward = std::function<torch::Tensor(int chunk, const torch::Tensor& input, int micro)>;

// What the last run spent: time in the stage's own forwards and backwards, the whole step, and the
// most micro-batch chunks whose activations were alive at once.
struct RunStats {
  double compute_seconds = 0;
  double step_seconds = 0;
  int peak_live = 0;
  double bubble() const { return step_seconds > 0 ? 1.0 - compute_seconds / step_seconds : 0.0; }
};

class PipelineEngine {
 public:
  // `group` holds the pipeline ranks; its group rank is the stage.
  PipelineEngine(const ScheduleSpec& spec, dist::GroupPtr group);

  int stage() const { return group_->rank(); }
  const ScheduleSpec& spec() const { return spec_; }

  // One optimizer step's micro-batches, forward and backward as the schedule says. Gradients
  // accumulate into the parameters as for the mean of the micro-batches' losses times `loss_scale`
  // (mixed precision). `micro_input(m)` is called only on the rank holding virtual stage 0. Returns
  // the mean loss (unscaled) on every rank. `after_backward` (if set) runs after each micro-batch
  // chunk's backward, before the next forward (a memory strategy settles that backward's gradients).
  // Activations may have any shape and dtype: each is preceded by a small header describing it.
  double run(const ChunkForward& forward, const std::function<torch::Tensor(int micro)>& micro_input,
             double loss_scale = 1.0, const std::function<void()>& after_backward = nullptr);
  // The same micro-batches forward only, without gradients (evaluation): the mean loss on every rank.
  double evaluate(const ChunkForward& forward, const std::function<torch::Tensor(int micro)>& micro_input);
  // Forward only, the last virtual stage returning `width` numbers per micro-batch (e.g. a loss sum, an
  // item count and a count of right answers): their sums over the micro-batches, float64 [width], on
  // every rank.
  torch::Tensor evaluate_sums(const ChunkForward& forward, const std::function<torch::Tensor(int micro)>& micro_input,
                              int64_t width);
  const RunStats& last_stats() const { return stats_; }

 private:
  // The sums of what the last virtual stage returned ([width] each), on every rank.
  torch::Tensor execute(const std::vector<Step>& steps, const ChunkForward& forward,
                        const std::function<torch::Tensor(int micro)>& micro_input, double loss_scale, int64_t width,
                        const std::function<void()>& after_backward = nullptr);

  ScheduleSpec spec_;
  dist::GroupPtr group_;
  std::vector<Step> steps_;  // the training schedule, made on the first run
  RunStats stats_;
};

// The group of this rank's first and last pipeline stage (the same coordinates on every other mesh
// axis), which hold the two copies of a tied embedding; null unless this rank is one of them and the
// mesh has a "pipeline" axis of 2 or more stages. Only its two members create it.
dist::GroupPtr first_and_last_stage_group(const dist::ProcessMesh& mesh);

}  // namespace kuafu::parallel::pipeline
