// CPU softmax and log_softmax, forward and backward, on [outer, n, inner] views
// (pointwise_problem.h).
//
// inner == 1 (the reduced axis is the last one, or all trailing axes are reduced): contiguous rows
// of n elements, three passes per row (max; sum of exp(x - m); normalize). The reductions are
// vectorized (`omp simd` reductions) in an order fixed by the build, so results do not depend on
// the thread count. Rows are split across the thread pool. The forward runs short rows four at a
// time (forward_rows4_f32), each row's reductions in the same order as alone (tests/test_softmax.py
// checks that a row's result is bitwise the same alone and among others).
// inner > 1: each task owns a block of up to kCols columns of one [n, inner] slab and runs the
// same three passes down the rows, with one accumulator per column (the inner loops run along the
// contiguous inner dimension). Blocks are as wide as the slab allows: every row of a block is a
// separate run in memory, and runs of 1 KB (256 columns) streamed from DRAM at 0.6x the speed of
// whole 14 KB rows (log_softmax backward over H of 4x56x56x64, float32, 4 distinct inputs). Slabs
// are split into narrower blocks only to give every thread work.
//
// NaN and inf behave as in jax.nn: x - m is NaN where x and the row maximum m are infinities of
// one sign (a row of all -inf, or any +inf in the row), and a NaN anywhere in a row makes the
// row's sum, hence its whole output, NaN; -inf entries of an otherwise finite row give 0
// (softmax) and -inf (log_softmax).
//
// float32 softmax stores exp(x - m) into y in the second pass and rescales it in the third.
// 16-bit rows of up to kGroup elements are widened to float32 in groups of rows and run the
// float32 kernels; longer 16-bit rows and the strided case convert block by block in each pass
// (recomputing exp in the third).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "activation_math.h"
#include "f16_convert.h"
#include "f16_storage.h"
#include "parallel.h"
#include "pointwise_cpu.h"

namespace jaxdnn::cpu {
namespace {

using f16::BF16;
using f16::F16;

constexpr int64_t kBlock = 512; // 16-bit types: elements converted per float32 block
constexpr int64_t kCols = 4096;  // strided case: most columns per task
constexpr int64_t kMinTaskElems = 1 << 15;

template <typename C>
constexpr C kNegInf = -std::numeric_limits<C>::infinity();

// Calls f(block, offset, len) over src[0, n) in blocks of compute-type values (16-bit values are
// converted into a stack buffer; float32 and float64 are read in place).
template <typename S, typename F>
inline void for_blocks(const S* src, int64_t n, F&& f) {
  if constexpr (std::is_same_v<S, f16::Compute<S>>) {
    f(src, int64_t{0}, n);
  } else {
    alignas(64) float buf[kBlock];
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t len = std::min(kBlock, n - b);
      f16::to_float(src + b, buf, len);
      f(static_cast<const float*>(buf), b, len);
    }
  }
}

template <typename S, typename F>
inline void for_blocks2(const S* a, const S* b, int64_t n, F&& f) {
  if constexpr (std::is_same_v<S, f16::Compute<S>>) {
    f(a, b, int64_t{0}, n);
  } else {
    alignas(64) float ba[kBlock], bb[kBlock];
    for (int64_t o = 0; o < n; o += kBlock) {
      const int64_t len = std::min(kBlock, n - o);
      f16::to_float(a + o, ba, len);
      f16::to_float(b + o, bb, len);
      f(static_cast<const float*>(ba), static_cast<const float*>(bb), o, len);
    }
  }
}

// Writes len computed values: fn(ob) fills ob[0, len), which is dst itself for float32/float64
// and a stack buffer (then rounded into dst) for the 16-bit types.
template <typename S, typename F>
inline void emit(S* dst, int64_t len, F&& fn) {
  if constexpr (std::is_same_v<S, f16::Compute<S>>) {
    fn(dst);
  } else {
    alignas(64) float ob[kBlock];
    fn(static_cast<float*>(ob));
    f16::from_float(ob, dst, len);
  }
}

// The loops below take every scalar by value and every array through a restrict pointer (not
// through lambda captures), so that the compiler can keep them in registers and vectorize. Row
// reductions are `omp simd` reductions (compiled with -fopenmp-simd: vector partial results,
// combined in an order fixed by the build, independent of the thread count).

// ln for the log-sum-exp: vectorizable in float32, where a loop over std::log stays scalar (the
// strided forward takes one per column: 4x4x784 over axis 1, 154 -> 122 us).
template <typename C>
inline C log_of(C v) {
  if constexpr (std::is_same_v<C, float>) {
    return VecMathF::log(v);
  } else {
    using std::log;
    return log(v);
  }
}

template <typename C>
inline C block_max(const C* __restrict b, int64_t len, C m) {
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < len; ++i) m = b[i] > m ? b[i] : m;
  return m;
}

