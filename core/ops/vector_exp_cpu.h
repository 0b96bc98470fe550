// glibc's vector expf for AVX2 (libmvec, linked by kuafu_hooks): the function GCC calls when it vectorises
// expf, eight values to within a few ulp. The CPU kernels for the loss's rows and for GELU call it.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

extern "C" __m256 _ZGVdN8v_expf(__m256 x);
#endif
