// WINOGRAD_NONFUSED and WINOGRAD families: minimal filtering F(m x m, 3 x 3). NONFUSED: m = 4 or
// 2 (or 6 when asked for), in separate passes through the workspace, with the per-point channel contractions as matrix
// products (gemm.h). WINOGRAD (fused): F(2x2, 3x3), each thread taking small blocks of tiles
// through input transform, products and output transform in its own cache-resident buffers.
//
// 1-D minimal filtering F(m, 3) evaluates the correlation y[i] = sum_r g[r] d[i + r], i < m, from
// an input tile of a = m + 2 samples with a multiplications (polynomial interpolation at a points):
//   y = AT [ (G g) .* (BT d) ],   AT: m x a,  G: a x 3,  BT: a x a.
// Nesting it along rows and columns gives the 2-D tile formula for an m x m output tile:
//   Y = AT [ U .* V ] AT^T,   U = G g G^T (filter, a x a),   V = BT d BT^T (input tile, a x a).
// Summed over input channels c, output channel k of a tile is AT [ sum_c U[c][k] .* V[c] ] AT^T: for
// each of the a*a points xi, sum_c V[xi][tile][c] * U[xi][c][k] is a matrix product with
// M = tiles, N = K/G, K = C/G (per group). So a forward pass is
//   1. filter transform U[xi][g][c][k]: its own FFI call (jaxdnn_winograd_filter,
//      winograd_filter_transform below), whose result is an XLA value that the convolution call
//      takes in place of w, so that XLA shares one U between the convolutions of one filter and
//      hoists it out of loops (the filter-transform cache);
//   2. input transform V[xi][tile][c] for a chunk of tiles (workspace),
//   3. a*a*G products Mo[xi][tile][k] = V[xi] * U[xi] (gemm.h's macro kernel; U is written in
//      gemm's packed-B panel format by step 1, so no product repacks it),
//   4. output transform Y = AT Mo AT^T, cropped to the output extent.
// Tile geometry: output tile (i, j) of a plane covers output rows [i*m, i*m + m) and columns
// [j*m, j*m + m); it reads input rows i*m - pad_lo + [0, a) (zero outside the image: padding, or
// rows only cropped outputs read), and likewise columns. Images smaller than a tile are one tile.
//
// Backward-data is the same pass on dy with the spatially flipped, channel-swapped filter
// w'(r, s, k, c) = w(2 - r, 2 - s, c, k) and padding 2 - pad (stride 1); its U is the transform
// of w' (the transform call's flip attribute).
// Backward-filter is the adjoint of the forward in the filter: with Dy = AT^T dy_tile AT (a x a),
//   <dy, AT (U .* V) AT^T> = <Dy .* V, G g G^T> = <G^T (Dy .* V) G, g>, so
//   dw[c][k] = G^T [ sum_tiles V[c] .* Dy[k] ] G,
// where the sum over tiles is, per point xi, the product V[xi]^T * Dy[xi] (reduction over tiles).
//
// Points: F(2, 3) interpolates at 0, 1, -1, inf; F(4, 3) at 0, 1, -1, 2, -2, inf; F(6, 3) at 0,
// 1, -1, 2, -2, 1/2, -1/2, inf. F(6x6) does 64 multiplications per 36 outputs (1.78 per output),
// F(4x4) 36 per 16 (2.25), F(2x2) 16 per 4 (4), against 9 for direct. The larger tiles' larger
// constants cost accuracy (measured float32 relative errors against float64: algorithms.py's
// FAMILY_NOTES, tests/tolerances.py); tile_m() below picks F(4x4) or F(2x2) per problem, and
// F(6x6) runs only when asked for (ConvProblem::tile, jaxdnn's "winograd_nonfused_f6x6").
//
// The 3-D descriptor is handled with depth 1-filters only: each depth slice is an independent plane.
#include <algorithm>
#include <cstring>
#include <string>

#include "conv_cpu.h"
#include "float16.h"
#include "gemm.h"
#include "parallel.h"

