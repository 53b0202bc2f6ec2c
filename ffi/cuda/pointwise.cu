// CUDA activation and softmax kernels (pointwise_problem.h describes the operations).
//
// Activations: memory-bound elementwise kernels. The arrays are processed as 16-byte vectors
// (8 x 16-bit, 4 x f32, 2 x f64 per load/store) with a grid-stride loop over a grid sized to
// the device (resident blocks per SM x SM count), each thread issuing kUnroll independent vector
// loads before computing, so that enough bytes are in flight to saturate HBM. Operands and result
// may start at any address: when all of them share one offset modulo 16 bytes, a scalar head
// brings them to a 16-byte boundary and a scalar tail finishes the array; otherwise (mixed
// offsets) the whole array runs the scalar path. The formulas are activation.h's (CUDA's math
// library: expf, tanhf, ...; float erfc from device_math.cuh), instantiated per kind at compile
// time; 16-bit types compute in float, float64 in double.
//
// Softmax over [outer, n, inner], max-subtracted, sums in float (double for float64):
//   inner == 1, n a multiple of the 16-byte vector width V and n <= 128 V, aligned operands:
//                          32 / L rows per warp, L lanes per row, 16-byte loads, the row held in
//                          registers (read once, written once);
//   inner == 1, n <= 1024: one warp per row, the row held in registers (read once, written once);
//   inner == 1, n > 1024:  one block per row, three passes over the row (max, sum, write);
//   inner > 1:             one thread per (outer, inner) column, three passes down the column
//                          (consecutive threads read consecutive addresses).
// All indexing is 64-bit. Every launch is checked.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "device_math.cuh"
#include "pointwise_cuda.h"

