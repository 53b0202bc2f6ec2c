// Emulated float16 (see cuda_runtime.h): storage and the conversions bias_act.cu uses.
#pragma once
#include "../../pool/host_fp.h"
struct __half { unsigned short x; };
inline float __half2float(__half v) { return hostfp::f16_to_float(v.x); }
inline __half __float2half_rn(float f) { return {hostfp::float_to_f16(f)}; }
