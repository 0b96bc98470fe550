// Bytes each rank sends for one GPT block (forward + backward) under a tensor-parallel mode, measured
// from the process groups' counters, next to the closed-form count derived in docs/tensor_parallel.md.
//
//   kuafu-run --nproc-per-node P tensor_parallel_comm --mode 2d [--depth d] [--hidden 1024 --heads 16
//             --batch 16 --seq 256]
//   tensor_parallel_comm --table [--hidden ... --batch ... --seq ...]   (the formulas at P = 4, 8, 64, 512)
//
// Counting convention (core/dist/collectives.cpp): the bandwidth-optimal ring NCCL uses. All-reduce sends
// 2(p-1)/p of the tensor per rank, all-gather and reduce-scatter (p-1)/p of the full tensor, broadcast and
// reduce (a pipelined ring) the tensor from every rank but one, (p-1)/p on average. The block's input
// needs a gradient, as every block but the first does in a model.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "apps/gpt/model.h"
#include "core/dist/collectives.h"
#include "benchmarks/options_main.h"
#include "core/dist/launch_env.h"
#include "core/parallel/tensor/factory.h"

namespace {

namespace po = boost::program_options;
using kuafu::parallel::TensorMode;

struct Shape {
  double tokens;  // N = batch x sequence, the rows one tensor-parallel group works on
  double hidden;  // H
};

// Elements each rank sends on average for one block, fwd + bwd (docs/tensor_parallel.md derives each
// term). Linear layers: c_attn H -> 3H, c_proj H -> H, c_fc H -> 4H, c_proj 4H -> H, so Σ in = 7H,
// Σ out = 9H, Σ in·out = 12H^2; two LayerNorms.
std::optional<double> formula_elements(TensorMode mode, int p, int depth, const Shape& s) {
  const double n = s.tokens, h = s.hidden;
  switch (mode) {
    case TensorMode::k1D:  // two all-reduces of [N, H] forward, two backward
      return 8.0 * (p - 1) / p * n * h;
    case TensorMode::k2D:
    case TensorMode::k2p5D: {
      const double d = mode == TensorMode::k2D ? 1 : depth;
      const double q = std::sqrt(p / d);
      if (std::abs(q - std::round(q)) > 1e-9) return std::nullopt;
      const double linears = (q - 1) / (q * q) * 3 * (7 * n * h / d + 12 * h * h)  // SUMMA broadcasts, reductions
                             + 2 * (d - 1) / d * 12 * h * h / (q * q)               // dA over the depth
                             + 2 * (d * q - 1) / (d * q) * 9 * h / q;               // db over rows and depth
      const double norms = 16 * (q - 1) * n / (d * q * q)      // statistics forward, two sums backward
                           + 8 * (d * q - 1) * h / (d * q * q);  // dγ, dβ
      return linears + norms;
    }
    case TensorMode::k3D: {
      const double q = std::cbrt(p);
      if (std::abs(q - std::round(q)) > 1e-9) return std::nullopt;
      return (q - 1) / (q * q * q) * (39 * n * h + 36 * h * h + 16 * n)  // gathers, reduce-scatters, statistics
             + 26 * (q * q - 1) * h / (q * q * q);                       // db, dγ, dβ over q^2 replicas
    }
    case TensorMode::kNone:
      return 0.0;
  }
  return std::nullopt;
}

TensorMode mode_of(const std::string& name) {
  if (name == "1d") return TensorMode::k1D;
  if (name == "2d") return TensorMode::k2D;
  if (name == "2.5d") return TensorMode::k2p5D;
  if (name == "3d") return TensorMode::k3D;
  throw std::invalid_argument("--mode must be 1d, 2d, 2.5d or 3d, got '" + name + "'");
}

void print_table(const Shape& shape) {
  std::printf("Analytic bytes sent per rank, one GPT block fwd+bwd, fp32, N = %.0f tokens, H = %.0f\n", shape.tokens,
              shape.hidden);
  std::printf("%-6s %-14s %-14s %-14s %-14s\n", "mode", "P=4", "P=8", "P=64", "P=512");
  const std::map<std::string, std::map<int, int>> depths = {{"2.5d", {{4, 1}, {8, 2}, {64, 4}, {512, 8}}}};
  for (const std::string name : {"1d", "2d", "2.5d", "3d"}) {
    std::printf("%-6s", name.c_str());
    for (int p : {4, 8, 64, 512}) {
      const int d = name == "2.5d" ? depths.at(name).at(p) : 1;
      const auto elements = formula_elements(mode_of(name), p, d, shape);
      if (elements) {
        std::printf(" %-14s", (std::to_string(static_cast<int64_t>(std::llround(*elements * 4 / 1e3))) + " kB" +
                               (name == "2.5d" ? " d=" + std::to_string(d) : ""))
                                  .c_str());
      } else {
        std::printf(" %-14s", "-");
      }
    }
    std::printf("\n");
  }
}

int64_t bytes_sent(const kuafu::dist::World& world) {
  int64_t total = 0;
  for (const auto& group : world.groups()) total += group->counters().bytes_sent;
  return total;
}

int run(const po::variables_map& args) {
  using namespace kuafu;
  const Shape shape{static_cast<double>(args["batch"].as<int64_t>() * args["seq"].as<int64_t>()),
                    static_cast<double>(args["hidden"].as<int64_t>())};
  if (args.count("table")) {
    print_table(shape);
    return 0;
  }
  dist::WorldOptions options;
  options.backend = "gloo";
  auto world = dist::World::init(dist::detect_launch_env(), options);
  const int threads = args["threads"].as<int>();
  torch::set_num_threads(threads > 0 ? threads : 1);

  parallel::TensorParallel tp;
  tp.spec = {mode_of(args["mode"].as<std::string>()), world->size(), args["depth"].as<int>()};
  tp.mesh = std::make_shared<dist::ProcessMesh>(world, parallel::tensor_mesh_axes(tp.spec));
  gpt::GPTConfig config;
  config.n_embd = args["hidden"].as<int64_t>();
  config.n_head = args["heads"].as<int64_t>();
  config.n_layer = 1;
  torch::manual_seed(0);
  nn::TransformerBlock block(gpt::block_spec(config), tp);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : block->parameters()) p.normal_(0.0, 0.02);
  }
  const int64_t batch = args["batch"].as<int64_t>(), seq = args["seq"].as<int64_t>();
  const torch::Tensor x_full = torch::randn({batch, seq, config.n_embd});
  const auto layout = parallel::stream_layout(tp, 3);
  torch::Tensor x = parallel::shard_of(x_full, layout, *tp.mesh).requires_grad_();

  const int64_t before = bytes_sent(*world);
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor y = block->forward(x, nullptr);
  y.sum().backward();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t sent = bytes_sent(*world) - before;

  // Every rank's count, gathered after the measurement.
  torch::Tensor mine = torch::tensor({static_cast<double>(sent)}, torch::kFloat64);
  const torch::Tensor all = dist::all_gather(mine, *world->world_group(), 0);
  if (world->rank() == 0) {
    const double mean = all.mean().item<double>(), most = all.max().item<double>();
    const double formula = *formula_elements(tp.spec.mode, world->size(), tp.spec.depth, shape) * 4;
    std::printf("%s P=%d%s N=%.0f H=%.0f: sent per rank mean %.1f kB (max %.1f kB), formula %.1f kB, "
                "measured/formula %.6f, step %.2f s\n",
                parallel::mode_name(tp.spec.mode).c_str(), world->size(),
                tp.spec.mode == TensorMode::k2p5D ? (" d=" + std::to_string(tp.spec.depth)).c_str() : "",
                shape.tokens, shape.hidden, mean / 1e3, most / 1e3, formula / 1e3, mean / formula, seconds);
    nlohmann::json line = {{"mode", parallel::mode_name(tp.spec.mode)}, {"ranks", world->size()},
                           {"depth", tp.spec.depth},  {"tokens", shape.tokens},
                           {"hidden", shape.hidden},  {"bytes_sent_mean", mean},
                           {"bytes_sent_max", most},  {"formula_bytes", formula}};
    std::cout << line.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description described("tensor_parallel_comm options");
  described.add_options()("table", "print the formulas at P = 4, 8, 64, 512 and exit")(
      "mode", po::value<std::string>()->default_value("1d"), "1d, 2d, 2.5d or 3d")(
      "depth", po::value<int>()->default_value(1), "2.5d: stacked grids")(
      "hidden", po::value<int64_t>()->default_value(1024), "hidden size H")(
      "heads", po::value<int64_t>()->default_value(16), "attention heads")(
      "batch", po::value<int64_t>()->default_value(16), "sequences")(
      "seq", po::value<int64_t>()->default_value(256), "tokens per sequence")(
      "threads", po::value<int>()->default_value(1), "LibTorch threads per rank");
  return kuafu::benchmarks::options_main(argc, argv, "tensor_parallel_comm", described, run);
}