// sum of exp(b[i] - m), also stored to e[i] when kStore.
template <typename C, bool kStore>
inline C block_exp_sum(const C* __restrict b, C* __restrict e, int64_t len, C m, C sum) {
  using M = MathOf<C>;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < len; ++i) {
    const C v = M::exp(b[i] - m);
    if constexpr (kStore) e[i] = v;
    sum += v;
  }
  return sum;
}

template <typename C>
inline void scale(C* __restrict e, int64_t len, C f) {
  for (int64_t i = 0; i < len; ++i) e[i] *= f;
}

template <typename C>
inline void exp_scaled(const C* __restrict b, C* __restrict o, int64_t len, C m, C f) {
  using M = MathOf<C>;
  for (int64_t i = 0; i < len; ++i) o[i] = M::exp(b[i] - m) * f;
}

template <typename C>
inline void shifted(const C* __restrict b, C* __restrict o, int64_t len, C m, C lse) {
  for (int64_t i = 0; i < len; ++i) o[i] = (b[i] - m) - lse;
}

// Column forms: one accumulator per column.
template <typename C>
inline void col_max(const C* __restrict b, int64_t len, C* __restrict m) {
  for (int64_t j = 0; j < len; ++j) m[j] = b[j] > m[j] ? b[j] : m[j];
}

template <typename C, bool kStore>
inline void col_exp_sum(const C* __restrict b, C* __restrict e, int64_t len,
                        const C* __restrict m, C* __restrict s) {
  using M = MathOf<C>;
  for (int64_t j = 0; j < len; ++j) {
    const C v = M::exp(b[j] - m[j]);
    if constexpr (kStore) e[j] = v;
    s[j] += v;
  }
}

template <typename C>
inline void col_scale(C* __restrict e, int64_t len, const C* __restrict f) {
  for (int64_t j = 0; j < len; ++j) e[j] *= f[j];
}

template <typename C>
inline void col_exp_scaled(const C* __restrict b, C* __restrict o, int64_t len,
                           const C* __restrict m, const C* __restrict f) {
  using M = MathOf<C>;
  for (int64_t j = 0; j < len; ++j) o[j] = M::exp(b[j] - m[j]) * f[j];
}

template <typename C>
inline void col_shifted(const C* __restrict b, C* __restrict o, int64_t len,
                        const C* __restrict m, const C* __restrict lse) {
  for (int64_t j = 0; j < len; ++j) o[j] = (b[j] - m[j]) - lse[j];
}

// ------------------------------------------------------------------------------------------
// Forward.

