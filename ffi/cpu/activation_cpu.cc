// CPU activation kernels: y = f(x), and dx = dy * f'(s) or dy * f''(s) (pointwise_problem.h).
//
// The formulas are activation.h's, instantiated per activation kind at compile time (the switch
// folds away) with the branch-free float math of vec_math.h for float32 and the 16-bit types, so
// the inner loops vectorize; float64 uses the standard library (it serves gradient checks, not
// speed). 16-bit operands are converted in blocks to float32 buffers on the stack, computed, and
// rounded back. Large arrays are split across the thread pool (parallel.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "activation_math.h"
#include "f16_convert.h"
#include "f16_storage.h"
#include "parallel.h"
#include "pointwise_cpu.h"

namespace jaxdnn::cpu {
namespace {

using f16::BF16;
using f16::F16;

// What a kernel computes per element from s (and multiplies by dy unless kForward).
enum class Op { kForward, kGradInput, kGradOutput, kGrad2Input, kGrad2Output };

template <Op kOp, Activation kA, typename C>
inline C pointwise(C s, C p) {
  if constexpr (kOp == Op::kForward) return act_forward<kA, C>(s, p);
  if constexpr (kOp == Op::kGradInput) return act_grad_from_input<kA, C>(s, p);
  if constexpr (kOp == Op::kGradOutput) return act_grad_from_output<kA, C>(s, p);
  if constexpr (kOp == Op::kGrad2Input) return act_grad2_from_input<kA, C>(s, p);
  return act_grad2_from_output<kA, C>(s, p);
}

// out[i] = op(s[i]) (* dy[i]) over contiguous compute-type buffers.
template <Op kOp, Activation kA, typename C>
inline void compute(const C* __restrict s, const C* __restrict dy, C* __restrict out, int64_t n,
                    C p) {
  if constexpr (kOp == Op::kForward) {
    (void)dy;
    int64_t i = 0;
#if defined(__AVX512F__)
    if constexpr (kA == Activation::kClippedRelu && std::is_same_v<C, float>) {
      // max(0, min(p, x)), constants first: vminps / vmaxps return their second operand for a
      // NaN and for equal values, which is activation.h's clipped_relu exactly for a positive
      // ceiling (NaN and -0 pass through). The compiler's selects took 3x as long (0.155
      // against 0.048 ns per value, L1).
      const __m512 zero = _mm512_setzero_ps(), ceiling = _mm512_set1_ps(p);
      for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i,
                         _mm512_max_ps(zero, _mm512_min_ps(ceiling, _mm512_loadu_ps(s + i))));
    }
#endif
    for (; i < n; ++i) out[i] = pointwise<kOp, kA, C>(s[i], p);
  } else if constexpr ((kOp == Op::kGradInput || kOp == Op::kGradOutput) &&
                       (kA == Activation::kRelu || kA == Activation::kClippedRelu)) {
    // jax.nn.relu and relu6 select the cotangent (a NaN or inf dy outside the linear piece
    // still gives 0), rather than multiply it by 0.
    for (int64_t i = 0; i < n; ++i) out[i] = pointwise<kOp, kA, C>(s[i], p) != C(0) ? dy[i] : C(0);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = dy[i] * pointwise<kOp, kA, C>(s[i], p);
  }
}

constexpr int64_t kBlock = 512;  // 16-bit types: elements converted per float32 block

// Whether every result of (op, kind) is one of its inputs, 0, or (clipped_relu's forward) the
// ceiling: then, with a ceiling representable in the storage type, 16-bit stores need no
// rounding.
template <Op kOp, Activation kA>
constexpr bool kSelects =
    kA == Activation::kIdentity ||
    ((kA == Activation::kRelu || kA == Activation::kClippedRelu) &&
     (kOp == Op::kForward || kOp == Op::kGradInput || kOp == Op::kGradOutput));

// relu and clipped_relu forwards on 16-bit storage, in the integer domain: the words of
// non-negative values order as the values, so the result and the mask bit come from unsigned
// range tests of the 16-bit words, 32 at a time, with no float32 round trip. With u the word,
// inf the word of +inf and c that of the ceiling (clipped_relu, a value the type holds):
//   u a negative non-NaN (relu: [0x8000, 0x8000 | inf]; clipped_relu: from 0x8001, since
//   activation.h gives -0 back there)        -> +0
//   u in [c, inf] (clipped_relu)             -> c
//   anything else (NaN included)             -> u
//   mask bit: u in [1, inf] (relu, x > 0) or [1, c - 1] (clipped_relu, 0 < x < c).
struct Select16 {
  uint16_t neg_lo, neg_hi;  // the words that become +0
  uint16_t clip_lo, clip_hi;  // the words that become the ceiling (empty: lo > hi)
  uint16_t bit_hi;            // mask bit for u in [1, bit_hi]
};

template <typename S, Activation kA>
Select16 select16_of(uint16_t ceiling_word) {
  const uint16_t inf = std::is_same_v<S, BF16> ? 0x7f80 : 0x7c00;
  if constexpr (kA == Activation::kRelu)
    return {0x8000, static_cast<uint16_t>(0x8000 | inf), 1, 0, inf};
  return {0x8001, static_cast<uint16_t>(0x8000 | inf), ceiling_word, inf,
          static_cast<uint16_t>(ceiling_word - 1)};
}

inline bool in_range16(uint16_t u, uint16_t lo, uint16_t hi) {
  return static_cast<uint16_t>(u - lo) <= static_cast<uint16_t>(hi - lo) && lo <= hi;
}

// out[i] (and, with bits, the mask bits from bit 0 of bits[0]) for n words of in.
template <typename S>
void forward_select16(const S* __restrict in, S* __restrict out, uint8_t* __restrict bits,
                      int64_t n, Select16 t) {
  const uint16_t* u = reinterpret_cast<const uint16_t*>(in);
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  auto one = [&](uint16_t w, bool& bit) {
    bit = in_range16(w, 1, t.bit_hi);
    if (in_range16(w, t.neg_lo, t.neg_hi)) return uint16_t{0};
    return in_range16(w, t.clip_lo, t.clip_hi) ? t.clip_lo : w;
  };
  int64_t i = 0;
#if defined(__AVX512BW__)
  const __m512i neg_lo = _mm512_set1_epi16(static_cast<short>(t.neg_lo));
  const __m512i neg_w = _mm512_set1_epi16(static_cast<short>(t.neg_hi - t.neg_lo));
  const __m512i clip_lo = _mm512_set1_epi16(static_cast<short>(t.clip_lo));
  const __m512i clip_w = _mm512_set1_epi16(static_cast<short>(t.clip_hi - t.clip_lo));
  const __m512i one16 = _mm512_set1_epi16(1);
  const __m512i bit_w = _mm512_set1_epi16(static_cast<short>(t.bit_hi - 1));
  const bool clips = t.clip_lo <= t.clip_hi;
  for (; i + 32 <= n; i += 32) {
    const __m512i w = _mm512_loadu_si512(u + i);
    // lo <= w <= hi  <=>  (w - lo) <= (hi - lo), unsigned
    const __mmask32 neg = _mm512_cmple_epu16_mask(_mm512_sub_epi16(w, neg_lo), neg_w);
    __m512i y = _mm512_maskz_mov_epi16(static_cast<__mmask32>(~neg), w);
    if (clips)
      y = _mm512_mask_mov_epi16(
          y, _mm512_cmple_epu16_mask(_mm512_sub_epi16(w, clip_lo), clip_w), clip_lo);
    _mm512_storeu_si512(o + i, y);
    if (bits) {
      const uint32_t word = _cvtmask32_u32(_mm512_cmple_epu16_mask(_mm512_sub_epi16(w, one16),
                                                                   bit_w));
      std::memcpy(bits + i / 8, &word, 4);
    }
  }
#endif
  for (; i < n; i += 8) {
    unsigned byte = 0;
    const int k_end = static_cast<int>(std::min<int64_t>(8, n - i));
    for (int k = 0; k < k_end; ++k) {
      bool bit;
      o[i + k] = one(u[i + k], bit);
      byte |= unsigned(bit) << k;
    }
    if (bits) bits[i / 8] = static_cast<uint8_t>(byte);
  }
}

// The integer-domain table for (S, kA)'s forward with ceiling p, or false where it does not
// apply (float storage, another kind, a ceiling the type cannot hold).
template <typename S, Activation kA>
bool select16_table(double param, Select16* t) {
  if constexpr (sizeof(S) != 2 ||
                !(kA == Activation::kRelu || kA == Activation::kClippedRelu)) {
    return false;
  } else {
    const float p = static_cast<float>(param);
    const S c = f16::store<S>(p);
    if (kA == Activation::kClippedRelu && !(f16::load(c) == p && p > 0)) return false;
    *t = select16_of<S, kA>(c.bits);
    return true;
  }
}

template <typename S, Op kOp, Activation kA>
void run_range(const S* s, const S* dy, S* out, int64_t begin, int64_t end, double param) {
  using C = f16::Compute<S>;
  const C p = static_cast<C>(param);
  if constexpr (std::is_same_v<S, C>) {
    compute<kOp, kA, C>(s + begin, kOp == Op::kForward ? nullptr : dy + begin, out + begin,
                        end - begin, p);
  } else {
    if constexpr (kOp == Op::kForward) {
      Select16 t;
      if (select16_table<S, kA>(param, &t))
        return forward_select16(s + begin, out + begin, nullptr, end - begin, t);
    }
    alignas(64) float sb[kBlock], db[kBlock], ob[kBlock];
    bool exact = kSelects<kOp, kA>;
    if constexpr (kA == Activation::kClippedRelu && kOp == Op::kForward)
      exact = f16::load(f16::store<S>(p)) == p;
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t n = std::min(kBlock, end - b);
      f16::to_float(s + b, sb, n);
      if constexpr (kOp != Op::kForward) f16::to_float(dy + b, db, n);
      compute<kOp, kA, float>(sb, db, ob, n, p);
      if (exact)
        f16::from_float_exact(ob, out + b, n);
      else
        f16::from_float(ob, out + b, n);
    }
  }
}

