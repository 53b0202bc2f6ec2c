// The fused-convolution epilogue on the GPU (conv_problem.h ConvEpilogue): every forward kernel
// passes each output value, with its flat output index i and its output channel k, through the
// epilogue just before it rounds and stores it:
//   z = v + bias[k] + residual[i];  preact[i] = z (when asked);  return act(z).
// bias, residual and preact have the output's dtype; the arithmetic is in the accumulator type
// (fp32, or fp64 for f64) and the value is rounded once, at the store.
//
// Cost notes (H200, bf16 r50_c3_3x3 on the wgmma kernel: bias+relu took the kernel from 25 to 40 us
// before these helpers were reshaped):
// - The caller passes the channel k (GEMM column + group offset) instead of deriving it from the
//   64-bit flat index (i % K, (i / pixels) % K): a 64-bit division is a ~70-instruction software
//   routine, per value. Only epi_fill, which walks flat indices, still divides.
// - The activation is dispatched once per run of values (epi_detail::act_run), not per value, and
//   only the cheap piecewise-linear kinds (identity, relu, leaky_relu, clipped_relu) are inlined;
//   the transcendental kinds call one out-of-line function. Inlining all ten kinds at every value
//   had made ~88% of the wgmma kernel's SASS epilogue code (52k of 60k instructions at 128x128).
// - Biases depend on the column only: epi_bias_run loads a run of them once, and the kernels
//   keep them across the rows that a thread stores.
#ifndef JAXDNN_CUDA_EPILOGUE_CUH_
#define JAXDNN_CUDA_EPILOGUE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "device_math.cuh"
#include "jaxdnn/activation.h"
#include "jaxdnn/conv_problem.h"

