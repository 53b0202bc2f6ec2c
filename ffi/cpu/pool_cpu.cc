// CPU pooling kernels: max and average pooling, forward and backward, channels-last.
//
// Forward-shaped operations (max, its arg-max gather, avg) run in parallel over output rows
// (n, o0, o1); backward-shaped ones (scatter to the arg-max, avg transpose) run in parallel over
// input rows and *gather* the contributions of the windows covering each input element, so no
// two threads write the same element and the summation order is fixed: results are
// deterministic. Inner loops run over channels, contiguous in memory, and vectorize.
//
// Arg-max rule (lax's select_and_scatter with `ge`, which jax.grad of a max reduce_window uses):
// the first tap of a window is selected, and each later tap v replaces the selection s unless
// s >= v. Padding taps take part with the value -inf and route nothing. So ties keep the first
// tap in window order; a NaN selection is always replaced and a NaN tap always replaces; a
// window whose leading padding is followed only by -inf inputs selects the padding (its gradient
// vanishes, as in lax).
//
// Single-channel problems (channels-first layouts, folded to N*C images of one channel) run the
// forward operations along output rows instead of channels.
//
// 16-bit inputs are widened per element and accumulated in float32; float64 in float64.
//
// Global pooling (one window covering the whole input: out = 1, window = in, no low padding,
// dilation 1) has its own kernels with the same arithmetic, bitwise: channels-last sums over the
// pixels in window order per channel, accumulated in registers over 16-channel vectors;
// single-channel (channels-first) sums each image's rows first and then the row sums, as
// forward_single_channel does (16 images at a time, rows of <= 16 elements as vector lanes); the
// backward writes dy * (1 / divisor) (avg) or 0 + dy at the arg-max tap (max: first tap, the
// same rule) and zeros elsewhere, computed once per image and channel and copied to the pixels.
// The AVX-512 paths are taken for float32 and bfloat16 when the compiler targets AVX-512
// (F, BW, VL); the rest runs the same arithmetic in plain loops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "f16_storage.h"
#include "parallel.h"
#include "pool_cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define JAXDNN_POOL_AVX512 1
#endif

namespace jaxdnn::cpu {
namespace {

using f16::BF16;
using f16::F16;
using f16::load;
using f16::store;

template <typename S>
using Acc = f16::Compute<S>;

template <typename A>
constexpr A kInf = std::numeric_limits<A>::infinity();

// Taps k in [0, window) of a window whose tap 0 sits at input position `start` such that
// lo <= start + k * dilation < hi, as the half-open range [*k0, *k1).
inline void tap_range(int64_t start, int64_t dilation, int64_t window, int64_t lo, int64_t hi,
                      int64_t* k0, int64_t* k1) {
  int64_t first = start >= lo ? 0 : (lo - start + dilation - 1) / dilation;
  int64_t last = start >= hi ? 0 : (hi - 1 - start) / dilation + 1;
  last = std::min(last, window);
  *k0 = std::min(first, last);
  *k1 = last;
}

// Calls fn(tap, pixel) for the in-bounds taps of output position o, in window order; `tap` is
// the flat window index, `pixel` the flat input position inside the image.
template <typename Fn>
inline void for_each_tap(const PoolProblem& p, const int64_t o[3], Fn&& fn) {
  int64_t start[3], k0[3], k1[3];
  for (int d = 0; d < 3; ++d) {
    start[d] = o[d] * p.stride[d] - p.pad_lo[d];
    tap_range(start[d], p.dilation[d], p.window[d], 0, p.in[d], &k0[d], &k1[d]);
  }
  for (int64_t a = k0[0]; a < k1[0]; ++a) {
    const int64_t i0 = start[0] + a * p.dilation[0];
    for (int64_t b = k0[1]; b < k1[1]; ++b) {
      const int64_t row = (i0 * p.in[1] + start[1] + b * p.dilation[1]) * p.in[2];
      for (int64_t c = k0[2]; c < k1[2]; ++c)
        fn((a * p.window[1] + b) * p.window[2] + c, row + start[2] + c * p.dilation[2]);
    }
  }
}

// Calls fn(tap, pixel) for every tap of output position o in window order, with pixel = -1 for
// padding taps.
template <typename Fn>
inline void for_each_window_tap(const PoolProblem& p, const int64_t o[3], Fn&& fn) {
  int64_t start[3], k0[3], k1[3];
  bool inside = true;
  for (int d = 0; d < 3; ++d) {
    start[d] = o[d] * p.stride[d] - p.pad_lo[d];
    tap_range(start[d], p.dilation[d], p.window[d], 0, p.in[d], &k0[d], &k1[d]);
    inside = inside && k0[d] == 0 && k1[d] == p.window[d];
  }
  if (inside) {
    for_each_tap(p, o, fn);
    return;
  }
  for (int64_t a = 0; a < p.window[0]; ++a) {
    const bool in_a = a >= k0[0] && a < k1[0];
    const int64_t i0 = start[0] + a * p.dilation[0];
    for (int64_t b = 0; b < p.window[1]; ++b) {
      const bool in_ab = in_a && b >= k0[1] && b < k1[1];
      const int64_t row = (i0 * p.in[1] + start[1] + b * p.dilation[1]) * p.in[2];
      for (int64_t c = 0; c < p.window[2]; ++c) {
        const bool in = in_ab && c >= k0[2] && c < k1[2];
        fn((a * p.window[1] + b) * p.window[2] + c, in ? row + start[2] + c * p.dilation[2] : -1);
      }
    }
  }
}

// Per dimension and input index i, the (tap, output index) pairs of the windows covering i:
// input i is tap k of output o when o * stride = i + pad_lo - k * dilation.
struct CoverLists {
  std::vector<int64_t> begin[3];  // pairs of index i are [begin[d][i], begin[d][i + 1])
  std::vector<int64_t> tap[3], out[3];

  explicit CoverLists(const PoolProblem& p) {
    for (int d = 0; d < 3; ++d) {
      begin[d].assign(p.in[d] + 1, 0);
      for (int64_t i = 0; i < p.in[d]; ++i) {
        begin[d][i] = static_cast<int64_t>(tap[d].size());
        for (int64_t k = 0; k < p.window[d]; ++k) {
          const int64_t t = i + p.pad_lo[d] - k * p.dilation[d];
          if (t < 0) break;
          if (t % p.stride[d] || t / p.stride[d] >= p.out[d]) continue;
          tap[d].push_back(k);
          out[d].push_back(t / p.stride[d]);
        }
      }
      begin[d][p.in[d]] = static_cast<int64_t>(tap[d].size());
    }
  }

