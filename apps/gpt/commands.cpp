#include "apps/gpt/commands.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "apps/gpt/hugging_face.h"
#include "core/config/cli.h"
#include "core/dist/collectives.h"
#include "core/io/text_split.h"
#include "core/io/token_file.h"
#include "core/io/tokenizer.h"
#include "core/memory/memory_config.h"
#include "core/memory/memory_meter.h"
#include "core/optim/mixed_precision.h"
#include "core/optim/optim_config.h"
#include "core/train/app.h"
#include "core/train/benchmark.h"
#include "core/train/generate_settings.h"
#include "core/train/hf_interop.h"
#include "core/train/model_memory.h"
#include "core/util/device.h"
#include "core/util/logging.h"

namespace kuafu::gpt {
namespace fs = std::filesystem;

TextTask::TextTask(GPT model, const train::ParallelOptions& options, std::shared_ptr<io::TokenWindowLoader> train,
                   std::shared_ptr<io::TokenWindowLoader> val, int64_t eval_rows, int64_t micro_batch)
    : ModelTask(std::make_unique<train::ParallelModel>(*model, options), micro_batch, model->tp.batch_blocks()),
      model_(std::move(model)), train_(std::move(train)), val_(std::move(val)), eval_rows_(eval_rows) {}

torch::Device TextTask::device() const { return model_->tp.device; }

train::Batch TextTask::train_batch(int64_t step, int64_t first_row, int64_t rows) {
  const io::TokenBatch batch = train_->train_batch(step, first_row, rows).to(device());
  return {batch.inputs, batch.targets};
}

train::Batch TextTask::eval_batch(int64_t first_row, int64_t rows) {
  const io::TokenBatch batch = val_->eval_batch(eval_rows_, first_row, rows).to(device());
  return {batch.inputs, batch.targets};
}

double TextTask::flops_per_item() const { return model_->config.flops_per_token(train_->context()); }

namespace {

// The task with this rank's share of the model: tensor blocks by `tp`, pipeline parts by `stages`
// (null: the whole model).
std::unique_ptr<TextTask> build_text_task(const config::Config& config, const parallel::TensorParallel& tp,
                                          const train::Runtime* stages) {
  const TextData data = text_data(config);
  const train::TrainSettings settings = train::read_train_settings(config);
  for (const auto& path : {data.train_tokens, data.val_tokens}) {
    KUAFU_CHECK(fs::exists(path), "token file ", path, " does not exist: run `kuafu-gpt prepare --config ",
                config.path(), "` first");
  }
  auto train_file = std::make_shared<const io::TokenFile>(io::TokenFile::open(data.train_tokens));
  auto val_file = std::make_shared<const io::TokenFile>(io::TokenFile::open(data.val_tokens));
  GPTConfig model = model_config(config);
  for (const auto* file : {train_file.get(), val_file.get()}) {
    if (file->vocab_size() > static_cast<uint64_t>(model.vocab_size)) {
      config.fail_at("model.vocab_size", "(" + std::to_string(model.vocab_size) + ") is smaller than the vocabulary of " +
                                             file->path() + " (" + std::to_string(file->vocab_size()) + ")");
    }
  }
  train::check_row_blocks(config, tp, {"train.micro_batch_size", "train.eval_rows"});
  auto train = std::make_shared<io::TokenWindowLoader>(train_file, data.context, settings.seed, tp.device);
  auto val = std::make_shared<io::TokenWindowLoader>(val_file, data.context, settings.seed, tp.device);
  const int64_t micro_batch = settings.micro_batch_size;
  torch::manual_seed(settings.seed);
  GPT gpt(model, tp);
  if (stages && stages->sequence.enabled()) {
    train::check_sequence_parallel(config, *gpt, stages->sequence, "data.context", data.context, "model.n_head",
                                   "model.dropout");
  }
  if (const std::string folder = train::init_from(config); !folder.empty()) {
    load_hf_weights(gpt, io::read_hf_folder(folder));  // a resumed run's checkpoint replaces them
    log::infof("initial weights from ", folder);
  }
  train::ParallelOptions options;
  if (stages) {
    const io::TokenBatch sample = train->train_batch(0, 0, micro_batch).to(tp.device);  // for "time" partitions
    options = train::parallel_options(*gpt, config, *stages, {sample.inputs, sample.targets});
  }
  return std::make_unique<TextTask>(gpt, options, train, val, settings.eval_rows, micro_batch);
}

}  // namespace

void check_model_fits(const config::Config& config, const train::Runtime& runtime) {
  train::check_model_fits(config, runtime, static_cast<double>(model_config(config).parameter_count()),
                          {"model.n_layer", "model.n_embd"});
}

std::unique_ptr<TextTask> make_text_task(const config::Config& config, const parallel::TensorParallel& tp) {
  return build_text_task(config, tp, nullptr);
}

std::unique_ptr<TextTask> make_text_task(const config::Config& config, const train::Runtime& runtime) {
  return build_text_task(config, runtime.tensor, &runtime);
}

void prepare_command(const config::Config& config) {
  const TextData data = text_data(config);
  const std::string& text_path = data.text;
  KUAFU_CHECK(fs::exists(text_path), "data.text = ", text_path, " does not exist (for the Bible: data/kjv/export.sh ",
              fs::path(text_path).parent_path().string(), ")");
  std::error_code created;
  fs::create_directories(data.dir, created);
  if (created) config.fail_at("data.dir", "= " + data.dir + ": cannot create the folder: " + created.message());

  const auto [train_text, val_text] = io::split_text_blocks(text_path, data.val_every);

  if (!fs::exists(data.tokenizer_model)) {
    const std::string train_only = (fs::path(data.dir) / "tokenizer_train.txt").string();
    std::ofstream(train_only) << train_text;
    io::TokenizerTrainOptions options;
    options.input_path = train_only;
    options.model_prefix = (fs::path(data.dir) / "tokenizer").string();
    options.vocab_size = static_cast<int>(data.vocab_size);
    options.num_threads = static_cast<int>(std::max(1, torch::get_num_threads()));
    log::infof("training a ", data.vocab_size, "-token BPE tokenizer on ", train_text.size(), " bytes");
    io::train_tokenizer(options);
    fs::remove(train_only);
  } else {
    log::infof("using the existing tokenizer ", data.tokenizer_model);
  }
  const io::Tokenizer tokenizer = io::Tokenizer::load(data.tokenizer_model);
  const auto vocab_size = static_cast<uint64_t>(tokenizer.vocab_size());
  io::write_token_file(data.train_tokens, tokenizer.encode(train_text), vocab_size);
  io::write_token_file(data.val_tokens, tokenizer.encode(val_text), vocab_size);
  const io::TokenFile train_file = io::TokenFile::open(data.train_tokens);
  const io::TokenFile val_file = io::TokenFile::open(data.val_tokens);
  log::infof("wrote ", data.train_tokens, " (", train_file.size(), " tokens) and ", data.val_tokens, " (",
             val_file.size(), " tokens); vocabulary ", vocab_size, "; unigram entropy of validation tokens ",
             io::unigram_entropy_nats(val_file), " nats");
}

train::TrainSummary train_command(const config::Config& config) {
  train::Runtime runtime = train::start_runtime(config);
  check_model_fits(config, runtime);
  std::unique_ptr<TextTask> task = make_text_task(config, runtime);
  if (runtime.is_main()) {
    const GPTConfig& m = task->gpt()->config;
    log::infof("GPT-2: ", m.n_layer, " layers, ", m.n_head, " heads, C = ", m.n_embd, ", vocabulary ", m.vocab_size,
               ", ", static_cast<double>(m.parameter_count()) / 1e6, "M parameters; ", runtime.world->size(),
               " rank(s) x ", runtime.threads, " thread(s)");
  }
  train::Trainer trainer(config, runtime, *task);
  train::TrainSummary summary = trainer.run();
  if (runtime.is_main() && !summary.stopped_by_signal && summary.steps_done == train::read_train_settings(config).steps) {
    const double entropy = io::unigram_entropy_nats(io::TokenFile::open(text_data(config).val_tokens));
    log::infof("final validation loss ", summary.val_loss, " nats vs unigram entropy of the validation tokens ",
               entropy, " nats");
  }
  return summary;
}

void eval_command(const config::Config& config, const std::string& checkpoint) {
  train::Runtime runtime = train::start_runtime(config);
  // The whole model on this rank's device (checkpoints hold whole tensors), each rank a share of the rows.
  std::unique_ptr<TextTask> task = make_text_task(config, parallel::TensorParallel::serial_on(runtime.device));
  const std::string folder = train::checkpoint_to_read(train::read_train_settings(config).out_dir, checkpoint);
  train::CheckpointStore::load_model(folder, task->model());
  const train::LossSum sums = train::evaluate_task(*task, *runtime.mesh->group("data"));
  const double loss = sums.loss_sum / sums.count;
  const double entropy = io::unigram_entropy_nats(io::TokenFile::open(text_data(config).val_tokens));
  if (runtime.is_main()) {
    std::cout << nlohmann::json{{"checkpoint", folder}, {"val_loss", loss}, {"val_perplexity", std::exp(loss)},
                                {"unigram_entropy", entropy}, {"tokens", sums.count}}
                     .dump()
              << std::endl;
  }
}

void generate_command(const config::Config& config, const std::string& checkpoint, const std::string& prompt_text) {
  torch::set_num_threads(std::max(1, static_cast<int>(config.get_int("runtime.threads"))));
  const io::Tokenizer tokenizer = io::Tokenizer::load(text_data(config).tokenizer_model);
  GPT model(model_config(config), parallel::TensorParallel::serial_on(resolve_device(config.get_string("runtime.device"), 0)));
  const std::string folder = train::checkpoint_to_read(train::read_train_settings(config).out_dir, checkpoint);
  train::CheckpointStore::load_model(folder, *model);
  train::GenerateSettings settings = train::generate_settings(config);
  if (!prompt_text.empty()) {
    settings.prompts = {prompt_text};
    settings.prompts_key = "--prompt";
  }
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& prompt : settings.prompts) {
    ids.emplace_back();
    for (uint32_t id : tokenizer.encode(prompt)) ids.back().push_back(id);
    KUAFU_CHECK(!ids.back().empty(), settings.prompts_key, " \"", prompt, "\" has no tokens to continue");
  }
  settings.sampling.stop_token = tokenizer.eos_id();
  model->eval();
  const std::vector<std::vector<int64_t>> produced = nn::generate(decoder(model), ids, settings.sampling);
  for (size_t r = 0; r < settings.prompts.size(); ++r) {
    const std::vector<uint32_t> row(produced[r].begin(), produced[r].end());
    std::cout << (r ? "\n" : "") << settings.prompts[r] << tokenizer.decode(row) << std::endl;
  }
}

