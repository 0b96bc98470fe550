// Peak memory per rank of one sequence-parallel attention layer (forward + backward) at sequence length
// n over P ranks: what the layer allocates above the process's resident size just before it (inputs,
// saved tensors, scores, gradients). Prints one JSON line from rank 0 with the largest rank's figure.
//
//   kuafu-run --nproc-per-node P sequence_attention_memory --mode ring --seq 4096 [--heads 8 --head-dim 64]
//
// Modes: ring (blockwise, online softmax), ring_scores (full score rows), all_to_all, and none (one
// process, LibTorch's attention). benchmarks/sequence_attention_memory.sh sweeps n and P and searches
// the longest n that fits a per-rank budget. Each run is a fresh process, as the resident high-water
// mark cannot be reset; run with MALLOC_MMAP_THRESHOLD_ set so freed blocks go back to the system.
#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <iostream>

#include "benchmarks/options_main.h"
#include "core/dist/collectives.h"
#include "core/dist/launch_env.h"
#include "core/parallel/sequence/sequence_parallel.h"
#include "core/util/error.h"

namespace {

namespace po = boost::program_options;
using namespace kuafu;

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t peak_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// One forward + backward of the layer on this rank's chunk of a sequence of `n` positions.
void attention_step(const parallel::sequence::SequenceParallel& sp, int64_t batch, int64_t heads, int64_t n,
                    int64_t head_dim, bool causal) {
  const int64_t chunk = n / sp.size;
  auto input = [&] { return torch::randn({batch, heads, chunk, head_dim}).requires_grad_(); };
  torch::Tensor q = input(), k = input(), v = input();
  torch::Tensor out = parallel::sequence::attention(q, k, v, causal, 0.0, sp);
  out.sum().backward();
}

int run(const po::variables_map& args) {
  const auto env = dist::detect_launch_env();
  dist::WorldOptions options;
  options.backend = "gloo";
  auto world = env.world_size > 1 ? dist::World::init(env, options) : dist::World::single();
  torch::set_num_threads(args["threads"].as<int>());
  dist::ProcessMesh mesh(world, {{"sequence", world->size()}});

  parallel::sequence::SequenceParallel sp;
  sp.mode = parallel::sequence::sequence_mode(args["mode"].as<std::string>());
  sp.size = world->size();
  sp.group = mesh.group("sequence");
  sp.query_tile = args["query-tile"].as<int64_t>();
  KUAFU_CHECK(sp.enabled() || sp.size == 1, "--mode none runs on one process");
  const int64_t n = args["seq"].as<int64_t>(), heads = args["heads"].as<int64_t>();
  const int64_t batch = args["batch"].as<int64_t>(), head_dim = args["head-dim"].as<int64_t>();
  const bool causal = args["causal"].as<bool>();
  KUAFU_CHECK(n % sp.size == 0, "--seq ", n, " must divide by the ", sp.size, " ranks");

  // Warm-up at a tiny length: the backend's buffers and LibTorch's first-use allocations are not the layer's.
  attention_step(sp, batch, heads, 2 * sp.size, head_dim, causal);
  dist::barrier(*world->world_group());
  const int64_t before = resident_bytes();
  const auto start = std::chrono::steady_clock::now();
  attention_step(sp, batch, heads, n, head_dim, causal);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  torch::Tensor peak = torch::tensor({static_cast<double>(peak_resident_bytes() - before), seconds}, torch::kFloat64);
  dist::all_reduce(peak, *world->world_group(), dist::Reduce::kMax);
  if (world->rank() == 0) {
    std::cout << nlohmann::json{{"mode", args["mode"].as<std::string>()}, {"ranks", sp.size}, {"seq", n},
                                {"batch", batch}, {"heads", heads}, {"head_dim", head_dim}, {"causal", causal},
                                {"peak_mib_per_rank", peak[0].item<double>() / (1 << 20)},
                                {"seconds", peak[1].item<double>()}}
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description described("sequence_attention_memory: peak memory per rank of one attention layer");
  described.add_options()
      ("mode", po::value<std::string>()->default_value("ring"), "ring, ring_scores, all_to_all, or none (one process)")
      ("seq", po::value<int64_t>()->default_value(2048), "sequence length n (divisible by the ranks)")
      ("batch", po::value<int64_t>()->default_value(1), "sequences")
      ("heads", po::value<int64_t>()->default_value(8), "attention heads")
      ("head-dim", po::value<int64_t>()->default_value(64), "features per head")
      ("causal", po::value<bool>()->default_value(true), "causal mask")
      ("query-tile", po::value<int64_t>()->default_value(64), "blockwise ring: query rows per score tile")
      ("threads", po::value<int>()->default_value(1), "intra-op threads per rank");
  return kuafu::benchmarks::options_main(argc, argv, "sequence_attention_memory", described, run);
}
