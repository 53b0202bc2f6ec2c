// Decoding of the activation and softmax FFI calls, shared by the CPU and CUDA handlers so both
// read the same contract (pointwise_problem.h describes the operations).
//
//   jaxdnn_activation_fwd  operands: x         result: y   any shape, one dtype
//   jaxdnn_activation_bwd  operands: s, dy     result: dx  one shape, one dtype
//     attributes: activation: i32 (jaxdnn::Activation)  activation_param: f64
//                 bwd only: from_output: i32 (0/1)  derivative: i32 (1 or 2)
//   jaxdnn_activation_mask_fwd  operand: x (rank >= 1)   results: y (x's shape and dtype), bits
//   jaxdnn_activation_mask_bwd  operands: bits, dy       result: dx (dy's shape and dtype)
//     bits: uint8, the data's shape with its last dimension L replaced by ceil(L / 8)
//     attributes: activation: i32 (relu, leaky_relu or clipped_relu)  activation_param: f64
//   jaxdnn_softmax_fwd     operands: x         result: y   any shape, viewed as [outer, n, inner]
//   jaxdnn_softmax_bwd     operands: y, v      result: out one shape
//     attributes: op: i32 (jaxdnn::SoftmaxOp; the forward takes kSoftmax or kLogSoftmax)
//                 outer, n, inner: i64 (their product is every buffer's element count)
//   (The callers pass flat buffers: a reshape to [outer, n, 1] would make XLA insert layout
//   copies around the custom call.)
// dtypes: float32, float64, bfloat16, float16. Every malformed call returns InvalidArgument.
#ifndef JAXDNN_FFI_POINTWISE_H_
#define JAXDNN_FFI_POINTWISE_H_

#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <string>
#include <utility>

#include "jaxdnn/ffi_conv.h"  // namespace alias ffi, to_dtype
#include "jaxdnn/pointwise_problem.h"
#include "xla/ffi/api/ffi.h"

namespace jaxdnn {

// Runs a pointwise handler body; an exception (there should be none) becomes an FFI error
// naming the operation instead of crossing the C ABI.
template <typename Fn>
ffi::Error guard_pointwise(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn ") + what + ": unexpected exception: " +
                                e.what());
  } catch (...) {
    return ffi::Error::Internal(std::string("jaxdnn ") + what + ": unexpected exception");
  }
}

namespace pointwise_internal {

inline ffi::Error invalid(const char* what, const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string("jaxdnn ") + what + ": " + msg);
}

template <typename T>
inline ffi::Error attr(const char* what, const ffi::Dictionary& attrs, const char* name, T* out) {
  auto v = attrs.get<T>(name);
  if (v.has_error())
    return invalid(what, std::string("missing or mistyped attribute '") + name + "'");
  *out = *v;
  return ffi::Error::Success();
}

inline bool same_dims(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b) {
  auto da = a.dimensions(), db = b.dimensions();
  if (da.size() != db.size()) return false;
  for (size_t i = 0; i < da.size(); ++i)
    if (da[i] != db[i]) return false;
  return true;
}

// One supported dtype shared by every buffer.
inline ffi::Error common_dtype(const char* what, std::initializer_list<const ffi::AnyBuffer*> bufs,
                               DType* dtype) {
  const ffi::DataType t = (*bufs.begin())->element_type();
  for (const ffi::AnyBuffer* b : bufs)
    if (b->element_type() != t)
      return invalid(what, "operands and result must share one dtype");
  if (!to_dtype(t, dtype))
    return invalid(what, "unsupported dtype (float32, float64, bfloat16 or float16 only)");
  return ffi::Error::Success();
}

}  // namespace pointwise_internal

