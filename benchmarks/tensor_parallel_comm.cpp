// Bytes each rank sends for one GPT block (forward + backward) under a tensor-parallel mode, measured
// from the process groups' counters, next to the closed-form count derived in docs/tensor_parallel.md.
//
//   kuafu-run --nproc-per-node P tensor_parallel_comm --mode 2d [--depth d] [--hidden 1024 --heads 16
//             --batch 16 --seq 256]
//   tensor_parallel_comm --table [--hidden ... --batch ... --seq ...]   (the formulas at P = 4, 8, 64, 512)
//
// With --interface NAME (each rank on its own host: benchmarks/tensor_parallel_wire.sh runs them in
// network namespaces) the bytes NAME transmitted during the block are read from the kernel's counters as
// well: what really crossed the wire, TCP/IP headers and acknowledgements included.
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
#include <functional>
#include <fstream>
#include <sstream>
#include <iostream>
#include <map>
#include <optional>

#include "apps/gpt/model.h"
#include "core/dist/collectives.h"
#include "benchmarks/options_main.h"
#include "core/dist/launch_env.h"
#include "core/parallel/tensor/factory.h"
#include "core/util/error.h"

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

// Bytes and packets `interface` has transmitted, from /proc/net/dev (this process's network namespace).
struct WireCount {
  double bytes = 0;
  double packets = 0;
};