template <typename S, bool kLog>
void forward_row(const S* x, S* y, int64_t n) {
  using C = f16::Compute<S>;
  C m = kNegInf<C>;
  for_blocks(x, n, [&](const C* b, int64_t, int64_t len) { m = block_max<C>(b, len, m); });

  C sum = 0;
  constexpr bool kStoreExp = !kLog && std::is_same_v<S, C>;
  for_blocks(x, n, [&](const C* b, int64_t off, int64_t len) {
    if constexpr (kStoreExp)
      sum = block_exp_sum<C, true>(b, reinterpret_cast<C*>(y) + off, len, m, sum);
    else
      sum = block_exp_sum<C, false>(b, nullptr, len, m, sum);
  });

  if constexpr (kStoreExp) {
    scale<C>(reinterpret_cast<C*>(y), n, C(1) / sum);
  } else if constexpr (kLog) {
    const C lse = log_of(sum);
    for_blocks(x, n, [&](const C* b, int64_t off, int64_t len) {
      emit(y + off, len, [&](C* o) { shifted<C>(b, o, len, m, lse); });
    });
  } else {
    const C inv = C(1) / sum;
    for_blocks(x, n, [&](const C* b, int64_t off, int64_t len) {
      emit(y + off, len, [&](C* o) { exp_scaled<C>(b, o, len, m, inv); });
    });
  }
}

// Four float32 rows of n side by side: each pass runs over the four rows in one loop, so that
// their reduction chains (max, then the exps and their sum, then the output) overlap. One short
// row at a time was bound by that chain's latency. softmax stores exp(x - m) and rescales it, as
// forward_row does. Kernel times, 4 distinct inputs, log_softmax forward: 12544 rows of 64
// 315 -> 236 us, 50176 rows of 64 1280 -> 974 us, rows of 32 1.3-1.4x faster. Rows of 128 gained
// only while cache-resident (3136 rows: 166 -> 127 us) and lost from DRAM (12544 rows:
// 488 -> 763 us; prefetching the next rows did not help), so float32 arrays interleave rows of
// up to 64, and the 16-bit path's L1-resident float32 groups rows of up to 256.
constexpr int64_t kInterleaveMaxRow = 64;
constexpr int64_t kInterleaveMaxRowInL1 = 256;

template <bool kLog>
void forward_rows4_f32(const float* __restrict x, float* __restrict y, int64_t n) {
  const float *x0 = x, *x1 = x + n, *x2 = x + 2 * n, *x3 = x + 3 * n;
  float *y0 = y, *y1 = y + n, *y2 = y + 2 * n, *y3 = y + 3 * n;
  float m0 = kNegInf<float>, m1 = m0, m2 = m0, m3 = m0;
#pragma omp simd reduction(max : m0, m1, m2, m3)
  for (int64_t i = 0; i < n; ++i) {
    m0 = x0[i] > m0 ? x0[i] : m0;
    m1 = x1[i] > m1 ? x1[i] : m1;
    m2 = x2[i] > m2 ? x2[i] : m2;
    m3 = x3[i] > m3 ? x3[i] : m3;
  }
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    const float e0 = VecMathF::exp(x0[i] - m0), e1 = VecMathF::exp(x1[i] - m1);
    const float e2 = VecMathF::exp(x2[i] - m2), e3 = VecMathF::exp(x3[i] - m3);
    if constexpr (!kLog) {
      y0[i] = e0;
      y1[i] = e1;
      y2[i] = e2;
      y3[i] = e3;
    }
    s0 += e0;
    s1 += e1;
    s2 += e2;
    s3 += e3;
  }
  if constexpr (kLog) {
    const float l0 = VecMathF::log(s0), l1 = VecMathF::log(s1);
    const float l2 = VecMathF::log(s2), l3 = VecMathF::log(s3);
    for (int64_t i = 0; i < n; ++i) {
      y0[i] = (x0[i] - m0) - l0;
      y1[i] = (x1[i] - m1) - l1;
      y2[i] = (x2[i] - m2) - l2;
      y3[i] = (x3[i] - m3) - l3;
    }
  } else {
    const float i0 = 1.0f / s0, i1 = 1.0f / s1, i2 = 1.0f / s2, i3 = 1.0f / s3;
    for (int64_t i = 0; i < n; ++i) {
      y0[i] *= i0;
      y1[i] *= i1;
      y2[i] *= i2;
      y3[i] *= i3;
    }
  }
}

