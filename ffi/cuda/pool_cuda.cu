// CUDA pooling kernels: max and average pooling, forward and backward, channels-last
// (N, D, H, W, C) as pool_problem.h defines them; channels-first arrays arrive as N*C images of
// one channel. Same operations, tie rules and arithmetic as pool_cpu.cc.
//
// Kernels (one thread per item unless said otherwise; an item is one pixel x one vector of V
// channels):
//   window_fwd   max / avg forward: thread = (output pixel, channel vector), the in-bounds taps
//                of its window in window order, walked as one flat sequence with 8 loads in
//                flight; 16-bit vector max works on packed pairs (bf16x2 / half2, NaN wins).
//   plane_fwd    max / avg forward of one-channel images (channels-first) with windows over the
//                two innermost dimensions: a 32 x 8 block stages the input region of a tile of
//                32 x 8*rows outputs in shared memory once, coalesced, and each output reads its
//                taps from there in window order.
//   split_fwd    max / avg forward for large windows with few outputs (global pooling): S
//                threads share one item, thread s takes the s-th of S consecutive runs of the
//                in-bounds taps (about one batch of loads each); the S partials are combined in
//                thread order through shared memory. With one channel (channels-first) the S
//                threads are consecutive lanes, so the loads of a window row coalesce.
//   select       the arg-max selection of a window (first tap, replaced by a later tap v unless
//                the selection s >= v; padding taps are -inf candidates that route nothing):
//                either the tangent at the arg-max (kMaxGather) or the arg-max tap itself into
//                the workspace (first pass of kMaxScatter).
//   scatter      second pass of kMaxScatter: thread = (input pixel, channel vector), gathers dy
//                of the windows covering it whose arg-max is its tap. No atomics: deterministic.
//   avg_bwd      thread = (input pixel, channel vector), gathers dy / divisor of the windows
//                covering it.
//   disjoint_bwd scatter's second pass / avg backward when windows do not overlap (stride >=
//                dilated window, or one window: 2x2 stride 2, global pooling): straight-line,
//                4 inputs per thread, so their loads are in flight together.
//   chan_tile    16-byte channel vectors, 2-D windows: a block stages the input region of a
//                tile of outputs x channel vectors in shared memory (cp.async). Max and avg
//                forward (windows of <= 64 taps; only when forced, slower than window_fwd on
//                the H200) read their taps from there; the max backward (kMaxScatter, <= 255
//                taps) is one pass: it also stages dy of the tile's outputs plus the halo
//                of windows that cover its first inputs, selects every staged window's arg-max
//                (one byte per element, shared memory), and each input of the tile gathers dy
//                from the covering windows that selected it. No workspace, no atomics.
//   quad         3x3 windows at stride 2 (the CNN stem's pooling), any vector width: thread =
//                four windows (2 x 2) x a channel vector, their 5 x 5 taps streamed row by
//                row: max / avg forward of disjoint quads (25 loads for 4 outputs); max
//                backward in two passes (each window's arg-max tap into the workspace, then
//                each 2 x 2 input cell gathers dy from the 4 windows that cover it); avg
//                backward per cell (no input loads).
//   rowvec       3x3 stride-2 forward of one-channel images (channels-first) with rows of whole
//                16-byte vectors: thread = 2 output rows x half a vector of output columns, from
//                5 row vectors and the column left of each.
//   global_avg_bwd  avg backward of one window covering the input: 16-byte stores of
//                dy * (1 / divisor) whatever the layout.
//   cell_avg     avg forward / backward when 2x2 windows partition the input (2x2 stride 2,
//                padding only inside edge windows), 16-byte vectors: thread = output, 4 per
//                thread, straight-line (the backward writes each input once from its window).
// Index math: items are decomposed with multiply-shift division (FastDiv, 32-bit items below
// 2^31); tap ranges and covering windows take no division at dilation 1; the avg divisor is a
// constant when every window counts all its taps.
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
// are exact; the max forward may return either zero of a tie between +0 and -0 (split_fwd,
// packed 16-bit pairs).
//
// Nothing depends on timing, the device or the launch configuration beyond the problem itself:
// results are bitwise reproducible. JAXDNN_POOL_SPLIT=0 / =1 (read once) turns split_fwd off /
// on for every window of 2 taps or more, so that checkers reach both forward paths;
// JAXDNN_POOL_CHAN=0 turns chan_tile off, =TH,TW,CB forces its tile sizes (checks, sweeps).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
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
// Division of numerators 0 <= n < 2^31 by a fixed divisor d >= 1: a multiply-high and a shift
// (m = ceil(2^p / d) with p = 31 + ceil(log2 d); m = 0 stands for d = 1).
struct FastDiv {
  uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(i64 divisor) {
    d = divisor < 1 ? 1 : static_cast<uint32_t>(divisor);
    if (d == 1) return;
    int l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    m = static_cast<uint32_t>(((uint64_t(1) << (31 + l)) + d - 1) / d);
    s = static_cast<uint32_t>(l - 1);
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return m == 0 ? n : static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32) >> s;
  }
};