// Activation forward (derivative = 0) or backward (s, dy given: derivative 1 or 2).
inline ffi::Error decode_activation_call(const ffi::AnyBuffer& s, const ffi::AnyBuffer* dy,
                                         const ffi::AnyBuffer& out, const ffi::Dictionary& attrs,
                                         ActivationCall* c) {
  using namespace pointwise_internal;
  constexpr const char* kWhat = "activation";
  int32_t act = 0;
  if (auto e = attr(kWhat, attrs, "activation", &act); !e.success()) return e;
  if (act < 0 || act >= kNumActivations)
    return invalid(kWhat, "unknown activation id " + std::to_string(act));
  c->activation = static_cast<Activation>(act);
  if (auto e = attr(kWhat, attrs, "activation_param", &c->param); !e.success()) return e;
  if (!std::isfinite(c->param)) return invalid(kWhat, "the activation parameter must be finite");
  if (c->activation == Activation::kClippedRelu && !(c->param > 0))
    return invalid(kWhat, "clipped_relu's ceiling must be positive");
  if ((c->activation == Activation::kLeakyRelu || c->activation == Activation::kElu) &&
      c->param < 0)
    return invalid(kWhat, "leaky_relu's slope and elu's alpha must be non-negative");
  c->derivative = 0;
  c->from_output = false;
  if (dy != nullptr) {
    int32_t from_output = 0, derivative = 0;
    if (auto e = attr(kWhat, attrs, "from_output", &from_output); !e.success()) return e;
    if (auto e = attr(kWhat, attrs, "derivative", &derivative); !e.success()) return e;
    if (derivative != 1 && derivative != 2)
      return invalid(kWhat, "derivative must be 1 or 2, got " + std::to_string(derivative));
    if (from_output != 0 && !activation_grad_from_output(c->activation))
      return invalid(kWhat, "this activation's derivative cannot be computed from its output");
    c->derivative = derivative;
    c->from_output = from_output != 0;
    if (!same_dims(s, *dy)) return invalid(kWhat, "s and dy must have one shape");
    if (auto e = common_dtype(kWhat, {&s, dy, &out}, &c->dtype); !e.success()) return e;
  } else {
    if (auto e = common_dtype(kWhat, {&s, &out}, &c->dtype); !e.success()) return e;
  }
  if (!same_dims(s, out)) return invalid(kWhat, "the result must have the operand's shape");
  c->n = static_cast<int64_t>(s.element_count());
  return ffi::Error::Success();
}

// Activation mask forward (data = x, out = y) or backward (data = dy, out = dx); `bits` is the
// mask, a result of the forward and an operand of the backward (pointwise_problem.h).
inline ffi::Error decode_activation_mask_call(const ffi::AnyBuffer& data,
                                              const ffi::AnyBuffer& bits,
                                              const ffi::AnyBuffer& out,
                                              const ffi::Dictionary& attrs, bool backward,
                                              ActivationMaskCall* c) {
  using namespace pointwise_internal;
  constexpr const char* kWhat = "activation mask";
  int32_t act = 0;
  if (auto e = attr(kWhat, attrs, "activation", &act); !e.success()) return e;
  if (act < 0 || act >= kNumActivations || !activation_has_mask(static_cast<Activation>(act)))
    return invalid(kWhat, "activation id " + std::to_string(act) +
                              " has no mask form (relu, leaky_relu or clipped_relu only)");
  c->activation = static_cast<Activation>(act);
  if (auto e = attr(kWhat, attrs, "activation_param", &c->param); !e.success()) return e;
  if (!std::isfinite(c->param)) return invalid(kWhat, "the activation parameter must be finite");
  if (c->activation == Activation::kClippedRelu && !(c->param > 0))
    return invalid(kWhat, "clipped_relu's ceiling must be positive");
  if (c->activation == Activation::kLeakyRelu && c->param < 0)
    return invalid(kWhat, "leaky_relu's slope must be non-negative");
  c->backward = backward;
  if (auto e = common_dtype(kWhat, {&data, &out}, &c->dtype); !e.success()) return e;
  if (!same_dims(data, out)) return invalid(kWhat, "the result must have the operand's shape");
  auto dims = data.dimensions();
  if (dims.size() == 0) return invalid(kWhat, "the operand must have rank >= 1");
  if (bits.element_type() != ffi::DataType::U8) return invalid(kWhat, "the mask must be uint8");
  auto mdims = bits.dimensions();
  bool mask_shape = mdims.size() == dims.size();
  for (size_t i = 0; mask_shape && i + 1 < dims.size(); ++i) mask_shape = mdims[i] == dims[i];
  c->row = dims[dims.size() - 1];
  if (!mask_shape || mdims[mdims.size() - 1] != activation_mask_bytes(c->row))
    return invalid(kWhat, "the mask must have the data's shape with its last dimension L "
                          "replaced by ceil(L / 8)");
  c->rows = c->row == 0 ? 0 : static_cast<int64_t>(data.element_count()) / c->row;
  return ffi::Error::Success();
}

