// Emulated float16 (see cuda_runtime.h): storage, conversions (round to nearest even) and the
// pair type the kernels store with.
#pragma once
#include "cuda_runtime.h"
#include "../pool/host_fp.h"
struct __half {
  unsigned short x;
  __half() = default;
  __half(float f) : x(hostfp::float_to_f16(f)) {}
  operator float() const { return hostfp::f16_to_float(x); }
};
struct alignas(4) __half2 { __half x, y; };
inline float __half2float(__half v) { return hostfp::f16_to_float(v.x); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half(float f) { return __half(f); }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline float2 __half22float2(__half2 h) { return {float(h.x), float(h.y)}; }