// float32 rows [0, rows) of n: four at a time while n <= max_interleaved, then one by one.
template <bool kLog>
void forward_rows_f32(const float* x, float* y, int64_t n, int64_t rows, int64_t max_interleaved) {
  int64_t r = 0;
  if (n <= max_interleaved)
    for (; r + 4 <= rows; r += 4) forward_rows4_f32<kLog>(x + r * n, y + r * n, n);
  for (; r < rows; ++r) forward_row<float, kLog>(x + r * n, y + r * n, n);
}

// Columns [c0, c0 + w) of one [n, inner] slab.
template <typename S, bool kLog>
void forward_cols(const S* x, S* y, int64_t n, int64_t inner, int64_t w) {
  using C = f16::Compute<S>;
  alignas(64) C m[kCols], s[kCols];
  std::fill(m, m + w, kNegInf<C>);
  std::fill(s, s + w, C(0));
  for (int64_t r = 0; r < n; ++r)
    for_blocks(x + r * inner, w,
               [&](const C* b, int64_t off, int64_t len) { col_max<C>(b, len, m + off); });
  constexpr bool kStoreExp = !kLog && std::is_same_v<S, C>;
  for (int64_t r = 0; r < n; ++r)
    for_blocks(x + r * inner, w, [&](const C* b, int64_t off, int64_t len) {
      if constexpr (kStoreExp)
        col_exp_sum<C, true>(b, reinterpret_cast<C*>(y) + r * inner + off, len, m + off, s + off);
      else
        col_exp_sum<C, false>(b, nullptr, len, m + off, s + off);
    });
  if constexpr (kLog) {
    for (int64_t j = 0; j < w; ++j) s[j] = log_of(s[j]);  // now the shifted log-sum-exp
  } else {
    for (int64_t j = 0; j < w; ++j) s[j] = C(1) / s[j];  // now the reciprocal sum
  }
  for (int64_t r = 0; r < n; ++r) {
    if constexpr (kStoreExp) {
      col_scale<C>(reinterpret_cast<C*>(y) + r * inner, w, s);
    } else {
      for_blocks(x + r * inner, w, [&](const C* b, int64_t off, int64_t len) {
        emit(y + r * inner + off, len, [&](C* o) {
          if constexpr (kLog)
            col_shifted<C>(b, o, len, m + off, s + off);
          else
            col_exp_scaled<C>(b, o, len, m + off, s + off);
        });
      });
    }
  }
}

// ------------------------------------------------------------------------------------------
// Backward: pass 1 sums a(y, v) over the row, pass 2 writes b(y, v, sum).

// log_softmax's y is <= 0, so its exponential never overflows; in float32 the cheaper exp_flush
// serves (a softmax value below 1.2e-38 counts as 0).
template <typename C>
inline C exp_of_log_prob(C y) {
  if constexpr (std::is_same_v<C, float>) return VecMathF::exp_flush(y);
  return MathOf<C>::exp(y);
}

template <SoftmaxOp kOp, typename C>
inline C bwd_term(C y, C v) {
  if constexpr (kOp == SoftmaxOp::kSoftmax) return v * y;
  if constexpr (kOp == SoftmaxOp::kLogSoftmax) return v;
  return v * exp_of_log_prob(y);
}

template <SoftmaxOp kOp, typename C>
inline C bwd_out(C y, C v, C sum) {
  if constexpr (kOp == SoftmaxOp::kSoftmax) return y * (v - sum);
  if constexpr (kOp == SoftmaxOp::kLogSoftmax) return v - exp_of_log_prob(y) * sum;
  return v - sum;
}

