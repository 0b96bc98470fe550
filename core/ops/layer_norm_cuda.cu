#include "core/ops/layer_norm_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "core/ops/cuda_values.cuh"

namespace kuafu::ops::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxValuesPerLane = 64;
constexpr int64_t kBackwardWarps = 2048;  // enough to fill an H100/H200 (132 SMs x 16 warps)

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// A lane's values of one row: kChunks packs of kVec elements, pack c at column (c * 32 + lane) * kVec.
template <typename T, int kChunks>
struct LaneRow {
  static constexpr int kVec = 16 / sizeof(T);
  float v[kChunks * kVec];

  __device__ void load(const T* row, int lane) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint4 raw = reinterpret_cast<const uint4*>(row)[c * 32 + lane];
      const T* p = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) v[c * kVec + k] = to_float(p[k]);
    }
  }

  __device__ void store(T* row, int lane) const {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      uint4 raw;
      T* p = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) p[k] = from_float<T>(v[c * kVec + k]);
      reinterpret_cast<uint4*>(row)[c * 32 + lane] = raw;
    }
  }
};

// One warp per row: the mean, then the variance about it (two passes over registers, as exact as
// Welford's), then y.
template <typename T, int kChunks>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    layer_norm_forward_kernel(const T* x, const T* gamma, const T* beta, T* y, float* mean_out, float* rstd_out,
                              int64_t rows, float eps) {
  constexpr int kColumns = kChunks * 32 * (16 / sizeof(T));
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  LaneRow<T, kChunks> r, g, b;
  r.load(x + row * kColumns, lane);
  g.load(gamma, lane);
  b.load(beta, lane);
  float sum = 0.f;
#pragma unroll
  for (float value : r.v) sum += value;
  const float mean = warp_sum(sum) / kColumns;
  float squares = 0.f;
#pragma unroll
  for (float value : r.v) squares += (value - mean) * (value - mean);
  const float rstd = rsqrtf(warp_sum(squares) / kColumns + eps);
#pragma unroll
  for (int i = 0; i < kChunks * LaneRow<T, kChunks>::kVec; ++i) r.v[i] = (r.v[i] - mean) * rstd * g.v[i] + b.v[i];
  r.store(y + row * kColumns, lane);
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// Each warp takes rows warp, warp + warps, ...: dx per row, and its own running sums of dy * xhat and dy
// per column, written once at the end as its partial row.
template <typename T, int kChunks>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    layer_norm_backward_kernel(const T* dy, const T* x, const float* mean, const float* rstd, const T* gamma, T* dx,
                               float* partials, int64_t warps, int64_t rows) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kValues = kChunks * kVec;
  constexpr int kColumns = kChunks * 32 * kVec;
  const int lane = threadIdx.x % 32;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (warp >= warps) return;
  LaneRow<T, kChunks> g;
  g.load(gamma, lane);
  float dgamma[kValues], dbeta[kValues];
#pragma unroll
  for (int i = 0; i < kValues; ++i) dgamma[i] = dbeta[i] = 0.f;
  for (int64_t row = warp; row < rows; row += warps) {
    LaneRow<T, kChunks> xr, dyr;
    xr.load(x + row * kColumns, lane);
    dyr.load(dy + row * kColumns, lane);
    const float mu = mean[row], s = rstd[row];
    float sum_g = 0.f, sum_g_xhat = 0.f;
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const float xhat = (xr.v[i] - mu) * s, gi = dyr.v[i] * g.v[i];
      dgamma[i] += dyr.v[i] * xhat;
      dbeta[i] += dyr.v[i];
      sum_g += gi;
      sum_g_xhat += gi * xhat;
      xr.v[i] = xhat;
    }
    const float mean_g = warp_sum(sum_g) / kColumns, mean_g_xhat = warp_sum(sum_g_xhat) / kColumns;
#pragma unroll
    for (int i = 0; i < kValues; ++i) xr.v[i] = s * (dyr.v[i] * g.v[i] - mean_g - xr.v[i] * mean_g_xhat);
    xr.store(dx + row * kColumns, lane);
  }
  float* gamma_row = partials + warp * kColumns;
  float* beta_row = partials + (warps + warp) * kColumns;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int column = (c * 32 + lane) * kVec + k;
      gamma_row[column] = dgamma[c * kVec + k];
      beta_row[column] = dbeta[c * kVec + k];
    }
  }
}

int vec_of(RowType type) { return type == RowType::kFloat32 ? 4 : 8; }

// Calls f(std::integral_constant<int, chunks>) for chunks in 1..16.
template <typename F>
bool with_chunks(int64_t chunks, F&& f) {
  switch (chunks) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 10: return f(std::integral_constant<int, 10>{});
    case 12: return f(std::integral_constant<int, 12>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default: return false;
  }
}

template <typename F>
bool with_type(RowType type, F&& f) {
  switch (type) {
    case RowType::kFloat32: return f(float{});
    case RowType::kBFloat16: return f(__nv_bfloat16{});
    case RowType::kFloat16: return f(__half{});
  }
  return false;
}

}  // namespace

bool layer_norm_takes(RowType type, int64_t columns) {
  const int64_t per_chunk = 32 * vec_of(type);
  if (columns % per_chunk != 0 || columns / 32 > kMaxValuesPerLane) return false;
  return with_chunks(columns / per_chunk, [](auto) { return true; });
}

namespace {

// launch(T{}, std::integral_constant<int, chunks>) for the element type and the packs a lane holds of
// `columns`; false for a shape the kernels do not take (no kernel is made for more than a lane holds).
template <typename F>
bool dispatch(RowType type, int64_t columns, F&& launch) {
  if (!layer_norm_takes(type, columns)) return false;
  return with_type(type, [&](auto zero) {
    using T = decltype(zero);
    return with_chunks(columns / (32 * (16 / sizeof(T))), [&](auto chunks) {
      if constexpr (decltype(chunks)::value * (16 / sizeof(T)) > kMaxValuesPerLane) {
        return false;
      } else {
        return launch(zero, chunks);
      }
    });
  });
}

}  // namespace

bool layer_norm_forward(RowType type, const void* x, const void* gamma, const void* beta, void* y, float* mean,
                        float* rstd, int64_t rows, int64_t columns, float eps, void* stream) {
  if (rows == 0) return layer_norm_takes(type, columns);
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return dispatch(type, columns, [&](auto zero, auto chunks) {
    using T = decltype(zero);
    layer_norm_forward_kernel<T, decltype(chunks)::value><<<blocks, kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta), static_cast<T*>(y), mean, rstd,
        rows, eps);
    return cudaGetLastError() == cudaSuccess;
  });
}

int64_t layer_norm_backward_warps(int64_t rows) { return std::max<int64_t>(1, std::min(rows, kBackwardWarps)); }

bool layer_norm_backward(RowType type, const void* dy, const void* x, const float* mean, const float* rstd,
                         const void* gamma, void* dx, float* partials, int64_t partial_rows, int64_t rows,
                         int64_t columns, void* stream) {
  const unsigned blocks = static_cast<unsigned>((partial_rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return dispatch(type, columns, [&](auto zero, auto chunks) {
    using T = decltype(zero);
    layer_norm_backward_kernel<T, decltype(chunks)::value><<<blocks, kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, static_cast<const T*>(gamma), static_cast<T*>(dx),
        partials, partial_rows, rows);
    return cudaGetLastError() == cudaSuccess;
  });
}

}  // namespace kuafu::ops::cuda
