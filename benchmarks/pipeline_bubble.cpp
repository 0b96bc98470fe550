// Measured bubble (idle time / step time per rank) of the pipeline engine running each schedule over
// real processes, next to (p - 1) / (v m + p - 1), and the most micro-batch chunks alive at once.
// Each stage's work is a fixed sleep (forward F ms, backward 2F ms, split over the chunks) in an
// autograd function, so ranks sharing a small machine's cores do not slow each other down: what is
// measured is the schedule as executed, with its real point-to-point transfers of [rows, width] fp32
// activations and gradients.
//
//   kuafu-run --nproc-per-node 4 pipeline_bubble [--forward-ms 20] [--width 4096] [--repeats 5]
//
// With --memory: one step of one schedule (--schedule, --micro) whose stages are real layers (4 x
// linear + GELU on [--rows, width] activations), printing each stage's peak resident memory growth during
// the step: the activations the schedule keeps alive. Run each schedule in its own processes (the
// peak never falls).
#include <boost/program_options.hpp>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

#include "core/dist/collectives.h"
#include "benchmarks/options_main.h"
#include "core/dist/launch_env.h"
#include "core/dist/process_mesh.h"
#include "core/parallel/pipeline/engine.h"

namespace {

namespace po = boost::program_options;
using namespace kuafu;
using parallel::pipeline::ScheduleKind;
using parallel::pipeline::ScheduleSpec;

void sleep_ms(double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); }

// y = x, taking `forward_ms` forward and `backward_ms` backward.
struct Work : torch::autograd::Function<Work> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, double forward_ms,
                               double backward_ms) {
    sleep_ms(forward_ms);
    ctx->saved_data["backward_ms"] = backward_ms;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    sleep_ms(ctx->saved_data["backward_ms"].toDouble());
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

// Resident memory now and its peak so far, in MB (Linux).
double resident_mb() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}
double peak_resident_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024;
}

