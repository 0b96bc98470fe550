#include "apps/gpt/task.h"

#include "apps/gpt/hugging_face.h"
#include "core/io/token_file.h"
#include "core/train/hf_interop.h"
#include "core/train/lazy_model.h"
#include "core/train/parallelize.h"
#include "core/util/logging.h"

namespace kuafu::gpt {

GptSettings read_settings(const config::Config& config) {
  return {text_data(config), train::read_train_settings(config), model_config(config)};
}

train::ModelRecipe<GPT> gpt_recipe(const config::Config& config, const GptSettings& settings) {
  train::ModelRecipe<GPT> recipe;
  recipe.describe = train::described<GPT>(settings.model);
  recipe.draw = train::seeded_initialization<GPT>(settings.train.seed);
  if (!train::init_from(config).empty()) recipe.load = [config](GPT& fresh) { gpt_format().load_init_weights(config, fresh); };
  recipe.parameters = static_cast<double>(settings.model.parameter_count());
  recipe.size_keys = {"model.n_layer", "model.n_embd"};
  return recipe;
}

std::unique_ptr<TextTask> make_text_task(const config::Config& config, const GptSettings& settings,
                                         const parallel::ModelOptions& options, const train::Runtime* runtime) {
  const TextData& data = settings.data;
  train::BatchSource batches =
      train::token_file_batches(data.train_tokens, data.val_tokens, data.context, settings.train.seed,
                                settings.train.eval_rows, options.device, "kuafu-gpt prepare --config " + config.path());
  const GPTConfig& model = settings.model;
  for (const auto& path : {data.train_tokens, data.val_tokens}) {
    if (const uint64_t vocab = io::TokenFile::open(path).vocab_size(); vocab > static_cast<uint64_t>(model.vocab_size)) {
      config.fail_at("model.vocab_size", "(" + std::to_string(model.vocab_size) + ") is smaller than the vocabulary of " +
                                             path + " (" + std::to_string(vocab) + ")");
    }
  }
  train::check_row_blocks(config, options.tp, {"train.micro_batch_size", "train.eval_rows"});
  const train::ModelRecipe<GPT> recipe = gpt_recipe(config, settings);
  GPT gpt = recipe.describe(options);
  if (runtime && runtime->sequence.enabled()) {
    train::check_sequence_parallel(config, *gpt, runtime->sequence, "data.context", data.context, "model.n_head",
                                   "model.dropout");
  }
  // Only this rank's stage gets storage; under ZeRO and Gemini the strategy fills its chunks as the
  // weights are drawn and read.
  train::LaidOut laid = train::lay_out(recipe, gpt, config, options, runtime,
                                       [&] { return batches.train(0, 0, settings.train.micro_batch_size); });
  auto task = std::make_unique<TextTask>(gpt, laid.layout, std::move(batches), settings.train.micro_batch_size,
                                         TextTask::Figures{model.flops_per_token(data.context), {"model."}});
  task->defer_weights(std::move(laid.deferred));
  return task;
}

std::unique_ptr<TextTask> make_text_task(const config::Config& config, const parallel::ModelOptions& options) {
  return make_text_task(config, read_settings(config), options, nullptr);
}

std::unique_ptr<TextTask> make_text_task(const config::Config& config, const train::Runtime& runtime) {
  return make_text_task(config, read_settings(config), runtime.model_options(), &runtime);
}

}  // namespace kuafu::gpt
