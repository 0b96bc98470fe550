// Part of libkuafu_sgemm.so (see sgemm_override.cpp): the process's answer to MKL's question "is this an
// Intel processor?". The MKL inside LibTorch's wheel asks it (through the symbol mkl_serv_intel_cpu_true,
// which libtorch_cpu.so calls through its procedure linkage table, so the first definition in the load
// order answers) before it picks its kernels, and gives every other vendor's processor its generic kernels
// whatever instruction sets they have. Answering yes makes MKL pick by instruction set on AMD processors
// too: AVX2 and AVX-512 (with bfloat16 dot products where the processor has them). Its choice is made
// once, at the first question, so the answer only counts when set before MKL's first call.
// No LibTorch headers: a library below everything.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>

namespace {

std::atomic<int> answer{1};
std::atomic<int64_t> questions{0};
std::atomic<int> first_answer{-1};  // -1 until MKL first asks

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int mkl_serv_intel_cpu_true() {
  const int given = answer.load(std::memory_order_relaxed);
  int unset = -1;
  first_answer.compare_exchange_strong(unset, given);
  questions.fetch_add(1, std::memory_order_relaxed);
  return given;
}

__attribute__((visibility("default"))) void kuafu_mkl_answer_intel(bool yes) { answer.store(yes ? 1 : 0); }
// What MKL was told at its first question (its kernels follow it): 1 yes, 0 no, -1 not asked yet.
__attribute__((visibility("default"))) int kuafu_mkl_first_answer() { return first_answer.load(); }
__attribute__((visibility("default"))) int64_t kuafu_mkl_questions() { return questions.load(); }
__attribute__((visibility("default"))) bool kuafu_mkl_question_is_kuafus() {
  return dlsym(RTLD_DEFAULT, "mkl_serv_intel_cpu_true") == reinterpret_cast<void*>(&mkl_serv_intel_cpu_true);
}

}  // extern "C"
