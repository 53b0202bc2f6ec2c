// Descriptors of the standalone activation and softmax calls, shared by the handlers and the
// kernels of every backend (no XLA types here; ffi_pointwise.h decodes FFI calls into them).
//
// Activations are elementwise over n elements (any shape, flattened):
//   forward      y  = f(x)
//   derivative 1 dx = dy * f'(x)               (s = x, from_output = false)
//                dx = dy * g(y),  g(y) = f'(x)  (s = y = f(x), from_output = true)
//   derivative 2 dx = dy * f''(x)              (from the input)
//                dx = dy * g'(y) = dy * f''(x) / f'(x)   (from the output)
// (activation.h: activation_grad{,2}_from_{input,output}). The 16-bit types compute in float32,
// float64 in float64.
//
// Softmax views its operands as [outer, n, inner] and normalizes over n (contiguous rows when
// inner == 1, strided columns otherwise), max-subtracted:
//   softmax      y = exp(x - m) / sum(exp(x - m)),   m = max(x)
//   log_softmax  y = (x - m) - log(sum(exp(x - m)))
// The backward operations take the forward's output y and a second operand v, summing over n:
//   kSoftmax        v*y - y*sum(v*y)     = y (v - sum(v y))   (the VJP and the JVP: J symmetric)
//   kLogSoftmaxVjp  v - exp(y) sum(v)                          (VJP of log_softmax)
//   kLogSoftmaxJvp  v - sum(v exp(y))                          (JVP of log_softmax)
// The two log_softmax operations are each other's transpose. Sums accumulate in float32 (float64
// for float64).
#ifndef JAXDNN_POINTWISE_PROBLEM_H_
#define JAXDNN_POINTWISE_PROBLEM_H_

#include <cstdint>

#include "jaxdnn/activation.h"
#include "jaxdnn/conv_problem.h"

namespace jaxdnn {

struct ActivationCall {
  Activation activation = Activation::kIdentity;
  double param = 0.0;
  bool from_output = false;  // backward only: s is the forward's output
  int derivative = 0;        // 0: forward; 1: dy * f'; 2: dy * f'' (see above)
  DType dtype = DType::kF32;
  int64_t n = 0;             // elements
};

enum class SoftmaxOp : int32_t {
  kSoftmax = 0,         // forward: softmax;      backward: y (v - sum(v y))
  kLogSoftmax = 1,      // forward: log_softmax;  backward: v - exp(y) sum(v)
  kLogSoftmaxJvp = 2,   // backward only:         v - sum(v exp(y))
};

struct SoftmaxCall {
  SoftmaxOp op = SoftmaxOp::kSoftmax;
  bool backward = false;
  DType dtype = DType::kF32;
  int64_t outer = 0, n = 0, inner = 0;
};

}  // namespace jaxdnn

#endif  // JAXDNN_POINTWISE_PROBLEM_H_
