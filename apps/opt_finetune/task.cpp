#include "apps/opt_finetune/task.h"

#include <filesystem>
#include <optional>

#include "apps/opt_finetune/app_config.h"
#include "apps/opt_finetune/hugging_face.h"
#include "core/io/instruction_batches.h"
#include "core/optim/mixed_precision.h"
#include "core/train/hf_interop.h"
#include "core/train/lazy_model.h"
#include "core/train/parallelize.h"
#include "core/train/peft_adapter.h"
#include "core/train/train_settings.h"
#include "core/util/logging.h"

namespace kuafu::opt {
namespace fs = std::filesystem;

OptSettings read_settings(const config::Config& config) {
  OptSettings settings{opt_data(config), train::read_train_settings(config), {}};
  settings.model = model_config(config, settings.data);
  return settings;
}

train::ModelRecipe<nn::CausalLMPtr> causal_lm_recipe(const config::Config& config, const OptSettings& settings,
                                                      const std::string& name) {
  const config::Config section = train::section_of(config, name);
  train::ModelRecipe<nn::CausalLMPtr> recipe;
  recipe.name = name;
  recipe.describe = described_lm(settings.model);
  recipe.draw = train::seeded_initialization<nn::CausalLMPtr>(settings.train.seed);
  recipe.load = train::init_from_load<nn::CausalLMPtr>(section, [](nn::CausalLMPtr& model, const std::string& folder) {
    load_lm_weights(*model, io::read_hf_folder(folder));  // one stored tensor at a time
  });
  // A LoRA run trains only the adapters; the model's own weights stay a frozen base.
  if (train::lora_spec(section)) {
    recipe.adapt = [section](nn::CausalLMPtr& model, std::optional<torch::Device> host_base) {
      train::apply_configured_lora(section, model->module(), host_base);
    };
  }
  recipe.parameters = static_cast<double>(settings.model.parameter_count());
  recipe.size_keys = {"model.shape", "model.hidden_size", "model.num_hidden_layers"};
  return recipe;
}

namespace {

train::BatchSource instruction_batches(const config::Config& config, const OptSettings& run, const torch::Device& device) {
  const OptData& data = run.data;
  const train::TrainSettings& settings = run.train;
  const io::BpeTokenizer tokenizer = load_tokenizer(config, data);
  const io::InstructionFormat format = instruction_format(config, data, tokenizer, run.model);
  const std::optional<int64_t> pad = tokenizer.token_id("<pad>");
  auto read = [&](const std::string& key, const std::string& path) {
    if (!fs::is_regular_file(path)) {
      config.fail_at(key, "= " + path + " does not exist (the instruction set: data/instructions/build.py " +
                              fs::path(path).parent_path().string() + ")");
    }
    auto set = std::make_shared<io::InstructionSet>(io::read_instructions(path, tokenizer, format));
    if (set->examples.empty()) config.fail_at(key, "= " + path + " holds no example of at most data.context tokens");
    int64_t tokens = 0, learned = 0;
    for (const auto& e : set->examples) {
      tokens += static_cast<int64_t>(e.tokens.size());
      learned += e.learned_count();
    }
    log::infof(path, ": ", set->examples.size(), " examples, ", tokens, " tokens (", learned, " learned); ",
               set->skipped_too_long, " longer than data.context = ", data.context, " skipped");
    return std::shared_ptr<const io::InstructionSet>(set);
  };
  const auto train = read("data.train", data.train);
  const auto val = read("data.val", data.val);
  double mean_tokens = 0;
  for (const auto& e : train->examples) mean_tokens += static_cast<double>(e.tokens.size() - 1);
  mean_tokens /= static_cast<double>(train->examples.size());
  const int64_t pad_id = pad.value_or(format.eos);
  auto train_batches = std::make_shared<io::InstructionBatcher>(train, pad_id, settings.batch_size, settings.seed, device,
                                                                data.pack ? data.context : 0);
  auto val_batches = std::make_shared<io::InstructionBatcher>(val, pad_id, 1, settings.seed, device);
  train::BatchSource source;
  source.train = [train_batches, device](int64_t step, int64_t first, int64_t rows) {
    return train::to_batch(train_batches->train_batch(step, first, rows), device);
  };
  source.eval = [val_batches, device](int64_t first, int64_t rows) {
    return train::to_batch(val_batches->eval_batch(first, rows), device);
  };
  source.eval_rows = std::min(settings.eval_rows, val_batches->size());
  source.items_per_row = data.pack ? static_cast<double>(data.context) : mean_tokens;
  return source;
}

}  // namespace

std::unique_ptr<OptTask> make_task(const config::Config& config, const OptSettings& settings,
                                   const parallel::ModelOptions& options, const train::Runtime* stages) {
  train::check_row_blocks(config, options.tp, {"train.micro_batch_size", "train.eval_rows"});
  const OptData& data = settings.data;
  train::BatchSource batches =
      data.instructions ? instruction_batches(config, settings, options.device)
                        : train::token_file_batches(data.train_tokens, data.val_tokens, data.context, settings.train.seed,
                                                    settings.train.eval_rows, options.device,
                                                    "kuafu-opt prepare --config " + config.path());
  const train::ModelRecipe<nn::CausalLMPtr> recipe = causal_lm_recipe(config, settings);
  nn::CausalLMPtr model = recipe.describe(options);
  const LmShape& m = settings.model;
  if (stages && stages->sequence.enabled()) {
    train::check_sequence_parallel(config, model->module(), stages->sequence, "data.context", data.context,
                                   "model.num_attention_heads", "model.attention_dropout");
  }
  for (const auto& check : {batches.train(0, 0, 1), batches.eval(0, 1)}) {
    const torch::Tensor ids = check.inputs.dim() == 3 ? check.inputs.select(1, 0) : check.inputs;  // packed: ids over documents
    if (ids.max().item<int64_t>() >= m.vocab_size()) {
      config.fail_at("model.vocab_size", "(" + std::to_string(m.vocab_size()) + ") is smaller than the tokenizer's ids (up to " +
                                             std::to_string(ids.max().item<int64_t>()) + ")");
    }
  }
  // Only this rank's pipeline stage is given storage (the whole model of an evaluation, in float32).
  train::LaidOut laid = train::lay_out(recipe, model, config, options, stages,
                                       [&] { return batches.train(0, 0, settings.train.micro_batch_size); });
  const double flops = m.flops_per_token(std::llround(batches.items_per_row));
  auto task = std::make_unique<OptTask>(model, laid.layout, std::move(batches), settings.train.micro_batch_size,
                                        OptTask::Figures{flops, {"model.", "lora.", "data.kind"}});
  task->defer_weights(std::move(laid.deferred));
  return task;
}

std::unique_ptr<OptTask> make_task(const config::Config& config, const train::Runtime& runtime) {
  return make_task(config, read_settings(config), runtime.model_options(), &runtime);
}

std::unique_ptr<OptTask> make_serial_task(const config::Config& config, const torch::Device& device) {
  return make_task(config, read_settings(config), parallel::ModelOptions::serial_on(device), nullptr);
}

}  // namespace kuafu::opt
