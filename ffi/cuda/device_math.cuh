// The math policy of the CUDA activation kernels and fused epilogues (activation.h's M): CUDA's
// math library, except float expm1 and erfc. erfc goes through jaxdnn's erfcx fit (erfcx_fit.h):
// erfc(|x|) = e^(-x^2) R(1 / (1 + |x|/2)), reflected for x < 0, with expf, the fast approximate
// division (2 ulp) for t, and an FMA correcting the rounding of x^2. CUDA's erfcf is about twice
// the instructions, which made exact gelu compute-bound (1.9 TB/s in bf16 on the H200 against
// 3.3+ TB/s for sigmoid and silu). Relative errors: erfc below 1e-6 where erfc(x) > 1e-30,
// expm1 below 1e-6 (tests/cuda/pointwise checks both against double precision).
#ifndef JAXDNN_CUDA_DEVICE_MATH_CUH_
#define JAXDNN_CUDA_DEVICE_MATH_CUH_

#include <cuda_runtime.h>

#include <type_traits>

#include "jaxdnn/activation.h"
#include "jaxdnn/erfcx_fit.h"

namespace jaxdnn::cuda {

struct DeviceMath : StdMath {
  // e^(-a^2) erfcx(a) = erfc(a) for 0 <= a <= 10; e = e^(-a^2), corrected for the rounding of a^2.
  static __device__ __forceinline__ float erfc_tail(float a, float* e) {
    const float a2 = a * a;
    const float a2_err = fmaf(a, a, -a2);  // a * a = a2 + a2_err exactly
    *e = expf(-a2) * (1.0f - a2_err);
    return *e * erfcx_poly(__fdividef(1.0f, 1.0f + 0.5f * a));
  }

  template <class T>
  static __device__ __forceinline__ T erfc(T x) {
    if constexpr (std::is_same_v<T, float>) {
      const float ax = fabsf(x);
      float e;
      const float tail = erfc_tail(fminf(ax, 10.0f), &e);  // erfc(10) ~ 2e-45
      const float r = x < 0.0f ? 2.0f - tail : (ax > 10.0f ? 0.0f : tail);
      return x != x ? x : r;  // fminf dropped the NaN
    } else {
      return StdMath::erfc(x);
    }
  }

  // e^x - 1: its Taylor polynomial to x^8 where |x| < ln(2)/2 (relative error below 1e-7 there),
  // expf(x) - 1 elsewhere (|e^x - 1| > 0.29: at most 4e-7); CUDA's expm1f costs about twice as
  // much, which held elu's forward to 2.3 TB/s in bf16 on the H200.
  template <class T>
  static __device__ __forceinline__ T expm1(T x) {
    if constexpr (std::is_same_v<T, float>) {
      const float small = x * (1.0f + x * (0.5f + x * (1.0f / 6 + x * (1.0f / 24 + x * (
          1.0f / 120 + x * (1.0f / 720 + x * (1.0f / 5040 + x * (1.0f / 40320))))))));
      return fabsf(x) < 0.34657359f ? small : expf(x) - 1.0f;  // NaN: expf(NaN) - 1 = NaN
    } else {
      return StdMath::expm1(x);
    }
  }

  // gelu'(x) = Phi(x) + x phi(x), Phi(x) = erfc(-x / sqrt(2)) / 2 and phi(x) = e^(-x^2 / 2) /
  // sqrt(2 pi) sharing one exponential (activation.h's generic formula takes two).
  static __device__ __forceinline__ float gelu_grad(float x) {
    const float ax = fabsf(x) * 0.70710678118654752f;
    float e;
    const float half_tail = 0.5f * erfc_tail(fminf(ax, 10.0f), &e);
    const float cdf = x > 0.0f ? 1.0f - half_tail : half_tail;
    const float pdf = ax > 10.0f ? 0.0f : 0.39894228040143268f * e;
    return x != x ? x : cdf + x * pdf;
  }
};

}  // namespace jaxdnn::cuda

#endif  // JAXDNN_CUDA_DEVICE_MATH_CUH_
