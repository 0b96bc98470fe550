#include "core/ops/cpu_blas.h"

// libkuafu_sgemm.so's controls (core/ops/sgemm_override.cpp).
extern "C" {
void kuafu_sgemm_use_openblas(bool on);
bool kuafu_sgemm_uses_openblas();
int64_t kuafu_sgemm_openblas_calls();
bool kuafu_sgemm_is_the_process_sgemm();
const char* kuafu_sgemm_next_library();
// core/ops/mkl_dispatch_override.cpp, in the same library.
void kuafu_mkl_by_instruction_set(bool on);
int kuafu_mkl_first_mode();
bool kuafu_mkl_question_is_kuafus();
}

namespace kuafu::ops {

void set_cpu_blas(CpuBlas blas) { kuafu_sgemm_use_openblas(blas == CpuBlas::kOpenBlas); }
CpuBlas cpu_blas() { return kuafu_sgemm_uses_openblas() ? CpuBlas::kOpenBlas : CpuBlas::kLibTorch; }
bool sgemm_is_kuafus() { return kuafu_sgemm_is_the_process_sgemm(); }
int64_t openblas_sgemm_calls() { return kuafu_sgemm_openblas_calls(); }
std::string libtorch_sgemm_library() { return kuafu_sgemm_next_library(); }

bool set_mkl_kernels(MklKernels kernels) {
  const bool yes = kernels == MklKernels::kByInstructionSet;
  const int first = kuafu_mkl_first_mode();
  if (first != -1 && first != static_cast<int>(yes)) return false;
  kuafu_mkl_by_instruction_set(yes);
  return true;
}

std::optional<MklKernels> mkl_kernels_in_use() {
  const int first = kuafu_mkl_first_mode();
  if (first == -1) return std::nullopt;
  return first == 1 ? MklKernels::kByInstructionSet : MklKernels::kByVendor;
}

bool mkl_question_is_kuafus() { return kuafu_mkl_question_is_kuafus(); }

}  // namespace kuafu::ops
