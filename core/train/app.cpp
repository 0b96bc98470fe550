#include "core/train/app.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "core/train/checkpoint.h"
#include "core/train/generate_settings.h"
#include "core/train/hf_interop.h"
#include "core/train/model_memory.h"
#include "core/train/model_recipe.h"
#include "core/train/model_state.h"
#include "core/train/runtime.h"
#include "core/train/trainer.h"
#include "core/util/device.h"
#include "core/util/error.h"
#include "core/util/logging.h"
#include "core/util/text.h"
#include "core/util/utf8.h"

namespace kuafu::train {

namespace {

std::string checkpoint_folder(const config::Config& config, const std::string& checkpoint) {
  return checkpoint == "init" ? checkpoint : checkpoint_to_read(read_train_settings(config).out_dir, checkpoint);
}

}  // namespace

std::string load_checkpoint_weights(const config::Config& config, const std::string& checkpoint, torch::nn::Module& model,
                                    const std::string& part) {
  const std::string folder = checkpoint_folder(config, checkpoint);
  if (folder == "init") return folder;
  const std::string ema = ".ema";
  if (part == "ema" || text::ends_with(part, ema)) {
    // A moving average holds the trained parameters only (a LoRA run's adapters): the model's own part
    // first, then the average over its trained parameters.
    CheckpointStore::load_model(folder, model, part == "ema" ? "" : part.substr(0, part.size() - ema.size()));
    io::NamedTensors trained;
    for (const auto& item : model.named_parameters()) {
      if (item.value().requires_grad()) trained.emplace_back(item.key(), item.value());
    }
    CheckpointStore::load_weights(folder, trained, nullptr, part);
  } else {
    CheckpointStore::load_model(folder, model, part);
  }
  return folder;
}

nlohmann::json App::evaluate(RunTask& task, const Runtime& runtime) {
  nlohmann::json line = metrics_line(task, runtime, task.item_name());
  // The default figure (a language model's perplexity) is val_ppl in metrics.jsonl, val_perplexity here.
  if (line.contains("val_ppl")) {
    line["val_perplexity"] = line["val_ppl"];
    line.erase("val_ppl");
  }
  return line;
}

nlohmann::json metrics_line(RunTask& task, const Runtime& runtime, const std::string& items) {
  const LossSum sums = evaluate_task(task, *runtime.mesh->group("data"));
  nlohmann::json line = {{"val_loss", sums.loss_sum / std::max(1.0, sums.count)}, {items, sums.count}};
  for (const EvalMetric& metric : task.eval_metrics(sums)) line[metric.key] = metric.value;
  return line;
}

ModelSize size_of(const std::vector<SizedModel>& models) {
  ModelSize size;
  for (const SizedModel& model : models) {
    size.parameters += model.parameters;
    size.frozen += model.frozen;
    for (const std::string& key : model.keys) {
      if (std::find(size.keys.begin(), size.keys.end(), key) == size.keys.end()) size.keys.push_back(key);
    }
  }
  if (models.size() > 1) size.models = models;
  return size;
}

void check_model_fits(const ModelSize& size, const config::Config& config, const Runtime& runtime) {
  check_model_fits(config, runtime, size.parameters, size.keys, size.frozen, size.models);
}

namespace {

// Evaluation, generation and export make every model whole in float32: refused before building when
// the machine cannot hold them.
void check_whole_weights_fit(const ModelSize& size, const config::Config& config, const torch::Device& device) {
  check_weights_fit(config, device, size.parameters, size.keys);
}

}  // namespace

TrainSummary train_app(App& app, const config::Config& config) {
  Runtime runtime = start_runtime(config);
  check_model_fits(app.model_size(), config, runtime);
  std::unique_ptr<RunTask> task = app.make_task(runtime.model_options(), &runtime);
  if (runtime.is_main()) {
    log::infof(app.describe(*task), "; ", runtime.world->size(), " rank(s) x ", runtime.threads, " thread(s)");
  }
  Trainer trainer(config, runtime, *task);
  const TrainSummary summary = trainer.run();
  if (!summary.stopped_by_signal && summary.steps_done == read_train_settings(config).steps) app.after_training(summary, runtime);
  return summary;
}

void eval_app(App& app, const config::Config& config, const std::string& checkpoint) {
  Runtime runtime = start_runtime(config);
  check_whole_weights_fit(app.model_size(), config, runtime.device);
  // The whole model on this rank's device (checkpoints hold whole tensors), each rank a share of the rows.
  std::unique_ptr<RunTask> task = app.make_task(parallel::ModelOptions::serial_on(runtime.device), nullptr);
  // Every model a checkpoint holds (the frozen ones it does not hold stay as built); a trained model's moving
  // average where its section keeps one (optim.ema_decay), as training's evaluations score it.
  const std::string folder = checkpoint_folder(config, checkpoint);
  for (const RunModel& model : task->models()) {
    if (folder == "init" || !(model.trained || model.saved)) continue;
    const bool averaged = model.trained && section_of(config, model.name).get_float("optim.ema_decay") > 0;
    load_checkpoint_weights(config, checkpoint, *model.module, averaged ? ema_part_of(model.name) : model.name);
  }
  nlohmann::json line = app.evaluate(*task, runtime);
  line["checkpoint"] = folder;
  if (runtime.is_main()) std::cout << line.dump() << std::endl;
}

void generate_app(App& app, const config::Config& config, const std::string& checkpoint, const std::string& prompt) {
  torch::set_num_threads(std::max(1, static_cast<int>(config.get_int("runtime.threads"))));
  const torch::Device device = resolve_device(config.get_string("runtime.device"), 0);
  check_whole_weights_fit(app.built_model_size(), config, device);
  torch::nn::Module& model = app.build_model(device, checkpoint == "init");
  load_checkpoint_weights(config, checkpoint, model, app.model_part());
  GenerateSettings settings = generate_settings(config);
  if (!prompt.empty()) {
    settings.prompts = {prompt};
    settings.prompts_key = "--prompt";
  }
  const TextFraming framing = app.text_framing();
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& text : settings.prompts) {
    KUAFU_CHECK(!text.empty(), settings.prompts_key, " holds an empty prompt");
    ids.push_back(framing.encode(text));
    KUAFU_CHECK(!ids.back().empty(), settings.prompts_key, " \"", text, "\" has no tokens to continue");
  }
  settings.sampling.stop_tokens = framing.stop_tokens;
  settings.sampling.vocab_limit = framing.vocab_limit;
  model.eval();
  const nn::Decoder decoder = app.decoder();
  // Bounded by the context: past it a model would continue from a window of its own text, not the prompt.
  size_t longest = 0;
  for (const auto& p : ids) longest = std::max(longest, p.size());
  const int64_t room = decoder.context - static_cast<int64_t>(longest);
  KUAFU_CHECK(room > 0, settings.prompts_key, " has a prompt of ", longest, " tokens: no room for new ones within the model's ",
              decoder.context, " positions");
  if (settings.sampling.max_new_tokens > room) {
    log::infof("generate.max_new_tokens = ", settings.sampling.max_new_tokens, " bounded to ", room, " by the model's ",
               decoder.context, " positions");
    settings.sampling.max_new_tokens = room;
  }
  // Answers are printed in order as soon as their rows (and the rows before) stop; a lone prompt's text
  // streams to stderr as it comes when that is a terminal (a person watching; scripts read stdout's
  // lines); Ctrl-C (or SIGTERM) stops decoding and prints what every row has so far (exit code 128 +
  // signal).
  const bool stream_to_terminal = ids.size() == 1 && framing.decode && ::isatty(STDERR_FILENO);
  std::vector<std::vector<int64_t>> so_far(ids.size());
  std::vector<bool> stopped(ids.size(), false);
  size_t next_to_print = 0;
  text::Utf8Stream streamed;
  auto print_ready = [&](bool all) {
    for (; next_to_print < ids.size() && (all || stopped[next_to_print]); ++next_to_print) {
      framing.print(next_to_print, settings.prompts[next_to_print], so_far[next_to_print]);
    }
  };
  settings.sampling.on_token = [&](size_t row, int64_t token) {
    so_far[row].push_back(token);
    if (settings.sampling.stops_at(token)) {
      stopped[row] = true;
      print_ready(false);
    } else if (stream_to_terminal) {
      std::cerr << streamed.next(framing.decode(so_far[row])) << std::flush;
    }
  };
  install_stop_signals();
  settings.sampling.interrupted = [] { return stop_requested(); };
  nn::generate(decoder, ids, settings.sampling);
  if (streamed.started()) std::cerr << std::endl;
  print_ready(/*all=*/true);
}

