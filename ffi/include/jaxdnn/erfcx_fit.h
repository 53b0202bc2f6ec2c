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

}  // namespace jaxdnn

#endif  // JAXDNN_ERFCX_FIT_H_
