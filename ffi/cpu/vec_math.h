// Branch-free float32 exp, expm1, tanh and erfc that compilers vectorize (the standard library's
// are opaque calls, so loops over them stay scalar), plus the normal CDF Phi and gelu's derivative
// from one shared exponential (normal_tail). VecMathF plugs into activation.h's math policy
// parameter: activate<float, VecMathF>(...).
//
// Accuracy (measured over 2e7 random floats against double-precision libm): relative error at most
// 8e-8 for exp (1 ulp), 2.5e-7 for expm1, 3e-7 for tanh, 5e-7 for erfc; erfc is 0 for x > 10,
// where the true value is below 3e-45. (erf = 1 - erfc would lose relative accuracy near 0; only
// erfc is provided: gelu needs Phi(x) = erfc(-x / sqrt(2)) / 2, which is near 1/2 there.)
// Special values follow the standard library: exp(-inf) = 0, exp(+inf) = +inf, tanh(+-inf) = +-1,
// erfc(-inf) = 2, erfc(+inf) = 0; NaN in, NaN out. Subnormal results of exp are produced; results
// below the smallest subnormal round to 0.
//
// Method (scripts/fit_vec_math.py regenerates the fitted coefficients). exp: x = n ln2 + r with
// |r| <= ln2/2 (Cody-Waite split of ln2, n found by the 1.5 * 2^23 rounding trick, so no
// float-to-int conversion of out-of-range values), e^r by a degree-6 polynomial, and 2^n
// applied as two factors 2^(n/2) 2^(n - n/2) so that every result from the largest float down to
// the subnormals is reachable. expm1: the Taylor polynomial to x^8 for |x| < ln2/2, exp(x) - 1
// elsewhere. tanh: x P(x^2) / Q(x^2) with P, Q of degree 4, a relative-error least-squares fit
// (Lawson-reweighted linearized rational fit) on [0, 9.2], x clamped to +-9.2 where tanh rounds
// to 1. erfc: e^(-x^2) R(1 / (1 + |x|/2)) (reflected for x < 0), R a degree-10 least-squares
// polynomial fit (Chebyshev-weighted, against mpmath) of erfcx(x) = e^(x^2) erfc(x) on [0, 10];
// e^(-x^2) is corrected for the rounding of x^2 with an FMA.
#ifndef JAXDNN_CPU_VEC_MATH_H_
#define JAXDNN_CPU_VEC_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "jaxdnn/erfcx_fit.h"

// Always inlined: a call inside a loop stops its vectorization, and GCC's inliner gives up on
// these once a translation unit has inlined them in many places.
#if defined(__GNUC__)
#define JAXDNN_VEC_INLINE inline __attribute__((always_inline))
#else
#define JAXDNN_VEC_INLINE inline
#endif

namespace jaxdnn::cpu {

namespace vec_math_detail {

JAXDNN_VEC_INLINE float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
JAXDNN_VEC_INLINE uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// 2^n for integers |n| <= 127 (n comes in as the raw bits of the rounding trick's sum).
JAXDNN_VEC_INLINE float pow2i(uint32_t n_plus_127) { return bits_to_float(n_plus_127 << 23); }

}  // namespace vec_math_detail

struct VecMathF {
  // Range reduction shared by the exps: z = n ln2 + r, |r| <= ln2 / 2; returns e^r (a degree-6
  // polynomial with P(0) = 1 and P'(0) = 1 fixed, least-squares in relative error with Lawson
  // reweighting: fit error 3e-9, one FMA fewer than the degree-7 Taylor polynomial at the same
  // float32 accuracy) and n. |z| must stay below ~2^22 so the magic-number rounding holds.
  static JAXDNN_VEC_INLINE float exp_reduced(float z, int32_t& n) {
    using namespace vec_math_detail;
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kLn2Hi = 0.693359375f;        // 11 significant bits: n * kLn2Hi is exact
    constexpr float kLn2Lo = -2.12194440e-4f;
    constexpr float kMagic = 12582912.0f;         // 1.5 * 2^23
    const float shifted = z * kLog2e + kMagic;
    const float fn = shifted - kMagic;                        // round(z / ln2), as a float
    n = static_cast<int32_t>(float_to_bits(shifted) - float_to_bits(kMagic));
    float r = z - fn * kLn2Hi;
    r = r - fn * kLn2Lo;
    float p = 0.0013813986122407002f;
    p = p * r + 0.008368692642821883f;
    p = p * r + 0.04166839812012533f;
    p = p * r + 0.16666520850215275f;
    p = p * r + 0.4999999340942653f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p;
  }

  static JAXDNN_VEC_INLINE float exp(float x) {
    using namespace vec_math_detail;
    constexpr float kHi = 88.72283935546875f;    // above: overflow to +inf
    constexpr float kLo = -103.97208404541016f;  // below: underflow to 0
    const float xc = x > kHi ? kHi : (x < kLo ? kLo : x);  // keeps NaN
    int32_t n;
    const float p = exp_reduced(xc, n);
    const int32_t n1 = n >> 1;  // arithmetic shift: floor(n / 2)
    const int32_t n2 = n - n1;
    const float y = p * pow2i(static_cast<uint32_t>(n1 + 127)) *
                    pow2i(static_cast<uint32_t>(n2 + 127));
    const float inf = std::numeric_limits<float>::infinity();
    return x > kHi ? inf : (x < kLo ? 0.0f : y);
  }