void export_app(App& app, const config::Config& config, const config::ParsedCommand& command) {
  const std::string out = command.option("out");
  KUAFU_CHECK(!out.empty(), "export needs --out DIR (a new folder)");
  const std::string checkpoint = command.option("checkpoint");
  check_whole_weights_fit(app.built_model_size(), config, torch::kCPU);
  torch::nn::Module& model = app.build_model(torch::kCPU, checkpoint == "init");
  const std::string folder = load_checkpoint_weights(config, checkpoint, model, app.model_part());
  nlohmann::json line = app.export_model(out, export_options(config), command);
  line["checkpoint"] = folder;
  line["exported"] = out;
  std::cout << line.dump() << std::endl;
}

void benchmark_app(App& app, const config::Config& config) {
  // The benchmark steps every rank's whole model (data parallelism, memory strategies): a config that
  // cuts the model over ranks is refused rather than timed as something it is not.
  if (config.schema().find("parallel.tensor.mode") && config.get_string("parallel.tensor.mode") != "none") {
    config.fail_at("parallel.tensor.mode", "is \"" + config.get_string("parallel.tensor.mode") + "\": `benchmark` times "
                   "the whole model on every rank; tensor parallelism's figures come from benchmarks/tensor_parallel_comm.sh and a `train` run's metrics");
  }
  if (config.get_int("parallel.pipeline") > 1) {
    config.fail_at("parallel.pipeline", "is " + std::to_string(config.get_int("parallel.pipeline")) + ": `benchmark` times "
                   "the whole model on every rank; pipeline figures come from benchmarks/pipeline_bubble and a `train` run's metrics");
  }
  Runtime runtime = start_runtime(config);
  check_model_fits(app.benchmark_size(), config, runtime);
  BenchmarkMemory memory(runtime.device);  // before any model state
  torch::manual_seed(read_train_settings(config).seed);
  app.build_benchmark_model(runtime);
  const nlohmann::json line = app.benchmark(runtime, memory);
  if (runtime.is_main()) std::cout << line.dump() << std::endl;
}

