#include "core/ops/gelu_tanh_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "core/ops/vector_exp_cpu.h"
#include "core/util/bfloat16_cpu.h"

namespace kuafu::ops::cpu {
namespace {

constexpr float kTwoRootTwoOverPi = 1.5957691216057308f;  // 2 √(2/π): 2u = this (x + kCube x³)
constexpr float kCube = 0.044715f;
constexpr int64_t kGrain = 1 << 15;  // values per task: a few tens of microseconds

// exp(-2u) for x.
inline float exp_minus_2u(float x) { return std::exp(-kTwoRootTwoOverPi * x * (1.0f + kCube * x * x)); }

void scalar_forward(const float* x, float* y, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) y[i] = x[i] / (1.0f + exp_minus_2u(x[i]));
}

void scalar_backward(const float* dy, const float* x, float* dx, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float v = x[i], s = 1.0f / (1.0f + exp_minus_2u(v));
    const float du2 = kTwoRootTwoOverPi * (1.0f + 3.0f * kCube * v * v);  // (2u)'
    dx[i] = dy[i] * (s + v * (s * (1.0f - s)) * du2);
  }
}

#if defined(__x86_64__)
// The same formulas eight values at a time; the tail goes through the scalar loop.
__attribute__((target("avx2,fma"))) inline __m256 avx2_exp_minus_2u(__m256 v) {
  const __m256 inner = _mm256_mul_ps(v, _mm256_fmadd_ps(_mm256_mul_ps(v, v), _mm256_set1_ps(kCube), _mm256_set1_ps(1.0f)));
  return _ZGVdN8v_expf(_mm256_mul_ps(inner, _mm256_set1_ps(-kTwoRootTwoOverPi)));
}

__attribute__((target("avx2,fma"))) void avx2_forward(const float* x, float* y, int64_t begin, int64_t end) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, avx2_exp_minus_2u(v))));
  }
  scalar_forward(x, y, i, end);
}

__attribute__((target("avx2,fma"))) void avx2_backward(const float* dy, const float* x, float* dx, int64_t begin, int64_t end) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 slope = _mm256_set1_ps(kTwoRootTwoOverPi), slope_cube = _mm256_set1_ps(3.0f * kCube * kTwoRootTwoOverPi);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, avx2_exp_minus_2u(v)));
    const __m256 du2 = _mm256_fmadd_ps(_mm256_mul_ps(v, v), slope_cube, slope);  // (2u)'
    const __m256 ds = _mm256_mul_ps(s, _mm256_sub_ps(one, s));
    const __m256 gelu_slope = _mm256_fmadd_ps(_mm256_mul_ps(v, ds), du2, s);
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(dy + i), gelu_slope));
  }
  scalar_backward(dy, x, dx, i, end);
}

bool vector_path(CpuPath path) { return path == CpuPath::kBest && cpu_has_avx2_fma(); }
#endif

using ForwardPass = void (*)(const float*, float*, int64_t, int64_t);
using BackwardPass = void (*)(const float*, const float*, float*, int64_t, int64_t);

ForwardPass forward_pass([[maybe_unused]] CpuPath path) {
#if defined(__x86_64__)
  if (vector_path(path)) return avx2_forward;
#endif
  return scalar_forward;
}

BackwardPass backward_pass([[maybe_unused]] CpuPath path) {
#if defined(__x86_64__)
  if (vector_path(path)) return avx2_backward;
#endif
  return scalar_backward;
}

// bfloat16 values go through float32 blocks this long (a multiple of the vectors' 8), on the stack.
constexpr int64_t kBf16Block = 1024;

}  // namespace

void gelu_tanh(const float* x, float* y, int64_t count, CpuPath path) {
  const ForwardPass pass = forward_pass(path);
  at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) { pass(x, y, begin, end); });
}

void gelu_tanh_backward(const float* grad_y, const float* x, float* grad_x, int64_t count, CpuPath path) {
  const BackwardPass pass = backward_pass(path);
  at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) { pass(grad_y, x, grad_x, begin, end); });
}

void gelu_tanh_bf16(const uint16_t* x, uint16_t* y, int64_t count, CpuPath path) {
  const ForwardPass pass = forward_pass(path);
  at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) {
    float block[kBf16Block];  // [kBf16Block] x, then gelu(x)
    for (int64_t i = begin; i < end; i += kBf16Block) {
      const int64_t n = std::min(kBf16Block, end - i);
      bf16::to_float(x + i, block, n, path);
      pass(block, block, 0, n);
      bf16::from_float(block, y + i, n, path);
    }
  });
}

void gelu_tanh_backward_bf16(const uint16_t* grad_y, const uint16_t* x, uint16_t* grad_x, int64_t count, CpuPath path) {
  const BackwardPass pass = backward_pass(path);
  at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) {
    float dy[kBf16Block], v[kBf16Block];  // [kBf16Block] each; dy becomes grad_x
    for (int64_t i = begin; i < end; i += kBf16Block) {
      const int64_t n = std::min(kBf16Block, end - i);
      bf16::to_float(grad_y + i, dy, n, path);
      bf16::to_float(x + i, v, n, path);
      pass(dy, v, dy, 0, n);
      bf16::from_float(dy, grad_x + i, n, path);
    }
  });
}

}  // namespace kuafu::ops::cpu
