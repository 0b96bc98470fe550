#include "core/ops/skinny_linear.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/ops/fused_kernels.h"
#include "core/util/cpu_features.h"
#include "core/util/error.h"

namespace kuafu::ops {
namespace {

struct Product {
  const float* x;     // [rows, in]
  const float* w;     // [out, in]
  const float* bias;  // [out] or null
  float* y;           // [rows, out]
  int64_t rows, in, out;
};

void scalar_outputs(const Product& p, int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n) {
    const float* w = p.w + n * p.in;
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* x = p.x + r * p.in;
      float sum = 0;
      for (int64_t k = 0; k < p.in; ++k) sum += x[k] * w[k];
      p.y[r * p.out + n] = sum + (p.bias ? p.bias[n] : 0.0f);
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline float horizontal_sum(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

// Outputs n .. n + kOut - 1 of input rows first .. first + kIn - 1: one pass over those weight rows with
// kOut x kIn sums in registers, each weight vector loaded once for kIn rows and each input vector once for
// kOut outputs (3 x 4: 7 loads for 12 multiply-adds, where one output at a time took 9 for 8).
template <int kOut, int kIn>
__attribute__((target("avx2,fma"))) void avx2_tile(const Product& p, int64_t n, int64_t first) {
  const float* w = p.w + n * p.in;
  const float* x = p.x + first * p.in;
  __m256 sums[kOut][kIn];
  for (int o = 0; o < kOut; ++o) {
    for (int r = 0; r < kIn; ++r) sums[o][r] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  // Unrolled whole, so that the sums stay in registers (GCC's -O2 leaves them on the stack otherwise).
  for (; k + 8 <= p.in; k += 8) {
    __m256 wv[kOut];
#pragma GCC unroll 4
    for (int o = 0; o < kOut; ++o) wv[o] = _mm256_loadu_ps(w + o * p.in + k);
#pragma GCC unroll 4
    for (int r = 0; r < kIn; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * p.in + k);
#pragma GCC unroll 4
      for (int o = 0; o < kOut; ++o) sums[o][r] = _mm256_fmadd_ps(xv, wv[o], sums[o][r]);
    }
  }
  for (int o = 0; o < kOut; ++o) {
    for (int r = 0; r < kIn; ++r) {
      float sum = horizontal_sum(sums[o][r]);
      for (int64_t j = k; j < p.in; ++j) sum += x[r * p.in + j] * w[o * p.in + j];
      p.y[(first + r) * p.out + n + o] = sum + (p.bias ? p.bias[n + o] : 0.0f);
    }
  }
}

constexpr int kTileOut = 3, kTileIn = 4;
using Tile = void (*)(const Product&, int64_t, int64_t);
constexpr Tile kTiles[kTileOut][kTileIn] = {
    {avx2_tile<1, 1>, avx2_tile<1, 2>, avx2_tile<1, 3>, avx2_tile<1, 4>},
    {avx2_tile<2, 1>, avx2_tile<2, 2>, avx2_tile<2, 3>, avx2_tile<2, 4>},
    {avx2_tile<3, 1>, avx2_tile<3, 2>, avx2_tile<3, 3>, avx2_tile<3, 4>}};

void avx2_outputs(const Product& p, int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; n += kTileOut) {
    const int64_t outs = std::min<int64_t>(kTileOut, end - n);
    for (int64_t first = 0; first < p.rows; first += kTileIn) {
      kTiles[outs - 1][std::min<int64_t>(kTileIn, p.rows - first) - 1](p, n, first);
    }
  }
}

#endif

}  // namespace

bool skinny_linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!fused_kernels().skinny_linear) return false;
  const auto f32_cpu = [](const torch::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == torch::kFloat32; };
  if (!f32_cpu(x) || !f32_cpu(weight) || weight.dim() != 2 || !weight.is_contiguous()) return false;
  if (bias.defined() && (!f32_cpu(bias) || !bias.is_contiguous())) return false;
  // Only under no_grad (decoding, evaluation): training keeps BLAS's products, frozen layers (LoRA's base) too.
  if (torch::GradMode::is_enabled()) return false;
  return x.dim() >= 1 && x.size(-1) == weight.size(1) && x.numel() <= kSkinnyRowsMax * weight.size(1);
}

torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, bool vector) {
  KUAFU_CHECK(skinny_linear_applies(x, weight, bias), "skinny_linear takes float32 CPU rows (at most ", kSkinnyRowsMax,
              ") of the weight's input width ", weight.size(1), " under no_grad, got ", x.sizes());
  const torch::Tensor rows = x.reshape({-1, weight.size(1)}).contiguous();  // [M, in]
  torch::Tensor y = torch::empty({rows.size(0), weight.size(0)}, x.options());  // [M, out]
  const Product p{rows.data_ptr<float>(), weight.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr,
                  y.data_ptr<float>(), rows.size(0), weight.size(1), weight.size(0)};
  auto outputs = scalar_outputs;
#if defined(__x86_64__)
  if (vector && cpu_has_avx2_fma()) outputs = avx2_outputs;
#endif
  // About 64 KiB of weights per task: enough work to pay for a thread's start.
  const int64_t grain = std::max<int64_t>(1, (int64_t{16} << 10) / std::max<int64_t>(1, p.in));
  at::parallel_for(0, p.out, grain, [&](int64_t begin, int64_t end) { outputs(p, begin, end); });
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return y.view(sizes);
}

}  // namespace kuafu::ops
