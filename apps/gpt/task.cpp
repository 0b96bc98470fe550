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

GPT describe_gpt(const GptSettings& settings, parallel::ModelOptions options) {
  options.device = torch::kMeta;
  return GPT(settings.model, options);
}

DeferredWeights deferred_gpt_weights(const config::Config& config, const GptSettings& settings,
                                     const parallel::ModelOptions& options, bool starting_weights) {
  // Each replay describes the whole model afresh (no storage): every rank draws the serial model.
  std::function<void(GPT&)> load;
  if (starting_weights && !train::init_from(config).empty()) {
    load = [config](GPT& fresh) { gpt_format().load_init_weights(config, fresh); };
  }
  return train::deferred_from<GPT>(options.device, [settings, options] { return describe_gpt(settings, options); },
                                   train::seeded_initialization<GPT>(settings.train.seed), load);
}

namespace {

// A described model given the weights of those parameters `holds` names (null: all) on `device`: the
// serial model's from train.seed, then model.init_from's.
void materialize_gpt(const config::Config& config, const GptSettings& settings, GPT& gpt, const torch::Device& device,
                     const std::function<bool(const std::string&)>& holds, bool starting_weights) {
  train::materialize(*gpt, {device, nullptr, holds});
  train::seeded_initialization<GPT>(settings.train.seed)(gpt);
  if (starting_weights) gpt_format().load_init_weights(config, gpt);
}

}  // namespace

GPT build_gpt(const config::Config& config, const GptSettings& settings, const parallel::ModelOptions& options,
              bool starting_weights) {
  GPT gpt = describe_gpt(settings, options);
  materialize_gpt(config, settings, gpt, options.device, nullptr, starting_weights);
  return gpt;
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
  GPT gpt = describe_gpt(settings, options);
  if (runtime && runtime->sequence.enabled()) {
    train::check_sequence_parallel(config, *gpt, runtime->sequence, "data.context", data.context, "model.n_head",
                                   "model.dropout");
  }
  train::ParallelOptions layout;
  if (runtime) {  // a micro-batch for "time" partitions
    layout = train::parallel_options(*gpt, config, *runtime, batches.train(0, 0, settings.train.micro_batch_size));
  }
  const bool deferred = runtime && train::defers_trained_weights(config);
  if (!deferred) {
    const train::StageParts parts = train::stage_parts(*gpt, layout.plan);  // only this rank's stage gets storage
    materialize_gpt(config, settings, gpt, options.device,
                    [&parts](const std::string& name) { return parts.holds(name); }, /*starting_weights=*/true);
  }
  auto task = std::make_unique<TextTask>(gpt, layout, std::move(batches), settings.train.micro_batch_size,
                                         TextTask::Figures{model.flops_per_token(data.context), {"model."}});
  // Under ZeRO and Gemini the strategy fills its chunks as the weights are drawn and read.
  if (deferred) task->defer_weights(deferred_gpt_weights(config, settings, options, /*starting_weights=*/true));
  return task;
}

std::unique_ptr<TextTask> make_text_task(const config::Config& config, const parallel::ModelOptions& options) {
  return make_text_task(config, read_settings(config), options, nullptr);
}

std::unique_ptr<TextTask> make_text_task(const config::Config& config, const train::Runtime& runtime) {
  return make_text_task(config, read_settings(config), runtime.model_options(), &runtime);
}

}  // namespace kuafu::gpt
