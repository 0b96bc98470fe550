#include "core/train/benchmark.h"

#include <algorithm>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "core/ops/attention_kernels.h"
#include "core/ops/cpu_blas.h"
#include "core/train/held_model.h"
#include "core/train/model_state.h"
#include "core/train/step_profile.h"
#include "core/util/cuda_graph.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::train {

void add_benchmark_schema(config::Schema& s) {
  s.add_int("benchmark.steps", 10, "timed training steps").min(1);
  s.add_int("benchmark.warmup", 2, "untimed steps first").min(0);
  s.add_int("benchmark.profile_steps", 0,
            "after the timed steps, this many more under the profiler: the line gains \"profile\", each step's "
            "time by kind of work and its largest kernels (GPU) or operators (CPU); 0: none")
      .min(0).max(100);
  s.add_bool("benchmark.cuda_graphs", false,
             "time the training step captured once as a CUDA graph and replayed: a CUDA device, memory.strategy "
             "\"none\" on one process, bf16 or fp32, AdamW or Adam, no moving average");
  s.add_string("benchmark.checkpoint_dir", "",
               "after the timed steps, save a checkpoint of the models under this folder and load it back, "
               "timing both and metering their memory; \"\" = none");
}

namespace {
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t folder_bytes(const std::filesystem::path& folder) {
  int64_t bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(folder)) {
    if (entry.is_regular_file()) bytes += static_cast<int64_t>(entry.file_size());
  }
  return bytes;
}

// benchmark.checkpoint_dir: one checkpoint of every model saved there (as the trainer saves one) and
// loaded back; the seconds and the peak memory in use of each, beside the steps' own figures.
nlohmann::json time_checkpoint(const config::Config& config, const Runtime& runtime,
                               const std::vector<BenchmarkedModel>& models, BenchmarkMemory& memory) {
  const std::string root = config.get_string("benchmark.checkpoint_dir");
  CheckpointStore store(root, runtime.world->world_group(), /*keep=*/1);
  const int64_t step = config.get_int("benchmark.warmup") + config.get_int("benchmark.steps");
  memory.start_phase();
  const auto save_start = std::chrono::steady_clock::now();
  std::vector<CheckpointPart> parts;
  nlohmann::json trainer_state = nlohmann::json::object();
  for (const BenchmarkedModel& m : models) {
    for (CheckpointPart& part : m.state->checkpoint_parts()) parts.push_back(std::move(part));
  }
  // train.async_save: training would go on once save_async returns (it copies the state to host memory
  // and starts the writer); the save ends when the writer has and the checkpoint is sealed.
  const bool async = config.get_bool("train.async_save");
  double blocking_s = 0;
  if (async) {
    store.save_async(step, parts, trainer_state);
    blocking_s = seconds_since(save_start);
    parts.clear();
    store.finish_pending();
  } else {
    store.save(step, parts, trainer_state);
    parts.clear();
  }
  const double save_s = seconds_since(save_start);
  const double save_peak = memory.phase_peak_mb();
  const std::string folder = checkpoint_folder(root, step);
  memory.start_phase();
  const auto load_start = std::chrono::steady_clock::now();
  const uint64_t read_before = io::tensor_bytes_read();
  const nlohmann::json saved_state = CheckpointStore::read_trainer_state(folder);
  for (const BenchmarkedModel& m : models) m.state->load(folder, saved_state);
  return {{"checkpoint_save_s", save_s},
          {"checkpoint_load_read_mb", mib(static_cast<int64_t>(io::tensor_bytes_read() - read_before))},  // this rank's
          {"checkpoint_save_blocking_s", async ? blocking_s : save_s},
          {"checkpoint_save_peak_in_use_mb", save_peak},
          {"checkpoint_load_s", seconds_since(load_start)},
          {"checkpoint_load_peak_in_use_mb", memory.phase_peak_mb()},
          {"checkpoint_mb", mib(folder_bytes(folder))}};
}

// An environment variable's value, "" when unset.
std::string environment_value(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// The line's "mkl_kernels": how MKL was answered when it picked its kernels.
std::string mkl_kernels_name() {
  const std::optional<ops::MklKernels> kernels = ops::mkl_kernels_in_use();
  if (!kernels) return "unused";
  return *kernels == ops::MklKernels::kByVendor ? "vendor" : "instruction_set";
}

// benchmark.cuda_graphs: what replays the step, once every model's step can run on the device; null when off.
std::unique_ptr<CapturedStep> captured_step(const config::Config& config, const Runtime& runtime,
                                            const std::vector<BenchmarkedModel>& models) {
  const std::string key = "benchmark.cuda_graphs";
  if (!config.get_bool(key)) return nullptr;
  if (!runtime.device.is_cuda()) config.fail_at(key, "captures the step on a CUDA device; this run's is " + runtime.device.str());
  for (const BenchmarkedModel& m : models) {
    if (const auto refusal = m.state->device_step_refusal()) {
      config.fail_at(key, "cannot capture " + (m.name.empty() ? std::string("the model") : m.name) + "'s step: " + *refusal);
    }
  }
  return std::make_unique<CapturedStep>(runtime.device);
}
}  // namespace

