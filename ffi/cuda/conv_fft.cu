// FFT and FFT_TILING on the GPU: stride 1, no dilation, any padding (negative and asymmetric
// too), groups, 1-D/2-D/3-D, both layouts, every dtype. No cuFFT: the transforms are our own
// shared-memory FFTs, one CTA per few signals.
//
// The algebra (per spatial axis; the CPU's conv_fft.cc does the same): a tile of To outputs
// starting at t0 needs To + R - 1 input samples, so with a cyclic length L >= To + R - 1 no
// product wraps around the period:
//   forward   xt[j] = x[j + t0 - pad_lo];             y[t0 + j]  = ifft(XT . conj(W))[j]
//   bwd-data  dyt[j] = dy[j + t0 - (R - 1 - pad_lo)]; dx[t0 + j] = ifft(DYT . W)[j + R - 1]
//   bwd-filt  xt as forward, dyt[j] = dy[t0 + j] (j < To);  dw[f] = ifft(sum XT . conj(DYT))[f]
// with zeros wherever a shifted index leaves the tensor (that is the padding). Backward-data is
// the forward pass on dy with the flipped (no conjugate), channel-swapped filter.
// FFT: one tile per image, L = the next power of two >= extent + R - 1 per axis. FFT_TILING:
// powers of two per axis picked by a cost model (16-64 for 3x3/5x5 in 2-D, 1024-2048 for long
// 1-D filters). Both give an axis whose filter is 1 the length L = 1 (no transform along it:
// that axis is a batch axis). Tiles of all images are "rows", like extra images.
//
// Kernels, in order (all launches on the caller's stream):
//   fft_forward_kernel  two jobs per launch (the filter and the first chunk's activations, or x
//                       and dy): 2 * pairs real signals per CTA, gathered (any layout / window,
//                       zero padding, bit-reversed placement) as pairs z = a + i b, radix-2^3
//                       DIT passes along each axis in shared memory (the leading stages that a
//                       short window such as a filter's leaves trivial are skipped), separated
//                       into the half spectra A = (Z(u) + conj Z(-u)) / 2,
//                       B = (Z(u) - conj Z(-u)) / 2i, stored spectrum[bin][signal] (signal index
//                       fastest: adjacent signals coalesce).
//   cgemm_kernel        per (bin, group) a complex matrix product over channels (fwd/dgrad) or
//                       over rows (wgrad), tiled 32 x 64 x 32 (fp64: x 16) through shared
//                       memory, 4 x 4 complex outputs per thread, fp32 (fp64) FMAs: no TF32.
//   fft_inverse_kernel  Z = A + i B rebuilt from two half spectra (Hermitian extension, each
//                       stored bin read once), inverse passes, real part -> signal a, imaginary
//                       part -> signal b, cropped to the tile's window, in the output dtype.
// Workspace: the filter-side spectrum P (bins x rows_P x cols_P complex) plus the activation
// and result spectra of one chunk of rows (bins x chunk x (Ci + Co)); chunks of rows bound it.
// Backward-filter accumulates P over the chunks in order: deterministic, no atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "conv_cuda.h"

