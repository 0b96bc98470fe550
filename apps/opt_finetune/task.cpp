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

nn::CausalLMPtr build_model(const config::Config& config, const parallel::ModelOptions& options) {
  return build_model(config, read_settings(config), options);
}

namespace {

// The model described on the meta device (lazy construction): nothing is allocated yet.
nn::CausalLMPtr describe_model(const OptSettings& settings, parallel::ModelOptions options) {
  options.device = torch::kMeta;
  return settings.model.build(options);
}

// model.init_from's weights, when it names a folder (read one tensor at a time).
void load_starting_weights(const config::Config& config, nn::CausalLM& model) {
  if (const std::string folder = train::init_from(config); !folder.empty()) {
    load_lm_weights(model, io::read_hf_folder(folder));
    log::infof("initial weights from ", folder);
  }
}

// How a LoRA run holds the model's own weights, which stay frozen: in the compute dtype when training,
// and in host memory under memory.offload_frozen.
struct FrozenBase {
  torch::Dtype dtype = torch::kFloat32;
  bool on_host = false;
};

// Gives a described model its weights on `device`, those `holds` names (null: all): the serial model's
// initialisation from train.seed, then model.init_from's weights (read one tensor at a time), then the
// config's LoRA. A LoRA run trains only the adapters, so the model's own weights are made as `frozen` says.
void materialize_model(const config::Config& config, const OptSettings& settings, nn::CausalLM& model,
                       const torch::Device& device, FrozenBase frozen, const std::function<bool(const std::string&)>& holds,
                       bool starting_weights) {
  const bool lora = train::lora_spec(config).has_value();
  const torch::Dtype dtype = lora ? frozen.dtype : torch::kFloat32;
  const bool on_host = lora && frozen.on_host;
  train::Materialization how = train::Materialization::all_in(device, dtype);
  how.holds = holds;
  if (on_host) how.on_host = [](const std::string&) { return true; };
  train::materialize(model.module(), how);
  {
    // Weights held in host memory are still drawn on the run's device, as an eager model's are.
    const WeightSink draw_here{device, [](const std::string&) { return false; }, nullptr};
    std::optional<ScopedWeightSink> scope;
    if (on_host) scope.emplace(draw_here);
    torch::manual_seed(settings.train.seed);
    model.initialize();
  }
  if (starting_weights) load_starting_weights(config, model);
  train::apply_configured_lora(config, model.module(), on_host ? std::optional<torch::Device>(device) : std::nullopt);
}

// A described model made ready to train, those `holds` names (null: all) given storage: a LoRA run's
// frozen base straight in the compute dtype that ModelState would cast it to (in host memory under
// memory.offload_frozen). A full fine-tuning run under ZeRO or Gemini stays described: the returned
// weights let the strategy fill its chunks as a fresh description is initialised and loaded into its
// weight sink. Otherwise the returned weights are empty.
DeferredWeights materialize_for_training(const config::Config& config, const OptSettings& settings,
                                         const parallel::ModelOptions& options, nn::CausalLM& model,
                                         const std::function<bool(const std::string&)>& holds, bool starting_weights) {
  if (!train::lora_spec(config) && train::defers_trained_weights(config)) {
    std::function<void(nn::CausalLMPtr&)> load;
    if (starting_weights && !train::init_from(config).empty()) {
      load = [config](nn::CausalLMPtr& fresh) { load_starting_weights(config, *fresh); };
    }
    return train::deferred_from<nn::CausalLMPtr>(options.device, [settings, options] { return describe_model(settings, options); },
                                                 train::seeded_initialization<nn::CausalLMPtr>(settings.train.seed), load);
  }
  const FrozenBase frozen{optim::compute_dtype(config, options.device), config.get_bool("memory.offload_frozen")};
  materialize_model(config, settings, model, options.device, frozen, holds, starting_weights);
  return {};
}

}  // namespace

nn::CausalLMPtr build_model(const config::Config& config, const OptSettings& settings, const parallel::ModelOptions& options,
                            bool starting_weights) {
  nn::CausalLMPtr model = describe_model(settings, options);
  materialize_model(config, settings, *model, options.device, FrozenBase{}, nullptr, starting_weights);
  return model;
}

nn::CausalLMPtr build_for_training(const config::Config& config, const OptSettings& settings,
                                   const parallel::ModelOptions& options, bool starting_weights, DeferredWeights& deferred) {
  nn::CausalLMPtr model = describe_model(settings, options);
  deferred = materialize_for_training(config, settings, options, *model, nullptr, starting_weights);
  return model;
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
  nn::CausalLMPtr model = describe_model(settings, options);
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
  train::ParallelOptions layout;
  if (stages) {
    layout = train::parallel_options(*model, config, *stages, batches.train(0, 0, settings.train.micro_batch_size));
  }
  // Only this rank's pipeline stage is given storage (the whole model of an evaluation, in float32).
  const train::StageParts parts = train::stage_parts(*model, layout.plan);
  const auto holds = [&parts](const std::string& name) { return parts.holds(name); };
  DeferredWeights deferred;
  if (stages) {
    deferred = materialize_for_training(config, settings, options, *model, holds, /*starting_weights=*/true);
  } else {
    materialize_model(config, settings, *model, options.device, FrozenBase{}, holds, /*starting_weights=*/true);
  }
  const double flops = m.flops_per_token(std::llround(batches.items_per_row));
  auto task = std::make_unique<OptTask>(model, layout, std::move(batches), settings.train.micro_batch_size,
                                        OptTask::Figures{flops, {"model.", "lora.", "data.kind"}});
  if (deferred) task->defer_weights(std::move(deferred));
  return task;
}

std::unique_ptr<OptTask> make_task(const config::Config& config, const train::Runtime& runtime) {
  return make_task(config, read_settings(config), runtime.model_options(), &runtime);
}

std::unique_ptr<OptTask> make_serial_task(const config::Config& config, const torch::Device& device) {
  return make_task(config, read_settings(config), parallel::ModelOptions::serial_on(device), nullptr);
}

}  // namespace kuafu::opt
