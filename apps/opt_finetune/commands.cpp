#include "apps/opt_finetune/commands.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <iostream>

#include "apps/opt_finetune/app_config.h"
#include "apps/opt_finetune/hugging_face.h"
#include "apps/opt_finetune/task.h"
#include "core/config/cli.h"
#include "core/io/text_split.h"
#include "core/io/token_file.h"
#include "core/nn/lora.h"
#include "core/train/app.h"
#include "core/train/benchmark.h"
#include "core/train/checkpoint.h"
#include "core/train/generate_settings.h"
#include "core/train/hf_interop.h"
#include "core/train/model_memory.h"
#include "core/train/peft_adapter.h"
#include "core/train/train_settings.h"
#include "core/util/device.h"
#include "core/util/logging.h"

namespace kuafu::opt {
namespace fs = std::filesystem;
namespace {

// The weights a command reads: a checkpoint (the latest by default), or "init" for the starting ones.
std::string load_weights(const config::Config& config, const std::string& checkpoint, torch::nn::Module& model) {
  if (checkpoint == "init") return "init";
  const std::string folder = train::checkpoint_to_read(train::read_train_settings(config).out_dir, checkpoint);
  train::CheckpointStore::load_model(folder, model);
  return folder;
}

void check_model_fits(const config::Config& config, const train::Runtime& runtime) {
  train::check_model_fits(config, runtime, static_cast<double>(model_config(config).parameter_count()),
                          {"model.shape", "model.hidden_size", "model.num_hidden_layers"});
}

// The tokenizer's files that travel with an export, so the folder is a whole model.
std::vector<std::string> tokenizer_files(const config::Config& config) {
  std::vector<std::string> files;
  const std::string dir = opt_data(config).tokenizer;
  if (dir.empty()) return files;
  for (const char* name : {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    if (fs::is_regular_file(fs::path(dir) / name)) files.push_back((fs::path(dir) / name).string());
  }
  return files;
}

}  // namespace

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
  const io::BpeTokenizer tokenizer = load_tokenizer(config);
  const auto [train_text, val_text] = io::split_text_blocks(data.text, data.val_every);
  const auto vocab = static_cast<uint64_t>(tokenizer.vocab_size());
  if (data.eos_after_lines) instruction_format(config, tokenizer);  // names data.tokenizer when it lacks </s>
  auto write = [&](const std::string& path, const std::string& lines) {
    std::string with_eos;
    if (data.eos_after_lines) {
      with_eos.reserve(lines.size() + lines.size() / 16);
      for (char c : lines) {
        if (c == '\n') {
          with_eos += "</s>";
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

train::TrainSummary finetune_command(const config::Config& config) {
  train::Runtime runtime = train::start_runtime(config);
  check_model_fits(config, runtime);
  std::unique_ptr<OptTask> task = make_task(config, runtime);
  if (runtime.is_main()) {
    const OPTConfig& m = task->opt()->config;
    log::infof("OPT: ", m.num_hidden_layers, " layers, ", m.num_attention_heads, " heads, hidden ", m.hidden_size,
               ", vocabulary ", m.vocab_size, ", ", static_cast<double>(m.parameter_count()) / 1e6, "M parameters; ",
               runtime.world->size(), " rank(s) x ", runtime.threads, " thread(s)");
  }
  train::Trainer trainer(config, runtime, *task);
  return trainer.run();
}

void eval_command(const config::Config& config, const std::string& checkpoint) {
  train::Runtime runtime = train::start_runtime(config);
  std::unique_ptr<OptTask> task = make_serial_task(config, runtime.device);
  const std::string folder = load_weights(config, checkpoint, task->model());
  const train::LossSum sums = train::evaluate_task(*task, *runtime.mesh->group("data"));
  const double loss = sums.loss_sum / std::max(1.0, sums.count);
  if (runtime.is_main()) {
    std::cout << nlohmann::json{{"checkpoint", folder}, {"data", opt_data(config).instructions ? "answers" : "text"},
                                {"val_loss", loss}, {"val_perplexity", std::exp(loss)}, {"tokens", sums.count}}
                     .dump()
              << std::endl;
  }
}

void generate_command(const config::Config& config, const std::string& checkpoint, const std::string& prompt_text) {
  torch::set_num_threads(std::max(1, static_cast<int>(config.get_int("runtime.threads"))));
  const io::BpeTokenizer tokenizer = load_tokenizer(config);
  const io::InstructionFormat format = instruction_format(config, tokenizer);
  OPTForCausalLM model = build_model(config, parallel::TensorParallel::serial_on(resolve_device(config.get_string("runtime.device"), 0)));
  load_weights(config, checkpoint, *model);
  train::GenerateSettings settings = train::generate_settings(config);
  if (!prompt_text.empty()) {
    settings.prompts = {prompt_text};
    settings.prompts_key = "--prompt";
  }
  // Instruction models see a prompt as fine-tuning showed it (BOS, prompt, end of prompt); text models
  // continue the text after the BOS.
  const bool instructions = opt_data(config).instructions;
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& prompt : settings.prompts) {
    KUAFU_CHECK(!prompt.empty(), settings.prompts_key, " holds an empty prompt");
    ids.push_back(io::make_example({{instructions ? prompt + format.prompt_end : prompt, false}}, tokenizer, format).tokens);
  }
  settings.sampling.stop_token = format.eos;
  settings.sampling.vocab_limit = tokenizer.vocab_size();
  model->eval();
  const std::vector<std::vector<int64_t>> produced = nn::generate(decoder(model), ids, settings.sampling);
  for (size_t r = 0; r < settings.prompts.size(); ++r) {
    std::vector<int64_t> answer = produced[r];
    if (!answer.empty() && answer.back() == format.eos) answer.pop_back();
    std::cout << nlohmann::json{{"prompt", settings.prompts[r]}, {"output", tokenizer.decode(answer)}}.dump() << std::endl;
  }
}

void export_command(const config::Config& config, const std::string& checkpoint, const std::string& out, bool adapter) {
  KUAFU_CHECK(!out.empty(), "export needs --out DIR (a new folder)");
  OPTForCausalLM model = build_model(config, parallel::TensorParallel::serial_on(torch::kCPU));
  const std::string folder = load_weights(config, checkpoint, *model);
  const std::optional<nn::LoraSpec> lora = train::lora_spec(config);
  if (adapter) {
    KUAFU_CHECK(lora, "export --adapter writes LoRA adapters, but lora.rank = 0 in ", config.path());
    train::export_adapter(*model, *lora, out, train::init_from(config));
  } else {
    io::HfWriteOptions options = train::export_options(config);
    options.extra_files = tokenizer_files(config);
    if (lora) {
      // The adapters folded into the weights: a plain OPT with the adapted model's outputs.
      OPTForCausalLM merged(model->config);
      train::copy_named_weights(nn::merged_lora_weights(*model, *lora), *merged);
      model = merged;
    }
    export_hf_opt(model, out, options);
  }
  std::cout << nlohmann::json{{"checkpoint", folder}, {"exported", out}, {"adapter", adapter}}.dump() << std::endl;
}

void benchmark_command(const config::Config& config) {
  train::Runtime runtime = train::start_runtime(config);
  check_model_fits(config, runtime);
  train::BenchmarkMemory memory(runtime.device);  // before any model state
  OPTForCausalLM model = build_model(config, parallel::TensorParallel::serial_on(runtime.device));
  const OPTConfig& m = model->config;
  const int64_t context = opt_data(config).context;
  train::BenchmarkSpec spec;
  spec.app = "opt";
  spec.flops_per_item = m.flops_per_token(context);
  spec.parameters = m.parameter_count();
  spec.fields = {{"lora_rank", config.get_int("lora.rank")}};
  const nlohmann::json line = train::benchmark_language_model(config, runtime, *model, m.vocab_size, context, spec, memory);
  if (runtime.is_main()) std::cout << line.dump() << std::endl;
}

int run_opt_app(int argc, const char* const argv[]) {
  config::CommandLine cli("kuafu-opt", "OPT fine-tuning (full or LoRA), evaluation, sampling and Hugging Face export");
  cli.subcommand("prepare", "data.kind = \"text\": token files from data.text; instructions: read and report them")
      .subcommand("finetune", "train (resumes from the latest checkpoint in train.out_dir)")
      .subcommand("eval", "validation loss and perplexity (instructions: of the answers) of a checkpoint")
      .subcommand("generate", "answer prompts (or continue text) from a checkpoint")
      .subcommand("export", "a checkpoint as a Hugging Face folder (adapters merged), or --adapter as a PEFT folder")
      .subcommand("benchmark", "time training steps on random tokens; prints one JSON line");
  for (const char* sub : {"eval", "generate", "export"}) {
    cli.option(sub, "checkpoint", "DIR", "", "checkpoint folder (default: the latest in train.out_dir; \"init\": the starting weights)");
  }
  cli.option("generate", "prompt", "TEXT", "", "a prompt (default: generate.prompt / generate.prompts)");
  cli.option("export", "out", "DIR", "", "the new folder to write");
  cli.flag("export", "adapter", "write only the LoRA adapters, as PEFT's adapter_config.json + adapter_model.safetensors");
  using Command = config::ParsedCommand;
  return train::run_app(
      "kuafu-opt", cli, opt_schema(),
      {{"prepare", [](const config::Config& c, const Command&) { prepare_command(c); }},
       {"finetune", [](const config::Config& c, const Command&) { finetune_command(c); }},
       {"eval", [](const config::Config& c, const Command& cmd) { eval_command(c, cmd.option("checkpoint")); }},
       {"generate",
        [](const config::Config& c, const Command& cmd) { generate_command(c, cmd.option("checkpoint"), cmd.option("prompt")); }},
       {"export",
        [](const config::Config& c, const Command& cmd) {
          export_command(c, cmd.option("checkpoint"), cmd.option("out"), cmd.flag("adapter"));
        }},
       {"benchmark", [](const config::Config& c, const Command&) { benchmark_command(c); }}},
      argc, argv);
}

}  // namespace kuafu::opt