  static JAXDNN_VEC_INLINE float expm1(float x) {
    const float small = x * (1.0f + x * (0.5f + x * (1.0f / 6 + x * (1.0f / 24 + x * (
        1.0f / 120 + x * (1.0f / 720 + x * (1.0f / 5040 + x * (1.0f / 40320))))))));
    const float ax = x < 0.0f ? -x : x;
    return ax < 0.34657359f ? small : exp(x) - 1.0f;
  }

  static JAXDNN_VEC_INLINE float tanh(float x) {
    // x P(x^2) / Q(x^2) on x clamped to +-9.2 (beyond, tanh rounds to +-1).
    const float xc = x > 9.2f ? 9.2f : (x < -9.2f ? -9.2f : x);  // keeps NaN
    const float u = xc * xc;
    float p = 1.3002467594926777e-08f;
    p = p * u + 2.03538740431329e-05f;
    p = p * u + 3.4800415414796334e-03f;
    p = p * u + 1.3367924747985183e-01f;
    p = p * u + 9.999999750802929e-01f;
    float q = 7.632092050704622e-07f;
    q = q * u + 3.2602354039567715e-04f;
    q = q * u + 2.5817802718779505e-02f;
    q = q * u + 4.6701236740914925e-01f;
    q = q * u + 1.0f;
    const float t = xc * p / q;
    return t > 1.0f ? 1.0f : (t < -1.0f ? -1.0f : t);
  }

  // erfcx(a) ~ R(1 / (1 + a/2)) for a in [0, 10] (see the header comment).
  static JAXDNN_VEC_INLINE float erfcx_fit(float a) { return erfcx_poly(1.0f / (1.0f + 0.5f * a)); }

  // e^(-a^2) for a >= 0, corrected for the rounding of a^2 (an FMA recovers its error).
  static JAXDNN_VEC_INLINE float exp_neg_square(float a) {
    const float a2 = a * a;
#if defined(__FMA__)
    const float a2_err = __builtin_fmaf(a, a, -a2);  // a * a = a2 + a2_err exactly
#else
    const float a2_err = 0.0f;
#endif
    return exp(-a2) * (1.0f - a2_err);
  }

  static JAXDNN_VEC_INLINE float erfc(float x) {
    // erfc(|x|) = e^(-x^2) R(t), t = 1 / (1 + |x|/2), reflected for x < 0.
    const float ax = x < 0.0f ? -x : x;
    const float a = ax > 10.0f ? 10.0f : ax;  // erfc(10) underflows anyway; keeps NaN
    const float tail = exp_neg_square(a) * erfcx_fit(a);
    return x < 0.0f ? 2.0f - tail : (ax > 10.0f ? 0.0f : tail);
  }

  // e^z for z in [-87.3, 88.7] (and NaN): exp's reduction and polynomial with 2^n applied as one
  // factor (|n| <= 126, a normal float) and no range checks, for callers that bound z themselves.
  static JAXDNN_VEC_INLINE float exp_normal_range(float z) {
    using namespace vec_math_detail;
    int32_t n;
    const float p = exp_reduced(z, n);
    return p * pow2i(static_cast<uint32_t>(n + 127));
  }

  // ln(x) for positive normal x, +inf and NaN (not for 0, negatives or subnormals: softmax's
  // sums, which are >= 1, are what it serves). x = 2^k z with z in [0.699, 1.398) (the exponent
  // taken by integer arithmetic on the bits), then ln z = 2 atanh(s), s = (z - 1) / (z + 1),
  // |s| <= 0.18, by its series to s^9 (truncation 3e-9), and k ln2 added in two parts. Relative
  // error 8e-8 (2e7 samples against double-precision libm).
  static JAXDNN_VEC_INLINE float log(float x) {
    using namespace vec_math_detail;
    constexpr uint32_t kOffset = 0x3f330000u;  // bits of 0.699
    const uint32_t bits = float_to_bits(x);
    const uint32_t shifted = bits - kOffset;
    const float k = static_cast<float>(static_cast<int32_t>(shifted) >> 23);
    const float z = bits_to_float(bits - (shifted & 0xff800000u));
    const float f = z - 1.0f;  // exact
    const float t = f / (2.0f + f);
    const float t2 = t * t;
    float p = 1.0f / 9.0f;
    p = p * t2 + 1.0f / 7.0f;
    p = p * t2 + 1.0f / 5.0f;
    p = p * t2 + 1.0f / 3.0f;
    const float log_z = f - t * (f - 2.0f * t2 * p);  // 2t(1 + t2 p), as f - t f + 2 t^3 p
    const float r = k * 0.693359375f + (log_z + k * -2.12194440e-4f);  // ln2 in two parts
    return x < std::numeric_limits<float>::infinity() ? r : x;  // +inf and NaN pass through
  }