namespace jaxdnn::cpu {
namespace {

template <int I, int J>
struct Mat {
  double v[I][J];
};

template <int I, int J>
constexpr Mat<J, I> transposed(const Mat<I, J>& m) {
  Mat<J, I> t{};
  for (int i = 0; i < I; ++i)
    for (int j = 0; j < J; ++j) t.v[j][i] = m.v[i][j];
  return t;
}

// Transform matrices of F(m, 3): BT (input), G (filter), AT (output).
template <int M>
struct Wino;

template <>
struct Wino<2> {
  static constexpr int A = 4;
  // Points 0, 1, -1, inf.
  static constexpr Mat<4, 4> BT{{{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}}};
  static constexpr Mat<4, 3> G{{{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}}};
  static constexpr Mat<2, 4> AT{{{1, 1, 1, 0}, {0, 1, -1, -1}}};
};

template <>
struct Wino<4> {
  static constexpr int A = 6;
  // Points 0, 1, -1, 2, -2, inf. Row i of BT holds the coefficients of the Lagrange-style basis
  // for point i (times a common scale moved into G), AT row j evaluates x^j at the points.
  static constexpr Mat<6, 6> BT{{{4, 0, -5, 0, 1, 0},
                                 {0, -4, -4, 1, 1, 0},
                                 {0, 4, -4, -1, 1, 0},
                                 {0, -2, -1, 2, 1, 0},
                                 {0, 2, -1, -2, 1, 0},
                                 {0, 4, 0, -5, 0, 1}}};
  static constexpr Mat<6, 3> G{{{1.0 / 4, 0, 0},
                                {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                {0, 0, 1}}};
  static constexpr Mat<4, 6> AT{{{1, 1, 1, 1, 1, 0},
                                 {0, 1, -1, 2, -2, 0},
                                 {0, 1, 1, 4, 4, 0},
                                 {0, 1, -1, 8, -8, 1}}};
};

template <>
struct Wino<6> {
  static constexpr int A = 8;
  // Points 0, 1, -1, 2, -2, 1/2, -1/2, inf, in the usual (Lavin and Gray) normalisation: BT row i
  // holds prod_{j != i} (x - p_j) (the last row prod_j (x - p_j)), up to a sign and a power of
  // two; G row i is (1, p_i, p_i^2) / prod_{j != i} (p_i - p_j); AT row j evaluates x^j. Per-point
  // rescalings (AT column i * s, G row i / s, or between G and BT) were measured by float32
  // emulation (C = 64 .. 1024): powers of two change no rounding at all, and norm-equilibrating
  // ones (non-powers of two) moved the error by under 2%, never down; so these exact matrices.
  static constexpr Mat<8, 8> BT{{{1, 0, -21.0 / 4, 0, 21.0 / 4, 0, -1, 0},
                                 {0, 1, 1, -17.0 / 4, -17.0 / 4, 1, 1, 0},
                                 {0, -1, 1, 17.0 / 4, -17.0 / 4, -1, 1, 0},
                                 {0, 0.5, 0.25, -2.5, -1.25, 2, 1, 0},
                                 {0, -0.5, 0.25, 2.5, -1.25, -2, 1, 0},
                                 {0, 2, 4, -2.5, -5, 0.5, 1, 0},
                                 {0, -2, 4, 2.5, -5, -0.5, 1, 0},
                                 {0, -1, 0, 21.0 / 4, 0, -21.0 / 4, 0, 1}}};
  static constexpr Mat<8, 3> G{{{1, 0, 0},
                                {-2.0 / 9, -2.0 / 9, -2.0 / 9},
                                {-2.0 / 9, 2.0 / 9, -2.0 / 9},
                                {1.0 / 90, 1.0 / 45, 2.0 / 45},
                                {1.0 / 90, -1.0 / 45, 2.0 / 45},
                                {32.0 / 45, 16.0 / 45, 8.0 / 45},
                                {32.0 / 45, -16.0 / 45, 8.0 / 45},
                                {0, 0, 1}}};
  static constexpr Mat<6, 8> AT{{{1, 1, 1, 1, 1, 1, 1, 0},
                                 {0, 1, -1, 2, -2, 0.5, -0.5, 0},
                                 {0, 1, 1, 4, 4, 0.25, 0.25, 0},
                                 {0, 1, -1, 8, -8, 0.125, -0.125, 0},
                                 {0, 1, 1, 16, 16, 1.0 / 16, 1.0 / 16, 0},
                                 {0, 1, -1, 32, -32, 1.0 / 32, -1.0 / 32, 1}}};
};

// Channels transformed together (one vector register of floats).
constexpr int kCB = 16;
// Workspace for the transformed input and output of one chunk of tiles.
constexpr int64_t kChunkBytes = int64_t{3} << 20;
// Tiles per block of the fused variant (its per-thread buffers hold 16 * kFusedTiles * channels).
constexpr int64_t kFusedTiles = 24;

// y[i][j][c] = sum_{u, v} L[i][u] x[u][v][c] R[j][v] for all kCB channels c (x: [U][V][kCB],
// y: [I][J][kCB]). The matrices are compile-time constants, so zero terms fold away.
template <typename T, int I, int U, int J, int V>
__attribute__((always_inline)) inline void sandwich(const Mat<I, U>& L, const Mat<J, V>& R,
                                                    const T* x, T* y) {
  T tmp[I][V][kCB];
#pragma GCC unroll 8
  for (int i = 0; i < I; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      T acc[kCB] = {};
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        if (L.v[i][u] == 0) continue;
        const T l = T(L.v[i][u]);
        for (int c = 0; c < kCB; ++c) acc[c] += l * x[(u * V + v) * kCB + c];
      }
      std::memcpy(tmp[i][v], acc, sizeof(acc));
    }
#pragma GCC unroll 8
  for (int i = 0; i < I; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) {
      T acc[kCB] = {};
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) {
        if (R.v[j][v] == 0) continue;
        const T r = T(R.v[j][v]);
        for (int c = 0; c < kCB; ++c) acc[c] += r * tmp[i][v][c];
      }
      std::memcpy(y + (i * J + j) * kCB, acc, sizeof(acc));
    }
}

// dst[0, kCB) = src[c * stride] for c < n, zero beyond (a whole contiguous block is one copy).
template <typename T>
inline void load_block(T* dst, const T* src, int64_t stride, int64_t n) {
  if (n == kCB && stride == 1) {
    std::memcpy(dst, src, sizeof(T) * kCB);
    return;
  }
  for (int64_t c = 0; c < n; ++c) dst[c] = src[c * stride];
  for (int64_t c = n; c < kCB; ++c) dst[c] = T(0);
}

// dst[c * stride] = src[c] for c < n.
template <typename T>
inline void store_block(T* dst, const T* src, int64_t stride, int64_t n) {
  if (n == kCB && stride == 1) {
    std::memcpy(dst, src, sizeof(T) * kCB);
    return;
  }
  for (int64_t c = 0; c < n; ++c) dst[c * stride] = src[c];
}

// One forward-shaped pass: `in` (Ci channels, H x W planes) correlated with a 3x3 filter into
// `out` (Co channels, P x Q planes), padding pad_h / pad_w before the first row / column.
struct Pass {
  int64_t planes = 0, depth = 1;  // planes = N * depth (depth slices are independent)
  int64_t H = 0, W = 0, P = 0, Q = 0, pad_h = 0, pad_w = 0;
  int64_t Ci = 0, Co = 0, G = 1;
  ActStrides is{}, os{};
  int64_t Cig() const { return Ci / G; }
  int64_t Cog() const { return Co / G; }
  // Offset of plane `pl` (= n * depth + d) in a tensor with strides s.
  int64_t plane_off(const ActStrides& s, int64_t pl) const {
    return (pl / depth) * s.n + (pl % depth) * s.sp[0];
  }
};

int64_t tiles_of(const Pass& ps, int m) {
  return ps.planes * ((ps.P + m - 1) / m) * ((ps.Q + m - 1) / m);
}

// Tiles per chunk: the transformed input and output of a chunk take about kChunkBytes.
int64_t chunk_tiles(int64_t tiles, int a, int64_t ch_in, int64_t ch_out, size_t elem) {
  const int64_t per_tile = int64_t{a} * a * (ch_in + ch_out) * static_cast<int64_t>(elem);
  const int64_t tb = std::max<int64_t>(96, kChunkBytes / std::max<int64_t>(per_tile, 1));
  return std::max<int64_t>(1, std::min(tiles, tb));
}

// The pass of an operation: forward reads x and writes y; backward-data reads dy and writes dx;
// backward-filter's tiles are the forward's (input x, output extent of dy).
Pass make_pass(ConvOp op, const ConvProblem& p) {
  const bool nhwc = p.layout == Layout::kNHWC;
  Pass ps;
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
  return ps;
}

// The output tile edge: the problem's explicit tile (2, 4 or 6) when it has one, else F(4x4, 3x3)
// unless the pass output is smaller than 4 on a side (where a 4x4 tile is mostly cropped and
// F(2x2, 3x3) does fewer multiplications). An explicit tile is used whatever the output size
// (tiles past the output are cropped), so the backward operations keep the forward's tile.
int tile_m(const Pass& ps, int tile) {
  if (tile != 0) return tile;
  return std::min(ps.P, ps.Q) >= 4 ? 4 : 2;
}

// The 3x3 filter of a pass as strides: element (group g, pass input channel c, pass output
// channel k, tap (r, s)) at w[g * sg + c * sc + k * sk + r * sr + s * ss + base].
// Forward: NHWC w[R][S][Cg][K], NCHW w[K][Cg][R][S]. Backward-data reads the forward filter
// flipped and channel-swapped, w'(r, s, c, k) = w(2 - r, 2 - s, k, c): swap sc and sk, negate sr
// and ss and start at tap (2, 2).
struct FilterView {
  int64_t sg, sc, sk, sr, ss, base;
};

FilterView filter_view(const ConvProblem& p, bool flip_swap) {
  const int64_t Cg = p.Cg(), Kg = p.Kg(), K = p.K;
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

// Input transform of tiles [t0, t0 + nt) of `in` into V[xi][t - t0][ci] (row stride Ci, point
// stride TB * Ci).
template <typename T, int M>
void input_transform(const Pass& ps, const T* in, int64_t t0, int64_t nt, int64_t TB, T* V) {
  constexpr int A = Wino<M>::A;
  const int64_t th = (ps.P + M - 1) / M, tw = (ps.Q + M - 1) / M;
  parallel_for(nt, [&](int64_t b, int64_t e) {
    alignas(64) T d[A * A * kCB], v[A * A * kCB];
    for (int64_t tt = b; tt < e; ++tt) {
      const int64_t t = t0 + tt, pl = t / (th * tw), ti = t / tw % th, tj = t % tw;
      const T* base = in + ps.plane_off(ps.is, pl);
      const int64_t h0 = ti * M - ps.pad_h, w0 = tj * M - ps.pad_w;
      for (int64_t c0 = 0; c0 < ps.Ci; c0 += kCB) {
        const int64_t cb = std::min<int64_t>(kCB, ps.Ci - c0);
        for (int u = 0; u < A; ++u)
          for (int q = 0; q < A; ++q) {
            T* dst = d + (u * A + q) * kCB;
            const int64_t h = h0 + u, w = w0 + q;
            if (h < 0 || h >= ps.H || w < 0 || w >= ps.W) {
              std::fill(dst, dst + kCB, T(0));
              continue;
            }
            load_block(dst, base + h * ps.is.sp[1] + w * ps.is.sp[2] + c0 * ps.is.c, ps.is.c, cb);
          }
        sandwich<T>(Wino<M>::BT, Wino<M>::BT, d, v);
        for (int xi = 0; xi < A * A; ++xi)
          store_block(V + (xi * TB + tt) * ps.Ci + c0, v + xi * kCB, 1, cb);
      }
    }
  }, 4);
}

// Output transform of tiles [t0, t0 + nt): Y = AT Mo AT^T from Mo[xi][t - t0][k] (point stride
// TB * Co), cropped to the P x Q output.
// `epi` (forward only, else null): the fused epilogue, applied to each finished tile: per row
// of the tile (its pixels are contiguous) channels-last, per stored block of kCB channels of one
// pixel channels-first.
template <typename T, int M>
void output_transform(const Pass& ps, T* out, int64_t t0, int64_t nt, int64_t TB, const T* Mo,
                      const CpuEpilogue<T>* epi) {
  constexpr int A2 = Wino<M>::A * Wino<M>::A;
  const int64_t th = (ps.P + M - 1) / M, tw = (ps.Q + M - 1) / M;
  parallel_for(nt, [&](int64_t b, int64_t e) {
    alignas(64) T m[A2 * kCB], y[M * M * kCB];
    for (int64_t tt = b; tt < e; ++tt) {
      const int64_t t = t0 + tt, pl = t / (th * tw), ti = t / tw % th, tj = t % tw;
      T* base = out + ps.plane_off(ps.os, pl);
      const int64_t mh = std::min<int64_t>(M, ps.P - ti * M);
      const int64_t mw = std::min<int64_t>(M, ps.Q - tj * M);
      for (int64_t k0 = 0; k0 < ps.Co; k0 += kCB) {
        const int64_t kb = std::min<int64_t>(kCB, ps.Co - k0);
        for (int xi = 0; xi < A2; ++xi)
          load_block(m + xi * kCB, Mo + (xi * TB + tt) * ps.Co + k0, 1, kb);
        sandwich<T>(Wino<M>::AT, Wino<M>::AT, m, y);
        for (int64_t i = 0; i < mh; ++i)
          for (int64_t j = 0; j < mw; ++j) {
            T* dst = base + (ti * M + i) * ps.os.sp[1] + (tj * M + j) * ps.os.sp[2] + k0 * ps.os.c;
            store_block(dst, y + (i * M + j) * kCB, ps.os.c, kb);
            if (epi && ps.os.c != 1) epi->apply(dst, kb, ps.os.c, k0, 1);
          }
      }
      if (epi && ps.os.c == 1)
        for (int64_t i = 0; i < mh; ++i)
          epi->apply_channels_last(base + (ti * M + i) * ps.os.sp[1] + tj * M * ps.os.sp[2],
                                   mw * ps.Co, 0);
    }
  }, 4);
}

// One (point, group) filter matrix U (Cg x Kg) in gemm's packed-B format (gemm.h): blocks of KC
// rows; in block b (kc rows), sliver s of NR columns at b * KC * Npad + s * kc * NR, element
// (c, k) at + (c % KC) * NR + k % NR. Columns Kg..Npad are zero.
template <typename T>
struct PackedU {
  int64_t Cg, Npad;
  PackedU(int64_t cg, int64_t kg) : Cg(cg), Npad(gemm_round_up(kg, GemmShape<T>::NR)) {}
  int64_t size() const { return Cg * Npad; }
  int64_t off(int64_t c, int64_t k) const {
    constexpr int KC = GemmShape<T>::KC, NR = GemmShape<T>::NR;
    const int64_t b = c / KC, kc = std::min<int64_t>(KC, Cg - b * KC);
    return b * KC * Npad + (k / NR) * kc * NR + (c % KC) * NR + k % NR;
  }
};

// Mo[xi][:, g] (nt x Kg, row stride Co) = V[xi][:, g] (nt x Cg, row stride Ci) * U[xi][g], per
// point xi, group g and block of MC tiles: pack the V block, run gemm's macro kernel on the
// pre-packed U.
template <typename T>
void point_products(int64_t A2, int64_t G, int64_t nt, int64_t TB, int64_t Ci, int64_t Co,
                    const PackedU<T>& pu, int64_t Kg, const T* V, const T* U, T* Mo) {
  constexpr int MR = GemmShape<T>::MR, KC = GemmShape<T>::KC, MC = GemmShape<T>::MC;
  const int64_t Cg = pu.Cg, mblocks = (nt + MC - 1) / MC;
  parallel_for(A2 * G * mblocks, [&](int64_t b, int64_t e) {
    T* Ap = gemm_scratch<T>(0, static_cast<size_t>(MC) * KC);
    T* rows[MC];
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t xi = idx / (G * mblocks), g = idx / mblocks % G, i0 = idx % mblocks * MC;
      const int64_t mc = std::min<int64_t>(MC, nt - i0), mpad = gemm_round_up(mc, MR);
      const T* A = V + xi * TB * Ci + g * Cg;
      const T* Bp = U + (xi * G + g) * pu.size();
      T* C = Mo + xi * TB * Co + g * Kg;
      for (int64_t i = 0; i < mc; ++i) rows[i] = C + (i0 + i) * Co;
      for (int64_t k0 = 0, blk = 0; k0 < Cg; k0 += KC, ++blk) {
        const int64_t kc = std::min<int64_t>(KC, Cg - k0);
        gemm_pack_a_strided<T>(Ap, A, Ci, 1, i0, mc, k0, kc);
        for (int64_t i = mc; i < mpad; ++i) std::memset(Ap + i * KC, 0, sizeof(T) * kc);
        gemm_macro<T>(mc, Kg, kc, Ap, Bp + blk * KC * pu.Npad, T(1), blk == 0 ? T(0) : T(1),
                      rows, 1, 0);
      }
    }
  });
}

// U = G g G^T of a pass's filter (w read through the view wf, element type S converted by
// `cvt`), per (group, pass input channel, block of output channels), into the packed panels
// [A2][G] of PackedU (zero columns past Kg).
template <typename T, int M, typename S, typename Cvt>
void filter_transform(const S* w, const FilterView& wf, int64_t G, int64_t Cg, int64_t Kg,
                      T* U, Cvt cvt) {
  constexpr int A = Wino<M>::A, A2 = A * A;
  const PackedU<T> pu(Cg, Kg);
  if (pu.Npad != Kg)
    parallel_for(A2 * G * pu.size(), [&](int64_t b, int64_t e) { std::fill(U + b, U + e, T(0)); },
                 int64_t{1} << 14);
  const int64_t kblocks = (Kg + kCB - 1) / kCB;
  parallel_for(G * Cg * kblocks, [&](int64_t b, int64_t e) {
    alignas(64) T g9[9 * kCB], u[A2 * kCB];
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t g = idx / (Cg * kblocks), c = idx / kblocks % Cg, k0 = idx % kblocks * kCB;
      const int64_t kb = std::min<int64_t>(kCB, Kg - k0);
      const S* src = w + wf.base + g * wf.sg + c * wf.sc + k0 * wf.sk;
      for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s) {
          T* dst = g9 + (r * 3 + s) * kCB;
          const S* tap = src + r * wf.sr + s * wf.ss;
          for (int64_t k = 0; k < kb; ++k) dst[k] = T(cvt(tap[k * wf.sk]));
          for (int64_t k = kb; k < kCB; ++k) dst[k] = T(0);
        }
      sandwich<T>(Wino<M>::G, Wino<M>::G, g9, u);
      for (int xi = 0; xi < A2; ++xi) {
        T* dst = U + (xi * G + g) * pu.size();
        if constexpr (GemmShape<T>::NR % kCB == 0) {
          // A block of kCB columns lies contiguously inside one packed sliver.
          store_block(dst + pu.off(c, k0), u + xi * kCB, 1, kb);
        } else {
          for (int64_t k = 0; k < kb; ++k) dst[pu.off(c, k0 + k)] = u[xi * kCB + k];
        }
      }
    }
  }, 4);
}

