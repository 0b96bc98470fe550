#include "core/train/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <iostream>
#include <map>
#include <mutex>
#include <tuple>
#include <thread>

#include "core/ops/attention_kernels.h"
#include "core/ops/cpu_blas.h"
#include "core/ops/fused_kernels.h"
#include "core/train/train_settings.h"
#include "core/util/device.h"
#include "core/util/error.h"
#include "core/util/logging.h"

namespace kuafu::train {

void add_runtime_schema(config::Schema& schema) {
  schema.add_int("runtime.threads", 0, "intra-op threads per rank; 0 = cores on this node / ranks on this node")
      .min(0).max(1024);
  schema.add_string("runtime.device", "auto", "where the model computes: auto (the local rank's GPU when CUDA is "
                                             "available, else the CPU), cpu, cuda (the local rank's GPU), cuda:N");
  schema.add_bool("runtime.fused_loss", true,
                  "language models: the cross-entropy fused with the output layer, in chunks of rows (no float32 "
                  "logits for the whole batch; one kernel per chunk on a GPU); false: the plain logits and loss");
  schema.add_bool("runtime.fused_layer_norm", true,
                  "on a GPU: LayerNorm's forward and backward through Kuafu's kernels (dx and the weight and bias "
                  "gradients in one pass over the rows); false: LibTorch's");
  schema.add_bool("runtime.skinny_linear", true,
                  "on the CPU: products of a few rows (decoding steps, at most 32) streamed through the weights "
                  "once by Kuafu's kernel instead of BLAS (which packs the weights each call); false: BLAS");
  schema.add_bool("runtime.fused_gelu", true,
                  "on the CPU in float32 and bfloat16: the tanh GELU (GPT-2's) through Kuafu's kernels, one exponential "
                  "per value where LibTorch's takes a tanh; false: LibTorch's");
  schema.add_string("runtime.attention_backend", "auto",
                    "LibTorch's attention kernel: auto (the first that takes the inputs, in LibTorch's order; on the CPU "
                    "in bf16 below 512 keys Kuafu's plain products, measured faster), or flash, efficient, cudnn or "
                    "math alone (a run stops where it does not take the inputs). Masks LibTorch's kernels do not take "
                    "(padding, a sliding window, a decoding cache) keep Kuafu's products")
      .choices(ops::attention_backend_names());
  schema.add_string("runtime.cpu_blas", "openblas",
                    "float32 matrix products on the CPU (LibTorch's mm, matmul, attention): openblas (Debian's "
                    "OpenBLAS; faster than the MKL in LibTorch on AMD processors under runtime.mkl_kernels = "
                    "\"vendor\", level with it under \"instruction_set\") or libtorch (that MKL)")
      .choices({"openblas", "libtorch"});
  schema.add_string("runtime.mkl_kernels", "instruction_set",
                    "how the MKL in LibTorch picks its CPU kernels (bfloat16 products such as flash attention's "
                    "backward, and float32 ones under runtime.cpu_blas = \"libtorch\"): instruction_set (AVX2, "
                    "AVX-512 and its bfloat16 dot products wherever the processor has them) or vendor (MKL's own "
                    "rule: its generic kernels on processors not made by Intel). Taken at MKL's first call")
      .choices({"instruction_set", "vendor"});
  schema.add_string("runtime.log_dir", "", "folder for per-rank log files; empty = <train.out_dir>/logs");
  schema.add_string("dist.backend", "auto", "collective backend: auto (NCCL with CUDA, else Gloo), gloo, nccl")
      .choices({"auto", "gloo", "nccl"});
  schema.add_int("dist.timeout_s", 300, "seconds a collective may wait for its peers before failing")
      .min(1).max(86400);
  schema.add_int("parallel.data", 0, "data-parallel degree; 0 = the ranks the other axes leave").min(0);
  schema.add_int("parallel.pipeline", 1, "pipeline stages (the model's layers cut into consecutive stages)").min(1);
  schema.add_string("parallel.schedule", "1f1b", "pipeline schedule: gpipe, 1f1b, interleaved")
      .choices({"gpipe", "1f1b", "interleaved"});
  schema.add_int("parallel.chunks", 1, "interleaved schedule: model chunks per pipeline rank (2 or more)").min(1);
  schema.add_string("parallel.partition", "uniform", "layers per pipeline stage: uniform (equal counts), parameters or "
                                                     "time (balanced, the embeddings and output layer counted on the "
                                                     "end stages; time is measured at start-up)")
      .choices({"uniform", "parameters", "time"});
  schema.add_int("parallel.dap.size", 1,
                 "dynamic axial parallelism (FastFold): ranks over which a model's blocks cut each sample's MSA and "
                 "pair tensors; 1: off")
      .min(1);
  schema.add_bool("memory.activation_checkpointing", false,
                  "recompute each block's forward in its backward instead of keeping its activations");
  schema.add_string_list("memory.checkpoint_blocks", {},
                         "with activation checkpointing: the blocks to recompute, as globs over the model's block "
                         "names (e.g. [\"down_blocks.*\"]); empty: the model's own choice (every transformer layer)");
  parallel::add_tensor_parallel_schema(schema);
  parallel::sequence::add_sequence_parallel_schema(schema);
}

Runtime start_runtime(const config::Config& config) {
  dist::WorldOptions options;
  options.device = config.get_string("runtime.device");
  options.backend = config.get_string("dist.backend");
  options.timeout = std::chrono::seconds(config.get_int("dist.timeout_s"));
  return start_runtime(config, dist::World::init(dist::detect_launch_env(), options));
}

Runtime start_runtime(const config::Config& config, std::shared_ptr<dist::World> world) {
  const dist::LaunchEnv& env = world->env();
  Runtime runtime;
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  // Before anything calls MKL: it picks its kernels once, at its first call.
  if (config.schema().find("runtime.mkl_kernels")) {
    const bool by_vendor = config.get_string("runtime.mkl_kernels") == "vendor";
    if (!ops::set_mkl_kernels(by_vendor ? ops::MklKernels::kByVendor : ops::MklKernels::kByInstructionSet)) {
      config.fail_at("runtime.mkl_kernels", "MKL already picked its kernels " +
                                                std::string(by_vendor ? "by instruction set" : "by vendor") +
                                                " in this process, before this runtime started; the choice takes "
                                                "effect in a fresh process");
    }
  }
  const int64_t requested = config.get_int("runtime.threads");
  runtime.threads = requested > 0 ? static_cast<int>(requested) : std::max(1, cores / env.local_world_size);
  torch::set_num_threads(runtime.threads);

  runtime.world = std::move(world);
  runtime.device = runtime.world->device();
  if (config.schema().find("runtime.fused_loss")) {
    ops::set_fused_kernels({config.get_bool("runtime.fused_loss"), config.get_bool("runtime.fused_layer_norm"),
                            config.get_bool("runtime.skinny_linear"), config.get_bool("runtime.fused_gelu")});
  }
  if (config.schema().find("runtime.attention_backend")) ops::choose_attention_backend(config.get_string("runtime.attention_backend"));
  if (config.schema().find("runtime.cpu_blas")) {
    ops::set_cpu_blas(config.get_string("runtime.cpu_blas") == "openblas" ? ops::CpuBlas::kOpenBlas
                                                                         : ops::CpuBlas::kLibTorch);
  }
  // Rank 0 prints; every rank of a multi-rank job also appends to its own log file.
  std::string log_dir = config.get_string("runtime.log_dir");
  if (log_dir.empty() && runtime.world->size() > 1 && config.schema().find("train.out_dir")) {
    log_dir = config.get_string("train.out_dir") + "/logs";
  }
  log::configure(runtime.world->rank(), runtime.world->size(), log_dir);

  runtime.tensor.spec = parallel::tensor_parallel_spec(config);
  runtime.pipeline.stages = static_cast<int>(config.get_int("parallel.pipeline"));
  runtime.pipeline.kind = parallel::pipeline::schedule_kind(config.get_string("parallel.schedule"));
  runtime.pipeline.chunks = static_cast<int>(config.get_int("parallel.chunks"));
  if ((runtime.pipeline.kind == parallel::pipeline::ScheduleKind::kInterleaved) != (runtime.pipeline.chunks > 1)) {
    config.fail_at("parallel.chunks", "is " + std::to_string(runtime.pipeline.chunks) +
                                          " but parallel.schedule = \"" + config.get_string("parallel.schedule") +
                                          "\"; interleaved takes 2 or more chunks per rank, the others 1");
  }
  runtime.sequence = parallel::sequence::sequence_parallel_spec(config);
  if (runtime.sequence.enabled() && (runtime.tensor.spec.size > 1 || runtime.pipeline.stages > 1)) {
    config.fail_at("parallel.sequence.mode", "\"" + config.get_string("parallel.sequence.mode") +
                                                 "\" combines with data parallelism only: set parallel.tensor.mode = "
                                                 "\"none\" and parallel.pipeline = 1");
  }
  const int dap = static_cast<int>(config.get_int("parallel.dap.size"));
  if (dap > 1 && (runtime.tensor.spec.size > 1 || runtime.pipeline.stages > 1 || runtime.sequence.enabled())) {
    config.fail_at("parallel.dap.size", "is " + std::to_string(dap) + " but combines with data parallelism only: set "
                                        "parallel.tensor.mode = \"none\", parallel.pipeline = 1 and "
                                        "parallel.sequence.mode = \"none\"");
  }
  const int ranks = runtime.world->size(), tensor = runtime.tensor.spec.size;
  // Ranks holding one copy of the model, or (sequence or dynamic axial parallelism) sharing one copy's rows.
  const int model = tensor * runtime.pipeline.stages * runtime.sequence.size * dap;
  if (ranks % model != 0) {
    config.fail_at(runtime.pipeline.stages > 1 ? "parallel.pipeline"
                   : runtime.sequence.enabled() ? "parallel.sequence.size"
                   : dap > 1                    ? "parallel.dap.size"
                                                : "parallel.tensor.size",
                   "gives " + std::to_string(model) + " ranks per model copy (pipeline " +
                       std::to_string(runtime.pipeline.stages) + " x tensor " + std::to_string(tensor) +
                       " x sequence " + std::to_string(runtime.sequence.size) + " x dap " + std::to_string(dap) +
                       ") but the job has " +
                       std::to_string(ranks) + " ranks, which it does not divide");
  }
  const int64_t data = config.get_int("parallel.data");
  if (data != 0 && data * model != ranks) {
    config.fail_at("parallel.data", "is " + std::to_string(data) + " but the job has " + std::to_string(ranks) +
                                        " ranks = data x pipeline x tensor x sequence x dap (" +
                                        std::to_string(runtime.pipeline.stages) + " x " + std::to_string(tensor) +
                                        " x " + std::to_string(runtime.sequence.size) + " x " + std::to_string(dap) +
                                        "); use " +
                                        std::to_string(ranks / model) +
                                        " or 0");
  }
  // Pipeline outermost (stages talk least), tensor innermost (it talks most).
  std::vector<dist::MeshAxis> axes;
  if (runtime.pipeline.stages > 1) axes.push_back({"pipeline", runtime.pipeline.stages});
  axes.push_back({"data", ranks / model});
  if (runtime.sequence.enabled()) axes.push_back({"sequence", runtime.sequence.size});
  if (dap > 1) axes.push_back({"dap", dap});
  for (const auto& axis : parallel::tensor_mesh_axes(runtime.tensor.spec)) axes.push_back(axis);
  runtime.mesh = std::make_shared<dist::ProcessMesh>(runtime.world, axes);
  runtime.tensor.mesh = runtime.mesh;
  if (runtime.sequence.enabled()) runtime.sequence.group = runtime.mesh->group("sequence");
  if (dap > 1) runtime.dap = runtime.mesh->group("dap");
  if (env.world_size > 1) log::infof(dist::describe(env), "; mesh ", runtime.mesh->describe());
  return runtime;
}

dist::GroupPtr Runtime::model_group() const {
  std::vector<std::string> axes = tensor.enabled() ? tensor.axes() : std::vector<std::string>{};
  if (pipelined()) axes.insert(axes.begin(), "pipeline");
  return axes.empty() ? nullptr : mesh->group(axes);
}

std::vector<std::string> Runtime::replica_axes() const {
  if (sequence.enabled()) return {"data", "sequence"};
  if (dap) return {"data", "dap"};
  return {"data"};
}

dist::GroupPtr Runtime::replica_group() const { return mesh->group(replica_axes()); }

int64_t accumulation_steps(const config::Config& config, const Runtime& runtime) {
  const TrainSettings settings = read_train_settings(config);
  const int64_t batch = settings.batch_size, micro = settings.micro_batch_size;
  const int64_t ranks = runtime.mesh->size("data");
  if (batch % (micro * ranks) != 0) {
    config.fail_at("train.batch_size", "(" + std::to_string(batch) + ") must be a multiple of " +
                                           "train.micro_batch_size x data-parallel ranks = " + std::to_string(micro) +
                                           " x " + std::to_string(ranks));
  }
  return batch / (micro * ranks);
}

double measure_matmul_flops(const torch::Device& device, torch::Dtype dtype, bool fresh) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, int, int>, double> measured;
  const auto key = std::make_tuple(device.str(), static_cast<int>(dtype), torch::get_num_threads());
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = measured.find(key); found != measured.end() && !fresh) return found->second;

  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  // Every size up to one whose product takes 50 ms, each timed 3 times: the fastest product counts
  // (stopping where the rate first dipped let timing noise end the search early: "MFU 114%").
  const int64_t largest = device.is_cuda() ? 16384 : 2048;
  double best = 0;
  for (int64_t n = 256; n <= largest; n *= 2) {
    // Filled without random numbers: the probe runs after a resume has restored the generators, and a
    // draw here would shift every later dropout mask (resume would no longer be exact).
    const torch::Tensor a = torch::linspace(-1, 1, n * n, options).view({n, n});
    const torch::Tensor b = torch::linspace(1, -1, n * n, options).view({n, n});
    torch::Tensor c = torch::mm(a, b);  // warm-up: first-touch of the output, kernel selection
    const StepTimes times = time_steps([&] { torch::mm_out(c, a, b); }, /*warmup=*/0, /*steps=*/3, device);
    best = std::max(best, 2.0 * static_cast<double>(n) * n * n / times.min);
    if (times.min > 0.05) break;
  }
  measured[key] = best;
  return best;
}

