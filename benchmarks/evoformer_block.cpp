// One Evoformer block's forward + backward (AlphaFold 2's sizes by default: c_m 256, c_z 128, 8 MSA heads,
// 4 pair heads, 32 outer and 128 triangle channels) on S MSA rows and R residues, from AlphaFold's initial
// values, on the CPU or a GPU (--device) in float32 or bfloat16 (--dtype; the peak is the device's bytes in use): the median over --steps timed steps after --warmup, as one JSON line. benchmarks/evoformer_block.sh
// runs it beside AlphaFold's own JAX block (evoformer_block_jax.py) alternately on the same machine.
//
//   evoformer_block --residues 128 --msa-rows 128 [--steps 5 --warmup 2 --forward-only --device cuda --dtype bf16]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

#include <torch/torch.h>

#include "apps/fastfold/evoformer.h"
#include "benchmarks/options_main.h"
#include "core/memory/memory_meter.h"
#include "core/util/device.h"
#include "core/util/error.h"

namespace {
namespace po = boost::program_options;
using namespace kuafu;

int run(const po::variables_map& args) {
  const int64_t r = args["residues"].as<int64_t>(), s = args["msa-rows"].as<int64_t>();
  const bool forward_only = args.count("forward-only") > 0;
  const torch::Device device = resolve_device(args["device"].as<std::string>(), 0, "--device");
  const std::string dtype_name = args["dtype"].as<std::string>();
  KUAFU_CHECK(dtype_name == "float32" || dtype_name == "bf16", "--dtype is '", dtype_name, "': float32 or bf16");
  const auto options = torch::TensorOptions(dtype_name == "bf16" ? torch::kBFloat16 : torch::kFloat32).device(device);
  torch::manual_seed(0);
  fold::EvoformerBlock block(fold::EvoformerSizes{256, 128, 8, 4, 32, 128, 4, false});
  fold::initialize_alphafold_weights(*block);
  block->to(options.device(), options.dtype().toScalarType());
  const torch::Tensor m = torch::randn({s, r, 256}).to(options), z = torch::randn({r, r, 128}).to(options);
  const torch::Tensor msa_mask = torch::ones({s, r}, options), pair_mask = torch::ones({r, r}, options);
  memory::PeakInUse peak(device);
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
    synchronize(device);
    if (i >= warmup) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  std::cout << nlohmann::json{{"impl", "kuafu"}, {"residues", r}, {"msa_rows", s}, {"forward_only", forward_only},
                              {"threads", torch::get_num_threads()}, {"device", device.str()}, {"dtype", dtype_name},
                              {"peak_mb", static_cast<double>(peak.peak()) / (1 << 20)}, {"median_s", median},
                              {"ms_per_residue", 1e3 * median / static_cast<double>(r)}, {"steps", seconds}}.dump()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description options("evoformer_block: one Evoformer block's forward + backward time");
  options.add_options()("residues", po::value<int64_t>()->default_value(128), "R")(
      "msa-rows", po::value<int64_t>()->default_value(128), "S")("steps", po::value<int64_t>()->default_value(5), "timed steps")(
      "warmup", po::value<int64_t>()->default_value(2), "untimed steps first")("forward-only", "time the forward alone")(
      "device", po::value<std::string>()->default_value("cpu"), "cpu, cuda or cuda:N")(
      "dtype", po::value<std::string>()->default_value("float32"), "float32 or bf16 (weights and inputs)");
  return kuafu::benchmarks::options_main(argc, argv, "evoformer_block", options, run);
}
