// bfloat16 and IEEE half <-> float conversions of the CPU backend (round to nearest even, NaN
// kept quiet), and element access to a buffer of any jaxdnn DType through float / double.
#ifndef JAXDNN_CPU_FLOAT16_H_
#define JAXDNN_CPU_FLOAT16_H_

#include <cstdint>
#include <cstring>

#include "jaxdnn/conv_problem.h"

namespace jaxdnn::cpu {

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;                      // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                     // overflow (rounds to inf)
  if (abs < 0x38800000u) {                                           // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;                              // below half the min subnormal
    const uint32_t exp = abs >> 23, mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;                                // 14..24
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);                    // round to nearest even
  return sign | static_cast<uint16_t>(((r >> 13) - (112u << 10)) & 0xffffu);
}

namespace float16_detail {

// dst[j] = cvt(s[j * stride]) with a separate unit-stride loop, which the compiler vectorizes.
template <typename S, typename D, class Cvt>
inline void gather(const S* s, int64_t stride, int64_t n, D* dst, const Cvt& cvt) {
  if (stride == 1) {
    for (int64_t j = 0; j < n; ++j) dst[j] = cvt(s[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = cvt(s[j * stride]);
  }
}

template <typename S, typename D, class Cvt>
inline void scatter(const S* src, int64_t n, D* d, int64_t stride, const Cvt& cvt) {
  if (stride == 1) {
    for (int64_t j = 0; j < n; ++j) d[j] = cvt(src[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) d[j * stride] = cvt(src[j]);
  }
}

}  // namespace float16_detail

// dst[j] = element (off + j * stride) of `src` (dtype t) as T, for j < n.
template <typename T>
inline void load_as(DType t, const void* src, int64_t off, int64_t stride, int64_t n, T* dst) {
  using float16_detail::gather;
  switch (t) {
    case DType::kF32:
      gather(static_cast<const float*>(src) + off, stride, n, dst, [](float v) { return T(v); });
      break;
    case DType::kF64:
      gather(static_cast<const double*>(src) + off, stride, n, dst, [](double v) { return T(v); });
      break;
    case DType::kBF16:
      gather(static_cast<const uint16_t*>(src) + off, stride, n, dst,
             [](uint16_t v) { return T(bf16_to_float(v)); });
      break;
    case DType::kF16:
      gather(static_cast<const uint16_t*>(src) + off, stride, n, dst,
             [](uint16_t v) { return T(f16_to_float(v)); });
      break;
  }
}

// Element (off + j * stride) of `dst` (dtype t) = src[j] rounded once to t, for j < n.
template <typename T>
inline void store_as(DType t, void* dst, int64_t off, int64_t stride, int64_t n, const T* src) {
  using float16_detail::scatter;
  switch (t) {
    case DType::kF32:
      scatter(src, n, static_cast<float*>(dst) + off, stride,
              [](T v) { return static_cast<float>(v); });
      break;
    case DType::kF64:
      scatter(src, n, static_cast<double*>(dst) + off, stride,
              [](T v) { return static_cast<double>(v); });
      break;
    case DType::kBF16:
      scatter(src, n, static_cast<uint16_t*>(dst) + off, stride,
              [](T v) { return float_to_bf16(static_cast<float>(v)); });
      break;
    case DType::kF16:
      scatter(src, n, static_cast<uint16_t*>(dst) + off, stride,
              [](T v) { return float_to_f16(static_cast<float>(v)); });
      break;
  }
}

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_FLOAT16_H_