void export_command(const config::Config& config, const std::string& checkpoint, const std::string& out) {
  KUAFU_CHECK(!out.empty(), "export needs --out DIR (a new folder)");
  GPT model(model_config(config));
  const std::string folder = train::checkpoint_to_read(train::read_train_settings(config).out_dir, checkpoint);
  train::CheckpointStore::load_model(folder, *model);
  io::HfWriteOptions options = train::export_options(config);
  // Kuafu's SentencePiece model travels along (transformers' GPT-2 tokenizer is byte-level BPE).
  if (const std::string tokenizer = text_data(config).tokenizer_model; fs::exists(tokenizer)) options.extra_files = {tokenizer};
  export_hf_gpt(model, out, options);
  std::cout << nlohmann::json{{"checkpoint", folder}, {"exported", out}, {"parameters", model->config.parameter_count()}}.dump()
            << std::endl;
}

void benchmark_command(const config::Config& config) {
  train::Runtime runtime = train::start_runtime(config);
  check_model_fits(config, runtime);
  const GPTConfig m = model_config(config);
  train::BenchmarkMemory memory(runtime.device);  // before any model state
  const train::TrainSettings settings = train::read_train_settings(config);
  torch::manual_seed(settings.seed);
  GPT model(m, parallel::TensorParallel::serial_on(runtime.device));
  const int64_t context = text_data(config).context;
  train::BenchmarkSpec spec;
  spec.app = "gpt";
  spec.flops_per_item = m.flops_per_token(context);
  spec.parameters = m.parameter_count();
  const nlohmann::json line = train::benchmark_language_model(config, runtime, *model, m.vocab_size, context, spec, memory);
  if (runtime.is_main()) std::cout << line.dump() << std::endl;
}