// Whether (op, kind) needs no transcendental function: such loops are memory-bound, and a
// second thread only pays off on larger arrays, so they split in chunks of at least
// kMemoryBoundChunk elements; the others are compute-bound and split early. (2-core host, with
// the pool's workers spinning briefly for the next job: relu's forward and mask backward on
// 200K-400K float32 elements ran 1.5-1.7x faster at 128K than at 512K, where they ran on one
// thread; 64K was no better than 128K.)
constexpr int64_t kMemoryBoundChunk = int64_t{1} << 17;

template <Op kOp, Activation kA>
constexpr bool kCheap =
    kA == Activation::kIdentity || kA == Activation::kRelu || kA == Activation::kLeakyRelu ||
    kA == Activation::kClippedRelu || kOp == Op::kGradOutput || kOp == Op::kGrad2Output;

template <typename S, Op kOp, Activation kA>
void run_typed(const ActivationCall& c, const void* s, const void* dy, void* out) {
  const S* sp = static_cast<const S*>(s);
  const S* dp = static_cast<const S*>(dy);
  S* op = static_cast<S*>(out);
  const int64_t min_chunk = kCheap<kOp, kA> ? kMemoryBoundChunk : (int64_t{1} << 14);
  parallel_for(
      c.n, [&](int64_t b, int64_t e) { run_range<S, kOp, kA>(sp, dp, op, b, e, c.param); },
      min_chunk, 2);
}

