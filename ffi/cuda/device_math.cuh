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

// The math of the kernels whose results are stored in 16-bit types (bfloat16 keeps 8 significant
// bits, float16 11; half an ulp is 2e-3 and 2.4e-4): float math with relative errors below 2e-5,
// at about half the instructions of DeviceMath's, which made exact gelu and elu compute-bound in
// bf16 (2.2 and 2.4 TB/s on the H200 against 3.3+ for sigmoid). tests/cuda/pointwise checks
// each function against double precision.
//   exp(x) = 2^(x log2(e)) (MUFU.EX2; the rounding of the product costs up to 5e-6 at |x| = 88);
//   expm1: the Taylor polynomial to x^5 where |x| < ln(2)/2 (7e-6), exp(x) - 1 elsewhere;
//   gelu and gelu': Phi(-|x|) = erfc(|z|) / 2 = e^(-z^2) R6(1 / (1 + 0.61 |z|)) / 2, z = x/sqrt 2
//   (erfcx_fit.h's short fit, 3.5e-6; e^(-z^2) as 2^(-(|x| sqrt(log2(e) / 2))^2), whose
//   rounded square costs up to 1.5e-5 in the far tail), reflected for x > 0. No clamping:
//   |x| = inf gives e = 0 and t = 0, and NaN propagates through e.
struct DeviceMath16 : DeviceMath {
  static constexpr float kLog2e = 1.4426950408889634f;

  template <class T>
  static __device__ __forceinline__ T exp(T x) {
    static_assert(std::is_same_v<T, float>, "16-bit storage computes in float");
    return exp2f(x * kLog2e);
  }

  template <class T>
  static __device__ __forceinline__ T expm1(T x) {
    static_assert(std::is_same_v<T, float>, "16-bit storage computes in float");
    const float small =
        x * fmaf(x, fmaf(x, fmaf(x, fmaf(x, 1.0f / 120, 1.0f / 24), 1.0f / 6), 0.5f), 1.0f);
    return fabsf(x) < 0.34657359f ? small : exp(x) - 1.0f;
  }

  // erfc(|z|) / 2 from |x| = sqrt(2) |z| (Phi(-|x|), the half tail of the normal distribution),
  // and *e = e^(-z^2) = e^(-x^2 / 2).
  static __device__ __forceinline__ float normal_tail(float ax, float* e) {
    const float u = ax * 0.84932180028801904f;  // sqrt(log2(e) / 2)
    *e = exp2f(-u * u);
    const float t = __fdividef(1.0f, fmaf(kErfcx6Scale * 0.70710678118654752f, ax, 1.0f));
    return *e * erfcx_poly6_half(t);
  }

  // gelu(x) = x Phi(x), Phi(x) = 1 - Phi(-x) for x > 0.
  static __device__ __forceinline__ float gelu(float x) {
    float e;
    const float h = normal_tail(fabsf(x), &e);
    return x * (x > 0.0f ? 1.0f - h : h);
  }

  // gelu'(x) = Phi(x) + x phi(x), phi(x) = e^(-x^2 / 2) / sqrt(2 pi).
  static __device__ __forceinline__ float gelu_grad(float x) {
    float e;
    const float h = normal_tail(fabsf(x), &e);
    return fmaf(x, 0.39894228040143268f * e, x > 0.0f ? 1.0f - h : h);
  }
};

}  // namespace jaxdnn::cuda

#endif  // JAXDNN_CUDA_DEVICE_MATH_CUH_