template <SoftmaxOp kOp, typename C>
inline C block_bwd_sum(const C* __restrict y, const C* __restrict v, int64_t len, C sum) {
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < len; ++i) sum += bwd_term<kOp, C>(y[i], v[i]);
  return sum;
}

template <SoftmaxOp kOp, typename C>
inline void bwd_write(const C* __restrict y, const C* __restrict v, C* __restrict o, int64_t len,
                      C sum) {
  for (int64_t i = 0; i < len; ++i) o[i] = bwd_out<kOp, C>(y[i], v[i], sum);
}

template <SoftmaxOp kOp, typename C>
inline void col_bwd_sum(const C* __restrict y, const C* __restrict v, int64_t len,
                        C* __restrict s) {
  for (int64_t j = 0; j < len; ++j) s[j] += bwd_term<kOp, C>(y[j], v[j]);
}

template <SoftmaxOp kOp, typename C>
inline void col_bwd_write(const C* __restrict y, const C* __restrict v, C* __restrict o,
                          int64_t len, const C* __restrict s) {
  for (int64_t j = 0; j < len; ++j) o[j] = bwd_out<kOp, C>(y[j], v[j], s[j]);
}

template <typename S, SoftmaxOp kOp>
void backward_row(const S* y, const S* v, S* out, int64_t n) {
  using C = f16::Compute<S>;
  C sum = 0;
  for_blocks2(y, v, n, [&](const C* yb, const C* vb, int64_t, int64_t len) {
    sum = block_bwd_sum<kOp, C>(yb, vb, len, sum);
  });
  for_blocks2(y, v, n, [&](const C* yb, const C* vb, int64_t off, int64_t len) {
    emit(out + off, len, [&](C* o) { bwd_write<kOp, C>(yb, vb, o, len, sum); });
  });
}

// Four float32 rows of n side by side, as forward_rows4_f32: the four row sums in one loop, then
// the four outputs. Each row's sum runs in the same order as backward_row's. One short row at a
// time was bound by its sum's reduction chain (log_softmax backward, 50176 rows of 32: 0.78x
// jax.nn, which reads the exponentials its forward saved).
template <SoftmaxOp kOp>
void backward_rows4_f32(const float* __restrict y, const float* __restrict v,
                        float* __restrict o, int64_t n) {
  const float *y0 = y, *y1 = y + n, *y2 = y + 2 * n, *y3 = y + 3 * n;
  const float *v0 = v, *v1 = v + n, *v2 = v + 2 * n, *v3 = v + 3 * n;
  float *o0 = o, *o1 = o + n, *o2 = o + 2 * n, *o3 = o + 3 * n;
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    s0 += bwd_term<kOp, float>(y0[i], v0[i]);
    s1 += bwd_term<kOp, float>(y1[i], v1[i]);
    s2 += bwd_term<kOp, float>(y2[i], v2[i]);
    s3 += bwd_term<kOp, float>(y3[i], v3[i]);
  }
  for (int64_t i = 0; i < n; ++i) {
    o0[i] = bwd_out<kOp, float>(y0[i], v0[i], s0);
    o1[i] = bwd_out<kOp, float>(y1[i], v1[i], s1);
    o2[i] = bwd_out<kOp, float>(y2[i], v2[i], s2);
    o3[i] = bwd_out<kOp, float>(y3[i], v3[i], s3);
  }
}

// float32 rows [0, rows) of n: four at a time while n <= max_interleaved, then one by one.
template <SoftmaxOp kOp>
void backward_rows_f32(const float* y, const float* v, float* o, int64_t n, int64_t rows,
                       int64_t max_interleaved) {
  int64_t r = 0;
  if (n <= max_interleaved)
    for (; r + 4 <= rows; r += 4) backward_rows4_f32<kOp>(y + r * n, v + r * n, o + r * n, n);
  for (; r < rows; ++r) backward_row<float, kOp>(y + r * n, v + r * n, o + r * n, n);
}

