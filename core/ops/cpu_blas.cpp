#include "core/ops/cpu_blas.h"

// libkuafu_sgemm.so's controls (core/ops/sgemm_override.cpp).
extern "C" {
void kuafu_sgemm_use_openblas(bool on);
bool kuafu_sgemm_uses_openblas();
int64_t kuafu_sgemm_openblas_calls();
bool kuafu_sgemm_is_the_process_sgemm();
const char* kuafu_sgemm_next_library();
}

namespace kuafu::ops {

void set_cpu_blas(CpuBlas blas) { kuafu_sgemm_use_openblas(blas == CpuBlas::kOpenBlas); }
CpuBlas cpu_blas() { return kuafu_sgemm_uses_openblas() ? CpuBlas::kOpenBlas : CpuBlas::kLibTorch; }
bool sgemm_is_kuafus() { return kuafu_sgemm_is_the_process_sgemm(); }
int64_t openblas_sgemm_calls() { return kuafu_sgemm_openblas_calls(); }
std::string libtorch_sgemm_library() { return kuafu_sgemm_next_library(); }

}  // namespace kuafu::ops