namespace jaxdnn::cuda {
namespace {

using i64 = int64_t;

// ---------------------------------------------------------------------------------------------
// Element types.

template <typename S> struct Elem { using C = float; };
template <> struct Elem<double> { using C = double; };

__device__ __forceinline__ float to_c(float v) { return v; }
__device__ __forceinline__ double to_c(double v) { return v; }
__device__ __forceinline__ float to_c(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_c(__half v) { return __half2float(v); }

template <typename S> __device__ __forceinline__ S from_c(typename Elem<S>::C v);
template <> __device__ __forceinline__ float from_c<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_c<double>(double v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_c<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_c<__half>(float v) { return __float2half_rn(v); }

// SM count of the current device, cached (a host query; no stream work).
int sm_count() {
  static std::atomic<int> cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (dev >= 0 && dev < 64) {
    if (int v = cache[dev].load(std::memory_order_relaxed)) return v;
  }
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
  if (dev >= 0 && dev < 64) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

std::string check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return std::string(what) + ": " + cudaGetErrorString(e);
  return "";
}

// ---------------------------------------------------------------------------------------------
// Activations.

enum class Op { kForward, kGradInput, kGradOutput, kGrad2Input, kGrad2Output };

// The math policy by storage type: 16-bit results take DeviceMath16's shorter float math.
template <typename S>
using MathFor = std::conditional_t<sizeof(S) == 2, DeviceMath16, DeviceMath>;

template <Op kOp, Activation kA, typename C, typename M>
__device__ __forceinline__ C pointwise(C s, C p) {
  constexpr bool kShort = std::is_same_v<M, DeviceMath16>;
  if constexpr (kOp == Op::kForward && kA == Activation::kGelu && kShort) return M::gelu(s);
  if constexpr (kOp == Op::kForward) return activate<C, M>(kA, s, p);
  if constexpr (kOp == Op::kGradInput && kA == Activation::kGelu && std::is_same_v<C, float>)
    return M::gelu_grad(s);
  if constexpr (kOp == Op::kGradInput) return activation_grad_from_input<C, M>(kA, s, p);
  if constexpr (kOp == Op::kGradOutput) return activation_grad_from_output<C, M>(kA, s, p);
  if constexpr (kOp == Op::kGrad2Input) return activation_grad2_from_input<C, M>(kA, s, p);
  return activation_grad2_from_output<C, M>(kA, s, p);
}

// out = op(s) (* d). relu and relu6's first derivatives select the cotangent (as jax.nn does:
// a NaN or inf d outside the linear piece still gives 0) rather than multiply it by 0.
template <Op kOp, Activation kA, typename C, typename M>
__device__ __forceinline__ C apply(C s, C d, C p) {
  if constexpr (kOp == Op::kForward) {
    return pointwise<kOp, kA, C, M>(s, p);
  } else if constexpr ((kOp == Op::kGradInput || kOp == Op::kGradOutput) &&
                       (kA == Activation::kRelu || kA == Activation::kClippedRelu)) {
    return pointwise<kOp, kA, C, M>(s, p) != C(0) ? d : C(0);
  } else {
    return d * pointwise<kOp, kA, C, M>(s, p);
  }
}

constexpr int kActThreads = 256;
constexpr int kUnroll = 2;

template <typename S, Op kOp, Activation kA>
__global__ void __launch_bounds__(kActThreads)
    activation_kernel(const S* __restrict__ s, const S* __restrict__ dy, S* __restrict__ out,
                      i64 n, i64 head, i64 nvec, double param) {
  using C = typename Elem<S>::C;
  constexpr int V = 16 / sizeof(S);
  constexpr bool kBinary = kOp != Op::kForward;
  const C p = static_cast<C>(param);
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  const i64 tid = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;

  // 16-byte vectors: [head, head + nvec * V).
  const uint4* sv = reinterpret_cast<const uint4*>(s + head);
  const uint4* dv = reinterpret_cast<const uint4*>(kBinary ? dy + head : s + head);
  uint4* ov = reinterpret_cast<uint4*>(out + head);
  for (i64 i = tid; i < nvec; i += kUnroll * stride) {
    uint4 a[kUnroll], d[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const i64 k = i + u * stride;
      if (k < nvec) {
        a[u] = __ldg(sv + k);
        if constexpr (kBinary) d[u] = __ldg(dv + k);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const i64 k = i + u * stride;
      if (k < nvec) {
        const S* ae = reinterpret_cast<const S*>(&a[u]);
        uint4 r;
        S* re = reinterpret_cast<S*>(&r);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          C dval = C(0);
          if constexpr (kBinary) dval = to_c(reinterpret_cast<const S*>(&d[u])[e]);
          re[e] = from_c<S>(apply<kOp, kA, C, MathFor<S>>(to_c(ae[e]), dval, p));
        }
        ov[k] = r;
      }
    }
  }

  // Scalars: the head [0, head) and the tail [head + nvec * V, n).
  const i64 tail0 = head + nvec * V;
  const i64 nscalar = head + (n - tail0);
  for (i64 k = tid; k < nscalar; k += stride) {
    const i64 e = k < head ? k : tail0 + (k - head);
    C dval = C(0);
    if constexpr (kBinary) dval = to_c(dy[e]);
    out[e] = from_c<S>(apply<kOp, kA, C, MathFor<S>>(to_c(s[e]), dval, p));
  }
}

template <typename S, Op kOp, Activation kA>
std::string launch_activation(const ActivationCall& c, const void* s, const void* dy, void* out,
                              cudaStream_t stream) {
  constexpr int V = 16 / sizeof(S);
  const i64 n = c.n;
  // The vector path needs every buffer at one offset modulo 16 bytes (a whole number of
  // elements); the scalar head then aligns them.
  const uintptr_t off = reinterpret_cast<uintptr_t>(s) % 16;
  bool vectorize = off % sizeof(S) == 0 && reinterpret_cast<uintptr_t>(out) % 16 == off;
  if (kOp != Op::kForward) vectorize = vectorize && reinterpret_cast<uintptr_t>(dy) % 16 == off;
  i64 head = n, nvec = 0;
  if (vectorize) {
    head = std::min<i64>(n, static_cast<i64>((16 - off) % 16 / sizeof(S)));
    nvec = (n - head) / V;
  }
  const i64 nscalar = n - nvec * V;
  const i64 work = std::max<i64>((nvec + kUnroll - 1) / kUnroll, nscalar);

  static std::atomic<int> resident{0};  // blocks per SM, per instantiation
  int per_sm = resident.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, activation_kernel<S, kOp, kA>,
                                                      kActThreads, 0) != cudaSuccess ||
        per_sm <= 0)
      per_sm = 4;
    resident.store(per_sm, std::memory_order_relaxed);
  }
  const i64 full = std::max<i64>(1, static_cast<i64>(sm_count()) * per_sm);
  const i64 blocks = std::max<i64>(1, std::min<i64>((work + kActThreads - 1) / kActThreads, full));
  activation_kernel<S, kOp, kA><<<static_cast<unsigned>(blocks), kActThreads, 0, stream>>>(
      static_cast<const S*>(s), static_cast<const S*>(dy), static_cast<S*>(out), n, head, nvec,
      c.param);
  return check_launch("jaxdnn activation kernel launch");
}

template <typename S, Op kOp>
std::string dispatch_kind(const ActivationCall& c, const void* s, const void* dy, void* out,
                          cudaStream_t stream) {
  switch (c.activation) {
#define JAXDNN_ACT_CASE(kind)     \
    case Activation::kind:          \
      return launch_activation<S, kOp, Activation::kind>(c, s, dy, out, stream);
    JAXDNN_ACT_CASE(kIdentity)
    JAXDNN_ACT_CASE(kRelu)
    JAXDNN_ACT_CASE(kLeakyRelu)
    JAXDNN_ACT_CASE(kClippedRelu)
    JAXDNN_ACT_CASE(kElu)
    JAXDNN_ACT_CASE(kSigmoid)
    JAXDNN_ACT_CASE(kTanh)
    JAXDNN_ACT_CASE(kGelu)
    JAXDNN_ACT_CASE(kGeluTanh)
    JAXDNN_ACT_CASE(kSilu)
#undef JAXDNN_ACT_CASE
  }
  return "unknown activation";
}

template <typename S>
std::string dispatch_op(const ActivationCall& c, const void* s, const void* dy, void* out,
                        cudaStream_t stream) {
  if (c.derivative == 0) return dispatch_kind<S, Op::kForward>(c, s, dy, out, stream);
  if (c.derivative == 1)
    return c.from_output ? dispatch_kind<S, Op::kGradOutput>(c, s, dy, out, stream)
                         : dispatch_kind<S, Op::kGradInput>(c, s, dy, out, stream);
  return c.from_output ? dispatch_kind<S, Op::kGrad2Output>(c, s, dy, out, stream)
                       : dispatch_kind<S, Op::kGrad2Input>(c, s, dy, out, stream);
}

// ---------------------------------------------------------------------------------------------
// Softmax.

template <typename C> __device__ __forceinline__ C neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -CUDART_INF_F; }
template <> __device__ __forceinline__ double neg_inf<double>() { return -CUDART_INF; }