template <typename S, Op kOp>
void dispatch_kind(const ActivationCall& c, const void* s, const void* dy, void* out) {
  switch (c.activation) {
#define JAXDNN_ACT_CASE(kind) \
    case Activation::kind: return run_typed<S, kOp, Activation::kind>(c, s, dy, out);
    JAXDNN_ACT_CASE(kIdentity)
    JAXDNN_ACT_CASE(kRelu)
    JAXDNN_ACT_CASE(kLeakyRelu)
    JAXDNN_ACT_CASE(kClippedRelu)
    JAXDNN_ACT_CASE(kElu)
    JAXDNN_ACT_CASE(kSigmoid)
    JAXDNN_ACT_CASE(kTanh)
    JAXDNN_ACT_CASE(kGelu)
    JAXDNN_ACT_CASE(kGeluTanh)
    JAXDNN_ACT_CASE(kSilu)
#undef JAXDNN_ACT_CASE
  }
}

template <typename S>
void dispatch_op(const ActivationCall& c, const void* s, const void* dy, void* out) {
  if (c.derivative == 0) return dispatch_kind<S, Op::kForward>(c, s, dy, out);
  if (c.derivative == 1)
    return c.from_output ? dispatch_kind<S, Op::kGradOutput>(c, s, dy, out)
                         : dispatch_kind<S, Op::kGradInput>(c, s, dy, out);
  return c.from_output ? dispatch_kind<S, Op::kGrad2Output>(c, s, dy, out)
                       : dispatch_kind<S, Op::kGrad2Input>(c, s, dy, out);
}

