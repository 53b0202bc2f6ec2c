// XLA FFI handlers of the CPU backend: decode (ffi_conv.h), run (conv_cpu.cc, pool_cpu.cc),
// report errors.
#include "handlers.h"

#include <exception>
#include <string>

#include "bias_act.h"
#include "conv_cpu.h"
#include "jaxdnn/ffi_conv.h"
#include "pool_cpu.h"

namespace jaxdnn::cpu {
namespace {

ffi::Error run_conv_call(ConvOp op, ffi::AnyBuffer a, ffi::AnyBuffer b,
                         ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                         ffi::Dictionary attrs) {
  DecodedConv dec;
  if (auto err = decode_conv_call(op, a, b, *out, attrs, &dec); !err.success()) return err;
  const size_t need = cpu::workspace_bytes(op, dec.algo, dec.problem, dec.in_dtype, dec.out_dtype);
  if (workspace->size_bytes() < need)
    return ffi::Error::InvalidArgument("jaxdnn convolution: workspace buffer is too small (" +
                                       std::to_string(workspace->size_bytes()) + " < " +
                                       std::to_string(need) + " bytes)");
  std::string err = cpu::run_conv(op, dec.algo, dec.problem, dec.in_dtype, dec.out_dtype,
                                  a.untyped_data(), b.untyped_data(), out->untyped_data(),
                                  workspace->untyped_data(), workspace->size_bytes());
  if (!err.empty()) return ffi::Error::InvalidArgument("jaxdnn convolution: " + err);
  return ffi::Error::Success();
}

// No C++ exception may cross the FFI boundary (an allocation failure in a kernel, say).
template <ConvOp kOp>
ffi::Error conv_handler_impl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> workspace, ffi::Dictionary attrs) {
  try {
    return run_conv_call(kOp, a, b, out, workspace, attrs);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn convolution: unexpected exception: ") +
                                e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxdnn convolution: unexpected exception");
  }
}

// Fused forward (ffi_conv.h): conv + bias + residual, activation, optional preact.
ffi::Error run_conv_fused_call(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer bias,
                               ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> out,
                               ffi::Result<ffi::AnyBuffer> preact,
                               ffi::Result<ffi::AnyBuffer> workspace, ffi::Dictionary attrs) {
  DecodedConv dec;
  ConvEpilogue epi;
  if (auto err = decode_conv_fused_call(x, w, bias, residual, *out, *preact, attrs, &dec, &epi);
      !err.success())
    return err;
  if (std::string why = cpu::can_implement_fused(dec.algo, dec.problem); !why.empty())
    return ffi::Error::InvalidArgument(std::string("jaxdnn fused convolution (") +
                                       conv_algo_name(dec.algo) + "): " + why);
  const size_t need = cpu::workspace_bytes(ConvOp::kForward, dec.algo, dec.problem, dec.in_dtype,
                                           dec.out_dtype, /*epilogue=*/true);
  if (workspace->size_bytes() < need)
    return ffi::Error::InvalidArgument("jaxdnn fused convolution: workspace buffer is too small (" +
                                       std::to_string(workspace->size_bytes()) + " < " +
                                       std::to_string(need) + " bytes)");
  std::string err = cpu::run_conv(ConvOp::kForward, dec.algo, dec.problem, dec.in_dtype,
                                  dec.out_dtype, x.untyped_data(), w.untyped_data(),
                                  out->untyped_data(), workspace->untyped_data(),
                                  workspace->size_bytes(), epi);
  if (!err.empty()) return ffi::Error::InvalidArgument("jaxdnn fused convolution: " + err);
  return ffi::Error::Success();
}

ffi::Error conv_fused_handler_impl(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer bias,
                                   ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> out,
                                   ffi::Result<ffi::AnyBuffer> preact,
                                   ffi::Result<ffi::AnyBuffer> workspace, ffi::Dictionary attrs) {
  try {
    return run_conv_fused_call(x, w, bias, residual, out, preact, workspace, attrs);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn fused convolution: unexpected exception: ") +
                                e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxdnn fused convolution: unexpected exception");
  }
}

// jaxdnn_bias_act_bwd (ffi_conv.h, bias_act.h).
ffi::Error bias_act_handler_impl(ffi::AnyBuffer t, ffi::AnyBuffer tb, ffi::AnyBuffer s,
                                 ffi::Result<ffi::AnyBuffer> dz, ffi::Result<ffi::AnyBuffer> db,
                                 ffi::Result<ffi::AnyBuffer> /*workspace: unused on the CPU*/,
                                 ffi::Dictionary attrs) {
  try {
    DecodedBiasAct dec;
    if (auto err = decode_bias_act_call(t, tb, s, *dz, *db, attrs, &dec); !err.success())
      return err;
    BiasActProblem p;
    p.outer = dec.outer;
    p.K = dec.K;
    p.inner = dec.inner;
    p.act = dec.activation;
    p.param = dec.param;
    p.dtype = dec.dtype;
    std::string err = run_bias_act_backward(p, t.untyped_data(),
                                            dec.has_tb ? tb.untyped_data() : nullptr,
                                            s.untyped_data(), dz->untyped_data(),
                                            dec.has_db ? db->untyped_data() : nullptr);
    if (!err.empty())
      return ffi::Error::InvalidArgument("jaxdnn bias/activation backward: " + err);
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn bias/activation backward: unexpected "
                                            "exception: ") + e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxdnn bias/activation backward: unexpected exception");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvForward, conv_handler_impl<ConvOp::kForward>,
                              bind_conv_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvBackwardData, conv_handler_impl<ConvOp::kBackwardData>,
                              bind_conv_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvBackwardFilter, conv_handler_impl<ConvOp::kBackwardFilter>,
                              bind_conv_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvForwardFused, conv_fused_handler_impl,
                              bind_conv_fused_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(BiasActBackward, bias_act_handler_impl,
                              bind_bias_act_call(ffi::Ffi::Bind()));

}  // namespace jaxdnn::cpu

// ---------------------------------------------------------------------------------------------
// Pooling (pool_cpu.cc). Every pooling target binds its operands and results as remaining
// arguments (1 or 2 operands; the result, plus a u8 workspace for the scatter) and one attribute
// dictionary: window, stride, dilation, pad_lo, pad_hi, count_lo, count_hi (i64 arrays, one entry
// per spatial dimension). Buffers are channels-last (N, spatial..., C).

namespace jaxdnn::cpu {
namespace {

ffi::Error pool_invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument("jaxdnn pooling: " + msg);
}

ffi::Error pool_spatial(const ffi::Dictionary& attrs, const char* name, int nsd, int64_t fill,
                        int64_t out[3]) {
  auto span = attrs.get<ffi::Span<const int64_t>>(name);
  if (span.has_error() || static_cast<int>(span->size()) != nsd)
    return pool_invalid(std::string("missing or mistyped attribute '") + name + "'");
  for (int i = 0; i < 3; ++i) out[i] = fill;
  for (int i = 0; i < nsd; ++i) out[3 - nsd + i] = (*span)[i];
  return ffi::Error::Success();
}

// (N, spatial[3], C) of a channels-last buffer with nsd spatial dimensions.
bool pool_split(ffi::AnyBuffer::Dimensions d, int nsd, int64_t* n, int64_t sp[3], int64_t* c) {
  if (static_cast<int>(d.size()) != nsd + 2) return false;
  *n = d[0];
  *c = d[nsd + 1];
  for (int i = 0; i < 3; ++i) sp[i] = 1;
  for (int i = 0; i < nsd; ++i) sp[3 - nsd + i] = d[1 + i];
  return true;
}

ffi::Error run_pool_call(PoolOp op, ffi::RemainingArgs args, ffi::RemainingRets rets,
                         ffi::Dictionary attrs) {
  const bool binary = op == PoolOp::kMaxGather || op == PoolOp::kMaxScatter;
  const size_t want_rets = op == PoolOp::kMaxScatter ? 2 : 1;
  if (args.size() != (binary ? 2u : 1u) || rets.size() != want_rets)
    return pool_invalid("wrong number of operands or results");
  auto a = args.get<ffi::AnyBuffer>(0);
  auto out = rets.get<ffi::AnyBuffer>(0);
  if (a.has_error() || out.has_error()) return pool_invalid("operands must be arrays");
  // The second operand (t of the gather, dy of the scatter); unary operations have none.
  auto second = args.get<ffi::AnyBuffer>(binary ? 1 : 0);
  if (second.has_error()) return pool_invalid("operands must be arrays");
  const ffi::AnyBuffer* b = binary ? &*second : nullptr;

  const int nsd = static_cast<int>(a->dimensions().size()) - 2;
  if (nsd < 1 || nsd > 3) return pool_invalid("operands must have 1 to 3 spatial dimensions");
  PoolProblem p;
  int64_t pad_hi[3];
  struct SpatialAttr { const char* name; int64_t fill; int64_t* dst; };
  const SpatialAttr spatial_attrs[] = {
      {"window", 1, p.window}, {"stride", 1, p.stride}, {"dilation", 1, p.dilation},
      {"pad_lo", 0, p.pad_lo}, {"pad_hi", 0, pad_hi}, {"count_lo", 0, p.count_lo},
      {"count_hi", 0, p.count_hi}};
  for (const SpatialAttr& s : spatial_attrs) {
    if (auto e = pool_spatial(attrs, s.name, nsd, s.fill, s.dst); !e.success()) return e;
  }

  // x-shaped and y-shaped buffers by operation.
  const bool forward_shaped = op != PoolOp::kMaxScatter && op != PoolOp::kAvgBackward;
  ffi::AnyBuffer& result = **out;
  const ffi::AnyBuffer& x = op == PoolOp::kAvgBackward ? result : *a;
  const ffi::AnyBuffer& y = forward_shaped ? result : (op == PoolOp::kMaxScatter ? *b : *a);
  int64_t xn, xc, yn, yc, ys[3];
  if (!pool_split(x.dimensions(), nsd, &xn, p.in, &xc) ||
      !pool_split(y.dimensions(), nsd, &yn, ys, &yc))
    return pool_invalid("operand ranks do not match");
  if (op == PoolOp::kMaxGather) {
    if (b->dimensions().size() != x.dimensions().size())
      return pool_invalid("the tangent must have the input's shape");
    for (size_t i = 0; i < x.dimensions().size(); ++i)
      if (b->dimensions()[i] != x.dimensions()[i])
        return pool_invalid("the tangent must have the input's shape");
  }
  if (op == PoolOp::kMaxScatter) {
    if (result.dimensions().size() != x.dimensions().size())
      return pool_invalid("the result must have the input's shape");
    for (size_t i = 0; i < x.dimensions().size(); ++i)
      if (result.dimensions()[i] != x.dimensions()[i])
        return pool_invalid("the result must have the input's shape");
  }
  if (xn != yn || xc != yc) return pool_invalid("batch or channel counts do not match");
  p.N = xn;
  p.C = xc;
  for (int d = 0; d < 3; ++d) {
    if (p.window[d] <= 0 || p.stride[d] <= 0 || p.dilation[d] <= 0)
      return pool_invalid("window, strides and dilations must be positive");
    const int64_t span = p.in[d] + p.pad_lo[d] + pad_hi[d] - (p.window[d] - 1) * p.dilation[d];
    p.out[d] = span <= 0 ? 0 : (span - 1) / p.stride[d] + 1;
    if (p.out[d] != ys[d]) return pool_invalid("output spatial shape does not match the geometry");
  }

  DType dtype;
  if (!to_dtype(a->element_type(), &dtype) || result.element_type() != a->element_type() ||
      (b && b->element_type() != a->element_type()))
    return pool_invalid("operands and result must share one dtype: float32, float64, bfloat16 "
                        "or float16");
  void* ws = nullptr;
  size_t ws_bytes = 0;
  if (want_rets == 2) {
    auto w = rets.get<ffi::AnyBuffer>(1);
    if (w.has_error()) return pool_invalid("missing workspace result");
    ws = (*w)->untyped_data();
    ws_bytes = (*w)->size_bytes();
  }
  if (p.y_elems() == 0 && p.x_elems() == 0) return ffi::Error::Success();
  std::string err = run_pool(op, p, dtype, a->untyped_data(), b ? b->untyped_data() : nullptr,
                             result.untyped_data(), ws, ws_bytes);
  if (!err.empty()) return pool_invalid(err);
  return ffi::Error::Success();
}

template <PoolOp kOp>
ffi::Error pool_handler_impl(ffi::RemainingArgs args, ffi::RemainingRets rets,
                             ffi::Dictionary attrs) {
  try {
    return run_pool_call(kOp, args, rets, attrs);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn pooling: unexpected exception: ") + e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxdnn pooling: unexpected exception");
  }
}

auto bind_pool_call() {
  return ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<ffi::Dictionary>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxPoolForward, pool_handler_impl<PoolOp::kMaxForward>,
                              bind_pool_call());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxPoolGather, pool_handler_impl<PoolOp::kMaxGather>,
                              bind_pool_call());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxPoolScatter, pool_handler_impl<PoolOp::kMaxScatter>,
                              bind_pool_call());
XLA_FFI_DEFINE_HANDLER_SYMBOL(AvgPoolForward, pool_handler_impl<PoolOp::kAvgForward>,
                              bind_pool_call());
XLA_FFI_DEFINE_HANDLER_SYMBOL(AvgPoolBackward, pool_handler_impl<PoolOp::kAvgBackward>,
                              bind_pool_call());

}  // namespace jaxdnn::cpu
