// activation.h's formulas on the CPU, evaluated with vec_math.h's vectorizable float32 math
// (float64 keeps the standard library: it serves gradient checks, not speed). The activation
// kernels, the fused-convolution epilogue and the bias-activation backward all go through these,
// so they compute the same values, in loops the compiler vectorizes (a loop over std::erfc or
// std::exp stays scalar: the fused epilogue's gelu took 4x the time of the convolution itself).
// Exact gelu in float32 takes VecMathF's shared normal tail (one exponential for Phi and phi).
#ifndef JAXDNN_CPU_ACTIVATION_MATH_H_
#define JAXDNN_CPU_ACTIVATION_MATH_H_

#include <type_traits>

#include "jaxdnn/activation.h"
#include "vec_math.h"

namespace jaxdnn::cpu {

template <typename T>
using MathOf = std::conditional_t<std::is_same_v<T, float>, VecMathF, StdMath>;

// f(x).
template <Activation A, typename T>
inline T act_forward(T x, T param) {
  if constexpr (A == Activation::kGelu && std::is_same_v<T, float>) {
    return x * VecMathF::normal_cdf(x);
  } else {
    return activate<T, MathOf<T>>(A, x, param);
  }
}

// f'(x) from the input.
template <Activation A, typename T>
inline T act_grad_from_input(T x, T param) {
  if constexpr (A == Activation::kGelu && std::is_same_v<T, float>) {
    return VecMathF::gelu_grad(x);
  } else {
    return activation_grad_from_input<T, MathOf<T>>(A, x, param);
  }
}

// f'(x) from the output y = f(x) (the kinds for which it is a function of y).
template <Activation A, typename T>
inline T act_grad_from_output(T y, T param) {
  return activation_grad_from_output<T, MathOf<T>>(A, y, param);
}

// f''(x) from the input, and from the output.
template <Activation A, typename T>
inline T act_grad2_from_input(T x, T param) {
  return activation_grad2_from_input<T, MathOf<T>>(A, x, param);
}
template <Activation A, typename T>
inline T act_grad2_from_output(T y, T param) {
  return activation_grad2_from_output<T, MathOf<T>>(A, y, param);
}

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_ACTIVATION_MATH_H_
