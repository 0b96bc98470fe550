// Causal language model fine-tuning (OPT or GPT-2) as the trainer sees it: the model and its batches, from instruction examples (the
// loss on the responses only) or from windows of plain text.
#pragma once

#include <memory>

#include "apps/opt_finetune/app_config.h"
#include "apps/opt_finetune/model.h"
#include "core/config/config.h"
#include "core/train/source_task.h"
#include "core/train/runtime.h"
#include "core/train/train_settings.h"
#include "core/util/weight_sink.h"

namespace kuafu::opt {

// What a command reads of the config, read once and handed on.
struct OptSettings {
  OptData data;
  train::TrainSettings train;
  LmShape model;
};
OptSettings read_settings(const config::Config& config);

using OptTask = train::SourceTask<nn::CausalLMPtr>;

// The config's model built with `options`, seeded from train.seed: model.init_from's weights when it names a folder,
// then the config's LoRA (lora.*), so checkpoints of a LoRA run load into it.
// `starting_weights` false: the seeded weights only (a checkpoint's replace them), adapters still added.
nn::CausalLMPtr build_model(const config::Config& config, const OptSettings& settings, const parallel::ModelOptions& options,
                            bool starting_weights = true);
nn::CausalLMPtr build_model(const config::Config& config, const parallel::ModelOptions& options);
// The whole model on options.device as a training run holds it before its memory strategy (the one of
// `config`, the trained model's section): a LoRA run's frozen base in the compute dtype (in host memory
// under memory.offload_frozen); a full fine-tune under ZeRO or Gemini left described, `deferred` set for
// the strategy to fill it (from train.seed, then model.init_from); otherwise float32. `starting_weights`
// false: the seeded weights only (a benchmark's). The chat stages' actor and policy are made this way.
nn::CausalLMPtr build_for_training(const config::Config& config, const OptSettings& settings,
                                   const parallel::ModelOptions& options, bool starting_weights, DeferredWeights& deferred);

// The task of a config laid out on a runtime's mesh (tensor parallelism, this rank's pipeline stage).
std::unique_ptr<OptTask> make_task(const config::Config& config, const train::Runtime& runtime);
// The same with the whole model on `device` (evaluation).
std::unique_ptr<OptTask> make_serial_task(const config::Config& config, const torch::Device& device);
// Either of the above from settings already read (runtime null: the whole model on options.device).
std::unique_ptr<OptTask> make_task(const config::Config& config, const OptSettings& settings,
                                   const parallel::ModelOptions& options, const train::Runtime* runtime);

}  // namespace kuafu::opt
