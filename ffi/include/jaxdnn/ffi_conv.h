// Decoding of the jaxdnn_conv_{fwd,bwd_data,bwd_filter} FFI calls, shared by the CPU and CUDA
// handlers so both read the same contract.
//
// Call signature (the same for every operation and platform):
//   operands: a, b          (fwd: x, w;  bwd_data: dy, w;  bwd_filter: x, dy)
//   results:  out, workspace (workspace is a u8 buffer sized at trace time by workspace_bytes)
//   attributes (a flat dictionary):
//     layout: i32 (Layout)  algo: i32 (ConvAlgo)  precision: i32 (MathPrecision)  groups: i64
//     in_spatial, filter_spatial, stride, rhs_dilation, lhs_dilation, pad_lo, pad_hi:
//       i64 arrays, one entry per spatial dimension (1 to 3)
// Batch and channel counts are read from the buffers and checked against each other.
#ifndef JAXDNN_FFI_CONV_H_
#define JAXDNN_FFI_CONV_H_

#include <cstdint>
#include <string>
#include <utility>

#include "jaxdnn/conv_problem.h"
#include "xla/ffi/api/ffi.h"

namespace jaxdnn {

namespace ffi = xla::ffi;

// Result of decoding one call.
struct DecodedConv {
  ConvProblem problem;
  ConvAlgo algo = ConvAlgo::kDirect;
  MathPrecision precision = MathPrecision::kDefault;
  DType in_dtype = DType::kF32;
  DType out_dtype = DType::kF32;
};

inline bool to_dtype(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = DType::kF32; return true;
    case ffi::DataType::F64: *out = DType::kF64; return true;
    case ffi::DataType::BF16: *out = DType::kBF16; return true;
    case ffi::DataType::F16: *out = DType::kF16; return true;
    default: return false;
  }
}

namespace internal {

inline ffi::Error invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string("jaxdnn convolution: ") + msg);
}

template <typename T>
inline ffi::Error get_attr(const ffi::Dictionary& attrs, const char* name, T* value) {
  auto v = attrs.get<T>(name);
  if (v.has_error()) return invalid(std::string("missing or mistyped attribute '") + name + "'");
  *value = *v;
  return ffi::Error::Success();
}

inline ffi::Error get_spatial(const ffi::Dictionary& attrs, const char* name, int nsd,
                              int64_t fill, int64_t out[3]) {
  ffi::Span<const int64_t> span;
  if (auto err = get_attr(attrs, name, &span); !err.success()) return err;
  if (static_cast<int>(span.size()) != nsd)
    return invalid(std::string("attribute '") + name + "' has the wrong length");
  for (int i = 0; i < 3; ++i) out[i] = fill;
  for (int i = 0; i < nsd; ++i) out[3 - nsd + i] = span[i];
  return ffi::Error::Success();
}

// Splits an activation buffer's dims into (batch, channels, spatial[3]) for the layout.
inline bool split_activation(ffi::AnyBuffer::Dimensions d, Layout layout, int nsd, int64_t* n,
                             int64_t* c, int64_t sp[3]) {
  if (static_cast<int>(d.size()) != nsd + 2) return false;
  *n = d[0];
  *c = layout == Layout::kNHWC ? d[nsd + 1] : d[1];
  const int first = layout == Layout::kNHWC ? 1 : 2;
  for (int i = 0; i < 3; ++i) sp[i] = 1;
  for (int i = 0; i < nsd; ++i) sp[3 - nsd + i] = d[first + i];
  return true;
}

// Splits a filter buffer's dims into (in-channels per group, out channels, spatial[3]).
inline bool split_filter(ffi::AnyBuffer::Dimensions d, Layout layout, int nsd, int64_t* cg,
                         int64_t* k, int64_t sp[3]) {
  if (static_cast<int>(d.size()) != nsd + 2) return false;
  // kNHWC: [spatial..., I, O]; kNCHW: [O, I, spatial...]
  *cg = layout == Layout::kNHWC ? d[nsd] : d[1];
  *k = layout == Layout::kNHWC ? d[nsd + 1] : d[0];
  const int first = layout == Layout::kNHWC ? 0 : 2;
  for (int i = 0; i < 3; ++i) sp[i] = 1;
  for (int i = 0; i < nsd; ++i) sp[3 - nsd + i] = d[first + i];
  return true;
}

inline bool same3(const int64_t a[3], const int64_t b[3]) {
  return a[0] == b[0] && a[1] == b[1] && a[2] == b[2];
}

}  // namespace internal

