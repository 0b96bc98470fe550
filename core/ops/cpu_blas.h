// Which BLAS multiplies float32 matrices on the CPU. LibTorch's CPU products (mm, addmm, bmm, matmul, and
// the block products inside its CPU flash attention) all call the BLAS routine sgemm_, which LibTorch's
// wheel binds to the MKL it carries. On AMD processors MKL's own choice of kernels (its generic ones)
// runs them well below the machine's rate: GPT-2's output layer at 125 GFLOP/s where OpenBLAS reaches
// 200, and a causal attention layer's forward and backward about 8% slower (benchmarks/cpu_blas.py; with
// its instruction-set kernels, below, MKL is level with OpenBLAS at GPT-2 124M). Kuafu's executables link
// libkuafu_sgemm.so ahead of LibTorch: its sgemm_ is the one the process calls, and it sends each product
// to Debian's OpenBLAS (OpenMP build, sharing LibTorch's threads) or back to MKL, as runtime.cpu_blas
// says. Only sgemm_ is replaced: float64, bfloat16 and LAPACK stay LibTorch's.
//
// The same library answers MKL's "is this an Intel processor?" (core/ops/mkl_dispatch_override.cpp), by
// default yes, so that MKL picks its kernels by instruction set on AMD processors too: its bfloat16
// products (LibTorch's CPU flash attention takes its backward's block products there) run on AVX-512's
// bfloat16 dot products instead of MKL's generic kernels, 2.3x faster here (runtime.mkl_kernels). Only
// the processor's vendor is answered: MKL still reads which instruction sets the processor has.
#pragma once

#include <cstdint>
#include <optional>
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

// How MKL picks its kernels: by the processor's instruction sets on every vendor's processor (the
// default), or by MKL's own rule (its generic kernels on processors that are not Intel's). MKL decides at
// its first call, so a choice made after that cannot take effect: then this returns false and changes
// nothing.
enum class MklKernels { kByInstructionSet, kByVendor };
bool set_mkl_kernels(MklKernels kernels);
// What MKL was told when it decided; nullopt before its first call.
std::optional<MklKernels> mkl_kernels_in_use();
// Whether the answer MKL gets is Kuafu's (false: a library ahead of libkuafu_sgemm.so answers it).
bool mkl_question_is_kuafus();

}  // namespace kuafu::ops
