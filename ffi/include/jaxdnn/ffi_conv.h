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
//     tile: i32, optional (absent = 0): ConvProblem::tile, the output tile edge WINOGRAD_NONFUSED
//       must use (2, 4 or 6; 0 = the family's choice; other families require 0)
// Batch and channel counts are read from the buffers and checked against each other.
// WINOGRAD and WINOGRAD_NONFUSED forward and backward-data (takes_winograd_filter): operand b is
// the transformed filter U (the result of jaxdnn_winograd_filter below), not w; the filter's
// shape is then read from the geometry (filter_spatial, channels of a and out), and U's dims
// and dtype are checked by the backend against the ones its winograd_filter_dims gives.
//
// Filter transform of the Winograd families, target jaxdnn_winograd_filter:
//   U = G w G^T for every (group, pass input channel, pass output channel) of a 2-D 3x3 filter
//   (or a 3-D one of depth 1), in the layout the backend's per-point GEMMs read (CPU: gemm.h's
//   packed-B panels; CUDA: zero-padded [a*a][G][Cgp][Kgp]).
//   operand:  w (the filter, f32, f64, bf16 or f16; HWIO / DHWIO or OIHW / OIDHW by layout)
//   result:   U, float32 (float64 for a float64 w), dims from the backend's query
//             winograd_filter_shape (a 4-D array whose leading dims are a*a points and G groups)
//   attributes: layout: i32, groups: i64, tile: i32 (the output tile edge m: 2, 4 or 6; a = m + 2),
//     flip: i32 (0: the forward's filter; 1: backward-data's, w'(r, s, c, k) = w(2-r, 2-s, k, c))
//   No workspace, no side effect: identical calls on one w are one XLA value (CSE), and a call
//   on a loop-invariant w is loop-invariant (hoisted out of while loops).
//
// Fused forward, target jaxdnn_conv_fwd_fused (the same name on every platform):
//   y = act(z),  z = conv(x, w) + bias[k] + residual[n, ..., k]      (conv_problem.h ConvEpilogue)
//   operands: x, w, bias, residual
//     bias:     [K] in the result's dtype, or a zero-element array (shape (0,)) when absent;
//     residual: the result's shape and dtype, or a zero-element array (shape (0,)) when absent.
//   results:  out, preact, workspace
//     preact:   the result's shape and dtype when the kernel must also store z (the backward of
//               activations whose derivative needs the input: gelu, gelu_tanh, silu), else a
//               zero-element array (shape (0,)); it is never read.
//     workspace: u8, sized at trace time by the backend's workspace_bytes_fused query.
//   attributes: the dictionary above plus
//     activation: i32 (jaxdnn::Activation, activation.h)   activation_param: f64
// A zero-element bias / residual / preact means absent: K > 0 always, and a present residual or
// preact has the result's rank (>= 3). Presence is therefore read from the buffers alone.
//
// Backward of the epilogue's activation with the bias gradient, target jaxdnn_bias_act_bwd:
//   t'[o, k, i] = t[o, k, i] + tb[k],  dz = t' * f'(s),  db[k] = sum over (o, i) of dz[o, k, i]
//   operands: t (outer, K, inner), tb ([K], or shape (0,) when absent), s (outer, K, inner)
//   results:  dz (outer, K, inner), db ([K], or shape (0,) when not wanted), workspace (u8, sized
//             at trace time by the backend's bias_act_workspace_bytes: the GPU's bias-gradient
//             partials; empty on the CPU)
//   attributes: activation: i32, activation_param: f64
// s is the activation's output when activation_grad_from_output(kind), else its input (the
// preact z of the fused forward). One dtype for all (f32, f64, bf16, f16); 16-bit values are
// computed in float32 and dz, db rounded once. A channels-last tensor is passed as
// (pixels, K, 1), a channels-first one as (N, K, pixels).
#ifndef JAXDNN_FFI_CONV_H_
#define JAXDNN_FFI_CONV_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "jaxdnn/conv_problem.h"
#include "jaxdnn/winograd_filter.h"
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
  if (auto t = attrs.get<int32_t>("tile"); !t.has_error()) p.tile = *t;

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
  // The Winograd families' forward and backward-data take U as b: the filter's shape follows
  // from the channels of the activations and the geometry.
  const bool transformed = takes_winograd_filter(op, dec->algo);
  int64_t xn, xc, xs[3], yn, yk, ys[3], wcg = 0, wk = 0, ws[3];
  if (!internal::split_activation(x->dimensions(), p.layout, nsd, &xn, &xc, xs) ||
      !internal::split_activation(y->dimensions(), p.layout, nsd, &yn, &yk, ys) ||
      (!transformed && !internal::split_filter(w->dimensions(), p.layout, nsd, &wcg, &wk, ws)))
    return invalid("operand ranks do not match");
  if (transformed) {
    wcg = groups > 0 ? xc / groups : 0, wk = yk;
    for (int i = 0; i < 3; ++i) ws[i] = p.filt[i];
  }
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

  if (!to_dtype(a.element_type(), &dec->in_dtype) ||
      (!transformed && b.element_type() != a.element_type()))
    return invalid("operands must both be float32, float64, bfloat16 or float16");
  if (!to_dtype(out.element_type(), &dec->out_dtype))
    return invalid("result must be float32, float64, bfloat16 or float16");
  if (transformed) {
    DType u;
    if (!to_dtype(b.element_type(), &u) || u != winograd_filter_dtype(dec->in_dtype, dec->out_dtype))
      return invalid(std::string(conv_algo_name(dec->algo)) + " " + conv_op_name(op) +
                     " takes the transformed filter U (jaxdnn_winograd_filter's result) in " +
                     (winograd_filter_dtype(dec->in_dtype, dec->out_dtype) == DType::kF64
                          ? "float64" : "float32") + " as its second operand");
  }
  return ffi::Error::Success();
}

