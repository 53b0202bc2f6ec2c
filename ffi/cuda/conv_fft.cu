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
//   fft_forward_kernel  2 * pairs real signals per CTA: gathered (any layout / window, zero
//                       padding, bit-reversed placement) as pairs z = a + i b, radix-2 DIT passes
//                       along each axis in shared memory, separated into the half spectra
//                       A = (Z(u) + conj Z(-u)) / 2, B = (Z(u) - conj Z(-u)) / 2i, stored
//                       spectrum[bin][signal] (signal index fastest: adjacent signals coalesce).
//   cgemm_kernel        per (bin, group) a complex matrix product over channels (fwd/dgrad) or
//                       over rows (wgrad), tiled 32 x 64 x 16 through shared memory, 4 x 4
//                       complex outputs per thread, fp32 (fp64) FMAs: no TF32 anywhere.
//   fft_inverse_kernel  Z = A + i B rebuilt from two half spectra (Hermitian extension), inverse
//                       passes, real part -> signal a, imaginary part -> signal b, cropped to
//                       the tile's window and converted to the output dtype.
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

__device__ SigGeom signal_geom(const SigMap& m, i64 s) {
  SigGeom g;
  g.base = -1;
  if (s >= m.nsig) return g;
  i64 t0[3] = {0, 0, 0};
  if (m.kind == 0) {
    const i64 row = m.r0 + s / m.chans, ch = s % m.chans;
    const i64 n = row / m.tiles, t = row % m.tiles;
    t0[2] = (t % m.nt[2]) * m.To[2];
    t0[1] = (t / m.nt[2] % m.nt[1]) * m.To[1];
    t0[0] = (t / (static_cast<i64>(m.nt[2]) * m.nt[1])) * m.To[0];
    g.base = n * m.sn + ch * m.sc;
  } else {
    const i64 i = s / m.chans, j = s % m.chans;
    const i64 k = m.swap ? i : (i / m.Cg) * m.Kg + j, cin = m.swap ? j : i % m.Cg;
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

// In-place decimation-in-time passes along every axis over all pairs of the CTA (input
// bit-reversed per axis, output natural). Inverse: exp(+2 pi i jk / L), unscaled. Two radix-2
// stages (spans 2h and 4h) are done at once on 4 elements in registers ("radix 2^2"): for
// k < h, elements e_j = i0 + j h,
//   b0, b1 = e0 +- w_2h^k e1,  b2, b3 = e2 +- w_2h^k e3,
//   e0, e2 = b0 +- w_4h^k b2,  e1, e3 = b1 +- w_4h^(k+h) b3,  w_4h^(k+h) = -+i w_4h^k,
// so a pass costs half the barriers and shared-memory round trips; an odd last stage is
// radix 2.
template <typename F, bool Inv>
__device__ void fft_passes(Cx<F>* z, const Cx<F>* tw, const FftDims& d) {
  const int half_p = d.P >> 1, nb = d.pairs * half_p;
  const int quarter_p = d.P >> 2, nb4 = d.pairs * quarter_p;
  for (int a = 2; a >= 0; --a) {
    const int La = d.L[a], lgLa = d.lg[a];
    if (La == 1) continue;
    const int lsa = pass_stride_log(d, a);
    int lh = 0;
    for (; lh + 1 < lgLa; lh += 2) {
      const int h = 1 << lh;
      for (int t = threadIdx.x; t < nb4; t += blockDim.x) {
        const int pr = t >> (d.lgP - 2), b = t & (quarter_p - 1);
        const int lo = b & ((1 << lsa) - 1), rest = b >> lsa;
        const int q = rest & ((La >> 2) - 1), hi = rest >> (lgLa - 2);
        const int k = q & (h - 1), i0 = ((q >> lh) << (lh + 2)) + k;
        Cx<F>* e = z + pr * d.P + (((hi << lgLa) + i0) << lsa) + lo;
        const int s = h << lsa;
        Cx<F> w1 = tw[k << (d.lgLmax - lh - 1)], w2 = tw[k << (d.lgLmax - lh - 2)];
        if (Inv) w1.im = -w1.im, w2.im = -w2.im;
        const Cx<F> x1 = cmul(e[s], w1), x3 = cmul(e[3 * s], w1), x0 = e[0], x2 = e[2 * s];
        const Cx<F> b0{x0.re + x1.re, x0.im + x1.im}, b1{x0.re - x1.re, x0.im - x1.im};
        const Cx<F> b2{x2.re + x3.re, x2.im + x3.im}, b3{x2.re - x3.re, x2.im - x3.im};
        const Cx<F> c2 = cmul(b2, w2), t3 = cmul(b3, w2);
        // w_4h^(k+h) b3 = t3 * (-i) forward, t3 * (+i) inverse.
        const Cx<F> c3 = Inv ? Cx<F>{-t3.im, t3.re} : Cx<F>{t3.im, -t3.re};
        e[0] = Cx<F>{b0.re + c2.re, b0.im + c2.im};
        e[2 * s] = Cx<F>{b0.re - c2.re, b0.im - c2.im};
        e[s] = Cx<F>{b1.re + c3.re, b1.im + c3.im};
        e[3 * s] = Cx<F>{b1.re - c3.re, b1.im - c3.im};
      }
      __syncthreads();
    }
    for (; lh < lgLa; ++lh) {
      const int h = 1 << lh;
      for (int t = threadIdx.x; t < nb; t += blockDim.x) {
        const int pr = t >> (d.lgP - 1), b = t & (half_p - 1);
        const int lo = b & ((1 << lsa) - 1), rest = b >> lsa;
        const int q = rest & ((La >> 1) - 1), hi = rest >> (lgLa - 1);
        const int k = q & (h - 1), i0 = ((q >> lh) << (lh + 1)) + k;
        const int e0 = pr * d.P + (((hi << lgLa) + i0) << lsa) + lo, e1 = e0 + (h << lsa);
        Cx<F> w = tw[k << (d.lgLmax - lh - 1)];
        if (Inv) w.im = -w.im;
        const Cx<F> x0 = z[e0], y = z[e1];
        const F x1r = y.re * w.re - y.im * w.im, x1i = y.re * w.im + y.im * w.re;
        z[e0] = Cx<F>{x0.re + x1r, x0.im + x1i};
        z[e1] = Cx<F>{x0.re - x1r, x0.im - x1i};
      }
      __syncthreads();
    }
  }
}

// Shared memory of a transform CTA: pairs * P complex, Lmax / 2 twiddles, 2 * pairs geometries.
template <typename F>
size_t transform_smem(const FftDims& d) {
  return sizeof(Cx<F>) * (static_cast<size_t>(d.pairs) * d.P + d.Lmax / 2) +
         sizeof(SigGeom) * 2 * d.pairs;
}

// Spectra of signals [s0, s0 + 2 pairs) of `map` into dst[bin * ld + s].
template <typename In, typename F>
__global__ void __launch_bounds__(kThreads)
fft_forward_kernel(const In* __restrict__ src, SigMap map, FftDims d, Cx<F>* __restrict__ dst,
                   i64 ld) {
  extern __shared__ __align__(16) unsigned char fft_smem[];
  Cx<F>* z = reinterpret_cast<Cx<F>*>(fft_smem);
  Cx<F>* tw = z + d.pairs * d.P;
  SigGeom* geo = reinterpret_cast<SigGeom*>(tw + d.Lmax / 2);
  const int nsig = 2 * d.pairs;
  const i64 s0 = static_cast<i64>(blockIdx.x) * nsig;
  fill_twiddles(tw, d);
  for (int s = threadIdx.x; s < nsig; s += blockDim.x) geo[s] = signal_geom(map, s0 + s);
  __syncthreads();
  // Gather: pair index fastest, so neighbouring threads read neighbouring channels (NHWC).
  for (int idx = threadIdx.x; idx < d.pairs * d.P; idx += blockDim.x) {
    const int pr = idx & (d.pairs - 1), pos = idx >> d.lgpairs;
    int j[3];
    split_pos(d, pos, j);
    F v[2];
    for (int h = 0; h < 2; ++h) {
      const SigGeom& g = geo[2 * pr + h];
      v[h] = F(0);
      if (g.base >= 0 && j[0] >= g.lo[0] && j[0] < g.hi[0] && j[1] >= g.lo[1] &&
          j[1] < g.hi[1] && j[2] >= g.lo[2] && j[2] < g.hi[2])
        v[h] = static_cast<F>(to_f(src[g.base + (g.org[0] + j[0]) * map.sp[0] +
                                        (g.org[1] + j[1]) * map.sp[1] +
                                        (g.org[2] + j[2]) * map.sp[2]]));
    }
    z[pr * d.P + reversed_pos(d, j)] = Cx<F>{v[0], v[1]};
  }
  __syncthreads();
  fft_passes<F, false>(z, tw, d);
  // Separate the pairs' half spectra; signal index fastest (coalesced stores).
  for (int idx = threadIdx.x; idx < nsig * d.bins; idx += blockDim.x) {
    const int sl = idx & (nsig - 1), bin = idx >> (d.lgpairs + 1);
    if (s0 + sl >= map.nsig) continue;
    const int v = bin % d.H2, u01 = bin / d.H2;
    const int u1 = u01 & (d.L[1] - 1), u0 = u01 >> d.lg[1];
    const int mu0 = (d.L[0] - u0) & (d.L[0] - 1), mu1 = (d.L[1] - u1) & (d.L[1] - 1);
    const int mv = (d.L[2] - v) & (d.L[2] - 1);
    const Cx<F>* zp = z + (sl >> 1) * d.P;
    const Cx<F> p = zp[(((u0 << d.lg[1]) + u1) << d.lg[2]) + v];
    const Cx<F> m = zp[(((mu0 << d.lg[1]) + mu1) << d.lg[2]) + mv];
    Cx<F> o;
    if ((sl & 1) == 0)
      o = Cx<F>{F(0.5) * (p.re + m.re), F(0.5) * (p.im - m.im)};
    else
      o = Cx<F>{F(0.5) * (p.im + m.im), F(0.5) * (m.re - p.re)};
    dst[bin * ld + s0 + sl] = o;
  }
}

// Inverse of the half spectra src[bin * ld + s] of signals [s0, s0 + 2 pairs), times scale,
// stored into the windows of `map` in the output dtype.
template <typename Out, typename F>
__global__ void __launch_bounds__(kThreads)
fft_inverse_kernel(const Cx<F>* __restrict__ src, i64 ld, SigMap map, FftDims d,
                   Out* __restrict__ dst, F scale) {
  extern __shared__ __align__(16) unsigned char fft_smem[];
  Cx<F>* z = reinterpret_cast<Cx<F>*>(fft_smem);
  Cx<F>* tw = z + d.pairs * d.P;
  SigGeom* geo = reinterpret_cast<SigGeom*>(tw + d.Lmax / 2);
  const int nsig = 2 * d.pairs;
  const i64 s0 = static_cast<i64>(blockIdx.x) * nsig;
  fill_twiddles(tw, d);
  for (int s = threadIdx.x; s < nsig; s += blockDim.x) geo[s] = signal_geom(map, s0 + s);
  // Z = A + i B over the full spectrum: for v < H2 directly, (ar - bi, ai + br); otherwise from
  // the mirrored bin (A(u) = conj A(-u), likewise B): (ar + bi, br - ai).
  for (int idx = threadIdx.x; idx < d.pairs * d.P; idx += blockDim.x) {
    const int pr = idx & (d.pairs - 1), pos = idx >> d.lgpairs;
    int j[3];
    split_pos(d, pos, j);
    const bool direct = j[2] < d.H2;
    const int u0 = direct ? j[0] : (d.L[0] - j[0]) & (d.L[0] - 1);
    const int u1 = direct ? j[1] : (d.L[1] - j[1]) & (d.L[1] - 1);
    const int v = direct ? j[2] : d.L[2] - j[2];
    const i64 bin = (static_cast<i64>(u0) * d.L[1] + u1) * d.H2 + v;
    const i64 sa = s0 + 2 * pr;
    const Cx<F> zero{F(0), F(0)};
    const Cx<F> A = sa < map.nsig ? src[bin * ld + sa] : zero;
    const Cx<F> B = sa + 1 < map.nsig ? src[bin * ld + sa + 1] : zero;
    z[pr * d.P + reversed_pos(d, j)] =
        direct ? Cx<F>{A.re - B.im, A.im + B.re} : Cx<F>{A.re + B.im, B.re - A.im};
  }
  __syncthreads();
  fft_passes<F, true>(z, tw, d);
  for (int idx = threadIdx.x; idx < d.pairs * d.P; idx += blockDim.x) {
    const int pr = idx & (d.pairs - 1), pos = idx >> d.lgpairs;
    int j[3];
    split_pos(d, pos, j);
    const Cx<F> r = z[pr * d.P + pos];
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
constexpr int kBM = 32, kBN = 64, kBK = 16, kGemmThreads = 128, kPad = 2;

struct GemmArgs {
  i64 M, N, Kr, G, bins, mt, nt;
  i64 a_bin, a_g, a_m, a_k;
  i64 b_bin, b_g, b_k, b_n;
  i64 c_bin, c_g, c_m, c_n;
  bool conj_b, accumulate;
};

template <typename F>
size_t gemm_smem() {
  return sizeof(Cx<F>) * kBK * ((kBM + kPad) + (kBN + kPad));
}

template <typename F>
__global__ void __launch_bounds__(kGemmThreads)
cgemm_kernel(const Cx<F>* __restrict__ A, const Cx<F>* __restrict__ B, Cx<F>* __restrict__ C,
             GemmArgs g) {
  extern __shared__ __align__(16) unsigned char fft_smem[];
  Cx<F>* As = reinterpret_cast<Cx<F>*>(fft_smem);  // [kBK][kBM + kPad]
  Cx<F>* Bs = As + kBK * (kBM + kPad);              // [kBK][kBN + kPad]
  const i64 id = blockIdx.x;
  const i64 tn = id % g.nt, tm = id / g.nt % g.mt, bg = id / (g.nt * g.mt);
  const i64 bin = bg / g.G, grp = bg % g.G;
  const i64 m0 = tm * kBM, n0 = tn * kBN;
  const Cx<F>* Ab = A + bin * g.a_bin + grp * g.a_g;
  const Cx<F>* Bb = B + bin * g.b_bin + grp * g.b_g;
  Cx<F>* Cb = C + bin * g.c_bin + grp * g.c_g;
  // 8 x 16 threads, each rows rm + 8 i and columns cn + 16 j (i, j < 4): a half-warp reads 16
  // consecutive B elements (no bank conflicts) and stores 16 consecutive C elements.
  const int rm = threadIdx.x / 16, cn = threadIdx.x % 16;
  const F sgn = g.conj_b ? F(-1) : F(1);
  F accr[4][4], acci[4][4];
  for (int i = 0; i < 4; ++i)
    for (int jj = 0; jj < 4; ++jj) accr[i][jj] = acci[i][jj] = F(0);
  const Cx<F> zero{F(0), F(0)};
  for (i64 k0 = 0; k0 < g.Kr; k0 += kBK) {
    // Tiles in, the unit-stride index along consecutive threads.
    for (int e = threadIdx.x; e < kBM * kBK; e += kGemmThreads) {
      const int kk = g.a_k == 1 ? e % kBK : e / kBM, mm = g.a_k == 1 ? e / kBK : e % kBM;
      const i64 gm = m0 + mm, gk = k0 + kk;
      As[kk * (kBM + kPad) + mm] = gm < g.M && gk < g.Kr ? Ab[gm * g.a_m + gk * g.a_k] : zero;
    }
    for (int e = threadIdx.x; e < kBN * kBK; e += kGemmThreads) {
      const int nn = g.b_n == 1 ? e % kBN : e / kBK, kk = g.b_n == 1 ? e / kBN : e % kBK;
      const i64 gn = n0 + nn, gk = k0 + kk;
      Bs[kk * (kBN + kPad) + nn] = gn < g.N && gk < g.Kr ? Bb[gk * g.b_k + gn * g.b_n] : zero;
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kBK; ++kk) {
      Cx<F> a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = As[kk * (kBM + kPad) + rm + 8 * i];
      for (int jj = 0; jj < 4; ++jj) {
        b[jj] = Bs[kk * (kBN + kPad) + cn + 16 * jj];
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
    const i64 gm = m0 + rm + 8 * i;
    if (gm >= g.M) continue;
    for (int jj = 0; jj < 4; ++jj) {
      const i64 gn = n0 + cn + 16 * jj;
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
  const size_t tsmem = transform_smem<F>(d), gsmem = gemm_smem<F>();
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

  auto forward = [&](const In* src, const SigMap& m, Cx<F>* dst, i64 ld) -> std::string {
    const i64 blocks = cdiv(m.nsig, 2 * d.pairs);
    if (blocks == 0) return "";
    if (blocks > INT32_MAX) return "FFT transform: too many signals for one launch";
    fft_forward_kernel<In, F><<<static_cast<unsigned>(blocks), kThreads, tsmem, io.stream>>>(
        src, m, d, dst, ld);
    return launch_error("forward transform");
  };
  auto inverse = [&](const Cx<F>* src, i64 ld, const SigMap& m, Out* dst) -> std::string {
    const i64 blocks = cdiv(m.nsig, 2 * d.pairs);
    if (blocks == 0) return "";
    if (blocks > INT32_MAX) return "FFT transform: too many signals for one launch";
    fft_inverse_kernel<Out, F><<<static_cast<unsigned>(blocks), kThreads, tsmem, io.stream>>>(
        src, ld, m, d, dst, F(1) / static_cast<F>(pl.points));
    return launch_error("inverse transform");
  };
  auto gemm = [&](const Cx<F>* A, const Cx<F>* B, Cx<F>* C, GemmArgs g) -> std::string {
    g.mt = cdiv(g.M, kBM), g.nt = cdiv(g.N, kBN);
    const i64 blocks = g.bins * g.G * g.mt * g.nt;
    if (blocks == 0) return "";
    if (blocks > INT32_MAX) return "FFT channel product: grid of " + std::to_string(blocks) +
                                   " blocks exceeds the launch limit";
    cgemm_kernel<F><<<static_cast<unsigned>(blocks), kGemmThreads, gsmem, io.stream>>>(A, B, C,
                                                                                      g);
    return launch_error("channel product");
  };

  const In* a_src = static_cast<const In*>(io.a);
  const In* b_src = static_cast<const In*>(io.b);
  Out* out = static_cast<Out*>(io.out);
  if (op != ConvOp::kBackwardFilter) {
    const bool fwd = op == ConvOp::kForward;
    if (std::string e = forward(b_src, fm, SP, fm.nsig); !e.empty()) return e;
    const i64* a_ext = fwd ? p.in : p.out;   // x or dy
    const i64* o_ext = fwd ? p.out : p.in;   // y or dx
    const i64 I = fwd ? Cg : Kg;             // reduction per group
    for (i64 r0 = 0; r0 < pl.rows; r0 += pl.chunk) {
      const i64 nr = std::min(pl.chunk, pl.rows - r0);
      const SigMap am = act_map(sh.Ci, a_ext, off_in, zero3, win_in, r0, nr);
      if (std::string e = forward(a_src, am, SA, nr * sh.Ci); !e.empty()) return e;
      GemmArgs g{};
      g.M = nr, g.N = sh.p_cols, g.Kr = I, g.G = G, g.bins = pl.bins;
      g.a_bin = nr * sh.Ci, g.a_g = I, g.a_m = sh.Ci, g.a_k = 1;
      g.b_bin = sh.p_rows * sh.p_cols, g.b_g = I * sh.p_cols, g.b_k = sh.p_cols, g.b_n = 1;
      g.c_bin = nr * sh.Co, g.c_g = sh.p_cols, g.c_m = sh.Co, g.c_n = 1;
      g.conj_b = fwd;
      if (std::string e = gemm(SA, SP, SQ, g); !e.empty()) return e;
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
    if (std::string e = forward(a_src, xm, SA, nr * p.C); !e.empty()) return e;
    const SigMap dm = act_map(p.K, p.out, zero3, zero3, win_out, r0, nr);
    if (std::string e = forward(b_src, dm, SQ, nr * p.K); !e.empty()) return e;
    GemmArgs g{};
    g.M = Cg, g.N = Kg, g.Kr = nr, g.G = G, g.bins = pl.bins;
    g.a_bin = nr * p.C, g.a_g = Cg, g.a_m = 1, g.a_k = p.C;
    g.b_bin = nr * p.K, g.b_g = Kg, g.b_k = p.K, g.b_n = 1;
    g.c_bin = p.C * Kg, g.c_g = Cg * Kg, g.c_m = Kg, g.c_n = 1;
    g.conj_b = true;
    g.accumulate = r0 > 0;
    if (std::string e = gemm(SA, SQ, SP, g); !e.empty()) return e;
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
