// WINOGRAD_NONFUSED and WINOGRAD (fused) on the GPU: minimal filtering F(m x m, 3 x 3), the math
// of ffi/cpu/conv_winograd.cc (read its header comment first) and its support scope: 3x3
// stride-1 undilated 2-D filters (3-D only with depth-1 filters, as independent depth slices),
// groups, NHWC and NCHW, any (negative, asymmetric) padding, images smaller than a tile.
//
// Per point xi of the a x a transform domain (a = m + 2) and group g:
//   Y = AT [ sum_c U[xi][c][k] V[xi][tile][c] ] AT^T,  U = G w G^T,  V = BT d BT^T.
//
// The filter transform is its own FFI call (jaxdnn_winograd_filter: winograd_filter_run below):
// U is an XLA value that the forward and backward-data calls of both families take in place of
// w, so XLA shares one U between the convolutions of one filter (CSE) and hoists it out of loops.
//
// WINOGRAD_NONFUSED, F(4x4,3x3) (F(2x2,3x3) where the pass output is < 4 on a side, as the CPU),
// or the problem's explicit tile (ConvProblem::tile: 2, 4, or 6 = F(6x6,3x3), 64 points, float32
// and float64 operands only):
//   1. filter_transform_kernel: U[xi][g][c][k]  (Cgp x Kgp per (xi, g), zero-padded; own call)
//   2. input_transform_kernel:  V[xi][t][g][c]  (a chunk of TB tiles; NHWC reads coalesced along c)
//   3. one batched GEMM launch: Mo[xi][t][g][k] = V[xi][t][g][:] * U[xi][g]  (M = tiles of the
//      chunk, N = K/G, K = C/G), 36 * G products (gemm_tc_kernel for float compute, or
//      gemm_wgmma_kernel on sm_90 where use_wgmma_gemm picks it; gemm_kernel for double)
//   4. output_transform_kernel: Y = AT Mo AT^T, cropped, in the output layout and dtype.
//   Backward-data: the same on dy with w'(r, s, c, k) = w(2 - r, 2 - s, k, c), padding 2 - pad.
//   Backward-filter: V of x and Dy = AT^T dy AT (dy_transform_kernel), per point
//   P[s][xi][g] (+)= V[xi][tiles of split s]^T * Dy[xi][tiles of split s] (gemm_kernel, A read
//   k-major), then dw = G^T (sum_s P[s]) G (filter_grad_kernel) with the splits added in a
//   fixed order: no atomics, bitwise reproducible.
// WINOGRAD (fused), forward and backward-data: F(4x4,3x3) on the tensor cores (fused_tc_kernel,
//   below) for channels-last float32 / bf16 / f16 operands with pass input channels per group a
//   multiple of 8 and pass outputs of at least 4 x 4 (fused_tile), else F(2x2,3x3) in FFMA/DFMA:
//   fused_kernel takes 32 tiles x 32 output channels of a group per CTA; per block of input
//   channels it transforms the input tiles into shared memory, loads the pre-transformed filter
//   (U, the jaxdnn_winograd_filter operand) and accumulates the 16 point products in registers;
//   the output transform runs on those registers. Backward-data: the same on dy with the
//   flipped, channel-swapped filter. Backward-filter: fused_wgrad_kernel takes a slice of the
//   tiles x 32 input x 32 output channels per CTA through both transforms and the per-point
//   products into registers, writes the slice's sums, and filter_grad_kernel adds the slices in
//   order (deterministic) and applies G^T (.) G.
//
// Arithmetic: fp32 for float32 at every precision and for bf16/f16 operands (widened when
// loaded): transforms in FFMA, NONFUSED products on the tensor cores as 3xTF32 with fp32-grade
// error (gemm_tc_kernel), fused-kernel products in FFMA; or fp64 (DFMA, float64) throughout.
// Transformed operands live in the
// workspace in that type. Channel pads: Cgp = round_up(C/G, 8), Kgp = round_up(K/G, 8) (per pass
// input / output channels), zeros in the pads (the GEMM zero-fills its K tail past a multiple
// of 8).
// Workspace (elements of the compute type Tc; TB = tiles per chunk, TBr = round_up(TB, 8)):
//   fwd/dgrad NONFUSED: a*a TBr G (Cgp + Kgp) (V, Mo); U (a*a G Cgp Kgp) is an operand
//   wgrad:              a*a S G Cgp Kgp (split partials) + a*a TBr G (Cgp + Kgp) (V, Dy)
//   fused:              none for fwd/dgrad (U is an operand); wgrad: 16 G Cgp Kgp per tile
//                       slice, at most 64 slices
//   cap = max(256, kChunkBytes / (a*a * G * (Cgp + Kgp) * sizeof(Tc))), 256 MiB chunks;
//   TB = tiles if tiles <= cap; else wgrad: cap; fwd/dgrad: a multiple of the GEMM's BM, at most
//   cap, chosen against wave quantization (chunk_tiles).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "conv_cuda.h"
#ifndef JAXDNN_WINO_EMULATION
#include "gemm_primitives.cuh"
#include "wgmma_util.cuh"
#endif

#ifdef JAXDNN_WINO_EMULATION
#define WINO_SMEM static  // host emulation (tests/cuda/winograd/emu): one block at a time
#else
#define WINO_SMEM __shared__
#endif

namespace jaxdnn::cuda {
namespace {

using i64 = long long;

#ifndef WINO_CHUNK_MIB  // NONFUSED chunk size (workspace), a sweep knob
#define WINO_CHUNK_MIB 256  // 128 -> 256: vgg_c3_2 1.026 -> 1.000 ms, vgg_c1_2 2.06 -> 1.89 (H200 sweep)
#endif
constexpr i64 kChunkBytes = i64{WINO_CHUNK_MIB} << 20;
constexpr int kThreads = 256;  // every kernel here
constexpr int kPad = 8;        // channel pad (half the GEMM's BK)
constexpr i64 kMaxSplits = 16;
// CTAs the backward-filter GEMM aims for (about 4 waves of an H200 at 2 CTAs per SM, so the
// last partial wave costs little); a constant, not a device query, so that the workspace size
// and the summation order do not depend on the device.
constexpr i64 kWgradTargetCtas = 1056;

i64 round_up(i64 a, i64 b) { return (a + b - 1) / b * b; }
i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// Element conversions (compute type float or double).
template <typename Tc, typename T>
__device__ __forceinline__ Tc load_as(const T* p) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return static_cast<Tc>(__bfloat162float(*p));
  else if constexpr (std::is_same_v<T, __half>) return static_cast<Tc>(__half2float(*p));
  else return static_cast<Tc>(*p);
}
template <typename T, typename Tc>
__device__ __forceinline__ void store_as(T* p, Tc v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) *p = __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>) *p = __float2half_rn(static_cast<float>(v));
  else *p = static_cast<T>(v);
}

// ---------------------------------------------------------------------------------------------
// 1-D transforms of F(m, 3). bt: input (a -> a), g: filter (3 -> a), at: output (a -> m);
// the adjoints for backward-filter: a (m -> a, v = AT^T y) and gt (a -> 3, w = G^T u).
template <int M>
struct Tr;

template <>
struct Tr<2> {  // points 0, 1, -1, inf
  static constexpr int A = 4;
  template <typename T>
  __device__ static void bt(const T* d, T* o) {
    o[0] = d[0] - d[2]; o[1] = d[1] + d[2]; o[2] = d[2] - d[1]; o[3] = d[1] - d[3];
  }
  template <typename T>
  __device__ static void g(const T* w, T* u) {
    const T h = T(0.5);
    u[0] = w[0]; u[1] = h * (w[0] + w[1] + w[2]); u[2] = h * (w[0] - w[1] + w[2]); u[3] = w[2];
  }
  template <typename T>
  __device__ static void at(const T* m, T* y) {
    y[0] = m[0] + m[1] + m[2]; y[1] = m[1] - m[2] - m[3];
  }
  template <typename T>
  __device__ static void a(const T* y, T* v) {
    v[0] = y[0]; v[1] = y[0] + y[1]; v[2] = y[0] - y[1]; v[3] = -y[1];
  }
  template <typename T>
  __device__ static void gt(const T* u, T* w) {
    const T h = T(0.5);
    w[0] = u[0] + h * (u[1] + u[2]); w[1] = h * (u[1] - u[2]); w[2] = h * (u[1] + u[2]) + u[3];
  }
};

template <>
struct Tr<4> {  // points 0, 1, -1, 2, -2, inf
  static constexpr int A = 6;
  // BT rows (4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
  // (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1) in 12 operations (6 adds, 6 multiply-adds).
  template <typename T>
  __device__ static void bt(const T* d, T* o) {
    const T a = d[4] - d[2], b = d[3] - d[1];
    const T c = d[4] - T(4) * d[2], e = d[3] - T(4) * d[1];
    o[0] = T(4) * (d[0] - d[2]) + a;
    o[1] = c + e;
    o[2] = c - e;
    o[3] = a + T(2) * b;
    o[4] = a - T(2) * b;
    o[5] = (d[5] - d[3]) - T(4) * b;
  }
  template <typename T>
  __device__ static void g(const T* w, T* u) {
    const T s6 = T(1.0 / 6), s12 = T(1.0 / 12), s24 = T(1.0 / 24);
    u[0] = T(0.25) * w[0];
    u[1] = -s6 * (w[0] + w[1] + w[2]);
    u[2] = -s6 * (w[0] - w[1] + w[2]);
    u[3] = s24 * w[0] + s12 * w[1] + s6 * w[2];
    u[4] = s24 * w[0] - s12 * w[1] + s6 * w[2];
    u[5] = w[2];
  }
  template <typename T>
  __device__ static void at(const T* m, T* y) {
    const T p1 = m[1] + m[2], m1 = m[1] - m[2], p2 = m[3] + m[4], m2 = m[3] - m[4];
    y[0] = m[0] + p1 + p2;
    y[1] = m1 + T(2) * m2;
    y[2] = p1 + T(4) * p2;
    y[3] = m1 + T(8) * m2 + m[5];
  }
  template <typename T>
  __device__ static void a(const T* y, T* v) {
    v[0] = y[0];
    v[1] = y[0] + y[1] + y[2] + y[3];
    v[2] = y[0] - y[1] + y[2] - y[3];
    v[3] = y[0] + T(2) * y[1] + T(4) * y[2] + T(8) * y[3];
    v[4] = y[0] - T(2) * y[1] + T(4) * y[2] - T(8) * y[3];
    v[5] = y[3];
  }
  template <typename T>
  __device__ static void gt(const T* u, T* w) {
    const T s6 = T(1.0 / 6), s12 = T(1.0 / 12), s24 = T(1.0 / 24);
    w[0] = T(0.25) * u[0] - s6 * (u[1] + u[2]) + s24 * (u[3] + u[4]);
    w[1] = s6 * (u[2] - u[1]) + s12 * (u[3] - u[4]);
    w[2] = -s6 * (u[1] + u[2]) + s6 * (u[3] + u[4]) + u[5];
  }
};

template <>
struct Tr<6> {  // points 0, 1, -1, 2, -2, 1/2, -1/2, inf (ffi/cpu/conv_winograd.cc's Wino<6>)
  static constexpr int A = 8;
  // The rows of BT, AT and G pair up as p, -p: each pair is (even part) +- (odd part).
  template <typename T>
  __device__ static void bt(const T* d, T* o) {
    const T c = T(5.25), e = T(4.25);
    o[0] = d[0] - d[6] + c * (d[4] - d[2]);
    o[7] = d[7] - d[1] + c * (d[3] - d[5]);
    T ev = d[2] + d[6] - e * d[4], od = d[1] + d[5] - e * d[3];
    o[1] = ev + od, o[2] = ev - od;
    ev = T(0.25) * d[2] - T(1.25) * d[4] + d[6], od = T(0.5) * d[1] - T(2.5) * d[3] + T(2) * d[5];
    o[3] = ev + od, o[4] = ev - od;
    ev = T(4) * d[2] - T(5) * d[4] + d[6], od = T(2) * d[1] - T(2.5) * d[3] + T(0.5) * d[5];
    o[5] = ev + od, o[6] = ev - od;
  }
  template <typename T>
  __device__ static void g(const T* w, T* u) {
    const T ev1 = w[0] + w[2], c29 = T(-2.0 / 9);
    u[0] = w[0];
    u[1] = c29 * (ev1 + w[1]);
    u[2] = c29 * (ev1 - w[1]);
    T ev = T(1.0 / 90) * w[0] + T(2.0 / 45) * w[2], od = T(1.0 / 45) * w[1];
    u[3] = ev + od, u[4] = ev - od;
    ev = T(32.0 / 45) * w[0] + T(8.0 / 45) * w[2], od = T(16.0 / 45) * w[1];
    u[5] = ev + od, u[6] = ev - od;
    u[7] = w[2];
  }
  template <typename T>
  __device__ static void at(const T* m, T* y) {
    const T p1 = m[1] + m[2], q1 = m[1] - m[2], p2 = m[3] + m[4], q2 = m[3] - m[4];
    const T p3 = m[5] + m[6], q3 = m[5] - m[6];
    y[0] = m[0] + p1 + p2 + p3;
    y[1] = q1 + T(2) * q2 + T(0.5) * q3;
    y[2] = p1 + T(4) * p2 + T(0.25) * p3;
    y[3] = q1 + T(8) * q2 + T(0.125) * q3;
    y[4] = p1 + T(16) * p2 + T(0.0625) * p3;
    y[5] = q1 + T(32) * q2 + T(0.03125) * q3 + m[7];
  }
  template <typename T>
  __device__ static void a(const T* y, T* v) {
    v[0] = y[0];
    T ev = y[0] + y[2] + y[4], od = y[1] + y[3] + y[5];
    v[1] = ev + od, v[2] = ev - od;
    ev = y[0] + T(4) * y[2] + T(16) * y[4], od = T(2) * y[1] + T(8) * y[3] + T(32) * y[5];
    v[3] = ev + od, v[4] = ev - od;
    ev = y[0] + T(0.25) * y[2] + T(0.0625) * y[4];
    od = T(0.5) * y[1] + T(0.125) * y[3] + T(0.03125) * y[5];
    v[5] = ev + od, v[6] = ev - od;
    v[7] = y[5];
  }
  template <typename T>
  __device__ static void gt(const T* u, T* w) {
    const T s1 = u[1] + u[2], d1 = u[1] - u[2], s2 = u[3] + u[4], d2 = u[3] - u[4];
    const T s3 = u[5] + u[6], d3 = u[5] - u[6], c29 = T(-2.0 / 9);
    w[0] = u[0] + c29 * s1 + T(1.0 / 90) * s2 + T(32.0 / 45) * s3;
    w[1] = c29 * d1 + T(1.0 / 45) * d2 + T(16.0 / 45) * d3;
    w[2] = c29 * s1 + T(2.0 / 45) * s2 + T(8.0 / 45) * s3 + u[7];
  }
};

// y = F x F^T for a 1-D map F (I -> O): columns first, then rows. x: I x I, y: O x O.
template <int I, int O, typename T, typename F>
__device__ __forceinline__ void sandwich(const T (&x)[I][I], T (&y)[O][O], F f) {
  T tmp[O][I];
#pragma unroll
  for (int v = 0; v < I; ++v) {
    T col[I], res[O];
#pragma unroll
    for (int u = 0; u < I; ++u) col[u] = x[u][v];
    f(col, res);
#pragma unroll
    for (int i = 0; i < O; ++i) tmp[i][v] = res[i];
  }
#pragma unroll
  for (int i = 0; i < O; ++i) f(tmp[i], y[i]);
}

// ---------------------------------------------------------------------------------------------
// Geometry of one forward-shaped pass (fwd, dgrad on dy, or the tiles of wgrad).
struct Strides {
  i64 n, c, sp[3];  // batch, channel, (depth, row, column)
};

Strides act_strides(bool nhwc, i64 ch, const int64_t* sp) {
  const i64 pix = sp[0] * sp[1] * sp[2];
  if (nhwc) return {pix * ch, 1, {sp[1] * sp[2] * ch, sp[2] * ch, ch}};
  return {ch * pix, pix, {sp[1] * sp[2], sp[2], 1}};
}

struct Pass {
  i64 planes, depth;      // planes = N * depth; depth slices are independent
  i64 H, W, P, Q, pad_h, pad_w;
  i64 Ci, Co, G;          // pass input / output channels (totals), groups
  i64 Cig, Cog, Cgp, Kgp; // per group, and padded to kPad
  i64 th, tw;             // tiles per column and per row of a plane
  Strides is, os;
  __host__ __device__ i64 plane_off(const Strides& s, i64 pl) const {
    return (pl / depth) * s.n + (pl % depth) * s.sp[0];
  }
};

