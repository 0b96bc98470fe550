// CPU Adam kernel vs torch::optim::AdamW and vs the memory-bandwidth bound, in one run, interleaved.
// Usage: cpu_adam_benchmark [sizes=10000000,100000000] [repeats=7] [threads=hardware concurrency]
//
// One Adam step moves 28 bytes per parameter at least (read param, grad, exp_avg, exp_avg_sq; write param,
// exp_avg, exp_avg_sq), 30 with a bf16 copy; the bound is those bytes at the bandwidth of a parallel memcpy
// (2 x 4 bytes per float copied) measured with the same threads. glibc's memcpy uses ordinary stores below
// a threshold of 3/4 of the L3 (480 MB on the dev VM), which read each destination line before writing it,
// so the copy moves 12 bytes per float it is credited 8 for; the Adam-shaped stream (the same 4 reads and 3
// writes per element, one add each) is printed beside it as the tighter bound. Prints medians (warm-up excluded),
// ratios, and one JSON line per size.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/optim/cpu_adam.h"

// at::parallel_for (the copy below) is header-only: without OpenMP it would measure one thread.
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "benchmarks/cpu_adam_benchmark.cpp must be compiled with -fopenmp"
#endif

namespace {

using kuafu::optim::CpuAdamBuffers;
using kuafu::optim::CpuAdamHyper;
using kuafu::optim::HalfKind;

template <typename F>
double time_ms(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// memcpy split over the ATen threads as cpu_adam_step splits its work.
void parallel_copy(float* dst, const float* src, int64_t n) {
  at::parallel_for(0, n, 1 << 15, [&](int64_t begin, int64_t end) {
    std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin) * sizeof(float));
  });
}