template <typename C> __device__ __forceinline__ C exp_c(C v) { return exp(v); }
template <> __device__ __forceinline__ float exp_c<float>(float v) { return expf(v); }
// exp for storage type S: DeviceMath16's 2^(x log2 e) for 16-bit results.
template <typename S, typename C>
__device__ __forceinline__ C exp_s(C v) {
  if constexpr (sizeof(S) == 2) return DeviceMath16::exp(v);
  else return exp_c(v);
}
template <typename C> __device__ __forceinline__ C log_c(C v) { return log(v); }
template <> __device__ __forceinline__ float log_c<float>(float v) { return logf(v); }

// NaN is skipped by the max (it reaches the output through the sum instead, as in jax.nn).
template <typename C> __device__ __forceinline__ C max_c(C a, C b) { return b > a ? b : a; }

// Max / sum over aligned groups of `width` lanes (a power of two; the whole warp by default).
template <typename C>
__device__ __forceinline__ C warp_max(C v, int width = 32) {
#pragma unroll
  for (int o = width >> 1; o > 0; o >>= 1) v = max_c(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename C>
__device__ __forceinline__ C warp_sum(C v, int width = 32) {
#pragma unroll
  for (int o = width >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// All threads of the block get the max (kMax) or the sum of v. Call from every thread.
template <bool kMax, typename C>
__device__ __forceinline__ C block_allreduce(C v) {
  __shared__ C partial[33];
  v = kMax ? warp_max(v) : warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    C w = lane < warps ? partial[lane] : (kMax ? neg_inf<C>() : C(0));
    w = kMax ? warp_max(w) : warp_sum(w);
    if (lane == 0) partial[32] = w;
  }
  __syncthreads();
  const C r = partial[32];
  __syncthreads();  // partial is reused by the next call
  return r;
}

// Backward: pass 1 sums term(y, v), pass 2 writes out(y, v, sum) (pointwise_problem.h).
template <SoftmaxOp kOp, typename S, typename C = typename Elem<S>::C>
__device__ __forceinline__ C bwd_term(C y, C v) {
  if constexpr (kOp == SoftmaxOp::kSoftmax) return v * y;
  if constexpr (kOp == SoftmaxOp::kLogSoftmax) return v;
  return v * exp_s<S>(y);
}

template <SoftmaxOp kOp, typename S, typename C = typename Elem<S>::C>
__device__ __forceinline__ C bwd_out(C y, C v, C sum) {
  if constexpr (kOp == SoftmaxOp::kSoftmax) return y * (v - sum);
  if constexpr (kOp == SoftmaxOp::kLogSoftmax) return v - exp_s<S>(y) * sum;
  return v - sum;
}

constexpr int kWarpRowThreads = 128;  // 4 rows per block
constexpr int kBlockRowThreads = 512;
constexpr int kColThreads = 256;

// --- one warp per row (n <= 32 * kPer) ---

template <typename S, bool kLog, int kPer>
__global__ void __launch_bounds__(kWarpRowThreads)
    softmax_fwd_warp(const S* __restrict__ x, S* __restrict__ y, i64 rows, int n) {
  using C = typename Elem<S>::C;
  const int lane = threadIdx.x & 31;
  const i64 warps = static_cast<i64>(gridDim.x) * (blockDim.x >> 5);
  for (i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       row < rows; row += warps) {
    const S* xr = x + row * n;
    S* yr = y + row * n;
    C v[kPer];
    C m = neg_inf<C>();
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = lane + 32 * k;
      v[k] = i < n ? to_c(xr[i]) : neg_inf<C>();
      m = max_c(m, v[k]);
    }
    m = warp_max(m);
    C sum = 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (lane + 32 * k < n) {
        const C e = exp_s<S>(v[k] - m);
        sum += e;
        if constexpr (!kLog) v[k] = e;
      }
    }
    sum = warp_sum(sum);
    if constexpr (kLog) {
      const C lse = log_c(sum);
#pragma unroll
      for (int k = 0; k < kPer; ++k)
        if (lane + 32 * k < n) yr[lane + 32 * k] = from_c<S>((v[k] - m) - lse);
    } else {
      const C inv = C(1) / sum;
#pragma unroll
      for (int k = 0; k < kPer; ++k)
        if (lane + 32 * k < n) yr[lane + 32 * k] = from_c<S>(v[k] * inv);
    }
  }
}

template <typename S, SoftmaxOp kOp, int kPer>
__global__ void __launch_bounds__(kWarpRowThreads)
    softmax_bwd_warp(const S* __restrict__ y, const S* __restrict__ g, S* __restrict__ out,
                     i64 rows, int n) {
  using C = typename Elem<S>::C;
  const int lane = threadIdx.x & 31;
  const i64 warps = static_cast<i64>(gridDim.x) * (blockDim.x >> 5);
  for (i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       row < rows; row += warps) {
    const i64 base = row * n;
    C yv[kPer], gv[kPer];
    C sum = 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = lane + 32 * k;
      if (i < n) {
        yv[k] = to_c(y[base + i]);
        gv[k] = to_c(g[base + i]);
        sum += bwd_term<kOp, S>(yv[k], gv[k]);
      }
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = lane + 32 * k;
      if (i < n) out[base + i] = from_c<S>(bwd_out<kOp, S>(yv[k], gv[k], sum));
    }
  }
}