namespace jaxdnn::cuda {

struct EpiDev {
  const void* bias = nullptr;
  const void* residual = nullptr;
  void* preact = nullptr;
  long long K = 1;       // output channels (epi_fill's channel of a flat index)
  long long pixels = 1;  // output pixels per image (NCHW channel index)
  float param = 0.f;
  double param64 = 0.0;
  int act = 0;           // jaxdnn::Activation
  int dtype = 0;         // jaxdnn::DType of the output (and of bias, residual, preact)
  bool nchw = false;
  bool on = false;       // any epilogue at all
  bool aligned16 = false;  // bias, residual and preact 16-byte aligned: vector loads/stores allowed
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
  d.aligned16 = ((reinterpret_cast<uintptr_t>(e.bias) | reinterpret_cast<uintptr_t>(e.residual) |
                  reinterpret_cast<uintptr_t>(e.preact)) & 15) == 0;
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

// n 16-bit values (dt 2 = bf16, 3 = f16) packed in n / 2 words to floats.
template <int n>
__device__ __forceinline__ void unpack16v(const uint32_t* w, int dt, float* f) {
#pragma unroll
  for (int j = 0; j < n / 2; ++j) {
    if (dt == 2) {
      f[2 * j] = __uint_as_float(w[j] << 16), f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    } else {
      const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
      f[2 * j] = h.x, f[2 * j + 1] = h.y;
    }
  }
}
// n (2, 4 or 8) 16-bit values (dt 2 = bf16, 3 = f16) at p + i, i % n == 0 and p 16-byte aligned:
// one 4-, 8- or 16-byte access.
template <int n>
__device__ __forceinline__ void load16v(const void* p, long long i, int dt, float* f) {
  static_assert(n == 2 || n == 4 || n == 8, "16-bit vector width");
  const unsigned short* s = static_cast<const unsigned short*>(p) + i;
  uint32_t w[n / 2];
  if constexpr (n == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(s);
    w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
  } else if constexpr (n == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(s);
    w[0] = u.x, w[1] = u.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(s);
  }
  unpack16v<n>(w, dt, f);
}
template <int n>
__device__ __forceinline__ void store16v(void* p, long long i, int dt, const float* f) {
  uint32_t w[n / 2];
#pragma unroll
  for (int j = 0; j < n / 2; ++j) {
    if (dt == 2) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
      w[j] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __half2 h = __floats2half2_rn(f[2 * j], f[2 * j + 1]);
      w[j] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
  unsigned short* d = static_cast<unsigned short*>(p) + i;
  if constexpr (n == 8) *reinterpret_cast<uint4*>(d) = make_uint4(w[0], w[1], w[2], w[3]);
  else if constexpr (n == 4) *reinterpret_cast<uint2*>(d) = make_uint2(w[0], w[1]);
  else *reinterpret_cast<uint32_t*>(d) = w[0];
}

// The transcendental kinds (elu, sigmoid, tanh, gelu, gelu_tanh, silu) out of line: their math is
// long and would otherwise be inlined at every value of every epilogue loop; next to exp/erfc
// the call costs little. Same function, same arithmetic as the inlined activate.
template <class A>
__device__ __noinline__ A activate_slow(int act, A x, A param) {
  return activate<A, DeviceMath>(static_cast<Activation>(act), x, param);
}

// v[q] = act(v[q]) for q < n, the kind dispatched once for the run.
template <int n, class A>
__device__ __forceinline__ void act_run(const EpiDev& e, A* v) {
  const A prm = param_of<A>(e);
  switch (static_cast<Activation>(e.act)) {
    case Activation::kIdentity: return;
    case Activation::kRelu:
#pragma unroll
      for (int q = 0; q < n; ++q) v[q] = activate<A>(Activation::kRelu, v[q], prm);
      return;
    case Activation::kLeakyRelu:
#pragma unroll
      for (int q = 0; q < n; ++q) v[q] = activate<A>(Activation::kLeakyRelu, v[q], prm);
      return;
    case Activation::kClippedRelu:
#pragma unroll
      for (int q = 0; q < n; ++q) v[q] = activate<A>(Activation::kClippedRelu, v[q], prm);
      return;
    default:
#pragma unroll
      for (int q = 0; q < n; ++q) v[q] = activate_slow<A>(e.act, v[q], prm);
      return;
  }
}
}  // namespace epi_detail

// The epilogue of one output value v (the accumulator, before rounding) at flat index i, output
// channel k.
template <class A>
__device__ __forceinline__ A epi_apply(const EpiDev& e, long long i, long long k, A v) {
  if (e.bias) v += epi_detail::load<A>(e.bias, k, e.dtype);
  if (e.residual) v += epi_detail::load<A>(e.residual, i, e.dtype);
  if (e.preact) epi_detail::store<A>(e.preact, i, e.dtype, v);
  epi_detail::act_run<1, A>(e, &v);
  return v;
}

// The same where only the flat index is known (the channel costs a 64-bit division).
template <class A>
__device__ __forceinline__ A epi_apply_flat(const EpiDev& e, long long i, A v) {
  const long long k = e.nchw ? (i / e.pixels) % e.K : i % e.K;
  return epi_apply<A>(e, i, k, v);
}

// b[q] = bias[k + q] for q < cnt (cnt <= n consecutive channels; b[q] = 0 beyond and without a
// bias). Loaded once per column run: a thread that stores several rows of the same columns keeps
// them. A full run of 16-bit biases with k % n == 0 is one vector load.
template <int n>
__device__ __forceinline__ void epi_bias_run(const EpiDev& e, long long k, int cnt, float* b) {
#pragma unroll
  for (int q = 0; q < n; ++q) b[q] = 0.f;
  if (!e.bias) return;
  if ((n == 2 || n == 4 || n == 8) && cnt == n && (e.dtype == 2 || e.dtype == 3) && e.aligned16 &&
      k % n == 0) {
    epi_detail::load16v<n>(e.bias, k, e.dtype, b);
    return;
  }
#pragma unroll
  for (int q = 0; q < n; ++q)
    if (q < cnt) b[q] = epi_detail::load<float>(e.bias, k + q, e.dtype);
}

// Operands held raw. A kernel whose thread stores n consecutive channels (or values) that make
// one aligned 16-byte vector of the output dtype (n = 8 16-bit or 4 f32 values, index % n == 0,
// pointers 16-byte aligned: epi_raw16_ok) can load its biases, or the residuals of several
// pixels, as 16-byte words (four registers each) before it stores anything, and unpack them
// where it needs them. Issued one pixel at a time, each such load would wait for the previous
// pixel's store, which may alias it as far as the compiler knows.
template <int n>
__device__ __forceinline__ bool epi_raw16_ok(const EpiDev& e, long long index) {
  const bool fits = (n == 8 && (e.dtype == 2 || e.dtype == 3)) || (n == 4 && e.dtype == 0);
  return fits && e.aligned16 && index % n == 0;
}
// The 16 bytes of values index .. index + n - 1 of p (epi_raw16_ok).
template <int n>
__device__ __forceinline__ uint4 epi_raw16_load(const void* p, long long index) {
  return __ldg(reinterpret_cast<const uint4*>(p) + index / n);
}
template <int n>
__device__ __forceinline__ void epi_raw16_unpack(const EpiDev& e, const uint4& u, float* f) {
  if constexpr (n == 4) {
    f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
  } else {
    static_assert(n == 8, "16 bytes of 16-bit values");
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    epi_detail::unpack16v<8>(w, e.dtype, f);
  }
}

// Brings the line holding value i of p (an epilogue operand in the output's dtype) toward L2
// ahead of its use: a kernel asks for its residuals before its main loop, so that the epilogue's
// loads after it wait for L2, not DRAM. No registers are held across the loop.
__device__ __forceinline__ void epi_prefetch_l2(const EpiDev& e, const void* p, long long i) {
#ifndef JAXDNN_CUDA_EMULATION  // host emulation (tests/cuda/emu): nothing to prefetch
  const int bytes = e.dtype == 0 ? 4 : e.dtype == 1 ? 8 : 2;
  asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(p) + i * bytes));
#endif
}

