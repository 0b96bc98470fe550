#include "apps/opt_finetune/task.h"

#include <filesystem>

#include "apps/opt_finetune/app_config.h"
#include "apps/opt_finetune/hugging_face.h"
#include "core/io/instruction_batches.h"
#include "core/train/hf_interop.h"
#include "core/train/peft_adapter.h"
#include "core/train/train_settings.h"
#include "core/util/logging.h"

namespace kuafu::opt {
namespace fs = std::filesystem;

OptTask::OptTask(OPTForCausalLM model, const train::ParallelOptions& options, BatchSource batches, int64_t micro_batch)
    : ModelTask(std::make_unique<train::ParallelModel>(*model, options), micro_batch, model->tp.batch_blocks()),
      model_(std::move(model)), batches_(std::move(batches)) {}

train::Batch OptTask::train_batch(int64_t step, int64_t first_row, int64_t rows) {
  const io::TokenBatch batch = batches_.train(step, first_row, rows).to(device());
  return {batch.inputs, batch.targets};
}

train::Batch OptTask::eval_batch(int64_t first_row, int64_t rows) {
  const io::TokenBatch batch = batches_.eval(first_row, rows).to(device());
  return {batch.inputs, batch.targets};
}

double OptTask::flops_per_item() const {
  return model_->config.flops_per_token(static_cast<int64_t>(batches_.tokens_per_row + 0.5));
}

OPTForCausalLM build_model(const config::Config& config, const parallel::TensorParallel& tp) {
  torch::manual_seed(train::read_train_settings(config).seed);
  OPTForCausalLM model(model_config(config), tp);
  if (const std::string folder = train::init_from(config); !folder.empty()) {
    load_hf_weights(model, io::read_hf_folder(folder));  // a resumed run's checkpoint replaces them
    log::infof("initial weights from ", folder);
  }
  train::apply_configured_lora(config, *model);
  return model;
}

namespace {

BatchSource instruction_batches(const config::Config& config, const torch::Device& device) {
  const OptData data = opt_data(config);
  const train::TrainSettings settings = train::read_train_settings(config);
  const io::BpeTokenizer tokenizer = load_tokenizer(config);
  const io::InstructionFormat format = instruction_format(config, tokenizer);
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
  BatchSource source;
  source.train = [train_batches](int64_t step, int64_t first, int64_t rows) { return train_batches->train_batch(step, first, rows); };
  source.eval = [val_batches](int64_t first, int64_t rows) { return val_batches->eval_batch(first, rows); };
  source.eval_rows = std::min(settings.eval_rows, val_batches->size());
  source.tokens_per_row = data.pack ? static_cast<double>(data.context) : mean_tokens;
  return source;
}

BatchSource text_batches(const config::Config& config, const torch::Device& device) {
  const OptData data = opt_data(config);
  const train::TrainSettings settings = train::read_train_settings(config);
  for (const auto& path : {data.train_tokens, data.val_tokens}) {
    KUAFU_CHECK(fs::exists(path), "token file ", path, " does not exist: run `kuafu-opt prepare --config ",
                config.path(), "` first");
  }
  auto train = std::make_shared<io::TokenWindowLoader>(
      std::make_shared<const io::TokenFile>(io::TokenFile::open(data.train_tokens)), data.context, settings.seed, device);
  auto val = std::make_shared<io::TokenWindowLoader>(
      std::make_shared<const io::TokenFile>(io::TokenFile::open(data.val_tokens)), data.context, settings.seed, device);
  BatchSource source;
  source.train = [train](int64_t step, int64_t first, int64_t rows) { return train->train_batch(step, first, rows); };
  const int64_t eval_rows = settings.eval_rows;
  source.eval = [val, eval_rows](int64_t first, int64_t rows) { return val->eval_batch(eval_rows, first, rows); };
  source.eval_rows = eval_rows;
  source.tokens_per_row = static_cast<double>(data.context);
  return source;
}

std::unique_ptr<OptTask> build_task(const config::Config& config, const parallel::TensorParallel& tp,
                                    const train::Runtime* stages) {
  const train::TrainSettings settings = train::read_train_settings(config);
  train::check_row_blocks(config, tp, {"train.micro_batch_size", "train.eval_rows"});
  if (opt_data(config).pack && stages && (stages->pipelined() || stages->sequence.enabled())) {
    config.fail_at("data.pack", "is on, but packed rows keep their documents apart only without pipeline and "
                                "sequence parallelism: turn data.pack off or parallel.pipeline / parallel.sequence off");
  }
  BatchSource batches = opt_data(config).instructions ? instruction_batches(config, tp.device) : text_batches(config, tp.device);
  OPTForCausalLM model = build_model(config, tp);
  const OPTConfig& m = model->config;
  for (const auto& check : {batches.train(0, 0, 1), batches.eval(0, 1)}) {
    const torch::Tensor ids = check.inputs.dim() == 3 ? check.inputs.select(1, 0) : check.inputs;  // packed: ids over documents
    if (ids.max().item<int64_t>() >= m.vocab_size) {
      config.fail_at("model.vocab_size", "(" + std::to_string(m.vocab_size) + ") is smaller than the tokenizer's ids (up to " +
                                             std::to_string(ids.max().item<int64_t>()) + ")");
    }
  }
  train::ParallelOptions options;
  if (stages) {
    const io::TokenBatch sample = batches.train(0, 0, settings.micro_batch_size).to(tp.device);
    options = train::parallel_options(*model, config, *stages, {sample.inputs, sample.targets});
  }
  return std::make_unique<OptTask>(model, options, std::move(batches), settings.micro_batch_size);
}

}  // namespace

std::unique_ptr<OptTask> make_task(const config::Config& config, const train::Runtime& runtime) {
  return build_task(config, runtime.tensor, &runtime);
}

std::unique_ptr<OptTask> make_serial_task(const config::Config& config, const torch::Device& device) {
  return build_task(config, parallel::TensorParallel::serial_on(device), nullptr);
}

}  // namespace kuafu::opt