// One step of real layers under one schedule; every stage reports how far its peak memory rose.
int measure_memory(const po::variables_map& args, const dist::GroupPtr& group) {
  const ScheduleSpec spec{parallel::pipeline::schedule_kind(args["schedule"].as<std::string>()), group->size(),
                          args["micro"].as<int>(), args["schedule"].as<std::string>() == "interleaved" ? 2 : 1};
  const int64_t width = args["width"].as<int64_t>(), rows = args["rows"].as<int64_t>(), layers = 4;
  torch::manual_seed(0);
  std::vector<torch::Tensor> weights;
  for (int i = 0; i < layers * spec.chunks; ++i) weights.push_back((torch::randn({width, width}) / 64).requires_grad_());
  parallel::pipeline::PipelineEngine engine(spec, group);
  const int last = spec.virtual_stages() - 1;
  const double before = resident_mb();
  engine.run(
      [&](int chunk, const torch::Tensor& input, int) {
        torch::Tensor x = input;
        for (int i = 0; i < layers; ++i) x = torch::gelu(torch::matmul(x, weights[chunk * layers + i]));
        return chunk * spec.stages + group->rank() == last ? x.mean() : x;
      },
      [&](int) { return torch::randn({rows, width}); });
  torch::Tensor growth = torch::tensor({peak_resident_mb() - before}, torch::kFloat64);
  const torch::Tensor all = dist::all_gather(growth, *group, 0);
  if (group->rank() == 0) {
    // Saved for backward per layer: the matmul's input and GELU's input.
    const double per_micro = static_cast<double>(rows * width) * 4 * 2 * layers / (1 << 20);
    std::printf("%s p=%d m=%d: peak memory growth per stage (MB):", parallel::pipeline::kind_name(spec.kind).c_str(),
                spec.stages, spec.micro_batches);
    for (int s = 0; s < spec.stages; ++s) std::printf(" %.1f", all[s].item<double>());
    std::printf("; live micro-batches on stage 0: %d (%.1f MB of saved activations each)\n",
                engine.last_stats().peak_live, per_micro);
  }
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const po::variables_map& args) {
  dist::WorldOptions options;
  options.backend = "gloo";
  auto world = dist::World::init(dist::detect_launch_env(), options);
  torch::set_num_threads(1);
  const int p = world->size();
  auto mesh = std::make_shared<dist::ProcessMesh>(world, std::vector<dist::MeshAxis>{{"pipeline", p}});
  const auto group = mesh->group("pipeline");
  if (args.count("memory")) return measure_memory(args, group);
  const double forward_ms = args["forward-ms"].as<double>();
  const int64_t width = args["width"].as<int64_t>();
  const int repeats = args["repeats"].as<int>();
  // A learnable scale so the first stage's input has a gradient path (its input is data).
  torch::Tensor scale = torch::ones({1}, torch::kFloat32).requires_grad_();

  if (world->rank() == 0) {
    std::printf("p = %d stages, forward %.0f ms + backward %.0f ms per stage per micro-batch, activations [8, %ld] "
                "fp32; bubble: worst rank, median of %d steps\n",
                p, forward_ms, 2 * forward_ms, static_cast<long>(width), repeats);
    std::printf("%-16s %-4s %-10s %-10s %-8s %-10s\n", "schedule", "m", "measured", "formula", "live", "step (s)");
  }
  for (const auto& [kind, chunks] : {std::pair{ScheduleKind::kGPipe, 1}, std::pair{ScheduleKind::k1F1B, 1},
                                     std::pair{ScheduleKind::kInterleaved, 2}}) {
    for (int m : {4, 8, 16}) {
      const ScheduleSpec spec{kind, p, m, chunks};
      parallel::pipeline::PipelineEngine engine(spec, group);
      const int last = spec.virtual_stages() - 1;
      std::vector<double> bubbles, steps;
      int live = 0;
      for (int r = 0; r < repeats + 1; ++r) {  // the first run warms up
        engine.run(
            [&](int chunk, const torch::Tensor& input, int) {
              const int v = chunk * p + group->rank();
              torch::Tensor y = Work::apply(input * scale, forward_ms / chunks, 2 * forward_ms / chunks);
              return v == last ? y.mean() : y;
            },
            [&](int) { return torch::ones({8, width}); });
        // Every rank's bubble; the pipeline's is its worst rank's.
        torch::Tensor mine = torch::tensor({engine.last_stats().bubble()}, torch::kFloat64);
        const double worst = dist::all_gather(mine, *group, 0).max().item<double>();
        if (r > 0) {
          bubbles.push_back(worst);
          steps.push_back(engine.last_stats().step_seconds);
        }
        live = engine.last_stats().peak_live;
      }
      if (world->rank() == 0) {
        const std::string name = parallel::pipeline::kind_name(kind) + (chunks > 1 ? " v=" + std::to_string(chunks) : "");
        std::printf("%-16s %-4d %-10.4f %-10.4f %-8d %-10.3f\n", name.c_str(), m, median(bubbles),
                    parallel::pipeline::theoretical_bubble(spec), live, median(steps));
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description described("pipeline_bubble options");
  described.add_options()(
      "forward-ms", po::value<double>()->default_value(20), "forward time per stage and micro-batch")(
      "width", po::value<int64_t>()->default_value(4096), "activation width (8 rows)")(
      "repeats", po::value<int>()->default_value(5), "measured steps per schedule")(
      "memory", "measure one step's peak memory growth instead (with --schedule, --micro)")(
      "schedule", po::value<std::string>()->default_value("1f1b"), "--memory: gpipe, 1f1b or interleaved")(
      "micro", po::value<int>()->default_value(16), "--memory: micro-batches")(
      "rows", po::value<int64_t>()->default_value(512), "--memory: rows of each micro-batch");
  return kuafu::benchmarks::options_main(argc, argv, "pipeline_bubble", described, run);
}