// --- rows of 16-byte vectors, several rows per warp (n a multiple of V = 16 / sizeof(S), at
// most 32 * NV vectors, 16-byte-aligned operands) ---
// L lanes per row (a power of two <= 32), 32 / L rows per warp; lane l of a row holds its vectors
// l, l + L, ..., l + (NV - 1) L. A row of 64 bf16 channels takes 8 lanes with one 16-byte load
// each, where the warp-per-row kernels load 2 bytes per lane. With one vector per lane (NV = 1)
// the forward takes two such row groups per step and issues both loads first: each row's load
// is followed by a chain of shuffles, exps and a division, and a single 16-byte load in flight
// per thread held it to 2.5 TB/s (bf16, 64 channels, H200).
template <int NV> constexpr int kVecRows = NV == 1 ? 2 : 1;

template <typename S, bool kLog, int NV>
__global__ void __launch_bounds__(kWarpRowThreads)
    softmax_fwd_vec(const S* __restrict__ x, S* __restrict__ y, i64 rows, int n, int L) {
  using C = typename Elem<S>::C;
  constexpr int V = 16 / sizeof(S);
  const int lane = threadIdx.x & 31, l = lane & (L - 1), nvec = n / V, per_warp = 32 / L;
  const i64 step = static_cast<i64>(gridDim.x) * (blockDim.x >> 5) * per_warp * kVecRows<NV>;
  for (i64 r0 = (static_cast<i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)) *
                per_warp * kVecRows<NV>;
       r0 < rows; r0 += step) {  // warp-uniform: every lane reaches the shuffles
    uint4 u[kVecRows<NV>][NV];
#pragma unroll
    for (int g = 0; g < kVecRows<NV>; ++g) {
      const i64 row = r0 + g * per_warp + lane / L;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int q = k * L + l;
        u[g][k] = make_uint4(0, 0, 0, 0);
        if (row < rows && q < nvec) u[g][k] = __ldg(reinterpret_cast<const uint4*>(x + row * n) + q);
      }
    }
#pragma unroll
    for (int g = 0; g < kVecRows<NV>; ++g) {
      const i64 row = r0 + g * per_warp + lane / L;
      const bool live = row < rows;
      C v[NV][V];
      C m = neg_inf<C>();
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const bool in = live && k * L + l < nvec;
        const S* e = reinterpret_cast<const S*>(&u[g][k]);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          v[k][j] = in ? to_c(e[j]) : neg_inf<C>();
          m = max_c(m, v[k][j]);
        }
      }
      m = warp_max(m, L);
      C sum = 0;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (k * L + l < nvec) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const C e = exp_s<S>(v[k][j] - m);
            sum += e;
            if constexpr (!kLog) v[k][j] = e;
          }
        }
      }
      sum = warp_sum(sum, L);
      if (!live) continue;
      const C lse = kLog ? log_c(sum) : C(0), inv = kLog ? C(0) : C(1) / sum;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int q = k * L + l;
        if (q >= nvec) continue;
        uint4 w;
        S* e = reinterpret_cast<S*>(&w);
#pragma unroll
        for (int j = 0; j < V; ++j) e[j] = from_c<S>(kLog ? (v[k][j] - m) - lse : v[k][j] * inv);
        reinterpret_cast<uint4*>(y + row * n)[q] = w;
      }
    }
  }
}

template <typename S, SoftmaxOp kOp, int NV>
__global__ void __launch_bounds__(kWarpRowThreads)
    softmax_bwd_vec(const S* __restrict__ y, const S* __restrict__ g, S* __restrict__ out,
                    i64 rows, int n, int L) {
  using C = typename Elem<S>::C;
  constexpr int V = 16 / sizeof(S);
  const int lane = threadIdx.x & 31, l = lane & (L - 1), nvec = n / V, per_warp = 32 / L;
  const i64 step = static_cast<i64>(gridDim.x) * (blockDim.x >> 5) * per_warp;
  for (i64 r0 = (static_cast<i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)) * per_warp;
       r0 < rows; r0 += step) {
    const i64 row = r0 + lane / L;
    const bool live = row < rows;
    uint4 yu[NV], gu[NV];
    C sum = 0;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int q = k * L + l;
      if (live && q < nvec) {
        yu[k] = __ldg(reinterpret_cast<const uint4*>(y + row * n) + q);
        gu[k] = __ldg(reinterpret_cast<const uint4*>(g + row * n) + q);
        const S* ye = reinterpret_cast<const S*>(&yu[k]);
        const S* ge = reinterpret_cast<const S*>(&gu[k]);
#pragma unroll
        for (int j = 0; j < V; ++j) sum += bwd_term<kOp, S>(to_c(ye[j]), to_c(ge[j]));
      }
    }
    sum = warp_sum(sum, L);
    if (!live) continue;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int q = k * L + l;
      if (q >= nvec) continue;
      const S* ye = reinterpret_cast<const S*>(&yu[k]);
      const S* ge = reinterpret_cast<const S*>(&gu[k]);
      uint4 u;
      S* e = reinterpret_cast<S*>(&u);
