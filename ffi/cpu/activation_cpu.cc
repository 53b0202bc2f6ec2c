// CPU activation kernels: y = f(x), and dx = dy * f'(s) or dy * f''(s) (pointwise_problem.h).
//
// The formulas are activation.h's, instantiated per activation kind at compile time (the switch
// folds away) with the branch-free float math of vec_math.h for float32 and the 16-bit types, so
// the inner loops vectorize; float64 uses the standard library (it serves gradient checks, not
// speed). 16-bit operands are converted in blocks to float32 buffers on the stack, computed, and
// rounded back. Large arrays are split across the thread pool (parallel.h).
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "f16_convert.h"
#include "f16_storage.h"
#include "parallel.h"
#include "pointwise_cpu.h"
#include "vec_math.h"

namespace jaxdnn::cpu {
namespace {

using f16::BF16;
using f16::F16;

template <typename C>
using MathOf = std::conditional_t<std::is_same_v<C, float>, VecMathF, StdMath>;

// What a kernel computes per element from s (and multiplies by dy unless kForward).
enum class Op { kForward, kGradInput, kGradOutput, kGrad2Input, kGrad2Output };

template <Op kOp, Activation kA, typename C>
inline C pointwise(C s, C p) {
  using M = MathOf<C>;
  if constexpr (kOp == Op::kForward) return activate<C, M>(kA, s, p);
  if constexpr (kOp == Op::kGradInput) return activation_grad_from_input<C, M>(kA, s, p);
  if constexpr (kOp == Op::kGradOutput) return activation_grad_from_output<C, M>(kA, s, p);
  if constexpr (kOp == Op::kGrad2Input) return activation_grad2_from_input<C, M>(kA, s, p);
  return activation_grad2_from_output<C, M>(kA, s, p);
}

// gelu's f'(x) = Phi(x) + x phi(x), with one exponential shared by Phi and phi (activation.h's
// generic formula evaluates erfc and exp separately); see VecMathF::gelu_grad.
template <>
inline float pointwise<Op::kGradInput, Activation::kGelu, float>(float x, float) {
  return VecMathF::gelu_grad(x);
}

// out[i] = op(s[i]) (* dy[i]) over contiguous compute-type buffers.
template <Op kOp, Activation kA, typename C>
inline void compute(const C* __restrict s, const C* __restrict dy, C* __restrict out, int64_t n,
                    C p) {
  if constexpr (kOp == Op::kForward) {
    (void)dy;
    for (int64_t i = 0; i < n; ++i) out[i] = pointwise<kOp, kA, C>(s[i], p);
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

template <typename S, Op kOp, Activation kA>
void run_range(const S* s, const S* dy, S* out, int64_t begin, int64_t end, double param) {
  using C = f16::Compute<S>;
  const C p = static_cast<C>(param);
  if constexpr (std::is_same_v<S, C>) {
    compute<kOp, kA, C>(s + begin, kOp == Op::kForward ? nullptr : dy + begin, out + begin,
                        end - begin, p);
  } else {
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
// the pool's workers spinning briefly for the next job: relu's forward on 200K-400K float32
// elements ran 1.5-1.7x faster at 128K than at 512K, where it ran on one thread; 64K was no
// better than 128K.)
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

}  // namespace

std::string run_activation(const ActivationCall& c, const void* s, const void* dy, void* out) {
  if (c.derivative < 0 || c.derivative > 2) return "derivative must be 0, 1 or 2";
  if (c.derivative > 0 && dy == nullptr) return "the backward needs dy";
  if (c.n == 0) return "";
  switch (c.dtype) {
    case DType::kF32: dispatch_op<float>(c, s, dy, out); break;
    case DType::kF64: dispatch_op<double>(c, s, dy, out); break;
    case DType::kBF16: dispatch_op<BF16>(c, s, dy, out); break;
    case DType::kF16: dispatch_op<F16>(c, s, dy, out); break;
    default: return "unsupported dtype";
  }
  return "";
}

}  // namespace jaxdnn::cpu
