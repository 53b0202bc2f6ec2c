// jaxdnn_bias_act_bwd on the GPU (bias_act_cuda.h): dz = (t + tb[k]) * f'(s) in one pass over t
// and s, and the bias gradient db[k] = sum of dz folded into the same kernel.
//
// Channels-last (inner == 1: rows x K), bab_rows_kernel: a block of 512 threads covers a group
// of at most 64 channels (cx lanes of one channel vector each: 16 bytes, or one element when K or
// a pointer does not allow vectors) over a slice of rows, cy = 512 / cx row lanes. Each thread
// loads 4 rows before using any (8 independent 16-byte loads in flight, predicated at the end of
// the slice; 2 rows in the 16-bit and float64 vector kernels for any kind, short of registers),
// the relu kernel without any dispatch, the others dispatching the kind once per row. The grid
// targets about 256 blocks: one wave on the H200 (2 blocks of 512 per SM), with many rows per
// thread on large tensors. Channels-first (outer x K x inner),
// bab_planes_kernel: a block of 256 threads covers one channel k over a slice of images, walking
// the slice's planes as one run of vectors.
//
// Bias gradient: each block adds its rows per channel (a butterfly across the row lanes of a
// warp, then the warps in order through shared memory) and stores one partial row; the last
// block of the channel group to finish (an arrival counter per group in the workspace, zeroed by
// a memset before the launch) adds the group's partial rows (lanes over slices, then a
// butterfly). Every sum has an order fixed by the shape, whichever block finishes last:
// identical calls give identical bits. A grid of one slice writes db directly.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "bias_act_cuda.h"
#include "device_math.cuh"

