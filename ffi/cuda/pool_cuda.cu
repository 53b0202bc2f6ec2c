// CUDA pooling kernels: max and average pooling, forward and backward, channels-last
// (N, D, H, W, C) as pool_problem.h defines them; channels-first arrays arrive as N*C images of
// one channel. Same operations, tie rules and arithmetic as pool_cpu.cc.
//
// Kernels (one thread per item; an item is one pixel x one vector of V channels):
//   window_fwd   max / avg forward: thread = (output pixel, channel vector), taps of its window
//                in window order, loads of the innermost dimension issued 4 at a time.
//   split_fwd    max / avg forward for large windows with few outputs (global pooling): S
//                threads share one item, thread s takes taps s, s+S, ... of the in-bounds taps;
//                the S partials are combined in a fixed order through shared memory. With one
//                channel (channels-first) the S threads are consecutive lanes, so the loads of a
//                window row coalesce.
//   select       the arg-max selection of a window (first tap, replaced by a later tap v unless
//                the selection s >= v; padding taps are -inf candidates that route nothing):
//                either the tangent at the arg-max (kMaxGather) or the arg-max tap itself into
//                the workspace (first pass of kMaxScatter).
//   scatter      second pass of kMaxScatter: thread = (input pixel, channel vector), gathers dy
//                of the windows covering it whose arg-max is its tap. No atomics: deterministic.
//   avg_bwd      thread = (input pixel, channel vector), gathers dy / divisor of the windows
//                covering it.
// Vectors: V = 16 bytes of channels (8 x 16-bit, 4 x f32, 2 x f64) when C % V == 0 and every
// pointer is 16-byte aligned, else V = 1 (a warp then spans channels, or pixels along W with one
// channel). The windows covering an input are enumerated per dimension in closed form (first
// tap, step stride / gcd(stride, dilation)), in increasing tap order as the CPU does, so
// overlapping sums add up in the CPU's order.
//
// Arithmetic: 16-bit values are widened to float (float64 stays double); sums accumulate in that
// type in window order (split_fwd: per-thread partials in tap order, then the partials in thread
// order), rounded once at the store (round to nearest even). The avg backward adds
// dy * (1 / divisor) with fused multiply-adds (one product when a single window covers the input).
// Max selects stored values, so max forward, the gather and the scatter of a single selection
// are exact; split_fwd may return the other signed zero of a max tie between +0 and -0.
//
// Nothing depends on timing, the device or the launch configuration beyond the problem itself:
// results are bitwise reproducible. JAXDNN_POOL_SPLIT=0 / =1 (read once) turns split_fwd off /
// on for every window of 2 taps or more, so that checkers reach both forward paths.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "pool_cuda.h"

