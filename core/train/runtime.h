// What every app does before training: threads, seed, logging, the distributed world and its mesh,
// stop signals, and the machine measurements (matrix-product rate, peak memory) behind MFU figures.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/config/config.h"
#include "core/dist/process_mesh.h"
#include "core/parallel/pipeline/schedule.h"
#include "core/parallel/sequence/sequence_parallel.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::train {

// runtime.* and dist.* keys, plus parallel.data, parallel.pipeline, .schedule, .chunks, .partition,
// parallel.tensor.*, parallel.sequence.*, parallel.dap.size and memory.activation_checkpointing.
void add_runtime_schema(config::Schema& schema);

struct Runtime {
  std::shared_ptr<dist::World> world;
  // axes: pipeline (when > 1), data, sequence or dap (when on), then the tensor axes
  std::shared_ptr<dist::ProcessMesh> mesh;
  parallel::TensorParallel tensor;            // the configured mode over `mesh` (serial when none)
  parallel::sequence::SequenceParallel sequence;  // each sequence cut across the "sequence" axis (off: none)
  // FastFold's dynamic axial parallelism: the "dap" axis (parallel.dap.size) over which a model's blocks
  // cut each sample's MSA and pair tensors (core/parallel/dap); null when off. Its ranks take the same
  // rows, each its block of every sample, and their losses are means over their blocks.
  dist::GroupPtr dap;
  // Stages, schedule and chunks (micro_batches: set by the trainer from the accumulation steps).
  parallel::pipeline::ScheduleSpec pipeline;
  bool pipelined() const { return pipeline.stages > 1; }
  int stage() const { return pipelined() ? mesh->coordinate("pipeline") : 0; }
  // The ranks holding one copy of the model: pipeline and tensor axes (null for a serial model).
  dist::GroupPtr model_group() const;
  // The ranks holding the same weights and sharing out each step's tokens, over which gradients are
  // averaged: data, and sequence or dap when on (their ranks take the same rows' chunks of positions).
  dist::GroupPtr replica_group() const;
  std::vector<std::string> replica_axes() const;  // the mesh axes of replica_group()
  int threads = 1;
  torch::Device device{torch::kCPU};
  // What this rank's model is built with: the tensor-parallel cuts, the run's device and the DAP group.
  parallel::ModelOptions model_options() const {
    parallel::ModelOptions options{tensor, device};
    options.dap = dap;
    return options;
  }
  bool is_main() const { return world->rank() == 0; }
};

// Sets threads (runtime.threads, 0 = cores / ranks on this node), configures logging, joins the
// world described by the launch environment and builds the mesh. Fails before any work on bad sizes.
Runtime start_runtime(const config::Config& config);
// The same over a world already joined (a second layout in the same processes, e.g. tests that
// resume one run's checkpoint under another mesh).
Runtime start_runtime(const config::Config& config, std::shared_ptr<dist::World> world);

// The micro-steps one optimizer step accumulates: train.batch_size / (train.micro_batch_size x data
// ranks); kuafu::Error at train.batch_size when that does not divide. A pipeline runs them as its
// micro-batches.
int64_t accumulation_steps(const config::Config& config, const Runtime& runtime);

// Measured matrix-product rate of this process (FLOP/s) on `device` in `dtype` with the current threads:
// the peak that MFU figures are relative to. Small products underestimate the peak (a 512² probe gave
// "MFU 123%"), so square products grow from 256 until one takes 50 ms (CPU: at most 2048), and the
// fastest of all counts. Measured once per process for each device, dtype and thread count.
// `fresh` measures again and replaces the remembered rate (a probe taken on a busy machine is low).
double measure_matmul_flops(const torch::Device& device, torch::Dtype dtype = torch::kFloat32, bool fresh = false);

// Wall-clock seconds of `step` over `steps` calls after `warmup` untimed ones (benchmark subcommands).
struct StepTimes {
  double median = 0, min = 0, max = 0;
};
// Each step is timed until `device` has finished its work.
StepTimes time_steps(const std::function<void()>& step, int64_t warmup, int64_t steps, const torch::Device& device);

// Runs an app's command, printing "<app>: error: ..." for any failure; returns the exit code: 0, 1 for
// an error, 128 + the signal when SIGINT or SIGTERM stopped it (130, 143, as shells and kuafu-run say).
int run_app_command(const std::string& app, const std::function<void()>& command);

// SIGINT/SIGTERM set a flag that the trainer polls between micro-steps (checkpoint, then stop);
// a second SIGINT falls back to the default action.
void install_stop_signals();
bool stop_requested();
int stop_signal();          // the first stop signal received, 0 if none
void request_stop();        // as if a signal arrived (tests)
void clear_stop_request();  // tests run several trainings in one process

}  // namespace kuafu::train