Pass make_pass(ConvOp op, const ConvProblem& p, int m) {
  const bool nhwc = p.layout == Layout::kNHWC;
  Pass ps{};
  ps.depth = p.in[0];
  ps.planes = p.N * p.in[0];
  ps.G = p.G;
  if (op == ConvOp::kBackwardData) {
    ps.H = p.out[1], ps.W = p.out[2], ps.P = p.in[1], ps.Q = p.in[2];
    ps.pad_h = 2 - p.pad_lo[1], ps.pad_w = 2 - p.pad_lo[2];
    ps.Ci = p.K, ps.Co = p.C;
    ps.is = act_strides(nhwc, p.K, p.out);
    ps.os = act_strides(nhwc, p.C, p.in);
  } else {
    ps.H = p.in[1], ps.W = p.in[2], ps.P = p.out[1], ps.Q = p.out[2];
    ps.pad_h = p.pad_lo[1], ps.pad_w = p.pad_lo[2];
    ps.Ci = p.C, ps.Co = p.K;
    ps.is = act_strides(nhwc, p.C, p.in);
    ps.os = act_strides(nhwc, p.K, p.out);
  }
  ps.Cig = ps.Ci / ps.G, ps.Cog = ps.Co / ps.G;
  ps.Cgp = round_up(ps.Cig, kPad), ps.Kgp = round_up(ps.Cog, kPad);
  ps.th = ceil_div(ps.P, m), ps.tw = ceil_div(ps.Q, m);
  return ps;
}

i64 tiles_of(const Pass& ps) { return ps.planes * ps.th * ps.tw; }

// Tile t of a pass: its plane and its row and column among the plane's tiles.
struct TilePos {
  i64 pl, ti, tj;
};
__device__ __forceinline__ TilePos tile_pos(const Pass& ps, i64 t) {
  return {t / (ps.th * ps.tw), t / ps.tw % ps.th, t % ps.tw};
}

// Stores y, the M x M output tile at `pos` of pass output channel ch (of all groups), cropped to
// P x Q, in the output's layout and dtype.
template <int M, typename To, typename Tc>
__device__ __forceinline__ void store_tile(To* out, const Pass& ps, TilePos pos, i64 ch,
                                           const Tc (&y)[M][M]) {
  To* base = out + ps.plane_off(ps.os, pos.pl) + ch * ps.os.c;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const i64 p = pos.ti * M + i;
    if (p >= ps.P) continue;
#pragma unroll
    for (int j = 0; j < M; ++j) {
      const i64 q = pos.tj * M + j;
      if (q < ps.Q) store_as(base + p * ps.os.sp[1] + q * ps.os.sp[2], y[i][j]);
    }
  }
}

// The CPU's rule: the problem's explicit tile when it has one (any output size: tiles past the
// output are cropped), else F(4x4) unless the pass output is smaller than 4 on a side.
int tile_m(ConvOp op, const ConvProblem& p) {
  if (p.tile != 0) return p.tile;
  const Pass ps = make_pass(op, p, 4);
  return std::min(ps.P, ps.Q) >= 4 ? 4 : 2;
}

// The filter of a pass as strides: (group g, pass input channel c, pass output channel k, tap
// (r, s)) at base + g*sg + c*sc + k*sk + r*sr + s*ss. Backward-data: flipped and channel-swapped.
struct FilterView {
  i64 sg, sc, sk, sr, ss, base;
};

FilterView filter_view(const ConvProblem& p, bool flip_swap) {
  const i64 Cg = p.Cg(), Kg = p.Kg(), K = p.K;
  FilterView f = p.layout == Layout::kNHWC ? FilterView{Kg, K, 1, 3 * Cg * K, Cg * K, 0}
                                           : FilterView{Kg * Cg * 9, 9, Cg * 9, 3, 1, 0};
  if (flip_swap) {
    std::swap(f.sc, f.sk);
    f.base = 2 * f.sr + 2 * f.ss;
    f.sr = -f.sr;
    f.ss = -f.ss;
  }
  return f;
}

// ---------------------------------------------------------------------------------------------
// Transform kernels: one thread per (tile or filter slice, channel).
// Thread -> (tile tt < ntiles, workspace column col < cols). Channels-last activations: columns
// fastest, so activation loads and workspace accesses are coalesced along channels. Channels-
// first: a warp takes 32 consecutive tiles of one channel (its pixel rows are contiguous) and
// the next warps the next channels, so each 32-byte workspace sector is completed by 8 warps
// running together.
__device__ __forceinline__ bool thread_tile(i64 idx, i64 ntiles, i64 cols, bool tiles_fast,
                                            i64& tt, i64& col) {
  if (!tiles_fast) {
    col = idx % cols, tt = idx / cols;
  } else {
    const i64 rest = idx / 32;
    col = rest % cols, tt = rest / cols * 32 + idx % 32;
  }
  return tt < ntiles;
}
i64 transform_threads(i64 ntiles, i64 cols, bool tiles_fast) {
  return (tiles_fast ? round_up(ntiles, 32) : ntiles) * cols;
}

// U[xi][g][c][k] (Cgp x Kgp per (xi, g)), zeros in the pads.
template <typename T, typename Tc, int M>
__global__ void __launch_bounds__(kThreads)
filter_transform_kernel(const T* __restrict__ w, FilterView f, i64 G, i64 Cg, i64 Kg, i64 Cgp,
                        i64 Kgp, Tc* __restrict__ U) {
  constexpr int A = Tr<M>::A;
  const i64 idx = blockIdx.x * i64{kThreads} + threadIdx.x;
  if (idx >= G * Cgp * Kgp) return;
  const i64 k = idx % Kgp, c = idx / Kgp % Cgp, g = idx / (Kgp * Cgp);
  Tc g3[3][3] = {};
  if (c < Cg && k < Kg) {
    const T* src = w + f.base + g * f.sg + c * f.sc + k * f.sk;
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
      for (int s = 0; s < 3; ++s) g3[r][s] = load_as<Tc>(src + r * f.sr + s * f.ss);
  }
  Tc u[A][A];
  sandwich(g3, u, [](const Tc* i, Tc* o) { Tr<M>::g(i, o); });
  const i64 step = G * Cgp * Kgp;
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < A; ++j) U[(i * A + j) * step + idx] = u[i][j];
}

// V[xi][tt][g][c] = (BT d BT^T) of tile t0 + tt, for tt < ntr (tiles >= nt and channel pads: 0).
template <typename T, typename Tc, int M>
__global__ void __launch_bounds__(kThreads)
input_transform_kernel(const T* __restrict__ in, Pass ps, i64 t0, i64 nt, i64 ntr, i64 TBr,
                       Tc* __restrict__ V) {
  constexpr int A = Tr<M>::A;
  const i64 cip = ps.G * ps.Cgp;
  i64 tt, col;
  if (!thread_tile(blockIdx.x * i64{kThreads} + threadIdx.x, ntr, cip, ps.is.c != 1, tt, col))
    return;
  const i64 g = col / ps.Cgp, c = col % ps.Cgp;
  Tc d[A][A] = {};
  if (tt < nt && c < ps.Cig) {
    const i64 t = t0 + tt, pl = t / (ps.th * ps.tw), ti = t / ps.tw % ps.th, tj = t % ps.tw;
    const T* base = in + ps.plane_off(ps.is, pl) + (g * ps.Cig + c) * ps.is.c;
    const i64 h0 = ti * M - ps.pad_h, w0 = tj * M - ps.pad_w;
#pragma unroll
    for (int u = 0; u < A; ++u) {
      const i64 h = h0 + u;
      if (h < 0 || h >= ps.H) continue;
#pragma unroll
      for (int v = 0; v < A; ++v) {
        const i64 x = w0 + v;
        if (x >= 0 && x < ps.W) d[u][v] = load_as<Tc>(base + h * ps.is.sp[1] + x * ps.is.sp[2]);
      }
    }
  }
  Tc o[A][A];
  sandwich(d, o, [](const Tc* i, Tc* r) { Tr<M>::bt(i, r); });
  Tc* dst = V + tt * cip + col;
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < A; ++j) dst[(i * A + j) * TBr * cip] = o[i][j];
}

// Dy[xi][tt][g][k] = (AT^T dy_tile AT), the tile zero past the output extent (wgrad).
template <typename T, typename Tc, int M>
__global__ void __launch_bounds__(kThreads)
dy_transform_kernel(const T* __restrict__ dy, Pass ps, i64 t0, i64 nt, i64 ntr, i64 TBr,
                    Tc* __restrict__ D) {
  constexpr int A = Tr<M>::A;
  const i64 cop = ps.G * ps.Kgp;
  i64 tt, col;
  if (!thread_tile(blockIdx.x * i64{kThreads} + threadIdx.x, ntr, cop, ps.os.c != 1, tt, col))
    return;
  const i64 g = col / ps.Kgp, k = col % ps.Kgp;
  Tc y[M][M] = {};
  if (tt < nt && k < ps.Cog) {
    const i64 t = t0 + tt, pl = t / (ps.th * ps.tw), ti = t / ps.tw % ps.th, tj = t % ps.tw;
    const T* base = dy + ps.plane_off(ps.os, pl) + (g * ps.Cog + k) * ps.os.c;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const i64 p = ti * M + i;
      if (p >= ps.P) continue;
#pragma unroll
      for (int j = 0; j < M; ++j) {
        const i64 q = tj * M + j;
        if (q < ps.Q) y[i][j] = load_as<Tc>(base + p * ps.os.sp[1] + q * ps.os.sp[2]);
      }
    }
  }
  Tc o[A][A];
  sandwich(y, o, [](const Tc* i, Tc* r) { Tr<M>::a(i, r); });
  Tc* dst = D + tt * cop + col;
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < A; ++j) dst[(i * A + j) * TBr * cop] = o[i][j];
}

// out tile t0 + tt = AT Mo[.][tt][g][k] AT^T, cropped to P x Q.
template <typename T, typename Tc, int M>
__global__ void __launch_bounds__(kThreads)
output_transform_kernel(const Tc* __restrict__ Mo, Pass ps, i64 t0, i64 nt, i64 TBr,
                        T* __restrict__ out) {
  constexpr int A = Tr<M>::A;
  const i64 cop = ps.G * ps.Kgp;
  i64 tt, col;
  if (!thread_tile(blockIdx.x * i64{kThreads} + threadIdx.x, nt, cop, ps.os.c != 1, tt, col))
    return;
  const i64 g = col / ps.Kgp, k = col % ps.Kgp;
  if (k >= ps.Cog) return;
  Tc m[A][A];
  const Tc* src = Mo + tt * cop + col;
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < A; ++j) m[i][j] = src[(i * A + j) * TBr * cop];
  Tc y[M][M];
  sandwich(m, y, [](const Tc* i, Tc* r) { Tr<M>::at(i, r); });
  store_tile(out, ps, tile_pos(ps, t0 + tt), g * ps.Cog + k, y);
}

// dw = G^T (sum_s P[s][.][g][c][k]) G, splits added in order s = 0, 1, ...
template <typename T, typename Tc, int M>
__global__ void __launch_bounds__(kThreads)
filter_grad_kernel(const Tc* __restrict__ Pp, i64 S, i64 G, i64 Cg, i64 Kg, i64 Cgp, i64 Kgp,
                   bool nhwc, T* __restrict__ dw) {
  constexpr int A = Tr<M>::A;
  const i64 idx = blockIdx.x * i64{kThreads} + threadIdx.x;
  if (idx >= G * Cg * Kg) return;
  const i64 k = idx % Kg, c = idx / Kg % Cg, g = idx / (Kg * Cg);
  const i64 point = G * Cgp * Kgp, split = A * A * point;
  const Tc* src = Pp + (g * Cgp + c) * Kgp + k;
  Tc m[A][A];
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < A; ++j) {
      Tc acc = src[(i * A + j) * point];
      for (i64 s = 1; s < S; ++s) acc += src[s * split + (i * A + j) * point];
      m[i][j] = acc;
    }
  Tc w3[3][3];
  sandwich(m, w3, [](const Tc* i, Tc* r) { Tr<M>::gt(i, r); });
  const i64 K = G * Kg;
#pragma unroll
  for (int r = 0; r < 3; ++r)
#pragma unroll
    for (int s = 0; s < 3; ++s) {
      const i64 off = nhwc ? ((r * 3 + s) * Cg + c) * K + g * Kg + k
                           : ((g * Kg + k) * Cg + c) * 9 + r * 3 + s;
      store_as(dw + off, w3[r][s]);
    }
}

// ---------------------------------------------------------------------------------------------
// Batched GEMM, SIMT (FFMA / DFMA): C[z] (M x N, row stride ldc) (+)= A[z] (M x K) * B[z] (K x N).
// A element (m, k) at A[m*lda + k] (row-major) or, A_KMAJOR, at A[k*lda + m]; B (k, n) at
// B[k*ldb + n]. Batch z = (xi * G + g) * S + s: operand offsets xi*_xi + g*_g + s*_s; split s
// covers K rows [s*k_split, min(K, (s+1)*k_split)). K and k_split are multiples of 8 (kPad);
// rows / columns / k past their limits are zero-filled on load (cp.async zfill) and not stored
// (the limits are multiples of the vector width where they bound a vector).
// Tile: BM = BN = 32 V (128 for fp32, 64 for fp64; V = 16-byte vector width), BK = 16, 256
// threads, each a 2V x 2V register block (8x8 fp32) split into 2 x 2 sub-blocks BM/2 apart.
// Operands go global -> shared by cp.async (16 bytes, no register staging) through a 3-stage
// ring (48 KB, one barrier per BK). A is kept in shared memory as loaded: k-major [BK][BM]
// (A_KMAJOR) or m-major [BM][BK] with the 16-byte chunks of a row XOR-swizzled by bit 0 of
// (row / V), so that the two rows a warp reads at once sit in different banks; m-major
// fragments are read as V consecutive k of each of the thread's 2V rows. Every output is summed
// over k in increasing order (fixed, bitwise reproducible). When N <= BN / 2 a narrow variant
// takes BN / 2 columns (2V x V per thread).
struct GemmArgs {
  const void* A;
  const void* B;
  void* C;
  i64 lda, ldb, ldc;
  i64 M, N, K, k_split;
  i64 G, S;
  i64 a_xi, a_g, a_s, b_xi, b_g, b_s, c_xi, c_g, c_s;
  i64 mblocks, nblocks;
  bool accumulate;
};

// The GEMM block of CTA blockIdx.x: column block nb, row block mb, point xi, group g, split s,
// and the split's reduction length klen.
struct GemmBlock {
  i64 nb, mb, xi, g, s;
  int klen;
  // Element offsets of the block's A, B and C matrices (batch xi, group g, split s).
  __device__ __forceinline__ i64 a_off(const GemmArgs& p) const {
    return xi * p.a_xi + g * p.a_g + s * p.a_s;
  }
  __device__ __forceinline__ i64 b_off(const GemmArgs& p) const {
    return xi * p.b_xi + g * p.b_g + s * p.b_s;
  }
  __device__ __forceinline__ i64 c_off(const GemmArgs& p) const {
    return xi * p.c_xi + g * p.c_g + s * p.c_s;
  }
};
__device__ __forceinline__ GemmBlock gemm_block(const GemmArgs& p) {
  const i64 blk = blockIdx.x, z = blk / (p.nblocks * p.mblocks);
  const i64 s = z % p.S;
  return {blk % p.nblocks, blk / p.nblocks % p.mblocks, z / (p.S * p.G), z / p.S % p.G, s,
          static_cast<int>(std::max<i64>(0, std::min(p.k_split, p.K - s * p.k_split)))};
}

template <typename T>
struct Vec16;
template <>
struct Vec16<float> {
  using type = float4;
};
template <>
struct Vec16<double> {
  using type = double2;
};

// 16-byte global -> shared copy, zero-filled when !ok (src is then not read).
__device__ __forceinline__ void cp_async16(void* smem, const void* src, bool ok) {
#ifdef JAXDNN_WINO_EMULATION
  if (ok) std::memcpy(smem, src, 16);
  else std::memset(smem, 0, 16);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(ok ? 16 : 0));