// Steps 2-4 of a forward-shaped pass on the transformed filter U (filter_transform's packed
// panels, from the jaxdnn_winograd_filter call).
// fused == false (WINOGRAD_NONFUSED): steps 2-4 each run over a whole chunk of TB tiles, in
// parallel within the step. fused == true (WINOGRAD): each thread takes blocks of kFusedTiles
// tiles through steps 2-4 in its own cache-resident buffers (no workspace at all); the nested
// steps run serially on that thread.
template <typename T, int M>
void forward_pass(const Pass& ps, const T* in, T* out, const T* U, bool fused, void* workspace,
                  const CpuEpilogue<T>* epi) {
  constexpr int A = Wino<M>::A, A2 = A * A;
  const int64_t G = ps.G, Cg = ps.Cig(), Kg = ps.Cog();
  const int64_t tiles = tiles_of(ps, M);
  if (tiles == 0) return;  // empty output
  const int64_t TB = fused ? 0 : chunk_tiles(tiles, A, ps.Ci, ps.Co, sizeof(T));
  const PackedU<T> pu(Cg, Kg);
  T* V = static_cast<T*>(workspace);  // [A2][TB][Ci]
  T* Mo = V + A2 * TB * ps.Ci;        // [A2][TB][Co]
  if (fused) {
    const int64_t FB = kFusedTiles;
    parallel_for((tiles + FB - 1) / FB, [&](int64_t b, int64_t e) {
      T* Vb = gemm_scratch<T>(2, static_cast<size_t>(A2 * FB * ps.Ci));
      T* Mb = gemm_scratch<T>(3, static_cast<size_t>(A2 * FB * ps.Co));
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t t0 = blk * FB, nt = std::min(FB, tiles - t0);
        input_transform<T, M>(ps, in, t0, nt, FB, Vb);
        point_products<T>(A2, G, nt, FB, ps.Ci, ps.Co, pu, Kg, Vb, U, Mb);
        output_transform<T, M>(ps, out, t0, nt, FB, Mb, epi);
      }
    }, 1, 2);
    return;
  }
  for (int64_t t0 = 0; t0 < tiles; t0 += TB) {
    const int64_t nt = std::min(TB, tiles - t0);
    // 2. V = BT d BT^T.
    input_transform<T, M>(ps, in, t0, nt, TB, V);
    // 3. Mo[xi] = V[xi] * U[xi], per group.
    point_products<T>(A2, G, nt, TB, ps.Ci, ps.Co, pu, Kg, V, U, Mo);
    // 4. Y = AT Mo AT^T, cropped to P x Q.
    output_transform<T, M>(ps, out, t0, nt, TB, Mo, epi);
  }
}