namespace jaxdnn::cuda {
namespace {

using i64 = int64_t;

// Transform points per signal: two pairs of 4096 complex doubles (128 KiB) fit in shared memory.
constexpr i64 kMaxPoints = 4096;
constexpr int kThreads = 256;
// Points (bins) a transform thread gathers per round, their loads all in flight together.
constexpr int kBatch = 4;
// Activation + result spectra of one chunk of rows, at most about this many bytes
// (JAXDNN_FFT_CHUNK_BYTES overrides it: the checker uses it to exercise the chunk loop).
i64 chunk_bytes() {
  static const i64 bytes = [] {
    const char* v = std::getenv("JAXDNN_FFT_CHUNK_BYTES");
    const long long b = v != nullptr ? std::atoll(v) : 0;
    return b > 0 ? static_cast<i64>(b) : i64{64} << 20;
  }();
  return bytes;
}
// The filter-side spectrum is not chunked: refuse problems where it would pass this.
constexpr i64 kMaxFilterSpectrumBytes = i64{1} << 30;

i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }
i64 next_pow2(i64 n) {
  i64 p = 1;
  while (p < n) p <<= 1;
  return p;
}
int ilog2(i64 n) {
  int l = 0;
  while ((i64{1} << l) < n) ++l;
  return l;
}

// ---------------------------------------------------------------------------------------------
// Device types and conversions.

template <typename F>
struct alignas(2 * sizeof(F)) Cx {
  F re, im;
};

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ double to_f(double v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ void from_f(float* d, float v) { *d = v; }
__device__ __forceinline__ void from_f(double* d, double v) { *d = v; }
__device__ __forceinline__ void from_f(__nv_bfloat16* d, float v) { *d = __float2bfloat16_rn(v); }
__device__ __forceinline__ void from_f(__half* d, float v) { *d = __float2half_rn(v); }

// Transform shape: lengths (powers of two) and their logs, points, half-spectrum bins.
struct FftDims {
  int L[3], lg[3];
  int P, lgP, H2, bins;  // H2 = L2 / 2 + 1, bins = L0 * L1 * H2
  int Lmax, lgLmax;
  int pairs, lgpairs;    // signal pairs per CTA (a power of two) and its log
};

// Which real signal index s is, and where its samples live. kind 0, an activation-like tensor:
// s = row * chans + channel, row (global r0 + s / chans) = image * tiles + tile, the tile's
// cyclic position j at spatial index tile_origin + off + j, read or written for j in [wlo, whi).
// kind 1, a filter: s = i * chans + j with (fwd / wgrad) i = input channel (all groups), j =
// output channel within the group, or (bwd-data, swap) i = output channel, j = input channel in
// the group; cyclic position j is tap j.
struct SigMap {
  int kind;
  i64 nsig, chans, r0, tiles;
  int nt[3], To[3];
  i64 sn, sc, sp[3], ext[3];
  i64 off[3];
  int wlo[3], whi[3];
  i64 K, Cg, Kg, taps;
  bool nhwc, swap;
};

// A signal's base offset, origin and clipped window; base < 0: no samples (all zero).
struct SigGeom {
  i64 base;
  i64 org[3];
  int lo[3], hi[3];
};

// a / b for 0 <= a, 0 < b (callers take the remainder as a - q b): a 32-bit division when both
// fit (a 64-bit one is a long subroutine on the GPU, on the path to every transform's first load).
__device__ __forceinline__ i64 quot(i64 a, i64 b) {
  if ((a | b) >> 32 != 0) return a / b;
  return static_cast<i64>(static_cast<uint32_t>(a) / static_cast<uint32_t>(b));
}

__device__ SigGeom signal_geom(const SigMap& m, i64 s) {
  SigGeom g;
  g.base = -1;
  if (s >= m.nsig) return g;
  i64 t0[3] = {0, 0, 0};
  if (m.kind == 0) {
    const i64 q = quot(s, m.chans), row = m.r0 + q, ch = s - q * m.chans;
    const i64 n = quot(row, m.tiles), t = row - n * m.tiles;
    const i64 t2 = quot(t, m.nt[2]), t1 = quot(t2, m.nt[1]);
    t0[2] = (t - t2 * m.nt[2]) * m.To[2];
    t0[1] = (t2 - t1 * m.nt[1]) * m.To[1];
    t0[0] = t1 * m.To[0];
    g.base = n * m.sn + ch * m.sc;
  } else {
    const i64 i = quot(s, m.chans), j = s - i * m.chans, gi = quot(i, m.Cg);
    const i64 k = m.swap ? i : gi * m.Kg + j, cin = m.swap ? j : i - gi * m.Cg;
    g.base = m.nhwc ? cin * m.K + k : (k * m.Cg + cin) * m.taps;
  }
  for (int a = 0; a < 3; ++a) {
    g.org[a] = t0[a] + m.off[a];
    // [lo, hi) = [wlo, whi) clipped to the tensor: 0 <= org + j < ext.
    const i64 lo = -g.org[a] > m.wlo[a] ? -g.org[a] : m.wlo[a];
    const i64 hi = m.ext[a] - g.org[a] < m.whi[a] ? m.ext[a] - g.org[a] : m.whi[a];
    if (lo >= hi) {
      g.base = -1;
      g.lo[a] = g.hi[a] = 0;
    } else {
      g.lo[a] = static_cast<int>(lo);
      g.hi[a] = static_cast<int>(hi);
    }
  }
  return g;
}

__device__ __forceinline__ unsigned bit_reverse(unsigned x, int bits) {
  return bits == 0 ? 0u : __brev(x) >> (32 - bits);
}

// Natural position (j0, j1, j2) of linear index pos, and its bit-reversed placement per axis.
__device__ __forceinline__ void split_pos(const FftDims& d, int pos, int j[3]) {
  j[2] = pos & (d.L[2] - 1);
  j[1] = (pos >> d.lg[2]) & (d.L[1] - 1);
  j[0] = pos >> (d.lg[2] + d.lg[1]);
}
__device__ __forceinline__ int reversed_pos(const FftDims& d, const int j[3]) {
  return static_cast<int>((bit_reverse(j[0], d.lg[0]) << (d.lg[1] + d.lg[2])) |
                          (bit_reverse(j[1], d.lg[1]) << d.lg[2]) | bit_reverse(j[2], d.lg[2]));
}

// tw[k] = exp(-2 pi i k / Lmax), k < Lmax / 2 (computed in double: the float twiddles are
// correctly rounded).
template <typename F>
__device__ void fill_twiddles(Cx<F>* tw, const FftDims& d) {
  for (int k = threadIdx.x; k < d.Lmax / 2; k += blockDim.x) {
    double s, c;
    sincospi(2.0 * k / d.Lmax, &s, &c);
    tw[k].re = static_cast<F>(c);
    tw[k].im = static_cast<F>(-s);
  }
}

__device__ __forceinline__ int pass_stride_log(const FftDims& d, int a) {
  return a == 2 ? 0 : a == 1 ? d.lg[2] : d.lg[2] + d.lg[1];
}

template <typename F>
__device__ __forceinline__ Cx<F> cmul(Cx<F> a, Cx<F> b) {
  return Cx<F>{a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}

// Where point i of a pair lives in its shared-memory slab: bits 0-2 XOR bits 3-5. A permutation
// within each group of 8 that puts the 8 contiguous points a thread takes in the first pass of
// the innermost axis into different banks across neighbouring threads; runs of 8 aligned points
// stay together, so the other passes' accesses stay conflict-free.
__device__ __forceinline__ int zpos(int i) { return i ^ ((i >> 3) & 7); }

// w times exp(-+2 pi i jj / 2^(st + 1)) (- forward, + inverse), jj < 2^st, st < 3: the factors
// within a radix-2^3 pass are constants (1, -+i, and the eighth turns r (1 -+ i), r = 1 / sqrt 2).
template <typename F, bool Inv>
__device__ __forceinline__ Cx<F> turn(Cx<F> w, int st, int jj) {
  if (jj == 0) return w;
  if (2 * jj == (1 << st)) return Inv ? Cx<F>{-w.im, w.re} : Cx<F>{w.im, -w.re};
  const F r = F(0.70710678118654752440);
  Cx<F> u = Inv ? Cx<F>{r * (w.re - w.im), r * (w.re + w.im)}
                : Cx<F>{r * (w.re + w.im), r * (w.im - w.re)};
  if (jj == 3) u = Inv ? Cx<F>{-u.im, u.re} : Cx<F>{u.im, -u.re};  // times the quarter turn
  return u;
}

// One pass of R (1..3) radix-2 decimation-in-time stages lh .. lh + R - 1 along axis a (stride
// 2^lsa) over all pairs of the CTA, 2^R points per thread in registers. With h = 2^lh, k < h and
// x_j = e[i0 + j h] (j < 2^R), stage t pairs x_j and x_(j + 2^t) (bit t of j clear):
//   x_j, x_(j + 2^t) = x_j +- w_(2^(t+1) h)^(k + (j mod 2^t) h) x_(j + 2^t),
// with w_n = exp(-2 pi i / n) (conjugated for the inverse): w_(2^(t+1) h)^k from tw
// (tw[m] = w_Lmax^m), times the constant w_(2^(t+1))^(j mod 2^t) (turn).
template <typename F, bool Inv, int R>
__device__ void radix_pass(Cx<F>* z, const Cx<F>* tw, const FftDims& d, int a, int lsa, int lh) {
  constexpr int E = 1 << R;
  const int La = d.L[a], lgLa = d.lg[a], h = 1 << lh, lgper = d.lgP - R;
  for (int t = threadIdx.x; t < d.pairs << lgper; t += blockDim.x) {
    const int pr = t >> lgper, b = t & ((1 << lgper) - 1);
    const int lo = b & ((1 << lsa) - 1), rest = b >> lsa;
    const int q = rest & ((La >> R) - 1), hi = rest >> (lgLa - R);
    const int k = q & (h - 1), i0 = ((q >> lh) << (lh + R)) + k;
    Cx<F>* zp = z + pr * d.P;
    const int e0 = (((hi << lgLa) + i0) << lsa) + lo, s = h << lsa;
    Cx<F> x[E];
#pragma unroll
    for (int j = 0; j < E; ++j) x[j] = zp[zpos(e0 + j * s)];
#pragma unroll
    for (int st = 0; st < R; ++st) {
      Cx<F> wk = tw[k << (d.lgLmax - lh - st - 1)];
      if (Inv) wk.im = -wk.im;
#pragma unroll
      for (int j = 0; j < E; ++j) {
        if (j & (1 << st)) continue;
        const Cx<F> y = cmul(x[j + (1 << st)], turn<F, Inv>(wk, st, j & ((1 << st) - 1)));
        x[j + (1 << st)] = Cx<F>{x[j].re - y.re, x[j].im - y.im};
        x[j] = Cx<F>{x[j].re + y.re, x[j].im + y.im};
      }
    }
#pragma unroll
    for (int j = 0; j < E; ++j) zp[zpos(e0 + j * s)] = x[j];
  }
  __syncthreads();
}

// In-place decimation-in-time passes along every axis over all pairs of the CTA (input
// bit-reversed per axis, output natural; inverse: exp(+2 pi i jk / L), unscaled): radix-2^3
// passes, then one of radix 2^2 or 2 for the remaining stages, so a 32-point axis costs two
// barriers. Stages below skip_a along axis a count as done (see FwdJob).
template <typename F, bool Inv>
__device__ __forceinline__ void fft_passes(Cx<F>* z, const Cx<F>* tw, const FftDims& d,
                                           int skip0, int skip1, int skip2) {
  for (int a = 2; a >= 0; --a) {
    if (d.L[a] == 1) continue;
    const int lsa = pass_stride_log(d, a), lg = d.lg[a];
    int lh = a == 2 ? skip2 : a == 1 ? skip1 : skip0;
    for (; lh + 3 <= lg; lh += 3) radix_pass<F, Inv, 3>(z, tw, d, a, lsa, lh);
    if (lg - lh == 2) radix_pass<F, Inv, 2>(z, tw, d, a, lsa, lh);
    if (lg - lh == 1) radix_pass<F, Inv, 1>(z, tw, d, a, lsa, lh);
  }
}

// Shared memory of a transform CTA: pairs * P complex, Lmax / 2 twiddles, 2 * pairs geometries.
template <typename F>
size_t transform_smem(const FftDims& d) {
  return sizeof(Cx<F>) * (static_cast<size_t>(d.pairs) * d.P + d.Lmax / 2) +
         sizeof(SigGeom) * 2 * d.pairs;
}

// One forward-transform job: the spectra of the signals of `map` into dst[bin * ld + s], in
// `blocks` CTAs of 2 * pairs signals. skip[a]: every window of the map lies in [0, L_a >> skip),
// so the first skip radix-2 stages along axis a are copies (below) and are not computed.
template <typename In, typename F>
struct FwdJob {
  const In* src;
  SigMap map;
  Cx<F>* dst;
  i64 ld;
  i64 blocks;
  int skip[3];
};

// Leading DIT stages that a window [0, whi) of an axis of length L (log lg) leaves trivial: with
// x zero beyond L / 2^s, after s stages every block of 2^s bit-reversed positions holds the
// 2^s-point DFT of (x[m], 0, ..., 0), i.e. x[m] repeated, m = the natural index mod L / 2^s.
int trivial_stages(i64 whi, int lg) {
  int s = 0;
  while (s < lg && whi <= (i64{1} << (lg - s - 1))) ++s;
  return s;
}

template <typename In, typename F>
__device__ __forceinline__ void fft_forward_block(const FwdJob<In, F>& jb, const FftDims& d,
                                                  i64 block, Cx<F>* z, Cx<F>* tw, SigGeom* geo) {
  const SigMap& map = jb.map;
  const int nsig = 2 * d.pairs;
  const i64 s0 = block * nsig;
  for (int s = threadIdx.x; s < nsig; s += blockDim.x) geo[s] = signal_geom(map, s0 + s);
  __syncthreads();
  // Gather: pair index fastest, so neighbouring threads read neighbouring channels (NHWC);
  // kBatch points per thread with all their loads issued before the stores.
  // Position j holds x[j mod (L >> skip)] per axis: the skipped stages' output (see FwdJob).
  const int mask[3] = {(d.L[0] >> jb.skip[0]) - 1, (d.L[1] >> jb.skip[1]) - 1,
                       (d.L[2] >> jb.skip[2]) - 1};
  const int total = d.pairs * d.P;
  for (int base = threadIdx.x; base < total; base += kBatch * blockDim.x) {
    F v[kBatch][2];
    int at[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = base + u * blockDim.x;
      const int pr = idx & (d.pairs - 1), pos = idx >> d.lgpairs;
      int j[3];
      split_pos(d, pos, j);
      at[u] = pr * d.P + zpos(reversed_pos(d, j));
      const int x0 = j[0] & mask[0], x1 = j[1] & mask[1], x2 = j[2] & mask[2];
      for (int h = 0; h < 2; ++h) {
        const SigGeom& g = geo[2 * pr + h];
        v[u][h] = F(0);
        if (idx < total && g.base >= 0 && x0 >= g.lo[0] && x0 < g.hi[0] && x1 >= g.lo[1] &&
            x1 < g.hi[1] && x2 >= g.lo[2] && x2 < g.hi[2])
          v[u][h] = static_cast<F>(to_f(jb.src[g.base + (g.org[0] + x0) * map.sp[0] +
                                                (g.org[1] + x1) * map.sp[1] +
                                                (g.org[2] + x2) * map.sp[2]]));
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (base + u * static_cast<int>(blockDim.x) < total) z[at[u]] = Cx<F>{v[u][0], v[u][1]};
  }
  fill_twiddles(tw, d);  // after the gather's loads: its latency hides behind theirs
  __syncthreads();
  fft_passes<F, false>(z, tw, d, jb.skip[0], jb.skip[1], jb.skip[2]);
  // Separate the pairs' half spectra, one thread per (bin, pair): signal index fastest
  // (coalesced stores).
  for (int idx = threadIdx.x; idx < d.pairs * d.bins; idx += blockDim.x) {
    const int pr = idx & (d.pairs - 1), bin = idx >> d.lgpairs;
    const i64 sa = s0 + 2 * pr;
    if (sa >= map.nsig) continue;
    const int v = bin % d.H2, u01 = bin / d.H2;
    const int u1 = u01 & (d.L[1] - 1), u0 = u01 >> d.lg[1];
    const int mu0 = (d.L[0] - u0) & (d.L[0] - 1), mu1 = (d.L[1] - u1) & (d.L[1] - 1);
    const int mv = (d.L[2] - v) & (d.L[2] - 1);
    const Cx<F>* zp = z + pr * d.P;
    const Cx<F> p = zp[zpos((((u0 << d.lg[1]) + u1) << d.lg[2]) + v)];
    const Cx<F> m = zp[zpos((((mu0 << d.lg[1]) + mu1) << d.lg[2]) + mv)];
    Cx<F>* o = jb.dst + bin * jb.ld + sa;
    o[0] = Cx<F>{F(0.5) * (p.re + m.re), F(0.5) * (p.im - m.im)};
    if (sa + 1 < map.nsig) o[1] = Cx<F>{F(0.5) * (p.im + m.im), F(0.5) * (m.re - p.re)};
  }
}

// Two forward jobs in one launch (the filter and the activations, or x and dy): blocks
// [0, j0.blocks) run j0, the rest j1 (j1.blocks may be 0). Each branch reads its own kernel
// parameter, so no parameter is indexed at run time.
// fp32: at most 40 registers, 6 CTAs of 256 threads per SM (inc_5x5's filter + input
// transforms, 768 CTAs, in one wave).
template <typename In, typename F>
__global__ void __launch_bounds__(kThreads, sizeof(F) == 4 ? 6 : 1)
fft_forward_kernel(FwdJob<In, F> j0, FwdJob<In, F> j1, FftDims d) {
  extern __shared__ __align__(16) unsigned char fft_smem[];
  Cx<F>* z = reinterpret_cast<Cx<F>*>(fft_smem);
  Cx<F>* tw = z + d.pairs * d.P;
  SigGeom* geo = reinterpret_cast<SigGeom*>(tw + d.Lmax / 2);
  const i64 b = blockIdx.x;
  if (b < j0.blocks)
    fft_forward_block(j0, d, b, z, tw, geo);
  else
    fft_forward_block(j1, d, b - j0.blocks, z, tw, geo);
}

// Inverse of the half spectra src[bin * ld + s] of signals [s0, s0 + 2 pairs), times scale,
// stored into the windows of `map` in the output dtype.
// fp32: at most 48 registers, 5 CTAs per SM (inc_5x5's 512 inverse CTAs in one wave).
template <typename Out, typename F>
__global__ void __launch_bounds__(kThreads, sizeof(F) == 4 ? 5 : 1)
fft_inverse_kernel(const Cx<F>* __restrict__ src, i64 ld, SigMap map, FftDims d,
                   Out* __restrict__ dst, F scale) {
  extern __shared__ __align__(16) unsigned char fft_smem[];
  Cx<F>* z = reinterpret_cast<Cx<F>*>(fft_smem);
  Cx<F>* tw = z + d.pairs * d.P;
  SigGeom* geo = reinterpret_cast<SigGeom*>(tw + d.Lmax / 2);
  const int nsig = 2 * d.pairs;
  const i64 s0 = static_cast<i64>(blockIdx.x) * nsig;
  for (int s = threadIdx.x; s < nsig; s += blockDim.x) geo[s] = signal_geom(map, s0 + s);
  // Z = A + i B over the full spectrum, each stored bin read once: at u (v < H2) directly,
  // (ar - bi, ai + br); at its mirror -u (when distinct: 0 < v < L2 / 2) from A(-u) =
  // conj A(u), likewise B: (ar + bi, br - ai).
  const int total = d.pairs * d.bins;
  for (int base = threadIdx.x; base < total; base += kBatch * blockDim.x) {
    Cx<F> A[kBatch], B[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {  // kBatch bins per thread: all loads first
      const int idx = base + u * blockDim.x;
      const i64 bin = idx >> d.lgpairs, sa = s0 + 2 * (idx & (d.pairs - 1));
      const bool in = idx < total;
      A[u] = in && sa < map.nsig ? src[bin * ld + sa] : Cx<F>{F(0), F(0)};
      B[u] = in && sa + 1 < map.nsig ? src[bin * ld + sa + 1] : Cx<F>{F(0), F(0)};
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = base + u * blockDim.x;
      if (idx >= total) break;
      const int pr = idx & (d.pairs - 1), bin = idx >> d.lgpairs;
      const int v = bin % d.H2, u01 = bin / d.H2;
      int j[3] = {u01 >> d.lg[1], u01 & (d.L[1] - 1), v};
      Cx<F>* zp = z + pr * d.P;
      zp[zpos(reversed_pos(d, j))] = Cx<F>{A[u].re - B[u].im, A[u].im + B[u].re};
      if (v > 0 && 2 * v < d.L[2]) {
        j[0] = (d.L[0] - j[0]) & (d.L[0] - 1);
        j[1] = (d.L[1] - j[1]) & (d.L[1] - 1);
        j[2] = d.L[2] - v;
        zp[zpos(reversed_pos(d, j))] = Cx<F>{A[u].re + B[u].im, B[u].re - A[u].im};
      }
    }
  }
  fill_twiddles(tw, d);  // after the loads above: its latency hides behind theirs
  __syncthreads();
  fft_passes<F, true>(z, tw, d, 0, 0, 0);
  for (int idx = threadIdx.x; idx < d.pairs * d.P; idx += blockDim.x) {
    const int pr = idx & (d.pairs - 1), pos = idx >> d.lgpairs;
    int j[3];
    split_pos(d, pos, j);
    const Cx<F> r = z[pr * d.P + zpos(pos)];
    for (int h = 0; h < 2; ++h) {
      const SigGeom& g = geo[2 * pr + h];
      if (g.base >= 0 && j[0] >= g.lo[0] && j[0] < g.hi[0] && j[1] >= g.lo[1] &&
          j[1] < g.hi[1] && j[2] >= g.lo[2] && j[2] < g.hi[2])
        from_f(dst + g.base + (g.org[0] + j[0]) * map.sp[0] + (g.org[1] + j[1]) * map.sp[1] +
                   (g.org[2] + j[2]) * map.sp[2],
               (h == 0 ? r.re : r.im) * scale);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Per-(bin, group) complex matrix product:
//   C[m][n] (+)= sum_k A[m][k] . op(B[k][n]),  op = conj when conj_b,
// element (m, k) of A at a + bin * a_bin + g * a_g + m * a_m + k * a_k (likewise B and C).
// Tiles kBM x BN x kBK: BN = 64, or 32 when N <= 32 (bwd-data's input channels: no idle half
// tile); 8 x BN / 4 threads of 4 x 4 complex outputs. kBK, the reduction slab per barrier pair:
// 32 in fp32 (inc_5x5's 32 channels in one slab), 16 in fp64 (within 48 KiB of shared memory).
constexpr int kBM = 32, kPad = 2;
template <typename F>
constexpr int kBK = sizeof(F) == 4 ? 32 : 16;

// Offsets within one (bin, group) are ints (fewer registers; the host checks that they fit).
struct GemmArgs {
  int M, N, Kr;
  int a_m, a_k, b_k, b_n, c_m, c_n;
  i64 G, bins, mt, nt;
  i64 a_bin, a_g, b_bin, b_g, c_bin, c_g;
  bool conj_b, accumulate;
};

template <typename F, int BN>
size_t gemm_smem() {
  return sizeof(Cx<F>) * kBK<F> * ((kBM + kPad) + (BN + kPad));
}

// fp32: 320 / BN CTAs of 2 BN threads per SM (at most 96 / 102 registers): inc_5x5's 544 (bin)
// CTAs in one wave over 132 SMs; the 128 registers it took unbounded allowed only 4 per SM.
template <typename F, int BN>
__global__ void __launch_bounds__(2 * BN, sizeof(F) == 4 ? 320 / BN : 1)
cgemm_kernel(const Cx<F>* __restrict__ A, const Cx<F>* __restrict__ B, Cx<F>* __restrict__ C,
             GemmArgs g) {
  constexpr int BK = kBK<F>, TC = BN / 4, T = 8 * TC;
  extern __shared__ __align__(16) unsigned char fft_smem[];
  Cx<F>* As = reinterpret_cast<Cx<F>*>(fft_smem);  // [BK][kBM + kPad]
  Cx<F>* Bs = As + BK * (kBM + kPad);              // [BK][BN + kPad]
  const i64 id = blockIdx.x, q = quot(id, g.nt), bg = quot(q, g.mt), bin = quot(bg, g.G);
  const int m0 = static_cast<int>(q - bg * g.mt) * kBM, n0 = static_cast<int>(id - q * g.nt) * BN;
  const i64 grp = bg - bin * g.G;
  const Cx<F>* Ab = A + bin * g.a_bin + grp * g.a_g;
  const Cx<F>* Bb = B + bin * g.b_bin + grp * g.b_g;
  Cx<F>* Cb = C + bin * g.c_bin + grp * g.c_g;
  // 8 x TC threads, each rows rm + 8 i and columns cn + TC j (i, j < 4): TC neighbouring
  // threads read TC consecutive B elements (no bank conflicts) and store TC consecutive C ones.
  const int rm = threadIdx.x / TC, cn = threadIdx.x % TC;
  const F sgn = g.conj_b ? F(-1) : F(1);
  F accr[4][4], acci[4][4];
  for (int i = 0; i < 4; ++i)
    for (int jj = 0; jj < 4; ++jj) accr[i][jj] = acci[i][jj] = F(0);
  const Cx<F> zero{F(0), F(0)};
  for (int k0 = 0; k0 < g.Kr; k0 += BK) {
    // Tiles in, the unit-stride index along consecutive threads.
    for (int e = threadIdx.x; e < kBM * BK; e += T) {
      const int kk = g.a_k == 1 ? e % BK : e / kBM, mm = g.a_k == 1 ? e / BK : e % kBM;
      const int gm = m0 + mm, gk = k0 + kk;
      As[kk * (kBM + kPad) + mm] = gm < g.M && gk < g.Kr ? Ab[gm * g.a_m + gk * g.a_k] : zero;
    }
    for (int e = threadIdx.x; e < BN * BK; e += T) {
      const int nn = g.b_n == 1 ? e % BN : e / BK, kk = g.b_n == 1 ? e / BN : e % BK;
      const int gn = n0 + nn, gk = k0 + kk;
      Bs[kk * (BN + kPad) + nn] = gn < g.N && gk < g.Kr ? Bb[gk * g.b_k + gn * g.b_n] : zero;
    }
    __syncthreads();
    const int kn = min(BK, g.Kr - k0);  // a short last slab (or few channels) stops early
#pragma unroll 1
    for (int kk = 0; kk < kn; ++kk) {
      Cx<F> a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = As[kk * (kBM + kPad) + rm + 8 * i];
      for (int jj = 0; jj < 4; ++jj) {
        b[jj] = Bs[kk * (BN + kPad) + cn + TC * jj];
        b[jj].im *= sgn;
      }
      for (int i = 0; i < 4; ++i)
        for (int jj = 0; jj < 4; ++jj) {
          accr[i][jj] += a[i].re * b[jj].re;
          acci[i][jj] += a[i].re * b[jj].im;
          accr[i][jj] -= a[i].im * b[jj].im;
          acci[i][jj] += a[i].im * b[jj].re;
        }
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int gm = m0 + rm + 8 * i;
    if (gm >= g.M) continue;
    for (int jj = 0; jj < 4; ++jj) {
      const int gn = n0 + cn + TC * jj;
      if (gn >= g.N) continue;
      Cx<F>* c = Cb + gm * g.c_m + gn * g.c_n;
      Cx<F> v{accr[i][jj], acci[i][jj]};
      if (g.accumulate) v.re += c->re, v.im += c->im;
      *c = v;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The plan: cyclic lengths, tiles, chunking and workspace (host).

struct Shape {
  i64 Ci, Co, p_rows, p_cols;  // activation / result channels; filter-side spectrum rows x cols
};

Shape shape_of(ConvOp op, const ConvProblem& p) {
  if (op == ConvOp::kBackwardData) return {p.K, p.C, p.K, p.Cg()};
  return {p.C, p.K, p.C, p.Kg()};
}

struct Plan {
  i64 L[3] = {1, 1, 1}, To[3] = {1, 1, 1}, nt[3] = {1, 1, 1}, E[3] = {0, 0, 0};
  i64 points = 1, bins = 1, tiles = 0, rows = 0, chunk = 1;
  Shape sh{};
  i64 off_a = 0, off_q = 0, bytes = 0;  // workspace: P at 0, then A, then Q (bytes)
  bool ok = false;                      // some tile shape fits kMaxPoints
};

i64 bins_of(const i64 L[3]) { return L[0] * L[1] * (L[2] / 2 + 1); }

// Estimated ns of a pass with cyclic lengths L (H200 orders of magnitude): butterflies at
// ~0.7 per ns (shared-memory bound), complex multiply-adds at ~3 per ns, spectrum traffic at
// ~3 bytes per ns, and a launch-sized floor per CTA wave of the widest transform.
double pass_cost(const ConvProblem& p, const Shape& sh, const i64 L[3], const i64 E[3],
                 size_t cx_bytes) {
  i64 P = 1, tiles = 1;
  for (int a = 0; a < 3; ++a) {
    P *= L[a];
    tiles *= cdiv(E[a], L[a] - p.filt[a] + 1);
  }
  const double rows = static_cast<double>(p.N * tiles), bins = static_cast<double>(bins_of(L));
  const double signals = rows * static_cast<double>(sh.Ci + sh.Co) +
                         static_cast<double>(sh.p_rows * sh.p_cols);
  const double butterflies = signals * 0.25 * static_cast<double>(P) * ilog2(P);
  const double cmacs = bins * rows * static_cast<double>(p.G * p.Cg() * p.Kg());
  const double bytes = 2.0 * bins * signals * static_cast<double>(cx_bytes);
  return butterflies / 0.7 + cmacs / 3.0 + bytes / 3.0;
}

Plan make_plan(ConvOp op, const ConvProblem& p, bool tiled, size_t cx_bytes) {
  Plan pl;
  pl.sh = shape_of(op, p);
  for (int a = 0; a < 3; ++a) {
    pl.E[a] = op == ConvOp::kBackwardData ? p.in[a] : p.out[a];
    pl.L[a] = p.filt[a] == 1 ? 1 : next_pow2(std::max<i64>(pl.E[a], 1) + p.filt[a] - 1);
  }
  if (tiled) {
    int active = 0;
    for (int a = 0; a < 3; ++a) active += p.filt[a] > 1 ? 1 : 0;
    const i64 cap = active <= 1 ? kMaxPoints : active == 2 ? 64 : 16;
    i64 cand[3][16];
    int nc[3];
    for (int a = 0; a < 3; ++a) {
      nc[a] = 0;
      if (p.filt[a] == 1) {
        cand[a][nc[a]++] = 1;
        continue;
      }
      const i64 whole = pl.L[a];
      for (i64 n = next_pow2(p.filt[a] + 1); n <= std::min(whole, cap); n <<= 1)
        cand[a][nc[a]++] = n;
      if (nc[a] == 0) cand[a][nc[a]++] = next_pow2(p.filt[a] + 1);  // kMaxPoints decides
    }
    double best = -1;
    for (int i0 = 0; i0 < nc[0]; ++i0)
      for (int i1 = 0; i1 < nc[1]; ++i1)
        for (int i2 = 0; i2 < nc[2]; ++i2) {
          const i64 c[3] = {cand[0][i0], cand[1][i1], cand[2][i2]};
          if (c[0] * c[1] * c[2] > kMaxPoints) continue;
          const double cost = pass_cost(p, pl.sh, c, pl.E, cx_bytes);
          if (best < 0 || cost < best) {
            best = cost;
            std::copy(c, c + 3, pl.L);
          }
        }
    if (best < 0) return pl;  // no tile fits
  }
  pl.points = pl.L[0] * pl.L[1] * pl.L[2];
  if (pl.points > kMaxPoints) return pl;
  pl.ok = true;
  pl.tiles = 1;
  for (int a = 0; a < 3; ++a) {
    pl.To[a] = pl.L[a] - p.filt[a] + 1;
    pl.nt[a] = cdiv(pl.E[a], pl.To[a]);
    pl.tiles *= pl.nt[a];
  }
  pl.rows = p.N * pl.tiles;
  pl.bins = bins_of(pl.L);
  const i64 per_row = pl.bins * (pl.sh.Ci + pl.sh.Co) * static_cast<i64>(cx_bytes);
  pl.chunk = std::clamp<i64>(chunk_bytes() / std::max<i64>(per_row, 1), 1,
                             std::max<i64>(pl.rows, 1));
  auto align = [](i64 b) { return (b + 255) / 256 * 256; };
  const i64 cb = static_cast<i64>(cx_bytes);
  pl.off_a = align(pl.bins * pl.sh.p_rows * pl.sh.p_cols * cb);
  pl.off_q = pl.off_a + align(pl.bins * pl.chunk * pl.sh.Ci * cb);
  pl.bytes = pl.off_q + align(pl.bins * pl.chunk * pl.sh.Co * cb);
  return pl;
}

size_t cx_bytes_of(DType in) { return in == DType::kF64 ? 16 : 8; }

FftDims dims_of(const Plan& pl) {
  FftDims d{};
  for (int a = 0; a < 3; ++a) {
    d.L[a] = static_cast<int>(pl.L[a]);
    d.lg[a] = ilog2(pl.L[a]);
  }
  d.P = static_cast<int>(pl.points);
  d.lgP = ilog2(pl.points);
  d.H2 = d.L[2] / 2 + 1;
  d.bins = static_cast<int>(pl.bins);
  d.Lmax = std::max({d.L[0], d.L[1], d.L[2]});
  d.lgLmax = ilog2(d.Lmax);
  d.pairs = static_cast<int>(std::clamp<i64>(2048 / pl.points, 2, 32));
  d.lgpairs = ilog2(d.pairs);
  return d;
}

// ---------------------------------------------------------------------------------------------
// The driver.

std::string launch_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return "";
  return std::string("FFT ") + what + " launch failed: " + cudaGetErrorString(e);
}

template <typename K>
std::string allow_smem(K kernel, size_t smem) {
  if (smem <= 48 * 1024) return "";
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem));
  if (e != cudaSuccess) return std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e);
  return "";
}

// Strides (elements) of an activation-like tensor with `ch` channels and spatial extents sp.
void act_strides(const ConvProblem& p, i64 ch, const i64 ext[3], SigMap& m) {
  const i64 pix = ext[0] * ext[1] * ext[2];
  if (p.layout == Layout::kNHWC) {
    m.sn = pix * ch, m.sc = 1;
    m.sp[2] = ch, m.sp[1] = ext[2] * ch, m.sp[0] = ext[1] * ext[2] * ch;
  } else {
    m.sn = pix * ch, m.sc = pix;
    m.sp[2] = 1, m.sp[1] = ext[2], m.sp[0] = ext[1] * ext[2];
  }
  for (int a = 0; a < 3; ++a) m.ext[a] = ext[a];
}

template <typename In, typename Out, typename F>
std::string run_typed(const CudaConvCall& c, const CudaConvBuffers& io) {
  const ConvProblem& p = c.problem;
  const ConvOp op = c.op;
  const bool tiled = c.algo == ConvAlgo::kFftTiling;
  const Plan pl = make_plan(op, p, tiled, sizeof(Cx<F>));
  const i64 out_elems = op == ConvOp::kForward         ? p.y_elems()
                        : op == ConvOp::kBackwardData ? p.x_elems()
                                                      : p.w_elems();
  if (out_elems == 0) return "";
  if (pl.rows == 0) {  // nothing to reduce over (no batch or an empty dy): zeros
    const cudaError_t e = cudaMemsetAsync(io.out, 0, out_elems * sizeof(Out), io.stream);
    return e == cudaSuccess ? "" : std::string("cudaMemsetAsync: ") + cudaGetErrorString(e);
  }
  const FftDims d = dims_of(pl);
  const size_t tsmem = transform_smem<F>(d);
  if (std::string e = allow_smem(fft_forward_kernel<In, F>, tsmem); !e.empty()) return e;
  if (std::string e = allow_smem(fft_inverse_kernel<Out, F>, tsmem); !e.empty()) return e;
  unsigned char* ws = static_cast<unsigned char*>(io.workspace);
  Cx<F>* SP = reinterpret_cast<Cx<F>*>(ws);
  Cx<F>* SA = reinterpret_cast<Cx<F>*>(ws + pl.off_a);
  Cx<F>* SQ = reinterpret_cast<Cx<F>*>(ws + pl.off_q);
  const Shape& sh = pl.sh;
  const i64 G = p.G, Cg = p.Cg(), Kg = p.Kg();
  const bool nhwc = p.layout == Layout::kNHWC;

  // Filter signals (spectrum P): rows x cols = sh.p_rows x sh.p_cols.
  SigMap fm{};
  fm.kind = 1;
  fm.nsig = sh.p_rows * sh.p_cols;
  fm.chans = sh.p_cols;
  fm.K = p.K, fm.Cg = Cg, fm.Kg = Kg, fm.taps = p.filt_taps();
  fm.nhwc = nhwc, fm.swap = op == ConvOp::kBackwardData;
  for (int a = 0; a < 3; ++a) {
    fm.ext[a] = p.filt[a];
    fm.off[a] = 0, fm.wlo[a] = 0, fm.whi[a] = static_cast<int>(p.filt[a]);
  }
  if (nhwc) {
    fm.sp[2] = Cg * p.K, fm.sp[1] = p.filt[2] * Cg * p.K, fm.sp[0] = p.filt[1] * fm.sp[1];
  } else {
    fm.sp[2] = 1, fm.sp[1] = p.filt[2], fm.sp[0] = p.filt[1] * p.filt[2];
  }
  // Activation-like signals: chans channels per row; window [wlo, whi) at tile origin + off.
  auto act_map = [&](i64 chans, const i64 ext[3], const i64 off[3], const i64 wlo[3],
                     const i64 whi[3], i64 r0, i64 nr) {
    SigMap m{};
    m.kind = 0;
    m.nsig = nr * chans;
    m.chans = chans;
    m.r0 = r0;
    m.tiles = pl.tiles;
    act_strides(p, chans, ext, m);
    for (int a = 0; a < 3; ++a) {
      m.nt[a] = static_cast<int>(pl.nt[a]), m.To[a] = static_cast<int>(pl.To[a]);
      m.off[a] = off[a], m.wlo[a] = static_cast<int>(wlo[a]), m.whi[a] = static_cast<int>(whi[a]);
    }
    return m;
  };
  i64 zero3[3] = {0, 0, 0}, win_in[3], win_out[3], off_in[3], off_dx[3], wlo_dx[3], whi_dx[3];
  for (int a = 0; a < 3; ++a) {
    win_in[a] = pl.To[a] + p.filt[a] - 1;
    win_out[a] = pl.To[a];
    off_in[a] = op == ConvOp::kBackwardData ? -(p.filt[a] - 1 - p.pad_lo[a]) : -p.pad_lo[a];
    off_dx[a] = -(p.filt[a] - 1);
    wlo_dx[a] = p.filt[a] - 1;
    whi_dx[a] = p.filt[a] - 1 + pl.To[a];
  }

  // A forward job over all signals of m; its skipped stages from the map's windows.
  auto job = [&](const In* src, const SigMap& m, Cx<F>* dst, i64 ld) {
    FwdJob<In, F> jb{src, m, dst, ld, cdiv(m.nsig, 2 * d.pairs), {0, 0, 0}};
    for (int a = 0; a < 3; ++a) jb.skip[a] = trivial_stages(m.whi[a], d.lg[a]);
    return jb;
  };
  // One launch for one or two jobs.
  auto forward = [&](const FwdJob<In, F>& j0, FwdJob<In, F> j1) -> std::string {
    const i64 blocks = j0.blocks + j1.blocks;
    if (blocks == 0) return "";
    if (blocks > INT32_MAX) return "FFT transform: too many signals for one launch";
    fft_forward_kernel<In, F><<<static_cast<unsigned>(blocks), kThreads, tsmem, io.stream>>>(
        j0, j1, d);
    return launch_error("forward transform");
  };
  FwdJob<In, F> none{};
  auto inverse = [&](const Cx<F>* src, i64 ld, const SigMap& m, Out* dst) -> std::string {
    const i64 blocks = cdiv(m.nsig, 2 * d.pairs);
    if (blocks == 0) return "";
    if (blocks > INT32_MAX) return "FFT transform: too many signals for one launch";
    fft_inverse_kernel<Out, F><<<static_cast<unsigned>(blocks), kThreads, tsmem, io.stream>>>(
        src, ld, m, d, dst, F(1) / static_cast<F>(pl.points));
    return launch_error("inverse transform");
  };
  // The channel product over all bins and groups; M, N, Kr and the strides within a (bin, group)
  // as i64 here, checked to fit the kernel's ints.
  auto gemm = [&](const Cx<F>* A, const Cx<F>* B, Cx<F>* C, i64 M, i64 N, i64 Kr, i64 a_m,
                  i64 a_k, i64 b_k, i64 b_n, i64 c_m, i64 c_n, GemmArgs g) -> std::string {
    const i64 span = std::max({(M - 1) * a_m + (Kr - 1) * a_k, (Kr - 1) * b_k + (N - 1) * b_n,
                               (M - 1) * c_m + (N - 1) * c_n, M, N, Kr});
    if (span >= INT32_MAX)
      return "FFT channel product: a frequency's matrices exceed 2^31 elements";
    g.M = static_cast<int>(M), g.N = static_cast<int>(N), g.Kr = static_cast<int>(Kr);
    g.a_m = static_cast<int>(a_m), g.a_k = static_cast<int>(a_k);
    g.b_k = static_cast<int>(b_k), g.b_n = static_cast<int>(b_n);
    g.c_m = static_cast<int>(c_m), g.c_n = static_cast<int>(c_n);
    const bool narrow = N <= 32;
    g.mt = cdiv(M, kBM), g.nt = cdiv(N, narrow ? 32 : 64);
    const i64 blocks = g.bins * g.G * g.mt * g.nt;
    if (blocks == 0) return "";
    if (blocks > INT32_MAX) return "FFT channel product: grid of " + std::to_string(blocks) +
                                   " blocks exceeds the launch limit";
    if (narrow)
      cgemm_kernel<F, 32><<<static_cast<unsigned>(blocks), 64, gemm_smem<F, 32>(), io.stream>>>(
          A, B, C, g);
    else
      cgemm_kernel<F, 64><<<static_cast<unsigned>(blocks), 128, gemm_smem<F, 64>(), io.stream>>>(
          A, B, C, g);
    return launch_error("channel product");
  };

  const In* a_src = static_cast<const In*>(io.a);
  const In* b_src = static_cast<const In*>(io.b);
  Out* out = static_cast<Out*>(io.out);
  if (op != ConvOp::kBackwardFilter) {
    const bool fwd = op == ConvOp::kForward;
    const FwdJob<In, F> filter_job = job(b_src, fm, SP, fm.nsig);
    const i64* a_ext = fwd ? p.in : p.out;   // x or dy
    const i64* o_ext = fwd ? p.out : p.in;   // y or dx
    const i64 I = fwd ? Cg : Kg;             // reduction per group
    for (i64 r0 = 0; r0 < pl.rows; r0 += pl.chunk) {
      const i64 nr = std::min(pl.chunk, pl.rows - r0);
      const SigMap am = act_map(sh.Ci, a_ext, off_in, zero3, win_in, r0, nr);
      // The filter's transform rides along with the first chunk's, after it (its blocks are
      // the shorter ones: fewer stages).
      const FwdJob<In, F> act_job = job(a_src, am, SA, nr * sh.Ci);
      if (std::string e = forward(act_job, r0 == 0 ? filter_job : none);
          !e.empty())
        return e;
      GemmArgs g{};
      g.G = G, g.bins = pl.bins;
      g.a_bin = nr * sh.Ci, g.a_g = I;
      g.b_bin = sh.p_rows * sh.p_cols, g.b_g = I * sh.p_cols;
      g.c_bin = nr * sh.Co, g.c_g = sh.p_cols;
      g.conj_b = fwd;
      if (std::string e = gemm(SA, SP, SQ, nr, sh.p_cols, I, sh.Ci, 1, sh.p_cols, 1, sh.Co, 1, g);
          !e.empty())
        return e;
      const SigMap om = fwd ? act_map(sh.Co, o_ext, zero3, zero3, win_out, r0, nr)
                            : act_map(sh.Co, o_ext, off_dx, wlo_dx, whi_dx, r0, nr);
      if (std::string e = inverse(SQ, nr * sh.Co, om, out); !e.empty()) return e;
    }
    return "";
  }
  // Backward-filter: P = sum over chunks of rows of X . conj(DY), in chunk order, then inverse.
  for (i64 r0 = 0; r0 < pl.rows; r0 += pl.chunk) {
    const i64 nr = std::min(pl.chunk, pl.rows - r0);
    const SigMap xm = act_map(p.C, p.in, off_in, zero3, win_in, r0, nr);
    const SigMap dm = act_map(p.K, p.out, zero3, zero3, win_out, r0, nr);
    if (std::string e = forward(job(a_src, xm, SA, nr * p.C), job(b_src, dm, SQ, nr * p.K));
        !e.empty())
      return e;
    GemmArgs g{};
    g.G = G, g.bins = pl.bins;
    g.a_bin = nr * p.C, g.a_g = Cg;
    g.b_bin = nr * p.K, g.b_g = Kg;
    g.c_bin = p.C * Kg, g.c_g = Cg * Kg;
    g.conj_b = true;
    g.accumulate = r0 > 0;
    if (std::string e = gemm(SA, SQ, SP, Cg, Kg, nr, 1, p.C, p.K, 1, Kg, 1, g); !e.empty())
      return e;
  }
  return inverse(SP, fm.nsig, fm, out);
}

std::string axes_text(const ConvProblem& p, const i64* v) {
  std::string s = "(";
  for (int a = 3 - p.spatial_dims; a < 3; ++a) {
    s += std::to_string(v[a]);
    if (a < 2) s += ", ";
  }
  return s + (p.spatial_dims == 1 ? ",)" : ")");
}

}  // namespace

std::string fft_can_implement(const CudaConvCall& c) {
  const ConvProblem& p = c.problem;
  const std::string name = conv_algo_name(c.algo);
  auto not_one = [](const i64* v) { return v[0] != 1 || v[1] != 1 || v[2] != 1; };
  if (not_one(p.stride)) return name + " needs window_strides 1, got " + axes_text(p, p.stride);
  if (not_one(p.dilation)) return name + " needs rhs_dilation 1, got " + axes_text(p, p.dilation);
  if (not_one(p.lhs_dilation))
    return name + " needs lhs_dilation 1, got " + axes_text(p, p.lhs_dilation);
  const size_t cb = cx_bytes_of(c.in);
  if (c.algo == ConvAlgo::kFft) {
    // Both passes of a layer (out + R - 1 and in + R - 1 per axis) must fit, so that all three
    // operations agree.
    i64 pts = 1, pts_bwd = 1;
    for (int a = 0; a < 3; ++a) {
      if (p.filt[a] == 1) continue;
      pts *= next_pow2(std::max<i64>(p.out[a], 1) + p.filt[a] - 1);
      pts_bwd *= next_pow2(std::max<i64>(p.in[a], 1) + p.filt[a] - 1);
    }
    if (std::max(pts, pts_bwd) > kMaxPoints)
      return "FFT transforms the whole image in shared memory on the GPU and " +
             std::to_string(std::max(pts, pts_bwd)) + " transform points exceed its limit of " +
             std::to_string(kMaxPoints) + " (use FFT_TILING)";
  } else {
    const Plan pl = make_plan(c.op, p, true, cb);
    if (!pl.ok)
      return "FFT_TILING on the GPU needs a power-of-two tile longer than the filter per axis "
             "within " + std::to_string(kMaxPoints) + " transform points; filter " +
             axes_text(p, p.filt) + " is too large";
  }
  const Plan pl = make_plan(c.op, p, c.algo == ConvAlgo::kFftTiling, cb);
  const i64 spectrum = pl.bins * pl.sh.p_rows * pl.sh.p_cols * static_cast<i64>(cb);
  if (spectrum > kMaxFilterSpectrumBytes)
    return name + " would need " + std::to_string(spectrum >> 20) + " MiB for its filter " +
           "spectrum (" + std::to_string(pl.bins) + " frequencies x " + std::to_string(p.Cg()) +
           " x " + std::to_string(p.K) + " channels), over its GPU limit of " +
           std::to_string(kMaxFilterSpectrumBytes >> 20) + " MiB";
  return "";
}

size_t fft_workspace_bytes(const CudaConvCall& c) {
  const Plan pl = make_plan(c.op, c.problem, c.algo == ConvAlgo::kFftTiling, cx_bytes_of(c.in));
  return pl.ok && pl.rows > 0 ? static_cast<size_t>(pl.bytes) : 0;
}

std::string fft_run(const CudaConvCall& c, const CudaConvBuffers& io) {
  if (!io.epi.empty()) return std::string(conv_algo_name(c.algo)) + " carries no fused epilogue";
  switch (c.in) {
    case DType::kF32: return run_typed<float, float, float>(c, io);
    case DType::kF64: return run_typed<double, double, double>(c, io);
    case DType::kBF16:
      return c.out == DType::kF32 ? run_typed<__nv_bfloat16, float, float>(c, io)
                                  : run_typed<__nv_bfloat16, __nv_bfloat16, float>(c, io);
    case DType::kF16:
      return c.out == DType::kF32 ? run_typed<__half, float, float>(c, io)
                                  : run_typed<__half, __half, float>(c, io);
  }
  return "unsupported dtype";
}

}  // namespace jaxdnn::cuda