namespace jaxdnn::cuda {
namespace {

constexpr int kRowThreads = 512;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kRowUnroll = 4;          // rows a thread loads before computing any
constexpr int kGroupChannels = 64;     // channels-last: at most this many channels per block
constexpr long long kRowBlocks = 256;  // channels-last grid target
constexpr int kPlaneThreads = 256;
constexpr int kPlaneWarps = kPlaneThreads / 32;
constexpr int kPlaneUnroll = 4;
constexpr long long kPlaneBlocks = 512;  // channels-first grid target
constexpr unsigned kFullWarp = 0xffffffffu;

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// The grid: shared by the launch and the workspace query.

struct BabPlan {
  int cx = 1;               // channels-last: lanes across channel vectors (a power of two <= 32)
  long long groups = 0;     // grid.x: channel groups (channels-last) or channels (channels-first)
  int slices = 1;           // grid.y: slices of rows (channels-last) or images (channels-first)
  long long slice_len = 0;  // rows or images per slice
  int width = 1;            // partial sums per (group, slice): the group's channels, padded to 16 B
  size_t counter_bytes = 0;    // arrival counters at the workspace's start
  size_t workspace_bytes = 0;  // counters + partial sums; 0 when one slice needs neither
};

// The grid's target block count; JAXDNN_BAB_BLOCKS overrides it for tests (small values force
// many rows per thread and many slices on small shapes).
long long target_blocks(long long fallback) {
  static const long long forced = [] {
    const char* v = std::getenv("JAXDNN_BAB_BLOCKS");
    return v != nullptr ? std::atoll(v) : 0LL;
  }();
  return std::min<long long>(forced > 0 ? forced : fallback, 65535);
}

// outer, K, inner > 0; V = elements per access (16 / sizeof(T) for vectors, else 1); acc_bytes
// = sizeof of the accumulator.
BabPlan bab_plan(long long outer, long long K, long long inner, int V, int acc_bytes) {
  BabPlan b;
  if (inner == 1) {
    const long long KV = K / V;
    while (b.cx < KV && b.cx < std::min(32, kGroupChannels / V)) b.cx *= 2;
    b.groups = ceil_div(KV, b.cx);
    // Rounds of kRowUnroll rows per row lane; a slice takes enough rounds for the target grid.
    const long long rounds = ceil_div(outer, kRowThreads / b.cx * kRowUnroll);
    const long long per_slice = ceil_div(rounds * b.groups, target_blocks(kRowBlocks));
    b.slice_len = ceil_div(outer, ceil_div(rounds, per_slice));
    b.width = std::max(b.cx * V, 16 / acc_bytes);
  } else {
    b.groups = K;
    b.slice_len = ceil_div(outer, std::clamp(target_blocks(kPlaneBlocks) / K, 1LL, outer));
  }
  // Offsets within a slice are 32-bit: at most INT_MAX accesses per slice.
  const long long units = inner == 1 ? K / V : K * (inner / V);  // accesses per row or image
  b.slice_len = std::min(b.slice_len, std::max(1LL, INT_MAX / units));
  if (units > INT_MAX || ceil_div(outer, b.slice_len) > 65535) return BabPlan{};  // too large
  b.slices = static_cast<int>(ceil_div(outer, b.slice_len));
  if (b.slices > 1) {
    b.counter_bytes = static_cast<size_t>(ceil_div(b.groups * 4, 256) * 256);
    b.workspace_bytes =
        b.counter_bytes + static_cast<size_t>(b.groups * b.slices * b.width * acc_bytes);
  }
  return b;
}

// ---------------------------------------------------------------------------------------------
// Values.

template <class T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <class T> using Acc = typename AccOf<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T from_acc(Acc<T> v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_acc<__half>(float v) {
  return __float2half_rn(v);
}

template <int bytes> struct RawOf;
template <> struct RawOf<2> { using type = unsigned short; };
template <> struct RawOf<4> { using type = unsigned int; };
template <> struct RawOf<8> { using type = unsigned long long; };
template <> struct RawOf<16> { using type = uint4; };

// n values of T moved as one memory access.
template <class T, int n>
union Pack {
  using Raw = typename RawOf<sizeof(T) * n>::type;
  Raw raw;
  T e[n];
};

// g[j] = f'(s[j]) for j < n, the kind known at compile time: from the output (the piecewise-linear
// kinds, elu, sigmoid, tanh: short arithmetic) or from the input (gelu, gelu_tanh, silu).
template <Activation kKind, int n, class A>
__device__ __forceinline__ void grads_of(A param, const A (&s)[n], A (&g)[n]) {
#pragma unroll
  for (int j = 0; j < n; ++j) {
    if constexpr (kKind == Activation::kGelu && std::is_same_v<A, float>)
      g[j] = DeviceMath::gelu_grad(s[j]);  // one exponential where activation.h's takes two
    else if (activation_grad_from_output(kKind))  // folded at compile time
      g[j] = activation_grad_from_output<A>(kKind, s[j], param);
    else
      g[j] = activation_grad_from_input<A, DeviceMath>(kKind, s[j], param);
  }
}

// The same for any kind, dispatched once for the n values.
template <int n, class A>
__device__ __forceinline__ void grads(Activation act, A param, const A (&s)[n], A (&g)[n]) {
  switch (act) {
    case Activation::kIdentity: return grads_of<Activation::kIdentity>(param, s, g);
    case Activation::kRelu: return grads_of<Activation::kRelu>(param, s, g);
    case Activation::kLeakyRelu: return grads_of<Activation::kLeakyRelu>(param, s, g);
    case Activation::kClippedRelu: return grads_of<Activation::kClippedRelu>(param, s, g);
    case Activation::kElu: return grads_of<Activation::kElu>(param, s, g);
    case Activation::kSigmoid: return grads_of<Activation::kSigmoid>(param, s, g);
    case Activation::kTanh: return grads_of<Activation::kTanh>(param, s, g);
    case Activation::kGelu: return grads_of<Activation::kGelu>(param, s, g);
    case Activation::kGeluTanh: return grads_of<Activation::kGeluTanh>(param, s, g);
    case Activation::kSilu: return grads_of<Activation::kSilu>(param, s, g);
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels.

template <class T>
struct BabParams {
  const T* t;
  const T* tb;  // or null
  const T* s;
  T* dz;
  T* db;                  // or null: no bias gradient
  Acc<T>* part;           // partial sums [group][slice][width] (when slices > 1)
  unsigned* arrivals;     // blocks of each group done, zero before the launch (when slices > 1)
  long long outer, K, inner;
  long long slice_len;    // rows or images per slice
  int slices, cx, width;  // as BabPlan
  Activation act;
  Acc<T> param;
};

// Called by every thread of a block once its share of the block's partial sums is stored.
// True in the last of `blocks` blocks to arrive at *arrivals; every partial row is then visible
// to it (read them through L2: __ldcg). Thread 0 counts the block: the barrier orders the
// block's stores before its fence (release), and its fence after the count orders the last
// block's reads after every other block's stores (acquire). One fence a block: a fence in every
// thread would also wait for each thread's own dz stores.
__device__ __forceinline__ bool last_to_arrive(unsigned* arrivals, int blocks) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(arrivals, 1u) == static_cast<unsigned>(blocks - 1);
    __threadfence();
  }
  __syncthreads();
  return last;
}

// Channels-last. Thread lane x = tid % cx takes channels (kv * V, ..., kv * V + V - 1),
// kv = group * cx + x, of rows r0 + y, r0 + y + cy, ... of the slice (y = tid / cx).
template <class T, int V, bool kReluOnly>
__global__ void __launch_bounds__(kRowThreads, 2) bab_rows_kernel(const BabParams<T> p) {
  using A = Acc<T>;
  using P = Pack<T, V>;
  using Raw = typename P::Raw;
  // Rows of loads in flight: 4, but 2 in the 16-bit and float64 vector kernels for any kind,
  // which hold 8 sums (or float64 math) and spilled pending loads at 4 within 64 registers.
  constexpr int kUnroll = kReluOnly || V == 1 || std::is_same_v<T, float> ? kRowUnroll : 2;
  const int tid = threadIdx.x, cx = p.cx, cy = kRowThreads / cx;
  const long long KV = p.K / V, kv = blockIdx.x * static_cast<long long>(cx) + tid % cx;
  const long long r0 = blockIdx.y * p.slice_len;
  // Rows of this slice; offsets within it fit 32 bits (the plan caps slice_len * KV).
  const unsigned rows = static_cast<unsigned>(r0 + p.slice_len < p.outer ? p.slice_len
                                                                          : p.outer - r0);
  const unsigned kvs = static_cast<unsigned>(KV);
  P bias;  // kept packed: 16-bit values widen at their use for free (a shift or a convert)
  A sum[V];
#pragma unroll
  for (int j = 0; j < V; ++j) bias.e[j] = from_acc<T>(A(0)), sum[j] = A(0);
  if (kv < KV) {
    if (p.tb != nullptr) {
#pragma unroll
      for (int j = 0; j < V; ++j) bias.e[j] = p.tb[kv * V + j];
    }
    // t and s are read once: streaming loads (evict first). dz is stored plainly: the backward
    // convolutions read it next, from L2 when it is still there.
    const long long first = r0 * KV + kv;
    const Raw* tr = reinterpret_cast<const Raw*>(p.t) + first;
    const Raw* sr = reinterpret_cast<const Raw*>(p.s) + first;
    Raw* dr = reinterpret_cast<Raw*>(p.dz) + first;
    for (unsigned r = tid / cx; r < rows; r += kUnroll * cy) {
      P tv[kUnroll], sv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (r + u * cy < rows) {
          tv[u].raw = __ldcs(tr + (r + u * cy) * kvs);
          sv[u].raw = __ldcs(sr + (r + u * cy) * kvs);
        }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (r + u * cy < rows) {
          A sa[V], g[V];
#pragma unroll
          for (int j = 0; j < V; ++j) sa[j] = to_acc(sv[u].e[j]);
          if constexpr (kReluOnly)
            grads_of<Activation::kRelu>(p.param, sa, g);
          else
            grads(p.act, p.param, sa, g);
          P out;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A v = (to_acc(tv[u].e[j]) + to_acc(bias.e[j])) * g[j];
            out.e[j] = from_acc<T>(v);
            sum[j] += v;
          }
          dr[(r + u * cy) * kvs] = out.raw;
        }
    }
  }
  if (p.db == nullptr) return;

  // The block's column sums: across the row lanes of each warp (lanes x, x + cx, ...: a
  // butterfly, after which lane x holds them), then across the warps in order.
  for (int off = cx; off < 32; off *= 2) {
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] += __shfl_xor_sync(kFullWarp, sum[j], off);
  }
  __shared__ A warp_sums[kRowWarps][kGroupChannels];
  const int warp = tid / 32, lane = tid % 32, cols = cx * V;
  if (lane < cx) {
#pragma unroll
    for (int j = 0; j < V; ++j) warp_sums[warp][lane * V + j] = sum[j];
  }
  __syncthreads();
  A total = A(0);  // of column tid (channel k); 0 in the padding
  if (tid < cols)
    for (int w = 0; w < kRowWarps; ++w) total += warp_sums[w][tid];
  const long long k0 = blockIdx.x * static_cast<long long>(cols);
  if (p.slices == 1) {
    if (tid < cols && k0 + tid < p.K) p.db[k0 + tid] = from_acc<T>(total);
    return;
  }
  A* part = p.part + blockIdx.x * static_cast<long long>(p.slices) * p.width;
  if (tid < p.width) part[blockIdx.y * static_cast<long long>(p.width) + tid] = total;
  if (!last_to_arrive(p.arrivals + blockIdx.x, p.slices)) return;

