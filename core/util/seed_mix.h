// Independent random streams from one seed: a stream per (seed, a, b, c), e.g. (run seed, step, row, use),
// so what a row draws does not depend on which rank or micro-batch computes it.
#pragma once

#include <cstdint>

namespace kuafu {

// splitmix64's finaliser over a mix of the four numbers.
inline uint64_t mix_seed(uint64_t seed, int64_t a, int64_t b, int64_t c) {
  uint64_t x = seed ^ (static_cast<uint64_t>(a) * 0x9E3779B97F4A7C15ULL) ^ (static_cast<uint64_t>(b) << 32) ^ static_cast<uint64_t>(c);
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace kuafu
