// Language modelling on token files: a GPT and its data as the trainer sees them, built from the
// config's settings (read once).
#pragma once

#include <memory>

#include "apps/gpt/app_config.h"
#include "core/train/model_recipe.h"
#include "core/train/source_task.h"
#include "core/train/train_settings.h"

namespace kuafu::gpt {

// What a command reads of the config, read once and handed on.
struct GptSettings {
  TextData data;
  train::TrainSettings train;
  GPTConfig model;
};
GptSettings read_settings(const config::Config& config);

// The configured GPT: described with the run's layout, drawn from train.seed, then model.init_from's
// weights when it names a folder.
train::ModelRecipe<GPT> gpt_recipe(const config::Config& config, const GptSettings& settings);

using TextTask = train::SourceTask<GPT>;

// The GPT and its data from the config (seeded from train.seed); `options` (default: serial on the CPU) say
// how its layers are cut and where they live.
std::unique_ptr<TextTask> make_text_task(const config::Config& config, const parallel::ModelOptions& options = {});
// The same laid out on a runtime's mesh: tensor parallelism, and this rank's pipeline stage with its
// schedule over the step's accumulation micro-batches.
std::unique_ptr<TextTask> make_text_task(const config::Config& config, const train::Runtime& runtime);
// Either of the above from settings already read.
std::unique_ptr<TextTask> make_text_task(const config::Config& config, const GptSettings& settings,
                                         const parallel::ModelOptions& options, const train::Runtime* runtime);

}  // namespace kuafu::gpt