// Dy = AT^T dy_tile AT for tiles t0 + [b, e) into D[xi][t - t0][k] (point stride TB * K), the dy
// tile zero past the output extent.
template <typename T, int M>
void dy_transform(const Pass& ps, const T* dy, int64_t K, int64_t t0, int64_t b, int64_t e,
                  int64_t TB, T* D) {
  constexpr int A = Wino<M>::A, A2 = A * A;
  static constexpr Mat<A, M> ATt = transposed(Wino<M>::AT);
  const int64_t th = (ps.P + M - 1) / M, tw = (ps.Q + M - 1) / M;
  alignas(64) T d[M * M * kCB], v[A2 * kCB];
  for (int64_t tt = b; tt < e; ++tt) {
    const int64_t t = t0 + tt, pl = t / (th * tw), ti = t / tw % th, tj = t % tw;
    const T* base = dy + ps.plane_off(ps.os, pl);
    const int64_t mh = std::min<int64_t>(M, ps.P - ti * M), mw = std::min<int64_t>(M, ps.Q - tj * M);
    for (int64_t k0 = 0; k0 < K; k0 += kCB) {
      const int64_t kb = std::min<int64_t>(kCB, K - k0);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < M; ++j) {
          T* dst = d + (i * M + j) * kCB;
          if (i >= mh || j >= mw) {
            std::fill(dst, dst + kCB, T(0));
            continue;
          }
          load_block(dst, base + (ti * M + i) * ps.os.sp[1] + (tj * M + j) * ps.os.sp[2] +
                              k0 * ps.os.c, ps.os.c, kb);
        }
      sandwich<T>(ATt, ATt, d, v);
      for (int xi = 0; xi < A2; ++xi) store_block(D + (xi * TB + tt) * K + k0, v + xi * kCB, 1, kb);
    }
  }
}