#endif
}
// The same through L1 (cp.async.ca): for sources that neighbouring copies of one CTA read again
// (the overlapping input windows of adjacent Winograd tiles).
__device__ __forceinline__ void cp_async16_ca(void* smem, const void* src, bool ok) {
#ifdef JAXDNN_WINO_EMULATION
  cp_async16(smem, src, ok);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(ok ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifndef JAXDNN_WINO_EMULATION
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifndef JAXDNN_WINO_EMULATION
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Tunables of the GEMM (compile-time; tests/cuda/winograd/sweep.sh times settings of them on a
// GPU, the defaults are the chosen ones):
//   WINO_GEMM_BK      k per stage (16 or 32): 32 halves the barriers and loop overhead per K.
//   WINO_GEMM_STAGES  cp.async ring depth (2..4).
//   WINO_GEMM_MINB    CTAs per SM asked of the register allocator (2: 128 registers a thread).
//   WINO_GEMM_AV      fp32 m-major A: k per shared-memory fragment read (2: LDS.64, 4: LDS.128,
//                     fewer LDS per FFMA for 16 more registers).
//   WINO_GEMM_WARP    thread -> (tx, ty) map. 0: tx = tid % 16 (a warp is 2 x 16 threads, 16 x 128
//                     outputs); 1: a warp is 4 x 8 threads (32 x 64 outputs), whose B reads are
//                     128 contiguous bytes (one shared-memory wavefront, not two) and A reads four
//                     rows (A's swizzle then takes 2 bits).
//   WINO_GEMM_PIPE    1: each k step's fragments are read from shared memory one step ahead
//                     (register double buffer), also across the stage boundary.
// Shared memory is dynamic where it passes the 48 KB static limit (BK 32, 4 stages).
#ifndef WINO_GEMM_BK
#define WINO_GEMM_BK 16
#endif
#ifndef WINO_GEMM_STAGES
#define WINO_GEMM_STAGES 3
#endif
#ifndef WINO_GEMM_MINB
#define WINO_GEMM_MINB 2
#endif
#ifndef WINO_GEMM_AV
#define WINO_GEMM_AV 2
#endif
#ifndef WINO_GEMM_WARP
#define WINO_GEMM_WARP 0
#endif
#ifndef WINO_GEMM_PIPE
#define WINO_GEMM_PIPE 0
#endif
constexpr int kGemmBK = WINO_GEMM_BK, kGemmStages = WINO_GEMM_STAGES;
static_assert(kGemmBK % (2 * kPad) == 0 && kGemmStages >= 2, "GEMM tunables");
template <typename T>
constexpr i64 gemm_bm() {
  return 32 * (16 / sizeof(T));
}
// Tile width of a GEMM of N columns: wide (BN = BM) when N > BM / 2, except in the tensor-core
// GEMM of forward-shaped passes (A m-major: fwd, dgrad), which takes the narrow tiles (BN = BM / 2,
// 2 CTAs per SM against 1): H200 sweep at N = 128..512 (gpu-h200-2026-12-04-s10.md), fwd and
// dgrad 2-12 % faster on the ResNet-50 3x3 layers, while wgrad (A k-major) was 1-4 % slower on
// r50_c3 / r50_c4. WINO_GEMM_NARROW=1 (compile time, sweep.sh SWEEP_SET=tc) takes narrow tiles
// everywhere.
#ifndef WINO_GEMM_NARROW
#define WINO_GEMM_NARROW 0
#endif
bool use_tc_gemm();
template <typename T>
bool gemm_wide(i64 N, bool a_kmajor) {
  if (N <= gemm_bm<T>() / 2 || WINO_GEMM_NARROW) return false;
  return !(std::is_same_v<T, float> && !a_kmajor && use_tc_gemm());
}
// Column blocks of the GEMM for N columns.
template <typename T>
i64 gemm_nblocks(i64 N, bool a_kmajor) {
  constexpr i64 bm = gemm_bm<T>();
  return gemm_wide<T>(N, a_kmajor) ? ceil_div(N, bm) : ceil_div(N, bm / 2);
}
template <typename T, bool WIDE>
constexpr size_t gemm_smem_bytes() {
  constexpr size_t bm = gemm_bm<T>(), bn = WIDE ? bm : bm / 2;
  return kGemmStages * kGemmBK * (bm + bn) * sizeof(T);
}
template <typename T, bool WIDE>
constexpr bool gemm_smem_dynamic() {
  return gemm_smem_bytes<T, WIDE>() > 48 * 1024;
}

template <typename T, bool A_KMAJOR, bool WIDE>
__global__ void __launch_bounds__(kThreads, WINO_GEMM_MINB) gemm_kernel(GemmArgs p) {
  constexpr int V = 16 / sizeof(T), BM = 32 * V, BN = WIDE ? 32 * V : 16 * V, BK = kGemmBK;
  constexpr int ST = kGemmStages, TM = 2 * V, TN = WIDE ? 2 * V : V;
  // Loads in pairs of adjacent 16-byte chunks (32 bytes): PA pairs of A per thread, PB of B
  // (B: the first kBPairs threads when there are fewer pairs than threads).
  constexpr int kAPairs = BM * BK / (2 * V), kBPairs = BK * BN / (2 * V);
  constexpr int PA = kAPairs / kThreads, PB = (kBPairs + kThreads - 1) / kThreads;
  static_assert(PA >= 1 && kAPairs % kThreads == 0, "load assignment");
  static_assert(kBPairs % kThreads == 0 || kBPairs < kThreads, "load assignment");
  // A's swizzle: XOR of the 16-byte chunk index with (row / V) & SWM, SWM + 1 = the rows of
  // thread blocks a warp reads at once.
  constexpr int SWM = WINO_GEMM_WARP ? 3 : 1;
  static_assert(BK / V > SWM, "swizzle needs BK / V chunks per row");
  using VecT = typename Vec16<T>::type;
  union Pack {
    VecT v;
    T e[V];
  };
  // m-major A fragments: AV consecutive k of a row per shared-memory read (fp32: WINO_GEMM_AV,
  // fp64: 16 bytes).
  constexpr int AV = sizeof(T) == 4 ? WINO_GEMM_AV : V;
  static_assert(V % AV == 0, "AV divides V");
  using AVecT = std::conditional_t<sizeof(T) == 4,
                                   std::conditional_t<AV == 4, float4,
                                                      std::conditional_t<AV == 2, float2, float>>,
                                   double2>;
  union APack {
    AVecT v;
    T e[AV];
  };
  // Static shared arrays up to 48 KB (separate As / Bs symbols fold into constant addresses:
  // fewer registers than offsets from one base), dynamic past it (gemm_smem_dynamic).
  constexpr bool kDyn = gemm_smem_dynamic<T, WIDE>();
  alignas(16) WINO_SMEM T As_s[kDyn ? 1 : ST][BM * BK];
  alignas(16) WINO_SMEM T Bs_s[kDyn ? 1 : ST][BK * BN];
#ifdef JAXDNN_WINO_EMULATION
  alignas(16) static unsigned char smem_dyn[kDyn ? gemm_smem_bytes<T, WIDE>() : 16];
#else
  extern __shared__ __align__(16) unsigned char smem_dyn[];
#endif
  // Indexed as As[stage][...] (not base + stage * size: the stage offset then folds into the
  // LDS immediate offsets, which keeps the default at 128 registers without spills).
  T(*const As)[BM * BK] = kDyn ? reinterpret_cast<T(*)[BM * BK]>(smem_dyn) : As_s;
  T(*const Bs)[BK * BN] =
      kDyn ? reinterpret_cast<T(*)[BK * BN]>(smem_dyn + ST * BM * BK * sizeof(T)) : Bs_s;
  const int tid = threadIdx.x;
  const int tx = WINO_GEMM_WARP ? (tid / 32 % 2) * 8 + tid % 8 : tid % 16;
  const int ty = WINO_GEMM_WARP ? (tid / 64) * 4 + tid % 32 / 8 : tid / 16;
  const GemmBlock blk = gemm_block(p);
  const i64 m0 = blk.mb * BM, n0 = blk.nb * BN;
  const int klen = blk.klen;
  const T* A = static_cast<const T*>(p.A) + blk.a_off(p);
  const T* B = static_cast<const T*>(p.B) + blk.b_off(p);
  const int nk = (klen + BK - 1) / BK;

  // Pair q = tid + i * kThreads. A k-major: k = q / (BM / 2V) (pair i: k + i * AKS); m-major:
  // row m = q / (BK / 2V) (pair i: m + i * AMS), chunk c of the row. B: k = q / (BN / 2V).
  constexpr int AKS = kThreads / (BM / (2 * V)), AMS = kThreads / (BK / (2 * V));
  constexpr int BKS = kThreads / (BN / (2 * V));
  int a_k, a_dst0, a_dst1, b_k, b_dst;
  bool a_ok[PA], b_ok;
  const T* a_src;
  const T* b_src;
  i64 a_pstride;  // source offset between pairs i and i + 1
  if constexpr (A_KMAJOR) {
    const int k = tid / (BM / (2 * V)), m = (tid % (BM / (2 * V))) * 2 * V;
    a_k = k, a_dst0 = k * BM + m, a_dst1 = a_dst0 + V;
#pragma unroll
    for (int i = 0; i < PA; ++i) a_ok[i] = m0 + m < p.M;  // M is a multiple of 2V here
    a_src = A + k * p.lda + m0 + m;
    a_pstride = AKS * p.lda;
  } else {
    const int m = tid / (BK / (2 * V)), c = (tid % (BK / (2 * V))) * 2, sw = (m / V) & SWM;
    // (m + i * AMS) / V keeps m / V's low bits: AMS is a multiple of 4V.
    static_assert(PA == 1 || AMS % (4 * V) == 0, "swizzle of later pairs");
    a_k = c * V, a_dst0 = m * BK + (c ^ sw) * V, a_dst1 = m * BK + ((c + 1) ^ sw) * V;
#pragma unroll
    for (int i = 0; i < PA; ++i) a_ok[i] = m0 + m + i * AMS < p.M;
    a_src = A + (m0 + m) * p.lda + c * V;
    a_pstride = PA > 1 ? AMS * p.lda : 0;
  }
  {
    const int k = tid / (BN / (2 * V)), n = (tid % (BN / (2 * V))) * 2 * V;
    b_k = k, b_dst = k * BN + n;
    b_ok = tid < kBPairs && n0 + n < p.N;  // N is a multiple of 2V = 8 (fp32) or 4 (fp64)
    b_src = B + k * p.ldb + n0 + n;
  }
  const i64 a_step = A_KMAJOR ? BK * p.lda : BK, b_step = BK * p.ldb;
  // Stage kt's chunks: k past klen (the split's end) and rows / columns past M / N are zeros.
  auto load_stage = [&](int buf, int kt) {
    const int kb = kt * BK;
    // A chunk that is not read gets the operand's base as its (unread, in-bounds) source.
    const T* a0 = static_cast<const T*>(p.A);
    const T* b0 = static_cast<const T*>(p.B);
    T* as = As[buf];
    T* bs = Bs[buf];
    if constexpr (PA == 1) {  // the original form (fewer registers, at the default's edge)
      bool ok0, ok1;
      if constexpr (A_KMAJOR) {
        ok0 = ok1 = a_ok[0] && kb + a_k < klen;
      } else {
        ok0 = a_ok[0] && kb + a_k < klen, ok1 = a_ok[0] && kb + a_k + V < klen;
      }
      cp_async16(&as[a_dst0], ok0 ? a_src : a0, ok0);
      cp_async16(&as[a_dst1], ok1 ? a_src + V : a0, ok1);
    } else {
#pragma unroll
    for (int i = 0; i < PA; ++i) {
      const T* src = a_src + i * a_pstride;
      bool ok0, ok1;
      int d = 0;
      if constexpr (A_KMAJOR) {
        ok0 = ok1 = a_ok[i] && kb + a_k + i * AKS < klen;
        d = i * AKS * BM;
      } else {
        ok0 = a_ok[i] && kb + a_k < klen, ok1 = a_ok[i] && kb + a_k + V < klen;
        d = i * AMS * BK;
      }
      cp_async16(&as[a_dst0 + d], ok0 ? src : a0, ok0);
      cp_async16(&as[a_dst1 + d], ok1 ? src + V : a0, ok1);
    }
    }
    if constexpr (PB == 1) {
      if (tid < kBPairs) {
        const bool ok = b_ok && kb + b_k < klen;
        cp_async16(&bs[b_dst], ok ? b_src : b0, ok);
        cp_async16(&bs[b_dst + V], ok ? b_src + V : b0, ok);
      }
    } else if (tid < kBPairs) {
#pragma unroll
      for (int i = 0; i < PB; ++i) {
        const bool ok = b_ok && kb + b_k + i * BKS < klen;
        const T* src = b_src + i * BKS * p.ldb;
        cp_async16(&bs[b_dst + i * BKS * BN], ok ? src : b0, ok);
        cp_async16(&bs[b_dst + i * BKS * BN + V], ok ? src + V : b0, ok);
      }
    }
    a_src += a_step, b_src += b_step;
  };

  T acc[TM][TN] = {};
#if WINO_GEMM_PIPE
  // Swizzle of the m-major A chunks this thread reads: (row / V) & SWM = ty & SWM.
  const int sw = ty & SWM;
  // Row of the thread's i-th A element (two blocks of V rows BM / 2 apart).
  auto arow = [&](int i) { return i < V ? ty * V + i : BM / 2 + ty * V + i - V; };
  // Register double buffer: fragments of step j + 1 are read while step j's FFMAs run; the
  // stage barrier sits before the last step of a stage, so the next stage's first fragments are
  // read before that step's FFMAs. One step = AV k (m-major A) or 1 k (k-major A): A[TM] rows
  // (m-major: AV k each), B: AV k x TN columns.
  constexpr int KS = A_KMAJOR ? 1 : AV, NSTEP = BK / KS;
  struct Frag {
    T a[TM][KS];
    T b[KS][TN];
  };
  auto read_frag = [&](const T* as, const T* bs, int j, Frag& f) {
    if constexpr (A_KMAJOR) {
      Pack a0, a1;
      a0.v = *reinterpret_cast<const VecT*>(&as[j * BM + ty * V]);
      a1.v = *reinterpret_cast<const VecT*>(&as[j * BM + BM / 2 + ty * V]);
#pragma unroll
      for (int i = 0; i < V; ++i) f.a[i][0] = a0.e[i], f.a[V + i][0] = a1.e[i];
    } else {
      const int k = j * KS, col = ((k / V) ^ sw) * V + k % V;
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        APack t;
        t.v = *reinterpret_cast<const AVecT*>(&as[arow(i) * BK + col]);
#pragma unroll
        for (int kv = 0; kv < KS; ++kv) f.a[i][kv] = t.e[kv];
      }
    }
#pragma unroll
    for (int kv = 0; kv < KS; ++kv)
#pragma unroll
      for (int h = 0; h < TN / V; ++h) {
        Pack t;
        t.v = *reinterpret_cast<const VecT*>(&bs[(j * KS + kv) * BN + h * (BN / 2) + tx * V]);
#pragma unroll
        for (int jj = 0; jj < V; ++jj) f.b[kv][h * V + jj] = t.e[jj];
      }
  };
  auto fma_frag = [&](const Frag& f) {
#pragma unroll
    for (int kv = 0; kv < KS; ++kv)
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += f.a[i][kv] * f.b[kv][j];
  };
  // Prologue: stages 0 .. ST - 1 in flight, stage 0 landed, its first fragments read.
#pragma unroll
  for (int st = 0; st < ST; ++st) {
    if (st < nk) load_stage(st, st);
    cp_async_commit();
  }
  cp_async_wait<ST - 1>();
  __syncthreads();
  Frag f[2];
  if (nk > 0) read_frag(As[0], Bs[0], 0, f[0]);
#pragma unroll 1
  for (int kt = 0; kt < nk; ++kt) {
    const int buf = kt % ST;
    const T* as = As[buf];
    const T* bs = Bs[buf];
#pragma unroll
    for (int j = 0; j < NSTEP - 1; ++j) {
      read_frag(as, bs, j + 1, f[(j + 1) % 2]);
      fma_frag(f[j % 2]);
    }
    // Stage kt + 1 landed for all, and every thread has read stage kt (its last fragments are in
    // registers): refill buf with stage kt + ST, then read stage kt + 1's first fragments.
    cp_async_wait<ST - 2>();
    __syncthreads();
    if (kt + ST < nk) load_stage(buf, kt + ST);
    cp_async_commit();
    if (kt + 1 < nk) {
      const int nbuf = (kt + 1) % ST;
      read_frag(As[nbuf], Bs[nbuf], 0, f[NSTEP % 2]);
    }
    fma_frag(f[(NSTEP - 1) % 2]);
  }
  static_assert(NSTEP % 2 == 0, "the next stage's first fragments go to f[0]");
#else
#pragma unroll
  for (int st = 0; st < ST - 1; ++st) {
    if (st < nk) load_stage(st, st);
    cp_async_commit();
  }
  // Swizzle of the m-major A chunks this thread reads: (row / V) & SWM = ty & SWM.
  const int sw = ty & SWM;
#pragma unroll 1
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<ST - 2>();
    __syncthreads();  // stage kt landed for all; stage kt - 1 is free again
    if (kt + ST - 1 < nk) load_stage((kt + ST - 1) % ST, kt + ST - 1);
    cp_async_commit();
    const T* as = As[kt % ST];
    const T* bs = Bs[kt % ST];
    if constexpr (A_KMAJOR) {
#pragma unroll
      for (int k = 0; k < BK; ++k) {
        Pack a0, a1, b0, b1;
        a0.v = *reinterpret_cast<const VecT*>(&as[k * BM + ty * V]);
        a1.v = *reinterpret_cast<const VecT*>(&as[k * BM + BM / 2 + ty * V]);
        b0.v = *reinterpret_cast<const VecT*>(&bs[k * BN + tx * V]);
        if constexpr (WIDE) b1.v = *reinterpret_cast<const VecT*>(&bs[k * BN + BN / 2 + tx * V]);
#pragma unroll
        for (int i = 0; i < V; ++i)
#pragma unroll
          for (int j = 0; j < V; ++j) {
            acc[i][j] += a0.e[i] * b0.e[j];
            acc[V + i][j] += a1.e[i] * b0.e[j];
            if constexpr (WIDE) {
              acc[i][V + j] += a0.e[i] * b1.e[j];
              acc[V + i][V + j] += a1.e[i] * b1.e[j];
            }
          }
      }
    } else {
#pragma unroll
      for (int kc = 0; kc < BK / V; ++kc) {
        const int col = (kc ^ sw) * V;
#pragma unroll
        for (int ka = 0; ka < V / AV; ++ka) {
          APack a[TM];
#pragma unroll
          for (int i = 0; i < TM; ++i) {
            const int row = i < V ? ty * V + i : BM / 2 + ty * V + i - V;
            a[i].v = *reinterpret_cast<const AVecT*>(&as[row * BK + col + ka * AV]);
          }
#pragma unroll
          for (int kv = 0; kv < AV; ++kv) {
            const int k = kc * V + ka * AV + kv;
            Pack b0, b1;
            b0.v = *reinterpret_cast<const VecT*>(&bs[k * BN + tx * V]);
            if constexpr (WIDE)
              b1.v = *reinterpret_cast<const VecT*>(&bs[k * BN + BN / 2 + tx * V]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
              for (int j = 0; j < V; ++j) {
                acc[i][j] += a[i].e[kv] * b0.e[j];
                if constexpr (WIDE) acc[i][V + j] += a[i].e[kv] * b1.e[j];
              }
          }
        }
      }
    }
  }
#endif

  // The epilogue recomputes the block's place rather than holding it through the loop.
  const i64 b2 = blockIdx.x, z2 = b2 / (p.nblocks * p.mblocks);
  const i64 em = p.M - (b2 / p.nblocks % p.mblocks) * BM, en = p.N - (b2 % p.nblocks) * BN;
  T* C = static_cast<T*>(p.C) + (z2 / (p.S * p.G)) * p.c_xi + (z2 / p.S % p.G) * p.c_g +
         (z2 % p.S) * p.c_s + (b2 / p.nblocks % p.mblocks) * BM * p.ldc + (b2 % p.nblocks) * BN;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int r = i < V ? ty * V + i : BM / 2 + ty * V + i - V;
    if (r >= em) continue;
#pragma unroll
    for (int h = 0; h < TN / V; ++h) {
      const int c = h * (BN / 2) + tx * V;
      if (c >= en) continue;
      VecT* dst = reinterpret_cast<VecT*>(C + r * p.ldc + c);
      Pack o;
      if (p.accumulate) o.v = *dst;
#pragma unroll
      for (int j = 0; j < V; ++j) o.e[j] = (p.accumulate ? o.e[j] : T(0)) + acc[i][h * V + j];
      *dst = o.v;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// TF32 tensor-core helpers ("3xTF32", below): the operand split and the m16n8k8 MMA. Under host
// emulation (tests/cuda/winograd/emu) the MMA is computed by the warp's lanes from fragments they
// publish in shared scratch (lane = 4 g + t holds A (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4),
// B (k = t, n = g), (t + 4, g) and C/D (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)), with
// fp32 sums in k order, each operand read as tf32 (its low 13 bits ignored, as the tensor cores
// do): the fragment mapping and the split are checked, not the hardware's rounding of sums.
#ifdef JAXDNN_WINO_EMULATION
inline float emu_f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline void emu_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                    const float (&c)[4]) {
  struct Frag {
    uint32_t a[4], b[2];
  };
  static Frag frags[32][32];  // [warp][lane]; one block runs at a time
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  Frag& mine = frags[warp][lane];
  for (int r = 0; r < 4; ++r) mine.a[r] = a[r];
  mine.b[0] = b0, mine.b[1] = b1;
  __syncwarp();
  float out[4];
  for (int r = 0; r < 4; ++r) {
    const int row = g + (r / 2) * 8, col = 2 * t + r % 2;
    float sum = c[r];
    for (int k = 0; k < 8; ++k) {
      const float av =
          emu_f(frags[warp][(row % 8) * 4 + k % 4].a[row / 8 + 2 * (k / 4)] & 0xffffe000u);
      const float bv = emu_f(frags[warp][col * 4 + k % 4].b[k / 4] & 0xffffe000u);
      sum += av * bv;
    }
    out[r] = sum;
  }
  __syncwarp();
  for (int r = 0; r < 4; ++r) d[r] = out[r];
}
#endif

__device__ __forceinline__ float f32_of_bits(uint32_t u) {
#ifdef JAXDNN_WINO_EMULATION
  return emu_f(u);
#else
  return __uint_as_float(u);
#endif
}

// x = big + small: big = x rounded to TF32 (to nearest, ties away, by an integer add into the
// 13 dropped bits: a carry moves into the exponent as it should, and inf / NaN stay inf / NaN),
// small = x - big (exact: the two are within half a TF32 step). small goes to the tensor cores
// whole, which read its top 19 bits (truncation: |error| < 2^-21 |x|, the size of the dropped
// small * small term). Three instructions; cvt.rna.tf32.f32 compiles to three for big alone.
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
#ifdef JAXDNN_WINO_EMULATION
  uint32_t u;
  std::memcpy(&u, &x, 4);
  big = (u + 0x1000u) & 0xffffe000u;
  const float rest = x - emu_f(big);
  std::memcpy(&small, &rest, 4);
#else
  big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  small = __float_as_uint(x - __uint_as_float(big));
#endif
}

// d = a * b (a zero accumulator), m16n8k8 TF32.
__device__ __forceinline__ void mma_tf32_first(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
#ifdef JAXDNN_WINO_EMULATION
  const float zero[4] = {};
  emu_mma(d, a, b0, b1, zero);
#else
  const float zero = 0.f;
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(zero));
#endif
}

// d += a * b, m16n8k8 TF32 (not volatile: the compiler may interleave independent products).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#ifdef JAXDNN_WINO_EMULATION
  const float c[4] = {d[0], d[1], d[2], d[3]};
  emu_mma(d, a, b0, b1, c);
#else
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// ---------------------------------------------------------------------------------------------
// The same batched GEMM on the tensor cores for float compute (Tc = float: float32 operands, and
// bf16/f16 operands, whose transforms are float): "3xTF32". Each operand value x splits into
// big = tf32(x) (11 significant bits, rounded to nearest) and small = x - big, of which the
// tensor cores read the next 11 bits (split_tf32), and
//   a * b ~= big_a big_b + big_a small_b + small_a big_b   (small_a small_b, ~2^-22 a b, dropped)
// as three m16n8k8 TF32 mma.sync with fp32 accumulation (small terms first): products at about
// fp32's error at a fraction of FFMA's cost (errors measured by tests/cuda/winograd/check.cu).
// Same GemmArgs, grid and zero-fill contract as gemm_kernel; CTA 128 x BN x 32 (BN = 128 wide,
// 64 narrow), 8 warps as 4 (m) x 2 (n), warp tile 32 x BN/2. Shared-memory rows are padded so
// that each fragment read (lane = 4 g + t) hits 32 distinct banks with a fixed per-thread base:
//   m-major A [BM][BK + 4]: a fragment reads rows g, columns t   -> bank 4 g + t
//   k-major A [BK][BM + 8], B [BK][BN + 8]: rows t, columns g     -> bank 8 t + g
// JAXDNN_WINO_GEMM=simt (read once) runs gemm_kernel instead, for comparisons. Under host emulation
// (tests/cuda/winograd/emulate.sh) this kernel runs only with JAXDNN_WINO_GEMM=mma.
// Compile-time knobs (tests/cuda/winograd/sweep.sh SWEEP_SET=tc): WINO_TC_UNROLL (k8 steps
// unrolled per stage), WINO_TC_MINB (CTAs per SM asked of the register allocator),
// WINO_TC_FLUSH (per-stage partial sums, below); WINO_NO_TC leaves the tensor-core kernel out.
#if !defined(WINO_NO_TC)
#define JAXDNN_WINO_TC 1
#ifndef JAXDNN_WINO_EMULATION
#define JAXDNN_WINO_WGMMA 1  // gemm_wgmma_kernel (never emulated: the host has no wgmma)
#endif
#ifndef WINO_TC_UNROLL
#define WINO_TC_UNROLL 4  // H200 sweep: 4 with 4 wide stages, vgg_c3_2 fwd 0.843 ms (1 stage-3: 0.870)
#endif
#ifndef WINO_TC_MINB
#define WINO_TC_MINB 2
#endif
#ifndef WINO_TC_FLUSH
#define WINO_TC_FLUSH 1
#endif
#ifndef WINO_TC_STAGES_WIDE  // cp.async ring depth of the wide tiles (one CTA per SM)
#define WINO_TC_STAGES_WIDE 4
#endif
constexpr bool kTcFlush = WINO_TC_FLUSH != 0;
constexpr int kTcBM = 128, kTcBK = 32, kTcK8Unroll = WINO_TC_UNROLL;
template <bool WIDE>
constexpr int tc_stages() {
  return WIDE ? WINO_TC_STAGES_WIDE : 3;
}
// Floats per stage of the A and B tiles (padded rows, see above).
template <bool A_KMAJOR>
constexpr int tc_a_floats() {
  return A_KMAJOR ? kTcBK * (kTcBM + 8) : kTcBM * (kTcBK + 4);
}
template <bool WIDE>
constexpr int tc_b_floats() {
  return kTcBK * ((WIDE ? 128 : 64) + 8);
}
template <bool A_KMAJOR, bool WIDE>
constexpr size_t tc_smem_bytes() {
  return size_t{tc_stages<WIDE>()} * (tc_a_floats<A_KMAJOR>() + tc_b_floats<WIDE>()) *
         sizeof(float);
}

template <bool A_KMAJOR, bool WIDE>
// Wide tiles with per-stage partials need ~240 registers: one CTA per SM.
__global__ void __launch_bounds__(kThreads, WIDE && kTcFlush ? 1 : WINO_TC_MINB)
    gemm_tc_kernel(GemmArgs p) {
  constexpr int BM = kTcBM, BN = WIDE ? 128 : 64, BK = kTcBK, ST = tc_stages<WIDE>();
  constexpr int WM = 32, WN = BN / 2, MT = WM / 16, NT = WN / 8;  // warp tile: MT m16 x NT n8
  constexpr int AF = tc_a_floats<A_KMAJOR>(), BF = tc_b_floats<WIDE>();
  constexpr int LA = A_KMAJOR ? BM + 8 : BK + 4, LB = BN + 8;  // padded row lengths
#ifdef JAXDNN_WINO_EMULATION
  alignas(16) static unsigned char smem_dyn[tc_smem_bytes<A_KMAJOR, WIDE>()];
#else
  extern __shared__ __align__(16) unsigned char smem_dyn[];
#endif
  float* const As = reinterpret_cast<float*>(smem_dyn);  // [ST][AF]
  float* const Bs = As + ST * AF;                         // [ST][BF]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = (warp % 4) * WM, wn = (warp / 4) * WN;
  const GemmBlock blk = gemm_block(p);
  const i64 m0 = blk.mb * BM, n0 = blk.nb * BN;
  const int klen = blk.klen;
  const float* A = static_cast<const float*>(p.A) + blk.a_off(p);
  const float* B = static_cast<const float*>(p.B) + blk.b_off(p);
  const int nk = (klen + BK - 1) / BK;

  // Stage kt as 16-byte chunks, chunk q = tid + i * kThreads; k past klen and rows / columns past
  // M / N are zeros (M, N and klen are multiples of 4 where a chunk runs along them). A chunk
  // that is not read takes the operand's base as its (unread) source.
  constexpr int ACW = (A_KMAJOR ? BM : BK) / 4, BCW = BN / 4;  // chunks per source row
  auto load_stage = [&](int buf, int kt) {
    const int kb = kt * BK;
    float* as = As + buf * AF;
    float* bs = Bs + buf * BF;
#pragma unroll
    for (int i = 0; i < BM * BK / 4 / kThreads; ++i) {
      const int q = tid + i * kThreads, row = q / ACW, c = q % ACW;
      // k-major: row = k, chunk along m; m-major: row = m, chunk along k.
      const bool ok = A_KMAJOR ? kb + row < klen && m0 + c * 4 < p.M
                               : m0 + row < p.M && kb + c * 4 < klen;
      const float* src = A_KMAJOR ? A + (kb + row) * p.lda + m0 + c * 4
                                  : A + (m0 + row) * p.lda + kb + c * 4;
      cp_async16(&as[row * LA + c * 4], ok ? src : static_cast<const float*>(p.A), ok);
    }
#pragma unroll
    for (int i = 0; i < BK * BN / 4 / kThreads; ++i) {
      const int q = tid + i * kThreads, k = q / BCW, c = q % BCW;
      const bool ok = kb + k < klen && n0 + c * 4 < p.N;
      cp_async16(&bs[k * LB + c * 4], ok ? B + (kb + k) * p.ldb + n0 + c * 4
                                         : static_cast<const float*>(p.B), ok);
    }
  };

  float acc[MT][NT][4] = {};
#pragma unroll
  for (int st = 0; st < ST - 1; ++st) {
    if (st < nk) load_stage(st, st);
    cp_async_commit();
  }
#pragma unroll 1
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<ST - 2>();
    __syncthreads();  // stage kt landed for all; stage kt - 1 is free again
    if (kt + ST - 1 < nk) load_stage((kt + ST - 1) % ST, kt + ST - 1);
    cp_async_commit();
    // This thread's fragment bases: A (row g, col t) or (k t, m g); B (k t, n g).
    const float* as = As + (kt % ST) * AF + (A_KMAJOR ? t * LA + wm + g : (wm + g) * LA + t);
    const float* bs = Bs + (kt % ST) * BF + t * LB + wn + g;
    // Tensor cores add with truncation (round toward zero), so one accumulator fed by all
    // K / 8 * 3 MMAs drifts: error linear in K (1.4e-5 at K = 2048 for F(2x2) on the H200).
    // Each stage's 12 MMAs go to a zeroed partial that is added to acc in fp32 (round to
    // nearest) -- WINO_TC_FLUSH=0 accumulates in acc directly.
    float part[MT][NT][4];
    float(&dst)[MT][NT][4] = kTcFlush ? part : acc;
    auto k8_step = [&](int k8, auto first) {
      constexpr bool kZero = decltype(first)::value && kTcFlush;
      uint32_t ab[MT][4], as_[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // a0: (g, t), a1: (g + 8, t), a2: (g, t + 4), a3: (g + 8, t + 4)
          const int m = i * 16 + (r % 2) * 8, k = k8 + (r / 2) * 4;  // past the base
          split_tf32(as[A_KMAJOR ? k * LA + m : m * LA + k], ab[i][r], as_[i][r]);
        }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        uint32_t bb[2], bs_[2];
#pragma unroll
        for (int r = 0; r < 2; ++r)  // b0: (k = t, n = g), b1: (k = t + 4, n = g)
          split_tf32(bs[(k8 + r * 4) * LB + j * 8], bb[r], bs_[r]);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          if constexpr (kZero) mma_tf32_first(dst[i][j], as_[i], bb[0], bb[1]);
          else mma_tf32(dst[i][j], as_[i], bb[0], bb[1]);
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) mma_tf32(dst[i][j], ab[i], bs_[0], bs_[1]);
#pragma unroll
        for (int i = 0; i < MT; ++i) mma_tf32(dst[i][j], ab[i], bb[0], bb[1]);
      }
    };
    k8_step(0, std::true_type{});