WireCount transmitted(const std::string& interface) {
  std::ifstream in("/proc/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != interface) continue;
    std::istringstream fields(line.substr(colon + 1));
    double value[10] = {};  // received: bytes packets errs drop fifo frame compressed multicast; sent: bytes packets
    for (double& v : value) fields >> v;
    KUAFU_CHECK(fields, "/proc/net/dev: cannot read the counters of ", interface);
    return {value[8], value[9]};
  }
  kuafu::fail("--interface " + interface + ": no such interface in /proc/net/dev");
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

  const std::string collective = args["collective"].as<std::string>();
  std::function<void()> work;  // what is measured
  std::string label;           // and its name in the report
  std::optional<double> formula_bytes;
  nlohmann::json line;
  parallel::TensorParallel tp;
  torch::Tensor x;
  std::optional<nn::TransformerBlock> block;
  if (collective.empty()) {
    tp.spec = {mode_of(args["mode"].as<std::string>()), world->size(), args["depth"].as<int>()};
    tp.mesh = std::make_shared<dist::ProcessMesh>(world, parallel::tensor_mesh_axes(tp.spec));
    gpt::GPTConfig config;
    config.n_embd = args["hidden"].as<int64_t>();
    config.n_head = args["heads"].as<int64_t>();
    config.n_layer = 1;
    torch::manual_seed(0);
    block.emplace(gpt::block_spec(config), tp);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : (*block)->parameters()) p.normal_(0.0, 0.02);
    }
    const int64_t batch = args["batch"].as<int64_t>(), seq = args["seq"].as<int64_t>();
    const torch::Tensor x_full = torch::randn({batch, seq, config.n_embd});  // [B, T, H]
    x = parallel::shard_of(x_full, parallel::stream_layout(tp, 3), *tp.mesh).requires_grad_();
    work = [&] { (*block)->forward(x, nullptr).sum().backward(); };
    formula_bytes = *formula_elements(tp.spec.mode, world->size(), tp.spec.depth, shape) * 4;
    label = parallel::mode_name(tp.spec.mode) + " P=" + std::to_string(world->size()) +
            (tp.spec.mode == TensorMode::k2p5D ? " d=" + std::to_string(tp.spec.depth) : "");
    line = {{"mode", parallel::mode_name(tp.spec.mode)}, {"depth", tp.spec.depth}};
  } else {
    // One collective of N x H float32 elements over every rank (what its accounting counts is printed).
    x = torch::randn({static_cast<int64_t>(shape.tokens), static_cast<int64_t>(shape.hidden)});  // [N, H]
    const auto& group = *world->world_group();
    if (collective == "all_reduce") work = [&] { dist::all_reduce(x, group); };
    else if (collective == "all_gather") work = [&] { dist::all_gather(x.chunk(world->size())[0].contiguous(), group); };
    else if (collective == "reduce_scatter") work = [&] { dist::reduce_scatter(x, group); };
    else if (collective == "broadcast") work = [&] { dist::broadcast(x, group, 0); };
    else if (collective == "reduce") work = [&] { dist::reduce(x, group, 0); };
    else throw std::invalid_argument("--collective must be all_reduce, all_gather, reduce_scatter, broadcast or reduce, got '" +
                                     collective + "'");
    label = collective + " P=" + std::to_string(world->size());
    line = {{"collective", collective}};
  }

  const std::string interface = args["interface"].as<std::string>();
  const auto& world_group = *world->world_group();
  // Barriers around the work: every rank's counters start after all have set up, and stop after every
  // peer has received what this rank sent.
  world_group.wait(world_group.backend().barrier(), "the barrier before the block");
  const WireCount wire_before = interface.empty() ? WireCount{} : transmitted(interface);
  const int64_t before = bytes_sent(*world);
  const auto start = std::chrono::steady_clock::now();
  work();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t sent = bytes_sent(*world) - before;
  world_group.wait(world_group.backend().barrier(), "the barrier after the block");
  const WireCount wire_after = interface.empty() ? WireCount{} : transmitted(interface);

  // Every rank's counts, gathered after the measurement: accounted bytes, wire bytes, wire packets.
  torch::Tensor mine = torch::tensor({static_cast<double>(sent), wire_after.bytes - wire_before.bytes,
                                      wire_after.packets - wire_before.packets}, torch::kFloat64).view({1, 3});
  const torch::Tensor all = dist::all_gather(mine, world_group, 0);  // [ranks, 3]
  if (world->rank() == 0) {
    const torch::Tensor accounted = all.select(1, 0);
    const double mean = accounted.mean().item<double>(), most = accounted.max().item<double>();
    const double formula = formula_bytes.value_or(mean);  // a collective's accounting is its formula
    std::printf("%s N=%.0f H=%.0f: sent per rank mean %.1f kB (max %.1f kB), formula %.1f kB, "
                "measured/formula %.6f, %.2f s\n",
                label.c_str(), shape.tokens, shape.hidden, mean / 1e3, most / 1e3, formula / 1e3, mean / formula, seconds);
    line.update({{"ranks", world->size()},   {"tokens", shape.tokens}, {"hidden", shape.hidden},
                 {"bytes_sent_mean", mean}, {"bytes_sent_max", most}, {"formula_bytes", formula}});
    if (!interface.empty()) {
      // Every packet on the wire carries Ethernet (14), IPv4 (20) and TCP (20 + 12 of timestamps)
      // headers: what is left is what Gloo wrote to its sockets, its own message headers included.
      constexpr double kHeaderBytes = 66;
      const torch::Tensor wire = all.select(1, 1).contiguous(), packets = all.select(1, 2).contiguous();
      const torch::Tensor payload = wire - kHeaderBytes * packets;
      const auto values = [](const torch::Tensor& t) {
        return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
      };
      line["wire_bytes_per_rank"] = values(wire);
      line["wire_packets_per_rank"] = values(packets);
      line["wire_bytes_mean"] = wire.mean().item<double>();
      line["wire_payload_bytes_mean"] = payload.mean().item<double>();
      line["wire_payload_bytes_max"] = payload.max().item<double>();
      std::printf("  on the wire (%s): sent per rank mean %.1f kB (max %.1f kB) in %.0f packets; less TCP/IP headers "
                  "%.1f kB (max %.1f kB), payload/formula %.4f\n",
                  interface.c_str(), line["wire_bytes_mean"].get<double>() / 1e3, wire.max().item<double>() / 1e3,
                  packets.mean().item<double>(), payload.mean().item<double>() / 1e3, payload.max().item<double>() / 1e3,
                  payload.mean().item<double>() / formula);
    }
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
      "threads", po::value<int>()->default_value(1), "LibTorch threads per rank")(
      "collective", po::value<std::string>()->default_value(""),
      "instead of the block, one collective of N x H floats over all ranks: all_reduce, all_gather, "
      "reduce_scatter, broadcast or reduce")(
      "interface", po::value<std::string>()->default_value(""),
      "also measure the bytes this network interface transmits (one rank per host)");
  return kuafu::benchmarks::options_main(argc, argv, "tensor_parallel_comm", described, run);
}
