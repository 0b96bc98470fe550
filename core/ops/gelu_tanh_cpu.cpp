#include "core/ops/gelu_tanh_cpu.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "core/ops/vector_exp_cpu.h"

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

}  // namespace

void gelu_tanh(const float* x, float* y, int64_t count, CpuPath path) {
  auto pass = scalar_forward;
#if defined(__x86_64__)
  if (vector_path(path)) pass = avx2_forward;
#endif
  at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) { pass(x, y, begin, end); });
}

void gelu_tanh_backward(const float* grad_y, const float* x, float* grad_x, int64_t count, CpuPath path) {
  auto pass = scalar_backward;
#if defined(__x86_64__)
  if (vector_path(path)) pass = avx2_backward;
#endif
  at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) { pass(grad_y, x, grad_x, begin, end); });
}

}  // namespace kuafu::ops::cpu
