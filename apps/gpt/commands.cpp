#include "apps/gpt/commands.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "apps/gpt/hugging_face.h"
#include "core/io/text_split.h"
#include "core/io/token_file.h"
#include "core/io/tokenizer.h"
#include "core/train/model_app.h"
#include "core/util/logging.h"
#include "core/util/utf8.h"

namespace kuafu::gpt {
namespace fs = std::filesystem;

namespace {

class GptApp : public train::ModelApp<GPT> {
 public:
  explicit GptApp(const config::Config& config) : ModelApp(config), settings_(read_settings(config)) {}

  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override {
    return make_text_task(config_, settings_, options, runtime);
  }
  std::string describe(train::RunTask&) override {
    const GPTConfig& m = settings_.model;
    std::ostringstream line;
    line << "GPT-2: " << m.n_layer << " layers, " << m.n_head << " heads, C = " << m.n_embd << ", vocabulary "
         << m.vocab_size << ", " << static_cast<double>(m.parameter_count()) / 1e6 << "M parameters";
    return line.str();
  }
  void after_training(const train::TrainSummary& summary, const train::Runtime& runtime) override {
    if (runtime.is_main()) {
      log::infof("final validation loss ", summary.val_loss, " nats vs unigram entropy of the validation tokens ",
                 unigram_entropy(), " nats");
    }
  }
  nlohmann::json evaluate(train::RunTask& task, const train::Runtime& runtime) override {
    nlohmann::json line = App::evaluate(task, runtime);
    line["unigram_entropy"] = unigram_entropy();
    return line;
  }
  nlohmann::json export_model(const std::string& out, io::HfWriteOptions options, const config::ParsedCommand&) override {
    // Kuafu's SentencePiece model travels along (transformers' GPT-2 tokenizer is byte-level BPE).
    if (const std::string& tokenizer = settings_.data.tokenizer_model; fs::exists(tokenizer)) options.extra_files = {tokenizer};
    gpt_format().save(model(), out, options);
    return {{"parameters", settings_.model.parameter_count()}};
  }
  nlohmann::json benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) override {
    const GPTConfig& m = settings_.model;
    train::BenchmarkSpec spec;
    spec.deferred = deferred();
    spec.app = "gpt";
    spec.flops_per_item = m.flops_per_token(settings_.data.context);
    spec.parameters = m.parameter_count();
    return train::benchmark_language_model(config_, runtime, *model(), m.vocab_size, settings_.data.context, spec, memory);
  }
  train::TextFraming text_framing() override {
    auto tokenizer = std::make_shared<io::Tokenizer>(io::Tokenizer::load(settings_.data.tokenizer_model));
    train::TextFraming framing;
    framing.encode = [tokenizer](const std::string& prompt) {
      const std::vector<uint32_t> ids = tokenizer->encode(prompt);
      return std::vector<int64_t>(ids.begin(), ids.end());
    };
    framing.print = [tokenizer](size_t row, const std::string& prompt, const std::vector<int64_t>& produced) {
      const std::string continuation = tokenizer->decode(std::vector<uint32_t>(produced.begin(), produced.end()));
      std::cout << (row ? "\n" : "") << prompt << text::replace_invalid_utf8(continuation) << std::endl;
    };
    framing.stop_tokens = {tokenizer->eos_id()};
    framing.decode = [tokenizer](const std::vector<int64_t>& ids) {
      return tokenizer->decode(std::vector<uint32_t>(ids.begin(), ids.end()));
    };
    return framing;
  }
  nn::Decoder decoder() override { return gpt::decoder(model()); }

 private:
  double unigram_entropy() const { return io::unigram_entropy_nats(io::TokenFile::open(settings_.data.val_tokens)); }

  train::ModelRecipe<GPT> recipe() const override { return gpt_recipe(config_, settings_); }

  GptSettings settings_;
};

}  // namespace

std::unique_ptr<train::App> make_gpt_app(const config::Config& config) { return std::make_unique<GptApp>(config); }

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

int run_gpt_app(int argc, const char* const argv[]) {
  train::AppDefinition app;
  app.program = "kuafu-gpt";
  app.description = "GPT-2 training, evaluation and sampling";
  app.schema = gpt_schema();
  app.make_app = make_gpt_app;
  app.before = {{"prepare", "export-ready text -> SentencePiece BPE tokenizer + train/val token files",
                 [](const config::Config& config, const config::ParsedCommand&) { prepare_command(config); }}};
  app.generates = true;
  app.item_help = "random tokens";
  app.export_help = "GPT2LMHeadModel.from_pretrained loads it";
  return train::run_app(app, argc, argv);
}

}  // namespace kuafu::gpt
