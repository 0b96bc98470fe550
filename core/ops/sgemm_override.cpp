// libkuafu_sgemm.so: the process's sgemm_ (Fortran BLAS interface, column-major, as LibTorch declares and
// calls it), dispatching to OpenBLAS or to the next sgemm_ in the search order (LibTorch's MKL). Built
// as its own shared library so that it can sit ahead of LibTorch in every executable's load order; see
// core/ops/cpu_blas.h. No LibTorch headers: a library below everything.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>

#include <cblas.h>

namespace {

using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                       const int*, const float*, const int*, const float*, float*, const int*);

std::atomic<bool> use_openblas{true};
std::atomic<int64_t> openblas_calls{0};

Sgemm next_sgemm() {
  static const Sgemm next = reinterpret_cast<Sgemm>(dlsym(RTLD_NEXT, "sgemm_"));
  return next;
}

CBLAS_TRANSPOSE transpose_of(const char* t) { return (*t == 'N' || *t == 'n') ? CblasNoTrans : CblasTrans; }

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void sgemm_(const char* transa, const char* transb, const int* m,
                                                   const int* n, const int* k, const float* alpha, const float* a,
                                                   const int* lda, const float* b, const int* ldb,
                                                   const float* beta, float* c, const int* ldc) {
  const Sgemm next = next_sgemm();
  if (!use_openblas.load(std::memory_order_relaxed) && next != nullptr) {
    next(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  openblas_calls.fetch_add(1, std::memory_order_relaxed);
  cblas_sgemm(CblasColMajor, transpose_of(transa), transpose_of(transb), *m, *n, *k, *alpha, a, *lda, b, *ldb, *beta,
              c, *ldc);
}

__attribute__((visibility("default"))) void kuafu_sgemm_use_openblas(bool on) { use_openblas.store(on); }
__attribute__((visibility("default"))) bool kuafu_sgemm_uses_openblas() { return use_openblas.load(); }
__attribute__((visibility("default"))) int64_t kuafu_sgemm_openblas_calls() { return openblas_calls.load(); }
// The file of the sgemm_ that the LibTorch choice calls (LibTorch's own library where all is in order).
__attribute__((visibility("default"))) const char* kuafu_sgemm_next_library() {
  Dl_info info{};
  return next_sgemm() != nullptr && dladdr(reinterpret_cast<void*>(next_sgemm()), &info) != 0 ? info.dli_fname : "";
}
__attribute__((visibility("default"))) bool kuafu_sgemm_is_the_process_sgemm() {
  return dlsym(RTLD_DEFAULT, "sgemm_") == reinterpret_cast<void*>(&sgemm_);
}

}  // extern "C"