// Geometry handed to the kernels (every spatial quantity fits in int: pool_can_implement).
struct Geo {
  int C;                         // channels
  int CV;                        // channel vectors, C / V
  int in[3], out[3], win[3], st[3], dl[3], pad[3], clo[3], chi[3];
  int cstep[3], costep[3];       // covering windows: tap step stride / g, output step dilation / g
  int win_elems;
  i64 in_pix, out_pix;           // pixels of one image
  FastDiv fcv, fin[3], fout[3], fst[3];  // CV, the extents and the strides as divisors
  int uniform_div;               // the avg divisor when every window counts all its taps, else 0
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

// s / d, correctly rounded, for a count d >= 0 given inv = 1 / d (one division per window instead
// of one per channel): q = s * inv is within an ulp of s / d, r = s - q d is exact (an FMA), and
// q + r * inv rounds to s / d (Markstein's correction, the fast path of the hardware division
// sequence). Infinite or NaN quotients (0 / 0 for an empty window) keep q. H200, bf16 avg 3x3/2
// forward on the ResNet-50 stem: 28.2 -> 26.0 us; the same results as the division (checker).
template <typename A>
__device__ __forceinline__ A div_by_count(A s, A inv, A d) {
  const A q = s * inv;
  const A r = fma_acc(-q, d, s);
  return fabs(q) <= std::numeric_limits<A>::max() ? fma_acc(r, inv, q) : q;
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

  // The raw words of V taps, and tap e of them.
  static constexpr int kAllWords = V / kPer * kWords;
  static __device__ __forceinline__ void load_words(const G* p, uint32_t (&w)[kAllWords]) {
#pragma unroll
    for (int q = 0; q < V; q += kPer)
      to_words(ldg_raw(reinterpret_cast<const R*>(p + q)), w + q / kPer * kWords);
  }
  static __device__ __forceinline__ int tap(const uint32_t (&w)[kAllWords], int e) {
    if (sizeof(G) == 1) return (w[e / 4] >> (8 * (e % 4))) & 0xff;
    return static_cast<int>(w[e]);
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

// n / d for n >= 0 (most windows have dilation 1: no division).
__device__ __forceinline__ int div_pos(int n, int d) { return d == 1 ? n : n / d; }

// Taps k in [0, window) of a window whose tap 0 sits at `start` with
// lo <= start + k * dilation < hi, as the half-open range [*k0, *k1).
__device__ __forceinline__ void tap_range(int start, int dilation, int window, int lo, int hi,
                                          int* k0, int* k1) {
  const int first = start >= lo ? 0 : div_pos(lo - start + dilation - 1, dilation);
  int last = start >= hi ? 0 : div_pos(hi - 1 - start, dilation) + 1;
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

__device__ __forceinline__ int avg_divisor(const Geo& g, const int (&o)[3]) {
  if (g.uniform_div) return g.uniform_div;
  return divisor_factor(g, 0, o[0]) * divisor_factor(g, 1, o[1]) * divisor_factor(g, 2, o[2]);
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
  if (dl == 1) {  // outputs o in [ceil((u - win + 1) / st), u / st], taps u - o * st
    const int ohi = min(static_cast<int>(g.fst[d].div(u)), g.out[d] - 1);
    const int r = u - g.win[d] + 1;
    const int olo = r <= 0 ? 0 : static_cast<int>(g.fst[d].div(r + st - 1));
    if (olo > ohi) return c;
    c.k = u - ohi * st;
    c.o = ohi;
    c.n = ohi - olo + 1;
    return c;
  }
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

// q = n / f.d (32-bit items: multiply-high; 64-bit: a division).
template <typename I>
__device__ __forceinline__ I divq(I n, const FastDiv& f) {
  if constexpr (sizeof(I) == 4) return f.div(n);
  else return n / f.d;
}

// Decomposes item t of an (N, e0, e1, e2, CV) index space (f: the divisors CV, e2, e1, e0).
template <typename I>
__device__ __forceinline__ void split_item(I t, const FastDiv& fcv, const FastDiv& f2,
                                           const FastDiv& f1, const FastDiv& f0, int* cv,
                                           int p[3], i64* n) {
  I q = divq(t, fcv);
  *cv = static_cast<int>(t - q * fcv.d);
  t = q;
  q = divq(t, f2);
  p[2] = static_cast<int>(t - q * f2.d);
  t = q;
  q = divq(t, f1);
  p[1] = static_cast<int>(t - q * f1.d);
  t = q;
  q = divq(t, f0);
  p[0] = static_cast<int>(t - q * f0.d);
  *n = static_cast<i64>(q);
}

template <typename A>
__device__ __forceinline__ A max_step(A m, A v) {  // lax's max: NaN wins and stays
  return (v > m || v != v) ? v : m;
}

// Walks an n0 x n1 x n2 box of positions in row-major order, keeping the element offset and
// the tap index of the current position.
struct Walk {
  i64 off;
  int k;
  int b, c, n1, n2;
  i64 s2, s1, s0;  // offset step along dimension 2, and the extra steps at a new row / plane
  int k2, k1, k0;  // the same for the tap index
  // Moves on; returns 0 within a row, 1 at a new row, 2 at a new plane.
  __device__ __forceinline__ int next() {
    off += s2;
    k += k2;
    if (++c < n2) return 0;
    c = 0;
    off += s1;
    k += k1;
    if (++b < n1) return 1;
    b = 0;
    off += s0;
    k += k0;
    return 2;
  }
};

// The in-bounds taps of the window of output o (channel vector cv of image n), in window order:
// *count of them; *pad_first / *pad_last: padding taps before the first / after the last;
// *pad_row / *pad_plane: padding taps between the last tap of a row (plane) and the next.
struct WindowTaps {
  Walk w;
  int count;
  int n0;
  bool pad_first, pad_last, pad_row, pad_plane;
};

__device__ __forceinline__ WindowTaps window_taps(const Geo& g, const int (&o)[3], i64 n, int cv,
                                                  int V) {
  int start[3], k0[3], k1[3];
#pragma unroll
  for (int d = 0; d < 3; ++d) {
    start[d] = o[d] * g.st[d] - g.pad[d];
    tap_range(start[d], g.dl[d], g.win[d], 0, g.in[d], &k0[d], &k1[d]);
  }
  WindowTaps t;
  t.n0 = k1[0] - k0[0];
  const int n1 = k1[1] - k0[1], n2 = k1[2] - k0[2];
  t.count = t.n0 * n1 * n2;
  t.pad_first = k0[0] > 0 || k0[1] > 0 || k0[2] > 0;
  t.pad_last = k1[0] < g.win[0] || k1[1] < g.win[1] || k1[2] < g.win[2];
  t.pad_row = n2 < g.win[2];
  t.pad_plane = t.pad_row || n1 < g.win[1];
  Walk& w = t.w;
  w.b = w.c = 0;
  w.n1 = n1;
  w.n2 = n2;
  const i64 C = g.C;
  const i64 row = static_cast<i64>(g.in[2]) * C, plane = static_cast<i64>(g.in[1]) * row;
  w.s2 = g.dl[2] * C;
  const i64 r1 = g.dl[1] * row;
  w.s1 = r1 - n2 * w.s2;
  w.s0 = g.dl[0] * plane - n1 * r1;
  w.k2 = 1;
  w.k1 = g.win[2] - n2;
  w.k0 = (g.win[1] - n1) * g.win[2];
  // Offsets stay integers until they are in bounds (start may be negative).
  const int i0 = start[0] + k0[0] * g.dl[0], i1 = start[1] + k0[1] * g.dl[1];
  const int i2 = start[2] + k0[2] * g.dl[2];
  w.off = n * g.in_pix * C + i0 * plane + i1 * row + i2 * C + static_cast<i64>(cv) * V;
  w.k = (k0[0] * g.win[1] + k0[1]) * g.win[2] + k0[2];
  return t;
}

// The windows covering input i (channel vector cv of image n): a walk over their dy offsets and
// taps, in increasing tap order; c[d] per dimension.
__device__ __forceinline__ Walk cover_walk(const Geo& g, const Cover (&c)[3], i64 n, int cv,
                                           int V) {
  Walk w;
  w.b = w.c = 0;
  w.n1 = c[1].n;
  w.n2 = c[2].n;
  const i64 C = g.C;
  const i64 row = static_cast<i64>(g.out[2]) * C, plane = static_cast<i64>(g.out[1]) * row;
  w.s2 = -g.costep[2] * C;
  const i64 r1 = -g.costep[1] * row;
  w.s1 = r1 - c[2].n * w.s2;
  w.s0 = -g.costep[0] * plane - c[1].n * r1;
  w.k2 = g.cstep[2];
  const int kr = g.cstep[1] * g.win[2];
  w.k1 = kr - c[2].n * g.cstep[2];
  w.k0 = g.cstep[0] * g.win[1] * g.win[2] - c[1].n * kr;
  w.off = n * g.out_pix * C + c[0].o * plane + c[1].o * row + c[2].o * C +
          static_cast<i64>(cv) * V;
  w.k = (c[0].k * g.win[1] + c[1].k) * g.win[2] + c[2].k;
  return w;
}

// Loads per thread issued before their values are used.
constexpr int kBatch = 8;

// ---------------------------------------------------------------------------------------------
// Max of 16-bit pairs in one 32-bit word (lax's max: NaN wins). By value the same as max_step
// on the widened values (either zero may come out of a +0 / -0 tie, as the forward allows).
template <typename T>
__device__ __forceinline__ uint32_t max2(uint32_t a, uint32_t b) {
#ifdef JAXDNN_POOL_EMULATION
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const unsigned short ha = static_cast<unsigned short>(a >> (16 * h));
    const unsigned short hb = static_cast<unsigned short>(b >> (16 * h));
    T ea, eb;
    memcpy(&ea, &ha, 2);
    memcpy(&eb, &hb, 2);
    const float fa = to_acc(ea), fb = to_acc(eb);
    r |= static_cast<uint32_t>(fb > fa || fb != fb ? hb : ha) << (16 * h);
  }
  return r;
#else
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  T2 x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  const T2 m = __hmax2_nan(x, y);
  uint32_t r;
  memcpy(&r, &m, 4);
  return r;
#endif
}

// -inf in both halves of a word.
template <typename T> constexpr uint32_t neg_inf2() {
  return std::is_same_v<T, __half> ? 0xfc00fc00u : 0xff80ff80u;
}

template <typename T, int V>
constexpr bool kPackedMax = sizeof(T) == 2 && V * sizeof(T) >= 4;

// ---------------------------------------------------------------------------------------------
// Forward: max or avg over the in-bounds taps of each window, in window order.
template <typename T, int V, bool kMax, typename I>
__global__ void window_fwd_kernel(Geo g, const T* __restrict__ x, T* __restrict__ y, I items) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  using R = typename VT::R;
  const I t = static_cast<I>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= items) return;
  int cv, o[3];
  i64 n;
  split_item(t, g.fcv, g.fout[2], g.fout[1], g.fout[0], &cv, o, &n);
  WindowTaps wt = window_taps(g, o, n, cv, V);
  Walk& w = wt.w;
  if constexpr (kMax && kPackedMax<T, V>) {
    // 16-bit max: pairs of values in 32-bit words, no widening.
    constexpr int kW = sizeof(R) / 4;
    uint32_t acc[kW];
#pragma unroll
    for (int i = 0; i < kW; ++i) acc[i] = neg_inf2<T>();
    for (int f = 0; f < wt.count; f += kBatch) {
      R r[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (f + j < wt.count) {
          r[j] = VT::load(x + w.off);
          w.next();
        }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (f + j < wt.count) {
          uint32_t v[kW];
          memcpy(v, &r[j], sizeof(R));
#pragma unroll
          for (int i = 0; i < kW; ++i) acc[i] = max2<T>(acc[i], v[i]);
        }
    }
    R out;
    memcpy(&out, acc, sizeof(R));
    *reinterpret_cast<R*>(y + static_cast<i64>(t) * V) = out;
  } else {
    A acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = kMax ? neg_inf<A>() : A(0);
    for (int f = 0; f < wt.count; f += kBatch) {
      R r[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (f + j < wt.count) {
          r[j] = VT::load(x + w.off);
          w.next();
        }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (f + j < wt.count) {
          A v[V];
          VT::unpack(r[j], v);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] = kMax ? max_step(acc[e], v[e]) : acc[e] + v[e];
        }
    }
    if (!kMax) {
      // An empty counting region gives 0/0 = NaN, as lax's sum / count does.
      const A divisor = static_cast<A>(avg_divisor(g, o));
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = acc[e] / divisor;
    }
    VT::store(y + static_cast<i64>(t) * V, acc);
  }
}

// Forward for large windows with few outputs: S threads per item (blockDim = S x kBlock/S with
// the S threads as consecutive lanes when kLaneSplit, else kBlock/S x S with the items as
// consecutive lanes). Thread s takes the s-th of S consecutive runs of the window's in-bounds
// taps; the partials are combined in thread order.
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
    split_item(t, g.fcv, g.fout[2], g.fout[1], g.fout[0], &cv, o, &n);
    WindowTaps wt = window_taps(g, o, n, cv, V);
    Walk& w = wt.w;
    const int run = (wt.count + S - 1) / S;
    const int f0 = s * run, f1 = min(f0 + run, wt.count);
    if (f0 < f1) {
      // Moves the walk to tap f0 of the box.
      const int c = f0 % w.n2, r = f0 / w.n2;
      const int b = r % w.n1, a = r / w.n1;
      w.c = c;
      w.b = b;
      w.off += a * (w.s0 + w.n1 * (w.s1 + w.n2 * w.s2)) + b * (w.s1 + w.n2 * w.s2) + c * w.s2;
    }
    for (int f = f0; f < f1; f += kBatch) {
      typename VT::R raw[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (f + j < f1) {
          raw[j] = VT::load(x + w.off);
          w.next();
        }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (f + j < f1) {
          A v[V];
          VT::unpack(raw[j], v);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] = kMax ? max_step(acc[e], v[e]) : acc[e] + v[e];
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
    const A divisor = static_cast<A>(avg_divisor(g, o));
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = acc[e] / divisor;
  }
  VT::store(y + static_cast<i64>(t) * V, acc);
}

// One-channel images (channels-first layouts) with windows over the two innermost dimensions:
// a block of kTileW x 8 threads handles a tile of kTileW x 8 * rows pixels of one image (outputs
// for the forward and the arg-max selection, inputs for the backward) from the region of the
// other side they need, staged once in shared memory (coalesced along rows); each thread then
// reads its taps / covering windows from there in the CPU's order.
constexpr int kTileW = 32;
constexpr int kTileThreads = kTileW * 8;

struct PlaneTile {
  int rows;          // pixels per thread, down the tile
  int ih, iw;        // forward / select: the input region of a tile; backward: its bound
  FastDiv ftw, fth;  // tiles across and down an image
  FastDiv fiw;       // iw
};

// The image and the first row / column of this block's tile.
struct TileAt {
  i64 n;
  int h0, w0;
};

__device__ __forceinline__ TileAt tile_at(const PlaneTile& pt) {
  const uint32_t q1 = pt.ftw.div(blockIdx.x), q2 = pt.fth.div(q1);
  return {static_cast<i64>(q2), static_cast<int>(q1 - q2 * pt.fth.d) * 8 * pt.rows,
          static_cast<int>(blockIdx.x - q1 * pt.ftw.d) * kTileW};
}

// Stages the ih x iw input region at (r0, c0) of image xn as accumulator values (positions
// outside the image hold 0 and are never read).
template <typename T, typename A>
__device__ __forceinline__ void stage_input(const Geo& g, const PlaneTile& pt, const T* xn,
                                            int r0, int c0, A* tile) {
  const int total = pt.ih * pt.iw;
#ifdef JAXDNN_POOL_EMULATION
  // The host emulation runs a block's threads one after another: each stages the whole tile.
  for (int tid = 0; tid < kTileThreads; ++tid)
#else
  const int tid = threadIdx.y * kTileW + threadIdx.x;
#endif
  for (int base = tid; base < total; base += kBatch * kTileThreads) {
    T v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int idx = base + j * kTileThreads;
      const int r = static_cast<int>(pt.fiw.div(idx)), c = idx - r * pt.iw;
      const int ir = r0 + r, ic = c0 + c;
      if (idx < total && ir >= 0 && ir < g.in[1] && ic >= 0 && ic < g.in[2])
        v[j] = xn[static_cast<i64>(ir) * g.in[2] + ic];
      else v[j] = from_acc<T>(A(0));
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (base + j * kTileThreads < total) tile[base + j * kTileThreads] = to_acc(v[j]);
  }
}

// The shared start of the tiled forward and selection: stages this block's input region, then
// gives this thread's output column ow (at.w0 + threadIdx.x; >= out[2]: none), its in-bounds
// taps [kc0, kc1) and its first tap's column in the region.
struct PlaneCol {
  TileAt at;
  int ow, kc0, kc1, col;
};

template <typename T, typename A>
__device__ __forceinline__ PlaneCol plane_prologue(const Geo& g, const PlaneTile& pt,
                                                   const T* x, A* tile) {
  PlaneCol pc;
  pc.at = tile_at(pt);
  stage_input(g, pt, x + pc.at.n * g.in_pix, pc.at.h0 * g.st[1] - g.pad[1],
              pc.at.w0 * g.st[2] - g.pad[2], tile);
  __syncthreads();
  pc.ow = pc.at.w0 + threadIdx.x;
  pc.kc0 = pc.kc1 = 0;
  pc.col = threadIdx.x * g.st[2];
  if (pc.ow < g.out[2])
    tap_range(pc.ow * g.st[2] - g.pad[2], g.dl[2], g.win[2], 0, g.in[2], &pc.kc0, &pc.kc1);
  return pc;
}

// Forward: max / avg over the in-bounds taps of each output in window order.
template <typename T, bool kMax>
__global__ void plane_fwd_kernel(Geo g, PlaneTile pt, const T* __restrict__ x,
                                 T* __restrict__ y) {
  using A = typename AccOf<T>::type;
  extern __shared__ unsigned char smem[];
  A* tile = reinterpret_cast<A*>(smem);
  const PlaneCol pc = plane_prologue(g, pt, x, tile);
  if (pc.ow >= g.out[2]) return;
  const TileAt& at = pc.at;
  const int ow = pc.ow, kc0 = pc.kc0, kc1 = pc.kc1, col = pc.col;
  const int fc = g.uniform_div ? 1 : divisor_factor(g, 2, ow);
  for (int r = 0; r < pt.rows; ++r) {
    const int ty = threadIdx.y + 8 * r, oh = at.h0 + ty;
    if (oh >= g.out[1]) break;
    int kb0, kb1;
    tap_range(oh * g.st[1] - g.pad[1], g.dl[1], g.win[1], 0, g.in[1], &kb0, &kb1);
    A acc = kMax ? neg_inf<A>() : A(0);
    for (int kb = kb0; kb < kb1; ++kb) {
      const A* row = tile + (ty * g.st[1] + kb * g.dl[1]) * pt.iw + col;
      for (int kc = kc0; kc < kc1; ++kc) {
        const A v = row[kc * g.dl[2]];
        acc = kMax ? max_step(acc, v) : acc + v;
      }
    }
    if (!kMax) {
      // An empty counting region gives 0/0 = NaN, as lax's sum / count does.
      const int div = g.uniform_div ? g.uniform_div
                                    : divisor_factor(g, 0, 0) * divisor_factor(g, 1, oh) * fc;
      acc = acc / static_cast<A>(div);
    }
    y[at.n * g.out_pix + static_cast<i64>(oh) * g.out[2] + ow] = from_acc<T>(acc);
  }
}

// Arg-max selection (select_kernel's rule over every tap, padding included, in window order):
// kGather writes the tangent at the arg-max (copied; 0 for padding), else the arg-max tap.
template <typename T, bool kGather, typename G>
__global__ void plane_select_kernel(Geo g, PlaneTile pt, const T* __restrict__ x,
                                    const T* __restrict__ tangent, T* __restrict__ y,
                                    G* __restrict__ arg) {
  using A = typename AccOf<T>::type;
  extern __shared__ unsigned char smem[];
  A* tile = reinterpret_cast<A*>(smem);
  const PlaneCol pc = plane_prologue(g, pt, x, tile);
  if (pc.ow >= g.out[2]) return;
  const TileAt& at = pc.at;
  const int ow = pc.ow, kc0 = pc.kc0, kc1 = pc.kc1, col = pc.col;
  for (int r = 0; r < pt.rows; ++r) {
    const int ty = threadIdx.y + 8 * r, oh = at.h0 + ty;
    if (oh >= g.out[1]) break;
    int kb0, kb1;
    tap_range(oh * g.st[1] - g.pad[1], g.dl[1], g.win[1], 0, g.in[1], &kb0, &kb1);
    A sel = quiet_nan<A>();  // NaN: the first tap replaces it, whatever its value
    int sb = -1, sc = 0;     // the selected tap (sb < 0: padding or none)
    // A padding tap (-inf, no tap) replaces only a NaN selection.
    auto padding = [&]() {
      const bool take = sel != sel;
      sel = take ? neg_inf<A>() : sel;
      sb = take ? -1 : sb;
    };
    for (int kb = 0; kb < g.win[1]; ++kb) {
      if (kb < kb0 || kb >= kb1 || kc0 >= kc1) {  // a row of padding
        padding();
        continue;
      }
      if (kc0 > 0) padding();
      const A* row = tile + (ty * g.st[1] + kb * g.dl[1]) * pt.iw + col;
      for (int kc = kc0; kc < kc1; ++kc) {
        const A v = row[kc * g.dl[2]];
        const bool take = !(sel >= v);
        sel = take ? v : sel;
        sb = take ? kb : sb;
        sc = take ? kc : sc;
      }
      if (kc1 < g.win[2]) padding();
    }
    const i64 yo = at.n * g.out_pix + static_cast<i64>(oh) * g.out[2] + ow;
    if (kGather) {
      T picked = from_acc<T>(A(0));
      if (sb >= 0)
        picked = tangent[at.n * g.in_pix +
                         static_cast<i64>(oh * g.st[1] - g.pad[1] + sb * g.dl[1]) * g.in[2] +
                         (ow * g.st[2] - g.pad[2] + sc * g.dl[2])];
      y[yo] = picked;
    } else {
      arg[yo] = static_cast<G>(sb >= 0 ? sb * g.win[2] + sc : no_tap<G>());
    }
  }
}

// Backward, a tile of inputs: the avg backward (!kMax) or the scatter's second pass (kMax) from
// the dy (and arg-max) region of the outputs covering the tile, in the CPU's order.
template <typename T, bool kMax, typename G>
__global__ void plane_bwd_kernel(Geo g, PlaneTile pt, const T* __restrict__ dy,
                                 const G* __restrict__ arg, T* __restrict__ dx) {
  using A = typename AccOf<T>::type;
  extern __shared__ unsigned char smem[];
  A* dyt = reinterpret_cast<A*>(smem);
  G* argt = reinterpret_cast<G*>(smem + sizeof(A) * pt.ih * pt.iw);
  const TileAt at = tile_at(pt);
  // The outputs covering inputs [h0, h1) x [w0, w1): [olo, ohi] along each dimension.
  int olo[2], cnt[2];
#pragma unroll
  for (int d = 0; d < 2; ++d) {
    const int dim = d + 1;
    const int i0 = d == 0 ? at.h0 : at.w0;
    const int i1 = min(i0 + (d == 0 ? 8 * pt.rows : kTileW), g.in[dim]);
    const int lo = i0 + g.pad[dim] - (g.win[dim] - 1) * g.dl[dim];
    olo[d] = lo <= 0 ? 0 : static_cast<int>(g.fst[dim].div(lo + g.st[dim] - 1));
    const int hi = i1 - 1 + g.pad[dim];
    const int ohi = hi < 0 ? -1 : min(static_cast<int>(g.fst[dim].div(hi)), g.out[dim] - 1);
    cnt[d] = max(ohi - olo[d] + 1, 0);
  }
  const i64 ybase = at.n * g.out_pix;
#ifdef JAXDNN_POOL_EMULATION
  // The host emulation runs a block's threads one after another: each stages the whole region.
  for (int ty0 = 0; ty0 < 8; ++ty0)
    for (int tx0 = 0; tx0 < kTileW; ++tx0)
#else
  const int ty0 = threadIdx.y, tx0 = threadIdx.x;
#endif
  for (int r = ty0; r < cnt[0]; r += 8)
    for (int c = tx0; c < cnt[1]; c += kTileW) {
      const i64 yo = ybase + static_cast<i64>(olo[0] + r) * g.out[2] + olo[1] + c;
      dyt[r * pt.iw + c] = to_acc(dy[yo]);
      if (kMax) argt[r * pt.iw + c] = arg[yo];
    }
  __syncthreads();
  const int iw = at.w0 + threadIdx.x;
  if (iw >= g.in[2]) return;
  const Cover c2 = cover(g, 2, iw);
  for (int r = 0; r < pt.rows; ++r) {
    const int ih = at.h0 + threadIdx.y + 8 * r;
    if (ih >= g.in[1]) break;
    const Cover c1 = cover(g, 1, ih);
    const bool single = c1.n * c2.n == 1;
    A acc = A(0);
    for (int a = 0; a < c1.n; ++a) {
      const int ob = c1.o - a * g.costep[1], kb = c1.k + a * g.cstep[1];
      const int fb = kMax || g.uniform_div ? 1 : divisor_factor(g, 0, 0) * divisor_factor(g, 1, ob);
      for (int c = 0; c < c2.n; ++c) {
        const int oc = c2.o - c * g.costep[2], kc = c2.k + c * g.cstep[2];
        const int idx = (ob - olo[0]) * pt.iw + (oc - olo[1]);
        const A d = dyt[idx];
        if (kMax) {
          acc = static_cast<int>(argt[idx]) == kb * g.win[2] + kc ? acc + d : acc;
        } else {
          const int div = g.uniform_div ? g.uniform_div : fb * divisor_factor(g, 2, oc);
          const A inv = A(1) / static_cast<A>(div);
          acc = single ? d * inv : fma_acc(d, inv, acc);
        }
      }
    }
    dx[at.n * g.in_pix + static_cast<i64>(ih) * g.in[2] + iw] = from_acc<T>(acc);
  }
}

// Arg-max selection over every tap of each window in window order. kGather: writes the tangent
// t at the arg-max (0 when padding is selected); else writes the arg-max tap (no_tap<G>() for
// padding) into `arg`.
template <typename T, int V, bool kGather, typename G, typename I>
__global__ void select_kernel(Geo g, const T* __restrict__ x, const T* __restrict__ tangent,
                              T* __restrict__ y, G* __restrict__ arg, I items) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  constexpr int kB = kGather ? kBatch / 2 : kBatch;  // two loads per tap when gathering
  const I t = static_cast<I>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= items) return;
  int cv, o[3];
  i64 n;
  split_item(t, g.fcv, g.fout[2], g.fout[1], g.fout[0], &cv, o, &n);
  WindowTaps wt = window_taps(g, o, n, cv, V);
  Walk& w = wt.w;
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
  bool pad = wt.pad_first || wt.count == 0;  // padding before the next in-bounds tap
  for (int f = 0; f < wt.count; f += kB) {
    typename VT::R rx[kB], rt[kB];
    bool pb[kB];
    int kt[kB];
#pragma unroll
    for (int j = 0; j < kB; ++j)
      if (f + j < wt.count) {
        rx[j] = VT::load(x + w.off);
        if (kGather) rt[j] = VT::load(tangent + w.off);
        pb[j] = pad;
        kt[j] = w.k;
        const int moved = w.next();
        pad = (moved == 1 && wt.pad_row) || (moved == 2 && wt.pad_plane);
      }
#pragma unroll
    for (int j = 0; j < kB; ++j)
      if (f + j < wt.count) {
        if (pb[j]) padding();
        A v[V], tv[V];
        VT::unpack(rx[j], v);
        if (kGather) VT::unpack(rt[j], tv);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const bool take = !(sel[e] >= v[e]);
          sel[e] = take ? v[e] : sel[e];
          if (kGather) picked[e] = take ? tv[e] : picked[e];
          else tap[e] = take ? kt[j] : tap[e];
        }
      }
  }
  if (wt.count == 0 ? pad : wt.pad_last) padding();
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
  using AV = ArgVec<G, V>;
  const I t = static_cast<I>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= items) return;
  int cv, i[3];
  i64 n;
  split_item(t, g.fcv, g.fin[2], g.fin[1], g.fin[0], &cv, i, &n);
  const Cover c[3] = {cover(g, 0, i[0]), cover(g, 1, i[1]), cover(g, 2, i[2])};
  const int count = c[0].n * c[1].n * c[2].n;
  Walk w = cover_walk(g, c, n, cv, V);
  A acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = A(0);
  constexpr int kB = kBatch / 2;
  for (int f = 0; f < count; f += kB) {
    uint32_t sel[kB][AV::kAllWords];
    int kt[kB];
    typename VT::R rd[kB];
#pragma unroll
    for (int j = 0; j < kB; ++j)
      if (f + j < count) {
        AV::load_words(arg + w.off, sel[j]);
        rd[j] = VT::load(dy + w.off);
        kt[j] = w.k;
        w.next();
      }
#pragma unroll
    for (int j = 0; j < kB; ++j)
      if (f + j < count) {
        A d[V];
        VT::unpack(rd[j], d);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = AV::tap(sel[j], e) == kt[j] ? acc[e] + d[e] : acc[e];
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
  split_item(t, g.fcv, g.fin[2], g.fin[1], g.fin[0], &cv, i, &n);
  const Cover c[3] = {cover(g, 0, i[0]), cover(g, 1, i[1]), cover(g, 2, i[2])};
  const int count = c[0].n * c[1].n * c[2].n;
  const bool single = count == 1;
  Walk w = cover_walk(g, c, n, cv, V);
  A acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = A(0);
  if (g.uniform_div) {
    const A inv = A(1) / static_cast<A>(g.uniform_div);
    for (int f = 0; f < count; f += kBatch) {
      typename VT::R rd[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (f + j < count) {
          rd[j] = VT::load(dy + w.off);
          w.next();
        }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (f + j < count) {
          A d[V];
          VT::unpack(rd[j], d);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] = single ? d[e] * inv : fma_acc(d[e], inv, acc[e]);
        }
    }
    VT::store(dx + static_cast<i64>(t) * V, acc);
    return;
  }
  // The current window's outputs along each dimension and the divisor factor of the first two.
  int oa = c[0].o, ob = c[1].o, oc = c[2].o;
  int fab = divisor_factor(g, 0, oa) * divisor_factor(g, 1, ob);
  for (int f = 0; f < count; f += kBatch) {
    typename VT::R rd[kBatch];
    int div[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (f + j < count) {
        rd[j] = VT::load(dy + w.off);
        div[j] = fab * divisor_factor(g, 2, oc);
        const int moved = w.next();
        oc -= g.costep[2];
        if (moved != 0) {
          oc = c[2].o;
          ob -= g.costep[1];
          if (moved == 2) {
            ob = c[1].o;
            oa -= g.costep[0];
          }
          fab = divisor_factor(g, 0, oa) * divisor_factor(g, 1, ob);
        }
      }
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (f + j < count) {
        const A inv = A(1) / static_cast<A>(div[j]);
        A d[V];
        VT::unpack(rd[j], d);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = single ? d[e] * inv : fma_acc(d[e], inv, acc[e]);
      }
  }
  VT::store(dx + static_cast<i64>(t) * V, acc);
}

// Backward when windows do not overlap (every input lies in at most one window: stride >=
// the dilated window in every dimension): the scatter's second pass (kMax) or the avg backward,
// straight-line for kItems inputs per thread (items t, t + kBlock, ...) so that all their loads
// are in flight together.
constexpr int kItems = 4;

template <typename T, int V, bool kMax, typename G, typename I>
__global__ void disjoint_bwd_kernel(Geo g, const T* __restrict__ dy, const G* __restrict__ arg,
                                    T* __restrict__ dx, I items) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  using AV = ArgVec<G, V>;
  const I t0 = static_cast<I>(blockIdx.x) * (kBlock * kItems) + threadIdx.x;
  typename VT::R rd[kItems];
  uint32_t sel[kItems][AV::kAllWords];
  int k[kItems], div[kItems];
  bool covered[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const I t = t0 + static_cast<I>(j) * kBlock;
    covered[j] = false;
    if (t >= items) continue;
    int cv, i[3];
    i64 n;
    split_item(t, g.fcv, g.fin[2], g.fin[1], g.fin[0], &cv, i, &n);
    const Cover c[3] = {cover(g, 0, i[0]), cover(g, 1, i[1]), cover(g, 2, i[2])};
    covered[j] = c[0].n > 0 && c[1].n > 0 && c[2].n > 0;
    if (!covered[j]) continue;
    const i64 off = ((n * g.out[0] + c[0].o) * g.out[1] + c[1].o) * static_cast<i64>(g.out[2]) *
                        g.C + static_cast<i64>(c[2].o) * g.C + static_cast<i64>(cv) * V;
    rd[j] = VT::load(dy + off);
    if (kMax) {
      AV::load_words(arg + off, sel[j]);
      k[j] = (c[0].k * g.win[1] + c[1].k) * g.win[2] + c[2].k;
    } else {
      const int o[3] = {c[0].o, c[1].o, c[2].o};
      div[j] = avg_divisor(g, o);
    }
  }
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const I t = t0 + static_cast<I>(j) * kBlock;
    if (t >= items) continue;
    A acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = A(0);
    if (covered[j]) {
      A d[V];
      VT::unpack(rd[j], d);
      if (kMax) {
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = AV::tap(sel[j], e) == k[j] ? acc[e] + d[e] : acc[e];
      } else {
        const A inv = A(1) / static_cast<A>(div[j]);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = d[e] * inv;
      }
    }
    VT::store(dx + static_cast<i64>(t) * V, acc);
  }
}