// Pairs of 16-bit values (dtype 2 or 3) at even index i of a 4-byte aligned buffer: one raw
// 32-bit word each, loaded through the read-only path. A kernel loads a row's pairs before it
// stores any of them (stores between would hold each load back: the compiler cannot tell that
// they do not alias) and unpacks them where it adds them.
__device__ __forceinline__ uint32_t epi_pair16_load(const void* p, long long i) {
  return __ldg(reinterpret_cast<const unsigned int*>(p) + i / 2);
}
__device__ __forceinline__ void epi_pair16_unpack(const EpiDev& e, uint32_t w, float* f) {
  epi_detail::unpack16v<2>(&w, e.dtype, f);
}

namespace epi_detail {
// preact (when asked) and the activation of a run whose bias and residual are added.
template <int n>
__device__ __forceinline__ void finish_run(const EpiDev& e, long long i, float* v, int cnt,
                                           bool vec) {
  if (e.preact) {
    if (vec) {
      store16v<n>(e.preact, i, e.dtype, v);
    } else {
#pragma unroll
      for (int q = 0; q < n; ++q)
        if (q < cnt) store<float>(e.preact, i + q, e.dtype, v[q]);
    }
  }
  act_run<n, float>(e, v);  // also on v[q >= cnt]: harmless, never stored
}
}  // namespace epi_detail