StepTimes time_steps(const std::function<void()>& step, int64_t warmup, int64_t steps, const torch::Device& device) {
  KUAFU_CHECK(steps > 0, "time_steps needs at least one timed step");
  for (int64_t i = 0; i < warmup; ++i) step();
  synchronize(device);
  std::vector<double> seconds;
  for (int64_t i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    synchronize(device);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return {seconds[seconds.size() / 2], seconds.front(), seconds.back()};
}

int run_app_command(const std::string& app, const std::function<void()>& command) {
  try {
    command();
    // A run stopped by SIGINT or SIGTERM (after saving) exits as the shells and kuafu-run report such a
    // stop: 128 + the signal (130, 143), so a script can tell it from a finished run.
    const int signal = stop_signal();
    return signal ? 128 + signal : 0;
  } catch (const Error& e) {
    std::cerr << app << ": error: " << e.what() << std::endl;
  } catch (const c10::Error& e) {
    std::cerr << app << ": error: " << e.what_without_backtrace() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << app << ": error: " << e.what() << std::endl;
  }
  return 1;
}

namespace {
std::atomic<int> g_stop_signals{0};
std::atomic<int> g_first_stop_signal{0};

void on_stop_signal(int signal) {
  int none = 0;
  g_first_stop_signal.compare_exchange_strong(none, signal);
  if (g_stop_signals.fetch_add(1) >= 1 && signal == SIGINT) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}
}  // namespace

void install_stop_signals() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}
bool stop_requested() { return g_stop_signals.load() > 0; }
void request_stop() { g_stop_signals.fetch_add(1); }
void clear_stop_request() {
  g_stop_signals.store(0);
  g_first_stop_signal.store(0);
}
int stop_signal() { return g_first_stop_signal.load(); }

}  // namespace kuafu::train
