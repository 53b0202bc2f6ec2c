// 16-bit float storage types of the CPU kernels and their conversions to and from the compute
// type (float32 for the 16-bit types and float32, float64 for float64). Stores round to nearest
// even and keep NaN a (quiet) NaN. Written as selects, not branches, so that loops of loads and
// stores vectorize.
#ifndef JAXDNN_CPU_F16_STORAGE_H_
#define JAXDNN_CPU_F16_STORAGE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "jaxdnn/conv_problem.h"  // DType

namespace jaxdnn::cpu::f16 {

struct BF16 { uint16_t bits; };
struct F16 { uint16_t bits; };

// Calls fn(S()) with the storage type S of `dtype` (float, double, BF16 or F16): the one place
// where the kernels' entry points turn a runtime dtype into a template argument. False for any
// other dtype.
template <typename Fn>
bool with_storage_type(DType dtype, Fn&& fn);

// The arithmetic type of a storage type.
template <typename S>
using Compute = std::conditional_t<std::is_same_v<S, double>, double, float>;

inline float load(float v) { return v; }
inline double load(double v) { return v; }

inline float load(BF16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float load(F16 v) {
#if defined(__F16C__)
  return _cvtsh_ss(v.bits);
#else
  // sign | exponent rebias (15 -> 127) | mantissa; subnormals are scaled by 2^-24.
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  const uint32_t exp = (v.bits >> 10) & 0x1fu, mant = v.bits & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  const uint32_t bits = sign | (exp == 31 ? 0x7f800000u : (exp + 112) << 23) | mant << 13;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

template <typename S> S store(Compute<S> v);
template <> inline float store<float>(float v) { return v; }
template <> inline double store<double>(double v) { return v; }

template <> inline BF16 store<BF16>(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // to nearest even
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return BF16{static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

template <> inline F16 store<F16>(float v) {
#if defined(__F16C__)
  return F16{static_cast<uint16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT))};
#else
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) return F16{static_cast<uint16_t>(sign | 0x7e00u)};
  if (mag >= 0x477ff000u) return F16{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (mag < 0x38800000u) {  // f16 subnormal: an integer multiple of 2^-24, rounded to even
    const float scaled = std::nearbyint(std::ldexp(std::fabs(v), 24));
    return F16{static_cast<uint16_t>(sign | static_cast<uint16_t>(scaled))};
  }
  const uint32_t r = mag + 0xfffu + ((mag >> 13) & 1u);  // round to nearest even
  return F16{static_cast<uint16_t>(sign | (((r >> 13) - (112u << 10)) & 0xffffu))};
#endif
}

template <typename Fn>
bool with_storage_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: fn(float()); return true;
    case DType::kF64: fn(double()); return true;
    case DType::kBF16: fn(BF16()); return true;
    case DType::kF16: fn(F16()); return true;
  }
  return false;
}

}  // namespace jaxdnn::cpu::f16

#endif  // JAXDNN_CPU_F16_STORAGE_H_
