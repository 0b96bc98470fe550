#include "core/ops/cross_entropy_rows_cuda.h"

#include <cuda_runtime.h>

#include "core/ops/cuda_values.cuh"

namespace kuafu::ops::cuda {

namespace {

constexpr int kThreads = 256;

// A running maximum m and the sum s of exp(x - m) over the values seen.
struct MaxSum {
  float m;
  float s;
};

__device__ MaxSum combine(MaxSum a, MaxSum b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

// One block per row: pass 1 reads the row once for its log-sum-exp (online softmax), pass 2 reads it
// again and writes the gradient over it. Loads and stores are 16 bytes wide.
template <typename T>
__global__ void __launch_bounds__(kThreads) cross_entropy_rows_kernel(T* logits, int64_t row_stride, int64_t columns,
                                                                      const int64_t* targets, int64_t ignored,
                                                                      const float* scale, float* loss,
                                                                      bool write_gradient) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  T* x = logits + row * row_stride;
  uint4* packs = reinterpret_cast<uint4*>(x);
  const int64_t pack_count = row_stride / kVec;
  const int64_t target = targets[row];

  MaxSum acc{-INFINITY, 0.f};
  for (int64_t p = threadIdx.x; p < pack_count; p += kThreads) {
    uint4 raw = packs[p];
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (p * kVec + i >= columns) break;
      const float value = to_float(v[i]);
      if (value > acc.m) {
        acc.s = acc.s * __expf(acc.m - value) + 1.f;
        acc.m = value;
      } else {
        acc.s += __expf(value - acc.m);
      }
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset), __shfl_xor_sync(0xffffffffu, acc.s, offset)};
    acc = combine(acc, other);
  }
  __shared__ MaxSum warp_totals[kThreads / 32];
  __shared__ float row_lse;
  if (threadIdx.x % 32 == 0) warp_totals[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total = warp_totals[0];
    for (int w = 1; w < kThreads / 32; ++w) total = combine(total, warp_totals[w]);
    const float lse = total.m + logf(total.s);
    row_lse = lse;
    if (target == ignored) {
      loss[row] = 0.f;
    } else if (target < 0 || target >= columns) {
      loss[row] = NAN;  // a token outside the vocabulary: the step's loss turns non-finite and is refused
    } else {
      loss[row] = lse - to_float(x[target]);
    }
  }
  __syncthreads();  // the target's logit is read before pass 2 overwrites it
  if (!write_gradient) return;
  const float lse = row_lse;
  const float row_scale = scale[row];
  for (int64_t p = threadIdx.x; p < pack_count; p += kThreads) {
    uint4 raw = packs[p];
    T* v = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int64_t column = p * kVec + i;
      float gradient = 0.f;
      if (column < columns) {
        gradient = __expf(to_float(v[i]) - lse);
        if (column == target) gradient -= 1.f;
        gradient *= row_scale;
      }
      v[i] = from_float<T>(gradient);
    }
    packs[p] = raw;
  }
}

template <typename T>
bool launch(void* logits, int64_t rows, int64_t row_stride, int64_t columns, const int64_t* targets, int64_t ignored,
            const float* scale, float* loss, bool write_gradient, void* stream) {
  cross_entropy_rows_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<T*>(logits), row_stride, columns, targets, ignored, scale, loss, write_gradient);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace

bool cross_entropy_rows(void* logits, RowType type, int64_t rows, int64_t row_stride, int64_t columns,
                        const int64_t* targets, int64_t ignored, const float* scale, float* loss, bool write_gradient,
                        void* stream) {
  if (rows == 0) return true;
  switch (type) {
    case RowType::kFloat32:
      return launch<float>(logits, rows, row_stride, columns, targets, ignored, scale, loss, write_gradient, stream);
    case RowType::kBFloat16:
      return launch<__nv_bfloat16>(logits, rows, row_stride, columns, targets, ignored, scale, loss, write_gradient,
                                   stream);
    case RowType::kFloat16:
      return launch<__half>(logits, rows, row_stride, columns, targets, ignored, scale, loss, write_gradient, stream);
  }
  return false;
}

}  // namespace kuafu::ops::cuda
