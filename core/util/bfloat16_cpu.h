// bfloat16 on the CPU as its 16 bits (c10::BFloat16's layout), for the hand-vectorised kernels that take it
// (CPU Adam's half copy, the loss's rows, GELU) while they compute in float32. Widening is exact (the bits
// move up half a word). Narrowing rounds to nearest even as c10::BFloat16(float) does: add 0x7fff plus the
// lowest kept bit and keep the high half; NaN becomes 0x7fc0. Not VCVTNEPS2BF16, which flushes subnormals
// to zero.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/util/cpu_features.h"

namespace kuafu::bf16 {

inline float to_float(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t from_float(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) inline __m256 to_float_avx2(__m128i b) {  // 8 values
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

// AVX2 has no 32->16 bit narrowing store: pack within the 128-bit lanes, then bring the two low quads together.
__attribute__((target("avx2"))) inline __m128i from_float_avx2(__m256 x) {  // 8 values
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0xd8));
}

__attribute__((target("avx512f"))) inline __m256i from_float_avx512(__m512 x) {  // 16 values
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0)));
}

__attribute__((target("avx2"))) inline void to_float_avx2(const uint16_t* in, float* out, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(out + i, to_float_avx2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < count; ++i) out[i] = to_float(in[i]);
}

__attribute__((target("avx2"))) inline void from_float_avx2(const float* in, uint16_t* out, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), from_float_avx2(_mm256_loadu_ps(in + i)));
  for (; i < count; ++i) out[i] = from_float(in[i]);
}
#endif

// `count` values, on the calling thread (the kernels call these inside their parallel regions).
inline void to_float(const uint16_t* in, float* out, int64_t count, CpuPath path = CpuPath::kBest) {
#if defined(__x86_64__)
  if (path == CpuPath::kBest && cpu_has_avx2_fma()) return to_float_avx2(in, out, count);
#endif
  for (int64_t i = 0; i < count; ++i) out[i] = to_float(in[i]);
}

inline void from_float(const float* in, uint16_t* out, int64_t count, CpuPath path = CpuPath::kBest) {
#if defined(__x86_64__)
  if (path == CpuPath::kBest && cpu_has_avx2_fma()) return from_float_avx2(in, out, count);
#endif
  for (int64_t i = 0; i < count; ++i) out[i] = from_float(in[i]);
}

}  // namespace kuafu::bf16
