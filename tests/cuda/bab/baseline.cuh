// The bias/activation backward kernels as they were before bias_act.cu (ffi/cuda/fused.cu at
// 8c47896), for check.cu's A/B timings and as a second implementation under the reference.
// Verbatim but for the namespace, run_bab's call type (BiasActCall has DecodedBiasAct's fields)
// and the workspace function's name.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "bias_act_cuda.h"
#include "device_math.cuh"

namespace bab_baseline {
using namespace jaxdnn;
using namespace jaxdnn::cuda;

inline size_t baseline_workspace_bytes(long long outer, long long K, long long inner,
                                       DType dtype, bool reduce);

constexpr int kBabTargetBlocks = 2048;

struct BabShape {
  long long outer, K, inner;
  int slices;      // row slices of the reduction
  long long rows;  // outer rows (inner == 1) or outer images (inner > 1) per slice
};

BabShape bab_shape(long long outer, long long K, long long inner) {
  BabShape b{outer, K, inner, 1, outer};
  if (outer <= 0 || K <= 0) return b;
  const long long kblocks = inner == 1 ? (K + 31) / 32 : K;
  long long slices = std::max<long long>(1, kBabTargetBlocks / kblocks);
  slices = std::min(slices, inner == 1 ? (outer + 63) / 64 : outer);
  slices = std::max<long long>(1, std::min<long long>(slices, 65535));
  b.rows = (outer + slices - 1) / slices;
  b.slices = static_cast<int>((outer + b.rows - 1) / b.rows);
  return b;
}

template <class T> struct BabAcc { using type = float; };
template <> struct BabAcc<double> { using type = double; };

template <class T> __device__ __forceinline__ float to_acc(T v) { return static_cast<float>(v); }
template <> __device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ double to_acc(double v) { return v; }
template <class T, class A> __device__ __forceinline__ T from_acc(A v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_acc(float v) { return __float2half_rn(v); }

struct BabArgs {
  long long outer, K, inner, rows;
  int act;
  double param;
  bool from_output;  // s is the activation's output
};

template <class A>
__device__ __forceinline__ A bab_grad(const BabArgs& a, A s) {
  const Activation act = static_cast<Activation>(a.act);
  const A prm = static_cast<A>(a.param);
  if constexpr (std::is_same_v<A, float>)
    if (act == Activation::kGelu) return DeviceMath::gelu_grad(s);
  return a.from_output ? activation_grad_from_output<A, DeviceMath>(act, s, prm)
                       : activation_grad_from_input<A, DeviceMath>(act, s, prm);
}

// Channels-last view (outer rows x K): block = 32 channels x 8 row lanes of one row slice.
template <class T>
__global__ void __launch_bounds__(256) bab_rows_kernel(const T* __restrict__ t,
                                                       const T* __restrict__ tb,
                                                       const T* __restrict__ s, T* __restrict__ dz,
                                                       typename BabAcc<T>::type* __restrict__ part,
                                                       BabArgs a) {
  using A = typename BabAcc<T>::type;
  __shared__ A red[8][33];
  const long long k = blockIdx.y * 32LL + threadIdx.x;
  const long long r0 = blockIdx.x * a.rows, r1 = min(a.outer, r0 + a.rows);
  A sum = 0;
  if (k < a.K) {
    const A bias = tb ? to_acc(tb[k]) : A(0);
    for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
      const long long i = r * a.K + k;
      const A v = (to_acc(t[i]) + bias) * bab_grad<A>(a, to_acc(s[i]));
      dz[i] = from_acc<T>(v);
      sum += v;
    }
  }
  if (part == nullptr) return;
  red[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && k < a.K) {
    A tot = 0;
#pragma unroll
    for (int y = 0; y < 8; ++y) tot += red[y][threadIdx.x];
    part[blockIdx.x * a.K + k] = tot;
  }
}

// The same, vectorized: K a multiple of V = 16 / sizeof(T) and 16-byte-aligned t, s and dz.
// Thread (x, y) takes channel vector x + blockIdx.y * blockDim.x (V consecutive channels) of
// every blockDim.y-th row of the slice, with 16-byte loads and stores and two rows in flight;
// the partial sums are added across y in shared memory in a fixed order (deterministic).
template <class T>
__global__ void __launch_bounds__(256) bab_rows_vec_kernel(const T* __restrict__ t,
                                                           const T* __restrict__ tb,
                                                           const T* __restrict__ s,
                                                           T* __restrict__ dz,
                                                           typename BabAcc<T>::type* __restrict__ part,
                                                           BabArgs a) {
  using A = typename BabAcc<T>::type;
  constexpr int V = 16 / sizeof(T);
  union Vec {
    uint4 u;
    T e[V];
  };
  __shared__ A red[256 * V];
  const int cx = blockDim.x, cy = blockDim.y;
  const long long KV = a.K / V, kv = blockIdx.y * static_cast<long long>(cx) + threadIdx.x;
  const long long r0 = blockIdx.x * a.rows, r1 = min(a.outer, r0 + a.rows);
  A sum[V];
#pragma unroll
  for (int j = 0; j < V; ++j) sum[j] = A(0);
  if (kv < KV) {
    A bias[V];
#pragma unroll
    for (int j = 0; j < V; ++j) bias[j] = tb ? to_acc(tb[kv * V + j]) : A(0);
    const uint4* tv = reinterpret_cast<const uint4*>(t);
    const uint4* sv = reinterpret_cast<const uint4*>(s);
    uint4* dv = reinterpret_cast<uint4*>(dz);
    auto row = [&](long long i, const Vec& tt, const Vec& ss) {
      Vec o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A v = (to_acc(tt.e[j]) + bias[j]) * bab_grad<A>(a, to_acc(ss.e[j]));
        o.e[j] = from_acc<T>(v);
        sum[j] += v;
      }
      dv[i] = o.u;
    };
    long long r = r0 + threadIdx.y;
    for (; r + cy < r1; r += 2 * cy) {
      const long long i0 = r * KV + kv, i1 = (r + cy) * KV + kv;
      Vec t0, s0, t1, s1;
      t0.u = tv[i0], s0.u = sv[i0], t1.u = tv[i1], s1.u = sv[i1];
      row(i0, t0, s0);
      row(i1, t1, s1);
    }
    if (r < r1) {
      const long long i0 = r * KV + kv;
      Vec t0, s0;
      t0.u = tv[i0], s0.u = sv[i0];
      row(i0, t0, s0);
    }
  }
  if (part == nullptr) return;
  // red[y][x * V + j]: channel c = x * V + j of the block at row lane y.
#pragma unroll
  for (int j = 0; j < V; ++j) red[(threadIdx.y * cx + threadIdx.x) * V + j] = sum[j];
  __syncthreads();
  const int c = threadIdx.y * cx + threadIdx.x;
  const long long k = blockIdx.y * static_cast<long long>(cx) * V + c;
  if (c < cx * V && k < a.K) {
    A tot = 0;
    for (int y = 0; y < cy; ++y) tot += red[y * cx * V + c];
    part[blockIdx.x * a.K + k] = tot;
  }
}