  // The last block: db[k] = the sum of the group's partial rows. Warp w takes the 16-byte
  // column vectors w, w + 16, ...; lane l adds slices l, l + 32, ... in order, then a butterfly.
  constexpr int N = 16 / sizeof(A);
  const int vecs = p.width / N;
  for (int q = warp; q < vecs; q += kRowWarps) {
    A acc[N];
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = A(0);
    for (int sl = lane; sl < p.slices; sl += 32) {
      Pack<A, N> v;
      v.raw = __ldcg(reinterpret_cast<const uint4*>(part) + sl * static_cast<long long>(vecs) + q);
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] += v.e[j];
    }
    for (int off = 16; off > 0; off /= 2) {
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] += __shfl_xor_sync(kFullWarp, acc[j], off);
    }
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const int c = q * N + j;
        if (c < cols && k0 + c < p.K) p.db[k0 + c] = from_acc<T>(acc[j]);
      }
    }
  }
}

// Channels-first. Block (k, slice): vector m of the slice (V elements of one plane) is vector
// m % nv of image m / nv of the slice, nv = inner / V; thread tid takes m = tid, tid + 256, ...
template <class T, int V>
__global__ void __launch_bounds__(kPlaneThreads) bab_planes_kernel(const BabParams<T> p) {
  using A = Acc<T>;
  using P = Pack<T, V>;
  using Raw = typename P::Raw;
  const int tid = threadIdx.x;
  const long long k = blockIdx.x, nv = p.inner / V, o0 = blockIdx.y * p.slice_len;
  // Offsets within the slice fit 32 bits (the plan caps slice_len * K * nv).
  const unsigned images = static_cast<unsigned>(o0 + p.slice_len < p.outer ? p.slice_len
                                                                            : p.outer - o0);
  const unsigned nvs = static_cast<unsigned>(nv), image_stride = static_cast<unsigned>(p.K * nv);
  const unsigned n = images * nvs;
  const long long first = (o0 * p.K + k) * nv;
  const Raw* tr = reinterpret_cast<const Raw*>(p.t) + first;
  const Raw* sr = reinterpret_cast<const Raw*>(p.s) + first;
  Raw* dr = reinterpret_cast<Raw*>(p.dz) + first;
  const A bias = p.tb != nullptr ? to_acc(p.tb[k]) : A(0);
  // Offset of vector m: (m / nv) * image_stride + m % nv, advanced by 256 vectors at a time with
  // a carry into the next image.
  const unsigned step_j = kPlaneThreads % nvs;
  const unsigned step = kPlaneThreads / nvs * image_stride + step_j, carry = image_stride - nvs;
  unsigned j = tid % nvs, off = tid / nvs * image_stride + j;
  A sum = A(0);
  for (unsigned m = tid; m < n; m += kPlaneUnroll * kPlaneThreads) {
    P tv[kPlaneUnroll], sv[kPlaneUnroll];
    unsigned at[kPlaneUnroll];
#pragma unroll
    for (int u = 0; u < kPlaneUnroll; ++u) {
      at[u] = off;
      if (m + u * kPlaneThreads < n) {
        tv[u].raw = __ldcs(tr + off);
        sv[u].raw = __ldcs(sr + off);
      }
      off += step, j += step_j;
      if (j >= nvs) j -= nvs, off += carry;
    }
#pragma unroll
    for (int u = 0; u < kPlaneUnroll; ++u)
      if (m + u * kPlaneThreads < n) {
        A sa[V], g[V];
#pragma unroll
        for (int e = 0; e < V; ++e) sa[e] = to_acc(sv[u].e[e]);
        grads(p.act, p.param, sa, g);
        P out;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const A v = (to_acc(tv[u].e[e]) + bias) * g[e];
          out.e[e] = from_acc<T>(v);
          sum += v;
        }
        dr[at[u]] = out.raw;
      }
  }
  if (p.db == nullptr) return;

  // The block's sum: a butterfly in each warp, then the warps in order.
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(kFullWarp, sum, off);
  __shared__ A warp_sums[kPlaneWarps];
  const int warp = tid / 32, lane = tid % 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  A total = A(0);
  if (tid == 0)
    for (int w = 0; w < kPlaneWarps; ++w) total += warp_sums[w];
  if (p.slices == 1) {
    if (tid == 0) p.db[k] = from_acc<T>(total);
    return;
  }
  A* part = p.part + k * p.slices;
  if (tid == 0) part[blockIdx.y] = total;
  if (!last_to_arrive(p.arrivals + k, p.slices)) return;
  // The last block: the channel's partials (lane l adds slices l, l + 32, ..., then a butterfly).
  if (warp == 0) {
    A acc = A(0);
    for (int sl = lane; sl < p.slices; sl += 32) acc += __ldcg(part + sl);
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(kFullWarp, acc, off);
    if (lane == 0) p.db[k] = from_acc<T>(acc);
  }
}