  // Number of windows covering input position i.
  int64_t count(const int64_t i[3]) const {
    int64_t n = 1;
    for (int d = 0; d < 3; ++d) n *= begin[d][i[d] + 1] - begin[d][i[d]];
    return n;
  }
};

// Calls fn(tap, o0, o1, o2) for the windows covering input position i, in an order fixed for i.
template <typename Fn>
inline void for_each_covering_window(const PoolProblem& p, const CoverLists& L,
                                     const int64_t i[3], Fn&& fn) {
  for (int64_t a = L.begin[0][i[0]]; a < L.begin[0][i[0] + 1]; ++a) {
    for (int64_t b = L.begin[1][i[1]]; b < L.begin[1][i[1] + 1]; ++b) {
      const int64_t tap01 = L.tap[0][a] * p.window[1] + L.tap[1][b];
      for (int64_t c = L.begin[2][i[2]]; c < L.begin[2][i[2] + 1]; ++c)
        fn(tap01 * p.window[2] + L.tap[2][c], L.out[0][a], L.out[1][b], L.out[2][c]);
    }
  }
}

// Per-dimension divisor factors of avg pooling: taps of output o inside the counting region.
std::vector<int64_t> divisor_factors(const PoolProblem& p, int d) {
  std::vector<int64_t> f(p.out[d]);
  for (int64_t o = 0; o < p.out[d]; ++o) {
    int64_t k0, k1;
    tap_range(o * p.stride[d] - p.pad_lo[d], p.dilation[d], p.window[d], -p.count_lo[d],
              p.in[d] + p.count_hi[d], &k0, &k1);
    f[o] = k1 - k0;
  }
  return f;
}

// Rows of at least ~16K inner iterations per parallel chunk.
int64_t min_rows(int64_t row_work) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_work)); }

// fn(n, r0, r1, buffer) over rows (n, r0, r1) of an (N, e0, e1, e2, C) array, in parallel.
template <typename Fn>
void for_rows(int64_t N, const int64_t extent[3], int64_t row_work, Fn&& fn) {
  const int64_t rows = N * extent[0] * extent[1];
  parallel_for(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t r1 = r % extent[1], r0 = (r / extent[1]) % extent[0];
      fn(r / (extent[0] * extent[1]), r0, r1);
    }
  }, min_rows(row_work));
}

// Whether p is one window over the whole input (global pooling): every tap in bounds, taps in
// pixel order (tap index = flat pixel index), every tap counted by the avg divisor.
bool is_global(const PoolProblem& p) {
  for (int d = 0; d < 3; ++d) {
    if (p.out[d] != 1 || p.window[d] != p.in[d] || p.pad_lo[d] != 0) return false;
    if (p.dilation[d] != 1 && p.window[d] != 1) return false;
  }
  return true;
}

// Work units per parallel chunk so that a chunk has at least ~32K elements of work.
int64_t min_units(int64_t unit_work) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, unit_work));
}

#if defined(JAXDNN_POOL_AVX512)
// 16 float32 lanes from 16 stored values (load / store as f16::load / f16::store do).
inline __m512 vload16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 vload16(const BF16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// The first n < 16 lanes (the others 0).
inline __m512 vload16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 vload16(const BF16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// bfloat16 bits (low 16 bits of each lane) of f16::store<BF16>: nearest even, NaN quieted.
inline __m512i bf16_bits(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i hi = _mm512_srli_epi32(bits, 16);
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)),
                       _mm512_and_si512(hi, one)), 16);
  const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}