namespace jaxdnn::cuda {
namespace {

using i64 = int64_t;

constexpr int kBlock = 256;
// Threads that fill an H200 (132 SMs x 2048): below this, split_fwd shares items among threads.
constexpr i64 kFillThreads = i64(1) << 18;

// ---------------------------------------------------------------------------------------------
// Geometry handed to the kernels (every spatial quantity fits in int: pool_can_implement).
struct Geo {
  int C;                         // channels
  int CV;                        // channel vectors, C / V
  int in[3], out[3], win[3], st[3], dl[3], pad[3], clo[3], chi[3];
  int cstep[3], costep[3];       // covering windows: tap step stride / g, output step dilation / g
  int win_elems;
  i64 in_pix, out_pix;           // pixels of one image
};

// ---------------------------------------------------------------------------------------------
// Element types: storage T, accumulator A (float, or double for float64).
template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_acc(typename AccOf<T>::type v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_acc<__half>(float v) {
  return __float2half_rn(v);
}

template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -CUDART_INF_F; }
template <> __device__ __forceinline__ double neg_inf<double>() { return -CUDART_INF; }
template <typename A> __device__ __forceinline__ A quiet_nan();
template <> __device__ __forceinline__ float quiet_nan<float>() { return CUDART_NAN_F; }
template <> __device__ __forceinline__ double quiet_nan<double>() { return CUDART_NAN; }

__device__ __forceinline__ float fma_acc(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_acc(double a, double b, double c) {
  return __fma_rn(a, b, c);
}

// Raw words of B bytes (read-only loads through __ldg, plain stores).
template <int B> struct Raw;
template <> struct Raw<1> { using type = unsigned char; };
template <> struct Raw<2> { using type = unsigned short; };
template <> struct Raw<4> { using type = unsigned int; };
template <> struct Raw<8> { using type = uint2; };
template <> struct Raw<16> { using type = uint4; };

template <typename R> __device__ __forceinline__ R ldg_raw(const R* p) { return __ldg(p); }
template <> __device__ __forceinline__ unsigned char ldg_raw(const unsigned char* p) {
  return static_cast<unsigned char>(__ldg(reinterpret_cast<const char*>(p)));
}

// V consecutive elements of type T (V * sizeof(T) of 1 to 16 bytes, aligned to that size).
template <typename T, int V>
struct Vec {
  using A = typename AccOf<T>::type;
  using R = typename Raw<sizeof(T) * V>::type;
  static_assert(sizeof(R) == sizeof(T) * V, "vector size");

  static __device__ __forceinline__ R load(const T* p) {
    return ldg_raw(reinterpret_cast<const R*>(p));
  }
  static __device__ __forceinline__ void unpack(const R& r, A (&o)[V]) {
    T e[V];
    memcpy(e, &r, sizeof(R));
#pragma unroll
    for (int i = 0; i < V; ++i) o[i] = to_acc(e[i]);
  }
  static __device__ __forceinline__ void store(T* p, const A (&v)[V]) {
    T e[V];
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = from_acc<T>(v[i]);
    R r;
    memcpy(&r, e, sizeof(R));
    *reinterpret_cast<R*>(p) = r;
  }
};

// Raw words as 32-bit words and back (arg-max taps are unpacked with shifts, in registers).
__device__ __forceinline__ void to_words(unsigned char r, uint32_t* w) { w[0] = r; }
__device__ __forceinline__ void to_words(unsigned short r, uint32_t* w) { w[0] = r; }
__device__ __forceinline__ void to_words(unsigned int r, uint32_t* w) { w[0] = r; }
__device__ __forceinline__ void to_words(const uint2& r, uint32_t* w) { w[0] = r.x, w[1] = r.y; }
__device__ __forceinline__ void to_words(const uint4& r, uint32_t* w) {
  w[0] = r.x, w[1] = r.y, w[2] = r.z, w[3] = r.w;
}
__device__ __forceinline__ void from_words(const uint32_t* w, unsigned char* r) {
  *r = static_cast<unsigned char>(w[0]);
}
__device__ __forceinline__ void from_words(const uint32_t* w, unsigned short* r) {
  *r = static_cast<unsigned short>(w[0]);
}
__device__ __forceinline__ void from_words(const uint32_t* w, unsigned int* r) { *r = w[0]; }
__device__ __forceinline__ void from_words(const uint32_t* w, uint2* r) {
  r->x = w[0], r->y = w[1];
}
__device__ __forceinline__ void from_words(const uint32_t* w, uint4* r) {
  r->x = w[0], r->y = w[1], r->z = w[2], r->w = w[3];
}

// V arg-max taps stored as G (uint8: 0..254, 255 for none; int32: -1 for none) and handled as
// int in the kernels; at most 16 bytes per access.
template <typename G> __host__ __device__ constexpr int no_tap() {
  return std::is_same_v<G, uint8_t> ? 0xff : -1;
}

template <typename G, int V>
struct ArgVec {
  static constexpr int kBytes = sizeof(G) * V;
  static constexpr int kPiece = kBytes < 16 ? kBytes : 16;
  static constexpr int kWords = (kPiece + 3) / 4;
  static constexpr int kPer = kPiece / sizeof(G);  // taps per piece
  using R = typename Raw<kPiece>::type;

  static __device__ __forceinline__ void load(const G* p, int (&o)[V]) {
#pragma unroll
    for (int q = 0; q < V; q += kPer) {
      uint32_t w[kWords];
      to_words(ldg_raw(reinterpret_cast<const R*>(p + q)), w);
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        if (sizeof(G) == 1) o[q + e] = (w[e / 4] >> (8 * (e % 4))) & 0xff;
        else o[q + e] = static_cast<int>(w[e]);
      }
    }
  }
  static __device__ __forceinline__ void store(G* p, const int (&v)[V]) {
#pragma unroll
    for (int q = 0; q < V; q += kPer) {
      uint32_t w[kWords];
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = 0;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        if (sizeof(G) == 1) w[e / 4] |= (static_cast<uint32_t>(v[q + e]) & 0xffu) << (8 * (e % 4));
        else w[e] = static_cast<uint32_t>(v[q + e]);
      }
      R r;
      from_words(w, &r);
      *reinterpret_cast<R*>(p + q) = r;
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Window arithmetic (pool_cpu.cc's, in int).

// Taps k in [0, window) of a window whose tap 0 sits at `start` with
// lo <= start + k * dilation < hi, as the half-open range [*k0, *k1).
__device__ __forceinline__ void tap_range(int start, int dilation, int window, int lo, int hi,
                                          int* k0, int* k1) {
  const int first = start >= lo ? 0 : (lo - start + dilation - 1) / dilation;
  int last = start >= hi ? 0 : (hi - 1 - start) / dilation + 1;
  last = min(last, window);
  *k0 = min(first, last);
  *k1 = last;
}

// Avg divisor factor of output o along dimension d: its taps inside the counting region.
__device__ __forceinline__ int divisor_factor(const Geo& g, int d, int o) {
  int k0, k1;
  tap_range(o * g.st[d] - g.pad[d], g.dl[d], g.win[d], -g.clo[d], g.in[d] + g.chi[d], &k0, &k1);
  return k1 - k0;
}

// Windows covering input i along dimension d: taps k = k, k + step, ... (n of them, increasing)
// of outputs o, o - ostep, ...; input i is tap k of output o when o * stride = i + pad - k * dl.
struct Cover {
  int k, o, n;
};

__device__ __forceinline__ Cover cover(const Geo& g, int d, int i) {
  Cover c{0, 0, 0};
  const int u = i + g.pad[d];
  if (g.out[d] <= 0 || u < 0) return c;
  const int st = g.st[d], dl = g.dl[d];
  const int kmax = min(g.win[d] - 1, u / dl);        // o * stride >= 0
  const int lo = u - (g.out[d] - 1) * st;            // o <= out - 1
  const int kmin = lo <= 0 ? 0 : (lo + dl - 1) / dl;
  if (kmin > kmax) return c;
  // The first tap in [kmin, kmax] with (u - k * dl) % stride == 0; the solutions of that
  // congruence repeat every cstep taps, so one period is enough.
  int k = kmin;
  const int stop = min(kmax, kmin + g.cstep[d] - 1);
  while (k <= stop && (u - k * dl) % st != 0) ++k;
  if (k > stop) return c;
  c.k = k;
  c.o = (u - k * dl) / st;
  c.n = (kmax - k) / g.cstep[d] + 1;
  return c;
}

// Decomposes item t of an (N, e0, e1, e2, CV) index space.
// (The extents come by value: the address of a kernel parameter would cost a local copy.)
template <typename I>
__device__ __forceinline__ void split_item(I t, int CV, int e0, int e1, int e2, int* cv,
                                           int p[3], i64* n) {
  *cv = static_cast<int>(t % static_cast<I>(CV));
  t /= static_cast<I>(CV);
  p[2] = static_cast<int>(t % static_cast<I>(e2));
  t /= static_cast<I>(e2);
  p[1] = static_cast<int>(t % static_cast<I>(e1));
  t /= static_cast<I>(e1);
  p[0] = static_cast<int>(t % static_cast<I>(e0));
  *n = static_cast<i64>(t / static_cast<I>(e0));
}

template <typename A>
__device__ __forceinline__ A max_step(A m, A v) {  // lax's max: NaN wins and stays
  return (v > m || v != v) ? v : m;
}

// ---------------------------------------------------------------------------------------------
// Forward: max or avg over the in-bounds taps of each window, in window order.
template <typename T, int V, bool kMax, typename I>
__global__ void window_fwd_kernel(Geo g, const T* __restrict__ x, T* __restrict__ y, I items) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  const I t = static_cast<I>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= items) return;
  int cv, o[3];
  i64 n;
  split_item(t, g.CV, g.out[0], g.out[1], g.out[2], &cv, o, &n);
  int start[3], k0[3], k1[3];
#pragma unroll
  for (int d = 0; d < 3; ++d) {
    start[d] = o[d] * g.st[d] - g.pad[d];
    tap_range(start[d], g.dl[d], g.win[d], 0, g.in[d], &k0[d], &k1[d]);
  }
  A acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = kMax ? neg_inf<A>() : A(0);
  const T* xn = x + n * g.in_pix * g.C + static_cast<i64>(cv) * V;
  const i64 step2 = static_cast<i64>(g.dl[2]) * g.C;
  for (int a = k0[0]; a < k1[0]; ++a) {
    const i64 i0 = start[0] + a * g.dl[0];
    for (int b = k0[1]; b < k1[1]; ++b) {
      const i64 i1 = start[1] + b * g.dl[1];
      // Offsets stay integers until they are in bounds (start[2] may be negative).
      const i64 row = ((i0 * g.in[1] + i1) * g.in[2] + start[2]) * g.C;
      for (int c = k0[2]; c < k1[2]; c += 4) {
        typename VT::R r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (c + j < k1[2]) r[j] = VT::load(xn + (row + (c + j) * step2));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (c + j < k1[2]) {
            A v[V];
            VT::unpack(r[j], v);
#pragma unroll
            for (int e = 0; e < V; ++e) acc[e] = kMax ? max_step(acc[e], v[e]) : acc[e] + v[e];
          }
        }
      }
    }
  }
  if (!kMax) {
    // An empty counting region gives 0/0 = NaN, as lax's sum / count does.
    const A divisor = static_cast<A>(static_cast<i64>(divisor_factor(g, 0, o[0])) *
                                     divisor_factor(g, 1, o[1]) * divisor_factor(g, 2, o[2]));
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = acc[e] / divisor;
  }
  VT::store(y + static_cast<i64>(t) * V, acc);
}

// Forward for large windows: S threads per item (blockDim = S x kBlock/S with the S threads as
// consecutive lanes when kLaneSplit, else kBlock/S x S with the items as consecutive lanes).
template <typename T, int V, bool kMax, bool kLaneSplit, typename I>
__global__ void split_fwd_kernel(Geo g, const T* __restrict__ x, T* __restrict__ y, I items,
                                 int S) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  extern __shared__ unsigned char smem[];
  A* partial = reinterpret_cast<A*>(smem);
  const int s = kLaneSplit ? threadIdx.x : threadIdx.y;
  const int local = kLaneSplit ? threadIdx.y : threadIdx.x;
  const I t = static_cast<I>(blockIdx.x) * (kBlock / S) + local;
  A acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = kMax ? neg_inf<A>() : A(0);
  int o[3] = {0, 0, 0};
  if (t < items) {
    int cv;
    i64 n;
    split_item(t, g.CV, g.out[0], g.out[1], g.out[2], &cv, o, &n);
    int start[3], k0[3], k1[3];
#pragma unroll
    for (int d = 0; d < 3; ++d) {
      start[d] = o[d] * g.st[d] - g.pad[d];
      tap_range(start[d], g.dl[d], g.win[d], 0, g.in[d], &k0[d], &k1[d]);
    }
    const int n1 = k1[1] - k0[1], n2 = k1[2] - k0[2];
    const int count = (k1[0] - k0[0]) * n1 * n2;
    const T* xn = x + n * g.in_pix * g.C + static_cast<i64>(cv) * V;
    // Taps s, s + S, s + 2S, ... in that order, loads issued 4 at a time.
    for (int f0 = s; f0 < count; f0 += 4 * S) {
      typename VT::R raw[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int f = f0 + j * S;
        if (f < count) {
          const int c = k0[2] + f % n2, r = f / n2;
          const int b = k0[1] + r % n1, a = k0[0] + r / n1;
          const i64 i0 = start[0] + a * g.dl[0], i1 = start[1] + b * g.dl[1];
          const i64 i2 = start[2] + c * g.dl[2];
          raw[j] = VT::load(xn + ((i0 * g.in[1] + i1) * g.in[2] + i2) * g.C);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (f0 + j * S < count) {
          A v[V];
          VT::unpack(raw[j], v);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] = kMax ? max_step(acc[e], v[e]) : acc[e] + v[e];
        }
      }
    }
  }
  A* mine = partial + (static_cast<i64>(local) * S + s) * V;
#pragma unroll
  for (int e = 0; e < V; ++e) mine[e] = acc[e];
  __syncthreads();
  if (s != 0 || t >= items) return;
  for (int j = 1; j < S; ++j) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A v = mine[j * V + e];
      acc[e] = kMax ? max_step(acc[e], v) : acc[e] + v;
    }
  }
  if (!kMax) {
    const A divisor = static_cast<A>(static_cast<i64>(divisor_factor(g, 0, o[0])) *
                                     divisor_factor(g, 1, o[1]) * divisor_factor(g, 2, o[2]));
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = acc[e] / divisor;
  }
  VT::store(y + static_cast<i64>(t) * V, acc);
}