// ---------------------------------------------------------------------------------------------
// Launch.

template <class T>
std::string run_typed(const BiasActCall& c, const void* t, const void* tb, const void* s,
                      void* dz, void* db, void* ws, size_t ws_bytes, cudaStream_t st) {
  using A = Acc<T>;
  constexpr int V = 16 / sizeof(T);
  if (c.outer * c.K * c.inner == 0) {  // no elements: db = 0
    if (db != nullptr && c.K > 0 && cudaMemsetAsync(db, 0, c.K * sizeof(T), st) != cudaSuccess)
      return "memset of db failed";
    return "";
  }
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool vec =
      (c.inner == 1 ? c.K : c.inner) % V == 0 && aligned(t) && aligned(s) && aligned(dz);
  const BabPlan plan = bab_plan(c.outer, c.K, c.inner, vec ? V : 1, sizeof(A));
  if (plan.groups == 0 || plan.groups > INT_MAX) return "tensor too large for the CUDA kernels";
  BabParams<T> p{static_cast<const T*>(t), static_cast<const T*>(tb), static_cast<const T*>(s),
                 static_cast<T*>(dz), static_cast<T*>(db), nullptr, nullptr, c.outer, c.K,
                 c.inner, plan.slice_len, plan.slices, plan.cx, plan.width, c.activation,
                 static_cast<A>(c.param)};
  if (db != nullptr && plan.slices > 1) {
    if (ws == nullptr || ws_bytes < plan.workspace_bytes)
      return "workspace too small for the bias gradient";
    p.arrivals = static_cast<unsigned*>(ws);
    p.part = reinterpret_cast<A*>(static_cast<char*>(ws) + plan.counter_bytes);
    if (cudaMemsetAsync(ws, 0, plan.groups * sizeof(unsigned), st) != cudaSuccess)
      return "memset of the arrival counters failed";
  }
  const dim3 grid(static_cast<unsigned>(plan.groups), static_cast<unsigned>(plan.slices));
  if (c.inner == 1) {
    if (!vec)
      bab_rows_kernel<T, 1, false><<<grid, kRowThreads, 0, st>>>(p);
    else if (c.activation == Activation::kRelu)
      bab_rows_kernel<T, V, true><<<grid, kRowThreads, 0, st>>>(p);
    else
      bab_rows_kernel<T, V, false><<<grid, kRowThreads, 0, st>>>(p);
  } else if (vec) {
    bab_planes_kernel<T, V><<<grid, kPlaneThreads, 0, st>>>(p);
  } else {
    bab_planes_kernel<T, 1><<<grid, kPlaneThreads, 0, st>>>(p);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return std::string("bias/activation kernel launch: ") + cudaGetErrorString(e);
  return "";
}

}  // namespace