// ---------------------------------------------------------------------------------------------
// Channels-last tiles (16-byte channel vectors, windows over the two innermost dimensions):
// a block of kBlock threads takes th x tw outputs x cb channel vectors of one image and copies
// the input region their windows read into shared memory once (16-byte cp.async, coalesced
// along C; positions outside the image hold -inf, or 0 for avg). Then:
//   forward        each output vector takes the max / window-order sum of its taps from there;
//   backward       also stages dy of those outputs plus a halo of hlo = floor((R-1)*dl / s)
//                  outputs before the tile in each dimension (the windows that also cover the
//                  tile's first inputs), computes every staged window's arg-max tap (one byte
//                  per element, in shared memory), and each input the block owns gathers dy
//                  from the covering windows whose arg-max is its tap. One pass: x and dy read
//                  once (halo aside), dx written once, no workspace, no atomics.
// Input ownership: the tile of outputs [o0, o0 + th) owns inputs [o0*s - pad, (o0+th)*s - pad)
// (the first tile from 0, the last to the end, clamped), whose covering windows are exactly the
// staged outputs [o0 - hlo, o0 + th). A padding tap in shared memory is -inf, which is what the
// selection rule makes of padding (it replaces only a NaN selection); its tap index never
// matches an input, so it routes nothing.
struct ChanTile {
  int th, tw, cb;          // outputs down and across, channel vectors of a tile
  int hlo_h, hlo_w;        // staged outputs before the tile (backward; 0 forward)
  int oh, ow;              // staged outputs: th + hlo_h, tw + hlo_w
  int rh, rw;              // their input region
  FastDiv fcb, frw, fow;   // cb, rw, ow
  FastDiv fnc, fnw, fnh;   // channel blocks, tiles across, tiles down
};

