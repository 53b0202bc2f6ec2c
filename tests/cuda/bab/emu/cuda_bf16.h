// Emulated bfloat16 (see cuda_runtime.h): storage and the conversions bias_act.cu uses.
#pragma once
#include "../../pool/host_fp.h"
struct __nv_bfloat16 { unsigned short x; };
inline float __bfloat162float(__nv_bfloat16 v) { return hostfp::bf16_to_float(v.x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {hostfp::float_to_bf16(f)}; }