// Arg-max selection over every tap of each window in window order. kGather: writes the tangent
// t at the arg-max (0 when padding is selected); else writes the arg-max tap (no_tap<G>() for
// padding) into `arg`.
template <typename T, int V, bool kGather, typename G, typename I>
__global__ void select_kernel(Geo g, const T* __restrict__ x, const T* __restrict__ tangent,
                              T* __restrict__ y, G* __restrict__ arg, I items) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  const I t = static_cast<I>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= items) return;
  int cv, o[3];
  i64 n;
  split_item(t, g.CV, g.out[0], g.out[1], g.out[2], &cv, o, &n);
  int start[3], k0[3], k1[3];
#pragma unroll
  for (int d = 0; d < 3; ++d) {
    start[d] = o[d] * g.st[d] - g.pad[d];
    tap_range(start[d], g.dl[d], g.win[d], 0, g.in[d], &k0[d], &k1[d]);
  }
  A sel[V];    // the selected value; NaN: the first tap replaces it, whatever its value
  A picked[V]; // kGather: the tangent at the selection
  int tap[V];  // else: the selected tap
#pragma unroll
  for (int e = 0; e < V; ++e) {
    sel[e] = quiet_nan<A>();
    picked[e] = A(0);
    tap[e] = no_tap<G>();
  }
  // A padding tap (-inf, tangent 0, no tap) replaces only a NaN selection, so a run of padding
  // taps acts as one.
  auto padding = [&]() {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const bool take = sel[e] != sel[e];
      sel[e] = take ? neg_inf<A>() : sel[e];
      if (kGather) picked[e] = take ? A(0) : picked[e];
      else tap[e] = take ? no_tap<G>() : tap[e];
    }
  };
  const i64 base = n * g.in_pix * g.C + static_cast<i64>(cv) * V;
  const i64 step2 = static_cast<i64>(g.dl[2]) * g.C;
  for (int a = 0; a < g.win[0]; ++a) {
    const bool in_a = a >= k0[0] && a < k1[0];
    const i64 i0 = start[0] + a * g.dl[0];
    for (int b = 0; b < g.win[1]; ++b) {
      if (!in_a || b < k0[1] || b >= k1[1] || k0[2] >= k1[2]) {  // a row of padding
        padding();
        continue;
      }
      const i64 i1 = start[1] + b * g.dl[1];
      const i64 row = base + ((i0 * g.in[1] + i1) * g.in[2] + start[2]) * g.C;
      const int tap_row = (a * g.win[1] + b) * g.win[2];
      if (k0[2] > 0) padding();
      for (int c = k0[2]; c < k1[2]; c += 2) {
        const bool two = c + 1 < k1[2];
        typename VT::R rx[2], rt[2];
        rx[0] = VT::load(x + (row + c * step2));
        if (two) rx[1] = VT::load(x + (row + (c + 1) * step2));
        if (kGather) {
          rt[0] = VT::load(tangent + (row + c * step2));
          if (two) rt[1] = VT::load(tangent + (row + (c + 1) * step2));
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          if (j == 1 && !two) break;
          A v[V], tv[V];
          VT::unpack(rx[j], v);
          if (kGather) VT::unpack(rt[j], tv);
          const int k = tap_row + c + j;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const bool take = !(sel[e] >= v[e]);
            sel[e] = take ? v[e] : sel[e];
            if (kGather) picked[e] = take ? tv[e] : picked[e];
            else tap[e] = take ? k : tap[e];
          }
        }
      }
      if (k1[2] < g.win[2]) padding();
    }
  }
  if (kGather) VT::store(y + static_cast<i64>(t) * V, picked);
  else ArgVec<G, V>::store(arg + static_cast<i64>(t) * V, tap);
}

