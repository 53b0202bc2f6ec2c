// Pointwise activations and their derivatives, shared by the CPU and CUDA kernels (standalone
// activation kernels and the epilogues of fused convolutions).
//
// Every function is a template over the compute type T (float or double; 16-bit storage types are
// computed in float) and compiles as host and device code. `param` is the kind's one scalar
// parameter: leaky_relu's negative slope, clipped_relu's ceiling, elu's alpha; others ignore it.
//
// Derivatives at the kinks follow jax.nn (relu'(0) = 0, leaky_relu'(0) = 1, relu6'(0) = relu6'(6)
// = 0, elu'(0) = alpha), so jaxdnn's gradients equal jax.nn's everywhere.
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
  kGelu = 7,         // x * Phi(x), exact (erf)
  kGeluTanh = 8,     // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  kSilu = 9,         // x * sigmoid(x) (swish)
};
constexpr int kNumActivations = 10;

// True when f'(x) can be computed from y = f(x) alone, so a backward pass may read the output
// instead of keeping the input (relu's y > 0, sigmoid's y (1 - y), tanh's 1 - y^2, ...).
JAXDNN_HD bool activation_grad_from_output(Activation a) {
  return a != Activation::kGelu && a != Activation::kGeluTanh && a != Activation::kSilu;
}

namespace act_detail {
template <class T>
JAXDNN_HD T sigmoid(T x) {
  return T(1) / (T(1) + exp(-x));
}
// sqrt(2/pi) and 1/sqrt(2pi), 1/sqrt(2).
template <class T> JAXDNN_HD T k_sqrt_2_over_pi() { return T(0.7978845608028654); }
template <class T> JAXDNN_HD T k_inv_sqrt_2pi() { return T(0.3989422804014327); }
template <class T> JAXDNN_HD T k_inv_sqrt_2() { return T(0.7071067811865476); }
}  // namespace act_detail

// f(x).
template <class T>
JAXDNN_HD T activate(Activation a, T x, T param) {
  using std::erf;
  using std::exp;
  using std::expm1;
  using std::tanh;
  switch (a) {
    case Activation::kIdentity: return x;
    // x > 0 ? x : 0 propagates NaN (a comparison with NaN is false, so the NaN must be tested).
    case Activation::kRelu: return x > T(0) ? x : (x != x ? x : T(0));
    case Activation::kLeakyRelu: return x >= T(0) ? x : param * x;
    case Activation::kClippedRelu:
      return x != x ? x : (x < T(0) ? T(0) : (x > param ? param : x));
    case Activation::kElu: return x > T(0) ? x : param * expm1(x);
    case Activation::kSigmoid: return act_detail::sigmoid(x);
    case Activation::kTanh: return tanh(x);
    case Activation::kGelu: return T(0.5) * x * (T(1) + erf(x * act_detail::k_inv_sqrt_2<T>()));
    case Activation::kGeluTanh: {
      const T u = act_detail::k_sqrt_2_over_pi<T>() * (x + T(0.044715) * x * x * x);
      return T(0.5) * x * (T(1) + tanh(u));
    }
    case Activation::kSilu: return x * act_detail::sigmoid(x);
  }
  return x;
}

// f'(x) from the input x.
template <class T>
JAXDNN_HD T activation_grad_from_input(Activation a, T x, T param) {
  using std::erf;
  using std::exp;
  using std::tanh;
  switch (a) {
    case Activation::kIdentity: return T(1);
    case Activation::kRelu: return x > T(0) ? T(1) : T(0);
    case Activation::kLeakyRelu: return x >= T(0) ? T(1) : param;
    case Activation::kClippedRelu: return (x > T(0) && x < param) ? T(1) : T(0);
    case Activation::kElu: return x > T(0) ? T(1) : param * exp(x);
    case Activation::kSigmoid: {
      const T s = act_detail::sigmoid(x);
      return s * (T(1) - s);
    }
    case Activation::kTanh: {
      const T t = tanh(x);
      return T(1) - t * t;
    }
    case Activation::kGelu:  // Phi(x) + x phi(x)
      return T(0.5) * (T(1) + erf(x * act_detail::k_inv_sqrt_2<T>())) +
             x * act_detail::k_inv_sqrt_2pi<T>() * exp(T(-0.5) * x * x);
    case Activation::kGeluTanh: {
      const T c = act_detail::k_sqrt_2_over_pi<T>();
      const T t = tanh(c * (x + T(0.044715) * x * x * x));
      return T(0.5) * (T(1) + t) +
             T(0.5) * x * (T(1) - t * t) * c * (T(1) + T(3 * 0.044715) * x * x);
    }
    case Activation::kSilu: {
      const T s = act_detail::sigmoid(x);
      return s * (T(1) + x * (T(1) - s));
    }
  }
  return T(1);
}

// f'(x) from the output y = f(x); only for kinds with activation_grad_from_output(a).
template <class T>
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

}  // namespace jaxdnn

#endif  // JAXDNN_ACTIVATION_H_
