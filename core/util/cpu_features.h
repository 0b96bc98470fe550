// Which vector instructions this CPU has, asked once: the hand-vectorised CPU kernels (skinny products, the
// loss's rows, sums of squares, GELU) choose their path by it.
#pragma once

namespace kuafu {

// A hand-vectorised kernel's path: kBest, the vector one where the CPU has it; kScalar, the portable loop
// (tests compare the two).
enum class CpuPath { kBest, kScalar };

inline bool cpu_has_avx2_fma() {
#if defined(__x86_64__)
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
#else
  return false;
#endif
}

}  // namespace kuafu