template <typename S, SoftmaxOp kOp>
void backward_cols(const S* y, const S* v, S* out, int64_t n, int64_t inner, int64_t w) {
  using C = f16::Compute<S>;
  alignas(64) C s[kCols];
  std::fill(s, s + w, C(0));
  for (int64_t r = 0; r < n; ++r)
    for_blocks2(y + r * inner, v + r * inner, w,
                [&](const C* yb, const C* vb, int64_t off, int64_t len) {
                  col_bwd_sum<kOp, C>(yb, vb, len, s + off);
                });
  for (int64_t r = 0; r < n; ++r)
    for_blocks2(y + r * inner, v + r * inner, w,
                [&](const C* yb, const C* vb, int64_t off, int64_t len) {
                  emit(out + r * inner + off, len,
                       [&](C* o) { col_bwd_write<kOp, C>(yb, vb, o, len, s + off); });
                });
}

// ------------------------------------------------------------------------------------------
// Rows of the 16-bit types: groups of whole rows (at most kGroup elements) are widened to float32
// once, run through the float32 row kernels (one exp per element, exp stored and rescaled), and
// rounded back, instead of converting block by block in each of the three passes. Rows longer
// than kGroup take the blocked path of forward_row / backward_row on the 16-bit data. 2048
// floats a buffer keeps the backward's three buffers (24 KB) inside a 32 KB L1; with 4096 they
// were 48 KB (bfloat16, this host: backward 7-17 % and forward 1-5 % faster at 2048).

constexpr int64_t kGroup = 2048;

template <typename S, bool kLog>
void forward_rows(const S* x, S* y, int64_t n, int64_t r0, int64_t r1) {
  if constexpr (!std::is_same_v<S, f16::Compute<S>>) {
    if (n <= kGroup) {
      alignas(64) float xb[kGroup], yb[kGroup];
      const int64_t per = kGroup / n;
      for (int64_t r = r0; r < r1; r += per) {
        const int64_t cnt = std::min(per, r1 - r);
        f16::to_float(x + r * n, xb, cnt * n);
        forward_rows_f32<kLog>(xb, yb, n, cnt, kInterleaveMaxRowInL1);
        f16::from_float(yb, y + r * n, cnt * n);
      }
      return;
    }
  }
  if constexpr (std::is_same_v<S, float>) {
    forward_rows_f32<kLog>(x + r0 * n, y + r0 * n, n, r1 - r0, kInterleaveMaxRow);
  } else {
    for (int64_t r = r0; r < r1; ++r) forward_row<S, kLog>(x + r * n, y + r * n, n);
  }
}

template <typename S, SoftmaxOp kOp>
void backward_rows(const S* y, const S* v, S* out, int64_t n, int64_t r0, int64_t r1) {
  if constexpr (!std::is_same_v<S, f16::Compute<S>>) {
    if (n <= kGroup) {
      alignas(64) float yb[kGroup], vb[kGroup], ob[kGroup];
      const int64_t per = kGroup / n;
      for (int64_t r = r0; r < r1; r += per) {
        const int64_t cnt = std::min(per, r1 - r);
        f16::to_float(y + r * n, yb, cnt * n);
        f16::to_float(v + r * n, vb, cnt * n);
        backward_rows_f32<kOp>(yb, vb, ob, n, cnt, kInterleaveMaxRowInL1);
        f16::from_float(ob, out + r * n, cnt * n);
      }
      return;
    }
  }
  if constexpr (std::is_same_v<S, float>) {
    backward_rows_f32<kOp>(y + r0 * n, v + r0 * n, out + r0 * n, n, r1 - r0, kInterleaveMaxRow);
  } else {
    for (int64_t r = r0; r < r1; ++r) backward_row<S, kOp>(y + r * n, v + r * n, out + r * n, n);
  }
}