// Macc[xi][g] (+)= V[xi][:, g]^T * D[xi][:, g] over nt tiles (point strides TB * C, TB * K), for
// the (point, group) pairs idx = xi * G + g in [b, e).
template <typename T>
void tile_sum_products(const ConvProblem& p, int64_t nt, int64_t TB, const T* V, const T* D,
                       bool accumulate, T* Macc, int64_t b, int64_t e) {
  const int64_t G = p.G, Cg = p.Cg(), Kg = p.Kg(), C = p.C, K = p.K;
  for (int64_t idx = b; idx < e; ++idx) {
    const int64_t xi = idx / G, g = idx % G;
    gemm<T>(true, false, Cg, Kg, nt, T(1), V + xi * TB * C + g * Cg, C, D + xi * TB * K + g * Kg,
            K, accumulate ? T(1) : T(0), Macc + (xi * G + g) * Cg * Kg, Kg);
  }
}

// dw = G^T Macc G per (group, input channel, block of output channels).
template <typename T, int M>
void filter_grad_transform(const ConvProblem& p, const T* Macc, T* dw) {
  constexpr int A = Wino<M>::A, A2 = A * A;
  static constexpr Mat<3, A> Gt = transposed(Wino<M>::G);
  const bool nhwc = p.layout == Layout::kNHWC;
  const int64_t G = p.G, Cg = p.Cg(), Kg = p.Kg(), K = p.K;
  const int64_t kblocks = (Kg + kCB - 1) / kCB;
  parallel_for(G * Cg * kblocks, [&](int64_t b, int64_t e) {
    alignas(64) T m[A2 * kCB], w9[9 * kCB];
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t g = idx / (Cg * kblocks), c = idx / kblocks % Cg, k0 = idx % kblocks * kCB;
      const int64_t kb = std::min<int64_t>(kCB, Kg - k0);
      for (int xi = 0; xi < A2; ++xi)
        load_block(m + xi * kCB, Macc + ((xi * G + g) * Cg + c) * Kg + k0, 1, kb);
      sandwich<T>(Gt, Gt, m, w9);
      for (int rs = 0; rs < 9; ++rs)
        for (int64_t k = 0; k < kb; ++k) {
          const int64_t kk = k0 + k;
          const int64_t off = nhwc ? (rs * Cg + c) * K + g * Kg + kk : ((g * Kg + kk) * Cg + c) * 9 + rs;
          dw[off] = w9[rs * kCB + k];
        }
    }
  }, 4);
}