int run_gpt_app(int argc, const char* const argv[]) {
  config::CommandLine cli("kuafu-gpt", "GPT-2 training, evaluation and sampling");
  cli.subcommand("prepare", "export-ready text -> SentencePiece BPE tokenizer + train/val token files")
      .subcommand("train", "train (resumes from the latest checkpoint in train.out_dir)")
      .subcommand("eval", "validation loss and perplexity of a checkpoint")
      .subcommand("generate", "sample text from a checkpoint")
      .subcommand("export", "a checkpoint as a Hugging Face folder (GPT2LMHeadModel.from_pretrained loads it)")
      .subcommand("benchmark", "time training steps on random tokens; prints one JSON line");
  for (const char* sub : {"eval", "generate", "export"}) {
    cli.option(sub, "checkpoint", "DIR", "", "checkpoint folder (default: the latest in train.out_dir)");
  }
  cli.option("generate", "prompt", "TEXT", "", "text to continue (default: generate.prompt)");
  cli.option("export", "out", "DIR", "", "the new folder to write");
  using Command = config::ParsedCommand;
  return train::run_app("kuafu-gpt", cli, gpt_schema(),
                        {{"prepare", [](const config::Config& c, const Command&) { prepare_command(c); }},
                         {"train", [](const config::Config& c, const Command&) { train_command(c); }},
                         {"eval", [](const config::Config& c, const Command& cmd) { eval_command(c, cmd.option("checkpoint")); }},
                         {"generate",
                          [](const config::Config& c, const Command& cmd) {
                            generate_command(c, cmd.option("checkpoint"), cmd.option("prompt"));
                          }},
                         {"export",
                          [](const config::Config& c, const Command& cmd) {
                            export_command(c, cmd.option("checkpoint"), cmd.option("out"));
                          }},
                         {"benchmark", [](const config::Config& c, const Command&) { benchmark_command(c); }}},
                        argc, argv);
}

}  // namespace kuafu::gpt