#pragma unroll kTcK8Unroll
    for (int k8 = 8; k8 < BK; k8 += 8) k8_step(k8, std::false_type{});
    if constexpr (kTcFlush) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[i][j][r] += part[i][j][r];
    }
  }

  // c0, c1: (row g, cols 2t, 2t + 1); c2, c3: row g + 8.
  const i64 em = p.M - m0, en = p.N - n0;
  float* C = static_cast<float*>(p.C) + blk.c_off(p) + m0 * p.ldc + n0;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int col = wn + j * 8 + 2 * t;
      if (col >= en) continue;  // N is a multiple of 8: a column pair is whole
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm + i * 16 + g + h * 8;
        if (r >= em) continue;
        float2* dst = reinterpret_cast<float2*>(C + r * p.ldc + col);
        float2 o = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        if (p.accumulate) {
          const float2 prev = *dst;
          o.x += prev.x, o.y += prev.y;
        }
        *dst = o;
      }
    }
}

#endif  // JAXDNN_WINO_TC

#ifdef JAXDNN_WINO_WGMMA
// ---------------------------------------------------------------------------------------------
// The forward-shaped batched GEMM (A m-major: forward and backward-data passes) on Hopper's
// warpgroup MMA, sm_90a: the same 3xTF32 products as gemm_tc_kernel (big_a small_b + small_a
// big_b + big_a big_b, each stage's 12 products into a zeroed partial added to the accumulator
// in fp32), same GemmArgs, grid and zero-fill contract. CTA 128 x BN x 32 (BN = 128, or 64 when
// N <= 64), two warpgroups of 64 rows each, one CTA per SM (about 194 KB of shared memory).
// tf32 wgmma reads both operands K-major from shared memory, and splitting a value takes a pass
// over it, so each K step (32 values) goes through three buffers:
//   raw ring (kWgStages deep, cp.async): A [128][32] fp32 in the 128-byte-swizzled rows wgmma
//     reads (chunk c of row r at c ^ (r % 8)); B [32][BN] as stored (n contiguous), rows padded
//     by 16 bytes;
//   split (double-buffered): the CTA's 256 threads write big(A) over the raw A in place and
//     small(A) beside it; B is transposed into K-major swizzled big(B) and small(B) rows.
// The split of step k + 1 runs while the tensor cores multiply step k (wgmma is asynchronous).
// Taken on sm_90 devices for float compute where use_wgmma_gemm() says it is the faster kernel.
constexpr int kWgBM = 128, kWgBK = 32, kWgStages = 3;
template <int BN>
struct WgGemmCfg {
  static constexpr int A_BYTES = kWgBM * 128;        // A tile: 128 rows x 32 fp32
  static constexpr int BT_BYTES = BN * 128;          // K-major B tile: BN rows x 32 fp32
  static constexpr int B_LD = BN + 4;                // raw B row pitch, floats
  static constexpr int BRAW_BYTES = kWgBK * B_LD * 4;
  // Byte offsets (every swizzled buffer 1024-aligned): raw A ring, then per split buffer
  // small(A), big(B), small(B), then the raw B ring.
  static constexpr int SPLIT_BYTES = A_BYTES + 2 * BT_BYTES;
  static constexpr int SPLIT0 = kWgStages * A_BYTES;
  static constexpr int BRAW0 = SPLIT0 + 2 * SPLIT_BYTES;
  static constexpr int BYTES = BRAW0 + kWgStages * BRAW_BYTES;
};

