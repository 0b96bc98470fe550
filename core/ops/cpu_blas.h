// Which BLAS multiplies float32 matrices on the CPU. LibTorch's CPU products (mm, addmm, bmm, matmul, and
// the block products inside its CPU flash attention) all call the BLAS routine sgemm_, which LibTorch's
// wheel binds to the MKL it carries. On AMD processors MKL runs them well below the machine's rate:
// GPT-2's output layer at 125 GFLOP/s where OpenBLAS reaches 200, and a causal attention layer's
// forward and backward about 8% slower (benchmarks/cpu_blas.py). Kuafu's executables link
// libkuafu_sgemm.so ahead of LibTorch: its sgemm_ is the one the process calls, and it sends each product
// to Debian's OpenBLAS (OpenMP build, sharing LibTorch's threads) or back to MKL, as runtime.cpu_blas
// says. Only sgemm_ is replaced: float64, bfloat16 and LAPACK stay LibTorch's.
#pragma once

#include <cstdint>
#include <string>

namespace kuafu::ops {

enum class CpuBlas { kOpenBlas, kLibTorch };

// The process-wide choice (default OpenBLAS); a no-op where sgemm_ is not Kuafu's (see below).
void set_cpu_blas(CpuBlas blas);
CpuBlas cpu_blas();

// Whether the process's sgemm_ is Kuafu's (false: a library loaded ahead of libkuafu_sgemm.so, or an
// LD_PRELOAD, took the symbol; every product is then that library's).
bool sgemm_is_kuafus();

// Products Kuafu's sgemm_ has sent to OpenBLAS so far in this process (tests count them).
int64_t openblas_sgemm_calls();

// The library whose sgemm_ the LibTorch choice calls (LibTorch's libtorch_cpu.so where all is in order).
std::string libtorch_sgemm_library();

}  // namespace kuafu::ops