// Max-pool backward, second pass: dx at each input is the sum, over the windows covering it (in
// the CPU's order), of dy where the window's arg-max is this input's tap.
template <typename T, int V, typename G, typename I>
__global__ void scatter_kernel(Geo g, const T* __restrict__ dy, const G* __restrict__ arg,
                               T* __restrict__ dx, I items) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  const I t = static_cast<I>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= items) return;
  int cv, i[3];
  i64 n;
  split_item(t, g.CV, g.in[0], g.in[1], g.in[2], &cv, i, &n);
  const Cover c0 = cover(g, 0, i[0]), c1 = cover(g, 1, i[1]), c2 = cover(g, 2, i[2]);
  A acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = A(0);
  const i64 base = n * g.out_pix * g.C + static_cast<i64>(cv) * V;
  for (int a = 0; a < c0.n; ++a) {
    const int ka = c0.k + a * g.cstep[0], oa = c0.o - a * g.costep[0];
    for (int b = 0; b < c1.n; ++b) {
      const int kb = c1.k + b * g.cstep[1], ob = c1.o - b * g.costep[1];
      const int tap_ab = (ka * g.win[1] + kb) * g.win[2];
      const i64 row = static_cast<i64>(oa) * g.out[1] + ob;
      for (int c = 0; c < c2.n; ++c) {
        const int kc = c2.k + c * g.cstep[2], oc = c2.o - c * g.costep[2];
        const i64 off = base + (row * g.out[2] + oc) * g.C;
        const int k = tap_ab + kc;
        int sel[V];
        ArgVec<G, V>::load(arg + off, sel);
        bool any = false;
#pragma unroll
        for (int e = 0; e < V; ++e) any |= sel[e] == k;
        if (!any) continue;
        A d[V];
        VT::unpack(VT::load(dy + off), d);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = sel[e] == k ? acc[e] + d[e] : acc[e];
      }
    }
  }
  VT::store(dx + static_cast<i64>(t) * V, acc);
}