#pragma unroll
      for (int j = 0; j < V; ++j) e[j] = from_c<S>(bwd_out<kOp, S>(to_c(ye[j]), to_c(ge[j]), sum));
      reinterpret_cast<uint4*>(out + row * n)[q] = u;
    }
  }
}

// --- one block per row ---

template <typename S, bool kLog>
__global__ void __launch_bounds__(kBlockRowThreads)
    softmax_fwd_block(const S* __restrict__ x, S* __restrict__ y, i64 rows, i64 n) {
  using C = typename Elem<S>::C;
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const S* xr = x + row * n;
    S* yr = y + row * n;
    C m = neg_inf<C>();
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) m = max_c(m, to_c(xr[i]));
    m = block_allreduce<true>(m);
    C sum = 0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) sum += exp_s<S>(to_c(xr[i]) - m);
    sum = block_allreduce<false>(sum);
    if constexpr (kLog) {
      const C lse = log_c(sum);
      for (i64 i = threadIdx.x; i < n; i += blockDim.x) yr[i] = from_c<S>((to_c(xr[i]) - m) - lse);
    } else {
      const C inv = C(1) / sum;
      for (i64 i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = from_c<S>(exp_s<S>(to_c(xr[i]) - m) * inv);
    }
  }
}

template <typename S, SoftmaxOp kOp>
__global__ void __launch_bounds__(kBlockRowThreads)
    softmax_bwd_block(const S* __restrict__ y, const S* __restrict__ g, S* __restrict__ out,
                      i64 rows, i64 n) {
  using C = typename Elem<S>::C;
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const i64 base = row * n;
    C sum = 0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x)
      sum += bwd_term<kOp, S>(to_c(y[base + i]), to_c(g[base + i]));
    sum = block_allreduce<false>(sum);
    for (i64 i = threadIdx.x; i < n; i += blockDim.x)
      out[base + i] = from_c<S>(bwd_out<kOp, S>(to_c(y[base + i]), to_c(g[base + i]), sum));
  }
}

// --- one thread per column of a strided (inner > 1) view ---

template <typename S, bool kLog>
__global__ void __launch_bounds__(kColThreads)
    softmax_fwd_cols(const S* __restrict__ x, S* __restrict__ y, i64 outer, i64 n, i64 inner) {
  using C = typename Elem<S>::C;
  const i64 cols = outer * inner;
  for (i64 col = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; col < cols;
       col += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 base = (col / inner) * n * inner + col % inner;
    C m = neg_inf<C>();
    for (i64 r = 0; r < n; ++r) m = max_c(m, to_c(x[base + r * inner]));
    C sum = 0;
    for (i64 r = 0; r < n; ++r) sum += exp_s<S>(to_c(x[base + r * inner]) - m);
    if constexpr (kLog) {
      const C lse = log_c(sum);
      for (i64 r = 0; r < n; ++r)
        y[base + r * inner] = from_c<S>((to_c(x[base + r * inner]) - m) - lse);
    } else {
      const C inv = C(1) / sum;
      for (i64 r = 0; r < n; ++r)
        y[base + r * inner] = from_c<S>(exp_s<S>(to_c(x[base + r * inner]) - m) * inv);
    }
  }
}

template <typename S, SoftmaxOp kOp>
__global__ void __launch_bounds__(kColThreads)
    softmax_bwd_cols(const S* __restrict__ y, const S* __restrict__ g, S* __restrict__ out,
                     i64 outer, i64 n, i64 inner) {
  using C = typename Elem<S>::C;
  const i64 cols = outer * inner;
  for (i64 col = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; col < cols;
       col += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 base = (col / inner) * n * inner + col % inner;
    C sum = 0;
    for (i64 r = 0; r < n; ++r)
      sum += bwd_term<kOp, S>(to_c(y[base + r * inner]), to_c(g[base + r * inner]));
    for (i64 r = 0; r < n; ++r) {
      const i64 i = base + r * inner;
      out[i] = from_c<S>(bwd_out<kOp, S>(to_c(y[i]), to_c(g[i]), sum));
    }
  }
}

constexpr i64 kMaxGrid = 1 << 30;

unsigned grid_for(i64 work, int threads_or_rows_per_block, i64 cap) {
  const i64 b = (work + threads_or_rows_per_block - 1) / threads_or_rows_per_block;
  return static_cast<unsigned>(std::max<i64>(1, std::min(b, cap)));
}