// Whether U's dims are exactly `want` (the backend's winograd_filter_shape).
inline bool winograd_filter_dims_are(const ffi::AnyBuffer& u, const int64_t want[4]) {
  const auto d = u.dimensions();
  bool ok = d.size() == 4;
  for (size_t i = 0; ok && i < 4; ++i) ok = d[i] == want[i];
  return ok;
}

// Checks U (operand b of a takes_winograd_filter call) against the dims the backend expects.
inline ffi::Error check_winograd_filter_dims(const ffi::AnyBuffer& u, const int64_t want[4],
                                             const DecodedConv& dec, ConvOp op) {
  if (winograd_filter_dims_are(u, want)) return ffi::Error::Success();
  const auto d = u.dimensions();
  std::string got, exp;
  for (size_t i = 0; i < d.size(); ++i) got += (i ? ", " : "") + std::to_string(d[i]);
  for (int i = 0; i < 4; ++i) exp += (i ? ", " : "") + std::to_string(want[i]);
  return internal::invalid(std::string(conv_algo_name(dec.algo)) + " " + conv_op_name(op) +
                           ": the transformed filter U has dims (" + got + "), expected (" + exp +
                           ") for this geometry (jaxdnn_winograd_filter with the same layout, "
                           "groups, tile and flip)");
}