// ------------------------------------------------------------------------------------------
// Task decomposition shared by forward and backward: rows(r0, r1) runs contiguous rows
// [r0, r1) (inner == 1); cols(offset, w) runs one block of w columns whose first element in row 0
// of its slab is at `offset` (inner > 1).

template <typename Rows, typename Cols>
void for_tasks(const SoftmaxCall& c, Rows&& rows, Cols&& cols) {
  if (c.inner == 1) {
    const int64_t rows_per_task = std::max<int64_t>(1, kMinTaskElems / std::max<int64_t>(1, c.n));
    parallel_for(c.outer, [&](int64_t b, int64_t e) { rows(b, e); }, rows_per_task);
    return;
  }
  // Block width: the slab's, capped at kCols, and narrower (a multiple of 16 columns) while
  // there are fewer than two blocks per thread.
  const int64_t per_slab = std::max((c.inner + kCols - 1) / kCols,
                                    (2 * num_threads() + c.outer - 1) / c.outer);
  const int64_t width = std::min(kCols, (c.inner + per_slab - 1) / per_slab + 15) / 16 * 16;
  const int64_t blocks = (c.inner + width - 1) / width;
  const int64_t slab = c.n * c.inner;
  const int64_t tasks_min = std::max<int64_t>(1, kMinTaskElems / std::max<int64_t>(1, c.n * width));
  parallel_for(c.outer * blocks, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / blocks, c0 = (t % blocks) * width;
      cols(o * slab + c0, std::min(width, c.inner - c0));
    }
  }, tasks_min);
}

template <typename S, bool kLog>
void run_forward(const SoftmaxCall& c, const S* x, S* out) {
  for_tasks(
      c, [&](int64_t r0, int64_t r1) { forward_rows<S, kLog>(x, out, c.n, r0, r1); },
      [&](int64_t off, int64_t w) {
        forward_cols<S, kLog>(x + off, out + off, c.n, c.inner, w);
      });
}

template <typename S, SoftmaxOp kOp>
void run_backward(const SoftmaxCall& c, const S* y, const S* v, S* out) {
  for_tasks(
      c, [&](int64_t r0, int64_t r1) { backward_rows<S, kOp>(y, v, out, c.n, r0, r1); },
      [&](int64_t off, int64_t w) {
        backward_cols<S, kOp>(y + off, v + off, out + off, c.n, c.inner, w);
      });
}

template <typename S>
void run_typed(const SoftmaxCall& c, const void* xv, const void* vv, void* outv) {
  const S* x = static_cast<const S*>(xv);
  const S* v = static_cast<const S*>(vv);
  S* out = static_cast<S*>(outv);
  if (!c.backward) {
    if (c.op == SoftmaxOp::kLogSoftmax)
      run_forward<S, true>(c, x, out);
    else
      run_forward<S, false>(c, x, out);
    return;
  }
  switch (c.op) {
    case SoftmaxOp::kSoftmax: run_backward<S, SoftmaxOp::kSoftmax>(c, x, v, out); break;
    case SoftmaxOp::kLogSoftmax: run_backward<S, SoftmaxOp::kLogSoftmax>(c, x, v, out); break;
    case SoftmaxOp::kLogSoftmaxJvp:
      run_backward<S, SoftmaxOp::kLogSoftmaxJvp>(c, x, v, out);
      break;
  }
}

}  // namespace

std::string run_softmax(const SoftmaxCall& c, const void* x, const void* v, void* out) {
  if (c.backward && v == nullptr) return "the backward needs a second operand";
  if (!c.backward && c.op == SoftmaxOp::kLogSoftmaxJvp) return "not a forward operation";
  if (c.outer == 0 || c.n == 0 || c.inner == 0) return "";
  const bool known = f16::with_storage_type(
      c.dtype, [&](auto storage) { run_typed<decltype(storage)>(c, x, v, out); });
  return known ? "" : "unsupported dtype";
}

}  // namespace jaxdnn::cpu
