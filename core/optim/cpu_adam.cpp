// CPU Adam/AdamW: one pass over param, grad, exp_avg and exp_avg_sq (28 bytes per element, 30 with a
// half-precision copy) instead of the ~10 passes of the torch::optim loop, split over the ATen threads.
//
// The float operations of torch::optim::AdamW / Adam running ATen's AVX2 or AVX-512 kernels (the default
// on x86), in the same order, which does per tensor:
//   p.mul_(1 - lr*wd)                        AdamW       | g = g.add(p, wd)                 Adam (L2)
//   m.mul_(b1).add_(g, 1 - b1)               ATen: m = fma(g, 1-b1, m*b1)
//   v.mul_(b2).addcmul_(g, g, 1 - b2)        ATen: v = fma((1-b2)*g, g, v*b2)  (built with -ffp-contract=fast)
//   denom = (v.sqrt() / sqrt(1 - b2^t)).add_(eps)
//   p.addcdiv_(m, denom, -lr / (1 - b1^t))   p = p + ((-step)*m)/denom
// The scalars are computed in double and rounded to float once, as ATen does with a double Scalar on a float
// tensor; the element maths is float with the same fused multiply-adds, so every path here (AVX-512, AVX2,
// scalar via std::fma) gives the same bits as each other, and as torch for the moments. The square root
// here is correctly rounded; the LibTorch 2.x wheel takes it from MKL (within 1 ulp), so params may differ
// from torch's by the last bit of a step.
#include "core/optim/cpu_adam.h"

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#if defined(__x86_64__)
#include <immintrin.h>  // GCC 12 warns inside it (bug 105593): silenced for this file in core/CMakeLists.txt
#endif

#include "core/util/bfloat16_cpu.h"
#include "core/util/cpu_features.h"
#include "core/util/error.h"

// at::parallel_for is header-only: compiled without OpenMP it silently runs everything on the calling thread.
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "core/optim/cpu_adam.cpp must be compiled with -fopenmp (CMake: find_package(OpenMP) and link OpenMP::OpenMP_CXX)"
#endif

namespace kuafu::optim {
namespace {

// Threads get whole 64-element blocks, so every chunk but the last runs entirely in the vector loop;
// 512 blocks (32K elements, ~1 MB of traffic) per thread at least, below that a thread costs more than it saves.
constexpr int64_t kBlock = 64;
constexpr int64_t kGrainBlocks = 512;

struct Coefficients {
  float grad_scale;
  float param_decay;  // AdamW: 1 - lr*wd; 1 otherwise (an exact no-op)
  bool add_l2;        // Adam with weight decay: g += wd*p
  float l2;
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float sqrt_bias2;     // sqrt(1 - b2^t), 1 without bias correction
  float eps;
  float neg_step_size;  // -lr / (1 - b1^t)
};

Coefficients coefficients(const CpuAdamHyper& h, float grad_scale) {
  const double t = static_cast<double>(h.step);
  const double bias1 = h.bias_correction ? 1.0 - std::pow(h.beta1, t) : 1.0;
  const double bias2 = h.bias_correction ? 1.0 - std::pow(h.beta2, t) : 1.0;
  Coefficients c;
  c.grad_scale = grad_scale;
  c.param_decay = static_cast<float>(h.decoupled_weight_decay ? 1.0 - h.lr * h.weight_decay : 1.0);
  c.add_l2 = !h.decoupled_weight_decay && h.weight_decay != 0.0;
  c.l2 = static_cast<float>(h.weight_decay);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.sqrt_bias2 = static_cast<float>(std::sqrt(bias2));
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-(h.lr / bias1));
  return c;
}

// The scalar path: tails of the vector loops, forced runs, and CPUs without AVX2.
void scalar_range(const Coefficients& c, const CpuAdamBuffers& b, int64_t begin, int64_t end) {
  auto* half = static_cast<uint16_t*>(b.half_out);
  for (int64_t i = begin; i < end; ++i) {
    float p = b.param[i] * c.param_decay;
    float g = b.grad[i] * c.grad_scale;
    if (c.add_l2) g = std::fma(p, c.l2, g);
    const float m = std::fma(g, c.one_minus_beta1, b.exp_avg[i] * c.beta1);
    const float v = std::fma(c.one_minus_beta2 * g, g, b.exp_avg_sq[i] * c.beta2);
    const float denom = std::sqrt(v) / c.sqrt_bias2 + c.eps;
    p = p + (c.neg_step_size * m) / denom;
    b.param[i] = p;
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    if (b.half_kind == HalfKind::kBFloat16) half[i] = bf16::from_float(p);
    if (b.half_kind == HalfKind::kFloat16) half[i] = c10::Half(p).x;
  }
}

#if defined(__x86_64__)
template <HalfKind kHalf>
__attribute__((target("avx512f"))) void avx512_range(const Coefficients& c, const CpuAdamBuffers& b, int64_t begin,
                                                     int64_t end) {
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale), param_decay = _mm512_set1_ps(c.param_decay);
  const __m512 l2 = _mm512_set1_ps(c.l2), beta1 = _mm512_set1_ps(c.beta1), beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 sqrt_bias2 = _mm512_set1_ps(c.sqrt_bias2), eps = _mm512_set1_ps(c.eps);
  const __m512 neg_step_size = _mm512_set1_ps(c.neg_step_size);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(b.param + i), param_decay);
    __m512 g = _mm512_mul_ps(_mm512_loadu_ps(b.grad + i), grad_scale);
    if (c.add_l2) g = _mm512_fmadd_ps(p, l2, g);
    const __m512 m = _mm512_fmadd_ps(g, one_minus_beta1, _mm512_mul_ps(_mm512_loadu_ps(b.exp_avg + i), beta1));
    const __m512 v =
        _mm512_fmadd_ps(_mm512_mul_ps(one_minus_beta2, g), g, _mm512_mul_ps(_mm512_loadu_ps(b.exp_avg_sq + i), beta2));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), sqrt_bias2), eps);
    p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m), denom));
    _mm512_storeu_ps(b.param + i, p);
    _mm512_storeu_ps(b.exp_avg + i, m);
    _mm512_storeu_ps(b.exp_avg_sq + i, v);
    if constexpr (kHalf != HalfKind::kNone) {
      auto* half = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(b.half_out) + i);
      _mm256_storeu_si256(half, kHalf == HalfKind::kBFloat16 ? bf16::from_float_avx512(p)
                                                             : _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
    }
  }
  scalar_range(c, b, i, end);
}

