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
//
// Activation masks, for the kinds whose f' is 1 or a constant `lower` (activation_has_mask: relu
// and clipped_relu with lower 0, leaky_relu with lower = its slope). The operand is viewed as rows
// of `row` elements (its last axis); each row has ceil(row / 8) mask bytes, and bit k of byte j
// (least significant first) belongs to element 8j + k of the row (the unused high bits of a row's
// last byte are 0):
//   mask forward   y = f(x) and bit = [f'(x) = 1]  (relu x > 0, leaky_relu x >= 0,
//                                                   clipped_relu 0 < x < ceiling: jax.nn's kinks)
//   mask backward  dx = bit ? dy : lower * dy      (relu and clipped_relu select: dx = 0 where
//                                                   the bit is clear, whatever dy is)
// The backward reads 1/8 byte per element where the output-based one reads a whole element.
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

struct ActivationMaskCall {
  Activation activation = Activation::kRelu;  // activation_has_mask(activation)
  double param = 0.0;
  bool backward = false;
  DType dtype = DType::kF32;  // of x, y, dy, dx (the mask is bytes)
  int64_t rows = 0, row = 0;  // rows * row elements
};

// Mask bytes per row of `row` elements.
inline int64_t activation_mask_bytes(int64_t row) { return (row + 7) / 8; }

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
