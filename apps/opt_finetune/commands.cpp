#include "apps/opt_finetune/commands.h"

#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include "apps/opt_finetune/hugging_face.h"
#include "core/io/text_split.h"
#include "core/io/token_file.h"
#include "core/nn/lora.h"
#include "core/train/hf_interop.h"
#include "core/train/peft_adapter.h"
#include "core/util/logging.h"
#include "core/util/utf8.h"

namespace kuafu::opt {
namespace fs = std::filesystem;

CausalLmApp::CausalLmApp(const config::Config& config, std::string name)
    : ModelApp(config), name_(std::move(name)), section_(train::section_of(config, name_)), settings_(read_settings(config)) {}

nlohmann::json CausalLmApp::benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) {
  const LmShape& m = settings_.model;
  const int64_t context = settings_.data.context;
  train::BenchmarkSpec spec;
  spec.app = "opt";
  spec.deferred = deferred();
  spec.flops_per_item = m.flops_per_token(context);
  spec.parameters = m.parameter_count();
  spec.fields = {{"lora_rank", section_.get_int("lora.rank")}};
  return train::benchmark_language_model(config_, runtime, *model(), m.vocab_size(), context, spec, memory);
}

nlohmann::json CausalLmApp::export_model(const std::string& out, io::HfWriteOptions options, const config::ParsedCommand& command) {
  const std::optional<nn::LoraSpec> lora = train::lora_spec(section_);
  if (command.flag("adapter")) {
    KUAFU_CHECK(lora, "export --adapter writes LoRA adapters, but lora.rank = 0 in ", config_.path());
    train::export_adapter(model()->module(), *lora, out, train::init_from(section_));
    return {{"adapter", true}};
  }
  // The tokenizer's files travel along, so the folder is a whole model.
  if (!settings_.data.tokenizer.empty()) options.extra_files = io::hf_tokenizer_files(settings_.data.tokenizer);
  nn::CausalLMPtr model = this->model();
  if (lora) {
    // The adapters folded into a plain model of the same description (the merged weights are its draws):
    // the adapted model's outputs.
    const train::ModelRecipe<nn::CausalLMPtr> merged{"", /*trained=*/false, recipe().describe, [&](nn::CausalLMPtr& plain) {
      train::copy_named_weights(nn::merged_lora_weights(model->module(), *lora), plain->module());
    }};
    model = train::build_as(merged, train::Materialization::all_in(torch::kCPU, torch::kFloat32));
  }
  save_causal_lm(*model, out, options);
  return {{"adapter", false}};
}

// Instruction models see a prompt as fine-tuning showed it (BOS, prompt, end of prompt); text models
// continue the text after the BOS. Each answer prints as a JSON line.
train::TextFraming CausalLmApp::text_framing() {
  auto tokenizer = std::make_shared<io::BpeTokenizer>(load_tokenizer(config_, settings_.data));
  const io::InstructionFormat format = instruction_format(config_, settings_.data, *tokenizer, settings_.model);
  const bool instructions = settings_.data.instructions;
  train::TextFraming framing;
  framing.encode = [tokenizer, format, instructions](const std::string& prompt) {
    return instructions ? io::prompt_tokens(prompt, *tokenizer, format) : io::make_example({{prompt, false}}, *tokenizer, format).tokens;
  };
  framing.print = [tokenizer, eos = format.eos](size_t, const std::string& prompt, const std::vector<int64_t>& produced) {
    std::vector<int64_t> answer = produced;
    if (!answer.empty() && answer.back() == eos) answer.pop_back();
    // A sample may end inside a character (byte-level BPE): printed as U+FFFD, as transformers decodes it.
    std::cout << nlohmann::json{{"prompt", prompt}, {"output", text::replace_invalid_utf8(tokenizer->decode(answer))}}.dump()
              << std::endl;
  };
  framing.stop_tokens = format.stop_tokens();
  framing.vocab_limit = tokenizer->vocab_size();
  framing.decode = [tokenizer](const std::vector<int64_t>& ids) { return tokenizer->decode(ids); };
  return framing;
}

namespace {

// kuafu-opt's model with its own task: fine-tuning on instructions or text.
class OptApp : public CausalLmApp {
 public:
  explicit OptApp(const config::Config& config) : CausalLmApp(config) {}

  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override {
    return opt::make_task(config_, settings_, options, runtime);
  }
  std::string describe(train::RunTask&) override { return settings_.model.describe(); }
  nlohmann::json evaluate(train::RunTask& task, const train::Runtime& runtime) override {
    nlohmann::json line = App::evaluate(task, runtime);
    line["data"] = settings_.data.instructions ? "answers" : "text";
    return line;
  }
};

}  // namespace

std::unique_ptr<train::App> make_opt_app(const config::Config& config) { return std::make_unique<OptApp>(config); }

void prepare_command(const config::Config& config) {
  const OptData data = opt_data(config);
  if (data.instructions) {
    // Nothing to write: examples are tokenized when a run starts. Read them now to report on them.
    make_serial_task(config, torch::kCPU);
    return;
  }
  if (!fs::exists(data.text)) config.fail_at("data.text", "= " + data.text + " does not exist (data/instructions/build.py)");
  std::error_code created;
  fs::create_directories(data.dir, created);
  if (created) config.fail_at("data.dir", "= " + data.dir + ": cannot create the folder: " + created.message());
  const io::BpeTokenizer tokenizer = load_tokenizer(config, data);
  const auto [train_text, val_text] = io::split_text_blocks(data.text, data.val_every);
  const auto vocab = static_cast<uint64_t>(tokenizer.vocab_size());
  const LmShape shape = model_config(config, data);
  // The model's own EOS ends each document (a chat template's end of turn is for conversations); names
  // data.tokenizer when it lacks one.
  const std::string eos = data.eos_after_lines ? tokenizer.decode({special_ids(config, data, tokenizer, shape).eos}) : "";
  auto write = [&](const std::string& path, const std::string& lines) {
    std::string with_eos;
    if (data.eos_after_lines) {
      with_eos.reserve(lines.size() + lines.size() / 16);
      for (char c : lines) {
        if (c == '\n') {
          with_eos += eos;
        } else {
          with_eos += c;
        }
      }
    }
    const std::string& text = data.eos_after_lines ? with_eos : lines;
    const std::vector<int64_t> ids = tokenizer.encode(text);
    io::write_token_file(path, std::vector<uint32_t>(ids.begin(), ids.end()), vocab);
    log::infof("wrote ", path, ": ", ids.size(), " tokens from ", text.size(), " bytes");
  };
  write(data.train_tokens, train_text);
  write(data.val_tokens, val_text);
}

int run_opt_app(int argc, const char* const argv[]) {
  train::AppDefinition app;
  app.program = "kuafu-opt";
  app.description = "OPT or GPT-2 fine-tuning (full or LoRA), evaluation, sampling and Hugging Face export";
  app.schema = opt_schema();
  app.make_app = make_opt_app;
  app.before = {{"prepare", "data.kind = \"text\": token files from data.text; instructions: read and report them",
                 [](const config::Config& config, const config::ParsedCommand&) { prepare_command(config); }}};
  app.train_name = "finetune";
  app.generates = true;
  app.item_help = "random tokens";
  app.export_help = "adapters merged; --adapter: a PEFT adapter folder";
  app.eval_help = "validation loss and perplexity (instructions: of the answers) of a checkpoint";
  app.add_options = train::add_adapter_option;
  return train::run_app(app, argc, argv);
}

}  // namespace kuafu::opt
