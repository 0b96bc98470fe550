// `kuafu-<app> benchmark`, shared by every app: training steps of the app's model on one random batch,
// stepped as the trainer steps them (activation checkpointing, precision, memory strategy and optimizer
// from the config, through a ModelState; no clipping), timed on the device, as one JSON line.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/hooks/block_model.h"
#include "core/memory/memory_meter.h"
#include "core/train/parallelize.h"
#include "core/train/runtime.h"
#include "core/util/weight_sink.h"

namespace kuafu::train {

// benchmark.steps, benchmark.warmup and benchmark.checkpoint_dir.
void add_benchmark_schema(config::Schema& schema);

// What the process holds before the model is built: the line's memory figures count from here.
class BenchmarkMemory {
 public:
  explicit BenchmarkMemory(const torch::Device& device);
  // The model and its state are built: from here the steps' own peak is kept as well (building can
  // peak higher, e.g. weights made in float32 before they are cast or offloaded).
  void start_steps();
  nlohmann::json figures() const;  // peaks (whole run, building, the steps alone) and the baselines, MiB
  // After figures(): the peak of a later phase (a checkpoint's save) from start_phase() on, MiB in use.
  void start_phase();
  double phase_peak_mb() const;

 private:
  torch::Device device_;
  int64_t resident_before_, in_use_before_;
  int64_t setup_peak_in_use_ = 0, setup_peak_bytes_ = 0;
  memory::PeakInUse peak_in_use_;
};

struct BenchmarkSpec {
  std::string app;             // the line's "app"
  std::string item_name;       // "tokens", "images": the line's "<item_name>_per_s"
  double flops_per_item = 0;   // model FLOPs (forward + backward) per item
  int64_t items_per_row = 1;   // items in one row of the batch (tokens per sequence; 1 per image)
  int64_t parameters = 0;
  nlohmann::json fields;       // the app's own fields (context, image_size)
  // Run once after the models' states are made and before the timed steps, its memory counted in the
  // steps' peak (RLHF: the rollout's generation and experience under each model's memory strategy).
  std::function<void()> before_steps;
  // The first model was left described: ZeRO or Gemini fill its trained weights (App::build_benchmark_model).
  DeferredWeights deferred;
};

class ModelState;

// A model trained in the benchmark's steps: its state, and the name its memory figures are prefixed with
// in the line ("" for the first, whose figures are the line's own).
struct BenchmarkedModel {
  std::string name;
  ModelState* state = nullptr;
};

// Times training steps of any model and returns the line (every rank; rank 0 prints it): `loss` gives
// the mean loss of one batch of `rows` rows; the memory strategy's hooks go on the model's block sites
// (activation checkpointing, if any, is already applied to them). MFU is the model FLOPs this rank
// reached over the matrix-product rate this rank's device measured in the compute dtype.
nlohmann::json benchmark_training(const config::Config& config, const Runtime& runtime, hooks::SiteModel& model,
                                  const std::function<torch::Tensor()>& loss, int64_t rows, const BenchmarkSpec& spec,
                                  BenchmarkMemory& memory);
// Several models trained together, each through its own state: `losses` gives each model's mean loss of
// one batch of `rows` rows, in the order of `models`; one backward of their sum reaches each. The line's
// memory strategy, precision and optimizer are the first model's (`config`).
nlohmann::json benchmark_models(const config::Config& config, const Runtime& runtime,
                                const std::vector<BenchmarkedModel>& models,
                                const std::function<std::vector<torch::Tensor>()>& losses, int64_t rows,
                                const BenchmarkSpec& spec, BenchmarkMemory& memory);
// A sequential model on `batch`, with activation checkpointing from the config (ParallelModel).
nlohmann::json benchmark_training(const config::Config& config, const Runtime& runtime, hooks::BlockModel& model,
                                  const Batch& batch, const BenchmarkSpec& spec, BenchmarkMemory& memory);

// A language model's benchmark: micro-batch rows (train.micro_batch_size) of `context` random tokens
// below `vocab` against their next tokens, timed by benchmark_training; the line counts tokens and adds
// "context" and "trainable_parameters" to `spec.fields`.
nlohmann::json benchmark_language_model(const config::Config& config, const Runtime& runtime, hooks::BlockModel& model,
                                        int64_t vocab, int64_t context, BenchmarkSpec spec, BenchmarkMemory& memory);

}  // namespace kuafu::train