using gemm::smem_u32;

template <int BN>
__device__ __forceinline__ void wg_mma_tf32(float (&d)[BN / 2], uint64_t da, uint64_t db, int acc) {
  if constexpr (BN == 128) wg::mma_m64n128k8_tf32(d, da, db, acc);
  else wg::mma_m64n64k8_tf32(d, da, db, acc);
}

template <int BN>
__global__ void __launch_bounds__(kThreads, 1) gemm_wgmma_kernel(GemmArgs p) {
#ifdef JAXDNN_HAS_WGMMA
  using Cf = WgGemmCfg<BN>;
  constexpr int BM = kWgBM, BK = kWgBK, ST = kWgStages;
  extern __shared__ __align__(1024) unsigned char wg_smem[];
  unsigned char* const smem = wg_smem;  // 1024-aligned: the swizzle atoms
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wg = tid / 128;
  const GemmBlock blk = gemm_block(p);
  const i64 m0 = blk.mb * BM, n0 = blk.nb * BN;
  const int klen = blk.klen;
  const float* A = static_cast<const float*>(p.A) + blk.a_off(p);
  const float* B = static_cast<const float*>(p.B) + blk.b_off(p);
  const int nk = (klen + BK - 1) / BK;

  // Raw stage kt into ring slot st (zeros past M, N and klen; all three are multiples of 4).
  auto load = [&](int st, int kt) {
    const int kb = kt * BK;
    unsigned char* as = smem + st * Cf::A_BYTES;
#pragma unroll
    for (int i = 0; i < BM * 8 / kThreads; ++i) {  // A: 8 chunks of 16 bytes per row
      const int q = tid + i * kThreads, row = q / 8, c = q % 8;
      const bool ok = m0 + row < p.M && kb + c * 4 < klen;
      cp_async16(as + row * 128 + ((c ^ (row % 8)) * 16),
                 ok ? A + (m0 + row) * p.lda + kb + c * 4 : static_cast<const float*>(p.A), ok);
    }
    float* bs = reinterpret_cast<float*>(smem + Cf::BRAW0 + st * Cf::BRAW_BYTES);
#pragma unroll
    for (int i = 0; i < BK * BN / 4 / kThreads; ++i) {  // B: BN / 4 chunks per k row
      const int q = tid + i * kThreads, k = q / (BN / 4), c = q % (BN / 4);
      const bool ok = kb + k < klen && n0 + c * 4 < p.N;
      cp_async16(bs + k * Cf::B_LD + c * 4,
                 ok ? B + (kb + k) * p.ldb + n0 + c * 4 : static_cast<const float*>(p.B), ok);
    }
  };
  // Split ring slot st into split buffer sb: big(x) = tf32(x) rounded to nearest, small(x) =
  // x - big(x) (split_tf32). B: lane = k (32 values of a raw row), warp = groups of 4 columns n;
  // the K-major writes (row n, chunk (k / 4) ^ (n % 8)) of a warp hit 32 distinct banks.
  auto split = [&](int st, int sb) {
    unsigned char* as = smem + st * Cf::A_BYTES;
    unsigned char* sp = smem + Cf::SPLIT0 + sb * Cf::SPLIT_BYTES;
#pragma unroll
    for (int i = 0; i < BM * 8 / kThreads; ++i) {
      const int off = (tid + i * kThreads) * 16;
      float4 v = *reinterpret_cast<const float4*>(as + off);
      uint32_t b[4], s[4];
      split_tf32(v.x, b[0], s[0]);
      split_tf32(v.y, b[1], s[1]);
      split_tf32(v.z, b[2], s[2]);
      split_tf32(v.w, b[3], s[3]);
      *reinterpret_cast<uint4*>(as + off) = make_uint4(b[0], b[1], b[2], b[3]);
      *reinterpret_cast<uint4*>(sp + off) = make_uint4(s[0], s[1], s[2], s[3]);
    }
    const float* bs = reinterpret_cast<const float*>(smem + Cf::BRAW0 + st * Cf::BRAW_BYTES);
    unsigned char* bbig = sp + Cf::A_BYTES;
    unsigned char* bsmall = bbig + Cf::BT_BYTES;
    const int k = lane;
#pragma unroll
    for (int j = 0; j < BN / 4 / 8; ++j) {
      const int n4 = j * 8 + warp;
      const float4 v = *reinterpret_cast<const float4*>(bs + k * Cf::B_LD + n4 * 4);
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int n = n4 * 4 + u;
        const int off = n * 128 + (((k / 4) ^ (n % 8)) * 16) + (k % 4) * 4;
        uint32_t b, s;
        split_tf32(e[u], b, s);
        *reinterpret_cast<uint32_t*>(bbig + off) = b;
        *reinterpret_cast<uint32_t*>(bsmall + off) = s;
      }
    }
  };

  float acc[BN / 2], part[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = part[i] = 0.f;
#pragma unroll
  for (int st = 0; st < ST - 1; ++st) {
    if (st < nk) load(st, st);
    cp_async_commit();
  }
  cp_async_wait<ST - 2>();  // step 0 landed (this thread's copies) ...
  __syncthreads();          // ... and everyone's
  if (nk > 0) split(0, 0);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes -> wgmma reads
  __syncthreads();
#pragma unroll 1
  for (int kt = 0; kt < nk; ++kt) {
    const uint32_t a_big = smem_u32(smem + (kt % ST) * Cf::A_BYTES) + wg * 64 * 128;
    const uint32_t sp = smem_u32(smem + Cf::SPLIT0 + (kt % 2) * Cf::SPLIT_BYTES);
    const uint32_t a_small = sp + wg * 64 * 128, b_big = sp + Cf::A_BYTES,
                   b_small = b_big + Cf::BT_BYTES;
    fence_acc(part);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BK / 8; ++kk) {  // k8 slices: 32 bytes of each 128-byte row
      const int o = kk * 32;
      wg_mma_tf32<BN>(part, sw128_desc(a_small + o), sw128_desc(b_big + o), kk > 0);
      wg_mma_tf32<BN>(part, sw128_desc(a_big + o), sw128_desc(b_small + o), 1);
      wg_mma_tf32<BN>(part, sw128_desc(a_big + o), sw128_desc(b_big + o), 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    // Ring slot (kt - 1) % ST and split buffer (kt + 1) % 2 were last read by step kt - 1's
    // wgmma, complete (waited) before the previous iteration's closing barrier.
    if (kt + ST - 1 < nk) load((kt + ST - 1) % ST, kt + ST - 1);
    cp_async_commit();
    if (kt + 1 < nk) {
      cp_async_wait<ST - 2>();
      __syncthreads();
      split((kt + 1) % ST, (kt + 1) % 2);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_acc(part);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] += part[i];
    __syncthreads();  // the split of step kt + 1 is complete; every warpgroup is past step kt
  }
  cp_async_wait<0>();

  // Accumulator layout (m64nBN): warp w of the warpgroup holds rows 16 (w % 4) + lane / 4 (+ 8),
  // columns 8 j + 2 (lane % 4) (+ 1) in acc[4 j + {0, 1}] (and acc[4 j + {2, 3}] for row + 8).
  const i64 em = p.M - m0, en = p.N - n0;
  float* C = static_cast<float*>(p.C) + blk.c_off(p) + m0 * p.ldc + n0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wg * 64 + (warp % 4) * 16 + lane / 4 + h * 8;
    if (r >= em) continue;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = j * 8 + (lane % 4) * 2;
      if (col >= en) break;  // N is a multiple of 8: a column pair is whole
      float2* dst = reinterpret_cast<float2*>(C + r * p.ldc + col);
      float2 o = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      if (p.accumulate) {
        const float2 prev = *dst;
        o.x += prev.x, o.y += prev.y;
      }
      *dst = o;
    }
  }
#endif
}
#endif  // JAXDNN_WINO_WGMMA

// The GEMM kernels for float compute: JAXDNN_WINO_GEMM=simt runs gemm_kernel (FFMA), =mma
// gemm_tc_kernel everywhere, =wgmma gemm_wgmma_kernel for every forward-shaped pass on sm_90
// devices (tests, comparisons); by default the tensor cores, gemm_wgmma_kernel where it wins.
const char* wino_gemm_env() {
  static const char* v = std::getenv("JAXDNN_WINO_GEMM");
  return v != nullptr ? v : "";
}
bool use_tc_gemm() {
#ifdef JAXDNN_WINO_EMULATION
  return std::strcmp(wino_gemm_env(), "mma") == 0;  // emulated when asked only (slow on the host)
#elif defined(JAXDNN_WINO_TC)
  return std::strcmp(wino_gemm_env(), "simt") != 0;
#else
  return false;
#endif
}
// Forward-shaped pass (A m-major) of reduction K, N columns and `ctas` wgmma CTAs (128 x 128):
// gemm_wgmma_kernel or gemm_tc_kernel? H100, kernel-only (gpu-h100-2026-12-06-s18-wino-kernels.txt):
// wgmma is 7 % faster on vgg_c3_2 (K = 256, 3500 CTAs), slower where the K loop is short (K 64:
// r50_c2_3x3 and vgg_c1_2 by 17-20 %, K 128: r50_c3 by 3 %) or the grid is about one or two
// waves of its one CTA per SM (r50_c4 F(4x4), 288 CTAs: 4 %; r50_c5: 7 %), where gemm_tc_kernel
// runs two CTAs per SM of 128 x 64 tiles. So: K >= 256, N > 64 and at least 4 waves (132 SMs).
bool use_wgmma_gemm(i64 K, i64 N, i64 ctas) {
#ifdef JAXDNN_WINO_WGMMA
  if (!use_tc_gemm() || std::strcmp(wino_gemm_env(), "mma") == 0 || !device_is_sm90()) return false;
  if (std::strcmp(wino_gemm_env(), "wgmma") == 0) return true;
  return K >= 256 && N > 64 && ctas >= 4 * 132;
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------------
// WINOGRAD (fused) F(2x2,3x3). CTA: 32 tiles (lanes) x 32 pass output channels of one group
// (8 warps x 4 channels); input channels in blocks of CB (8 fp32 / 4 fp64: 32 KB of shared
// memory). Per block: each thread transforms one (tile, channel) into Vs, the CTA loads U's
// slice into Us, then each thread accumulates its 16 points x 4 channels.
constexpr int kFusedTiles = 32, kFusedK = 32;

template <typename T, typename To, typename Tc>
__global__ void __launch_bounds__(kThreads, sizeof(Tc) == 4 ? 2 : 1)  // fp32: 2 CTAs per SM
fused_kernel(const T* __restrict__ in, const Tc* __restrict__ U, Pass ps, i64 tiles,
             i64 tblocks, i64 kblocks, To* __restrict__ out) {
  constexpr int CB = 32 / sizeof(Tc), A = 4, A2 = 16, KPT = kFusedK / 8;
  alignas(16) WINO_SMEM Tc Vs[CB][A2][kFusedTiles];
  alignas(16) WINO_SMEM Tc Us[CB][A2][kFusedK];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const i64 blk = blockIdx.x;
  const i64 tb = blk % tblocks, kb = blk / tblocks % kblocks, g = blk / (tblocks * kblocks);
  const i64 tile0 = tb * kFusedTiles, k0 = kb * kFusedK;
  // Load role: tile tl, channel cc of the block (threads past CB * 32 idle).
  const int tl = tid / CB, cc = tid % CB;
  const i64 lt = tile0 + tl;
  const bool l_ok = tid < CB * kFusedTiles && lt < tiles;
  i64 h0 = 0, w0 = 0;
  const T* base = in;
  if (l_ok) {
    const i64 pl = lt / (ps.th * ps.tw), ti = lt / ps.tw % ps.th, tj = lt % ps.tw;
    base = in + ps.plane_off(ps.is, pl) + g * ps.Cig * ps.is.c;
    h0 = ti * 2 - ps.pad_h, w0 = tj * 2 - ps.pad_w;
  }
  const i64 point = ps.G * ps.Cgp * ps.Kgp;
  const Tc* Ug = U + g * ps.Cgp * ps.Kgp;
  Tc acc[A2][KPT] = {};
  for (i64 c0 = 0; c0 < ps.Cgp; c0 += CB) {
    if (tid < CB * kFusedTiles) {
      Tc d[A][A] = {};
      const i64 c = c0 + cc;
      if (l_ok && c < ps.Cig) {
        const T* src = base + c * ps.is.c;
#pragma unroll
        for (int u = 0; u < A; ++u) {
          const i64 h = h0 + u;
          if (h < 0 || h >= ps.H) continue;
#pragma unroll
          for (int v = 0; v < A; ++v) {
            const i64 x = w0 + v;
            if (x >= 0 && x < ps.W) d[u][v] = load_as<Tc>(src + h * ps.is.sp[1] + x * ps.is.sp[2]);
          }
        }
      }
      Tc o[A][A];
      sandwich(d, o, [](const Tc* i, Tc* r) { Tr<2>::bt(i, r); });
#pragma unroll
      for (int i = 0; i < A; ++i)
#pragma unroll
        for (int j = 0; j < A; ++j) Vs[cc][i * A + j][tl] = o[i][j];
    }
    for (int e = tid; e < CB * A2 * kFusedK; e += kThreads) {
      const int kk = e % kFusedK, xi = e / kFusedK % A2, c = e / (kFusedK * A2);
      const i64 k = k0 + kk;
      // c0 + c < Cgp always (Cgp is a multiple of CB); columns past Kgp are zero.
      Us[c][xi][kk] = k < ps.Kgp ? Ug[xi * point + (c0 + c) * ps.Kgp + k] : Tc(0);
    }
    __syncthreads();
#pragma unroll 2
    for (int c = 0; c < CB; ++c)
#pragma unroll
      for (int xi = 0; xi < A2; ++xi) {
        const Tc v = Vs[c][xi][lane];
#pragma unroll
        for (int j = 0; j < KPT; ++j) acc[xi][j] += v * Us[c][xi][warp * KPT + j];
      }
    __syncthreads();
  }
  const i64 t = tile0 + lane;
  if (t >= tiles) return;
  const TilePos pos = tile_pos(ps, t);
#pragma unroll
  for (int j = 0; j < KPT; ++j) {
    const i64 k = k0 + warp * KPT + j;
    if (k >= ps.Cog) continue;
    Tc m[A][A], y[2][2];
#pragma unroll
    for (int xi = 0; xi < A2; ++xi) m[xi / A][xi % A] = acc[xi][j];
    sandwich(m, y, [](const Tc* i, Tc* r) { Tr<2>::at(i, r); });
    store_tile(out, ps, pos, g * ps.Cog + k, y);
  }
}

// WINOGRAD (fused) F(2x2,3x3) backward-filter. CTA: (slice s of the tiles, group g, 32 input
// channels (lanes), 32 output channels (8 warps x 4)). Per block of TBt tiles (8 fp32 / 4 fp64)
// each thread transforms one (tile, input channel) of x into Vs and one (tile, output channel)
// of dy into Ds (Dy = AT^T dy AT), then accumulates the 16 per-point products over the tiles
// in registers; the slice's sums go to P[s][xi][g][c][k] and filter_grad_kernel adds the
// slices in order (deterministic) before dw = G^T (.) G.
template <typename T, typename Tc>
__global__ void __launch_bounds__(kThreads, sizeof(Tc) == 4 ? 2 : 1)
fused_wgrad_kernel(const T* __restrict__ x, const T* __restrict__ dy, Pass ps, i64 tiles,
                   i64 per_slice, i64 cblocks, i64 kblocks, Tc* __restrict__ P) {
  constexpr int TBt = 32 / sizeof(Tc), A = 4, A2 = 16, KPT = 4;
  alignas(16) WINO_SMEM Tc Vs[TBt][A2][32];
  alignas(16) WINO_SMEM Tc Ds[TBt][A2][32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const i64 blk = blockIdx.x;
  const i64 kb = blk % kblocks, cb = blk / kblocks % cblocks;
  const i64 g = blk / (kblocks * cblocks) % ps.G, s = blk / (kblocks * cblocks * ps.G);
  const i64 c0 = cb * 32, k0 = kb * 32;
  const i64 t_begin = s * per_slice, t_end = std::min(tiles, t_begin + per_slice);
  // Load role: tile tl of the block, channel ch (input channel for x, output channel for dy).
  const int tl = tid / 32, ch = tid % 32;
  const bool loader = tid < TBt * 32;
  const bool c_ok = c0 + ch < ps.Cig, k_ok = k0 + ch < ps.Cog;
  Tc acc[A2][KPT] = {};
  for (i64 tb = t_begin; tb < t_end; tb += TBt) {
    if (loader) {
      const i64 t = tb + tl;
      Tc d[A][A] = {}, y[2][2] = {};
      if (t < t_end) {
        const i64 pl = t / (ps.th * ps.tw), ti = t / ps.tw % ps.th, tj = t % ps.tw;
        if (c_ok) {
          const T* src = x + ps.plane_off(ps.is, pl) + (g * ps.Cig + c0 + ch) * ps.is.c;
          const i64 h0 = ti * 2 - ps.pad_h, w0 = tj * 2 - ps.pad_w;
#pragma unroll
          for (int u = 0; u < A; ++u) {
            const i64 h = h0 + u;
            if (h < 0 || h >= ps.H) continue;
#pragma unroll
            for (int v = 0; v < A; ++v) {
              const i64 w = w0 + v;
              if (w >= 0 && w < ps.W)
                d[u][v] = load_as<Tc>(src + h * ps.is.sp[1] + w * ps.is.sp[2]);
            }
          }
        }
        if (k_ok) {
          const T* src = dy + ps.plane_off(ps.os, pl) + (g * ps.Cog + k0 + ch) * ps.os.c;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const i64 pp = ti * 2 + i;
            if (pp >= ps.P) continue;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const i64 q = tj * 2 + j;
              if (q < ps.Q) y[i][j] = load_as<Tc>(src + pp * ps.os.sp[1] + q * ps.os.sp[2]);
            }
          }
        }
      }
      Tc v[A][A], e[A][A];
      sandwich(d, v, [](const Tc* i, Tc* r) { Tr<2>::bt(i, r); });
      sandwich(y, e, [](const Tc* i, Tc* r) { Tr<2>::a(i, r); });
#pragma unroll
      for (int i = 0; i < A; ++i)
#pragma unroll
        for (int j = 0; j < A; ++j) {
          Vs[tl][i * A + j][ch] = v[i][j];
          Ds[tl][i * A + j][ch] = e[i][j];
        }
    }
    __syncthreads();
#pragma unroll 2
    for (int t = 0; t < TBt; ++t)
#pragma unroll
      for (int xi = 0; xi < A2; ++xi) {
        const Tc v = Vs[t][xi][lane];
#pragma unroll
        for (int j = 0; j < KPT; ++j) acc[xi][j] += v * Ds[t][xi][warp * KPT + j];
      }
    __syncthreads();
  }
  const i64 c = c0 + lane;
  if (c >= ps.Cig) return;
  Tc* dst = P + ((s * A2 * ps.G + g) * ps.Cgp + c) * ps.Kgp;
  const i64 point = ps.G * ps.Cgp * ps.Kgp;
#pragma unroll
  for (int j = 0; j < KPT; ++j) {
    const i64 k = k0 + warp * KPT + j;
    if (k >= ps.Cog) continue;
#pragma unroll
    for (int xi = 0; xi < A2; ++xi) dst[xi * point + k] = acc[xi][j];
  }
}