// Avg-pool backward: dx[i] = sum over the windows o covering i of dy[o] * (1 / divisor[o]).
template <typename T, int V, typename I>
__global__ void avg_bwd_kernel(Geo g, const T* __restrict__ dy, T* __restrict__ dx, I items) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  const I t = static_cast<I>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= items) return;
  int cv, i[3];
  i64 n;
  split_item(t, g.CV, g.in[0], g.in[1], g.in[2], &cv, i, &n);
  const Cover c0 = cover(g, 0, i[0]), c1 = cover(g, 1, i[1]), c2 = cover(g, 2, i[2]);
  const bool single = c0.n == 1 && c1.n == 1 && c2.n == 1;
  A acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = A(0);
  const i64 base = n * g.out_pix * g.C + static_cast<i64>(cv) * V;
  for (int a = 0; a < c0.n; ++a) {
    const int oa = c0.o - a * g.costep[0];
    const i64 fa = divisor_factor(g, 0, oa);
    for (int b = 0; b < c1.n; ++b) {
      const int ob = c1.o - b * g.costep[1];
      const i64 fab = fa * divisor_factor(g, 1, ob);
      const i64 row = static_cast<i64>(oa) * g.out[1] + ob;
      for (int c = 0; c < c2.n; ++c) {
        const int oc = c2.o - c * g.costep[2];
        const A inv = A(1) / static_cast<A>(fab * divisor_factor(g, 2, oc));
        A d[V];
        VT::unpack(VT::load(dy + base + (row * g.out[2] + oc) * g.C), d);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = single ? d[e] * inv : fma_acc(d[e], inv, acc[e]);
      }
    }
  }
  VT::store(dx + static_cast<i64>(t) * V, acc);
}