// Slices of the fused backward-filter: each sums its share of the tile blocks into its own
// accumulator, and the slices are added in a fixed order, so the result does not depend on the
// thread count. Chosen from the problem alone (the workspace size depends on it): at most 8, and
// at most 64 MB of accumulators.
int64_t fused_wgrad_slices(const ConvProblem& p, int64_t tiles, size_t elem_bytes) {
  const int64_t blocks = (tiles + kFusedTiles - 1) / kFusedTiles;
  const int64_t acc_bytes = 16 * p.G * p.Cg() * p.Kg() * static_cast<int64_t>(elem_bytes);
  const int64_t by_memory = std::max<int64_t>(1, (int64_t{64} << 20) / std::max<int64_t>(acc_bytes, 1));
  return std::max<int64_t>(1, std::min({blocks, int64_t{8}, by_memory}));
}

// Backward-filter: dw[c][k] = G^T [sum_tiles V[c] .* Dy[k]] G (header comment).
// fused == false (WINOGRAD_NONFUSED): chunks of TB tiles, each step parallel over the chunk, one
// accumulator [A2][G][Cg][Kg]. fused == true (WINOGRAD, F(2x2)): each slice takes blocks of
// kFusedTiles tiles through both transforms and the per-point products in its own cache-resident
// buffers (no transformed-tile buffers in the workspace), into its own accumulator.
template <typename T, int M>
void backward_filter(const ConvProblem& p, const T* x, const T* dy, T* dw, void* workspace,
                     bool fused) {
  constexpr int A = Wino<M>::A, A2 = A * A;
  const Pass ps = make_pass(ConvOp::kBackwardFilter, p);
  const int64_t C = p.C, K = p.K;
  const int64_t tiles = tiles_of(ps, M);
  if (tiles == 0) {
    parallel_for(p.w_elems(), [&](int64_t b, int64_t e) { std::fill(dw + b, dw + e, T(0)); },
                 int64_t{1} << 14);
    return;
  }
  T* Macc = static_cast<T*>(workspace);  // [slices][A2][G][Cg][Kg]: sums over tiles of V .* Dy
  const int64_t acc = A2 * p.G * p.Cg() * p.Kg();
  if (fused) {
    const int64_t FB = kFusedTiles, blocks = (tiles + FB - 1) / FB;
    const int64_t S = fused_wgrad_slices(p, tiles, sizeof(T));
    parallel_for(S, [&](int64_t b, int64_t e) {
      T* Vb = gemm_scratch<T>(2, static_cast<size_t>(A2 * FB * C));
      T* Db = gemm_scratch<T>(3, static_cast<size_t>(A2 * FB * K));
      for (int64_t s = b; s < e; ++s) {
        T* Ms = Macc + s * acc;
        const int64_t blk0 = s * blocks / S, blk1 = (s + 1) * blocks / S;
        for (int64_t blk = blk0; blk < blk1; ++blk) {
          const int64_t t0 = blk * FB, nt = std::min(FB, tiles - t0);
          input_transform<T, M>(ps, x, t0, nt, FB, Vb);
          dy_transform<T, M>(ps, dy, K, t0, 0, nt, FB, Db);
          tile_sum_products<T>(p, nt, FB, Vb, Db, blk > blk0, Ms, 0, A2 * p.G);
        }
      }
    }, 1, 1);
    // Slice 0 += slices 1..S-1, in slice order.
    parallel_for(acc, [&](int64_t b, int64_t e) {
      for (int64_t s = 1; s < S; ++s)
        for (int64_t i = b; i < e; ++i) Macc[i] += Macc[s * acc + i];
    }, int64_t{1} << 12);
    filter_grad_transform<T, M>(p, Macc, dw);
    return;
  }
  const int64_t TB = chunk_tiles(tiles, A, C, K, sizeof(T));
  T* V = Macc + acc;       // [A2][TB][C]
  T* D = V + A2 * TB * C;  // [A2][TB][K]
  for (int64_t t0 = 0; t0 < tiles; t0 += TB) {
    const int64_t nt = std::min(TB, tiles - t0);
    input_transform<T, M>(ps, x, t0, nt, TB, V);
    parallel_for(nt, [&](int64_t b, int64_t e) { dy_transform<T, M>(ps, dy, K, t0, b, e, TB, D); },
                 4);
    parallel_for(A2 * p.G, [&](int64_t b, int64_t e) {
      tile_sum_products<T>(p, nt, TB, V, D, t0 > 0, Macc, b, e);
    }, 1, 1);
  }
  filter_grad_transform<T, M>(p, Macc, dw);
}