// ---------------------------------------------------------------------------------------------
// Activation masks (pointwise_problem.h): one bit per element, [f'(x) = 1], for the kinds whose
// f' is 1 or a constant. The backward then reads 1/8 byte per element instead of the output.

template <Activation kA, typename C>
inline bool mask_bit(C x, C p) {
  if constexpr (kA == Activation::kRelu) return x > C(0);
  if constexpr (kA == Activation::kLeakyRelu) return x >= C(0);
  return x > C(0) && x < p;  // kClippedRelu
}

// The bits of x[0, n) into ceil(n / 8) bytes (bit k of byte j: element 8j + k; the high bits of
// a partial last byte are 0). NaN compares false: its bit is clear.
template <Activation kA, typename C>
void pack_mask(const C* __restrict x, int64_t n, C p, uint8_t* __restrict bits) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<C, float>) {
    const __m512 zero = _mm512_setzero_ps(), ceiling = _mm512_set1_ps(p);
    for (; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      __mmask16 m;
      if constexpr (kA == Activation::kRelu) {
        m = _mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ);
      } else if constexpr (kA == Activation::kLeakyRelu) {
        m = _mm512_cmp_ps_mask(v, zero, _CMP_GE_OQ);
      } else {
        m = _mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ) & _mm512_cmp_ps_mask(v, ceiling, _CMP_LT_OQ);
      }
      const uint16_t word = static_cast<uint16_t>(m);  // lane k -> bit k; bytes little-endian
      std::memcpy(bits + i / 8, &word, 2);
    }
  }
#endif
  for (; i < n; i += 8) {
    unsigned byte = 0;
    const int k_end = static_cast<int>(std::min<int64_t>(8, n - i));
    for (int k = 0; k < k_end; ++k) byte |= unsigned(mask_bit<kA, C>(x[i + k], p)) << k;
    bits[i / 8] = static_cast<uint8_t>(byte);
  }
}

// dx = bit ? dy : lower * dy over n elements whose bits start at bit 0 of bits[0]; relu and
// clipped_relu select (dx = 0 where the bit is clear, even for a NaN or inf dy, as jax.nn).
template <Activation kA, typename C>
void select_mask(const uint8_t* __restrict bits, const C* __restrict dy, C* __restrict dx,
                 int64_t n, C p) {
  constexpr bool kSelect = kA != Activation::kLeakyRelu;
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<C, float>) {
    const __m512 slope = _mm512_set1_ps(p);
    for (; i + 16 <= n; i += 16) {
      uint16_t word;
      std::memcpy(&word, bits + i / 8, 2);
      const __mmask16 m = _cvtu32_mask16(word);
      const __m512 d = _mm512_loadu_ps(dy + i);
      const __m512 r = kSelect ? _mm512_maskz_mov_ps(m, d)
                               : _mm512_mask_mov_ps(_mm512_mul_ps(d, slope), m, d);
      _mm512_storeu_ps(dx + i, r);
    }
  }
#endif
  for (; i < n; ++i) {
    const bool bit = (bits[i / 8] >> (i % 8)) & 1;
    dx[i] = bit ? dy[i] : (kSelect ? C(0) : p * dy[i]);
  }
}

// The selecting kinds' backward on 16-bit storage: dx = bit ? dy : +0 moves the 16-bit values
// themselves (32 per masked move), with no conversion to float32 and back.
template <typename S>
void select_mask16(const uint8_t* __restrict bits, const S* __restrict dy, S* __restrict dx,
                   int64_t n) {
  static_assert(sizeof(S) == 2, "16-bit storage");
  int64_t i = 0;
#if defined(__AVX512BW__)
  for (; i + 32 <= n; i += 32) {
    uint32_t word;
    std::memcpy(&word, bits + i / 8, 4);
    _mm512_storeu_si512(dx + i, _mm512_maskz_mov_epi16(_cvtu32_mask32(word),
                                                       _mm512_loadu_si512(dy + i)));
  }
#endif
  for (; i < n; ++i) dx[i] = ((bits[i / 8] >> (i % 8)) & 1) ? dy[i] : S{0};
}