// ---------------------------------------------------------------------------------------------
// WINOGRAD (fused) F(4x4,3x3) on the tensor cores (float compute: float32, bf16, f16 operands),
// forward-shaped passes (forward, backward-data on dy). One kernel, nothing through global
// memory but the input, U (the jaxdnn_winograd_filter operand) and the output:
//   CTA = 32 tiles (any 32 consecutive linear tiles) x 32 pass output channels of one group,
//   12 warps; warp w owns the points xi = 3w .. 3w + 2 and keeps their 32 x 32 sums in registers
//   (96 fp32 per thread). Per chunk of 8 input channels:
//     1. cp.async, two stages (ft_issue): the 32 tiles' 6 x 6 x 8 input windows (raw, in the
//        operand's dtype, zero-filled outside the image) and U's 36 x 8 x 32 slice;
//     2. ft_transform: each of 256 threads transforms one (tile, channel) window,
//        V = BT d BT^T, into Vs;
//     3. ft_products: per point, the 32 x 8 x 32 product as 2 x 4 m16n8k8 3xTF32 MMAs
//        (gemm_tc_kernel's split), each (m16, n8) block's three MMAs into a zeroed partial that
//        is added to the sums in fp32 (round to nearest; the tensor cores truncate when they add).
//   Then the sums go through shared memory (Ms) and each thread makes Y = AT M AT^T of (tile,
//   channel) pairs, cropped, in the output dtype.
// Schedule per chunk c: barrier, copies of c + 1, transform c, barrier, products c (a schedule
// with one barrier per chunk and the transform beside the products measured 1-5 % slower on the
// H200, gpu-h200-2026-12-02-s9.md). Nsight Compute showed the kernel bound by instruction issue
// (about 1670 instructions per warp per chunk against 72 mma.sync), most of it the copy loops'
// index arithmetic; so each thread now derives its copies once (FtCopies: one source pointer,
// a mask and a destination per operand, advanced by a constant per chunk), and the A fragments
// are read with ldmatrix (one instruction per 16 x 8 fragment instead of four loads).
// Scope: channels-last, pass input channels per group a multiple of 8 (whole 16-byte chunks);
// fused_tc_refusal says why otherwise (the family then runs fused_kernel's F(2x2)). Every sum
// runs over the channels in a fixed order.
// 12 warps, 3 points each: the register file is split between the SM's four schedulers, so 9
// warps would get the registers of 12 (168 a thread: the 4-point warps' sums spilled).
constexpr int kFtTiles = 32, kFtK = 32, kFtC = 8, kFtWarps = 12;
constexpr int kFtThreads = 32 * kFtWarps;
constexpr int kFtPoints = 36 / kFtWarps;  // points per warp
constexpr int kFtRawP = 36 * kFtC + 8;    // raw window stride (elements) of a tile, padded
// Us rows (input channels): B fragment reads (k = t, n = g) hit banks 8t + g (rows of 40).
// Vs rows (tiles): ldmatrix reads 8 rows of 16 bytes at a stride of 48 bytes: 8 distinct
// 16-byte bank groups.
constexpr int kFtUL = kFtK + 8;
constexpr int kFtVL = kFtC + 4;
constexpr int kFtML = kFtK + 4;  // Ms row
// Copies per thread and chunk: a tile's window rows are split between 12 threads r, two a row
// (row r / 2), so that adjacent lanes copy adjacent 16-byte parts: with 32-bit elements (two
// parts a pixel) part r % 2 of the row's 6 pixels, with 16-bit elements (a pixel's 8 channels in
// one part) pixels 3 (r % 2) .. 3 (r % 2) + 2. U's 36 x 8 rows of 8 16-byte parts go to all
// threads, a row's parts to adjacent lanes.
constexpr int kFtTileThreads = kFtThreads / kFtTiles;
constexpr int kFtUParts = kFtK / 4, kFtURowStep = kFtThreads / kFtUParts;
constexpr int kFtUCopies = 36 * kFtC / kFtURowStep;
static_assert(kFtWarps * kFtPoints == 36 && kFtTiles * kFtC <= kFtThreads && kFtTiles % 16 == 0 &&
                  kFtK % 32 == 0 && kFtTileThreads == 12 && kFtURowStep % kFtC == 0 &&
                  kFtUCopies * kFtURowStep == 36 * kFtC,
              "fused TC layout");
template <typename T>
constexpr int ft_raw_copies() {  // 16-byte copies per thread: half a window row's parts
  return 3 * (kFtC * static_cast<int>(sizeof(T)) / 16);
}
template <typename T>
constexpr size_t ft_raw_bytes() {
  return size_t{kFtTiles} * kFtRawP * sizeof(T);
}
constexpr size_t kFtUBytes = size_t{36} * kFtC * kFtUL * 4;
constexpr size_t kFtVBytes = size_t{36} * kFtTiles * kFtVL * 4;
constexpr size_t kFtMBytes = size_t{36} * kFtTiles * kFtML * 4;
template <typename T>
constexpr size_t ft_smem_bytes() {
  return std::max(2 * (ft_raw_bytes<T>() + kFtUBytes) + kFtVBytes, kFtMBytes);
}
static_assert(ft_smem_bytes<float>() <= 227 * 1024, "fused TC shared memory");

// ldmatrix.x4 of 32-bit elements: lane l gives the address of row l % 8 of matrix l / 8 (16
// bytes each) and receives element (l / 4, l % 4) of each matrix. For a 16 x 8 tf32 A tile at
// rows i = 0..15 (row stride ld floats): matrices (rows 0-7 | 8-15) x (cols 0-3 | 4-7) give the
// m16n8k8 fragment (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const float* row) {
#ifdef JAXDNN_WINO_EMULATION
  static const float* rows[32][32];  // [warp][lane]; one block runs at a time
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  rows[warp][lane] = row;
  __syncwarp();
  for (int m = 0; m < 4; ++m) std::memcpy(&r[m], rows[warp][m * 8 + lane / 4] + lane % 4, 4);
  __syncwarp();
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
#endif
}

// One thread's share of every chunk's copies, derived once per CTA: chunk ch reads its input
// window pixels at raw_src + ch * 8 + j * raw_col (copy j < ft_raw_copies, zero-filled unless
// bit j of raw_ok) into raw_dst + j * 8 of the stage, and U's rows at u_src + ch * u_chunk +
// j * u_step into u_dst + j * 6 x 8 x UL floats (zero-filled unless u_ok).
template <typename T>
struct FtCopies {
  const T* raw_src;
  i64 raw_col;  // stride of a window column (the input's column stride)
  unsigned raw_ok;
  int raw_dst;
  const float* u_src;
  i64 u_step, u_chunk;
  bool u_ok;
  int u_dst;
};

// The per-CTA view fused_tc_kernel's helpers share: its operands, block and shared buffers.
template <typename T>
struct FtBlock {
  const T* in;
  const float* U;  // the operand (a harmless source for zero-filling copies)
  T* raw;          // [2][TT][kFtRawP]
  float* us;       // [2][36][CC][UL]
  float* vs;       // [36][TT][VL]
};

template <typename T>
__device__ __forceinline__ FtCopies<T> ft_copies(const FtBlock<T>& b, const Pass& ps, i64 tile0,
                                                 i64 tiles, i64 gr, i64 k0) {
  constexpr int PX = 16 / sizeof(T), PPX = kFtC / PX, NR = ft_raw_copies<T>();
  const int tid = threadIdx.x;
  FtCopies<T> cp;
  // Input: tile tl, window row `row`, its pixels col0 .. col0 + NR - 1, part `part` of each.
  const int tl = tid / kFtTileThreads, row = tid % kFtTileThreads / 2, r2 = tid % 2;
  const int part = PPX == 2 ? r2 : 0, col0 = PPX == 2 ? 0 : 3 * r2;
  static_assert((PPX == 2 && NR == 6) || (PPX == 1 && NR == 3), "window row split");
  const i64 t = tile0 + tl;
  cp.raw_col = ps.is.sp[2];
  cp.raw_dst = tl * kFtRawP + (row * 6 + col0) * kFtC + part * PX;
  cp.raw_ok = 0;
  cp.raw_src = b.in;
  if (t < tiles) {
    const TilePos pos = tile_pos(ps, t);
    const i64 h = pos.ti * 4 - ps.pad_h + row, w0 = pos.tj * 4 - ps.pad_w + col0;
    if (h >= 0 && h < ps.H) {
#pragma unroll
      for (int j = 0; j < NR; ++j)
        if (w0 + j >= 0 && w0 + j < ps.W) cp.raw_ok |= 1u << j;
      cp.raw_src = b.in + ps.plane_off(ps.is, pos.pl) + gr * ps.Cig + h * ps.is.sp[1] +
                   w0 * ps.is.sp[2] + part * PX;
    }
  }
  // U: part up of rows R = r0 + 48 j (point R / 8, channel R % 8).
  const int up = tid % kFtUParts, r0 = tid / kFtUParts;
  const i64 point = ps.G * ps.Cgp * ps.Kgp;
  cp.u_ok = k0 + up * 4 < ps.Kgp;  // Kgp is a multiple of 8: a 4-column part is whole
  const float* Ug = b.U + gr * ps.Cgp * ps.Kgp;
  cp.u_src = cp.u_ok ? Ug + (r0 / kFtC) * point + (r0 % kFtC) * ps.Kgp + k0 + up * 4 : b.U;
  cp.u_step = cp.u_ok ? (kFtURowStep / kFtC) * point : 0;
  cp.u_chunk = cp.u_ok ? i64{kFtC} * ps.Kgp : 0;
  cp.u_dst = r0 * kFtUL + up * 4;
  return cp;
}

// cp.async of chunk ch (8 input channels) into buffer st, without a commit: the tiles' 6 x 6
// input windows, zero-filled outside the image, and U's 36 x 8 x 32 slice.
template <typename T>
__device__ __forceinline__ void ft_issue(const FtBlock<T>& b, const FtCopies<T>& cp, int st,
                                         int ch) {
  constexpr int NR = ft_raw_copies<T>();
  T* const raw = b.raw + st * kFtTiles * kFtRawP + cp.raw_dst;
  const T* const src = cp.raw_src + i64{ch} * kFtC;
#pragma unroll
  for (int j = 0; j < NR; ++j) {
    const bool ok = (cp.raw_ok >> j) & 1u;
    cp_async16_ca(raw + j * kFtC, ok ? src + j * cp.raw_col : b.in, ok);
  }
  float* const us = b.us + st * 36 * kFtC * kFtUL + cp.u_dst;
  const float* const usrc = cp.u_src + ch * cp.u_chunk;
#pragma unroll
  for (int j = 0; j < kFtUCopies; ++j)
    cp_async16(us + j * kFtURowStep * kFtUL, usrc + j * cp.u_step, cp.u_ok);
}

// V = BT d BT^T of the 256 (tile, channel) windows of raw stage st.
template <typename T>
__device__ __forceinline__ void ft_transform(const FtBlock<T>& b, int st) {
  constexpr int TT = kFtTiles, CC = kFtC;
  const int tid = threadIdx.x;
  if (tid >= TT * CC) return;
  const int tl = tid / CC, cc = tid % CC;
  const T* r = b.raw + st * TT * kFtRawP + tl * kFtRawP + cc;
  // sandwich() by hand, a window column at a time: 36 + 12 live values beside the sums.
  float tmp[6][6];
#pragma unroll
  for (int v = 0; v < 6; ++v) {
    float col[6], res[6];
#pragma unroll
    for (int u = 0; u < 6; ++u) col[u] = load_as<float>(r + (u * 6 + v) * CC);
    Tr<4>::bt(col, res);
#pragma unroll
    for (int i = 0; i < 6; ++i) tmp[i][v] = res[i];
  }
  float* dst = b.vs + tl * kFtVL + cc;
#pragma unroll
  for (int i = 0; i < 6; ++i) {
    float res[6];
    Tr<4>::bt(tmp[i], res);
#pragma unroll
    for (int j = 0; j < 6; ++j) dst[(i * 6 + j) * TT * kFtVL] = res[j];
  }
}

// This warp's points' products of one chunk: acc += V (32 x 8) x U[st] (8 x 32) per point.
template <typename T>
__device__ __forceinline__ void ft_products(const FtBlock<T>& b, int st,
                                            float (&acc)[kFtPoints][kFtTiles / 16][kFtK / 8][4]) {
  constexpr int TT = kFtTiles, KB = kFtK, CC = kFtC;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g8 = lane / 4, t4 = lane % 4;
  const float* const us = b.us + st * 36 * CC * kFtUL;
  // ldmatrix row of this lane: row (lane / 8 % 2) * 8 + lane % 8, column block lane / 16.
  const float* const vrow = b.vs + ((lane / 8 % 2) * 8 + lane % 8) * kFtVL + (lane / 16) * 4;
#pragma unroll
  for (int pp = 0; pp < kFtPoints; ++pp) {
    const int xi = warp * kFtPoints + pp;
    const float* ub = us + xi * CC * kFtUL;
    uint32_t ab[TT / 16][4], as[TT / 16][4], bb[KB / 8][2], bs[KB / 8][2];
#pragma unroll
    for (int i = 0; i < TT / 16; ++i) {
      uint32_t raw[4];
      ldsm_x4(raw, vrow + (xi * TT + i * 16) * kFtVL);
#pragma unroll
      for (int r = 0; r < 4; ++r) split_tf32(f32_of_bits(raw[r]), ab[i][r], as[i][r]);
    }
#pragma unroll
    for (int j = 0; j < KB / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // (k = t, n = g), (t + 4, g)
        const int k = t4 + r * 4;
        split_tf32(ub[k * kFtUL + j * 8 + g8], bb[j][r], bs[j][r]);
      }
#pragma unroll
    for (int i = 0; i < TT / 16; ++i)
#pragma unroll
      for (int j = 0; j < KB / 8; ++j) {
        float part[4];
        mma_tf32_first(part, as[i], bb[j][0], bb[j][1]);
        mma_tf32(part, ab[i], bs[j][0], bs[j][1]);
        mma_tf32(part, ab[i], bb[j][0], bb[j][1]);
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[pp][i][j][r] += part[r];
      }
  }
}

