// Part of libkuafu_sgemm.so (see sgemm_override.cpp): the process's answer to MKL's question "is this an
// Intel processor?". The MKL inside LibTorch's wheel asks it (through the symbol mkl_serv_intel_cpu_true,
// which libtorch_cpu.so calls through its procedure linkage table, so the first definition in the load
// order answers) before it picks its kernels, and gives every other vendor's processor its generic kernels
// whatever instruction sets they have. Answering yes makes MKL pick by instruction set on AMD processors
// too: AVX2 and AVX-512 (with bfloat16 dot products where the processor has them); otherwise MKL's own
// answer (the next definition, libtorch_cpu.so's) is passed on. MKL's choice is made once, at the first
// question, so the answer only counts when set before MKL's first call.
// No LibTorch headers: a library below everything.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>

namespace {

using Question = int (*)();

std::atomic<int> by_instruction_set{1};
std::atomic<int> first_mode{-1};  // by_instruction_set when MKL first asked; -1 until then

Question mkls_own_answer() {
  static const Question next = reinterpret_cast<Question>(dlsym(RTLD_NEXT, "mkl_serv_intel_cpu_true"));
  return next;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int mkl_serv_intel_cpu_true() {
  const int mode = by_instruction_set.load(std::memory_order_relaxed);
  int unset = -1;
  first_mode.compare_exchange_strong(unset, mode);
  if (mode == 1) return 1;
  const Question own = mkls_own_answer();
  return own != nullptr ? own() : 0;
}

__attribute__((visibility("default"))) void kuafu_mkl_by_instruction_set(bool on) { by_instruction_set.store(on ? 1 : 0); }
// How MKL was answered at its first question (its kernels follow it): 1 by instruction set, 0 by its own
// rule, -1 not asked yet.
__attribute__((visibility("default"))) int kuafu_mkl_first_mode() { return first_mode.load(); }
__attribute__((visibility("default"))) bool kuafu_mkl_question_is_kuafus() {
  return dlsym(RTLD_DEFAULT, "mkl_serv_intel_cpu_true") == reinterpret_cast<void*>(&mkl_serv_intel_cpu_true);
}

}  // extern "C"