inline void vstore16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void vstore16(BF16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits(v)));
}
// max as forward_single_channel's reduce: v replaces m when v > m or v is NaN. (vmaxps(v, m)
// is v > m ? v : m, so only a NaN v needs the blend.)
inline __m512 vmax_nan(__m512 m, __m512 v) {
  return _mm512_mask_mov_ps(_mm512_max_ps(v, m), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
}
inline __m256 vmax_nan(__m256 m, __m256 v) {
  return _mm256_mask_mov_ps(_mm256_max_ps(v, m), _mm256_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
}
// 8 float32 lanes, the first n < 8 from p (the others 0).
inline __m256 vload8(const float* p, __mmask8 m) { return _mm256_maskz_loadu_ps(m, p); }
inline __m256 vload8(const BF16* p, __mmask8 m) {
  const __m128i h = _mm_maskz_loadu_epi16(m, p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// The 8-lane forms of bf16_bits / vstore16.
inline __m256i bf16_bits(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(bits, 16);
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)),
                       _mm256_and_si256(hi, _mm256_set1_epi32(1))), 16);
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __mmask8 nan = _mm256_cmpgt_epu32_mask(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  return _mm256_mask_blend_epi32(nan, rounded, quiet);
}
inline void vstore8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void vstore8(BF16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtepi32_epi16(bf16_bits(v)));
}
// 8 x 8 transpose: out[k] lane i = r[i] lane k.
inline void transpose8(const __m256 r[8], __m256 out[8]) {
  __m256 t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
    u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xee);
    u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
    u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xee);
  }
  for (int k = 0; k < 4; ++k) {
    out[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
    out[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
  }
}
// 16 x 16 transpose: out[w] lane j = t[j] lane w.
inline void transpose16_full(const __m512 t[16], __m512 out[16]) {
  __m512 a[16], b[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; j += 2) {
    a[j] = _mm512_unpacklo_ps(t[j], t[j + 1]);
    a[j + 1] = _mm512_unpackhi_ps(t[j], t[j + 1]);
  }
#pragma GCC unroll 16
  for (int j = 0; j < 16; j += 4) {
    const __m512d a0 = _mm512_castps_pd(a[j]), a1 = _mm512_castps_pd(a[j + 1]);
    const __m512d a2 = _mm512_castps_pd(a[j + 2]), a3 = _mm512_castps_pd(a[j + 3]);
    b[j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    b[j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    b[j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    b[j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  // b[4g + r], 128-bit lane q, element e = t[4g + e][4q + r]. First pair 128-bit lanes of
  // (b[r], b[4 + r]) and (b[8 + r], b[12 + r]), then pick lane q of each.
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    const __m512 lo01 = _mm512_shuffle_f32x4(b[r], b[4 + r], 0x44);   // b[r].0 b[r].1 b[4+r].0 b[4+r].1
    const __m512 lo23 = _mm512_shuffle_f32x4(b[r], b[4 + r], 0xee);   // lanes 2, 3
    const __m512 hi01 = _mm512_shuffle_f32x4(b[8 + r], b[12 + r], 0x44);
    const __m512 hi23 = _mm512_shuffle_f32x4(b[8 + r], b[12 + r], 0xee);
    out[r] = _mm512_shuffle_f32x4(lo01, hi01, 0x88);       // q = 0: lanes 0, 2 of each
    out[4 + r] = _mm512_shuffle_f32x4(lo01, hi01, 0xdd);   // q = 1: lanes 1, 3
    out[8 + r] = _mm512_shuffle_f32x4(lo23, hi23, 0x88);   // q = 2
    out[12 + r] = _mm512_shuffle_f32x4(lo23, hi23, 0xdd);  // q = 3
  }
}
// Transposes the first `rows` (<= 16) rows' lanes: out[w] lane j = t[j] lane w, for w < rows_out.
inline void transpose16(const __m512 t[16], __m512 out[16], int rows_out) {
  __m512 a[16], b[16];
  for (int j = 0; j < 16; j += 2) {
    a[j] = _mm512_unpacklo_ps(t[j], t[j + 1]);
    a[j + 1] = _mm512_unpackhi_ps(t[j], t[j + 1]);
  }
  for (int j = 0; j < 16; j += 4) {
    const __m512d a0 = _mm512_castps_pd(a[j]), a1 = _mm512_castps_pd(a[j + 1]);
    const __m512d a2 = _mm512_castps_pd(a[j + 2]), a3 = _mm512_castps_pd(a[j + 3]);
    b[j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    b[j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    b[j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    b[j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  // b[4g + r], 128-bit lane q, element e = t[4g + e][4q + r].
  for (int w = 0; w < rows_out; ++w) {
    const int q = w / 4, r = w % 4;
    __m512 lo, hi;
    switch (q) {  // the lane selector must be an immediate
      case 0: lo = _mm512_shuffle_f32x4(b[r], b[4 + r], 0x00);
              hi = _mm512_shuffle_f32x4(b[8 + r], b[12 + r], 0x00); break;
      case 1: lo = _mm512_shuffle_f32x4(b[r], b[4 + r], 0x55);
              hi = _mm512_shuffle_f32x4(b[8 + r], b[12 + r], 0x55); break;
      case 2: lo = _mm512_shuffle_f32x4(b[r], b[4 + r], 0xaa);
              hi = _mm512_shuffle_f32x4(b[8 + r], b[12 + r], 0xaa); break;
      default: lo = _mm512_shuffle_f32x4(b[r], b[4 + r], 0xff);
               hi = _mm512_shuffle_f32x4(b[8 + r], b[12 + r], 0xff); break;
    }
    out[w] = _mm512_shuffle_f32x4(lo, hi, 0x88);
  }
}
#endif

template <typename S>
struct PoolKernels {
  using A = Acc<S>;
  // float32 and float64 results accumulate in the output row itself (one pass fewer).
  static constexpr bool kAccumulateInPlace = std::is_same_v<S, A>;

  static A* row_accumulator(S* row, std::vector<A>& scratch) {
    if constexpr (kAccumulateInPlace) {
      return row;
    } else {
      return scratch.data();
    }
  }

  static void max_forward(const PoolProblem& p, const S* x, S* y) {
    const int64_t C = p.C, in_pixels = p.in[0] * p.in[1] * p.in[2];
    for_rows(p.N, p.out, p.out[2] * C * p.window_elems(), [&](int64_t n, int64_t o0, int64_t o1) {
      std::vector<A> acc(C);
      const S* xn = x + n * in_pixels * C;
      S* yrow = y + ((n * p.out[0] + o0) * p.out[1] + o1) * p.out[2] * C;
      for (int64_t o2 = 0; o2 < p.out[2]; ++o2) {
        const int64_t o[3] = {o0, o1, o2};
        std::fill(acc.begin(), acc.end(), -std::numeric_limits<A>::infinity());
        A* m = acc.data();
        for_each_tap(p, o, [&](int64_t, int64_t pixel) {
          const S* xp = xn + pixel * C;
          for (int64_t c = 0; c < C; ++c) {  // lax's max: NaN wins and stays
            const A v = load(xp[c]);
            m[c] = (v > m[c] || v != v) ? v : m[c];
          }
        });
        for (int64_t c = 0; c < C; ++c) yrow[o2 * C + c] = store<S>(m[c]);
      }
    });
  }

  // Single-channel problems (channels-first layouts): windows are separable, so each output row
  // first reduces its window's input rows into one contiguous row (vectorized), then reduces
  // that row along the last dimension with the window's stride.
  template <bool kMax>
  static void forward_single_channel(const PoolProblem& p, const S* x, S* y) {
    const int64_t in_pixels = p.in[0] * p.in[1] * p.in[2], in2 = p.in[2], out2 = p.out[2];
    std::vector<int64_t> f0, f1, f2;
    if (!kMax) f0 = divisor_factors(p, 0), f1 = divisor_factors(p, 1), f2 = divisor_factors(p, 2);
    const A identity = kMax ? -kInf<A> : A(0);
    auto reduce = [](A acc, A v) { return kMax ? ((v > acc || v != v) ? v : acc) : acc + v; };
    for_rows(p.N, p.out, out2 * p.window_elems(), [&](int64_t n, int64_t o0, int64_t o1) {
      std::vector<A> column(in2, identity), acc(out2, identity);
      A* col = column.data();
      A* m = acc.data();
      int64_t start[2], k0[2], k1[2];
      const int64_t o[2] = {o0, o1};
      for (int d = 0; d < 2; ++d) {
        start[d] = o[d] * p.stride[d] - p.pad_lo[d];
        tap_range(start[d], p.dilation[d], p.window[d], 0, p.in[d], &k0[d], &k1[d]);
      }
      for (int64_t a = k0[0]; a < k1[0]; ++a) {
        for (int64_t b = k0[1]; b < k1[1]; ++b) {
          const int64_t i0 = start[0] + a * p.dilation[0], i1 = start[1] + b * p.dilation[1];
          const S* xr = x + n * in_pixels + (i0 * p.in[1] + i1) * in2;
          for (int64_t i = 0; i < in2; ++i) col[i] = reduce(col[i], load(xr[i]));
        }
      }
      const int64_t s2 = p.stride[2];
      for (int64_t c = 0; c < p.window[2]; ++c) {
        const int64_t off = c * p.dilation[2] - p.pad_lo[2];  // input of output 0's tap c
        int64_t q0, q1;  // outputs whose tap c is in bounds: 0 <= q * s2 + off < in2
        tap_range(off, s2, out2, 0, in2, &q0, &q1);
        for (int64_t q = q0; q < q1; ++q) m[q] = reduce(m[q], col[q * s2 + off]);
      }
      S* yrow = y + ((n * p.out[0] + o0) * p.out[1] + o1) * out2;
      if (kMax) {
        for (int64_t q = 0; q < out2; ++q) yrow[q] = store<S>(m[q]);
      } else {
        const A f01 = static_cast<A>(f0[o0] * f1[o1]);
        for (int64_t q = 0; q < out2; ++q) yrow[q] = store<S>(m[q] / (f01 * A(f2[q])));
      }
    });
  }

  // One tap for n outputs: s, g (selection, tangent) advance to the tap's (v, t) by the
  // arg-max rule of max_gather (restrict: the compiler may vectorize).
  static void gather_taps(A* __restrict s, A* __restrict g, const A* __restrict v,
                          const A* __restrict t, int64_t n) {
    for (int64_t q = 0; q < n; ++q) {
      const bool take = !(s[q] >= v[q]);
      s[q] = take ? v[q] : s[q];
      g[q] = take ? t[q] : g[q];
    }
  }

  // max_gather for one channel (channels-first planes): every output of a row advances through
  // its window's taps in for_each_window_tap's (a, b, c) order, out-of-bounds taps as -inf with
  // a zero tangent, so ties and NaN resolve as in max_gather. Each input row of the window is
  // first split into its stride phases (xph[r][k] = x[r + k * s2]), so that tap c of outputs
  // q reads phase r contiguously at q + base (q * s2 + off = (q + base) * s2 + r) and the loop
  // over the row's outputs vectorizes.
  static void max_gather_single_channel(const PoolProblem& p, const S* x, const S* t, S* y) {
    const int64_t in_pixels = p.in[0] * p.in[1] * p.in[2], in2 = p.in[2], out2 = p.out[2];
    const int64_t s2 = p.stride[2], len = (in2 + s2 - 1) / s2;  // elements per phase
    for_rows(p.N, p.out, out2 * p.window_elems(), [&](int64_t n, int64_t o0, int64_t o1) {
      // Per-thread scratch, reused across rows (rows are short: one allocation per row cost
      // as much as the row's work).
      thread_local std::vector<A> scratch;
      scratch.resize(static_cast<size_t>(2 * out2 + 2 * s2 * len));
      A* sv = scratch.data();
      A* g = sv + out2;
      A* xph = g + out2;
      A* tph = xph + s2 * len;
      std::fill(sv, sv + out2, std::numeric_limits<A>::quiet_NaN());
      std::fill(g, g + out2, A(0));
      const int64_t start0 = o0 * p.stride[0] - p.pad_lo[0];
      const int64_t start1 = o1 * p.stride[1] - p.pad_lo[1];
      auto pad = [&](int64_t qa, int64_t qb) {  // an out-of-bounds tap: -inf, zero tangent
        for (int64_t q = qa; q < qb; ++q) {
          const bool take = !(sv[q] >= -kInf<A>);
          sv[q] = take ? -kInf<A> : sv[q];
          g[q] = take ? A(0) : g[q];
        }
      };
      for (int64_t a = 0; a < p.window[0]; ++a) {
        const int64_t i0 = start0 + a * p.dilation[0];
        for (int64_t b = 0; b < p.window[1]; ++b) {
          const int64_t i1 = start1 + b * p.dilation[1];
          if (i0 < 0 || i0 >= p.in[0] || i1 < 0 || i1 >= p.in[1]) {
            for (int64_t c = 0; c < p.window[2]; ++c) pad(0, out2);
            continue;
          }
          const int64_t row = n * in_pixels + (i0 * p.in[1] + i1) * in2;
          for (int64_t r = 0; r < s2 && r < in2; ++r) {
            const int64_t n_r = (in2 - r + s2 - 1) / s2;  // inputs r, r + s2, ... < in2
            const S* xs = x + row + r;
            const S* ts = t + row + r;
            A* xd = xph + r * len;
            A* td = tph + r * len;
            for (int64_t k = 0; k < n_r; ++k) {
              xd[k] = load(xs[k * s2]);
              td[k] = load(ts[k * s2]);
            }
          }
          for (int64_t c = 0; c < p.window[2]; ++c) {
            const int64_t off = c * p.dilation[2] - p.pad_lo[2];  // input of output 0's tap c
            int64_t q0, q1;  // outputs whose tap c is in bounds: 0 <= q * s2 + off < in2
            tap_range(off, s2, out2, 0, in2, &q0, &q1);
            const int64_t r = ((off % s2) + s2) % s2, at = r * len + (off - r) / s2;
            pad(0, q0);
            gather_taps(sv + q0, g + q0, xph + at + q0, tph + at + q0, q1 - q0);
            pad(q1, out2);
          }
        }
      }
      S* yrow = y + ((n * p.out[0] + o0) * p.out[1] + o1) * out2;
      for (int64_t q = 0; q < out2; ++q) yrow[q] = store<S>(g[q]);
    });
  }

  // Tangent at the arg-max of x per window (0 for windows with no in-bounds tap).
  static void max_gather(const PoolProblem& p, const S* x, const S* t, S* y) {
    const int64_t C = p.C, in_pixels = p.in[0] * p.in[1] * p.in[2];
    for_rows(p.N, p.out, p.out[2] * C * p.window_elems(), [&](int64_t n, int64_t o0, int64_t o1) {
      std::vector<A> best(C), picked(C);
      const S* xn = x + n * in_pixels * C;
      const S* tn = t + n * in_pixels * C;
      S* yrow = y + ((n * p.out[0] + o0) * p.out[1] + o1) * p.out[2] * C;
      for (int64_t o2 = 0; o2 < p.out[2]; ++o2) {
        const int64_t o[3] = {o0, o1, o2};
        // A NaN "selection" is replaced by the first tap, whatever its value.
        std::fill(best.begin(), best.end(), std::numeric_limits<A>::quiet_NaN());
        std::fill(picked.begin(), picked.end(), A(0));
        A* s = best.data();
        A* g = picked.data();
        for_each_window_tap(p, o, [&](int64_t, int64_t pixel) {
          if (pixel < 0) {  // padding: -inf with a zero tangent
            for (int64_t c = 0; c < C; ++c) {
              const bool take = !(s[c] >= -kInf<A>);
              s[c] = take ? -kInf<A> : s[c];
              g[c] = take ? A(0) : g[c];
            }
            return;
          }
          const S* xp = xn + pixel * C;
          const S* tp = tn + pixel * C;
          for (int64_t c = 0; c < C; ++c) {
            const A v = load(xp[c]);
            const bool take = !(s[c] >= v);
            s[c] = take ? v : s[c];
            g[c] = take ? load(tp[c]) : g[c];
          }
        });
        for (int64_t c = 0; c < C; ++c) yrow[o2 * C + c] = store<S>(g[c]);
      }
    });
  }

  // dx = dy summed onto each window's arg-max: arg-max taps into `arg` (one per output element,
  // -1 for windows with no in-bounds tap), then a gather over the windows covering each input.
  static void max_scatter(const PoolProblem& p, const S* x, const S* dy, S* dx, int32_t* arg) {
    const int64_t C = p.C, in_pixels = p.in[0] * p.in[1] * p.in[2];
    const int64_t out_pixels = p.out[0] * p.out[1] * p.out[2];
    for_rows(p.N, p.out, p.out[2] * C * p.window_elems(), [&](int64_t n, int64_t o0, int64_t o1) {
      std::vector<A> best(C);
      const S* xn = x + n * in_pixels * C;
      int32_t* arow = arg + ((n * p.out[0] + o0) * p.out[1] + o1) * p.out[2] * C;
      for (int64_t o2 = 0; o2 < p.out[2]; ++o2) {
        const int64_t o[3] = {o0, o1, o2};
        std::fill(best.begin(), best.end(), std::numeric_limits<A>::quiet_NaN());
        A* s = best.data();
        int32_t* idx = arow + o2 * C;
        std::fill(idx, idx + C, -1);
        for_each_window_tap(p, o, [&](int64_t tap, int64_t pixel) {
          if (pixel < 0) {  // padding: -inf, routes to no input
            for (int64_t c = 0; c < C; ++c) {
              const bool take = !(s[c] >= -kInf<A>);
              s[c] = take ? -kInf<A> : s[c];
              idx[c] = take ? -1 : idx[c];
            }
            return;
          }
          const S* xp = xn + pixel * C;
          const int32_t k = static_cast<int32_t>(tap);
          for (int64_t c = 0; c < C; ++c) {
            const A v = load(xp[c]);
            const bool take = !(s[c] >= v);
            s[c] = take ? v : s[c];
            idx[c] = take ? k : idx[c];
          }
        });
      }
    });
    const CoverLists lists(p);
    for_rows(p.N, p.in, p.in[2] * C * 2, [&](int64_t n, int64_t i0, int64_t i1) {
      std::vector<A> acc(C);
      const S* dyn = dy + n * out_pixels * C;
      const int32_t* an = arg + n * out_pixels * C;
      S* dxrow = dx + ((n * p.in[0] + i0) * p.in[1] + i1) * p.in[2] * C;
      for (int64_t i2 = 0; i2 < p.in[2]; ++i2) {
        const int64_t i[3] = {i0, i1, i2};
        A* g = row_accumulator(dxrow + i2 * C, acc);
        std::fill(g, g + C, A(0));
        for_each_covering_window(p, lists, i, [&](int64_t tap, int64_t q0, int64_t q1,
                                                  int64_t q2) {
          const int64_t opix = (q0 * p.out[1] + q1) * p.out[2] + q2;
          const int32_t k = static_cast<int32_t>(tap);
          const int32_t* ap = an + opix * C;
          const S* dp = dyn + opix * C;
          for (int64_t c = 0; c < C; ++c) g[c] += ap[c] == k ? load(dp[c]) : A(0);
        });
        if (!kAccumulateInPlace)
          for (int64_t c = 0; c < C; ++c) dxrow[i2 * C + c] = store<S>(g[c]);
      }
    });
  }

  static void avg_forward(const PoolProblem& p, const S* x, S* y) {
    const int64_t C = p.C, in_pixels = p.in[0] * p.in[1] * p.in[2];
    const std::vector<int64_t> f0 = divisor_factors(p, 0), f1 = divisor_factors(p, 1),
                               f2 = divisor_factors(p, 2);
    for_rows(p.N, p.out, p.out[2] * C * p.window_elems(), [&](int64_t n, int64_t o0, int64_t o1) {
      std::vector<A> acc(C);
      const S* xn = x + n * in_pixels * C;
      S* yrow = y + ((n * p.out[0] + o0) * p.out[1] + o1) * p.out[2] * C;
      for (int64_t o2 = 0; o2 < p.out[2]; ++o2) {
        const int64_t o[3] = {o0, o1, o2};
        std::fill(acc.begin(), acc.end(), A(0));
        A* sum = acc.data();
        for_each_tap(p, o, [&](int64_t, int64_t pixel) {
          const S* xp = xn + pixel * C;
          for (int64_t c = 0; c < C; ++c) sum[c] += load(xp[c]);
        });
        // An empty counting region gives 0/0 = NaN, as lax's sum / count does.
        const A divisor = static_cast<A>(f0[o0] * f1[o1] * f2[o2]);
        for (int64_t c = 0; c < C; ++c) yrow[o2 * C + c] = store<S>(sum[c] / divisor);
      }
    });
  }

  // dx[i] = sum over the windows o covering i of dy[o] / divisor[o].
  static void avg_backward(const PoolProblem& p, const S* dy, S* dx) {
    const int64_t C = p.C, out_pixels = p.out[0] * p.out[1] * p.out[2];
    const std::vector<int64_t> f0 = divisor_factors(p, 0), f1 = divisor_factors(p, 1),
                               f2 = divisor_factors(p, 2);
    const CoverLists lists(p);
    for_rows(p.N, p.in, p.in[2] * C * 2, [&](int64_t n, int64_t i0, int64_t i1) {
      std::vector<A> acc(C);
      const S* dyn = dy + n * out_pixels * C;
      S* dxrow = dx + ((n * p.in[0] + i0) * p.in[1] + i1) * p.in[2] * C;
      for (int64_t i2 = 0; i2 < p.in[2]; ++i2) {
        const int64_t i[3] = {i0, i1, i2};
        if (lists.count(i) == 1) {  // non-overlapping windows, global pooling: one pass
          for_each_covering_window(p, lists, i, [&](int64_t, int64_t q0, int64_t q1, int64_t q2) {
            const A inv = A(1) / static_cast<A>(f0[q0] * f1[q1] * f2[q2]);
            const S* dp = dyn + ((q0 * p.out[1] + q1) * p.out[2] + q2) * C;
            S* dst = dxrow + i2 * C;
            for (int64_t c = 0; c < C; ++c) dst[c] = store<S>(load(dp[c]) * inv);
          });
          continue;
        }
        A* g = row_accumulator(dxrow + i2 * C, acc);
        std::fill(g, g + C, A(0));
        for_each_covering_window(p, lists, i, [&](int64_t, int64_t q0, int64_t q1, int64_t q2) {
          const int64_t opix = (q0 * p.out[1] + q1) * p.out[2] + q2;
          const A inv = A(1) / static_cast<A>(f0[q0] * f1[q1] * f2[q2]);
          const S* dp = dyn + opix * C;
          for (int64_t c = 0; c < C; ++c) g[c] += load(dp[c]) * inv;
        });
        if (!kAccumulateInPlace)
          for (int64_t c = 0; c < C; ++c) dxrow[i2 * C + c] = store<S>(g[c]);
      }
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Global pooling (is_global): same arithmetic as the general kernels, bitwise.

#if defined(JAXDNN_POOL_AVX512)
  static constexpr bool kSimd = std::is_same_v<S, float> || std::is_same_v<S, BF16>;
#else
  static constexpr bool kSimd = false;
#endif

  static A global_divisor(const PoolProblem& p) {  // avg_forward's divisor of the one window
    return static_cast<A>(divisor_factors(p, 0)[0] * divisor_factors(p, 1)[0] *
                          divisor_factors(p, 2)[0]);
  }

  // Channels-last: y[n, c] = reduce over pixels q, in order, of x[n, q, c] (max_forward's max,
  // avg_forward's sum / divisor). Parallel over (n, block of channels).
  template <bool kMax>
  static void global_forward(const PoolProblem& p, const S* x, S* y) {
    const int64_t C = p.C, P = p.in[0] * p.in[1] * p.in[2];
    const A divisor = kMax ? A(1) : global_divisor(p);
    constexpr int64_t CB = 256;  // 16 registers of float32 sums; 1 KB of a pixel's row per load

    const int64_t blocks = (C + CB - 1) / CB;
    parallel_for(p.N * blocks, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t n = u / blocks, c0 = (u % blocks) * CB, cb = std::min(CB, C - c0);
        const S* xs = x + n * P * C + c0;
        S* ys = y + n * C + c0;
        int64_t c = 0;
#if defined(JAXDNN_POOL_AVX512)
        if constexpr (std::is_same_v<S, BF16>) {
          if (cb == CB) {  // 32 channels per load: even channels << 16, odd ones masked
            constexpr int V = CB / 32;
            const __m512i hi_half = _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u));
            __m512 even[V], odd[V];
            for (int v = 0; v < V; ++v) even[v] = odd[v] = _mm512_set1_ps(kMax ? -kInf<float> : 0.0f);
            for (int64_t q = 0; q < P; ++q) {
              const S* xp = xs + q * C;
#pragma GCC unroll 8
              for (int v = 0; v < V; ++v) {
                const __m512i w = _mm512_loadu_si512(xp + 32 * v);
                const __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
                const __m512 o = _mm512_castsi512_ps(_mm512_and_si512(w, hi_half));
                even[v] = kMax ? vmax_nan(even[v], e) : _mm512_add_ps(even[v], e);
                odd[v] = kMax ? vmax_nan(odd[v], o) : _mm512_add_ps(odd[v], o);
              }
            }
            const __m512 d = _mm512_set1_ps(divisor);
            for (int v = 0; v < V; ++v) {
              const __m512i e = bf16_bits(kMax ? even[v] : _mm512_div_ps(even[v], d));
              const __m512i o = bf16_bits(kMax ? odd[v] : _mm512_div_ps(odd[v], d));
              _mm512_storeu_si512(ys + 32 * v, _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
            }
            continue;
          }
        } else if constexpr (kSimd) {
          if (cb == CB) {
            constexpr int V = CB / 16;
            __m512 acc[V];
            for (int v = 0; v < V; ++v) acc[v] = _mm512_set1_ps(kMax ? -kInf<float> : 0.0f);
            for (int64_t q = 0; q < P; ++q) {
              const S* xp = xs + q * C;
#pragma GCC unroll 16
              for (int v = 0; v < V; ++v) {
                const __m512 val = vload16(xp + 16 * v);
                acc[v] = kMax ? vmax_nan(acc[v], val) : _mm512_add_ps(acc[v], val);
              }
            }
            const __m512 d = _mm512_set1_ps(divisor);
            for (int v = 0; v < V; ++v)
              vstore16(ys + 16 * v, kMax ? acc[v] : _mm512_div_ps(acc[v], d));
            c = CB;
          }
        }
#endif
        if (c == cb) continue;
        A acc[CB];
        for (int64_t k = c; k < cb; ++k) acc[k] = kMax ? -kInf<A> : A(0);
        for (int64_t q = 0; q < P; ++q) {
          const S* xp = xs + q * C;
          for (int64_t k = c; k < cb; ++k) {
            const A v = load(xp[k]);
            acc[k] = kMax ? ((v > acc[k] || v != v) ? v : acc[k]) : acc[k] + v;
          }
        }
        for (int64_t k = c; k < cb; ++k) ys[k] = store<S>(kMax ? acc[k] : acc[k] / divisor);
      }
    }, min_units(P * CB));
  }

  // One channel (channels-first): image i has R = in0 * in1 rows of W = in2 elements; as
  // forward_single_channel, the rows are reduced into one row (col), then col in order. With
  // AVX-512 and W <= 16, 16 images at a time: each image's row reduction in one vector, the 16
  // vectors transposed so that the final reduction runs over the 16 images' lanes.
  template <bool kMax>
  static void global_forward_single(const PoolProblem& p, const S* x, S* y) {
    const int64_t I = p.N, R = p.in[0] * p.in[1], W = p.in[2], P = R * W;
    const std::vector<int64_t> f0 = divisor_factors(p, 0), f1 = divisor_factors(p, 1),
                               f2 = divisor_factors(p, 2);
    const A divisor = static_cast<A>(f0[0] * f1[0]) * A(f2[0]);  // as forward_single_channel
    const A identity = kMax ? -kInf<A> : A(0);
    auto reduce = [](A acc, A v) { return kMax ? ((v > acc || v != v) ? v : acc) : acc + v; };
    constexpr int64_t B = 16;
    parallel_for((I + B - 1) / B, [&](int64_t b0, int64_t b1) {
      thread_local std::vector<A> scratch;
      scratch.resize(static_cast<size_t>(W));
      A* col = scratch.data();
      for (int64_t b = b0; b < b1; ++b) {
        int64_t i = b * B;
        const int64_t i1 = std::min(I, i + B);
#if defined(JAXDNN_POOL_AVX512)
        if constexpr (kSimd) {
          if (W <= 16 && i1 - i == B) {
            global_block16<kMax>(x + i * P, y + i, R, W, identity, divisor);
            i = i1;
          }
        }
#endif
        for (; i < i1; ++i) {
          const S* xi = x + i * P;
          for (int64_t w = 0; w < W; ++w) col[w] = identity;
          for (int64_t r = 0; r < R; ++r)
            for (int64_t w = 0; w < W; ++w) col[w] = reduce(col[w], load(xi[r * W + w]));
          A m = identity;
          for (int64_t w = 0; w < W; ++w) m = reduce(m, col[w]);
          y[i] = store<S>(kMax ? m : m / divisor);
        }
      }
    }, min_units(B * P));
  }

#if defined(JAXDNN_POOL_AVX512)
  // 16 consecutive one-channel images of R rows of W <= 16 (P = R * W contiguous elements each):
  // row reductions with the images in 16 independent registers (rows of <= 8 elements in
  // 256-bit registers), transposed, then reduced over the W lanes in order.
  template <bool kMax>
  static void global_block16(const S* x, S* y, const int64_t R, const int64_t W, const A identity,
                             const A divisor) {
    const int64_t P = R * W;
    __m512 t[16], cols[16];
    if (W <= 8) {  // two blocks of 8 images in 256-bit registers
      const __mmask8 m = static_cast<__mmask8>((1u << W) - 1);
      for (int h = 0; h < 2; ++h) {
        __m256 c[8], tc[8];
        for (int j = 0; j < 8; ++j) c[j] = _mm256_set1_ps(identity);
        const S* xh = x + 8 * h * P;
        for (int64_t r = 0; r < R; ++r) {
          const S* xr = xh + r * W;
#pragma GCC unroll 8
          for (int j = 0; j < 8; ++j) {
            const __m256 v = vload8(xr + j * P, m);
            c[j] = kMax ? vmax_nan(c[j], v) : _mm256_add_ps(c[j], v);
          }
        }
        transpose8(c, tc);
        __m256 acc = _mm256_set1_ps(identity);
        for (int64_t w = 0; w < W; ++w)
          acc = kMax ? vmax_nan(acc, tc[w]) : _mm256_add_ps(acc, tc[w]);
        vstore8(y + 8 * h, kMax ? acc : _mm256_div_ps(acc, _mm256_set1_ps(divisor)));
      }
      return;
    } else {
      const __mmask16 m = static_cast<__mmask16>((1u << W) - 1);
      for (int j = 0; j < 16; ++j) t[j] = _mm512_set1_ps(identity);
      for (int64_t r = 0; r < R; ++r) {
        const S* xr = x + r * W;
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) {
          const __m512 v = vload16(xr + j * P, m);
          t[j] = kMax ? vmax_nan(t[j], v) : _mm512_add_ps(t[j], v);
        }
      }
    }
    transpose16(t, cols, static_cast<int>(W));
    __m512 acc = _mm512_set1_ps(identity);
    for (int64_t w = 0; w < W; ++w)
      acc = kMax ? vmax_nan(acc, cols[w]) : _mm512_add_ps(acc, cols[w]);
    vstore16(y, kMax ? acc : _mm512_div_ps(acc, _mm512_set1_ps(divisor)));
  }
#endif

  // dst[k] = store(load(src[k]) * inv), k < n (avg_backward's one-window store).
  static void scale_row(const S* src, S* dst, int64_t n, A inv) {
    int64_t k = 0;
#if defined(JAXDNN_POOL_AVX512)
    if constexpr (kSimd) {
      const __m512 f = _mm512_set1_ps(inv);
      for (; k + 16 <= n; k += 16) vstore16(dst + k, _mm512_mul_ps(vload16(src + k), f));
    }
#endif
    for (; k < n; ++k) dst[k] = store<S>(load(src[k]) * inv);
  }

  // dx = dy / divisor at every pixel (avg_backward: dy * (1 / divisor), one window per input):
  // the row of an image is computed once and copied to its other pixels.
  static void global_avg_backward(const PoolProblem& p, const S* dy, S* dx) {
    const int64_t C = p.C, P = p.in[0] * p.in[1] * p.in[2];
    const A inv = A(1) / global_divisor(p);
    if (C == 1) return global_avg_backward_single(p.N, P, inv, dy, dx);
    parallel_for(p.N * P, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1;) {
        const int64_t n = r / P, end = std::min(r1, (n + 1) * P);
        S* first = dx + r * C;
        scale_row(dy + n * C, first, C, inv);
        for (int64_t q = r + 1; q < end; ++q)
          std::memcpy(dx + q * C, first, static_cast<size_t>(C) * sizeof(S));
        r = end;
      }
    }, min_units(C));
  }

  // One channel: image i (P contiguous elements) is store(load(dy[i]) * inv) everywhere. With
  // AVX-512, L = 64 / sizeof(S) images at a time: their P * L outputs are P vectors, each a lane
  // permutation of the L values (lane l of vector t holds image (t * L + l) / P).
  static void global_avg_backward_single(int64_t I, int64_t P, A inv, const S* dy, S* dx) {
    constexpr int64_t L = 64 / static_cast<int64_t>(sizeof(S));
    const bool simd = kSimd && P < 64;
    std::vector<uint32_t> perm32;
    std::vector<uint16_t> perm16;
    if (simd) {
      for (int64_t e = 0; e < P * L; ++e) {
        if (sizeof(S) == 4) perm32.push_back(static_cast<uint32_t>(e / P));
        else perm16.push_back(static_cast<uint16_t>(e / P));
      }
    }
    parallel_for((I + L - 1) / L, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t i = b * L;
        const int64_t i1 = std::min(I, i + L);
#if defined(JAXDNN_POOL_AVX512)
        if constexpr (kSimd) {
          if (simd && i1 - i == L) {
            const __m512 f = _mm512_set1_ps(inv);
            S* out = dx + i * P;
            if constexpr (std::is_same_v<S, float>) {
              const __m512 vals = _mm512_mul_ps(vload16(dy + i), f);
              for (int64_t t = 0; t < P; ++t) {
                const __m512i idx = _mm512_loadu_si512(perm32.data() + t * L);
                _mm512_storeu_ps(out + t * L, _mm512_permutexvar_ps(idx, vals));
              }
            } else {
              const __m256i lo = _mm512_cvtepi32_epi16(bf16_bits(_mm512_mul_ps(vload16(dy + i), f)));
              const __m256i hi =
                  _mm512_cvtepi32_epi16(bf16_bits(_mm512_mul_ps(vload16(dy + i + 16), f)));
              const __m512i vals = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
              for (int64_t t = 0; t < P; ++t) {
                const __m512i idx = _mm512_loadu_si512(perm16.data() + t * L);
                _mm512_storeu_si512(out + t * L, _mm512_permutexvar_epi16(idx, vals));
              }
            }
            i = i1;
          }
        }
#endif
        for (; i < i1; ++i) std::fill_n(dx + i * P, P, store<S>(load(dy[i]) * inv));
      }
    }, min_units(L * P));
  }

  // max_scatter of one window: dx = 0 + dy at the arg-max pixel (first pixel, replaced by a
  // later value v unless the selection s >= v), +0 elsewhere. First the arg-max pixel of every
  // (n, c) into `arg` (the workspace), over blocks of channels; then the rows of dx, contiguous.
  static void global_max_scatter(const PoolProblem& p, const S* x, const S* dy, S* dx,
                                 int32_t* arg) {
    const int64_t C = p.C, P = p.in[0] * p.in[1] * p.in[2];
    if (C == 1) return global_max_scatter_single(p.N, P, x, dy, dx);
    constexpr int64_t CB = 256;  // 16 selections + 16 arg-max registers
    const int64_t blocks = (C + CB - 1) / CB;
    parallel_for(p.N * blocks, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t n = u / blocks, c0 = (u % blocks) * CB, cb = std::min(CB, C - c0);
        const S* xs = x + n * P * C + c0;
        int32_t* as = arg + n * C + c0;
#if defined(JAXDNN_POOL_AVX512)
        if constexpr (kSimd) {
          if (cb == CB) {
            constexpr int V = CB / 16;
            __m512 sel[V];
            __m512i at[V];
            for (int v = 0; v < V; ++v) {
              sel[v] = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
              at[v] = _mm512_setzero_si512();
            }
            for (int64_t q = 0; q < P; ++q) {
              const S* xp = xs + q * C;
              const __m512i qv = _mm512_set1_epi32(static_cast<int32_t>(q));
#pragma GCC unroll 16
              for (int v = 0; v < V; ++v) {
                const __m512 val = vload16(xp + 16 * v);
                const __mmask16 take = _mm512_cmp_ps_mask(sel[v], val, _CMP_NGE_UQ);
                sel[v] = _mm512_mask_blend_ps(take, sel[v], val);
                at[v] = _mm512_mask_blend_epi32(take, at[v], qv);
              }
            }
            for (int v = 0; v < V; ++v) _mm512_storeu_si512(as + 16 * v, at[v]);
            continue;
          }
        }
#endif
        A s[CB];
        for (int64_t k = 0; k < cb; ++k) s[k] = std::numeric_limits<A>::quiet_NaN();
        for (int64_t q = 0; q < P; ++q) {
          const S* xp = xs + q * C;
          for (int64_t k = 0; k < cb; ++k) {
            const A v = load(xp[k]);
            const bool take = !(s[k] >= v);
            s[k] = take ? v : s[k];
            as[k] = take ? static_cast<int32_t>(q) : as[k];
          }
        }
      }
    }, min_units(P * CB));
    // Zeros (store<S>(A(0)) is all zero bits; memset writes whole lines without reading them
    // first), then 0 + dy at the arg-max pixels of the rows in this chunk.
    parallel_for(p.N * P, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1;) {
        const int64_t n = r / P, end = std::min(r1, (n + 1) * P);
        std::memset(static_cast<void*>(dx + r * C), 0,
                    static_cast<size_t>((end - r) * C) * sizeof(S));
        const int32_t q0 = static_cast<int32_t>(r - n * P), q1 = static_cast<int32_t>(end - n * P);
        const int32_t* as = arg + n * C;
        const S* ds = dy + n * C;
        S* dxn = dx + n * P * C;
        for (int64_t c = 0; c < C; ++c) {
          const int32_t q = as[c];
          if (q >= q0 && q < q1) dxn[q * C + c] = store<S>(A(0) + load(ds[c]));
        }
        r = end;
      }
    }, min_units(C));
  }

#if defined(JAXDNN_POOL_AVX512)
  // 16 consecutive one-channel images of P elements (dx already zero): the arg-max selection
  // runs in the lanes of the 16 images, over their elements in order, 16 at a time (16 x 16
  // transposes).
  static void global_scatter_block16(int64_t P, const S* x, const S* dy, S* dx) {
    __m512 sel = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
    __m512i at = _mm512_setzero_si512();
    __m512 t[16], cols[16];
    auto step = [&](__m512 v, int64_t e) {
      const __mmask16 take = _mm512_cmp_ps_mask(sel, v, _CMP_NGE_UQ);
      sel = _mm512_mask_blend_ps(take, sel, v);
      at = _mm512_mask_blend_epi32(take, at, _mm512_set1_epi32(static_cast<int32_t>(e)));
    };
    int64_t e0 = 0;
    for (; e0 + 16 <= P; e0 += 16) {
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) t[j] = vload16(x + j * P + e0);
      transpose16_full(t, cols);
#pragma GCC unroll 16
      for (int e = 0; e < 16; ++e) step(cols[e], e0 + e);
    }
    if (e0 < P) {
      const int n = static_cast<int>(P - e0);
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      for (int j = 0; j < 16; ++j) t[j] = vload16(x + j * P + e0, m);
      transpose16(t, cols, n);
      for (int e = 0; e < n; ++e) step(cols[e], e0 + e);
    }
    alignas(64) int32_t arg[16];
    alignas(64) float g[16];
    _mm512_store_si512(arg, at);
    _mm512_store_ps(g, _mm512_add_ps(_mm512_setzero_ps(), vload16(dy)));
    for (int j = 0; j < 16; ++j) {
      int64_t at_j = j * P + arg[j];
      asm("" : "+r"(at_j));  // 16 plain stores, not a (slow) vector scatter
      dx[at_j] = store<S>(g[j]);
    }
  }
#endif

  // One channel: image i's P contiguous elements; zeros, then 0 + dy[i] at its arg-max (four
  // images' selections interleaved).
  static void global_max_scatter_single(int64_t I, int64_t P, const S* x, const S* dy, S* dx) {
    static_assert(std::is_trivially_copyable_v<S>);
    parallel_for(I, [&](int64_t i0, int64_t i1) {
      std::memset(static_cast<void*>(dx + i0 * P), 0,  // store<S>(A(0)) is all zero bits
                  static_cast<size_t>((i1 - i0) * P) * sizeof(S));
      constexpr int G = 4;
      int64_t i = i0;
#if defined(JAXDNN_POOL_AVX512)
      if constexpr (kSimd) {
        for (; i + 16 <= i1; i += 16) global_scatter_block16(P, x + i * P, dy + i, dx + i * P);
      }
#endif
      for (; i + G <= i1; i += G) {
        A s[G];
        int64_t arg[G];
        for (int j = 0; j < G; ++j) s[j] = std::numeric_limits<A>::quiet_NaN(), arg[j] = 0;
        for (int64_t q = 0; q < P; ++q) {
          for (int j = 0; j < G; ++j) {
            const A v = load(x[(i + j) * P + q]);
            const bool take = !(s[j] >= v);
            s[j] = take ? v : s[j];
            arg[j] = take ? q : arg[j];
          }
        }
        for (int j = 0; j < G; ++j) dx[(i + j) * P + arg[j]] = store<S>(A(0) + load(dy[i + j]));
      }
      for (; i < i1; ++i) {
        A s = std::numeric_limits<A>::quiet_NaN();
        int64_t arg = 0;
        for (int64_t q = 0; q < P; ++q) {
          const A v = load(x[i * P + q]);
          const bool take = !(s >= v);
          s = take ? v : s;
          arg = take ? q : arg;
        }
        dx[i * P + arg] = store<S>(A(0) + load(dy[i]));
      }
    }, min_units(2 * P));
  }

  static void run(PoolOp op, const PoolProblem& p, const void* a, const void* b, void* out,
                  void* workspace) {
    const S* as = static_cast<const S*>(a);
    const S* bs = static_cast<const S*>(b);
    S* os = static_cast<S*>(out);
    if (is_global(p)) {
      switch (op) {
        case PoolOp::kMaxForward:
          p.C == 1 ? global_forward_single<true>(p, as, os) : global_forward<true>(p, as, os);
          return;
        case PoolOp::kAvgForward:
          p.C == 1 ? global_forward_single<false>(p, as, os) : global_forward<false>(p, as, os);
          return;
        case PoolOp::kMaxScatter:
          global_max_scatter(p, as, bs, os, static_cast<int32_t*>(workspace));
          return;
        case PoolOp::kAvgBackward: global_avg_backward(p, as, os); return;
        case PoolOp::kMaxGather: break;
      }
    }
    switch (op) {
      case PoolOp::kMaxForward:
        p.C == 1 ? forward_single_channel<true>(p, as, os) : max_forward(p, as, os);
        break;
      case PoolOp::kMaxGather:
        p.C == 1 ? max_gather_single_channel(p, as, bs, os) : max_gather(p, as, bs, os);
        break;
      case PoolOp::kMaxScatter: max_scatter(p, as, bs, os, static_cast<int32_t*>(workspace)); break;
      case PoolOp::kAvgForward:
        p.C == 1 ? forward_single_channel<false>(p, as, os) : avg_forward(p, as, os);
        break;
      case PoolOp::kAvgBackward: avg_backward(p, as, os); break;
    }
  }
};

}  // namespace

size_t pool_workspace_bytes(PoolOp op, const PoolProblem& p) {
  return op == PoolOp::kMaxScatter ? static_cast<size_t>(p.y_elems()) * sizeof(int32_t) : 0;
}

std::string run_pool(PoolOp op, const PoolProblem& p, DType dtype, const void* a, const void* b,
                     void* out, void* workspace, size_t workspace_size) {
  if (workspace_size < pool_workspace_bytes(op, p)) return "workspace buffer is too small";
  if (p.window_elems() > std::numeric_limits<int32_t>::max())
    return "the window has more than 2^31 elements";
  const bool known = f16::with_storage_type(dtype, [&](auto storage) {
    PoolKernels<decltype(storage)>::run(op, p, a, b, out, workspace);
  });
  return known ? "" : "unsupported dtype";
}

}  // namespace jaxdnn::cpu