// ---------------------------------------------------------------------------------------------
// Host side.

std::string launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return "";
  return std::string(what) + " launch failed: " + cudaGetErrorString(e);
}

int gcd(int a, int b) {
  while (b) {
    const int r = a % b;
    a = b;
    b = r;
  }
  return a;
}

Geo make_geo(const PoolProblem& p, int V) {
  Geo g{};
  g.C = static_cast<int>(p.C);
  g.CV = static_cast<int>(p.C / V);
  for (int d = 0; d < 3; ++d) {
    g.in[d] = static_cast<int>(p.in[d]);
    g.out[d] = static_cast<int>(p.out[d]);
    g.win[d] = static_cast<int>(p.window[d]);
    g.st[d] = static_cast<int>(p.stride[d]);
    g.dl[d] = static_cast<int>(p.dilation[d]);
    g.pad[d] = static_cast<int>(p.pad_lo[d]);
    g.clo[d] = static_cast<int>(p.count_lo[d]);
    g.chi[d] = static_cast<int>(p.count_hi[d]);
    const int div = gcd(g.st[d], g.dl[d]);
    g.cstep[d] = g.st[d] / div;
    g.costep[d] = g.dl[d] / div;
  }
  g.win_elems = static_cast<int>(p.window_elems());
  g.in_pix = p.in[0] * p.in[1] * p.in[2];
  g.out_pix = p.out[0] * p.out[1] * p.out[2];
  return g;
}

unsigned blocks_for(i64 items, int per_block) {
  return static_cast<unsigned>((items + per_block - 1) / per_block);
}

