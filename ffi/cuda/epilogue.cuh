// The fused-convolution epilogue on the GPU (conv_problem.h ConvEpilogue): every forward kernel
// passes each output value, with its flat output index, through epi_apply just before it rounds
// and stores it:  z = v + bias[k] + residual[i];  preact[i] = z (when asked);  return act(z).
// bias, residual and preact have the output's dtype. The channel k of flat index i is i % K
// (NHWC) or (i / pixels) % K (NCHW).
#ifndef JAXDNN_CUDA_EPILOGUE_CUH_
#define JAXDNN_CUDA_EPILOGUE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "jaxdnn/activation.h"
#include "jaxdnn/conv_problem.h"

namespace jaxdnn::cuda {

struct EpiDev {
  const void* bias = nullptr;
  const void* residual = nullptr;
  void* preact = nullptr;
  long long K = 1;       // output channels
  long long pixels = 1;  // output pixels per image (NCHW channel index)
  float param = 0.f;
  double param64 = 0.0;
  int act = 0;           // jaxdnn::Activation
  int dtype = 0;         // jaxdnn::DType of the output (and of bias, residual, preact)
  bool nchw = false;
  bool on = false;       // any epilogue at all
};

inline EpiDev make_epi(const ConvEpilogue& e, const ConvProblem& p, DType out) {
  EpiDev d;
  d.on = !e.empty();
  d.bias = e.bias, d.residual = e.residual, d.preact = e.preact;
  d.K = p.K;
  d.pixels = p.out_pixels();
  d.param = static_cast<float>(e.param), d.param64 = e.param;
  d.act = static_cast<int>(e.activation);
  d.dtype = static_cast<int>(out);
  d.nchw = p.layout == Layout::kNCHW;
  return d;
}

namespace epi_detail {
template <class A>
__device__ __forceinline__ A load(const void* p, long long i, int dt) {
  switch (dt) {
    case 0: return static_cast<A>(static_cast<const float*>(p)[i]);
    case 1: return static_cast<A>(static_cast<const double*>(p)[i]);
    case 2: return static_cast<A>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    default: return static_cast<A>(__half2float(static_cast<const __half*>(p)[i]));
  }
}
template <class A>
__device__ __forceinline__ void store(void* p, long long i, int dt, A v) {
  switch (dt) {
    case 0: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case 1: static_cast<double*>(p)[i] = static_cast<double>(v); break;
    case 2: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v)); break;
    default: static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v)); break;
  }
}
template <class A> __device__ __forceinline__ A param_of(const EpiDev& e);
template <> __device__ __forceinline__ float param_of<float>(const EpiDev& e) { return e.param; }
template <> __device__ __forceinline__ double param_of<double>(const EpiDev& e) { return e.param64; }
}  // namespace epi_detail

// The epilogue of one output value v (the accumulator, before rounding) at flat index i.
template <class A>
__device__ __forceinline__ A epi_apply(const EpiDev& e, long long i, A v) {
  if (e.bias) {
    const long long k = e.nchw ? (i / e.pixels) % e.K : i % e.K;
    v += epi_detail::load<A>(e.bias, k, e.dtype);
  }
  if (e.residual) v += epi_detail::load<A>(e.residual, i, e.dtype);
  if (e.preact) epi_detail::store<A>(e.preact, i, e.dtype, v);
  return activate<A>(static_cast<Activation>(e.act), v, epi_detail::param_of<A>(e));
}

// n consecutive channels of one NHWC pixel, v[q] at flat index i + q (i + q < n never wraps to
// the next pixel). 16-bit outputs with 16-byte aligned i take vector loads and stores.
template <int n>
__device__ __forceinline__ void epi_apply_run(const EpiDev& e, long long i, float* v) {
  const bool vec = n == 8 && (e.dtype == 2 || e.dtype == 3) && (i & 7) == 0 && e.K % 8 == 0 && !e.nchw;
  if (!vec) {
#pragma unroll
    for (int q = 0; q < n; ++q) v[q] = epi_apply<float>(e, i + q, v[q]);
    return;
  }
  auto widen = [&](const uint4& u, float* f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (e.dtype == 2) {
        f[2 * j] = __uint_as_float(w[j] << 16), f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
      } else {
        const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
        f[2 * j] = h.x, f[2 * j + 1] = h.y;
      }
    }
  };
  if (e.bias) {
    float b[8];
    widen(*reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(e.bias) + i % e.K), b);
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] += b[q];
  }
  if (e.residual) {
    float r[8];
    widen(*reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(e.residual) + i), r);
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] += r[q];
  }
  if (e.preact) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (e.dtype == 2) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
        w[j] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
        w[j] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    *reinterpret_cast<uint4*>(static_cast<unsigned short*>(e.preact) + i) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
  const Activation a = static_cast<Activation>(e.act);
#pragma unroll
  for (int q = 0; q < 8; ++q) v[q] = activate<float>(a, v[q], e.param);
}

// y = act(0 + bias + residual) for a convolution with an empty reduction (no input channels or
// taps inside the input): the epilogue still applies where a plain call would write zeros.
template <class A>
__global__ void epi_fill_kernel(EpiDev e, void* y, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    epi_detail::store<A>(y, i, e.dtype, epi_apply<A>(e, i, A(0)));
}

// Launches epi_fill_kernel over the n outputs; "" or the launch error.
inline std::string epi_fill(const EpiDev& e, void* y, long long n, cudaStream_t st) {
  if (n <= 0) return "";
  const int blocks = static_cast<int>(std::min<long long>((n + 255) / 256, 1 << 16));
  if (e.dtype == static_cast<int>(DType::kF64))
    epi_fill_kernel<double><<<blocks, 256, 0, st>>>(e, y, n);
  else
    epi_fill_kernel<float><<<blocks, 256, 0, st>>>(e, y, n);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? "" : std::string("epilogue fill launch: ") + cudaGetErrorString(err);
}

}  // namespace jaxdnn::cuda

#endif  // JAXDNN_CUDA_EPILOGUE_CUH_