// Appends what the jaxdnn_winograd_filter handler binds after its platform context (if any).
template <typename Binding>
auto bind_winograd_filter_call(Binding&& binding) {
  return std::forward<Binding>(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attrs<ffi::Dictionary>();
}

// One decoded jaxdnn_winograd_filter call. `filter` describes w only (layout, G, C = Cg * G, K,
// filt; the other fields are unused); Cig / Cog are the pass's input / output channels per group
// (forward: C/G, K/G; flip: K/G, C/G).
struct DecodedWinogradFilter {
  ConvProblem filter;
  int tile = 4;
  bool flip = false;
  int64_t Cig = 0, Cog = 0;
  DType w_dtype = DType::kF32, u_dtype = DType::kF32;
};

inline ffi::Error decode_winograd_filter_call(const ffi::AnyBuffer& w, const ffi::AnyBuffer& u,
                                              const ffi::Dictionary& attrs,
                                              DecodedWinogradFilter* dec) {
  auto invalid = [](const std::string& msg) {
    return ffi::Error::InvalidArgument("jaxdnn Winograd filter transform: " + msg);
  };
  int32_t layout = 0, tile = 0, flip = 0;
  int64_t groups = 1;
  if (auto e = internal::get_attr(attrs, "layout", &layout); !e.success()) return e;
  if (auto e = internal::get_attr(attrs, "groups", &groups); !e.success()) return e;
  if (auto e = internal::get_attr(attrs, "tile", &tile); !e.success()) return e;
  if (auto e = internal::get_attr(attrs, "flip", &flip); !e.success()) return e;
  if (layout != 0 && layout != 1) return invalid("layout must be 0 (NHWC) or 1 (NCHW)");
  if (tile != 2 && tile != 4 && tile != 6) return invalid("tile must be 2, 4 or 6");
  if (flip != 0 && flip != 1) return invalid("flip must be 0 or 1");
  ConvProblem& p = dec->filter;
  p.layout = static_cast<Layout>(layout);
  const int nsd = static_cast<int>(w.dimensions().size()) - 2;
  if (nsd != 2 && nsd != 3) return invalid("the filter must be 2-D (or 3-D of depth 1)");
  p.spatial_dims = nsd;
  int64_t cg, k;
  if (!internal::split_filter(w.dimensions(), p.layout, nsd, &cg, &k, p.filt))
    return invalid("the filter's rank does not match");
  if (p.filt[0] != 1 || p.filt[1] != 3 || p.filt[2] != 3)
    return invalid("the filter must be 3x3 (depth 1 in 3-D)");
  if (groups <= 0 || k % groups != 0) return invalid("output channels must divide into groups");
  p.G = groups, p.C = cg * groups, p.K = k;
  dec->tile = tile;
  dec->flip = flip != 0;
  dec->Cig = dec->flip ? k / groups : cg;
  dec->Cog = dec->flip ? cg : k / groups;
  if (!to_dtype(w.element_type(), &dec->w_dtype))
    return invalid("the filter must be float32, float64, bfloat16 or float16");
  dec->u_dtype = dec->w_dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  DType u_type;
  if (!to_dtype(u.element_type(), &u_type) || u_type != dec->u_dtype)
    return invalid(std::string("U must be ") +
                   (dec->u_dtype == DType::kF64 ? "float64" : "float32") + " for this filter");
  return ffi::Error::Success();
}

// Checks the transform's result U against the dims the backend expects.
inline ffi::Error check_winograd_filter_result(const ffi::AnyBuffer& u, const int64_t want[4]) {
  if (winograd_filter_dims_are(u, want)) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(
      "jaxdnn Winograd filter transform: U has the wrong dims for this filter, tile and backend "
      "(size it with the extension's winograd_filter_shape query)");
}

// Appends what the fused forward handler binds after its platform context (if any): operands
// x, w, bias, residual; results out, preact, workspace; the attribute dictionary.
template <typename Binding>
auto bind_conv_fused_call(Binding&& binding) {
  return std::forward<Binding>(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attrs<ffi::Dictionary>();
}

namespace internal {

inline bool same_dims(ffi::AnyBuffer::Dimensions a, ffi::AnyBuffer::Dimensions b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

}  // namespace internal

// Decodes and validates one fused forward call: the convolution as decode_conv_call(kForward),
// then the epilogue operands, the preact result and the activation attributes. On success fills
// `dec` and `epi` (null pointers for absent operands).
inline ffi::Error decode_conv_fused_call(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w,
                                         const ffi::AnyBuffer& bias,
                                         const ffi::AnyBuffer& residual,
                                         const ffi::AnyBuffer& out, const ffi::AnyBuffer& preact,
                                         const ffi::Dictionary& attrs, DecodedConv* dec,
                                         ConvEpilogue* epi) {
  using internal::invalid;
  if (auto e = decode_conv_call(ConvOp::kForward, x, w, out, attrs, dec); !e.success()) return e;
  int32_t act = 0;
  double param = 0.0;
  if (auto e = internal::get_attr(attrs, "activation", &act); !e.success()) return e;
  if (auto e = internal::get_attr(attrs, "activation_param", &param); !e.success()) return e;
  if (act < 0 || act >= kNumActivations) return invalid("unknown activation id");
  *epi = ConvEpilogue{};
  epi->activation = static_cast<Activation>(act);
  epi->param = param;
  const ffi::DataType out_type = out.element_type();
  if (bias.element_count() > 0) {
    if (bias.dimensions().size() != 1 || bias.dimensions()[0] != dec->problem.K)
      return invalid("bias must have shape [K] (the output channel count)");
    if (bias.element_type() != out_type) return invalid("bias must have the result's dtype");
    epi->bias = bias.untyped_data();
  }
  if (residual.element_count() > 0) {
    if (!internal::same_dims(residual.dimensions(), out.dimensions()))
      return invalid("residual must have the result's shape");
    if (residual.element_type() != out_type)
      return invalid("residual must have the result's dtype");
    epi->residual = residual.untyped_data();
  }
  if (preact.element_count() > 0) {
    if (!internal::same_dims(preact.dimensions(), out.dimensions()))
      return invalid("preact must have the result's shape");
    if (preact.element_type() != out_type) return invalid("preact must have the result's dtype");
    epi->preact = preact.untyped_data();
  }
  return ffi::Error::Success();
}

// Appends what the jaxdnn_bias_act_bwd handler binds after its platform context (if any).
template <typename Binding>
auto bind_bias_act_call(Binding&& binding) {
  return std::forward<Binding>(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attrs<ffi::Dictionary>();
}

struct DecodedBiasAct {
  int64_t outer = 0, K = 0, inner = 0;
  Activation activation = Activation::kIdentity;
  double param = 0.0;
  DType dtype = DType::kF32;
  bool has_tb = false, has_db = false;
};

// Decodes and validates one jaxdnn_bias_act_bwd call.
inline ffi::Error decode_bias_act_call(const ffi::AnyBuffer& t, const ffi::AnyBuffer& tb,
                                       const ffi::AnyBuffer& s, const ffi::AnyBuffer& dz,
                                       const ffi::AnyBuffer& db, const ffi::Dictionary& attrs,
                                       DecodedBiasAct* dec) {
  auto invalid = [](const std::string& msg) {
    return ffi::Error::InvalidArgument("jaxdnn bias/activation backward: " + msg);
  };
  auto act = attrs.get<int32_t>("activation");
  auto param = attrs.get<double>("activation_param");
  if (act.has_error() || param.has_error())
    return invalid("missing or mistyped attribute 'activation' or 'activation_param'");
  if (*act < 0 || *act >= kNumActivations) return invalid("unknown activation id");
  dec->activation = static_cast<Activation>(*act);
  dec->param = *param;
  if (t.dimensions().size() != 3) return invalid("t must have rank 3 (outer, K, inner)");
  if (!internal::same_dims(s.dimensions(), t.dimensions()) ||
      !internal::same_dims(dz.dimensions(), t.dimensions()))
    return invalid("t, s and dz must have one shape");
  dec->outer = t.dimensions()[0];
  dec->K = t.dimensions()[1];
  dec->inner = t.dimensions()[2];
  if (!to_dtype(t.element_type(), &dec->dtype))
    return invalid("operands must be float32, float64, bfloat16 or float16");
  for (const ffi::AnyBuffer* b : {&tb, &s, &dz, &db})
    if (b->element_type() != t.element_type())
      return invalid("operands and results must share one dtype");
  auto vector_k = [&](const ffi::AnyBuffer& b) {
    return b.dimensions().size() == 1 && b.dimensions()[0] == dec->K;
  };
  dec->has_tb = tb.element_count() > 0 || (dec->K == 0 && vector_k(tb));
  dec->has_db = db.element_count() > 0 || (dec->K == 0 && vector_k(db));
  if (dec->has_tb && !vector_k(tb)) return invalid("tb must have shape [K]");
  if (dec->has_db && !vector_k(db)) return invalid("db must have shape [K]");
  return ffi::Error::Success();
}

}  // namespace jaxdnn

#endif  // JAXDNN_FFI_CONV_H_
