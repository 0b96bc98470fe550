// Adam/AdamW step over flat fp32 buffers in host memory: the optimizer for parameters that live on the
// CPU (Gemini/offload). Vectorised (AVX-512 / AVX2+FMA picked at run time, scalar fallback elsewhere), multi-threaded.
#pragma once

#include <cstdint>

namespace kuafu::optim {

enum class HalfKind { kNone, kBFloat16, kFloat16 };

struct CpuAdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled_weight_decay = true;  // true: AdamW (p *= 1 - lr*wd); false: Adam with L2 (g += wd*p)
  bool bias_correction = true;
  int64_t step = 1;                    // 1-based step number AFTER increment (as torch's state.step)
};

// All buffers hold `numel` elements; param, exp_avg and exp_avg_sq are updated in place.
struct CpuAdamBuffers {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t numel;
  void* half_out = nullptr;  // optional: also write updated param rounded (nearest-even) to bf16/fp16
  HalfKind half_kind = HalfKind::kNone;
  float grad_scale = 1.0f;  // grads are multiplied by this first (1/loss_scale, clipping coefficient) in the same pass
};

// One step of torch::optim::AdamW / Adam (CPU, AVX2/AVX-512 kernels): the same float operations in the
// same order, fused multiply-adds where ATen's kernels fuse them, with a correctly rounded square root
// (torch's is MKL's, within 1 ulp): moments bitwise equal to torch's, params within a last bit per step. Every path (AVX-512,
// AVX2, scalar) and every thread count gives the same bits. Splits the work over at::get_num_threads().
// Throws kuafu::Error on a negative numel, missing buffers or a bad KUAFU_CPU_ADAM_ISA.
void cpu_adam_step(const CpuAdamHyper& hyper, const CpuAdamBuffers& buffers);

// Which path runs on this machine: "avx512", "avx2" or "scalar" (for logs/benchmarks).
// Env KUAFU_CPU_ADAM_ISA=scalar|avx2 forces a lower path (tests use it to cover each path); it is read on
// every call, so a test can switch paths between calls. Asking for a path the CPU lacks gives the best it has.
const char* cpu_adam_isa();

}  // namespace kuafu::optim
