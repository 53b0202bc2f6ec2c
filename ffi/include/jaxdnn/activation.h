// Pointwise activations and their derivatives, shared by the CPU and CUDA kernels (standalone
// activation kernels and the epilogues of fused convolutions).
//
// Every function is a template over the compute type T (float or double; 16-bit storage types are
// computed in float) and compiles as host and device code. `param` is the kind's one scalar
// parameter: leaky_relu's negative slope, clipped_relu's ceiling, elu's alpha; others ignore it.
// The optional second template parameter M supplies exp, expm1, tanh and erfc: StdMath (the
// default: the standard library on the host, CUDA's math library on the device) or a caller's
// own implementation (the CPU kernels' vectorizable float math, ffi/cpu/vec_math.h).
//
// Derivatives at the kinks follow jax.nn (relu'(0) = 0, leaky_relu'(0) = 1, relu6'(0) = relu6'(6)
// = 0, elu'(0) = alpha), so jaxdnn's gradients equal jax.nn's everywhere.
//
// Second derivatives (grad-of-grad): activation_grad2_from_input(a, x) is f''(x) (0 for the
// piecewise-linear kinds, also at their kinks, as jax differentiates them);
// activation_grad2_from_output(a, y) is the derivative of g(y) = f'(f^-1(y)), the function that
// activation_grad_from_output computes, i.e. f''(x) / f'(x): by the chain rule
// d/dx g(f(x)) = g'(y) f'(x) = f''(x).
#ifndef JAXDNN_ACTIVATION_H_
#define JAXDNN_ACTIVATION_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define JAXDNN_HD __host__ __device__ __forceinline__
#else
#define JAXDNN_HD inline
#endif

