// XLA FFI handlers of the CPU backend: decode (ffi_conv.h, ffi_pool.h, ffi_pointwise.h), run
// (conv_cpu.cc, pool_cpu.cc, activation_cpu.cc, softmax_cpu.cc), report errors.
#include "handlers.h"

#include <exception>
#include <string>

#include "bias_act.h"
#include "conv_cpu.h"
#include "jaxdnn/ffi_conv.h"
#include "jaxdnn/ffi_pointwise.h"
#include "jaxdnn/ffi_pool.h"
#include "pointwise_cpu.h"
#include "pool_cpu.h"

namespace jaxdnn::cpu {
namespace {

// Operand b of the Winograd families' forward and backward-data is U (ffi_conv.h): its dims must
// be the ones winograd_filter_transform wrote for this problem's tile and pass channels.
ffi::Error check_transformed_filter(ConvOp op, const DecodedConv& dec, const ffi::AnyBuffer& b) {
  if (!takes_winograd_filter(op, dec.algo)) return ffi::Error::Success();
  if (std::string why = cpu::can_implement(op, dec.algo, dec.problem); !why.empty())
    return ffi::Error::InvalidArgument(std::string("jaxdnn convolution (") +
                                       conv_algo_name(dec.algo) + "): " + why);
  int tile;
  int64_t want[4];
  cpu::winograd_filter_shape(op, dec.algo, dec.problem, dec.in_dtype, dec.out_dtype, &tile, want);
  return check_winograd_filter_dims(b, want, dec, op);
}

ffi::Error run_conv_call(ConvOp op, ffi::AnyBuffer a, ffi::AnyBuffer b,
                         ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                         ffi::Dictionary attrs) {
  DecodedConv dec;
  if (auto err = decode_conv_call(op, a, b, *out, attrs, &dec); !err.success()) return err;
  if (auto err = check_transformed_filter(op, dec, b); !err.success()) return err;
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
  if (auto err = check_transformed_filter(ConvOp::kForward, dec, w); !err.success()) return err;
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

// jaxdnn_winograd_filter (ffi_conv.h): U = G w G^T.
ffi::Error winograd_filter_handler_impl(ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> u,
                                        ffi::Dictionary attrs) {
  try {
    DecodedWinogradFilter dec;
    if (auto err = decode_winograd_filter_call(w, *u, attrs, &dec); !err.success()) return err;
    int64_t want[4];
    cpu::winograd_filter_dims(dec.tile, dec.filter.G, dec.Cig, dec.Cog, dec.u_dtype, want);
    if (auto err = check_winograd_filter_result(*u, want); !err.success()) return err;
    std::string err = cpu::winograd_filter_transform(dec.filter, dec.tile, dec.flip, dec.w_dtype,
                                                     w.untyped_data(), u->untyped_data());
    if (!err.empty())
      return ffi::Error::InvalidArgument("jaxdnn Winograd filter transform: " + err);
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn Winograd filter transform: unexpected "
                                            "exception: ") + e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxdnn Winograd filter transform: unexpected exception");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(WinogradFilter, winograd_filter_handler_impl,
                              bind_winograd_filter_call(ffi::Ffi::Bind()));
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
// Pooling (pool_cpu.cc). The call contract and its decoding are in ffi_pool.h.

namespace jaxdnn::cpu {
namespace {

ffi::Error run_pool_call(PoolOp op, ffi::RemainingArgs args, ffi::RemainingRets rets,
                         ffi::Dictionary attrs) {
  DecodedPool dec;
  if (auto e = decode_pool_call(op, args, rets, attrs, &dec); !e.success()) return e;
  if (dec.empty()) return ffi::Error::Success();
  std::string err = run_pool(op, dec.problem, dec.dtype, dec.a, dec.b, dec.out, dec.workspace,
                             dec.workspace_bytes);
  if (!err.empty()) return internal::pool_invalid(err);
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

auto pool_binding() { return bind_pool_call(ffi::Ffi::Bind()); }

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxPoolForward, pool_handler_impl<PoolOp::kMaxForward>,
                              pool_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxPoolGather, pool_handler_impl<PoolOp::kMaxGather>,
                              pool_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxPoolScatter, pool_handler_impl<PoolOp::kMaxScatter>,
                              pool_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(AvgPoolForward, pool_handler_impl<PoolOp::kAvgForward>,
                              pool_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(AvgPoolBackward, pool_handler_impl<PoolOp::kAvgBackward>,
                              pool_binding());

}  // namespace jaxdnn::cpu

// ---------------------------------------------------------------------------------------------
// Activations and softmax (activation_cpu.cc, softmax_cpu.cc); the call contract is
// jaxdnn/ffi_pointwise.h.

namespace jaxdnn::cpu {
namespace {

ffi::Error activation_call(const ffi::AnyBuffer& s, const ffi::AnyBuffer* dy,
                           ffi::Result<ffi::AnyBuffer> out, ffi::Dictionary attrs) {
  ActivationCall c;
  if (auto e = decode_activation_call(s, dy, *out, attrs, &c); !e.success()) return e;
  std::string err = run_activation(c, s.untyped_data(), dy ? dy->untyped_data() : nullptr,
                                   out->untyped_data());
  if (!err.empty()) return ffi::Error::InvalidArgument("jaxdnn activation: " + err);
  return ffi::Error::Success();
}

ffi::Error softmax_call(const ffi::AnyBuffer& x, const ffi::AnyBuffer* v,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Dictionary attrs) {
  SoftmaxCall c;
  if (auto e = decode_softmax_call(x, v, *out, attrs, &c); !e.success()) return e;
  std::string err = run_softmax(c, x.untyped_data(), v ? v->untyped_data() : nullptr,
                                out->untyped_data());
  if (!err.empty()) return ffi::Error::InvalidArgument("jaxdnn softmax: " + err);
  return ffi::Error::Success();
}

ffi::Error activation_fwd_impl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                               ffi::Dictionary attrs) {
  return guard_pointwise("activation", [&] { return activation_call(x, nullptr, y, attrs); });
}

ffi::Error activation_bwd_impl(ffi::AnyBuffer s, ffi::AnyBuffer dy,
                               ffi::Result<ffi::AnyBuffer> dx, ffi::Dictionary attrs) {
  return guard_pointwise("activation", [&] { return activation_call(s, &dy, dx, attrs); });
}

ffi::Error activation_mask_fwd_impl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                                    ffi::Result<ffi::AnyBuffer> bits, ffi::Dictionary attrs) {
  return run_activation_mask_call(x, *bits, *y, attrs, false, run_activation_mask);
}

ffi::Error activation_mask_bwd_impl(ffi::AnyBuffer bits, ffi::AnyBuffer dy,
                                    ffi::Result<ffi::AnyBuffer> dx, ffi::Dictionary attrs) {
  return run_activation_mask_call(dy, bits, *dx, attrs, true, run_activation_mask);
}

ffi::Error softmax_fwd_impl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                            ffi::Dictionary attrs) {
  return guard_pointwise("softmax", [&] { return softmax_call(x, nullptr, y, attrs); });
}

ffi::Error softmax_bwd_impl(ffi::AnyBuffer y, ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out,
                            ffi::Dictionary attrs) {
  return guard_pointwise("softmax", [&] { return softmax_call(y, &v, out, attrs); });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ActivationForward, activation_fwd_impl,
                              bind_unary_pointwise_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ActivationBackward, activation_bwd_impl,
                              bind_binary_pointwise_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ActivationMaskForward, activation_mask_fwd_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attrs<ffi::Dictionary>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ActivationMaskBackward, activation_mask_bwd_impl,
                              bind_binary_pointwise_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SoftmaxForward, softmax_fwd_impl,
                              bind_unary_pointwise_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SoftmaxBackward, softmax_bwd_impl,
                              bind_binary_pointwise_call(ffi::Ffi::Bind()));

}  // namespace jaxdnn::cpu