#ifdef JAXDNN_POOL_EMULATION
// The host emulation runs a block's threads one after another: a phase whose shared-memory
// results other threads read is done whole by every thread.
#define FOR_EACH_TID(tid) for (int tid = 0; tid < kBlock; ++tid)
#else
#define FOR_EACH_TID(tid) if (const int tid = threadIdx.x; true)
#endif

// 16-byte global -> shared copy that does not wait (cp.async.cg: L2 only), and the wait.
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
#ifdef JAXDNN_POOL_EMULATION
  memcpy(dst, src, 16);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
#endif
}
__device__ __forceinline__ void copy_async_wait() {
#ifndef JAXDNN_POOL_EMULATION
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

template <typename T, int V, bool kBwd, bool kMax>
__global__ void __launch_bounds__(kBlock)
    chan_tile_kernel(Geo g, ChanTile ct, const T* __restrict__ x, const T* __restrict__ dy,
                     T* __restrict__ out) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  using R = typename VT::R;
  using AR = typename Raw<V>::type;  // the V one-byte arg-max taps of a vector
  static_assert(sizeof(R) == 16, "16-byte vectors only");
  extern __shared__ unsigned char smem[];
  R* xs = reinterpret_cast<R*>(smem);               // rh x rw x cb
  R* ds = xs + ct.rh * ct.rw * ct.cb;               // oh x ow x cb (backward)
  AR* as = reinterpret_cast<AR*>(ds + (kBwd ? ct.oh * ct.ow * ct.cb : 0));
  // This block's tile: channel block fastest, then across, down, image (vertically adjacent
  // tiles run together, so the halo rows they share come from L2).
  uint32_t b = blockIdx.x, q = ct.fnc.div(b);
  const int cv0 = static_cast<int>(b - q * ct.fnc.d) * ct.cb;
  b = q;
  q = ct.fnw.div(b);
  const int ow0 = static_cast<int>(b - q * ct.fnw.d) * ct.tw;
  b = q;
  q = ct.fnh.div(b);
  const int oh0 = static_cast<int>(b - q * ct.fnh.d) * ct.th;
  const i64 img = q;
  const int bh = oh0 - ct.hlo_h, bw = ow0 - ct.hlo_w;  // the first staged output
  const int r0 = bh * g.st[1] - g.pad[1], c0 = bw * g.st[2] - g.pad[2];  // its first tap
  const i64 C = g.C;
  const T* xi = x + img * g.in[1] * g.in[2] * C + static_cast<i64>(cv0) * V;
  const i64 ybase = img * g.out[1] * g.out[2] * C + static_cast<i64>(cv0) * V;
  R ninf;  // padding: -inf for max; 0 for avg (a sum from +0 never holds -0, so adding +0 is exact)
  {
    T e[V];
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = from_acc<T>(kMax ? neg_inf<A>() : A(0));
    memcpy(&ninf, e, sizeof(R));
  }
  FOR_EACH_TID(tid) {
    const int total = ct.rh * ct.rw * ct.cb;
    for (int idx = tid; idx < total; idx += kBlock) {
      const int pix = static_cast<int>(ct.fcb.div(idx)), v = idx - pix * ct.cb;
      const int r = static_cast<int>(ct.frw.div(pix)), c = pix - r * ct.rw;
      const int ir = r0 + r, ic = c0 + c;
      if (ir >= 0 && ir < g.in[1] && ic >= 0 && ic < g.in[2])
        copy16_async(xs + idx, xi + (static_cast<i64>(ir) * g.in[2] + ic) * C + v * V);
      else xs[idx] = ninf;
    }
    if (kBwd) {
      const int staged = ct.oh * ct.ow * ct.cb;
      for (int idx = tid; idx < staged; idx += kBlock) {
        const int pix = static_cast<int>(ct.fcb.div(idx)), v = idx - pix * ct.cb;
        const int r = static_cast<int>(ct.fow.div(pix)), c = pix - r * ct.ow;
        const int o1 = bh + r, o2 = bw + c;  // outside the output: never read
        if (o1 >= 0 && o1 < g.out[1] && o2 >= 0 && o2 < g.out[2])
          copy16_async(ds + idx, dy + ybase + (static_cast<i64>(o1) * g.out[2] + o2) * C + v * V);
      }
    }
  }
  copy_async_wait();
  __syncthreads();
  // Each staged output's window: taps (kb, kc) at region rows lr*s + kb*dl, columns lc*s + kc*dl.
  const int tap_row = g.dl[1] * ct.rw * ct.cb, tap_col = g.dl[2] * ct.cb;
  auto window_at = [&](int idx, int* o1, int* o2, const R** p) {
    const int pix = static_cast<int>(ct.fcb.div(idx)), v = idx - pix * ct.cb;
    const int lr = static_cast<int>(ct.fow.div(pix)), lc = pix - lr * ct.ow;
    *o1 = bh + lr;
    *o2 = bw + lc;
    *p = xs + (lr * g.st[1] * ct.rw + lc * g.st[2]) * ct.cb + v;
    return v;
  };
  if constexpr (!kBwd) {
    for (int idx = threadIdx.x; idx < ct.oh * ct.ow * ct.cb; idx += kBlock) {
      int o1, o2;
      const R* p;
      const int v = window_at(idx, &o1, &o2, &p);
      if (o1 >= g.out[1] || o2 >= g.out[2]) continue;
      T* yo = out + ybase + (static_cast<i64>(o1) * g.out[2] + o2) * C + v * V;
      if constexpr (!kMax) {
        A acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = A(0);
        for (int kb = 0; kb < g.win[1]; ++kb)
          for (int kc = 0; kc < g.win[2]; ++kc) {
            A val[V];
            VT::unpack(p[kb * tap_row + kc * tap_col], val);
#pragma unroll
            for (int e = 0; e < V; ++e) acc[e] += val[e];
          }
        // Depth has window 1: its divisor factor is 1. An empty counting region gives NaN.
        const int o[3] = {0, o1, o2};
        const A divisor = static_cast<A>(avg_divisor(g, o));
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = acc[e] / divisor;
        VT::store(yo, acc);
      } else if constexpr (sizeof(T) == 2) {
        // 16-bit max on packed pairs (NaN wins; -inf padding changes nothing).
        uint32_t acc[4] = {neg_inf2<T>(), neg_inf2<T>(), neg_inf2<T>(), neg_inf2<T>()};
        for (int kb = 0; kb < g.win[1]; ++kb)
          for (int kc = 0; kc < g.win[2]; ++kc) {
            uint32_t w[4];
            to_words(p[kb * tap_row + kc * tap_col], w);
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[i] = max2<T>(acc[i], w[i]);
          }
        R r;
        from_words(acc, &r);
        *reinterpret_cast<R*>(yo) = r;
      } else {
        A acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = neg_inf<A>();
        for (int kb = 0; kb < g.win[1]; ++kb)
          for (int kc = 0; kc < g.win[2]; ++kc) {
            A val[V];
            VT::unpack(p[kb * tap_row + kc * tap_col], val);
#pragma unroll
            for (int e = 0; e < V; ++e) acc[e] = max_step(acc[e], val[e]);
          }
        VT::store(yo, acc);
      }
    }
  } else {
    FOR_EACH_TID(tid) {
      for (int idx = tid; idx < ct.oh * ct.ow * ct.cb; idx += kBlock) {
        int o1, o2;
        const R* p;
        window_at(idx, &o1, &o2, &p);
        if (o1 < 0 || o1 >= g.out[1] || o2 < 0 || o2 >= g.out[2]) continue;
        A sel[V];  // NaN: the first tap replaces it, whatever its value
        int tap[V];
#pragma unroll
        for (int e = 0; e < V; ++e) sel[e] = quiet_nan<A>(), tap[e] = 0;
        int k = 0;
        for (int kb = 0; kb < g.win[1]; ++kb)
          for (int kc = 0; kc < g.win[2]; ++kc, ++k) {
            A val[V];
            VT::unpack(p[kb * tap_row + kc * tap_col], val);
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const bool take = !(sel[e] >= val[e]);
              sel[e] = take ? val[e] : sel[e];
              tap[e] = take ? k : tap[e];
            }
          }
        uint32_t w[(V + 3) / 4] = {};
#pragma unroll
        for (int e = 0; e < V; ++e) w[e / 4] |= static_cast<uint32_t>(tap[e]) << (8 * (e % 4));
        AR a;
        from_words(w, &a);
        as[idx] = a;
      }
    }
    __syncthreads();
    // The inputs this block owns: [i0, i1) x [j0, j1).
    auto owned = [](int o0, int t, int out, int s, int pad, int in, int* lo, int* hi) {
      *lo = o0 == 0 ? 0 : min(max(o0 * s - pad, 0), in);
      *hi = o0 + t >= out ? in : min(max((o0 + t) * s - pad, 0), in);
    };
    int i0, i1, j0, j1;
    owned(oh0, ct.th, g.out[1], g.st[1], g.pad[1], g.in[1], &i0, &i1);
    owned(ow0, ct.tw, g.out[2], g.st[2], g.pad[2], g.in[2], &j0, &j1);
    const int row = (j1 - j0) * ct.cb;
    const int items = (i1 - i0) * row;
    T* dxi = out + img * g.in[1] * g.in[2] * C + static_cast<i64>(cv0) * V;
    for (int idx = threadIdx.x; idx < items; idx += kBlock) {
      const int r = idx / row, rest = idx - r * row;
      const int c = static_cast<int>(ct.fcb.div(rest)), v = rest - c * ct.cb;
      const int ih = i0 + r, iw = j0 + c;
      const Cover c1 = cover(g, 1, ih), c2 = cover(g, 2, iw);
      A acc[V];
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = A(0);
      // Covering windows in increasing tap order (the CPU's summation order).
      for (int a = 0; a < c1.n; ++a) {
        const int ob = c1.o - a * g.costep[1], kb = c1.k + a * g.cstep[1];
        for (int cc = 0; cc < c2.n; ++cc) {
          const int oc = c2.o - cc * g.costep[2], kc = c2.k + cc * g.cstep[2];
          const int s = ((ob - bh) * ct.ow + (oc - bw)) * ct.cb + v;
          const uint32_t k = kb * g.win[2] + kc;
          uint32_t w[(V + 3) / 4];
          to_words(as[s], w);
          A d[V];
          VT::unpack(ds[s], d);
#pragma unroll
          for (int e = 0; e < V; ++e)
            acc[e] = ((w[e / 4] >> (8 * (e % 4))) & 0xffu) == k ? acc[e] + d[e] : acc[e];
        }
      }
      VT::store(dxi + (static_cast<i64>(ih) * g.in[2] + iw) * C + v * V, acc);
    }
  }
}