int run_app(const AppDefinition& app, int argc, const char* const argv[]) {
  using Command = config::ParsedCommand;
  using Config = config::Config;
  const auto with_app = [&app](std::function<void(App&, const Config&, const Command&)> body) -> AppCommand {
    return [&app, body](const Config& config, const Command& command) { body(*app.make_app(config), config, command); };
  };
  std::vector<AppCommandSpec> commands = app.before;
  commands.push_back({app.train_name, "train (resumes from the latest checkpoint in train.out_dir)",
                      with_app([](App& a, const Config& c, const Command&) { train_app(a, c); })});
  commands.push_back({"eval", app.eval_help,
                      with_app([](App& a, const Config& c, const Command& cmd) { eval_app(a, c, cmd.option("checkpoint")); })});
  if (app.generates) {
    commands.push_back({"generate", "continue prompts with a checkpoint's model", with_app([](App& a, const Config& c, const Command& cmd) {
                          generate_app(a, c, cmd.option("checkpoint"), cmd.option("prompt"));
                        })});
  }
  commands.push_back({"export", "a checkpoint as a Hugging Face folder (" + app.export_help + ")",
                      with_app([](App& a, const Config& c, const Command& cmd) { export_app(a, c, cmd); })});
  commands.push_back({"benchmark", "time training steps on " + app.item_help + "; prints one JSON line",
                      with_app([](App& a, const Config& c, const Command&) { benchmark_app(a, c); })});

  config::CommandLine cli(app.program, app.description);
  std::map<std::string, AppCommand> bodies;
  for (const AppCommandSpec& command : commands) {
    cli.subcommand(command.name, command.help);
    bodies[command.name] = command.run;
  }
  for (const std::string& sub : {std::string("eval"), std::string("generate"), std::string("export")}) {
    if (bodies.count(sub)) {
      cli.option(sub, "checkpoint", "DIR", "",
                 "checkpoint folder (default: the latest in train.out_dir; \"init\": the starting weights)");
    }
  }
  if (app.generates) cli.option("generate", "prompt", "TEXT", "", "a prompt (default: generate.prompt / generate.prompts)");
  cli.option("export", "out", "DIR", "", "the new folder to write");
  if (app.add_options) app.add_options(cli);

  return run_app_command(app.program, [&] {
    const Command command = cli.parse(argc, argv);
    if (command.help) {
      std::cout << (command.subcommand.empty() ? cli.help() : cli.help(command.subcommand));
      return;
    }
    const auto found = bodies.find(command.subcommand);
    KUAFU_CHECK(found != bodies.end(), app.program, " declares subcommand \"", command.subcommand, "\" but has no code for it");
    const Config config = Config::load(command.config_path, app.schema, command.overrides);
    if (command.print_config) {
      std::cout << config.to_toml();
      return;
    }
    found->second(config, command);
  });
}

}  // namespace kuafu::train