  // e^z for z <= 88.7 (log-probabilities, say) with results below the smallest normal float
  // (z < -87.3) flushed to 0: e^(-inf) = 0, NaN in, NaN out. Cheaper than exp (one scale factor,
  // no overflow handling); z above 88.7 is clamped there (finite result), so callers bound z.
  static JAXDNN_VEC_INLINE float exp_flush(float z) {
    constexpr float kLo = -87.33654f;  // ln(2^-126)
    constexpr float kHi = 88.7f;
    const float zc = z < kLo ? kLo : (z > kHi ? kHi : z);  // keeps NaN
    const float y = exp_normal_range(zc);
    return z < kLo ? 0.0f : y;
  }

  // The standard normal's tail pieces, for Phi(x) = erfc(-x / sqrt 2) / 2 and gelu's derivative
  // Phi(x) + x phi(x), phi(x) = e^(-x^2/2) / sqrt(2 pi). With erfc(a) = e^(-a^2) erfcx(a) at
  // a = |x| / sqrt 2, both share e = e^(-x^2/2):
  //   Phi(x) = e s for x <= 0 and 1 - e s for x > 0, s = erfcx(a) / 2.
  // s ~ S(t), t = 1 / (1 + 0.55 a): a degree-8 fit of relative error 1.1e-7 on a in [0, 9.3]
  // (scripts/fit_vec_math.py). e is computed from x^2 itself, so the only rounding in its
  // argument is x^2's, which an FMA recovers: n = round(-x^2 / (2 ln2)),
  // u = x^2 + x2_err + 2 n ln2 (Cody-Waite, exact but for x2_err's rounding), and e = 2^n P(u),
  // P(u) ~ e^(-u/2) a degree-5 polynomial (relative error 1.1e-7 on |u| <= ln2). Beyond
  // x^2 = 172 (|x| > 13.1) e < 5e-38 is taken as 0, which keeps 2^n a normal float.
  // NaN gives NaN in e and s.
  static JAXDNN_VEC_INLINE void normal_tail(float x, float& e, float& s) {
    using namespace vec_math_detail;
    constexpr float kCut = 172.0f;
    constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float x2 = x * x;
#if defined(__FMA__)
    const float x2_err = __builtin_fmaf(x, x, -x2);  // x * x = x2 + x2_err exactly
#else
    const float x2_err = 0.0f;
#endif
    const float xc = x2 > kCut ? kCut : x2;  // keeps NaN
    const float shifted = xc * -0.72134752044448170f + kMagic;  // -log2(e) / 2
    const float fn = shifted - kMagic;
    float u = xc + fn * 1.38671875f;  // 2 ln2, high part: fn * it is exact
    u = u + fn * -4.2438888e-4f;      // 2 ln2, low part
    u = u + x2_err;
    float p = -2.5976385252e-04f;
    p = p * u + 2.6181230431e-03f;
    p = p * u - 2.0833893396e-02f;
    p = p * u + 1.2499808237e-01f;
    p = p * u - 0.5f;
    p = p * u + 1.0f;
    e = p * pow2i(float_to_bits(shifted) - float_to_bits(kMagic) + 127u);
    e = x2 > kCut ? 0.0f : e;
    const float t = 1.0f / (1.0f + 0.38890872965f * std::fabs(x));  // 0.55 / sqrt 2
    s = -3.3826098555e-02f;
    s = s * t + 1.8430345061e-01f;
    s = s * t - 3.7247688141e-01f;
    s = s * t + 2.8292110655e-01f;
    s = s * t - 2.9575024846e-02f;
    s = s * t + 1.6313930773e-01f;
    s = s * t + 1.4989337071e-01f;
    s = s * t + 1.5564002666e-01f;
    s = s * t - 1.9201200910e-05f;
  }

  // Phi(x), relative error below 8e-7 for |x| <= 13.1 (Phi(+-inf) = 1, 0).
  static JAXDNN_VEC_INLINE float normal_cdf(float x) {
    float e, s;
    normal_tail(x, e, s);
    const float g = e * s;
    return x > 0.0f ? 1.0f - g : g;
  }

  // gelu's f'(x) = Phi(x) + x phi(x) = g for x <= 0 and 1 - g for x > 0,
  // g = e (s - |x| / sqrt(2 pi)). Max error 4.1e-7 of |Phi(x)| + |x phi(x)| for |x| <= 13.1;
  // beyond, f' = [x > 0]. x = +-inf gives 0 * inf = NaN, as jax.nn's Phi + x phi.
  static JAXDNN_VEC_INLINE float gelu_grad(float x) {
    float e, s;
    normal_tail(x, e, s);
    const float g = e * (s - std::fabs(x) * 0.39894228040143268f);
    return x > 0.0f ? 1.0f - g : g;
  }
};

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_VEC_MATH_H_