// Avg pooling when the windows partition the input (stride = window, dilation 1, padding only
// inside the first and last windows: every input in exactly one window), 2-D windows of
// kR x kS, 16-byte channel vectors: thread = (output, channel vector) for kN outputs t,
// t + kBlock, ... Forward: the window-order sum of its in-bounds taps / divisor; backward:
// dy * (1 / divisor) (one window per input: a single product) stored to each in-bounds tap.
// Straight-line, loads in flight together.
template <typename T, int V, bool kFwd, int kR, int kS, typename I, int kN = kItems>
__global__ void __launch_bounds__(kBlock)
    cell_avg_kernel(Geo g, const T* __restrict__ src, T* __restrict__ dst, I items) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  const I t0 = static_cast<I>(blockIdx.x) * (kBlock * kN) + threadIdx.x;
  typename VT::R raw[kN][kFwd ? kR * kS : 1];
  i64 base[kN];  // offset of tap (0, 0) (input) in units of T
  bool in_r[kN][kR], in_s[kN][kS];
  int div[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const I t = t0 + static_cast<I>(j) * kBlock;
    if (t >= items) continue;
    int cv, o[3];
    i64 n;
    split_item(t, g.fcv, g.fout[2], g.fout[1], g.fout[0], &cv, o, &n);
    const int h = o[1] * kR - g.pad[1], w = o[2] * kS - g.pad[2];
    base[j] = ((n * g.in[0] + o[0]) * g.in[1] + h) * static_cast<i64>(g.in[2]) * g.C +
              static_cast<i64>(w) * g.C + static_cast<i64>(cv) * V;
#pragma unroll
    for (int a = 0; a < kR; ++a) in_r[j][a] = h + a >= 0 && h + a < g.in[1];
#pragma unroll
    for (int b = 0; b < kS; ++b) in_s[j][b] = w + b >= 0 && w + b < g.in[2];
    div[j] = avg_divisor(g, o);
    if (kFwd) {
#pragma unroll
      for (int a = 0; a < kR; ++a)
#pragma unroll
        for (int b = 0; b < kS; ++b)
          if (in_r[j][a] && in_s[j][b])
            raw[j][a * kS + b] =
                VT::load(src + base[j] + (static_cast<i64>(a) * g.in[2] + b) * g.C);
    } else {
      raw[j][0] = VT::load(src + static_cast<i64>(t) * V);
    }
  }
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const I t = t0 + static_cast<I>(j) * kBlock;
    if (t >= items) continue;
    A acc[V];
    if (kFwd) {
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = A(0);
#pragma unroll
      for (int a = 0; a < kR; ++a)
#pragma unroll
        for (int b = 0; b < kS; ++b)
          if (in_r[j][a] && in_s[j][b]) {
            A v[V];
            VT::unpack(raw[j][a * kS + b], v);
#pragma unroll
            for (int e = 0; e < V; ++e) acc[e] += v[e];
          }
      // An empty counting region gives 0/0 = NaN, as lax's sum / count does.
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = acc[e] / static_cast<A>(div[j]);
      VT::store(dst + static_cast<i64>(t) * V, acc);
    } else {
      const A inv = A(1) / static_cast<A>(div[j]);
      VT::unpack(raw[j][0], acc);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = acc[e] * inv;
#pragma unroll
      for (int a = 0; a < kR; ++a)
#pragma unroll
        for (int b = 0; b < kS; ++b)
          if (in_r[j][a] && in_s[j][b])
            VT::store(dst + base[j] + (static_cast<i64>(a) * g.in[2] + b) * g.C, acc);
    }
  }
}

// Avg backward of a single window that covers the whole input (global pooling): every input of
// image n, channel c gets dy[n, c] * (1 / divisor) (one window: a single product). Thread = W
// consecutive elements of dx (W = 16 bytes when the element count allows, else 1), so the
// stores are 16-byte whatever the layout; dy is read per element (cached: consecutive elements
// share it, or are consecutive channels). fc: C; fimg: the elements of one image, P * C.
template <typename T, int W, typename I>
__global__ void __launch_bounds__(kBlock)
    global_avg_bwd_kernel(const T* __restrict__ dy, T* __restrict__ dx, I vectors, FastDiv fc,
                          FastDiv fimg, typename AccOf<T>::type inv) {
  using A = typename AccOf<T>::type;
  const I t = static_cast<I>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= vectors) return;
  A v[W];
#pragma unroll
  for (int e = 0; e < W; ++e) {
    const I i = t * W + e;
    const I n = divq(i, fimg);
    const I c = i - divq(i, fc) * fc.d;
    v[e] = to_acc(dy[n * fc.d + c]) * inv;
  }
  Vec<T, W>::store(dx + static_cast<i64>(t) * W, v);
}

// ---------------------------------------------------------------------------------------------
// 3 x 3 windows at stride 2 (dilation 1, over the two inner dimensions; depth folds into the
// images), channel vectors of V elements (V = 1: lanes run along channels, or along the width
// of one-channel images): thread = (window quad, channel vector). Quad (c, c') is the
// windows {c, c+1} x {c', c'+1}; their taps are the 5 x 5 inputs from (2c - pad, 2c' - pad),
// which the thread streams row by row with the four windows' running states in registers:
//   max / avg forward  quads at even (c, c'), so each window once: 25 loads for 4 outputs
//                      (window_fwd: 36), each window's taps in window order; the max gather
//                      (JVP) selects the same way and carries the tangent of the selection;
//   max backward       two passes. The arg-max taps of every window (select_kernel's rule,
//                      quads as in the forward) go to the workspace, one byte per element.
//                      Then every quad's cell of 2 x 2 inputs (2c+1-pad+j, 2c'+1-pad+j'),
//                      j, j' in {0, 1}, whose covering windows are exactly the quad's (input
//                      row 2c+1-pad+j is tap 1+j of window c and, for j = 1, tap 0 of window
//                      c+1), adds dy of the windows that selected it in increasing tap order
//                      (the CPU's). No atomics. (A one-pass variant that recomputed each
//                      window's arg-max in the 4 cells that need it was issue-bound: 83 us on
//                      the bf16 ResNet-50 stem, 1.39 TB/s.)
//   avg backward       every quad: the cell adds dy * (1 / divisor) of its covering windows in
//                      the same order (no input loads).
// Windows outside the output (quads at the edges) take no part.
struct Quads {
  FastDiv fqh, fqw;  // quads down and across
  int qh0, qw0;      // the first quad's first window (c, c')
  int step;          // between quads: 2 forward, 1 backward
};

enum class QuadOp { kMaxFwd, kAvgFwd, kMaxSelect, kMaxGather, kMaxScatter, kAvgBwd };

// Quiet NaN in both halves of a word.
template <typename T> constexpr uint32_t nan2() {
  return std::is_same_v<T, __half> ? 0x7e007e00u : 0x7fc07fc0u;
}

// 0xffff in the halves of a word where a >= b (16-bit pairs; false when either is NaN).
template <typename T>
__device__ __forceinline__ uint32_t ge_mask(uint32_t a, uint32_t b) {
#ifdef JAXDNN_POOL_EMULATION
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const unsigned short ha = static_cast<unsigned short>(a >> (16 * h));
    const unsigned short hb = static_cast<unsigned short>(b >> (16 * h));
    T ea, eb;
    memcpy(&ea, &ha, 2);
    memcpy(&eb, &hb, 2);
    if (to_acc(ea) >= to_acc(eb)) r |= 0xffffu << (16 * h);
  }
  return r;
#else
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  T2 x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  return __hge2_mask(x, y);
#endif
}

// The running state of one window: the max or sum of its in-bounds taps (forward), or the
// selection (kSelect: a later tap v replaces the selection s unless s >= v, a padding tap
// replaces only a NaN selection, with -inf) and what it carries: the selected tap (none for
// padding) or, kPick, the tangent at the selected tap (0 for padding). 16-bit max works on
// pairs in 32-bit words, the taps or tangents in the matching halves.
template <typename T, int V, bool kMax, bool kSelect, bool kPick = false,
          bool kPacked = kMax && kPackedMax<T, V>>
struct WindowState;

template <typename T, int V, bool kSelect, bool kPick>
struct WindowState<T, V, true, kSelect, kPick, true> {
  using R = typename Vec<T, V>::R;
  static constexpr int kW = sizeof(T) * V / 4;
  uint32_t m[kW], k[kSelect ? kW : 1];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      m[i] = kSelect ? nan2<T>() : neg_inf2<T>();
      if (kSelect) k[i] = kPick ? 0u : 0xffffffffu;
    }
  }
  // Tap v (its tap index, or the tangent words `picked`).
  __device__ __forceinline__ void add(const R& r, int tap, const R* picked = nullptr) {
    uint32_t v[kW], pw[kW];
    memcpy(v, &r, sizeof(v));
    if constexpr (kPick) memcpy(pw, picked, sizeof(pw));
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      if constexpr (kSelect) {
        const uint32_t keep = ge_mask<T>(m[i], v[i]);
        const uint32_t payload = kPick ? pw[i] : static_cast<uint32_t>(tap) * 0x10001u;
        m[i] = (m[i] & keep) | (v[i] & ~keep);
        k[i] = (k[i] & keep) | (payload & ~keep);
      } else {
        m[i] = max2<T>(m[i], v[i]);
      }
    }
  }
  __device__ __forceinline__ void padding() {
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const uint32_t keep = ge_mask<T>(m[i], neg_inf2<T>());  // not NaN
      m[i] = (m[i] & keep) | (neg_inf2<T>() & ~keep);
      k[i] = kPick ? k[i] & keep : k[i] | ~keep;  // tangent +0 / no tap (0xffff)
    }
  }
  __device__ __forceinline__ int tap(int e) const { return (k[e / 2] >> (16 * (e % 2))) & 0xffff; }
  __device__ __forceinline__ R carried() const {
    R r;
    memcpy(&r, kSelect ? k : m, sizeof(R));
    return r;
  }
};

template <typename T, int V, bool kMax, bool kSelect, bool kPick>
struct WindowState<T, V, kMax, kSelect, kPick, false> {
  using A = typename AccOf<T>::type;
  using R = typename Vec<T, V>::R;
  using K = std::conditional_t<kPick, A, int>;
  A m[V];
  K k[kSelect ? V : 1];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      m[e] = kSelect ? quiet_nan<A>() : (kMax ? neg_inf<A>() : A(0));
      if (kSelect) k[e] = K(kPick ? 0 : -1);
    }
  }
  __device__ __forceinline__ void add(const R& r, int tap, const R* picked = nullptr) {
    A v[V], pv[V];
    Vec<T, V>::unpack(r, v);
    if constexpr (kPick) Vec<T, V>::unpack(*picked, pv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      if constexpr (kSelect) {
        const bool take = !(m[e] >= v[e]);
        m[e] = take ? v[e] : m[e];
        if constexpr (kPick) k[e] = take ? pv[e] : k[e];
        else k[e] = take ? tap : k[e];
      } else {
        m[e] = kMax ? max_step(m[e], v[e]) : m[e] + v[e];
      }
    }
  }
  __device__ __forceinline__ void padding() {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const bool take = m[e] != m[e];
      m[e] = take ? neg_inf<A>() : m[e];
      k[e] = take ? K(kPick ? 0 : -1) : k[e];
    }
  }
  __device__ __forceinline__ int tap(int e) const { return static_cast<int>(k[e]); }
};

// avg_divisor of output (d, h, w).
__device__ __forceinline__ int quad_divisor(const Geo& g, int d, int h, int w) {
  if (g.uniform_div) return g.uniform_div;
  return divisor_factor(g, 0, d) * divisor_factor(g, 1, h) * divisor_factor(g, 2, w);
}