// Appends what every jaxdnn conv handler binds after its platform context (if any):
// operands a, b; results out, workspace; all attributes as one dictionary.
template <typename Binding>
auto bind_conv_call(Binding&& binding) {
  return std::forward<Binding>(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attrs<ffi::Dictionary>();
}

// Decodes and validates one call. On success fills `dec`.
inline ffi::Error decode_conv_call(ConvOp op, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                   const ffi::AnyBuffer& out, const ffi::Dictionary& attrs,
                                   DecodedConv* dec) {
  using internal::invalid;
  int32_t layout = 0, algo = 0, precision = 0;
  int64_t groups = 1;
  if (auto e = internal::get_attr(attrs, "layout", &layout); !e.success()) return e;
  if (auto e = internal::get_attr(attrs, "algo", &algo); !e.success()) return e;
  if (auto e = internal::get_attr(attrs, "precision", &precision); !e.success()) return e;
  if (auto e = internal::get_attr(attrs, "groups", &groups); !e.success()) return e;
  if (layout != 0 && layout != 1) return invalid("layout must be 0 (NHWC) or 1 (NCHW)");
  if (algo < 0 || algo >= kNumConvAlgos) return invalid("unknown algorithm id");
  if (precision < 0 || precision > 2) return invalid("unknown precision");

  ConvProblem& p = dec->problem;
  p.layout = static_cast<Layout>(layout);
  dec->algo = static_cast<ConvAlgo>(algo);
  dec->precision = static_cast<MathPrecision>(precision);
  p.G = groups;

  const int nsd = static_cast<int>(a.dimensions().size()) - 2;
  if (nsd < 1 || nsd > 3) return invalid("operands must have 1 to 3 spatial dimensions");
  p.spatial_dims = nsd;
  if (auto e = internal::get_spatial(attrs, "in_spatial", nsd, 1, p.in); !e.success()) return e;
  if (auto e = internal::get_spatial(attrs, "filter_spatial", nsd, 1, p.filt); !e.success())
    return e;
  if (auto e = internal::get_spatial(attrs, "stride", nsd, 1, p.stride); !e.success()) return e;
  if (auto e = internal::get_spatial(attrs, "rhs_dilation", nsd, 1, p.dilation); !e.success())
    return e;
  if (auto e = internal::get_spatial(attrs, "lhs_dilation", nsd, 1, p.lhs_dilation);
      !e.success())
    return e;
  if (auto e = internal::get_spatial(attrs, "pad_lo", nsd, 0, p.pad_lo); !e.success()) return e;
  if (auto e = internal::get_spatial(attrs, "pad_hi", nsd, 0, p.pad_hi); !e.success()) return e;
  for (int i = 0; i < 3; ++i) {
    if (p.stride[i] <= 0 || p.dilation[i] <= 0 || p.lhs_dilation[i] <= 0)
      return invalid("strides and dilations must be positive");
    p.out[i] = conv_output_size(p.in[i], p.filt[i], p.stride[i], p.dilation[i],
                                p.lhs_dilation[i], p.pad_lo[i], p.pad_hi[i]);
  }

  // The buffers, by role.
  const ffi::AnyBuffer* x = nullptr;   // activation-shaped input of the forward problem
  const ffi::AnyBuffer* y = nullptr;   // activation-shaped output of the forward problem
  const ffi::AnyBuffer* w = nullptr;   // filter
  switch (op) {
    case ConvOp::kForward: x = &a; w = &b; y = &out; break;
    case ConvOp::kBackwardData: y = &a; w = &b; x = &out; break;
    case ConvOp::kBackwardFilter: x = &a; y = &b; w = &out; break;
  }
  int64_t xn, xc, xs[3], yn, yk, ys[3], wcg, wk, ws[3];
  if (!internal::split_activation(x->dimensions(), p.layout, nsd, &xn, &xc, xs) ||
      !internal::split_activation(y->dimensions(), p.layout, nsd, &yn, &yk, ys) ||
      !internal::split_filter(w->dimensions(), p.layout, nsd, &wcg, &wk, ws))
    return invalid("operand ranks do not match");
  if (xn != yn) return invalid("batch sizes of input and output do not match");
  if (groups <= 0 || xc % groups != 0 || wk % groups != 0 || xc / groups != wcg)
    return invalid("channel counts do not match feature_group_count");
  if (yk != wk) return invalid("output channels do not match the filter");
  if (!internal::same3(xs, p.in) || !internal::same3(ws, p.filt) || !internal::same3(ys, p.out))
    return invalid("buffer spatial shapes do not match the geometry attributes");
  p.N = xn;
  p.C = xc;
  p.K = wk;
  if (std::string why = validate_problem(p); !why.empty()) return invalid(why);

  if (!to_dtype(a.element_type(), &dec->in_dtype) || b.element_type() != a.element_type())
    return invalid("operands must both be float32, float64, bfloat16 or float16");
  if (!to_dtype(out.element_type(), &dec->out_dtype))
    return invalid("result must be float32, float64, bfloat16 or float16");
  return ffi::Error::Success();
}

}  // namespace jaxdnn

#endif  // JAXDNN_FFI_CONV_H_