// Forward and backward-data: io.b is the transformed filter U (takes_winograd_filter).
template <typename T, int M>
void run(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io, bool fused) {
  switch (op) {
    case ConvOp::kForward:
    case ConvOp::kBackwardData:
      forward_pass<T, M>(make_pass(op, p), io.a, io.out, io.b, fused, io.workspace,
                         op == ConvOp::kForward ? io.epi : nullptr);
      break;
    case ConvOp::kBackwardFilter:
      backward_filter<T, M>(p, io.a, io.b, io.out, io.workspace, fused);
      break;
  }
}

}  // namespace

std::string winograd_unsupported(const ConvProblem& p) {
  if (p.filt[0] != 1 || p.filt[1] != 3 || p.filt[2] != 3)
    return "Winograd kernels need a 2-D 3x3 filter (got " + std::to_string(p.filt[1]) + "x" +
           std::to_string(p.filt[2]) + (p.filt[0] != 1 ? " with depth " + std::to_string(p.filt[0]) : "") + ")";
  for (int a = 0; a < 3; ++a) {
    if (p.stride[a] != 1) return "Winograd kernels need window_strides 1";
    if (p.dilation[a] != 1) return "Winograd kernels need rhs_dilation 1";
    if (p.lhs_dilation[a] != 1) return "Winograd kernels need lhs_dilation 1";
  }
  if (p.pad_lo[0] != 0 || p.pad_hi[0] != 0) return "Winograd kernels cannot pad the depth axis";
  return "";
}

int winograd_tile(ConvOp op, ConvAlgo algo, const ConvProblem& p) {
  return algo == ConvAlgo::kWinograd ? 2 : tile_m(make_pass(op, p), p.tile);
}