// Vector-row kernels: L lanes per row for rows of nvec <= 32 * NV vectors.
template <typename S, int NV>
void launch_vec_rows(const SoftmaxCall& c, const S* x, const S* v, S* out, int L,
                     cudaStream_t st) {
  const unsigned grid = grid_for(c.outer, kWarpRowThreads / 32 * (32 / L), kMaxGrid);
  const int n = static_cast<int>(c.n);
  if (!c.backward) {
    const unsigned fgrid =
        grid_for(c.outer, kWarpRowThreads / 32 * (32 / L) * kVecRows<NV>, kMaxGrid);
    if (c.op == SoftmaxOp::kLogSoftmax)
      softmax_fwd_vec<S, true, NV><<<fgrid, kWarpRowThreads, 0, st>>>(x, out, c.outer, n, L);
    else
      softmax_fwd_vec<S, false, NV><<<fgrid, kWarpRowThreads, 0, st>>>(x, out, c.outer, n, L);
    return;
  }
  switch (c.op) {
    case SoftmaxOp::kSoftmax:
      softmax_bwd_vec<S, SoftmaxOp::kSoftmax, NV><<<grid, kWarpRowThreads, 0, st>>>(
          x, v, out, c.outer, n, L);
      break;
    case SoftmaxOp::kLogSoftmax:
      softmax_bwd_vec<S, SoftmaxOp::kLogSoftmax, NV><<<grid, kWarpRowThreads, 0, st>>>(
          x, v, out, c.outer, n, L);
      break;
    case SoftmaxOp::kLogSoftmaxJvp:
      softmax_bwd_vec<S, SoftmaxOp::kLogSoftmaxJvp, NV><<<grid, kWarpRowThreads, 0, st>>>(
          x, v, out, c.outer, n, L);
      break;
  }
}

// Warp-per-row kernels for rows of up to 32 * kPer elements.
template <typename S, int kPer>
void launch_warp_rows(const SoftmaxCall& c, const S* x, const S* v, S* out, cudaStream_t st) {
  const unsigned grid = grid_for(c.outer, kWarpRowThreads / 32, kMaxGrid);
  const int n = static_cast<int>(c.n);
  if (!c.backward) {
    if (c.op == SoftmaxOp::kLogSoftmax)
      softmax_fwd_warp<S, true, kPer><<<grid, kWarpRowThreads, 0, st>>>(x, out, c.outer, n);
    else
      softmax_fwd_warp<S, false, kPer><<<grid, kWarpRowThreads, 0, st>>>(x, out, c.outer, n);
    return;
  }
  switch (c.op) {
    case SoftmaxOp::kSoftmax:
      softmax_bwd_warp<S, SoftmaxOp::kSoftmax, kPer><<<grid, kWarpRowThreads, 0, st>>>(
          x, v, out, c.outer, n);
      break;
    case SoftmaxOp::kLogSoftmax:
      softmax_bwd_warp<S, SoftmaxOp::kLogSoftmax, kPer><<<grid, kWarpRowThreads, 0, st>>>(
          x, v, out, c.outer, n);
      break;
    case SoftmaxOp::kLogSoftmaxJvp:
      softmax_bwd_warp<S, SoftmaxOp::kLogSoftmaxJvp, kPer><<<grid, kWarpRowThreads, 0, st>>>(
          x, v, out, c.outer, n);
      break;
  }
}

template <typename S>
std::string softmax_typed(const SoftmaxCall& c, const void* xv, const void* vv, void* outv,
                          cudaStream_t st) {
  const S* x = static_cast<const S*>(xv);
  const S* v = static_cast<const S*>(vv);
  S* out = static_cast<S*>(outv);
  constexpr int V = 16 / sizeof(S);
  const auto aligned = [](const void* p) {
    return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
  };
  const i64 nvec = c.n / V;
  if (c.inner == 1 && c.n % V == 0 && nvec >= 1 && nvec <= 128 && aligned(x) && aligned(v) &&
      aligned(out)) {
    int L = 1;  // lanes per row: the vectors spread over up to 32 lanes, then up to 4 per lane
    while (L < 32 && L < nvec) L *= 2;
    if (nvec <= 32) launch_vec_rows<S, 1>(c, x, v, out, L, st);
    else if (nvec <= 64) launch_vec_rows<S, 2>(c, x, v, out, L, st);
    else launch_vec_rows<S, 4>(c, x, v, out, L, st);
  } else if (c.inner == 1 && c.n <= 1024) {
    if (c.n <= 32) launch_warp_rows<S, 1>(c, x, v, out, st);
    else if (c.n <= 64) launch_warp_rows<S, 2>(c, x, v, out, st);
    else if (c.n <= 128) launch_warp_rows<S, 4>(c, x, v, out, st);
    else if (c.n <= 256) launch_warp_rows<S, 8>(c, x, v, out, st);
    else if (c.n <= 512) launch_warp_rows<S, 16>(c, x, v, out, st);
    else launch_warp_rows<S, 32>(c, x, v, out, st);
  } else if (c.inner == 1) {
    const unsigned grid = grid_for(c.outer, 1, kMaxGrid);
    if (!c.backward) {
      if (c.op == SoftmaxOp::kLogSoftmax)
        softmax_fwd_block<S, true><<<grid, kBlockRowThreads, 0, st>>>(x, out, c.outer, c.n);
      else
        softmax_fwd_block<S, false><<<grid, kBlockRowThreads, 0, st>>>(x, out, c.outer, c.n);
    } else if (c.op == SoftmaxOp::kSoftmax) {
      softmax_bwd_block<S, SoftmaxOp::kSoftmax><<<grid, kBlockRowThreads, 0, st>>>(
          x, v, out, c.outer, c.n);
    } else if (c.op == SoftmaxOp::kLogSoftmax) {
      softmax_bwd_block<S, SoftmaxOp::kLogSoftmax><<<grid, kBlockRowThreads, 0, st>>>(
          x, v, out, c.outer, c.n);
    } else {
      softmax_bwd_block<S, SoftmaxOp::kLogSoftmaxJvp><<<grid, kBlockRowThreads, 0, st>>>(
          x, v, out, c.outer, c.n);
    }
  } else {
    const i64 cols = c.outer * c.inner;
    const unsigned grid =
        grid_for(cols, kColThreads, std::max<i64>(1, static_cast<i64>(sm_count()) * 16));
    if (!c.backward) {
      if (c.op == SoftmaxOp::kLogSoftmax)
        softmax_fwd_cols<S, true><<<grid, kColThreads, 0, st>>>(x, out, c.outer, c.n, c.inner);
      else
        softmax_fwd_cols<S, false><<<grid, kColThreads, 0, st>>>(x, out, c.outer, c.n, c.inner);
    } else if (c.op == SoftmaxOp::kSoftmax) {
      softmax_bwd_cols<S, SoftmaxOp::kSoftmax><<<grid, kColThreads, 0, st>>>(
          x, v, out, c.outer, c.n, c.inner);
    } else if (c.op == SoftmaxOp::kLogSoftmax) {
      softmax_bwd_cols<S, SoftmaxOp::kLogSoftmax><<<grid, kColThreads, 0, st>>>(
          x, v, out, c.outer, c.n, c.inner);
    } else {
      softmax_bwd_cols<S, SoftmaxOp::kLogSoftmaxJvp><<<grid, kColThreads, 0, st>>>(
          x, v, out, c.outer, c.n, c.inner);
    }
  }
  return check_launch("jaxdnn softmax kernel launch");
}