// Blocks per SM that quad_kernel's register budget aims at (sweeps: -DJAXDNN_QUAD_MINB=N; the
// arg-max gather's: -DJAXDNN_QUAD_GATHER_MINB=N). H200, bf16 ResNet-50 stem, kernel-only (s13):
// 3 blocks (80 registers) took the avg forward from 87 registers and 26.0 us to 22.6 us and
// the max backward from 51.7 to 49.3 us; the gather (max JVP, twice the registers per row) went
// from 34.3 to 41.7 us at 3, so it keeps 1; max forward and avg backward did not move.
#ifndef JAXDNN_QUAD_MINB
#define JAXDNN_QUAD_MINB 3
#endif
#ifndef JAXDNN_QUAD_GATHER_MINB
#define JAXDNN_QUAD_GATHER_MINB 1
#endif

template <typename T, int V, QuadOp kOp, typename I>
__global__ void __launch_bounds__(kBlock, kOp == QuadOp::kMaxGather ? JAXDNN_QUAD_GATHER_MINB
                                                                     : JAXDNN_QUAD_MINB)
    quad_kernel(Geo g, Quads qd, const T* __restrict__ x, const T* __restrict__ dy,
                T* __restrict__ out, uint8_t* __restrict__ arg, I items) {
  using A = typename AccOf<T>::type;
  using VT = Vec<T, V>;
  using R = typename VT::R;
  using AV = ArgVec<uint8_t, V>;
  constexpr bool kMax = kOp != QuadOp::kAvgFwd && kOp != QuadOp::kAvgBwd;
  constexpr bool kPick = kOp == QuadOp::kMaxGather;  // dy: the tangent
  constexpr bool kSelect = kOp == QuadOp::kMaxSelect || kPick;
  constexpr bool kCells = kOp == QuadOp::kMaxScatter || kOp == QuadOp::kAvgBwd;
  const I t = static_cast<I>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= items) return;
  int cv, q[3];
  i64 n;
  split_item(t, g.fcv, qd.fqw, qd.fqh, g.fin[0], &cv, q, &n);
  const int c0 = qd.qh0 + q[1] * qd.step, c1 = qd.qw0 + q[2] * qd.step;
  const i64 img = n * g.in[0] + q[0], C = g.C;
  bool vh[2], vw[2];  // windows (c0 + a, c1 + b) inside the output
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    vh[a] = c0 + a >= 0 && c0 + a < g.out[1];
    vw[a] = c1 + a >= 0 && c1 + a < g.out[2];
  }
  const int r0 = 2 * c0 - g.pad[1], s0 = 2 * c1 - g.pad[2];  // tap (0, 0) of window (c0, c1)
  auto y_off = [&](int a, int b) {
    return ((img * g.out[1] + c0 + a) * g.out[2] + c1 + b) * C + static_cast<i64>(cv) * V;
  };
  if constexpr (!kCells) {
    // The windows: their taps row by row, in window order.
    WindowState<T, V, kMax, kSelect, kPick> st[2][2];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int b = 0; b < 2; ++b) st[a][b].init();
    bool scol[5];  // columns some window reads
#pragma unroll
    for (int s = 0; s < 5; ++s) scol[s] = (s <= 2 && vw[0]) || (s >= 2 && vw[1]);
#pragma unroll
    for (int r = 0; r < 5; ++r) {
      if (!((r <= 2 && vh[0]) || (r >= 2 && vh[1]))) continue;
      const int ir = r0 + r;
      const bool rin = ir >= 0 && ir < g.in[1];
      if (!kSelect && !rin) continue;  // the forward skips out-of-bounds taps
      const i64 row = (img * g.in[1] + ir) * g.in[2] * C + static_cast<i64>(cv) * V;
      R v[5], tv[kPick ? 5 : 1];
      bool in[5];
#pragma unroll
      for (int s = 0; s < 5; ++s) {
        in[s] = rin && s0 + s >= 0 && s0 + s < g.in[2];
        if (in[s] && scol[s]) {
          v[s] = VT::load(x + row + static_cast<i64>(s0 + s) * C);
          if constexpr (kPick) tv[s] = VT::load(dy + row + static_cast<i64>(s0 + s) * C);
        }
      }
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        const int kb = r - 2 * a;
        if (kb < 0 || kb > 2 || !vh[a]) continue;
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          if (!vw[b]) continue;
#pragma unroll
          for (int kc = 0; kc < 3; ++kc) {
            const int s = 2 * b + kc;
            if (in[s]) st[a][b].add(v[s], kb * 3 + kc, kPick ? &tv[kPick ? s : 0] : nullptr);
            else if constexpr (kSelect) st[a][b].padding();
          }
        }
      }
    }
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        if (!vh[a] || !vw[b]) continue;
        if constexpr (kPick && kPackedMax<T, V>) {
          *reinterpret_cast<R*>(out + y_off(a, b)) = st[a][b].carried();
        } else if constexpr (kPick) {
          VT::store(out + y_off(a, b), st[a][b].k);
        } else if constexpr (kSelect) {
          int taps[V];
#pragma unroll
          for (int e = 0; e < V; ++e) taps[e] = st[a][b].tap(e);
          AV::store(arg + y_off(a, b), taps);
        } else if constexpr (kMax && kPackedMax<T, V>) {
          *reinterpret_cast<R*>(out + y_off(a, b)) = st[a][b].carried();
        } else {
          A acc[V];
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] = st[a][b].m[e];
          if (!kMax) {
            // An empty counting region gives 0/0 = NaN, as lax's sum / count does.
            const A divisor = static_cast<A>(quad_divisor(g, q[0], c0 + a, c1 + b));
            const A inv = A(1) / divisor;
#pragma unroll
            for (int e = 0; e < V; ++e) acc[e] = div_by_count(acc[e], inv, divisor);
          }
          VT::store(out + y_off(a, b), acc);
        }
      }
  } else {
    // The cell: dy (and arg-max taps, or 1 / divisor) of the quad's windows, then input
    // (r0 + 1 + j, s0 + 1 + j'), tap (1 + j - 2a, 1 + j' - 2b) of window (c0 + a, c1 + b),
    // adds their terms in increasing tap order: a, then b, descending.
    R d[2][2];
    uint32_t taps[2][2][kMax ? AV::kAllWords : 1];
    A inv[2][2];
    const A uniform_inv = kMax || !g.uniform_div ? A(0) : A(1) / static_cast<A>(g.uniform_div);
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        if (!vh[a] || !vw[b]) continue;
        d[a][b] = VT::load(dy + y_off(a, b));
        if constexpr (kMax) AV::load_words(arg + y_off(a, b), taps[a][b]);
        else inv[a][b] = g.uniform_div ? uniform_inv
                                       : A(1) / static_cast<A>(quad_divisor(g, q[0], c0 + a, c1 + b));
      }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int ih = r0 + 1 + j;
      if (ih < 0 || ih >= g.in[1]) continue;
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int iw = s0 + 1 + jj;
        if (iw < 0 || iw >= g.in[2]) continue;
        const int count = ((j == 1 && vh[1]) + vh[0]) * ((jj == 1 && vw[1]) + vw[0]);
        A acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = A(0);
#pragma unroll
        for (int a = 1; a >= 0; --a) {
          if ((a == 1 && j == 0) || !vh[a]) continue;
#pragma unroll
          for (int b = 1; b >= 0; --b) {
            if ((b == 1 && jj == 0) || !vw[b]) continue;
            A dv[V];
            VT::unpack(d[a][b], dv);
            if constexpr (kMax) {
              const int k = (1 + j - 2 * a) * 3 + 1 + jj - 2 * b;
#pragma unroll
              for (int e = 0; e < V; ++e)
                acc[e] = AV::tap(taps[a][b], e) == k ? acc[e] + dv[e] : acc[e];
            } else {
#pragma unroll
              for (int e = 0; e < V; ++e)
                acc[e] = count == 1 ? dv[e] * inv[a][b] : fma_acc(dv[e], inv[a][b], acc[e]);
            }
          }
        }
        VT::store(out + ((img * g.in[1] + ih) * g.in[2] + iw) * C + static_cast<i64>(cv) * V,
                  acc);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 3 x 3 windows at stride 2 (dilation 1, low padding 1 along the width) over one-channel images
// (channels-first layouts) whose rows are whole 16-byte vectors of E = 16 / sizeof(T) elements,
// forward: thread = 2 output rows x E / 2 output columns. Output column (E / 2) j + q reads input
// columns E j + 2q - 1 .. E j + 2q + 1: the row's vector j and the column to its left, so a
// warp's loads of an input row are 512 contiguous bytes (the quads' one-channel form reads 2-byte
// values 4 columns apart per lane: 8 sectors per warp load, each a quarter used). The 2 output
// rows read 5 input rows. Same arithmetic and window order as the quads (max: max_step from
// -inf over the in-bounds taps; avg: window-order sum / divisor).
struct RowVec {
  FastDiv fj, frp;  // column groups per output row, output row pairs per plane
};

template <typename T, bool kMax>
__global__ void __launch_bounds__(kBlock) rowvec_fwd_kernel(Geo g, RowVec rv,
                                                            const T* __restrict__ x,
                                                            T* __restrict__ y, uint32_t items) {
  using A = typename AccOf<T>::type;
  constexpr int E = 16 / sizeof(T), Q = E / 2;
  const uint32_t t = blockIdx.x * kBlock + threadIdx.x;
  if (t >= items) return;
  const uint32_t row_pair = rv.fj.div(t), plane = rv.frp.div(row_pair);
  const int j = static_cast<int>(t - row_pair * rv.fj.d);
  const int oh0 = 2 * static_cast<int>(row_pair - plane * rv.frp.d), ow0 = Q * j, c0 = E * j;
  const T* xp = x + static_cast<i64>(plane) * g.in[1] * g.in[2];
  T* yp = y + static_cast<i64>(plane) * g.out[1] * g.out[2];
  const bool vh[2] = {oh0 < g.out[1], oh0 + 1 < g.out[1]};
  A acc[2][Q];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int q = 0; q < Q; ++q) acc[a][q] = kMax ? neg_inf<A>() : A(0);
  const int r0 = 2 * oh0 - g.pad[1];  // input row of tap row 0 of output row oh0
  // Every row's loads before the first sum (5 x 16 bytes + 5 single elements in flight).
  Raw<16>::type raw[5];
  T left[5];
  bool rok[5];
#pragma unroll
  for (int r = 0; r < 5; ++r) {
    const int ir = r0 + r;
    rok[r] = ((r <= 2 && vh[0]) || (r >= 2 && vh[1])) && ir >= 0 && ir < g.in[1];
    if (rok[r]) {
      const T* row = xp + static_cast<i64>(ir) * g.in[2] + c0;
      raw[r] = ldg_raw(reinterpret_cast<const Raw<16>::type*>(row));
      if (c0 > 0) left[r] = row[-1];
    }
  }
#pragma unroll
  for (int r = 0; r < 5; ++r) {
    if (!rok[r]) continue;
    A v[E + 1];  // input columns c0 - 1 .. c0 + E - 1
    T e[E];
    memcpy(e, &raw[r], sizeof(e));
    v[0] = c0 > 0 ? to_acc(left[r]) : A(0);
#pragma unroll
    for (int i = 0; i < E; ++i) v[i + 1] = to_acc(e[i]);
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const int kr = r - 2 * a;
      if (kr < 0 || kr > 2 || !vh[a]) continue;
#pragma unroll
      for (int q = 0; q < Q; ++q)
#pragma unroll
        for (int kc = 0; kc < 3; ++kc) {
          if (kc == 0 && q == 0 && c0 == 0) continue;  // column -1: padding, skipped
          const A tap = v[2 * q + kc];
          acc[a][q] = kMax ? max_step(acc[a][q], tap) : acc[a][q] + tap;
        }
    }
  }
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    if (!vh[a]) continue;
    const int oh = oh0 + a;
    T out[Q];
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      A r = acc[a][q];
      // An empty counting region gives 0/0 = NaN, as lax's sum / count does.
      if (!kMax) r = r / static_cast<A>(quad_divisor(g, 0, oh, ow0 + q));
      out[q] = from_acc<T>(r);
    }
    T* dst = yp + static_cast<i64>(oh) * g.out[2] + ow0;
    if (ow0 + Q <= g.out[2] && reinterpret_cast<uintptr_t>(dst) % (Q * sizeof(T)) == 0) {
      using W = typename Raw<Q * sizeof(T)>::type;
      W w;
      memcpy(&w, out, sizeof(w));
      *reinterpret_cast<W*>(dst) = w;
    } else {
#pragma unroll
      for (int q = 0; q < Q; ++q)
        if (ow0 + q < g.out[2]) dst[q] = out[q];
    }
  }
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
    g.fin[d] = FastDiv(p.in[d]);
    g.fout[d] = FastDiv(p.out[d]);
    g.fst[d] = FastDiv(p.stride[d]);
  }
  g.fcv = FastDiv(g.CV);
  // Every window counts all its taps when the first and last windows of each dimension lie in
  // the counting region.
  bool uniform = true;
  for (int d = 0; d < 3; ++d) {
    const i64 first = -p.pad_lo[d];
    const i64 last = (p.out[d] - 1) * p.stride[d] - p.pad_lo[d] + (p.window[d] - 1) * p.dilation[d];
    uniform = uniform && first >= -p.count_lo[d] && last < p.in[d] + p.count_hi[d];
  }
  g.uniform_div = uniform ? static_cast<int>(p.window_elems()) : 0;
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

