#include "core/train/benchmark.h"

#include "core/train/model_state.h"

namespace kuafu::train {

void add_benchmark_schema(config::Schema& s) {
  s.add_int("benchmark.steps", 10, "timed training steps").min(1);
  s.add_int("benchmark.warmup", 2, "untimed steps first").min(0);
}

namespace {
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
}  // namespace

BenchmarkMemory::BenchmarkMemory(const torch::Device& device)
    : device_(device),
      resident_before_(memory::resident_bytes()),
      in_use_before_(memory::bytes_in_use(device)),
      peak_in_use_(device) {}

nlohmann::json BenchmarkMemory::figures() const {
  return {{"peak_mem_mb", mib(memory::peak_bytes(device_))},
          {"resident_before_model_mb", mib(resident_before_)},
          {"peak_in_use_mb", mib(peak_in_use_.peak())},  // allocated, not what the allocator keeps for reuse
          {"in_use_before_model_mb", mib(in_use_before_)}};
}

nlohmann::json benchmark_training(const config::Config& config, const Runtime& runtime, hooks::BlockModel& model,
                                  const Batch& batch, const BenchmarkSpec& spec, const BenchmarkMemory& memory) {
  ParallelOptions options;
  options.checkpoint_activations = config.get_bool("memory.activation_checkpointing");
  ParallelModel runner(model, options);
  ModelStateOptions state_options;
  state_options.set_block_hooks = [&runner](hooks::BlockHooks* hooks) {
    runner.set_block_hooks(hooks);
    return true;
  };
  ModelState state(config, runtime, model.module(), std::move(state_options));
  const double matmul_flops = measure_matmul_flops(runtime.device, state.compute_dtype());
  auto step = [&] {
    state.begin_backward(/*last=*/true);
    (runner.loss(batch) * state.loss_scale()).backward();
    state.end_backward();
    state.finish_step(state.grad_norm(), /*max_norm=*/0.0, /*overflow=*/false);
  };
  const StepTimes times = time_steps(step, config.get_int("benchmark.warmup"), config.get_int("benchmark.steps"), runtime.device);
  const int64_t rows = batch.inputs.size(0);
  const double items_per_s = static_cast<double>(rows * spec.items_per_row) / times.median;
  const std::string strategy = config.get_string("memory.strategy");
  nlohmann::json line = {
      {"app", spec.app},
      {"config", config.path()},
      {"parameters", spec.parameters},
      {"batch", rows},
      {"threads", runtime.threads},
      {"precision", config.get_string("precision.dtype")},
      {"optimizer", state.optimizer().name()},
      {"memory_strategy", strategy},
      {"activation_checkpointing", options.checkpoint_activations},
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
  if (strategy != "none") {
    line["memory_placement"] = strategy == "gemini" ? config.get_string("memory.placement") : "";
    for (const auto& [name, value] : state.memory_figures()) line[name] = value;
  }
  return line;
}

}  // namespace kuafu::train