// ---------------------------------------------------------------------------------------------
// Activation masks (pointwise_problem.h): relu, leaky_relu and clipped_relu keep one bit per
// element, [f'(x) = 1], packed along rows of `row` elements (ceil(row / 8) bytes per row). A
// thread takes one mask byte (8 elements) at a time in a grid-stride loop. kVec: rows of a
// multiple of 8 elements and 16-byte-aligned buffers, so byte j covers elements [8j, 8j + 8),
// loaded and stored as 16-byte vectors (one for 16-bit types, two for f32, four for f64; a warp
// reads consecutive 16-byte words and writes 32 consecutive mask bytes); otherwise the row
// arithmetic and scalar accesses.

template <Activation kA, typename C>
__device__ __forceinline__ bool mask_bit(C x, C p) {
  if constexpr (kA == Activation::kRelu) return x > C(0);
  if constexpr (kA == Activation::kLeakyRelu) return x >= C(0);
  return x > C(0) && x < p;  // kClippedRelu
}

// dx for one element: relu and clipped_relu select (0 where the bit is clear, whatever dy is).
template <Activation kA, typename C>
__device__ __forceinline__ C mask_select(bool bit, C d, C p) {
  if constexpr (kA == Activation::kLeakyRelu) return bit ? d : p * d;
  return bit ? d : C(0);
}

constexpr int kMaskThreads = 256;

template <typename S, Activation kA, bool kBackward, bool kVec>
__global__ void __launch_bounds__(kMaskThreads)
    activation_mask_kernel(const S* __restrict__ in, S* __restrict__ out,
                           uint8_t* __restrict__ bits, i64 nbytes, i64 row, i64 bytes_per_row,
                           double param) {
  using C = typename Elem<S>::C;
  constexpr int kWords = 8 * sizeof(S) / 16;  // 16-byte words per 8 elements (kVec)
  const C p = static_cast<C>(param);
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; j < nbytes; j += stride) {
    if constexpr (kVec) {
      uint4 a[kWords], r[kWords];
      const uint4* src = reinterpret_cast<const uint4*>(in) + j * kWords;
#pragma unroll
      for (int w = 0; w < kWords; ++w) a[w] = __ldg(src + w);
      const S* ae = reinterpret_cast<const S*>(a);
      S* re = reinterpret_cast<S*>(r);
      unsigned byte = 0;
      if constexpr (kBackward) byte = bits[j];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const C v = to_c(ae[k]);
        if constexpr (kBackward) {
          re[k] = from_c<S>(mask_select<kA, C>((byte >> k) & 1u, v, p));
        } else {
          re[k] = from_c<S>(apply<Op::kForward, kA, C, MathFor<S>>(v, C(0), p));
          byte |= unsigned(mask_bit<kA, C>(v, p)) << k;
        }
      }
      uint4* dst = reinterpret_cast<uint4*>(out) + j * kWords;
#pragma unroll
      for (int w = 0; w < kWords; ++w) dst[w] = r[w];
      if constexpr (!kBackward) bits[j] = static_cast<uint8_t>(byte);
    } else {
      const i64 r = j / bytes_per_row;
      const i64 c0 = (j - r * bytes_per_row) * 8;
      const i64 e0 = r * row + c0;
      const int count = static_cast<int>(min(i64{8}, row - c0));
      unsigned byte = 0;
      if constexpr (kBackward) byte = bits[j];
      for (int k = 0; k < count; ++k) {
        const C v = to_c(in[e0 + k]);
        if constexpr (kBackward) {
          out[e0 + k] = from_c<S>(mask_select<kA, C>((byte >> k) & 1u, v, p));
        } else {
          out[e0 + k] = from_c<S>(apply<Op::kForward, kA, C, MathFor<S>>(v, C(0), p));
          byte |= unsigned(mask_bit<kA, C>(v, p)) << k;
        }
      }
      if constexpr (!kBackward) bits[j] = static_cast<uint8_t>(byte);
    }
  }
}

