#include "core/ops/cross_entropy_rows_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/vector_exp_cpu.h"
#include "core/util/bfloat16_cpu.h"
#include "core/util/cpu_features.h"
#include "core/util/error.h"

namespace kuafu::ops::cpu {
namespace {

// The row's exponentials' sum after its max: e_j = exp(x_j - max) written over x_j when `keep` (the
// gradient pass scales them), summed in float64.
struct RowSums {
  float max;
  double sum;
};

RowSums scalar_exps(float* x, int64_t n, bool keep) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) max = std::max(max, x[j]);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float e = std::exp(x[j] - max);
    if (keep) x[j] = e;
    sum += e;
  }
  return {max, sum};
}

void scalar_scale(float* x, int64_t n, float by) {
  for (int64_t j = 0; j < n; ++j) x[j] *= by;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) RowSums avx2_exps(float* x, int64_t n, bool keep) {
  const int64_t whole = n / 8 * 8;
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < whole; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float max = -std::numeric_limits<float>::infinity();
  for (float l : lanes) max = std::max(max, l);
  for (int64_t j = whole; j < n; ++j) max = std::max(max, x[j]);
  const __m256 shift = _mm256_set1_ps(max);
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  for (int64_t j = 0; j < whole; j += 8) {
    const __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + j), shift));
    if (keep) _mm256_storeu_ps(x + j, e);
    low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double sums[4];
  _mm256_store_pd(sums, _mm256_add_pd(low, high));
  double sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
  for (int64_t j = whole; j < n; ++j) {
    const float e = std::exp(x[j] - max);
    if (keep) x[j] = e;
    sum += e;
  }
  return {max, sum};
}

__attribute__((target("avx2,fma"))) void avx2_scale(float* x, int64_t n, float by) {
  const int64_t whole = n / 8 * 8;
  const __m256 v = _mm256_set1_ps(by);
  for (int64_t j = 0; j < whole; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), v));
  for (int64_t j = whole; j < n; ++j) x[j] *= by;
}

#endif

// The kernels a row pass uses: the vector ones where the CPU has them.
struct RowKernels {
  RowSums (*exps)(float*, int64_t, bool) = scalar_exps;
  void (*scale)(float*, int64_t, float) = scalar_scale;
};

RowKernels row_kernels([[maybe_unused]] CpuPath path) {
  RowKernels k;
#if defined(__x86_64__)
  if (path == CpuPath::kBest && cpu_has_avx2_fma()) k.exps = avx2_exps, k.scale = avx2_scale;
#endif
  return k;
}

void check_rows(int64_t rows, int64_t row_stride, int64_t columns, const int64_t* targets, int64_t ignored) {
  KUAFU_CHECK(rows >= 0 && columns > 0 && row_stride >= columns, "cross_entropy_rows: ", rows, " rows of ", columns,
              " columns ", row_stride, " apart");
  for (int64_t r = 0; r < rows; ++r) {  // before any row changes: a bad target leaves the logits as they were
    KUAFU_CHECK(targets[r] == ignored || (targets[r] >= 0 && targets[r] < columns), "cross-entropy: row ", r,
                "'s target ", targets[r], " is outside the vocabulary [0, ", columns, ")");
  }
}

// One row x [columns]: its loss, and with `write_gradient` its gradient over x.
float pass_row(const RowKernels& k, float* x, int64_t columns, int64_t target, int64_t ignored, float scale,
               bool write_gradient) {
  const bool learned = target != ignored;
  const float picked = learned ? x[target] : 0.0f;
  const RowSums s = k.exps(x, columns, write_gradient);
  const double lse = static_cast<double>(s.max) + std::log(s.sum);
  if (write_gradient) {
    // softmax_j = e_j / sum; the row's gradient is (softmax - onehot) * scale, 0 on an ignored row.
    k.scale(x, columns, static_cast<float>(static_cast<double>(scale) / s.sum));
    if (learned) x[target] -= scale;
  }
  return learned ? static_cast<float>(lse - static_cast<double>(picked)) : 0.0f;
}

}  // namespace

void cross_entropy_rows(float* logits, int64_t rows, int64_t row_stride, int64_t columns, const int64_t* targets,
                        int64_t ignored, const float* scale, float* loss, bool write_gradient, CpuPath path) {
  check_rows(rows, row_stride, columns, targets, ignored);
  const RowKernels k = row_kernels(path);
  at::parallel_for(0, rows, /*grain_size=*/1, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      float* x = logits + r * row_stride;  // [row_stride]
      loss[r] = pass_row(k, x, columns, targets[r], ignored, scale[r], write_gradient);
      if (write_gradient) std::fill(x + columns, x + row_stride, 0.0f);
    }
  });
}

void cross_entropy_rows_bf16(uint16_t* logits, int64_t rows, int64_t row_stride, int64_t columns, const int64_t* targets,
                             int64_t ignored, const float* scale, float* loss, bool write_gradient, CpuPath path) {
  check_rows(rows, row_stride, columns, targets, ignored);
  const RowKernels k = row_kernels(path);
  at::parallel_for(0, rows, /*grain_size=*/1, [&](int64_t first, int64_t last) {
    std::vector<float> row(static_cast<size_t>(columns));  // [columns] float32, in the core's cache
    for (int64_t r = first; r < last; ++r) {
      uint16_t* x = logits + r * row_stride;  // [row_stride] bfloat16
      bf16::to_float(x, row.data(), columns, path);
      loss[r] = pass_row(k, row.data(), columns, targets[r], ignored, scale[r], write_gradient);
      if (!write_gradient) continue;
      bf16::from_float(row.data(), x, columns, path);
      std::fill(x + columns, x + row_stride, uint16_t{0});
    }
  });
}

}  // namespace kuafu::ops::cpu
