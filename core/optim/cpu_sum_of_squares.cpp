#include "core/optim/cpu_sum_of_squares.h"

#include <ATen/Parallel.h>

#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/util/cpu_features.h"
#include "core/util/error.h"

namespace kuafu::optim {
namespace {

constexpr int64_t kSquaresBlock = int64_t{1} << 16;  // values per block: 256 KB, within a core's L2
constexpr int64_t kSquaresLanes = 16;                // partial sums per block; value i of a 16-group goes to lane i

// A block's sum: 16 lanes, each the running sum of its values' squares, then the lanes in order, then the
// tail. float * float is exact in float64, so a fused multiply-add and a multiply then add give the same bits.
double scalar_block(const float* x, int64_t n) {
  double lane[kSquaresLanes] = {};
  int64_t i = 0;
  for (; i + kSquaresLanes <= n; i += kSquaresLanes) {
    for (int64_t j = 0; j < kSquaresLanes; ++j) lane[j] += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
  }
  double sum = 0;
  for (double l : lane) sum += l;
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sum;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) double avx2_block(const float* x, int64_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + kSquaresLanes <= n; i += kSquaresLanes) {
    for (int k = 0; k < 4; ++k) {  // lanes 4k .. 4k + 3
      const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * k));
      acc[k] = _mm256_fmadd_pd(d, d, acc[k]);
    }
  }
  alignas(32) double lane[kSquaresLanes];
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lane + 4 * k, acc[k]);
  double sum = 0;
  for (double l : lane) sum += l;
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sum;
}

#endif

}  // namespace

double cpu_sum_of_squares(const float* values, int64_t count, CpuPath path) {
  KUAFU_CHECK(count >= 0 && (count == 0 || values != nullptr), "cpu_sum_of_squares: ", count, " values at ",
              static_cast<const void*>(values));
  double (*block)(const float*, int64_t) = scalar_block;
#if defined(__x86_64__)
  if (path == CpuPath::kBest && cpu_has_avx2_fma()) block = avx2_block;
#endif
  const int64_t blocks = (count + kSquaresBlock - 1) / kSquaresBlock;
  std::vector<double> sums(static_cast<size_t>(blocks));  // [blocks]
  at::parallel_for(0, blocks, /*grain_size=*/4, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      sums[b] = block(values + b * kSquaresBlock, std::min(kSquaresBlock, count - b * kSquaresBlock));
    }
  });
  double total = 0;
  for (double s : sums) total += s;
  return total;
}

}  // namespace kuafu::optim