template <HalfKind kHalf>
__attribute__((target("avx2,fma,f16c"))) void avx2_range(const Coefficients& c, const CpuAdamBuffers& b, int64_t begin,
                                                          int64_t end) {
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale), param_decay = _mm256_set1_ps(c.param_decay);
  const __m256 l2 = _mm256_set1_ps(c.l2), beta1 = _mm256_set1_ps(c.beta1), beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 sqrt_bias2 = _mm256_set1_ps(c.sqrt_bias2), eps = _mm256_set1_ps(c.eps);
  const __m256 neg_step_size = _mm256_set1_ps(c.neg_step_size);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(b.param + i), param_decay);
    __m256 g = _mm256_mul_ps(_mm256_loadu_ps(b.grad + i), grad_scale);
    if (c.add_l2) g = _mm256_fmadd_ps(p, l2, g);
    const __m256 m = _mm256_fmadd_ps(g, one_minus_beta1, _mm256_mul_ps(_mm256_loadu_ps(b.exp_avg + i), beta1));
    const __m256 v =
        _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, g), g, _mm256_mul_ps(_mm256_loadu_ps(b.exp_avg_sq + i), beta2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), sqrt_bias2), eps);
    p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step_size, m), denom));
    _mm256_storeu_ps(b.param + i, p);
    _mm256_storeu_ps(b.exp_avg + i, m);
    _mm256_storeu_ps(b.exp_avg_sq + i, v);
    if constexpr (kHalf != HalfKind::kNone) {
      auto* half = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(b.half_out) + i);
      _mm_storeu_si128(half, kHalf == HalfKind::kBFloat16 ? bf16::from_float_avx2(p) : _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
    }
  }
  scalar_range(c, b, i, end);
}
#endif  // __x86_64__

enum class Isa { kScalar, kAvx2, kAvx512 };  // ordered: a forced path can only go down

Isa best_isa() {
  static const Isa best = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
    // Every CPU with AVX2 and FMA also has F16C (Intel since Ivy Bridge, AMD since Piledriver).
    if (cpu_has_avx2_fma()) return Isa::kAvx2;
#endif
    return Isa::kScalar;
  }();
  return best;
}

Isa selected_isa() {
  const char* env = std::getenv("KUAFU_CPU_ADAM_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  const std::string_view want(env);
  Isa forced;
  if (want == "scalar") {
    forced = Isa::kScalar;
  } else if (want == "avx2") {
    forced = Isa::kAvx2;
  } else if (want == "avx512") {
    forced = Isa::kAvx512;
  } else {
    throw Error(detail::concat("KUAFU_CPU_ADAM_ISA=", want, ": expected scalar, avx2 or avx512"));
  }
  return std::min(forced, best_isa());
}

using RangeFn = void (*)(const Coefficients&, const CpuAdamBuffers&, int64_t, int64_t);

template <HalfKind kHalf>
RangeFn vector_range([[maybe_unused]] Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::kAvx512) return avx512_range<kHalf>;
  if (isa == Isa::kAvx2) return avx2_range<kHalf>;
#endif
  return scalar_range;
}

}  // namespace

const char* cpu_adam_isa() {
  switch (selected_isa()) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kScalar: break;
  }
  return "scalar";
}

void cpu_adam_step(const CpuAdamHyper& hyper, const CpuAdamBuffers& buffers) {
  KUAFU_CHECK(buffers.numel >= 0, "cpu_adam_step: numel is ", buffers.numel);
  KUAFU_CHECK(!hyper.bias_correction || hyper.step >= 1, "cpu_adam_step: step is 1-based, got ", hyper.step);
  if (buffers.numel == 0) return;
  KUAFU_CHECK(buffers.param && buffers.grad && buffers.exp_avg && buffers.exp_avg_sq,
              "cpu_adam_step: param, grad, exp_avg and exp_avg_sq must all be given");
  KUAFU_CHECK(buffers.half_kind == HalfKind::kNone || buffers.half_out != nullptr,
              "cpu_adam_step: half_kind is set but half_out is null");
  const Coefficients c = coefficients(hyper, buffers.grad_scale);
  const Isa isa = selected_isa();
  RangeFn range = vector_range<HalfKind::kNone>(isa);
  if (buffers.half_kind == HalfKind::kBFloat16) range = vector_range<HalfKind::kBFloat16>(isa);
  if (buffers.half_kind == HalfKind::kFloat16) range = vector_range<HalfKind::kFloat16>(isa);
  const int64_t blocks = (buffers.numel + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, kGrainBlocks, [&](int64_t first, int64_t last) {
    range(c, buffers, first * kBlock, std::min(last * kBlock, buffers.numel));
  });
}

}  // namespace kuafu::optim
