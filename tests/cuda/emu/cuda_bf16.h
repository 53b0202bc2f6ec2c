// Emulated bfloat16 (see cuda_runtime.h): storage, conversions (round to nearest even) and the
// pair type the kernels store with.
#pragma once
#include "cuda_runtime.h"
#include "../pool/host_fp.h"
struct __nv_bfloat16 {
  unsigned short x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : x(hostfp::float_to_bf16(f)) {}
  operator float() const { return hostfp::bf16_to_float(x); }
};
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
inline float __bfloat162float(__nv_bfloat16 v) { return hostfp::bf16_to_float(v.x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