// JAXDNN_POOL_SPLIT: -1 unset (heuristic), 0 never split, 1 split every window of >= 2 taps.
int split_override() {
  static const int value = [] {
    const char* v = std::getenv("JAXDNN_POOL_SPLIT");
    return v == nullptr || *v == 0 ? -1 : (*v == '0' ? 0 : 1);
  }();
  return value;
}

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The launches of one (dtype, vector width, index type).
template <typename T, int V, typename I>
struct Launcher {
  const PoolProblem& p;
  Geo g;
  cudaStream_t stream;

  std::string forward(bool is_max, const T* x, T* y) const {
    const i64 items = p.y_elems() / V;
    if (items == 0) return "";
    // Large windows with few outputs: share each item among S threads.
    const i64 taps = p.window_elems();
    const bool one_channel = V == 1 && p.C == 1;
    int S = 1;
    if (split_override() == 1) {
      if (taps >= 2) {
        S = one_channel ? (taps >= 32 ? 32 : 16) : 2;
        while (!one_channel && S < 32 && 2 * S <= taps) S *= 2;
      }
    } else if (split_override() == -1 && taps >= 16) {
      if (one_channel) {
        if (items < kFillThreads) S = taps >= 32 ? 32 : 16;
      } else {
        while (S < 32 && 4 * S <= taps && items * S < kFillThreads) S *= 2;
      }
    }
    const bool lanes = one_channel && S > 1;
    if (S == 1) {
      if (is_max) window_fwd_kernel<T, V, true, I><<<blocks_for(items, kBlock), kBlock, 0,
                                                      stream>>>(g, x, y, static_cast<I>(items));
      else window_fwd_kernel<T, V, false, I><<<blocks_for(items, kBlock), kBlock, 0,
                                               stream>>>(g, x, y, static_cast<I>(items));
      return launched(is_max ? "max pool forward" : "avg pool forward");
    }
    using A = typename AccOf<T>::type;
    const dim3 block = lanes ? dim3(S, kBlock / S) : dim3(kBlock / S, S);
    const unsigned grid = blocks_for(items, kBlock / S);
    const size_t smem = sizeof(A) * V * kBlock;
    const I n = static_cast<I>(items);
    if (is_max && lanes) split_fwd_kernel<T, V, true, true, I><<<grid, block, smem, stream>>>(
        g, x, y, n, S);
    else if (is_max) split_fwd_kernel<T, V, true, false, I><<<grid, block, smem, stream>>>(
        g, x, y, n, S);
    else if (lanes) split_fwd_kernel<T, V, false, true, I><<<grid, block, smem, stream>>>(
        g, x, y, n, S);
    else split_fwd_kernel<T, V, false, false, I><<<grid, block, smem, stream>>>(g, x, y, n, S);
    return launched(is_max ? "max pool forward (split)" : "avg pool forward (split)");
  }

  std::string gather(const T* x, const T* tangent, T* y) const {
    const i64 items = p.y_elems() / V;
    if (items == 0) return "";
    select_kernel<T, V, true, uint8_t, I><<<blocks_for(items, kBlock), kBlock, 0, stream>>>(
        g, x, tangent, y, nullptr, static_cast<I>(items));
    return launched("max pool gather");
  }

  template <typename G>
  std::string scatter(const T* x, const T* dy, T* dx, G* arg) const {
    const i64 out_items = p.y_elems() / V;
    if (out_items > 0) {
      select_kernel<T, V, false, G, I><<<blocks_for(out_items, kBlock), kBlock, 0, stream>>>(
          g, x, nullptr, nullptr, arg, static_cast<I>(out_items));
      if (std::string err = launched("max pool arg-max"); !err.empty()) return err;
    }
    const i64 in_items = p.x_elems() / V;
    if (in_items == 0) return "";
    scatter_kernel<T, V, G, I><<<blocks_for(in_items, kBlock), kBlock, 0, stream>>>(
        g, dy, arg, dx, static_cast<I>(in_items));
    return launched("max pool scatter");
  }

  std::string avg_backward(const T* dy, T* dx) const {
    const i64 items = p.x_elems() / V;
    if (items == 0) return "";
    avg_bwd_kernel<T, V, I><<<blocks_for(items, kBlock), kBlock, 0, stream>>>(
        g, dy, dx, static_cast<I>(items));
    return launched("avg pool backward");
  }

