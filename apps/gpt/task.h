// Language modelling on token files: a GPT and its data as the trainer sees them, built from the
// config's settings (read once).
#pragma once

#include <memory>

#include "apps/gpt/app_config.h"
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

// The configured GPT built with `options`, seeded from train.seed, with model.init_from's weights when it names a folder.
// `starting_weights` false: the seeded weights only (a checkpoint's replace them).
GPT build_gpt(const config::Config& config, const GptSettings& settings, const parallel::ModelOptions& options,
              bool starting_weights = true);

// The configured GPT described on the meta device (lazy construction; core/train/lazy_model.h), and
// how ZeRO and Gemini fill its trained weights into their chunks: the serial model's draws from
// train.seed, then, with `starting_weights`, model.init_from's.
GPT describe_gpt(const GptSettings& settings, parallel::ModelOptions options);
DeferredWeights deferred_gpt_weights(const config::Config& config, const GptSettings& settings,
                                     const parallel::ModelOptions& options, bool starting_weights);

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
