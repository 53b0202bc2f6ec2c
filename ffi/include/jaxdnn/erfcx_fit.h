// erfcx(a) = e^(a^2) erfc(a) for a in [0, 10] as R(t), t = 1 / (1 + a/2): a degree-10
// least-squares polynomial (Chebyshev-weighted, against mpmath; scripts/fit_vec_math.py
// regenerates it), relative error below 5e-7 over the interval. Shared by the CPU's vectorizable
// float math (ffi/cpu/vec_math.h) and the CUDA kernels' (ffi/cuda/device_math.cuh), which compute
// t their own way (an exact division on the CPU, the fast approximate one on the GPU).
#ifndef JAXDNN_ERFCX_FIT_H_
#define JAXDNN_ERFCX_FIT_H_

#if defined(__CUDACC__)
#define JAXDNN_ERFCX_INLINE __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define JAXDNN_ERFCX_INLINE inline __attribute__((always_inline))
#else
#define JAXDNN_ERFCX_INLINE inline
#endif

namespace jaxdnn {

JAXDNN_ERFCX_INLINE float erfcx_poly(float t) {
  float r = 3.398299039620364e-02f;
  r = r * t - 2.4513568119715645e-01f;
  r = r * t + 7.276142897540214e-01f;
  r = r * t - 1.0895214677043006f;
  r = r * t + 7.942426840846346e-01f;
  r = r * t - 3.170884297990074e-01f;
  r = r * t + 3.1107081276056736e-01f;
  r = r * t + 2.166855705143187e-01f;
  r = r * t + 2.8639470210757756e-01f;
  r = r * t + 2.817418810138752e-01f;
  r = r * t + 1.2645738713845667e-05f;
  return r;
}

// A shorter fit for results rounded to 16-bit types (bfloat16 keeps 8 significant bits, float16
// 11): erfcx(a) ~ R6(t), t = 1 / (1 + 0.61 a), R6 of degree 6 (a Lawson-reweighted least-squares
// fit of relative error on [0, 10]), relative error below 3.5e-6 when evaluated in float32.
// The coefficients are halved: erfcx_poly6_half(t) = R6(t) / 2, as Phi(x) = erfc(-x/sqrt 2) / 2
// needs (scripts/fit_vec_math.py regenerates them).
constexpr float kErfcx6Scale = 0.61f;

JAXDNN_ERFCX_INLINE float erfcx_poly6_half(float t) {
  float r = 6.551390138e-02f;
  r = r * t - 2.492074396e-01f;
  r = r * t + 2.543146099e-01f;
  r = r * t + 7.257263651e-02f;
  r = r * t + 1.861911374e-01f;
  r = r * t + 1.705473410e-01f;
  r = r * t + 6.675391096e-05f;
  return r;
}

}  // namespace jaxdnn

#endif  // JAXDNN_ERFCX_FIT_H_
