// One Evoformer block's forward + backward (AlphaFold 2's sizes by default: c_m 256, c_z 128, 8 MSA heads,
// 4 pair heads, 32 outer and 128 triangle channels) on S MSA rows and R residues, from AlphaFold's initial
// values: the median over --steps timed steps after --warmup, as one JSON line. benchmarks/evoformer_block.sh
// runs it beside AlphaFold's own JAX block (evoformer_block_jax.py) alternately on the same machine.
//
//   evoformer_block --residues 128 --msa-rows 128 [--steps 5 --warmup 2 --forward-only]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

#include <torch/torch.h>

#include "apps/fastfold/evoformer.h"
#include "benchmarks/options_main.h"

namespace {
namespace po = boost::program_options;
using namespace kuafu;

int run(const po::variables_map& args) {
  const int64_t r = args["residues"].as<int64_t>(), s = args["msa-rows"].as<int64_t>();
  const bool forward_only = args.count("forward-only") > 0;
  torch::manual_seed(0);
  fold::EvoformerBlock block(fold::EvoformerSizes{256, 128, 8, 4, 32, 128, 4, false});
  fold::initialize_alphafold_weights(*block);
  const torch::Tensor m = torch::randn({s, r, 256}), z = torch::randn({r, r, 128});
  const torch::Tensor msa_mask = torch::ones({s, r}), pair_mask = torch::ones({r, r});
  std::vector<double> seconds;
  const int64_t warmup = args["warmup"].as<int64_t>(), steps = args["steps"].as<int64_t>();
  for (int64_t i = 0; i < warmup + steps; ++i) {
    const torch::Tensor m_in = m.clone().requires_grad_(!forward_only), z_in = z.clone().requires_grad_(!forward_only);
    const auto start = std::chrono::steady_clock::now();
    if (forward_only) {
      torch::NoGradGuard no_grad;
      block->forward(m_in, z_in, msa_mask, pair_mask);
    } else {
      const auto [m_out, z_out] = block->forward(m_in, z_in, msa_mask, pair_mask);
      (m_out.sum() + z_out.sum()).backward();
    }
    if (i >= warmup) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  std::cout << nlohmann::json{{"impl", "kuafu"}, {"residues", r}, {"msa_rows", s}, {"forward_only", forward_only},
                              {"threads", torch::get_num_threads()}, {"median_s", median},
                              {"ms_per_residue", 1e3 * median / static_cast<double>(r)}, {"steps", seconds}}.dump()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description options("evoformer_block: one Evoformer block's forward + backward time");
  options.add_options()("residues", po::value<int64_t>()->default_value(128), "R")(
      "msa-rows", po::value<int64_t>()->default_value(128), "S")("steps", po::value<int64_t>()->default_value(5), "timed steps")(
      "warmup", po::value<int64_t>()->default_value(2), "untimed steps first")("forward-only", "time the forward alone");
  return kuafu::benchmarks::options_main(argc, argv, "evoformer_block", options, run);
}