size_t bias_act_workspace_bytes(long long outer, long long K, long long inner, DType dtype,
                                bool reduce) {
  if (!reduce || outer <= 0 || K <= 0 || inner <= 0) return 0;
  const int acc = dtype == DType::kF64 ? 8 : 4, V = 16 / static_cast<int>(dtype_bytes(dtype));
  // The vector plan when the shape allows it (the pointers decide at run time), else the scalar.
  size_t bytes = bab_plan(outer, K, inner, 1, acc).workspace_bytes;
  if ((inner == 1 ? K : inner) % V == 0)
    bytes = std::max(bytes, bab_plan(outer, K, inner, V, acc).workspace_bytes);
  return bytes;
}

std::string bias_act_backward(const BiasActCall& c, const void* t, const void* tb, const void* s,
                              void* dz, void* db, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (c.outer < 0 || c.K < 0 || c.inner < 0) return "negative extent";
  if (static_cast<int>(c.activation) < 0 || static_cast<int>(c.activation) >= kNumActivations)
    return "unknown activation id";
  switch (c.dtype) {
    case DType::kF32:
      return run_typed<float>(c, t, tb, s, dz, db, workspace, workspace_bytes, stream);
    case DType::kF64:
      return run_typed<double>(c, t, tb, s, dz, db, workspace, workspace_bytes, stream);
    case DType::kBF16:
      return run_typed<__nv_bfloat16>(c, t, tb, s, dz, db, workspace, workspace_bytes, stream);
    case DType::kF16:
      return run_typed<__half>(c, t, tb, s, dz, db, workspace, workspace_bytes, stream);
  }
  return "unknown dtype";
}

}  // namespace jaxdnn::cuda