// The epilogue of cnt <= n consecutive values of one row (flat indices i + q, channels k + q:
// NHWC, or any layout with unit channel stride), float accumulators, biases b from epi_bias_run.
// v[q] for q >= cnt is left alone. 16-bit residual/preact of a full run with i % n == 0 take one
// vector access. The loops are unrolled with q < cnt as a predicate so that v and b stay in
// registers (a runtime trip count would index them dynamically: local memory).
template <int n>
__device__ __forceinline__ void epi_apply_run(const EpiDev& e, long long i, const float* b, float* v,
                                              int cnt = n) {
  if (e.bias) {  // skipped without a bias: v + 0 would turn -0 into +0
#pragma unroll
    for (int q = 0; q < n; ++q) v[q] += b[q];
  }
  const bool vec = (n == 2 || n == 4 || n == 8) && cnt == n && (e.dtype == 2 || e.dtype == 3) &&
                   e.aligned16 && i % n == 0;
  if (e.residual) {
    if (vec) {
      float r[n];
      epi_detail::load16v<n>(e.residual, i, e.dtype, r);
#pragma unroll
      for (int q = 0; q < n; ++q) v[q] += r[q];
    } else if (n % 4 == 0 && cnt == n && e.dtype == 0 && e.aligned16 && i % 4 == 0) {
#pragma unroll
      for (int q = 0; q < n; q += 4) {  // float32, 16 bytes per load
        const float4 r = __ldg(reinterpret_cast<const float4*>(e.residual) + (i + q) / 4);
        v[q] += r.x, v[q + 1] += r.y, v[q + 2] += r.z, v[q + 3] += r.w;
      }
    } else {
#pragma unroll
      for (int q = 0; q < n; ++q)
        if (q < cnt) v[q] += epi_detail::load<float>(e.residual, i + q, e.dtype);
    }
  }
  epi_detail::finish_run<n>(e, i, v, cnt, vec);
}

// The same for a full run (cnt = n) whose biases b and residuals r were loaded ahead and
// unpacked (epi_raw16_load / epi_raw16_unpack, or epi_pair16_load / epi_pair16_unpack for n = 2);
// each is ignored where the epilogue has none.
template <int n>
__device__ __forceinline__ void epi_apply_run_loaded(const EpiDev& e, long long i, const float* b,
                                                     const float* r, float* v) {
  if (e.bias) {
#pragma unroll
    for (int q = 0; q < n; ++q) v[q] += b[q];
  }
  if (e.residual) {
#pragma unroll
    for (int q = 0; q < n; ++q) v[q] += r[q];
  }
  epi_detail::finish_run<n>(e, i, v, n, n == 8);
}

// relu folded into the rounding to 16 bits: cvt.rn.relu.{bf16x2,f16x2}.f32 clamps negative
// results to 0 and keeps NaN, so it gives round(relu(z)) (rounding is monotone and keeps the
// sign) in the conversion instruction that a 16-bit store needs anyway, instead of a compare and
// select per value. A kernel that packs its 16-bit outputs with pack2_16 calls
// epi_take_relu_to_store on its copy of the epilogue: that copy then leaves the relu out.
__device__ __forceinline__ uint32_t pack2_16(float lo, float hi, bool f16, bool relu) {
  uint32_t d;
#ifdef JAXDNN_CUDA_EMULATION  // host emulation (tests/cuda/emu): the same rounding in C++
  if (relu) lo = lo < 0.f ? 0.f : lo, hi = hi < 0.f ? 0.f : hi;
  if (f16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&d, &h, 4);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&d, &h, 4);
  }
  return d;
#endif
  if (relu) {
    if (f16) asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    else asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  } else {
    if (f16) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  }
  return d;
}
// true (and e's activation becomes the identity) when e's relu can go to a 16-bit store.
__host__ __device__ __forceinline__ bool epi_take_relu_to_store(EpiDev& e, bool out16) {
  if (!e.on || !out16 || e.act != static_cast<int>(Activation::kRelu)) return false;
  e.act = static_cast<int>(Activation::kIdentity);
  return true;
}

// y = act(0 + bias + residual) for a convolution with an empty reduction (no input channels or
// taps inside the input): the epilogue still applies where a plain call would write zeros.
template <class A>
__global__ void epi_fill_kernel(EpiDev e, void* y, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    epi_detail::store<A>(y, i, e.dtype, epi_apply_flat<A>(e, i, A(0)));
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
