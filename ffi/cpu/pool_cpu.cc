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

  static void run(PoolOp op, const PoolProblem& p, const void* a, const void* b, void* out,
                  void* workspace) {
    const S* as = static_cast<const S*>(a);
    const S* bs = static_cast<const S*>(b);
    S* os = static_cast<S*>(out);
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
  switch (dtype) {
    case DType::kF32: PoolKernels<float>::run(op, p, a, b, out, workspace); break;
    case DType::kF64: PoolKernels<double>::run(op, p, a, b, out, workspace); break;
    case DType::kBF16: PoolKernels<BF16>::run(op, p, a, b, out, workspace); break;
    case DType::kF16: PoolKernels<F16>::run(op, p, a, b, out, workspace); break;
  }
  return "";
}

}  // namespace jaxdnn::cpu
