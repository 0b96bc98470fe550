// Causal language model fine-tuning (OPT or GPT-2) as the trainer sees it: the model and its batches, from instruction examples (the
// loss on the responses only) or from windows of plain text.
#pragma once

#include <memory>

#include "apps/opt_finetune/app_config.h"
#include "apps/opt_finetune/model.h"
#include "core/config/config.h"
#include "core/train/model_recipe.h"
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

// The configured causal LM: described with the run's layout, drawn from train.seed, then model.init_from's
// weights when it names a folder, then lora.*'s adapters over it, its own weights then a frozen base.
// `name`: the model's section (models.<name> over the top-level keys; "": the top-level keys), which
// also gives its init_from and LoRA. The chat stages' policy and actor are declared so.
train::ModelRecipe<nn::CausalLMPtr> causal_lm_recipe(const config::Config& config, const OptSettings& settings,
                                                      const std::string& name = "");

// The task of a config laid out on a runtime's mesh (tensor parallelism, this rank's pipeline stage).
std::unique_ptr<OptTask> make_task(const config::Config& config, const train::Runtime& runtime);
// The same with the whole model on `device` (evaluation).
std::unique_ptr<OptTask> make_serial_task(const config::Config& config, const torch::Device& device);
// Either of the above from settings already read (runtime null: the whole model on options.device).
std::unique_ptr<OptTask> make_task(const config::Config& config, const OptSettings& settings,
                                   const parallel::ModelOptions& options, const train::Runtime* runtime);

}  // namespace kuafu::opt