BenchmarkMemory::BenchmarkMemory(const torch::Device& device)
    : device_(device),
      resident_before_(memory::resident_bytes()),
      in_use_before_(memory::bytes_in_use(device)),
      peak_in_use_(device) {}

void BenchmarkMemory::start_steps() {
  setup_peak_in_use_ = peak_in_use_.peak();
  setup_peak_bytes_ = memory::peak_bytes(device_);
  peak_in_use_.restart();
}

void BenchmarkMemory::start_phase() { peak_in_use_.restart(); }

double BenchmarkMemory::phase_peak_mb() const { return mib(peak_in_use_.peak()); }

nlohmann::json BenchmarkMemory::figures() const {
  const int64_t steps_in_use = peak_in_use_.peak();
  return {{"peak_mem_mb", mib(std::max(setup_peak_bytes_, memory::peak_bytes(device_)))},
          {"resident_before_model_mb", mib(resident_before_)},
          // allocated, not what the allocator keeps for reuse
          {"peak_in_use_mb", mib(std::max(setup_peak_in_use_, steps_in_use))},
          {"steps_peak_in_use_mb", mib(steps_in_use)},
          {"setup_peak_in_use_mb", mib(setup_peak_in_use_)},
          {"in_use_before_model_mb", mib(in_use_before_)}};
}

nlohmann::json benchmark_training(const config::Config& config, const Runtime& runtime, hooks::BlockModel& model,
                                  const Batch& batch, const BenchmarkSpec& spec, BenchmarkMemory& memory) {
  ParallelOptions options;
  options.checkpoint_activations = config.get_bool("memory.activation_checkpointing");
  options.checkpoint_blocks = config.get_string_list("memory.checkpoint_blocks");
  ParallelModel runner(model, options);
  // A model of named features (no inputs) takes a batch of one example.
  const int64_t rows = batch.inputs.defined() ? batch.inputs.size(0) : 1;
  return benchmark_training(config, runtime, model, [&] { return runner.loss(batch); }, rows, spec, memory);
}

nlohmann::json benchmark_training(const config::Config& config, const Runtime& runtime, hooks::SiteModel& model,
                                  const std::function<torch::Tensor()>& loss, int64_t rows, const BenchmarkSpec& spec,
                                  BenchmarkMemory& memory) {
  ModelStateOptions state_options;
  state_options.set_block_hooks = [&model](hooks::BlockHooks* hooks) {
    model.set_block_hooks(hooks);
    return true;
  };
  state_options.deferred = spec.deferred;
  ModelState state(config, runtime, model.module(), std::move(state_options));
  return benchmark_models(config, runtime, {{"", &state}}, [&] { return std::vector<torch::Tensor>{loss()}; }, rows, spec,
                          memory);
}