// A whole activation-mask handler body: decode, then run(call, data, out, bits) (the backend's
// kernels; "" or the reason for an error), guarded against exceptions.
template <typename Run>
ffi::Error run_activation_mask_call(const ffi::AnyBuffer& data, const ffi::AnyBuffer& bits,
                                    const ffi::AnyBuffer& out, const ffi::Dictionary& attrs,
                                    bool backward, Run&& run) {
  return guard_pointwise("activation mask", [&] {
    ActivationMaskCall c;
    if (auto e = decode_activation_mask_call(data, bits, out, attrs, backward, &c); !e.success())
      return e;
    const std::string err = run(c, data.untyped_data(), out.untyped_data(),
                                static_cast<uint8_t*>(bits.untyped_data()));
    if (!err.empty()) return ffi::Error::InvalidArgument("jaxdnn activation mask: " + err);
    return ffi::Error::Success();
  });
}

// Softmax forward (v == nullptr) or backward (operands y, v).
inline ffi::Error decode_softmax_call(const ffi::AnyBuffer& x, const ffi::AnyBuffer* v,
                                      const ffi::AnyBuffer& out, const ffi::Dictionary& attrs,
                                      SoftmaxCall* c) {
  using namespace pointwise_internal;
  constexpr const char* kWhat = "softmax";
  int32_t op = 0;
  if (auto e = attr(kWhat, attrs, "op", &op); !e.success()) return e;
  c->backward = v != nullptr;
  if (op < 0 || op > (c->backward ? 2 : 1))
    return invalid(kWhat, "unknown softmax operation " + std::to_string(op));
  c->op = static_cast<SoftmaxOp>(op);
  int64_t outer = 0, n = 0, inner = 0;
  if (auto e = attr(kWhat, attrs, "outer", &outer); !e.success()) return e;
  if (auto e = attr(kWhat, attrs, "n", &n); !e.success()) return e;
  if (auto e = attr(kWhat, attrs, "inner", &inner); !e.success()) return e;
  if (outer < 0 || n < 0 || inner < 0) return invalid(kWhat, "negative view dimension");
  const size_t count = x.element_count();
  if (static_cast<size_t>(outer) * static_cast<size_t>(n) * static_cast<size_t>(inner) != count ||
      out.element_count() != count || (v && v->element_count() != count))
    return invalid(kWhat, "operands and result must have outer * n * inner elements");
  if (v) {
    if (auto e = common_dtype(kWhat, {&x, v, &out}, &c->dtype); !e.success()) return e;
  } else {
    if (auto e = common_dtype(kWhat, {&x, &out}, &c->dtype); !e.success()) return e;
  }
  c->outer = outer;
  c->n = n;
  c->inner = inner;
  return ffi::Error::Success();
}

template <typename Binding>
auto bind_unary_pointwise_call(Binding&& binding) {
  return std::forward<Binding>(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attrs<ffi::Dictionary>();
}

template <typename Binding>
auto bind_binary_pointwise_call(Binding&& binding) {
  return std::forward<Binding>(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attrs<ffi::Dictionary>();
}

}  // namespace jaxdnn

#endif  // JAXDNN_FFI_POINTWISE_H_