  std::string run(PoolOp op, const void* a, const void* b, void* out, void* workspace) const {
    const T* as = static_cast<const T*>(a);
    const T* bs = static_cast<const T*>(b);
    T* os = static_cast<T*>(out);
    switch (op) {
      case PoolOp::kMaxForward: return forward(true, as, os);
      case PoolOp::kAvgForward: return forward(false, as, os);
      case PoolOp::kMaxGather: return gather(as, bs, os);
      case PoolOp::kMaxScatter:
        if (p.window_elems() <= 255) return scatter(as, bs, os, static_cast<uint8_t*>(workspace));
        if (reinterpret_cast<uintptr_t>(workspace) % 4 != 0)
          return "the workspace of a scatter over more than 255 taps must be 4-byte aligned";
        return scatter(as, bs, os, static_cast<int32_t*>(workspace));
      case PoolOp::kAvgBackward: return avg_backward(as, os);
    }
    return "unknown pooling operation";
  }
};

template <typename T, int V>
std::string run_width(PoolOp op, const PoolProblem& p, const void* a, const void* b, void* out,
                      void* workspace, cudaStream_t stream) {
  const Geo g = make_geo(p, V);
  // Items of either index space (plus a block of slack) decide the index type.
  const i64 items = (p.x_elems() > p.y_elems() ? p.x_elems() : p.y_elems()) / V + kBlock;
  if (items <= static_cast<i64>(std::numeric_limits<uint32_t>::max()))
    return Launcher<T, V, uint32_t>{p, g, stream}.run(op, a, b, out, workspace);
  return Launcher<T, V, uint64_t>{p, g, stream}.run(op, a, b, out, workspace);
}

template <typename T>
std::string run_typed(PoolOp op, const PoolProblem& p, const void* a, const void* b, void* out,
                      void* workspace, cudaStream_t stream) {
  constexpr int kV = 16 / sizeof(T);
  const bool vector = p.C % kV == 0 && aligned16(a) && aligned16(b) && aligned16(out) &&
                      (op != PoolOp::kMaxScatter || aligned16(workspace));
  if (vector) return run_width<T, kV>(op, p, a, b, out, workspace, stream);
  return run_width<T, 1>(op, p, a, b, out, workspace, stream);
}

}  // namespace

size_t pool_workspace_bytes(PoolOp op, const PoolProblem& p) {
  if (op != PoolOp::kMaxScatter) return 0;
  return static_cast<size_t>(p.y_elems()) * (p.window_elems() <= 255 ? 1 : 4);
}

std::string pool_can_implement(const PoolProblem& p) {
  constexpr i64 kLim = i64(1) << 28;  // keeps every int window sum below 2^31
  for (int d = 0; d < 3; ++d) {
    const i64 values[] = {p.in[d], p.out[d], p.window[d], p.stride[d], p.dilation[d],
                          p.pad_lo[d] < 0 ? -p.pad_lo[d] : p.pad_lo[d],
                          p.count_lo[d] < 0 ? -p.count_lo[d] : p.count_lo[d],
                          p.count_hi[d] < 0 ? -p.count_hi[d] : p.count_hi[d]};
    for (i64 v : values)
      if (v > kLim) return "a spatial extent, window, stride, dilation or padding exceeds 2^28";
    if ((p.window[d] - 1) * p.dilation[d] > kLim ||
        (p.out[d] > 0 && (p.out[d] - 1) * p.stride[d] > kLim))
      return "a dilated window or strided output extent exceeds 2^28";
  }
  if (p.C > std::numeric_limits<int32_t>::max()) return "more than 2^31 - 1 channels";
  if (p.window_elems() > std::numeric_limits<int32_t>::max())
    return "the window has more than 2^31 - 1 elements";
  return "";
}

std::string run_pool(PoolOp op, const PoolProblem& p, DType dtype, const void* a, const void* b,
                     void* out, void* workspace, size_t workspace_size, cudaStream_t stream) {
  if (std::string why = pool_can_implement(p); !why.empty()) return why;
  if (workspace_size < pool_workspace_bytes(op, p))
    return "workspace buffer is too small (" + std::to_string(workspace_size) + " < " +
           std::to_string(pool_workspace_bytes(op, p)) + " bytes)";
  if (p.x_elems() == 0 && p.y_elems() == 0) return "";
  switch (dtype) {
    case DType::kF32: return run_typed<float>(op, p, a, b, out, workspace, stream);
    case DType::kF64: return run_typed<double>(op, p, a, b, out, workspace, stream);
    case DType::kBF16: return run_typed<__nv_bfloat16>(op, p, a, b, out, workspace, stream);
    case DType::kF16: return run_typed<__half>(op, p, a, b, out, workspace, stream);
  }
  return "unsupported dtype";
}

}  // namespace jaxdnn::cuda