// Channels-first view (outer x K x inner): block = one channel k of a slice of images, threads
// along the contiguous inner run.
template <class T>
__global__ void __launch_bounds__(256) bab_planes_kernel(const T* __restrict__ t,
                                                         const T* __restrict__ tb,
                                                         const T* __restrict__ s,
                                                         T* __restrict__ dz,
                                                         typename BabAcc<T>::type* __restrict__ part,
                                                         BabArgs a) {
  using A = typename BabAcc<T>::type;
  __shared__ A red[256];
  const long long k = blockIdx.y;
  const long long o0 = blockIdx.x * a.rows, o1 = min(a.outer, o0 + a.rows);
  const A bias = tb ? to_acc(tb[k]) : A(0);
  A sum = 0;
  for (long long o = o0; o < o1; ++o) {
    const long long base = (o * a.K + k) * a.inner;
    for (long long j = threadIdx.x; j < a.inner; j += blockDim.x) {
      const A v = (to_acc(t[base + j]) + bias) * bab_grad<A>(a, to_acc(s[base + j]));
      dz[base + j] = from_acc<T>(v);
      sum += v;
    }
  }
  if (part == nullptr) return;
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x * a.K + k] = red[0];
}

// db[k] = sum over the slices of part[slice][k]. Block = 32 channels x 32 slice lanes: lane y adds
// slices y, y + 32, ... (four loads in flight), then the lanes are added in order in shared memory:
// a fixed order, so deterministic; with one thread per channel the slices' adds formed a chain of
// dependent L2 loads (1024 slices for K = 64).
template <class T>
__global__ void __launch_bounds__(1024) bab_colsum_kernel(
    const typename BabAcc<T>::type* __restrict__ part, int slices, long long K,
    T* __restrict__ db) {
  using A = typename BabAcc<T>::type;
  __shared__ A red[32][33];
  const long long k = blockIdx.x * 32LL + threadIdx.x;
  A acc[4] = {A(0), A(0), A(0), A(0)};
  if (k < K) {
    int sl = threadIdx.y;
    for (; sl + 96 < slices; sl += 128) {
#pragma unroll
      for (int u = 0; u < 4; ++u) acc[u] += part[(sl + 32 * u) * K + k];
    }
    for (; sl < slices; sl += 32) acc[0] += part[sl * K + k];
  }
  red[threadIdx.y][threadIdx.x] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  __syncthreads();
  if (threadIdx.y == 0 && k < K) {
    A tot = 0;
    for (int y = 0; y < 32; ++y) tot += red[y][threadIdx.x];
    db[k] = from_acc<T>(tot);
  }
}