// The traffic of an Adam step without its arithmetic: what a perfectly memory-bound kernel would take.
// Vectorised at the widest ISA the CPU has (a scalar loop here is 30% slower than the Adam kernel itself).
__attribute__((target_clones("avx512f", "avx2", "default"))) void adam_shaped_range(
    float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

void adam_shaped_stream(float* p, const float* g, float* m, float* v, int64_t n) {
  at::parallel_for(0, n, 1 << 15, [&](int64_t begin, int64_t end) {
    adam_shaped_range(p + begin, g + begin, m + begin, v + begin, end - begin);
  });
}

void run_size(int64_t n, int repeats, int threads) {
  torch::manual_seed(0);
  // (a) torch: one parameter of n elements, the optimizer built once and stepped repeatedly.
  torch::Tensor torch_param = torch::randn({n}).requires_grad_(true);
  torch_param.mutable_grad() = torch::randn({n});
  torch::optim::AdamW torch_adamw({torch_param}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  // (b), (c) the kernel on its own buffers of the same size; (d) the copy.
  torch::Tensor param = torch::randn({n}), grad = torch::randn({n});
  torch::Tensor exp_avg = torch::zeros({n}), exp_avg_sq = torch::zeros({n});
  torch::Tensor half = torch::empty({n}, torch::kBFloat16);
  torch::Tensor copy_src = torch::randn({n}), copy_dst = torch::empty({n});
  std::vector<torch::Tensor> stream;  // p, g, m, v for the Adam-shaped stream
  for (int k = 0; k < 4; ++k) stream.push_back(torch::randn({n}));
  CpuAdamBuffers buffers{param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                         exp_avg_sq.data_ptr<float>(), n};
  CpuAdamBuffers buffers_bf16 = buffers;
  buffers_bf16.half_out = half.data_ptr();
  buffers_bf16.half_kind = HalfKind::kBFloat16;
  CpuAdamHyper hyper;
  hyper.weight_decay = 0.01;
  hyper.step = 0;  // incremented before each step, as torch's state.step

  std::vector<double> torch_ms, adam_ms, adam_bf16_ms, copy_ms, stream_ms;
  for (int r = 0; r <= repeats; ++r) {  // r == 0 warms up (page faults, thread pool) and is not counted
    const double t_torch = time_ms([&] { torch_adamw.step(); });
    hyper.step += 1;
    const double t_adam = time_ms([&] { kuafu::optim::cpu_adam_step(hyper, buffers); });
    hyper.step += 1;
    const double t_bf16 = time_ms([&] { kuafu::optim::cpu_adam_step(hyper, buffers_bf16); });
    const double t_copy = time_ms([&] { parallel_copy(copy_dst.data_ptr<float>(), copy_src.data_ptr<float>(), n); });
    const double t_stream = time_ms([&] {
      adam_shaped_stream(stream[0].data_ptr<float>(), stream[1].data_ptr<float>(), stream[2].data_ptr<float>(),
                         stream[3].data_ptr<float>(), n);
    });
    if (r == 0) continue;
    torch_ms.push_back(t_torch);
    adam_ms.push_back(t_adam);
    adam_bf16_ms.push_back(t_bf16);
    copy_ms.push_back(t_copy);
    stream_ms.push_back(t_stream);
  }
  const double torch_med = median(torch_ms), adam_med = median(adam_ms), bf16_med = median(adam_bf16_ms);
  const double copy_med = median(copy_ms), stream_med = median(stream_ms);
  const double copy_gbps = 2.0 * 4.0 * static_cast<double>(n) / (copy_med * 1e6);
  const double bound_ms = 28.0 * static_cast<double>(n) / (copy_gbps * 1e6);
  const double bound_bf16_ms = 30.0 * static_cast<double>(n) / (copy_gbps * 1e6);
  const double adam_gbps = 28.0 * static_cast<double>(n) / (adam_med * 1e6);
  const double stream_gbps = 28.0 * static_cast<double>(n) / (stream_med * 1e6);

  char line[640];
  std::snprintf(line, sizeof line,
                "n=%lld threads=%d: torch AdamW %.2f ms | cpu_adam %.2f ms (%.1f GB/s) | cpu_adam+bf16 %.2f ms | "
                "copy %.1f GB/s -> bound %.2f ms (28 B/param), %.2f ms (30 B/param) | Adam-shaped stream %.2f ms "
                "(%.1f GB/s)",
                static_cast<long long>(n), threads, torch_med, adam_med, adam_gbps, bf16_med, copy_gbps, bound_ms,
                bound_bf16_ms, stream_med, stream_gbps);
  std::cout << line << "\n";
  std::snprintf(line, sizeof line,
                "  torch / cpu_adam = %.2fx (target >= 3) | cpu_adam / bound = %.2f (target <= 2) | "
                "cpu_adam+bf16 / bound = %.2f | cpu_adam / stream = %.2f",
                torch_med / adam_med, adam_med / bound_ms, bf16_med / bound_bf16_ms, adam_med / stream_med);
  std::cout << line << "\n";
  std::snprintf(line, sizeof line,
                "{\"benchmark\":\"cpu_adam\",\"n\":%lld,\"threads\":%d,\"isa\":\"%s\",\"repeats\":%d,"
                "\"torch_adamw_ms\":%.3f,\"cpu_adam_ms\":%.3f,\"cpu_adam_bf16_ms\":%.3f,\"copy_gbps\":%.2f,"
                "\"bound_ms\":%.3f,\"bound_bf16_ms\":%.3f,\"speedup_vs_torch\":%.3f,\"cpu_adam_over_bound\":%.3f,"
                "\"cpu_adam_bf16_over_bound\":%.3f,\"stream_ms\":%.3f,\"cpu_adam_over_stream\":%.3f}",
                static_cast<long long>(n), threads, kuafu::optim::cpu_adam_isa(), repeats, torch_med, adam_med,
                bf16_med, copy_gbps, bound_ms, bound_bf16_ms, torch_med / adam_med, adam_med / bound_ms,
                bf16_med / bound_bf16_ms, stream_med, adam_med / stream_med);
  std::cout << line << std::endl;
}

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const int64_t n = std::stoll(item);
    if (n <= 0) throw std::invalid_argument("sizes must be positive");
    sizes.push_back(n);
  }
  if (sizes.empty()) throw std::invalid_argument("no sizes given");
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<int64_t> sizes = parse_sizes(argc > 1 ? argv[1] : "10000000,100000000");
    const int repeats = argc > 2 ? std::stoi(argv[2]) : 7;
    const int threads = argc > 3 ? std::stoi(argv[3]) : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (repeats < 1 || threads < 1) throw std::invalid_argument("repeats and threads must be at least 1");
    at::set_num_threads(threads);
    std::cout << "cpu_adam_benchmark: isa=" << kuafu::optim::cpu_adam_isa() << " threads=" << at::get_num_threads()
              << " repeats=" << repeats << " (medians, warm-up excluded)" << std::endl;
    for (int64_t n : sizes) run_size(n, repeats, threads);
  } catch (const std::exception& e) {
    std::cerr << "cpu_adam_benchmark: " << e.what()
              << "\nusage: cpu_adam_benchmark [sizes=10000000,100000000] [repeats=7] [threads]\n";
    return 1;
  }
  return 0;
}
