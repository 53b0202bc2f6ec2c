// Bulk conversions between the storage types of f16_storage.h and float32 buffers, for kernels that
// run their arithmetic on blocks of float32 values. float16 uses the F16C instructions eight at a
// time when the compiler targets them; bfloat16 is a shift (load) and a rounding select (store),
// which compilers vectorize, or vcvtneps2bf16 (store) where the compiler targets AVX512-BF16.
#ifndef JAXDNN_CPU_F16_CONVERT_H_
#define JAXDNN_CPU_F16_CONVERT_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "f16_storage.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace jaxdnn::cpu::f16 {

template <typename S>
inline void to_float(const S* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src[i]);
}

template <typename S>
inline void from_float(const float* __restrict src, S* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = store<S>(src[i]);
}

// from_float for values known to be exactly representable in S (a selection of inputs, 0, ...):
// bfloat16 then only needs the upper half of each float (no rounding, no NaN test).
template <typename S>
inline void from_float_exact(const float* __restrict src, S* __restrict dst, int64_t n) {
  if constexpr (std::is_same_v<S, BF16>) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, src + i, 4);
      dst[i] = BF16{static_cast<uint16_t>(bits >> 16)};
    }
  } else {
    from_float(src, dst, n);
  }
}

#if defined(__F16C__)
template <>
inline void to_float<F16>(const F16* __restrict src, float* __restrict dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = load(src[i]);
}

template <>
inline void from_float<F16>(const float* __restrict src, F16* __restrict dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = store<F16>(src[i]);
}
#endif

#if defined(__AVX512BF16__)
// AVX512-BF16: vcvtneps2bf16 rounds 16 floats to nearest even and quiets NaN as store<BF16> does
// (0.064 against 0.133 ns per value, one core, L1-resident), but it flushes subnormal inputs to
// zero: a block of 32 with any subnormal takes store<BF16>, so every value rounds exactly as
// there. The test is on the bits (|x| in [1, 0x7fffff]): vfpclassps reports no denormal under
// MXCSR's denormals-are-zero, which XLA:CPU's threads set.
inline __mmask16 subnormal_mask(__m512 v) {
  const __m512i mag = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmplt_epu32_mask(_mm512_sub_epi32(mag, _mm512_set1_epi32(1)),
                                 _mm512_set1_epi32(0x7fffff));
}

template <>
inline void from_float<BF16>(const float* __restrict src, BF16* __restrict dst, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 v0 = _mm512_loadu_ps(src + i), v1 = _mm512_loadu_ps(src + i + 16);
    if (__builtin_expect((subnormal_mask(v0) | subnormal_mask(v1)) != 0, 0)) {
      for (int64_t j = i; j < i + 32; ++j) dst[j] = store<BF16>(src[j]);
      continue;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v0)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v1)));
  }
  for (; i < n; ++i) dst[i] = store<BF16>(src[i]);
}
#endif

}  // namespace jaxdnn::cpu::f16

#endif  // JAXDNN_CPU_F16_CONVERT_H_