template <typename T, typename To>
__global__ void __launch_bounds__(kFtThreads, 1)
fused_tc_kernel(const T* __restrict__ in, const float* __restrict__ U, Pass ps, i64 tiles,
                i64 tblocks, i64 kblocks, To* __restrict__ out) {
  constexpr int TT = kFtTiles, KB = kFtK, CC = kFtC;
#ifdef JAXDNN_WINO_EMULATION
  alignas(16) static unsigned char smem[ft_smem_bytes<T>()];
#else
  extern __shared__ __align__(16) unsigned char smem[];
#endif
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g8 = lane / 4, t4 = lane % 4;
  const i64 blk = blockIdx.x;
  const i64 tb = blk % tblocks, kb = blk / tblocks % kblocks, gr = blk / (tblocks * kblocks);
  const i64 tile0 = tb * TT, k0 = kb * KB;
  FtBlock<T> b;
  b.in = in, b.U = U;
  b.raw = reinterpret_cast<T*>(smem);
  b.us = reinterpret_cast<float*>(smem + 2 * ft_raw_bytes<T>());
  b.vs = b.us + 2 * 36 * CC * kFtUL;
  const FtCopies<T> cp = ft_copies(b, ps, tile0, tiles, gr, k0);
  const int nchunks = static_cast<int>(ps.Cgp / CC);  // Cgp = Cig here (a multiple of 8)

  float acc[kFtPoints][TT / 16][KB / 8][4] = {};
  ft_issue(b, cp, 0, 0);
  cp_async_commit();
#pragma unroll 1
  for (int ch = 0; ch < nchunks; ++ch) {
    cp_async_wait<0>();
    __syncthreads();  // chunk ch landed for all; every warp is done with Vs and stage ch + 1
    if (ch + 1 < nchunks) ft_issue(b, cp, (ch + 1) & 1, ch + 1);
    cp_async_commit();
    ft_transform(b, ch & 1);
    __syncthreads();
    ft_products(b, ch & 1, acc);
  }
  __syncthreads();  // Ms overlays the stages and Vs
  float* const ms = reinterpret_cast<float*>(smem);  // [36][TT][ML]
#pragma unroll
  for (int pp = 0; pp < kFtPoints; ++pp) {
    float* m = ms + (warp * kFtPoints + pp) * TT * kFtML;
#pragma unroll
    for (int i = 0; i < TT / 16; ++i)
#pragma unroll
      for (int j = 0; j < KB / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // c0, c1: (row g, cols 2t, 2t + 1); c2, c3: row g + 8
          float* dst = m + (i * 16 + g8 + h * 8) * kFtML + j * 8 + 2 * t4;
          dst[0] = acc[pp][i][j][2 * h], dst[1] = acc[pp][i][j][2 * h + 1];
        }
  }
  __syncthreads();
  for (int idx = tid; idx < TT * KB; idx += kFtThreads) {
    const int kk = idx % KB, tl = idx / KB;
    const i64 t = tile0 + tl, k = k0 + kk;
    if (t >= tiles || k >= ps.Cog) continue;
    float mv[6][6], y[4][4];
#pragma unroll
    for (int xi = 0; xi < 36; ++xi) mv[xi / 6][xi % 6] = ms[(xi * TT + tl) * kFtML + kk];
    sandwich(mv, y, [](const float* i, float* x) { Tr<4>::at(i, x); });
    store_tile(out, ps, tile_pos(ps, t), gr * ps.Cog + k, y);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

std::string launch_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return "";
  return std::string("WINOGRAD ") + what + " launch failed: " + cudaGetErrorString(e);
}

i64 blocks_for(i64 threads) { return ceil_div(threads, kThreads); }

size_t tc_bytes(DType in) { return in == DType::kF64 ? 8 : 4; }

// Tiles per chunk of a NONFUSED pass (see the header comment). JAXDNN_WINO_CHUNK_TILES=n forces
// n (a test hook: the checker runs the multi-chunk paths on small problems).
// Forward-shaped passes (fwd, dgrad) take whole GEMM M blocks per chunk, as many as the chunk
// bytes allow, trading chunk count against wave quantization: kWaveCtas is one wave of the GEMM
// (an H200: 132 SMs x WINO_GEMM_MINB CTAs; a constant, like kWgradTargetCtas, so that the workspace size does
// not depend on the device). The chunking of a forward-shaped pass does not change any sum.
constexpr i64 kWaveCtas = 132 * WINO_GEMM_MINB;

i64 chunk_tiles(const Pass& ps, int a, size_t tc, bool fwd) {
  static const i64 forced = [] {
    const char* v = std::getenv("JAXDNN_WINO_CHUNK_TILES");
    return v != nullptr ? std::max<i64>(0, std::atoll(v)) : i64{0};
  }();
  const i64 tiles = tiles_of(ps);
  const i64 per_tile = i64{a} * a * ps.G * (ps.Cgp + ps.Kgp) * static_cast<i64>(tc);
  const i64 cap = std::max<i64>(256, kChunkBytes / std::max<i64>(per_tile, 1));
  if (forced > 0) return std::max<i64>(1, std::min(tiles, forced));
  if (!fwd || tiles <= cap) return std::max<i64>(1, std::min(tiles, cap));
  const i64 bm = tc == 8 ? gemm_bm<double>() : gemm_bm<float>();
  const i64 nbl = tc == 8 ? gemm_nblocks<double>(ps.Kgp, false) : gemm_nblocks<float>(ps.Kgp, false);
  const i64 per_mb = i64{a} * a * ps.G * nbl, mtot = ceil_div(tiles, bm);
  const i64 mb_cap = std::max<i64>(1, cap / bm);
  // Cost in tenths of a wave: the GEMM waves of all chunks, plus a tenth per chunk (launches,
  // transform tails). Fewer chunks win ties.
  i64 best = mb_cap, best_cost = -1;
  for (i64 mb = mb_cap; mb >= std::max<i64>(1, mb_cap / 2); --mb) {
    const i64 chunks = ceil_div(mtot, mb), last = mtot - (chunks - 1) * mb;
    const i64 waves = (chunks - 1) * ceil_div(mb * per_mb, kWaveCtas) +
                      ceil_div(last * per_mb, kWaveCtas);
    const i64 cost = 10 * waves + chunks;
    if (best_cost < 0 || cost < best_cost) best = mb, best_cost = cost;
  }
  return std::min(tiles, best * bm);
}

// Split count of the backward-filter GEMM and rows (tiles) per split of a chunk of TB tiles:
// the count (at most kMaxSplits, at least ~128 tiles per split) that minimizes waves of CTAs
// times the BK steps of one CTA (plus ~3 steps of prologue / epilogue); fewer splits win ties.
i64 wgrad_splits(const Pass& ps, int a, i64 TB, size_t tc) {
  const i64 bm = tc == 8 ? gemm_bm<double>() : gemm_bm<float>();
  const i64 nbl = tc == 8 ? gemm_nblocks<double>(ps.Kgp, true) : gemm_nblocks<float>(ps.Kgp, true);
  const i64 ctas = ceil_div(ps.Cgp, bm) * nbl * a * a * ps.G, TBr = round_up(TB, kPad);
  const i64 smax = std::clamp<i64>(TBr / 128, 1, kMaxSplits);
  i64 best = 1, best_cost = -1;
  for (i64 s = 1; s <= smax; ++s) {
    const i64 ks = round_up(ceil_div(TBr, s), kPad);
    const i64 cost = ceil_div(ctas * s, kWaveCtas) * (ceil_div(ks, kGemmBK) + 3);
    if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

std::string unsupported(const ConvProblem& p) {
  if (p.filt[0] != 1 || p.filt[1] != 3 || p.filt[2] != 3)
    return "Winograd kernels need a 2-D 3x3 filter (got " + std::to_string(p.filt[1]) + "x" +
           std::to_string(p.filt[2]) +
           (p.filt[0] != 1 ? " with depth " + std::to_string(p.filt[0]) : "") + ")";
  for (int a = 0; a < 3; ++a) {
    if (p.stride[a] != 1) return "Winograd kernels need window_strides 1";
    if (p.dilation[a] != 1) return "Winograd kernels need rhs_dilation 1";
    if (p.lhs_dilation[a] != 1) return "Winograd kernels need lhs_dilation 1";
  }
  if (p.pad_lo[0] != 0 || p.pad_hi[0] != 0) return "Winograd kernels cannot pad the depth axis";
  return "";
}

// Dynamic shared memory past 48 KB needs the kernel's opt-in (per device, so on every launch
// that needs it; a cheap host call). A failure shows as the launch's error.
template <typename K>
void gemm_smem_optin(K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(bytes));
  cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
}

template <typename Tc>
void gemm_launch(const GemmArgs& a0, int points, bool a_kmajor, cudaStream_t st) {
  constexpr i64 bm = gemm_bm<Tc>();
  const bool wide = gemm_wide<Tc>(a0.N, a_kmajor);
  GemmArgs a = a0;
  a.mblocks = ceil_div(a.M, bm);
  a.nblocks = gemm_nblocks<Tc>(a.N, a_kmajor);
  const i64 grid = a.mblocks * a.nblocks * points * a.G * a.S;
  // Dynamic shared memory bytes of the wide and narrow kernels (0: static arrays).
  const size_t sw = gemm_smem_dynamic<Tc, true>() ? gemm_smem_bytes<Tc, true>() : 0;
  const size_t sn = gemm_smem_dynamic<Tc, false>() ? gemm_smem_bytes<Tc, false>() : 0;
#ifdef JAXDNN_WINO_TC
  if constexpr (std::is_same_v<Tc, float>) {
#ifdef JAXDNN_WINO_WGMMA
    const i64 wg_mblocks = ceil_div(a.M, kWgBM), wg_nblocks = ceil_div(a.N, a.N > 64 ? 128 : 64);
    const i64 wgrid = wg_mblocks * wg_nblocks * points * a.G * a.S;
    if (!a_kmajor && use_wgmma_gemm(a.K, a.N, wgrid)) {
      a.mblocks = wg_mblocks;
      a.nblocks = wg_nblocks;
      if (a.N > 64) {
        gemm_smem_optin(gemm_wgmma_kernel<128>, WgGemmCfg<128>::BYTES);
        gemm_wgmma_kernel<128><<<wgrid, kThreads, WgGemmCfg<128>::BYTES, st>>>(a);
      } else {
        gemm_smem_optin(gemm_wgmma_kernel<64>, WgGemmCfg<64>::BYTES);
        gemm_wgmma_kernel<64><<<wgrid, kThreads, WgGemmCfg<64>::BYTES, st>>>(a);
      }
      return;
    }
#endif
    if (use_tc_gemm()) {
      if (a_kmajor && wide) {
        gemm_smem_optin(gemm_tc_kernel<true, true>, tc_smem_bytes<true, true>());
        gemm_tc_kernel<true, true><<<grid, kThreads, tc_smem_bytes<true, true>(), st>>>(a);
      } else if (a_kmajor) {
        gemm_smem_optin(gemm_tc_kernel<true, false>, tc_smem_bytes<true, false>());
        gemm_tc_kernel<true, false><<<grid, kThreads, tc_smem_bytes<true, false>(), st>>>(a);
      } else if (wide) {
        gemm_smem_optin(gemm_tc_kernel<false, true>, tc_smem_bytes<false, true>());
        gemm_tc_kernel<false, true><<<grid, kThreads, tc_smem_bytes<false, true>(), st>>>(a);
      } else {
        gemm_smem_optin(gemm_tc_kernel<false, false>, tc_smem_bytes<false, false>());
        gemm_tc_kernel<false, false><<<grid, kThreads, tc_smem_bytes<false, false>(), st>>>(a);
      }
      return;
    }
  }
#endif
  if (a_kmajor && wide) {
    gemm_smem_optin(gemm_kernel<Tc, true, true>, sw);
    gemm_kernel<Tc, true, true><<<grid, kThreads, sw, st>>>(a);
  } else if (a_kmajor) {
    gemm_smem_optin(gemm_kernel<Tc, true, false>, sn);
    gemm_kernel<Tc, true, false><<<grid, kThreads, sn, st>>>(a);
  } else if (wide) {
    gemm_smem_optin(gemm_kernel<Tc, false, true>, sw);
    gemm_kernel<Tc, false, true><<<grid, kThreads, sw, st>>>(a);
  } else {
    gemm_smem_optin(gemm_kernel<Tc, false, false>, sn);
    gemm_kernel<Tc, false, false><<<grid, kThreads, sn, st>>>(a);
  }
}

template <typename T, typename Tc, int M>
std::string filter_transform(const T* w, const ConvProblem& p, const Pass& ps, bool flip,
                             Tc* U, cudaStream_t st) {
  const i64 n = ps.G * ps.Cgp * ps.Kgp;
  filter_transform_kernel<T, Tc, M><<<blocks_for(n), kThreads, 0, st>>>(
      w, filter_view(p, flip), ps.G, ps.Cig, ps.Cog, ps.Cgp, ps.Kgp, U);
  return launch_error("filter transform");
}

// NONFUSED forward-shaped pass (forward, or backward-data on dy).
template <typename T, typename To, typename Tc, int M>
std::string nonfused_pass(const CudaConvCall& c, const CudaConvBuffers& io) {
  constexpr int A = M + 2, A2 = A * A;
  const ConvProblem& p = c.problem;
  const Pass ps = make_pass(c.op, p, M);
  const i64 tiles = tiles_of(ps);
  if (tiles == 0 || ps.P == 0 || ps.Q == 0) return "";
  const i64 TB = chunk_tiles(ps, A, sizeof(Tc), true), TBr = round_up(TB, kPad);
  const i64 cip = ps.G * ps.Cgp, cop = ps.G * ps.Kgp;
  const Tc* U = static_cast<const Tc*>(io.b);  // from jaxdnn_winograd_filter
  Tc* V = static_cast<Tc*>(io.workspace);
  Tc* Mo = V + A2 * TBr * cip;
  cudaStream_t st = io.stream;
  GemmArgs ga{};
  ga.A = V, ga.B = U, ga.C = Mo;
  ga.lda = cip, ga.ldb = ps.Kgp, ga.ldc = cop;
  ga.N = ps.Kgp, ga.K = ps.Cgp, ga.k_split = ps.Cgp;
  ga.G = ps.G, ga.S = 1;
  ga.a_xi = TBr * cip, ga.a_g = ps.Cgp;
  ga.b_xi = ps.G * ps.Cgp * ps.Kgp, ga.b_g = ps.Cgp * ps.Kgp;
  ga.c_xi = TBr * cop, ga.c_g = ps.Kgp;
  for (i64 t0 = 0; t0 < tiles; t0 += TB) {
    const i64 nt = std::min(TB, tiles - t0);
    const i64 in_threads = transform_threads(nt, cip, ps.is.c != 1);
    input_transform_kernel<T, Tc, M><<<blocks_for(in_threads), kThreads, 0, st>>>(
        static_cast<const T*>(io.a), ps, t0, nt, nt, TBr, V);
    if (std::string e = launch_error("input transform"); !e.empty()) return e;
    ga.M = nt;
    gemm_launch<Tc>(ga, A2, false, st);
    if (std::string e = launch_error("batched GEMM"); !e.empty()) return e;
    const i64 out_threads = transform_threads(nt, cop, ps.os.c != 1);
    output_transform_kernel<To, Tc, M><<<blocks_for(out_threads), kThreads, 0, st>>>(
        Mo, ps, t0, nt, TBr, static_cast<To*>(io.out));
    if (std::string e = launch_error("output transform"); !e.empty()) return e;
  }
  return "";
}

template <typename T, typename To, typename Tc, int M>
std::string nonfused_wgrad(const CudaConvCall& c, const CudaConvBuffers& io) {
  constexpr int A = M + 2, A2 = A * A;
  const ConvProblem& p = c.problem;
  const Pass ps = make_pass(ConvOp::kBackwardFilter, p, M);
  const i64 tiles = tiles_of(ps);
  cudaStream_t st = io.stream;
  if (tiles == 0 || ps.P == 0 || ps.Q == 0) {
    const cudaError_t e = cudaMemsetAsync(io.out, 0, p.w_elems() * sizeof(To), st);
    if (e != cudaSuccess) return std::string("WINOGRAD zero fill failed: ") + cudaGetErrorString(e);
    return "";
  }
  const i64 TB = chunk_tiles(ps, A, sizeof(Tc), false), TBr = round_up(TB, kPad);
  const i64 S = wgrad_splits(ps, A, TB, sizeof(Tc));
  const i64 cip = ps.G * ps.Cgp, cop = ps.G * ps.Kgp;
  Tc* Pp = static_cast<Tc*>(io.workspace);  // [S][A2][G][Cgp][Kgp]
  Tc* V = Pp + S * A2 * ps.G * ps.Cgp * ps.Kgp;
  Tc* D = V + A2 * TBr * cip;
  GemmArgs ga{};
  ga.A = V, ga.B = D, ga.C = Pp;
  ga.lda = cip, ga.ldb = cop, ga.ldc = ps.Kgp;
  ga.M = ps.Cgp, ga.N = ps.Kgp;
  ga.G = ps.G, ga.S = S;
  ga.a_xi = TBr * cip, ga.a_g = ps.Cgp;
  ga.b_xi = TBr * cop, ga.b_g = ps.Kgp;
  ga.c_xi = ps.G * ps.Cgp * ps.Kgp, ga.c_g = ps.Cgp * ps.Kgp, ga.c_s = A2 * ga.c_xi;
  for (i64 t0 = 0; t0 < tiles; t0 += TB) {
    const i64 nt = std::min(TB, tiles - t0), ntr = round_up(nt, kPad);
    const i64 in_threads = transform_threads(ntr, cip, ps.is.c != 1);
    input_transform_kernel<T, Tc, M><<<blocks_for(in_threads), kThreads, 0, st>>>(
        static_cast<const T*>(io.a), ps, t0, nt, ntr, TBr, V);
    if (std::string e = launch_error("input transform"); !e.empty()) return e;
    const i64 dy_threads = transform_threads(ntr, cop, ps.os.c != 1);
    dy_transform_kernel<T, Tc, M><<<blocks_for(dy_threads), kThreads, 0, st>>>(
        static_cast<const T*>(io.b), ps, t0, nt, ntr, TBr, D);
    if (std::string e = launch_error("dy transform"); !e.empty()) return e;
    // Each split's partial accumulates over the chunks (first chunk overwrites).
    ga.K = ntr;
    ga.k_split = round_up(ceil_div(ntr, S), kPad);
    ga.a_s = ga.k_split * cip, ga.b_s = ga.k_split * cop;
    ga.accumulate = t0 > 0;
    gemm_launch<Tc>(ga, A2, true, st);
    if (std::string e = launch_error("batched GEMM"); !e.empty()) return e;
  }
  filter_grad_kernel<To, Tc, M><<<blocks_for(ps.G * ps.Cig * ps.Cog), kThreads, 0, st>>>(
      Pp, S, ps.G, ps.Cig, ps.Cog, ps.Cgp, ps.Kgp, p.layout == Layout::kNHWC,
      static_cast<To*>(io.out));
  return launch_error("filter gradient transform");
}

// Why fused F(4x4,3x3) (fused_tc_kernel) cannot run a forward-shaped pass, or "".
std::string fused_tc_refusal(ConvOp op, const ConvProblem& p, DType in) {
  if (in == DType::kF64) return "WINOGRAD F(4x4,3x3) (fused) runs on the tensor cores: not float64";
  if (p.layout != Layout::kNHWC) return "WINOGRAD F(4x4,3x3) (fused) needs channels-last operands";
  if (make_pass(op, p, 4).Cig % kFtC != 0)
    return std::string("WINOGRAD F(4x4,3x3) (fused) needs ") +
           (op == ConvOp::kBackwardData ? "output" : "input") +
           " channels per group a multiple of 8";
  return "";
}

// The fused family's tile: the problem's (C++ callers: 2 or 4), else F(4x4,3x3) on the tensor
// cores (fused_tc_kernel) where it can run and the pass output is at least 4 on a side (H200,
// fp32 NHWC: 1.4-3.0x faster than fused_kernel's F(2x2) on the ResNet-50 / VGG 3x3 layers,
// benchmarks/results/gpu-h200-2026-12-01-s8.md), else F(2x2) (fused_kernel).
// JAXDNN_WINO_FUSED_TILE=2 keeps F(2x2) everywhere (comparisons). Backward-filter always runs
// F(2x2) (fused_wgrad_kernel; it takes no U).
int fused_tile(ConvOp op, const ConvProblem& p, DType in) {
  if (op == ConvOp::kBackwardFilter) return 2;
  if (p.tile != 0) return p.tile;
  static const bool f2 = [] {
    const char* v = std::getenv("JAXDNN_WINO_FUSED_TILE");
    return v != nullptr && std::strcmp(v, "2") == 0;
  }();
  if (f2 || !fused_tc_refusal(op, p, in).empty()) return 2;
  const Pass ps = make_pass(op, p, 4);
  return std::min(ps.P, ps.Q) >= 4 ? 4 : 2;
}

template <typename T, typename To>
std::string fused_tc_pass(const CudaConvCall& c, const CudaConvBuffers& io) {
  const Pass ps = make_pass(c.op, c.problem, 4);
  const i64 tiles = tiles_of(ps);
  if (tiles == 0 || ps.P == 0 || ps.Q == 0) return "";
  const i64 tblocks = ceil_div(tiles, kFtTiles), kblocks = ceil_div(ps.Cog, kFtK);
  constexpr size_t smem = ft_smem_bytes<T>();
  gemm_smem_optin(fused_tc_kernel<T, To>, smem);
  fused_tc_kernel<T, To><<<tblocks * kblocks * ps.G, kFtThreads, smem, io.stream>>>(
      static_cast<const T*>(io.a), static_cast<const float*>(io.b), ps, tiles, tblocks, kblocks,
      static_cast<To*>(io.out));
  return launch_error("fused F(4x4)");
}

template <typename T, typename To, typename Tc>
std::string fused_pass(const CudaConvCall& c, const CudaConvBuffers& io) {
  const ConvProblem& p = c.problem;
  if constexpr (std::is_same_v<Tc, float>) {
    if (fused_tile(c.op, p, c.in) == 4) return fused_tc_pass<T, To>(c, io);
  }
  const Pass ps = make_pass(c.op, p, 2);
  const i64 tiles = tiles_of(ps);
  if (tiles == 0 || ps.P == 0 || ps.Q == 0) return "";
  const Tc* U = static_cast<const Tc*>(io.b);  // from jaxdnn_winograd_filter
  cudaStream_t st = io.stream;
  const i64 tblocks = ceil_div(tiles, kFusedTiles), kblocks = ceil_div(ps.Cog, kFusedK);
  fused_kernel<T, To, Tc><<<tblocks * kblocks * ps.G, kThreads, 0, st>>>(
      static_cast<const T*>(io.a), U, ps, tiles, tblocks, kblocks, static_cast<To*>(io.out));
  return launch_error("fused");
}

// Tile slices of the fused backward-filter: {slices, tiles per slice}. Slices multiply the CTAs
// up to about kWgradTargetCtas, each slice keeping at least 64 tiles; at most 64 slices.
struct SlicePlan {
  i64 slices, per_slice;
};
SlicePlan fused_wgrad_plan(const Pass& ps, size_t tc) {
  const i64 tbt = 32 / static_cast<i64>(tc), tiles = tiles_of(ps);
  const i64 ctas = ps.G * ceil_div(ps.Cig, 32) * ceil_div(ps.Cog, 32);
  const i64 want = std::clamp<i64>(ceil_div(kWgradTargetCtas, ctas), 1,
                                   std::clamp<i64>(tiles / 64, 1, 64));
  const i64 per_slice = round_up(ceil_div(tiles, want), tbt);
  return {ceil_div(tiles, per_slice), per_slice};
}

template <typename T, typename To, typename Tc>
std::string fused_wgrad(const CudaConvCall& c, const CudaConvBuffers& io) {
  const ConvProblem& p = c.problem;
  const Pass ps = make_pass(ConvOp::kBackwardFilter, p, 2);
  const i64 tiles = tiles_of(ps);
  cudaStream_t st = io.stream;
  if (tiles == 0 || ps.P == 0 || ps.Q == 0) {
    const cudaError_t e = cudaMemsetAsync(io.out, 0, p.w_elems() * sizeof(To), st);
    if (e != cudaSuccess) return std::string("WINOGRAD zero fill failed: ") + cudaGetErrorString(e);
    return "";
  }
  const SlicePlan sp = fused_wgrad_plan(ps, sizeof(Tc));
  const i64 cblocks = ceil_div(ps.Cig, 32), kblocks = ceil_div(ps.Cog, 32);
  Tc* P = static_cast<Tc*>(io.workspace);  // [slices][16][G][Cgp][Kgp]
  fused_wgrad_kernel<T, Tc><<<sp.slices * ps.G * cblocks * kblocks, kThreads, 0, st>>>(
      static_cast<const T*>(io.a), static_cast<const T*>(io.b), ps, tiles, sp.per_slice,
      cblocks, kblocks, P);
  if (std::string e = launch_error("fused backward-filter"); !e.empty()) return e;
  filter_grad_kernel<To, Tc, 2><<<blocks_for(ps.G * ps.Cig * ps.Cog), kThreads, 0, st>>>(
      P, sp.slices, ps.G, ps.Cig, ps.Cog, ps.Cgp, ps.Kgp, p.layout == Layout::kNHWC,
      static_cast<To*>(io.out));
  return launch_error("filter gradient transform");
}

template <typename T, typename To, typename Tc>
std::string run_typed(const CudaConvCall& c, const CudaConvBuffers& io) {
  if (c.algo == ConvAlgo::kWinograd)
    return c.op == ConvOp::kBackwardFilter ? fused_wgrad<T, To, Tc>(c, io)
                                           : fused_pass<T, To, Tc>(c, io);
  const int m = tile_m(c.op, c.problem);
  const bool wgrad = c.op == ConvOp::kBackwardFilter;
  if constexpr (std::is_same_v<T, Tc>) {  // F(6x6): float32 and float64 only (compile time)
    if (m == 6) return wgrad ? nonfused_wgrad<T, To, Tc, 6>(c, io) : nonfused_pass<T, To, Tc, 6>(c, io);
  }
  if (m == 4) return wgrad ? nonfused_wgrad<T, To, Tc, 4>(c, io) : nonfused_pass<T, To, Tc, 4>(c, io);
  if (m == 2) return wgrad ? nonfused_wgrad<T, To, Tc, 2>(c, io) : nonfused_pass<T, To, Tc, 2>(c, io);
  return "WINOGRAD_NONFUSED: no F(" + std::to_string(m) + "x" + std::to_string(m) +
         ", 3x3) kernel for these dtypes";
}

}  // namespace

std::string winograd_can_implement(const CudaConvCall& c) {
  const ConvProblem& p = c.problem;
  if (std::string why = unsupported(p); !why.empty()) return why;
  // Launch geometry: the batched GEMM's grid is a*a * G * splits * tile blocks (1-D, < 2^31).
  if (p.G > 50000) return "Winograd kernels support at most 50000 groups";
  // F(6x6) is instantiated for float32 and float64 operands only (compile time; 16-bit operands
  // gain nothing from its speed that their output rounding would not hide).
  if (c.algo == ConvAlgo::kWinograd) {
    if (p.tile != 0 && p.tile != 2 && p.tile != 4)
      return "WINOGRAD (fused) runs F(2x2,3x3) or F(4x4,3x3) (tile 2 or 4)";
    if (p.tile == 4 && c.op != ConvOp::kBackwardFilter) return fused_tc_refusal(c.op, p, c.in);
    return "";
  }
  if (p.tile == 6 && c.in != DType::kF32 && c.in != DType::kF64)
    return "WINOGRAD_NONFUSED F(6x6,3x3) runs float32 and float64 operands on CUDA (use tile 2 or "
           "4, or the default, for 16-bit operands)";
  return "";
}

size_t winograd_workspace_bytes(const CudaConvCall& c) {
  if (!winograd_can_implement(c).empty()) return 0;
  const ConvProblem& p = c.problem;
  const size_t tc = tc_bytes(c.in);
  if (c.algo == ConvAlgo::kWinograd) {
    const Pass ps = make_pass(c.op, p, 2);
    if (tiles_of(ps) == 0 || ps.P == 0 || ps.Q == 0) return 0;
    if (c.op != ConvOp::kBackwardFilter) return 0;  // U is an operand
    return static_cast<size_t>(fused_wgrad_plan(ps, tc).slices * 16 * ps.G * ps.Cgp * ps.Kgp) *
           tc;
  }
  const int m = tile_m(c.op, p), a = m + 2;
  const Pass ps = make_pass(c.op, p, m);
  if (tiles_of(ps) == 0 || ps.P == 0 || ps.Q == 0) return 0;
  const i64 TB = chunk_tiles(ps, a, tc, c.op != ConvOp::kBackwardFilter);
  const i64 TBr = round_up(TB, kPad);
  // Backward-filter: S split partials of a*a G Cgp Kgp; forward and backward-data take U as an
  // operand (S = 0 here).
  const i64 S = c.op == ConvOp::kBackwardFilter ? wgrad_splits(ps, a, TB, tc) : 0;
  const i64 elems = i64{a} * a * ps.G * (S * ps.Cgp * ps.Kgp + TBr * (ps.Cgp + ps.Kgp));
  return static_cast<size_t>(elems) * tc;
}

int winograd_tile(const CudaConvCall& c) {
  return c.algo == ConvAlgo::kWinograd ? fused_tile(c.op, c.problem, c.in) : tile_m(c.op, c.problem);
}

void winograd_filter_dims(int tile, i64 G, i64 Cig, i64 Cog, int64_t dims[4]) {
  dims[0] = i64{tile + 2} * (tile + 2), dims[1] = G;
  dims[2] = round_up(Cig, kPad), dims[3] = round_up(Cog, kPad);
}

void winograd_filter_shape(const CudaConvCall& c, int* tile, int64_t dims[4]) {
  const ConvProblem& p = c.problem;
  const bool flip = c.op == ConvOp::kBackwardData;
  *tile = winograd_tile(c);
  winograd_filter_dims(*tile, p.G, flip ? p.Kg() : p.Cg(), flip ? p.Cg() : p.Kg(), dims);
}

std::string winograd_filter_run(const ConvProblem& filter, int tile, bool flip, DType w_dtype,
                                const void* w, void* u, cudaStream_t st) {
  if (tile != 2 && tile != 4 && tile != 6) return "tile must be 2, 4 or 6";
  if (std::string why = unsupported(filter); !why.empty()) return why;
  if (filter.G > 50000) return "Winograd kernels support at most 50000 groups";
  // Only the fields filter_transform reads: groups and the pass channels (padded).
  Pass ps{};
  ps.G = filter.G;
  ps.Cig = flip ? filter.Kg() : filter.Cg(), ps.Cog = flip ? filter.Cg() : filter.Kg();
  ps.Cgp = round_up(ps.Cig, kPad), ps.Kgp = round_up(ps.Cog, kPad);
  auto run = [&](auto tag_t, auto tag_tc) -> std::string {
    using T = decltype(tag_t);
    using Tc = decltype(tag_tc);
    const T* wt = static_cast<const T*>(w);
    Tc* ut = static_cast<Tc*>(u);
    if constexpr (std::is_same_v<T, Tc>) {  // F(6x6): float32 and float64 only
      if (tile == 6) return filter_transform<T, Tc, 6>(wt, filter, ps, flip, ut, st);
    }
    if (tile == 6) return "F(6x6,3x3) runs float32 and float64 filters on CUDA";
    return tile == 4 ? filter_transform<T, Tc, 4>(wt, filter, ps, flip, ut, st)
                     : filter_transform<T, Tc, 2>(wt, filter, ps, flip, ut, st);
  };
  switch (w_dtype) {
    case DType::kF32: return run(float{}, float{});
    case DType::kF64: return run(double{}, double{});
    case DType::kBF16: return run(__nv_bfloat16{}, float{});
    case DType::kF16: return run(__half{}, float{});
  }
  return "unsupported filter dtype";
}

std::string winograd_run(const CudaConvCall& c, const CudaConvBuffers& io) {
  if (!io.epi.empty()) return "Winograd kernels do not carry a fused epilogue";
  const DType in = c.in, out = c.out;
  if (in == DType::kF32) return run_typed<float, float, float>(c, io);
  if (in == DType::kF64) return run_typed<double, double, double>(c, io);
  if (in == DType::kBF16)
    return out == DType::kF32 ? run_typed<__nv_bfloat16, float, float>(c, io)
                              : run_typed<__nv_bfloat16, __nv_bfloat16, float>(c, io);
  if (in == DType::kF16)
    return out == DType::kF32 ? run_typed<__half, float, float>(c, io)
                              : run_typed<__half, __half, float>(c, io);
  return "Winograd: unsupported dtype";
}

}  // namespace jaxdnn::cuda