template <class T>
std::string run_bab(const BiasActCall& d, const void* t, const void* tb, const void* s,
                    void* dz, void* db, void* ws, size_t ws_size, cudaStream_t st) {
  using A = typename BabAcc<T>::type;
  const BabShape sh = bab_shape(d.outer, d.K, d.inner);
  if (d.outer * d.K * d.inner == 0) {
    if (db && d.K > 0 && cudaMemsetAsync(db, 0, d.K * sizeof(T), st) != cudaSuccess)
      return "memset of db failed";
    return "";
  }
  A* part = nullptr;
  if (db) {
    if (ws_size < baseline_workspace_bytes(d.outer, d.K, d.inner, d.dtype, true))
      return "workspace too small for the bias gradient";
    part = static_cast<A*>(ws);
  }
  BabArgs a{d.outer, d.K, d.inner, sh.rows, static_cast<int>(d.activation), d.param,
            activation_grad_from_output(d.activation)};
  constexpr int V = 16 / sizeof(T);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (d.inner == 1 && d.K % V == 0 && aligned(t) && aligned(s) && aligned(dz)) {
    // Channel vectors across x (up to 32), row lanes across y; the slices as the scalar path.
    const int cx = static_cast<int>(std::min<long long>(d.K / V, 32)), cy = 256 / cx;
    dim3 grid(sh.slices, static_cast<unsigned>((d.K / V + cx - 1) / cx));
    bab_rows_vec_kernel<T><<<grid, dim3(cx, cy), 0, st>>>(
        static_cast<const T*>(t), static_cast<const T*>(tb), static_cast<const T*>(s),
        static_cast<T*>(dz), part, a);
  } else if (d.inner == 1) {
    dim3 grid(sh.slices, static_cast<unsigned>((d.K + 31) / 32));
    bab_rows_kernel<T><<<grid, dim3(32, 8), 0, st>>>(
        static_cast<const T*>(t), static_cast<const T*>(tb), static_cast<const T*>(s),
        static_cast<T*>(dz), part, a);
  } else {
    if (d.K > 65535) return "too many channels for the channels-first kernel";
    dim3 grid(sh.slices, static_cast<unsigned>(d.K));
    bab_planes_kernel<T><<<grid, 256, 0, st>>>(static_cast<const T*>(t), static_cast<const T*>(tb),
                                               static_cast<const T*>(s), static_cast<T*>(dz), part,
                                               a);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return std::string("bias/activation kernel launch: ") + cudaGetErrorString(e);
  if (db) {
    const unsigned blocks = static_cast<unsigned>((d.K + 31) / 32);
    bab_colsum_kernel<T><<<blocks, dim3(32, 32), 0, st>>>(part, sh.slices, d.K,
                                                          static_cast<T*>(db));
    e = cudaGetLastError();
    if (e != cudaSuccess) return std::string("bias gradient launch: ") + cudaGetErrorString(e);
  }
  return "";
}

inline size_t baseline_workspace_bytes(long long outer, long long K, long long inner,
                                       DType dtype, bool reduce) {
  if (!reduce || outer <= 0 || K <= 0 || inner <= 0) return 0;
  const BabShape sh = bab_shape(outer, K, inner);
  return static_cast<size_t>(sh.slices) * static_cast<size_t>(K) * (dtype == DType::kF64 ? 8 : 4);
}

// run_bab for any dtype.
inline std::string run(const BiasActCall& d, const void* t, const void* tb, const void* s,
                       void* dz, void* db, void* ws, size_t ws_size, cudaStream_t st) {
  switch (d.dtype) {
    case DType::kF32: return run_bab<float>(d, t, tb, s, dz, db, ws, ws_size, st);
    case DType::kF64: return run_bab<double>(d, t, tb, s, dz, db, ws, ws_size, st);
    case DType::kBF16: return run_bab<__nv_bfloat16>(d, t, tb, s, dz, db, ws, ws_size, st);
    case DType::kF16: return run_bab<__half>(d, t, tb, s, dz, db, ws, ws_size, st);
  }
  return "unknown dtype";
}

}  // namespace bab_baseline