// One span of n elements whose mask starts at a byte boundary: a whole row, or (rows of a
// multiple of 8 elements) any run of whole bytes.
template <typename S, Activation kA>
void mask_span(const S* in, S* out, uint8_t* bits, int64_t n, double param, bool backward) {
  using C = f16::Compute<S>;
  const C p = static_cast<C>(param);
  if constexpr (std::is_same_v<S, C>) {
    if (backward) {
      select_mask<kA, C>(bits, in, out, n, p);
    } else {
      // In blocks, so that the packing rereads x from L1.
      for (int64_t b = 0; b < n; b += kBlock) {
        const int64_t m = std::min(kBlock, n - b);
        compute<Op::kForward, kA, C>(in + b, nullptr, out + b, m, p);
        pack_mask<kA, C>(in + b, m, p, bits + b / 8);
      }
    }
  } else {
    // 16-bit storage: float32 blocks (kBlock is a multiple of 8, so each starts a mask byte).
    // Selected elements, 0 and (forward) the inputs are exact; leaky_relu's products and a
    // clipped_relu ceiling that the storage type cannot hold round.
    if (backward && kA != Activation::kLeakyRelu) return select_mask16(bits, in, out, n);
    if (Select16 t; !backward && select16_table<S, kA>(param, &t))
      return forward_select16(in, out, bits, n, t);
    bool exact = kA == Activation::kRelu || (backward && kA == Activation::kClippedRelu);
    if constexpr (kA == Activation::kClippedRelu) {
      if (!backward) exact = f16::load(f16::store<S>(p)) == p;
    }
    alignas(64) float ib[kBlock], ob[kBlock];
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t m = std::min(kBlock, n - b);
      f16::to_float(in + b, ib, m);
      if (backward) {
        select_mask<kA, float>(bits + b / 8, ib, ob, m, p);
      } else {
        compute<Op::kForward, kA, float>(ib, nullptr, ob, m, p);
        pack_mask<kA, float>(ib, m, p, bits + b / 8);
      }
      if (exact)
        f16::from_float_exact(ob, out + b, m);
      else
        f16::from_float(ob, out + b, m);
    }
  }
}

template <typename S, Activation kA>
void run_mask_typed(const ActivationMaskCall& c, const void* data, void* out, uint8_t* bits) {
  const S* in = static_cast<const S*>(data);
  S* o = static_cast<S*>(out);
  // Memory-bound (see kCheap): split in whole mask bytes.
  constexpr int64_t kMinElements = kMemoryBoundChunk;
  if (c.row % 8 == 0) {  // one bit stream: element i has bit i % 8 of byte i / 8
    parallel_for(
        c.rows * c.row / 8,
        [&](int64_t b, int64_t e) {
          mask_span<S, kA>(in + 8 * b, o + 8 * b, bits + b, 8 * (e - b), c.param, c.backward);
        },
        kMinElements / 8, 2);
  } else {
    const int64_t bytes = activation_mask_bytes(c.row);
    parallel_for(
        c.rows,
        [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r)
            mask_span<S, kA>(in + r * c.row, o + r * c.row, bits + r * bytes, c.row, c.param,
                             c.backward);
        },
        std::max<int64_t>(1, kMinElements / c.row), 2);
  }
}

template <typename S>
void run_mask_kind(const ActivationMaskCall& c, const void* data, void* out, uint8_t* bits) {
  switch (c.activation) {
    case Activation::kRelu: return run_mask_typed<S, Activation::kRelu>(c, data, out, bits);
    case Activation::kLeakyRelu:
      return run_mask_typed<S, Activation::kLeakyRelu>(c, data, out, bits);
    case Activation::kClippedRelu:
      return run_mask_typed<S, Activation::kClippedRelu>(c, data, out, bits);
    default: return;  // the decoder admits only the kinds above
  }
}

}  // namespace

std::string run_activation(const ActivationCall& c, const void* s, const void* dy, void* out) {
  if (c.derivative < 0 || c.derivative > 2) return "derivative must be 0, 1 or 2";
  if (c.derivative > 0 && dy == nullptr) return "the backward needs dy";
  if (c.n == 0) return "";
  const bool known = f16::with_storage_type(
      c.dtype, [&](auto storage) { dispatch_op<decltype(storage)>(c, s, dy, out); });
  return known ? "" : "unsupported dtype";
}

std::string run_activation_mask(const ActivationMaskCall& c, const void* data, void* out,
                                uint8_t* bits) {
  if (!activation_has_mask(c.activation)) return "this activation has no mask form";
  if (c.rows == 0 || c.row == 0) return "";
  const bool known = f16::with_storage_type(
      c.dtype, [&](auto storage) { run_mask_kind<decltype(storage)>(c, data, out, bits); });
  return known ? "" : "unsupported dtype";
}

}  // namespace jaxdnn::cpu