nlohmann::json benchmark_models(const config::Config& config, const Runtime& runtime,
                                const std::vector<BenchmarkedModel>& models,
                                const std::function<std::vector<torch::Tensor>()>& losses, int64_t rows,
                                const BenchmarkSpec& spec, BenchmarkMemory& memory) {
  KUAFU_CHECK(!models.empty(), "benchmark_models: no model to train");
  ModelState& first = *models.front().state;
  const double matmul_flops = measure_matmul_flops(runtime.device, first.compute_dtype());
  memory.start_steps();
  if (spec.before_steps) spec.before_steps();
  // Every model's step, as training steps; `on_device`: the step a CUDA graph captures, nothing read on the host.
  auto train_step = [&](bool on_device) {
    for (const BenchmarkedModel& m : models) m.state->begin_backward(/*last=*/true);
    const std::vector<torch::Tensor> each = losses();
    KUAFU_CHECK(each.size() == models.size(), "benchmark_models: ", each.size(), " losses for ", models.size(), " models");
    torch::Tensor total;
    for (size_t i = 0; i < models.size(); ++i) {
      const torch::Tensor scaled = each[i] * models[i].state->loss_scale();
      total = total.defined() ? total + scaled : scaled;
    }
    total.backward();
    for (const BenchmarkedModel& m : models) {
      m.state->end_backward();
      if (on_device) {
        m.state->finish_step_on_device(m.state->grad_clip());
      } else {
        m.state->finish_step(m.state->grad_norm(), m.state->grad_clip(), /*overflow=*/false);
      }
    }
    return total.detach();
  };
  std::unique_ptr<CapturedStep> graph = captured_step(config, runtime, models);
  const std::function<void()> step = [&] {
    if (!graph) {
      train_step(/*on_device=*/false);
      return;
    }
    for (const BenchmarkedModel& m : models) m.state->prepare_device_step();
    graph->run([&] { return train_step(/*on_device=*/true); });  // captured at the first step, replayed after
  };
  // Seconds figures (a disk tier's reading, writing and waiting) per step: their growth over the steps timed and
  // the warm-up ones, apart from what building the model took.
  std::map<std::string, double> seconds_before;
  for (const BenchmarkedModel& m : models) {
    for (const auto& [name, value] : m.state->memory_figures())
      if (text::ends_with(name, "_s")) seconds_before[(m.name.empty() ? name : m.name + "." + name)] = value;
  }
  const int64_t warmup = config.get_int("benchmark.warmup"), timed = config.get_int("benchmark.steps");
  ops::record_attention_kernels(true);
  const StepTimes times = time_steps(step, warmup, timed, runtime.device);
  ops::record_attention_kernels(false);
  const double items_per_s = static_cast<double>(rows * spec.items_per_row) / times.median;
  const HeldModel& held = held_model(config);
  nlohmann::json line = {
      {"app", spec.app},
      {"config", config.path()},
      {"parameters", spec.parameters},
      {"batch", rows},
      {"threads", runtime.threads},
      {"precision", held.precision},
      {"optimizer", first.optimizer().name()},
      {"memory_strategy", held.strategy},
      {"activation_checkpointing", config.get_bool("memory.activation_checkpointing")},
      // runtime.attention_backend, and the kernels the steps' attention ran ("products": Kuafu's own)
      {"attention_backend", ops::chosen_attention_backend()},
      {"attention_kernels", ops::attention_kernels_seen()},
      {"cuda_graphs", graph != nullptr},
      // runtime.mkl_kernels as MKL took it at its first call ("unused": no MKL call in this process)
      {"mkl_kernels", mkl_kernels_name()},
      // libgomp's waits as this process started with them (openmp_env.h; "" when unset)
      {"omp_wait_policy", environment_value("OMP_WAIT_POLICY")},
      {"gomp_spincount", environment_value("GOMP_SPINCOUNT")},
      {"step_time_ms_median", times.median * 1e3},
      {"step_time_ms_min", times.min * 1e3},
      {"step_time_ms_max", times.max * 1e3},
      {spec.item_name + "_per_s", items_per_s},
      {"model_tflops", spec.flops_per_item * items_per_s / 1e12},
      {"matmul_gflops", matmul_flops / 1e9},
      {"mfu", spec.flops_per_item * items_per_s / matmul_flops},
  };
  line.update(memory.figures());
  line.update(spec.fields);
  if (held.sharded()) line["memory_placement"] = held.strategy == "gemini" ? config.get_string("memory.placement") : "";
  for (const BenchmarkedModel& m : models) {
    for (const auto& [name, value] : m.state->memory_figures()) {
      const std::string key = m.name.empty() ? name : m.name + "." + name;
      line[key] = value;
      if (const auto before = seconds_before.find(key); before != seconds_before.end())
        line[key + "_per_step"] = (value - before->second) / static_cast<double>(warmup + timed);
    }
  }
  if (const int64_t profiled = config.get_int("benchmark.profile_steps"); profiled > 0) {
    line["profile"] = profile_steps(step, profiled, runtime.device);
  }
  if (!config.get_string("benchmark.checkpoint_dir").empty()) line.update(time_checkpoint(config, runtime, models, memory));
  return line;
}

nlohmann::json benchmark_language_model(const config::Config& config, const Runtime& runtime, hooks::BlockModel& model,
                                        int64_t vocab, int64_t context, BenchmarkSpec spec, BenchmarkMemory& memory) {
  const torch::Tensor tokens = torch::randint(vocab, {config.get_int("train.micro_batch_size"), context + 1},
                                              torch::TensorOptions(torch::kInt64).device(runtime.device));
  int64_t trainable = 0;
  for (const auto& p : model.module().parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  spec.item_name = "tokens";
  spec.items_per_row = context;
  spec.fields["context"] = context;
  spec.fields["trainable_parameters"] = trainable;
  return benchmark_training(config, runtime, model, {tokens.narrow(1, 0, context), tokens.narrow(1, 1, context)}, spec,
                            memory);
}

}  // namespace kuafu::train
