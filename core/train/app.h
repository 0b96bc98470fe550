// The skeleton every app stands on. An app declares its program (name, schema, its own commands such as
// `prepare`, whether it generates text) and an App: its settings, read once from the config when a
// command starts, and what only it knows (its task, its model, its Hugging Face folder, its figures).
// The skeleton gives the command line, --help, --print-config, errors reported as
// "<program>: error: ..." with exit code 1 (128 + the signal after a stop by SIGINT/SIGTERM), and the
// bodies of train, eval, generate, export and benchmark.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/cli.h"
#include "core/config/config.h"
#include "core/io/hf_folder.h"
#include "core/nn/generation.h"
#include "core/train/benchmark.h"
#include "core/train/model_memory.h"
#include "core/train/model_task.h"

namespace kuafu::train {

// The configured model's size, for check_model_fits: its parameters and the keys that set them. An app
// of several models (RLHF's PPO) lists each in `models`, counted as its own config section holds it.
struct ModelSize {
  double parameters = 0;
  std::vector<std::string> keys = {};
  double frozen = 0;  // of the parameters, those that do not train (a LoRA run's base model)
  std::vector<SizedModel> models = {};  // empty: the one model above
};

// The size of a run of `models` (each declared by its recipe: train::sized): one is checked alone, several
// each from its own section; their keys are named together.
ModelSize size_of(const std::vector<SizedModel>& models);

// Text generation as an app frames it: a prompt's token ids, the run's stop tokens and vocabulary, and
// how a row's new tokens are printed.
struct TextFraming {
  std::function<std::vector<int64_t>(const std::string& prompt)> encode;
  std::function<void(size_t row, const std::string& prompt, const std::vector<int64_t>& produced)> print;
  std::vector<int64_t> stop_tokens;  // a row ends at any of these
  int64_t vocab_limit = 0;  // 0: the model's whole vocabulary
  // A row's tokens as bytes (for streaming a lone prompt's answer as it comes); may be null.
  std::function<std::string(const std::vector<int64_t>& tokens)> decode;
};

// What an app tells the skeleton. One is made per command from the loaded config.
class App {
 public:
  virtual ~App() = default;

  // The sizes of the models a run makes (train, eval), for the fit check.
  virtual ModelSize model_size() = 0;
  // Of build_model's model (generate, export) and of the benchmark's models: by default the run's.
  virtual ModelSize built_model_size() { return model_size(); }
  virtual ModelSize benchmark_size() { return model_size(); }
  // The task built with `options` (its cuts and device): with `runtime`, laid out on its mesh (training:
  // pipeline stages, sequence parallelism, checkpointing); without, whole on options.device (evaluation).
  // An app with one model gives a TrainTask (a ModelTask); one with several (RLHF) a RunTask.
  virtual std::unique_ptr<RunTask> make_task(const parallel::ModelOptions& options, const Runtime* runtime) = 0;
  // A line about the model for the start of training ("GPT-2: 12 layers, ...").
  virtual std::string describe(RunTask& task) = 0;
  // After a training run that was not stopped early, on every rank (e.g. a figure to compare with).
  virtual void after_training(const TrainSummary& /*summary*/, const Runtime& /*runtime*/) {}

  // eval's figures of `task` (weights loaded), summed over the data ranks: by default metrics_line's with
  // the task's items (a language model's perplexity named val_perplexity).
  virtual nlohmann::json evaluate(RunTask& task, const Runtime& runtime);

  // The whole model on `device` with the run's shape and adapters, held by the App; export, generate and
  // benchmark use it. `starting_weights`: with model.init_from's weights; false when a checkpoint's
  // replace them or the values do not matter (benchmark), so the folder is not read for nothing.
  virtual torch::nn::Module& build_model(const torch::Device& device, bool starting_weights) = 0;
  // The checkpoint part build_model's model is ("" for an app's one model; RLHF's policy: "actor").
  virtual std::string model_part() const { return ""; }
  // Writes the built model (checkpoint loaded) as the new Hugging Face folder `out`; returns what export
  // prints besides the checkpoint and the folder.
  virtual nlohmann::json export_model(const std::string& out, io::HfWriteOptions options,
                                      const config::ParsedCommand& command) = 0;
  // The model `benchmark` trains, held by the App: by default build_model's on runtime.device, without
  // starting weights. An app that builds lazily leaves it described under ZeRO and Gemini and hands
  // its DeferredWeights to the benchmark (BenchmarkSpec::deferred).
  virtual void build_benchmark_model(const Runtime& runtime) { build_model(runtime.device, /*starting_weights=*/false); }
  // The benchmark line of the built model (on runtime.device) under the run's strategies.
  virtual nlohmann::json benchmark(const Runtime& runtime, BenchmarkMemory& memory) = 0;
  // Only for apps whose program generates: how prompts become tokens and tokens text, and the built
  // model as generation drives it.
  virtual TextFraming text_framing() { fail("this app does not generate text"); }
  virtual nn::Decoder decoder() { fail("this app does not generate text"); }
};

using AppFactory = std::function<std::unique_ptr<App>(const config::Config& config)>;
// A subcommand's work, given the loaded config and the parsed command line (its options).
using AppCommand = std::function<void(const config::Config& config, const config::ParsedCommand& command)>;

struct AppCommandSpec {
  std::string name, help;
  AppCommand run;
};

struct AppDefinition {
  std::string program, description;
  config::Schema schema;
  AppFactory make_app;
  std::vector<AppCommandSpec> before;  // the app's own commands, listed first (e.g. prepare)
  std::string train_name = "train";    // e.g. "finetune"
  std::string item_help;               // what `benchmark` times on, e.g. "random tokens"
  std::string export_help;             // who loads an exported folder
  std::string eval_help = "validation loss and perplexity of a checkpoint";
  bool generates = false;              // adds `generate`
  // More options and flags of the shared commands (e.g. export --adapter).
  std::function<void(config::CommandLine& cli)> add_options;
};

// The whole program of an app; returns its exit code.
int run_app(const AppDefinition& app, int argc, const char* const argv[]);

// eval's line of a task that reports its own figures (eval_metrics), summed over the data ranks:
// val_loss, each metric by its key, and the items counted under `items` (e.g. "pairs").
nlohmann::json metrics_line(RunTask& task, const Runtime& runtime, const std::string& items);

// check_model_fits for the models of `size` (the app's model_size() or benchmark_size()).
void check_model_fits(const ModelSize& size, const config::Config& config, const Runtime& runtime);

// The shared command bodies, for tests and for apps that wrap them.
TrainSummary train_app(App& app, const config::Config& config);
void eval_app(App& app, const config::Config& config, const std::string& checkpoint);
void generate_app(App& app, const config::Config& config, const std::string& checkpoint, const std::string& prompt);
void export_app(App& app, const config::Config& config, const config::ParsedCommand& command);
void benchmark_app(App& app, const config::Config& config);

// Loads the weights a command reads into `model` (the checkpoint's `part`): a checkpoint folder, "" for
// the latest in train.out_dir, or "init" for the weights the run starts from (left as built). Returns
// the folder or "init".
std::string load_checkpoint_weights(const config::Config& config, const std::string& checkpoint, torch::nn::Module& model,
                                    const std::string& part = "");

}  // namespace kuafu::train