namespace jaxdnn {

// The ids are part of the FFI contract (attribute `activation`); jaxdnn/_src/activations.py
// mirrors them.
enum class Activation : int32_t {
  kIdentity = 0,
  kRelu = 1,
  kLeakyRelu = 2,    // x >= 0 ? x : param * x
  kClippedRelu = 3,  // min(max(x, 0), param); relu6 is param = 6
  kElu = 4,          // x > 0 ? x : param * expm1(x)
  kSigmoid = 5,
  kTanh = 6,
  kGelu = 7,         // x * Phi(x), exact (Phi(x) = erfc(-x / sqrt(2)) / 2, as jax.nn.gelu)
  kGeluTanh = 8,     // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  kSilu = 9,         // x * sigmoid(x) (swish)
};
constexpr int kNumActivations = 10;

// True when f'(x) can be computed from y = f(x) alone, so a backward pass may read the output
// instead of keeping the input (relu's y > 0, sigmoid's y (1 - y), tanh's 1 - y^2, ...).
JAXDNN_HD bool activation_grad_from_output(Activation a) {
  return a != Activation::kGelu && a != Activation::kGeluTanh && a != Activation::kSilu;
}

// Kinds whose f' takes two values, 1 and a constant (relu and clipped_relu: 0, leaky_relu: its
// slope). Their backward can keep one bit per element instead of the output (the activation-mask
// calls of pointwise_problem.h).
JAXDNN_HD bool activation_has_mask(Activation a) {
  return a == Activation::kRelu || a == Activation::kLeakyRelu || a == Activation::kClippedRelu;
}

// The standard math functions (CUDA's device overloads under nvcc).
struct StdMath {
  template <class T> static JAXDNN_HD T exp(T x) { using std::exp; return exp(x); }
  template <class T> static JAXDNN_HD T expm1(T x) { using std::expm1; return expm1(x); }
  template <class T> static JAXDNN_HD T tanh(T x) { using std::tanh; return tanh(x); }
  template <class T> static JAXDNN_HD T erfc(T x) { using std::erfc; return erfc(x); }
};

namespace act_detail {
// sqrt(2/pi) and 1/sqrt(2pi), 1/sqrt(2), gelu_tanh's cubic coefficient.
template <class T> JAXDNN_HD T k_sqrt_2_over_pi() { return T(0.7978845608028654); }
template <class T> JAXDNN_HD T k_inv_sqrt_2pi() { return T(0.3989422804014327); }
template <class T> JAXDNN_HD T k_inv_sqrt_2() { return T(0.7071067811865476); }
template <class T> JAXDNN_HD T k_gelu_cubic() { return T(0.044715); }

template <class T, class M = StdMath>
JAXDNN_HD T sigmoid(T x) {
  return T(1) / (T(1) + M::exp(-x));
}
// Phi(x), the standard normal CDF, through erfc so that it stays accurate for x < 0.
template <class T, class M = StdMath>
JAXDNN_HD T normal_cdf(T x) {
  return T(0.5) * M::erfc(-x * k_inv_sqrt_2<T>());
}
// phi(x), the standard normal density.
template <class T, class M = StdMath>
JAXDNN_HD T normal_pdf(T x) {
  return k_inv_sqrt_2pi<T>() * M::exp(T(-0.5) * x * x);
}
}  // namespace act_detail

// f(x).
template <class T, class M = StdMath>
JAXDNN_HD T activate(Activation a, T x, T param) {
  switch (a) {
    case Activation::kIdentity: return x;
    // x > 0 ? x : 0 propagates NaN (a comparison with NaN is false, so the NaN must be tested).
    case Activation::kRelu: return x > T(0) ? x : (x != x ? x : T(0));
    case Activation::kLeakyRelu: return x >= T(0) ? x : param * x;
    case Activation::kClippedRelu:
      return x != x ? x : (x < T(0) ? T(0) : (x > param ? param : x));
    case Activation::kElu: return x > T(0) ? x : param * M::expm1(x);
    case Activation::kSigmoid: return act_detail::sigmoid<T, M>(x);
    case Activation::kTanh: return M::tanh(x);
    case Activation::kGelu: return x * act_detail::normal_cdf<T, M>(x);
    case Activation::kGeluTanh: {
      const T k = act_detail::k_gelu_cubic<T>();
      const T u = act_detail::k_sqrt_2_over_pi<T>() * (x + k * x * x * x);
      return T(0.5) * x * (T(1) + M::tanh(u));
    }
    case Activation::kSilu: return x * act_detail::sigmoid<T, M>(x);
  }
  return x;
}

// f'(x) from the input x.
template <class T, class M = StdMath>
JAXDNN_HD T activation_grad_from_input(Activation a, T x, T param) {
  switch (a) {
    case Activation::kIdentity: return T(1);
    case Activation::kRelu: return x > T(0) ? T(1) : T(0);
    case Activation::kLeakyRelu: return x >= T(0) ? T(1) : param;
    case Activation::kClippedRelu: return (x > T(0) && x < param) ? T(1) : T(0);
    case Activation::kElu: return x > T(0) ? T(1) : param * M::exp(x);
    case Activation::kSigmoid: {
      const T s = act_detail::sigmoid<T, M>(x);
      return s * (T(1) - s);
    }
    case Activation::kTanh: {
      const T t = M::tanh(x);
      return T(1) - t * t;
    }
    case Activation::kGelu:  // Phi(x) + x phi(x)
      return act_detail::normal_cdf<T, M>(x) + x * act_detail::normal_pdf<T, M>(x);
    case Activation::kGeluTanh: {
      const T c = act_detail::k_sqrt_2_over_pi<T>();
      const T k = act_detail::k_gelu_cubic<T>();
      const T t = M::tanh(c * (x + k * x * x * x));
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * c * (T(1) + T(3) * k * x * x);
    }
    case Activation::kSilu: {
      const T s = act_detail::sigmoid<T, M>(x);
      return s * (T(1) + x * (T(1) - s));
    }
  }
  return T(1);
}

// f'(x) from the output y = f(x); only for kinds with activation_grad_from_output(a).
template <class T, class M = StdMath>
JAXDNN_HD T activation_grad_from_output(Activation a, T y, T param) {
  switch (a) {
    case Activation::kRelu: return y > T(0) ? T(1) : T(0);
    // With a non-negative slope, y >= 0 exactly when x >= 0 (x = 0 gives y = 0 and slope 1).
    case Activation::kLeakyRelu: return y >= T(0) ? T(1) : param;
    case Activation::kClippedRelu: return (y > T(0) && y < param) ? T(1) : T(0);
    case Activation::kElu: return y > T(0) ? T(1) : y + param;  // alpha e^x = y + alpha
    case Activation::kSigmoid: return y * (T(1) - y);
    case Activation::kTanh: return T(1) - y * y;
    default: return T(1);  // kIdentity
  }
}

// f''(x) from the input x.
template <class T, class M = StdMath>
JAXDNN_HD T activation_grad2_from_input(Activation a, T x, T param) {
  switch (a) {
    case Activation::kElu: return x > T(0) ? T(0) : param * M::exp(x);
    case Activation::kSigmoid: {  // s (1 - s) (1 - 2 s)
      const T s = act_detail::sigmoid<T, M>(x);
      return s * (T(1) - s) * (T(1) - T(2) * s);
    }
    case Activation::kTanh: {  // -2 t (1 - t^2)
      const T t = M::tanh(x);
      return T(-2) * t * (T(1) - t * t);
    }
    case Activation::kGelu:  // d/dx [Phi + x phi] = 2 phi + x phi' = phi (2 - x^2)
      return act_detail::normal_pdf<T, M>(x) * (T(2) - x * x);
    case Activation::kGeluTanh: {
      // f = x (1 + t) / 2, t = tanh(u), u = c (x + k x^3): with u' = c (1 + 3 k x^2) and
      // u'' = 6 c k x,  f'' = (1 - t^2) (u' - x t u'^2 + x u'' / 2).
      const T c = act_detail::k_sqrt_2_over_pi<T>();
      const T k = act_detail::k_gelu_cubic<T>();
      const T t = M::tanh(c * (x + k * x * x * x));
      const T du = c * (T(1) + T(3) * k * x * x);
      const T d2u = T(6) * c * k * x;
      return (T(1) - t * t) * (du - x * t * du * du + T(0.5) * x * d2u);
    }
    case Activation::kSilu: {  // s (1 - s) (2 + x (1 - 2 s))
      const T s = act_detail::sigmoid<T, M>(x);
      return s * (T(1) - s) * (T(2) + x * (T(1) - T(2) * s));
    }
    default: return T(0);  // identity, relu, leaky_relu, clipped_relu: piecewise linear
  }
}

// d/dy f'(f^-1(y)) = f''(x) / f'(x) from the output y = f(x); only for kinds with
// activation_grad_from_output(a). (elu: g(y) = y + alpha for y <= 0; sigmoid: g = y (1 - y);
// tanh: g = 1 - y^2; the piecewise-linear kinds have a piecewise-constant g.)
template <class T, class M = StdMath>
JAXDNN_HD T activation_grad2_from_output(Activation a, T y, T param) {
  (void)param;
  switch (a) {
    case Activation::kElu: return y > T(0) ? T(0) : T(1);
    case Activation::kSigmoid: return T(1) - T(2) * y;
    case Activation::kTanh: return T(-2) * y;
    default: return T(0);
  }
}

}  // namespace jaxdnn

#endif  // JAXDNN_ACTIVATION_H_