size_t winograd_nonfused_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes) {
  if (!winograd_unsupported(p).empty()) return 0;
  const Pass ps = make_pass(op, p);
  const int m = tile_m(ps, p.tile), a = m + 2;
  const int64_t tiles = tiles_of(ps, m);
  if (tiles == 0) return 0;
  const int64_t TB = chunk_tiles(tiles, a, ps.Ci, ps.Co, elem_bytes);
  // Backward-filter: the accumulator [a*a][G][Cg][Kg] (sized as a packed U, columns padded to
  // NR). Then a chunk of transformed input [a*a][TB][Ci] and output (or dy) [a*a][TB][Co].
  // Forward and backward-data take U as an operand (jaxdnn_winograd_filter), not in workspace.
  const int64_t nr = elem_bytes == 8 ? GemmShape<double>::NR : GemmShape<float>::NR;
  const int64_t acc_elems =
      op == ConvOp::kBackwardFilter ? ps.Ci * gemm_round_up(ps.Co / p.G, nr) : 0;
  const int64_t elems = int64_t{a} * a * (acc_elems + TB * (ps.Ci + ps.Co));
  return static_cast<size_t>(elems) * elem_bytes;
}

template <typename T>
void winograd_nonfused_conv(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io) {
  switch (winograd_tile(op, ConvAlgo::kWinogradNonfused, p)) {
    case 6: run<T, 6>(op, p, io, false); break;
    case 4: run<T, 4>(op, p, io, false); break;
    default: run<T, 2>(op, p, io, false); break;
  }
}

std::string winograd_fused_unsupported(ConvOp, const ConvProblem& p) {
  return winograd_unsupported(p);
}

size_t winograd_fused_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes) {
  if (!winograd_fused_unsupported(op, p).empty()) return 0;
  const Pass ps = make_pass(op, p);
  const int64_t tiles = tiles_of(ps, 2);
  if (tiles == 0) return 0;
  // Backward-filter: the slices' accumulators [slices][16][G][Cg][Kg].
  if (op == ConvOp::kBackwardFilter)
    return static_cast<size_t>(fused_wgrad_slices(p, tiles, elem_bytes) * 16 * p.G * p.Cg() *
                               p.Kg()) * elem_bytes;
  // Forward and backward-data: none (U, the packed filter transform, is an operand).
  return 0;
}

template <typename T>
void winograd_fused_conv(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io) {
  run<T, 2>(op, p, io, true);
}

void winograd_filter_dims(int tile, int64_t G, int64_t Cig, int64_t Cog, DType u_dtype,
                          int64_t dims[4]) {
  const int64_t a = tile + 2;
  const int64_t nr = u_dtype == DType::kF64 ? GemmShape<double>::NR : GemmShape<float>::NR;
  dims[0] = a * a, dims[1] = G, dims[2] = Cig, dims[3] = gemm_round_up(Cog, nr);
}

void winograd_filter_shape(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out,
                           int* tile, int64_t dims[4]) {
  const bool flip = op == ConvOp::kBackwardData;
  *tile = winograd_tile(op, algo, p);
  winograd_filter_dims(*tile, p.G, flip ? p.Kg() : p.Cg(), flip ? p.Cg() : p.Kg(),
                       winograd_filter_dtype(in, out), dims);
}

namespace {

template <typename T, typename S, typename Cvt>
void filter_transform_tile(int tile, const S* w, const FilterView& wf, int64_t G, int64_t Cg,
                           int64_t Kg, T* U, Cvt cvt) {
  if (tile == 6)
    filter_transform<T, 6>(w, wf, G, Cg, Kg, U, cvt);
  else if (tile == 4)
    filter_transform<T, 4>(w, wf, G, Cg, Kg, U, cvt);
  else
    filter_transform<T, 2>(w, wf, G, Cg, Kg, U, cvt);
}

}  // namespace

std::string winograd_filter_transform(const ConvProblem& filter, int tile, bool flip,
                                      DType w_dtype, const void* w, void* u) {
  if (tile != 2 && tile != 4 && tile != 6) return "tile must be 2, 4 or 6";
  if (filter.filt[0] != 1 || filter.filt[1] != 3 || filter.filt[2] != 3)
    return "the filter must be 3x3 (depth 1 in 3-D)";
  const FilterView wf = filter_view(filter, flip);
  const int64_t G = filter.G;
  const int64_t Cg = flip ? filter.Kg() : filter.Cg(), Kg = flip ? filter.Cg() : filter.Kg();
  auto same = [](auto v) { return v; };
  switch (w_dtype) {
    case DType::kF32:
      filter_transform_tile(tile, static_cast<const float*>(w), wf, G, Cg, Kg,
                            static_cast<float*>(u), same);
      return "";
    case DType::kF64:
      filter_transform_tile(tile, static_cast<const double*>(w), wf, G, Cg, Kg,
                            static_cast<double*>(u), same);
      return "";
    case DType::kBF16:
      filter_transform_tile(tile, static_cast<const uint16_t*>(w), wf, G, Cg, Kg,
                            static_cast<float*>(u), bf16_to_float);
      return "";
    case DType::kF16:
      filter_transform_tile(tile, static_cast<const uint16_t*>(w), wf, G, Cg, Kg,
                            static_cast<float*>(u), f16_to_float);
      return "";
  }
  return "unsupported filter dtype";
}

template void winograd_nonfused_conv<float>(ConvOp, const ConvProblem&, const ConvOperands<float>&);
template void winograd_nonfused_conv<double>(ConvOp, const ConvProblem&, const ConvOperands<double>&);
template void winograd_fused_conv<float>(ConvOp, const ConvProblem&, const ConvOperands<float>&);
template void winograd_fused_conv<double>(ConvOp, const ConvProblem&, const ConvOperands<double>&);

}  // namespace jaxdnn::cpu