template <typename S, Activation kA, bool kBackward>
std::string launch_activation_mask(const ActivationMaskCall& c, const void* in, void* out,
                                   uint8_t* bits, cudaStream_t stream) {
  const i64 bytes_per_row = activation_mask_bytes(c.row);
  const i64 nbytes = c.rows * bytes_per_row;
  const bool vec = c.row % 8 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  // Enough resident threads to keep HBM busy; each loops over the rest.
  const i64 full = std::max<i64>(1, static_cast<i64>(sm_count()) * (2048 / kMaskThreads));
  const i64 blocks = std::max<i64>(1, std::min<i64>((nbytes + kMaskThreads - 1) / kMaskThreads,
                                                   full));
  const S* src = static_cast<const S*>(in);
  S* dst = static_cast<S*>(out);
  if (vec)
    activation_mask_kernel<S, kA, kBackward, true>
        <<<static_cast<unsigned>(blocks), kMaskThreads, 0, stream>>>(
            src, dst, bits, nbytes, c.row, bytes_per_row, c.param);
  else
    activation_mask_kernel<S, kA, kBackward, false>
        <<<static_cast<unsigned>(blocks), kMaskThreads, 0, stream>>>(
            src, dst, bits, nbytes, c.row, bytes_per_row, c.param);
  return check_launch("jaxdnn activation mask kernel launch");
}

template <typename S, bool kBackward>
std::string dispatch_mask_kind(const ActivationMaskCall& c, const void* in, void* out,
                               uint8_t* bits, cudaStream_t stream) {
  switch (c.activation) {
    case Activation::kRelu:
      return launch_activation_mask<S, Activation::kRelu, kBackward>(c, in, out, bits, stream);
    case Activation::kLeakyRelu:
      return launch_activation_mask<S, Activation::kLeakyRelu, kBackward>(c, in, out, bits,
                                                                         stream);
    case Activation::kClippedRelu:
      return launch_activation_mask<S, Activation::kClippedRelu, kBackward>(c, in, out, bits,
                                                                           stream);
    default: return "this activation has no mask form";
  }
}

template <typename S>
std::string dispatch_mask(const ActivationMaskCall& c, const void* in, void* out, uint8_t* bits,
                          cudaStream_t stream) {
  return c.backward ? dispatch_mask_kind<S, true>(c, in, out, bits, stream)
                    : dispatch_mask_kind<S, false>(c, in, out, bits, stream);
}

}  // namespace

std::string run_activation(const ActivationCall& c, const void* s, const void* dy, void* out,
                           cudaStream_t stream) {
  if (c.derivative < 0 || c.derivative > 2) return "derivative must be 0, 1 or 2";
  if (c.derivative > 0 && dy == nullptr) return "the backward needs dy";
  if (c.n == 0) return "";
  switch (c.dtype) {
    case DType::kF32: return dispatch_op<float>(c, s, dy, out, stream);
    case DType::kF64: return dispatch_op<double>(c, s, dy, out, stream);
    case DType::kBF16: return dispatch_op<__nv_bfloat16>(c, s, dy, out, stream);
    case DType::kF16: return dispatch_op<__half>(c, s, dy, out, stream);
  }
  return "unsupported dtype";
}

std::string run_softmax(const SoftmaxCall& c, const void* x, const void* v, void* out,
                        cudaStream_t stream) {
  if (c.backward && v == nullptr) return "the backward needs a second operand";
  if (!c.backward && c.op == SoftmaxOp::kLogSoftmaxJvp) return "not a forward operation";
  if (c.outer == 0 || c.n == 0 || c.inner == 0) return "";
  switch (c.dtype) {
    case DType::kF32: return softmax_typed<float>(c, x, v, out, stream);
    case DType::kF64: return softmax_typed<double>(c, x, v, out, stream);
    case DType::kBF16: return softmax_typed<__nv_bfloat16>(c, x, v, out, stream);
    case DType::kF16: return softmax_typed<__half>(c, x, v, out, stream);
  }
  return "unsupported dtype";
}

std::string run_activation_mask(const ActivationMaskCall& c, const void* data, void* out,
                                uint8_t* bits, cudaStream_t stream) {
  if (c.rows == 0 || c.row == 0) return "";
  switch (c.dtype) {
    case DType::kF32: return dispatch_mask<float>(c, data, out, bits, stream);
    case DType::kF64: return dispatch_mask<double>(c, data, out, bits, stream);
    case DType::kBF16: return dispatch_mask<__nv_bfloat16>(c, data, out, bits, stream);
    case DType::kF16: return dispatch_mask<__half>(c, data, out, bits, stream);
  }
  return "unsupported dtype";
}

}  // namespace jaxdnn::cuda