// JAXDNN_POOL_CELL_ITEMS=1|2|4 (read once): outputs per thread of the 2x2-cell avg forward
// (default 1: bf16 32x112x112x64 on the H200, 18.3 / 20.4 / 25.4 us for 1 / 2 / 4).
int cell_items() {
  static const int value = [] {
    const char* v = std::getenv("JAXDNN_POOL_CELL_ITEMS");
    const int n = v == nullptr ? 0 : std::atoi(v);
    return n == 1 || n == 2 || n == 4 ? n : 1;
  }();
  return value;
}

// JAXDNN_POOL_QUAD=0 (read once) turns quad_kernel off (checks of the general kernels).
bool quads_off() {
  static const bool value = [] {
    const char* v = std::getenv("JAXDNN_POOL_QUAD");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  return value;
}

// JAXDNN_POOL_ROWVEC=0 (read once) turns rowvec_fwd_kernel off (the one-channel quads run).
bool rowvec_off() {
  static const bool value = [] {
    const char* v = std::getenv("JAXDNN_POOL_ROWVEC");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  return value;
}

// JAXDNN_POOL_CHAN: unset: the channel tiles where they apply; "0": never (the older kernels);
// "TH,TW,CB": those tile sizes (outputs down, across, channel vectors; for sweeps).
struct ChanOverride {
  bool off = false;
  int th = 0, tw = 0, cb = 0;
};
const ChanOverride& chan_override() {
  static const ChanOverride value = [] {
    ChanOverride o;
    const char* v = std::getenv("JAXDNN_POOL_CHAN");
    if (v == nullptr || *v == 0) return o;
    if (std::strcmp(v, "0") == 0) o.off = true;
    else if (std::sscanf(v, "%d,%d,%d", &o.th, &o.tw, &o.cb) != 3) o = ChanOverride{};
    return o;
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
    // Large windows with few outputs: share each item among S threads, enough of them that
    // each takes about one batch of loads (while the threads stay within a few waves).
    const i64 taps = p.window_elems();
    const bool one_channel = V == 1 && p.C == 1;
    int S = 1;
    if (split_override() == 1) {
      while (S < 32 && 2 * S <= taps) S *= 2;
    } else if (split_override() == -1 && taps >= 16 && items < kFillThreads) {
      while (S < 32 && (taps + S - 1) / S > kBatch && items * S < 2 * kFillThreads) S *= 2;
    }
    const bool lanes = one_channel && S > 1;
    if constexpr (V == 1 && sizeof(T) <= 4) {
      RowVec rv;
      i64 n;
      if (S == 1 && rowvec(x, &rv, &n)) {
        const uint32_t items32 = static_cast<uint32_t>(n);
        if (is_max) rowvec_fwd_kernel<T, true><<<blocks_for(n, kBlock), kBlock, 0, stream>>>(
            g, rv, x, y, items32);
        else rowvec_fwd_kernel<T, false><<<blocks_for(n, kBlock), kBlock, 0, stream>>>(
            g, rv, x, y, items32);
        return launched(is_max ? "max pool forward (row vectors)" : "avg pool forward (row vectors)");
      }
    }
    Quads qd;
    if (S == 1 && quads(false, &qd)) {
      const i64 n = quad_items(qd);
      if (is_max) quad_kernel<T, V, QuadOp::kMaxFwd, I><<<blocks_for(n, kBlock), kBlock, 0,
                                                          stream>>>(g, qd, x, nullptr, y, nullptr,
                                                                    static_cast<I>(n));
      else quad_kernel<T, V, QuadOp::kAvgFwd, I><<<blocks_for(n, kBlock), kBlock, 0, stream>>>(
          g, qd, x, nullptr, y, nullptr, static_cast<I>(n));
      return launched(is_max ? "max pool forward (quads)" : "avg pool forward (quads)");
    }
    if constexpr (sizeof(T) * V == 16) {
      ChanTile ct;
      if (S == 1 && !is_max && cells_2x2()) {
        const I n = static_cast<I>(items);
        switch (cell_items()) {  // outputs per thread
          case 1: cell_avg_kernel<T, V, true, 2, 2, I, 1><<<blocks_for(items, kBlock), kBlock, 0,
                                                          stream>>>(g, x, y, n); break;
          case 2: cell_avg_kernel<T, V, true, 2, 2, I, 2><<<blocks_for(items, kBlock * 2), kBlock,
                                                          0, stream>>>(g, x, y, n); break;
          default: cell_avg_kernel<T, V, true, 2, 2, I, 4><<<blocks_for(items, kBlock * 4), kBlock,
                                                           0, stream>>>(g, x, y, n);
        }
        return launched("avg pool forward (2x2 cells)");
      }
      // Forward channel tiles only when forced (JAXDNN_POOL_CHAN=TH,TW,CB): on the H200 they ran
      // slower than window_fwd (max 3x3/2 bf16 32x112x112x64: 1894 against 2971 GB/s).
      if (S == 1 && chan_override().th > 0 && chan_tile(false, &ct)) {
        if (is_max) chan_tile_kernel<T, V, false, true><<<chan_blocks(ct), kBlock,
                                                          chan_smem(ct, false), stream>>>(
            g, ct, x, nullptr, y);
        else chan_tile_kernel<T, V, false, false><<<chan_blocks(ct), kBlock, chan_smem(ct, false),
                                                    stream>>>(g, ct, x, nullptr, y);
        return launched(is_max ? "max pool forward (channel tiles)"
                               : "avg pool forward (channel tiles)");
      }
    }
    PlaneTile pt;
    if (S == 1 && plane_tile(false, 0, &pt)) {
      using A = typename AccOf<T>::type;
      const size_t smem = sizeof(A) * pt.ih * pt.iw;
      const dim3 block(kTileW, 8);
      if (is_max) plane_fwd_kernel<T, true><<<plane_blocks(pt), block, smem, stream>>>(g, pt, x,
                                                                                       y);
      else plane_fwd_kernel<T, false><<<plane_blocks(pt), block, smem, stream>>>(g, pt, x, y);
      return launched(is_max ? "max pool forward (tiles)" : "avg pool forward (tiles)");
    }
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

  // The tiles of chan_tile_kernel: 16-byte channel vectors, 2-D windows (depth folds into the
  // images), at most 255 taps backward (one-byte arg-max), the staged data within 48 KB.
  // Default: 8 outputs down, at most 32 across (balanced), 2 channel vectors (32 bytes, a DRAM
  // sector) per pixel; more channel vectors while a tile has under 64 (output, vector) items.
  bool chan_tile(bool backward, ChanTile* ct) const {
    if (sizeof(T) * V != 16 || chan_override().off) return false;
    if (p.window[0] != 1 || p.stride[0] != 1 || p.pad_lo[0] != 0) return false;
    if (p.out[1] < 1 || p.out[2] < 1 || p.N * p.in[0] < 1) return false;
    if (backward ? p.window_elems() > 255 : p.window_elems() > 64) return false;
    const i64 CV = p.C / V;
    const i64 hlo_h = backward ? (p.window[1] - 1) * p.dilation[1] / p.stride[1] : 0;
    const i64 hlo_w = backward ? (p.window[2] - 1) * p.dilation[2] / p.stride[2] : 0;
    auto region = [&](int d, i64 t, i64 hlo) {
      return (t + hlo - 1) * p.stride[d] + (p.window[d] - 1) * p.dilation[d] + 1;
    };
    auto bytes = [&](i64 th, i64 tw, i64 cb) {
      i64 b = region(1, th, hlo_h) * region(2, tw, hlo_w) * cb * 16;
      if (backward) b += (th + hlo_h) * (tw + hlo_w) * cb * (16 + V);
      return b;
    };
    constexpr i64 kSmem = 48 << 10;
    const i64 nw0 = (p.out[2] + 31) / 32;
    i64 th = std::min<i64>(8, p.out[1]), tw = (p.out[2] + nw0 - 1) / nw0;
    i64 cb = CV % 2 == 0 ? 2 : 1;
    const ChanOverride& o = chan_override();
    if (o.th > 0 && o.tw > 0 && o.cb > 0 && CV % o.cb == 0) {
      th = std::min<i64>(o.th, p.out[1]);
      tw = std::min<i64>(o.tw, p.out[2]);
      cb = o.cb;
    }
    while (bytes(th, tw, cb) > kSmem && th > 1) th = (th + 1) / 2;
    while (bytes(th, tw, cb) > kSmem && tw > 1) tw = (tw + 1) / 2;
    if (bytes(th, tw, cb) > kSmem) return false;
    while (th * tw * cb < 64 && CV % (2 * cb) == 0 && bytes(th, tw, 2 * cb) <= kSmem) cb *= 2;
    const i64 nh = (p.out[1] + th - 1) / th, nw = (p.out[2] + tw - 1) / tw, nc = CV / cb;
    if (p.N * p.in[0] * nh * nw * nc > std::numeric_limits<int32_t>::max()) return false;
    ct->th = static_cast<int>(th);
    ct->tw = static_cast<int>(tw);
    ct->cb = static_cast<int>(cb);
    ct->hlo_h = static_cast<int>(hlo_h);
    ct->hlo_w = static_cast<int>(hlo_w);
    ct->oh = static_cast<int>(th + hlo_h);
    ct->ow = static_cast<int>(tw + hlo_w);
    ct->rh = static_cast<int>(region(1, th, hlo_h));
    ct->rw = static_cast<int>(region(2, tw, hlo_w));
    ct->fcb = FastDiv(cb);
    ct->frw = FastDiv(ct->rw);
    ct->fow = FastDiv(ct->ow);
    ct->fnc = FastDiv(nc);
    ct->fnw = FastDiv(nw);
    ct->fnh = FastDiv(nh);
    return true;
  }

  // Shared bytes and blocks of a channel-tile launch.
  size_t chan_smem(const ChanTile& ct, bool backward) const {
    size_t b = size_t(16) * ct.rh * ct.rw * ct.cb;
    if (backward) b += size_t(16 + V) * ct.oh * ct.ow * ct.cb;
    return b;
  }
  unsigned chan_blocks(const ChanTile& ct) const {
    return static_cast<unsigned>(p.N * p.in[0] * ct.fnh.d * ct.fnw.d * ct.fnc.d);
  }

  // The windows partition the input along the two inner dimensions (stride = window, dilation
  // 1, padding only inside the first and last windows) and are 2 x 2; depth folds.
  bool cells_2x2() const {
    if (p.window[0] != 1 || p.stride[0] != 1 || p.pad_lo[0] != 0) return false;
    for (int d = 1; d < 3; ++d) {
      if (p.window[d] != 2 || p.dilation[d] != 1 || p.stride[d] != 2 || p.pad_lo[d] < 0)
        return false;
      if (p.out[d] < 1 || (p.out[d] - 1) * 2 - p.pad_lo[d] + 2 < p.in[d]) return false;
    }
    return true;
  }

  // 3 x 3 windows at stride 2, dilation 1, over the two inner dimensions (depth folds): the
  // quads of quad_kernel. Forward: quads at even windows; backward: the quads
  // whose cells (input rows 2c + 1 - pad + {0, 1}) cover the input, c from
  // floor((pad - 1) / 2) to floor((in - 2 + pad) / 2).
  bool quads(bool backward, Quads* qd) const {
    if (quads_off()) return false;
    if (p.window[0] != 1 || p.stride[0] != 1 || p.dilation[0] != 1 || p.pad_lo[0] != 0 ||
        p.out[0] != p.in[0])
      return false;
    i64 first[2], count[2];
    for (int d = 1; d < 3; ++d) {
      if (p.window[d] != 3 || p.stride[d] != 2 || p.dilation[d] != 1) return false;
      if (p.pad_lo[d] < -2 || p.pad_lo[d] > 2 || p.in[d] < 1) return false;
      const auto floor2 = [](i64 v) { return v >= 0 ? v / 2 : -((1 - v) / 2); };
      first[d - 1] = backward ? floor2(p.pad_lo[d] - 1) : 0;
      count[d - 1] = backward ? floor2(p.in[d] - 2 + p.pad_lo[d]) - first[d - 1] + 1
                              : (p.out[d] + 1) / 2;
      if (count[d - 1] < 1) return false;
    }
    qd->fqh = FastDiv(count[0]);
    qd->fqw = FastDiv(count[1]);
    qd->qh0 = static_cast<int>(first[0]);
    qd->qw0 = static_cast<int>(first[1]);
    qd->step = backward ? 1 : 2;
    return true;
  }
  i64 quad_items(const Quads& qd) const {
    return p.N * p.in[0] * static_cast<i64>(qd.fqh.d) * qd.fqw.d * (p.C / V);
  }

  // rowvec_fwd_kernel: one-channel images (depth folds into them), 3 x 3 windows at stride 2,
  // dilation 1, low padding 1 along the width, rows of whole 16-byte vectors (a 16-byte aligned
  // input), every output's columns inside the row (out width <= in width / 2), 32-bit items.
  bool rowvec(const T* x, RowVec* rv, i64* items) const {
    constexpr int E = 16 / sizeof(T);
    if (rowvec_off() || V != 1 || p.C != 1 || !aligned16(x)) return false;
    if (p.window[0] != 1 || p.stride[0] != 1 || p.dilation[0] != 1 || p.pad_lo[0] != 0 ||
        p.out[0] != p.in[0])
      return false;
    for (int d = 1; d < 3; ++d)
      if (p.window[d] != 3 || p.stride[d] != 2 || p.dilation[d] != 1) return false;
    if (p.pad_lo[2] != 1 || p.in[2] % E != 0 || 2 * p.out[2] > p.in[2] || p.out[1] < 1) return false;
    const i64 groups = (p.out[2] + E / 2 - 1) / (E / 2), pairs = (p.out[1] + 1) / 2;
    *items = p.N * p.in[0] * pairs * groups;
    if (*items >= (i64(1) << 31)) return false;
    rv->fj = FastDiv(groups);
    rv->frp = FastDiv(pairs);
    return true;
  }

  // One window (dilation 1) that covers every input: global pooling. *div: its divisor, the
  // taps inside the counting region.
  bool global_window(int* div) const {
    i64 d_all = 1;
    for (int d = 0; d < 3; ++d) {
      if (p.out[d] != 1 || p.dilation[d] != 1 || p.pad_lo[d] > 0 ||
          p.window[d] - p.pad_lo[d] < p.in[d])
        return false;
      // Taps k in [0, window) with k - pad in the counting region [-count_lo, in + count_hi).
      const i64 k0 = std::max<i64>(0, p.pad_lo[d] - p.count_lo[d]);
      const i64 k1 = std::min<i64>(p.window[d], p.in[d] + p.count_hi[d] + p.pad_lo[d]);
      d_all *= std::max<i64>(0, k1 - k0);
    }
    *div = static_cast<int>(d_all);
    // 32-bit indices divide by multiply-shift below 2^31.
    return p.N > 0 && (sizeof(I) == 8 || p.x_elems() < (i64(1) << 31) - 64 * kBlock);
  }

  // The tiles of the plane kernels: one-channel images, a window over the two innermost
  // dimensions only, at least 8 x 16 pixels on the tiled side (outputs, or inputs when
  // `backward`) and the staged region within 32 KB (arg-max entries of `arg_bytes` each too).
  bool plane_tile(bool backward, size_t arg_bytes, PlaneTile* pt) const {
    if (V != 1 || p.C != 1) return false;
    if (p.in[0] != 1 || p.out[0] != 1 || p.window[0] != 1 || p.pad_lo[0] != 0) return false;
    const i64 h = backward ? p.in[1] : p.out[1], w = backward ? p.in[2] : p.out[2];
    if (h < 8 || w < 16) return false;
    using A = typename AccOf<T>::type;
    for (int rows = 4; rows >= 1; rows /= 2) {
      const i64 th = 8 * rows;
      const i64 down = (h + th - 1) / th, across = (w + kTileW - 1) / kTileW;
      if (rows > 1 && 4 * down * th > 5 * h) continue;  // over a fifth of the rows idle
      const i64 span1 = (p.window[1] - 1) * p.dilation[1], span2 = (p.window[2] - 1) * p.dilation[2];
      // Forward: the input region of th x kTileW outputs. Backward: a bound on the outputs
      // covering th x kTileW inputs.
      const i64 ih = backward ? (th - 1 + span1) / p.stride[1] + 2 : (th - 1) * p.stride[1] + span1 + 1;
      const i64 iw = backward ? (kTileW - 1 + span2) / p.stride[2] + 2
                              : (kTileW - 1) * p.stride[2] + span2 + 1;
      if (ih * iw * static_cast<i64>(sizeof(A) + arg_bytes) > (32 << 10)) continue;
      if (p.N * across * down > std::numeric_limits<int32_t>::max()) return false;
      pt->rows = rows;
      pt->ih = static_cast<int>(ih);
      pt->iw = static_cast<int>(iw);
      pt->ftw = FastDiv(across);
      pt->fth = FastDiv(down);
      pt->fiw = FastDiv(iw);
      return true;
    }
    return false;
  }

  unsigned plane_blocks(const PlaneTile& pt) const {
    return static_cast<unsigned>(p.N * static_cast<i64>(pt.ftw.d) * pt.fth.d);
  }

  // Every input lies in at most one window.
  bool disjoint() const {
    for (int d = 0; d < 3; ++d)
      if ((p.window[d] - 1) * p.dilation[d] + 1 > p.stride[d] && p.out[d] > 1) return false;
    return true;
  }

  std::string gather(const T* x, const T* tangent, T* y) const {
    const i64 items = p.y_elems() / V;
    if (items == 0) return "";
    using A = typename AccOf<T>::type;
    Quads qd;
    if (quads(false, &qd)) {
      const i64 n = quad_items(qd);
      quad_kernel<T, V, QuadOp::kMaxGather, I><<<blocks_for(n, kBlock), kBlock, 0, stream>>>(
          g, qd, x, tangent, y, nullptr, static_cast<I>(n));
      return launched("max pool gather (quads)");
    }
    PlaneTile pt;
    if (plane_tile(false, 0, &pt)) {
      plane_select_kernel<T, true, uint8_t><<<plane_blocks(pt), dim3(kTileW, 8),
                                              sizeof(A) * pt.ih * pt.iw, stream>>>(
          g, pt, x, tangent, y, nullptr);
      return launched("max pool gather (tiles)");
    }
    select_kernel<T, V, true, uint8_t, I><<<blocks_for(items, kBlock), kBlock, 0, stream>>>(
        g, x, tangent, y, nullptr, static_cast<I>(items));
    return launched("max pool gather");
  }

  template <typename G>
  std::string scatter(const T* x, const T* dy, T* dx, G* arg) const {
    using A = typename AccOf<T>::type;
    // Quads: the arg-max taps of every window into the workspace, then the cells gather.
    Quads qs, qc;
    if constexpr (std::is_same_v<G, uint8_t>) {
      if (p.x_elems() > 0 && p.y_elems() > 0 && quads(false, &qs) && quads(true, &qc)) {
        const i64 ns = quad_items(qs), nc = quad_items(qc);
        quad_kernel<T, V, QuadOp::kMaxSelect, I><<<blocks_for(ns, kBlock), kBlock, 0, stream>>>(
            g, qs, x, nullptr, nullptr, arg, static_cast<I>(ns));
        if (std::string err = launched("max pool arg-max (quads)"); !err.empty()) return err;
        quad_kernel<T, V, QuadOp::kMaxScatter, I><<<blocks_for(nc, kBlock), kBlock, 0,
                                                    stream>>>(g, qc, nullptr, dy, dx, arg,
                                                              static_cast<I>(nc));
        return launched("max pool scatter (quads)");
      }
    }
    if constexpr (sizeof(T) * V == 16) {
      // Channel tiles: one pass, no workspace.
      ChanTile ct;
      if (p.x_elems() > 0 && chan_tile(true, &ct)) {
        chan_tile_kernel<T, V, true, true><<<chan_blocks(ct), kBlock, chan_smem(ct, true),
                                             stream>>>(g, ct, x, dy, dx);
        return launched("max pool backward (channel tiles)");
      }
    }
    const i64 out_items = p.y_elems() / V;
    PlaneTile pt;
    if (out_items > 0 && plane_tile(false, 0, &pt)) {
      plane_select_kernel<T, false, G><<<plane_blocks(pt), dim3(kTileW, 8),
                                         sizeof(A) * pt.ih * pt.iw, stream>>>(
          g, pt, x, nullptr, nullptr, arg);
      if (std::string err = launched("max pool arg-max (tiles)"); !err.empty()) return err;
    } else if (out_items > 0) {
      select_kernel<T, V, false, G, I><<<blocks_for(out_items, kBlock), kBlock, 0, stream>>>(
          g, x, nullptr, nullptr, arg, static_cast<I>(out_items));
      if (std::string err = launched("max pool arg-max"); !err.empty()) return err;
    }
    const i64 in_items = p.x_elems() / V;
    if (in_items == 0) return "";
    if (plane_tile(true, sizeof(G), &pt)) {
      plane_bwd_kernel<T, true, G><<<plane_blocks(pt), dim3(kTileW, 8),
                                     (sizeof(A) + sizeof(G)) * pt.ih * pt.iw, stream>>>(
          g, pt, dy, arg, dx);
      return launched("max pool scatter (tiles)");
    }
    if (disjoint()) {
      disjoint_bwd_kernel<T, V, true, G, I><<<blocks_for(in_items, kBlock * kItems), kBlock, 0,
                                              stream>>>(g, dy, arg, dx, static_cast<I>(in_items));
      return launched("max pool scatter (disjoint windows)");
    }
    scatter_kernel<T, V, G, I><<<blocks_for(in_items, kBlock), kBlock, 0, stream>>>(
        g, dy, arg, dx, static_cast<I>(in_items));
    return launched("max pool scatter");
  }

  std::string avg_backward(const T* dy, T* dx) const {
    const i64 items = p.x_elems() / V;
    if (items == 0) return "";
    using A = typename AccOf<T>::type;
    if (int div = 0; global_window(&div)) {
      constexpr int kW = 16 / sizeof(T);
      const A inv = A(1) / static_cast<A>(div);
      const FastDiv fc(p.C), fimg(p.x_elems() / p.N);
      if (p.x_elems() % kW == 0 && aligned16(dx)) {
        const i64 n = p.x_elems() / kW;
        global_avg_bwd_kernel<T, kW, I><<<blocks_for(n, kBlock), kBlock, 0, stream>>>(
            dy, dx, static_cast<I>(n), fc, fimg, inv);
      } else {
        global_avg_bwd_kernel<T, 1, I><<<blocks_for(p.x_elems(), kBlock), kBlock, 0, stream>>>(
            dy, dx, static_cast<I>(p.x_elems()), fc, fimg, inv);
      }
      return launched("avg pool backward (global)");
    }
    Quads qd;
    if (quads(true, &qd)) {
      const i64 n = quad_items(qd);
      quad_kernel<T, V, QuadOp::kAvgBwd, I><<<blocks_for(n, kBlock), kBlock, 0, stream>>>(
          g, qd, nullptr, dy, dx, nullptr, static_cast<I>(n));
      return launched("avg pool backward (quads)");
    }
    PlaneTile pt;
    if (plane_tile(true, 0, &pt)) {
      plane_bwd_kernel<T, false, uint8_t><<<plane_blocks(pt), dim3(kTileW, 8),
                                            sizeof(A) * pt.ih * pt.iw, stream>>>(
          g, pt, dy, nullptr, dx);
      return launched("avg pool backward (tiles)");
    }
    if constexpr (sizeof(T) * V == 16) {
      if (cells_2x2()) {
        const i64 out_items = p.y_elems() / V;
        if (out_items == 0) return "";
        cell_avg_kernel<T, V, false, 2, 2, I><<<blocks_for(out_items, kBlock * kItems), kBlock,
                                                0, stream>>>(g, dy, dx,
                                                             static_cast<I>(out_items));
        return launched("avg pool backward (2x2 cells)");
      }
    }
    if (disjoint()) {
      disjoint_bwd_kernel<T, V, false, uint8_t, I><<<blocks_for(items, kBlock * kItems), kBlock,
                                                     0, stream>>>(g, dy, nullptr, dx,
                                                                  static_cast<I>(items));
      return launched("avg pool backward (disjoint windows)");
    }
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
  // Items of either index space (plus a block of slack) decide the index type: 32-bit items
  // below 2^31 (FastDiv's range).
  const i64 items = (p.x_elems() > p.y_elems() ? p.x_elems() : p.y_elems()) / V + kBlock;
  if (items <= static_cast<i64>(std::numeric_limits<int32_t>::max()))
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
