// Decoding's products of a few rows on the CPU: ops::skinny_linear against LibTorch's linear (the BLAS the
// apps use: OpenBLAS by default, `--blas libtorch` for LibTorch's MKL), interleaved call by call in one
// process so that the machine's drift touches both alike, at OPT-125m's, OPT-1.3b's and Qwen2.5-0.5B's layer shapes.
// Prints each shape's medians, the weights' GB/s and the ratio, and one JSON line per shape.
// Usage: skinny_linear_benchmark [rows=8] [repeats=40] [threads=2] [blas=openblas|libtorch]
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/ops/cpu_blas.h"
#include "core/ops/skinny_linear.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::stoll(argv[1]) : 8;
  const int repeats = argc > 2 ? std::stoi(argv[2]) : 40;
  at::set_num_threads(argc > 3 ? std::stoi(argv[3]) : 2);
  const std::string blas = argc > 4 ? argv[4] : "openblas";
  kuafu::ops::set_cpu_blas(blas == "libtorch" ? kuafu::ops::CpuBlas::kLibTorch : kuafu::ops::CpuBlas::kOpenBlas);
  torch::NoGradGuard no_grad;
  struct Shape {
    const char* name;
    int64_t in, out;
  };
  const Shape shapes[] = {{"opt-125m attention", 768, 768},  {"opt-125m fc1", 768, 3072},    {"opt-125m fc2", 3072, 768},
                          {"opt-125m output", 768, 50272},   {"opt-1.3b fc1", 2048, 8192},   {"opt-1.3b output", 2048, 50272},
                          {"qwen2.5-0.5b q", 896, 896},      {"qwen2.5-0.5b k", 896, 128},   {"qwen2.5-0.5b gate", 896, 4864},
                          {"qwen2.5-0.5b down", 4864, 896}};
  for (const Shape& s : shapes) {
    const torch::Tensor x = torch::randn({rows, s.in}), w = torch::randn({s.out, s.in}), b = torch::randn({s.out});
    std::vector<double> skinny, plain;
    for (int i = 0; i < repeats + 3; ++i) {
      for (const bool streamed : {true, false}) {
        const auto start = std::chrono::steady_clock::now();
        const torch::Tensor y = streamed ? kuafu::ops::skinny_linear(x, w, b) : torch::nn::functional::linear(x, w, b);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        if (i >= 3) (streamed ? skinny : plain).push_back(ms);
      }
    }
    const double a = median(skinny), p = median(plain), gb = static_cast<double>(w.numel()) * 4 / 1e9;
    std::printf("%-20s %2lld rows: skinny %8.3f ms (%5.1f GB/s)  %s %8.3f ms (%5.1f GB/s)  %.2fx\n", s.name,
                static_cast<long long>(rows), a, gb / a * 1e3, blas.c_str(), p, gb / p * 1e3, p / a);
    std::printf("{\"shape\": \"%s\", \"rows\": %lld, \"skinny_ms\": %.4f, \"blas\": \"%s\", \"blas_ms\": %.4f, \"speedup\": %.3f}\n",
                s.name, static_cast<long long>(rows), a, blas.c_str(), p, p / a);
  }
}
