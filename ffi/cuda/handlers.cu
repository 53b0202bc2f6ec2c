// XLA FFI handlers of the CUDA backend: decode (ffi_conv.h, ffi_pointwise.h), dispatch
// (conv_cuda.cu, pointwise.cu), report errors. The handlers only enqueue work on XLA's stream: no host synchronization, no device
// allocation, no host reads of device memory, so they are marked command-buffer compatible.
// The XLA FFI headers trip two nvcc front-end diagnostics (missing return after an exhaustive
// switch, always_inline on non-inline templates); they are not ours.
#ifdef __NVCC__
#pragma nv_diag_suppress 940
#pragma nv_diag_suppress 2473
#endif
#include "handlers.h"

#include <cuda_runtime.h>

#include <exception>
#include <string>

#include "conv_cuda.h"
#include "jaxdnn/ffi_conv.h"
#include "jaxdnn/ffi_pointwise.h"
#include "pointwise_cuda.h"

namespace jaxdnn::cuda {
namespace {

ffi::Error run_conv_call(cudaStream_t stream, ConvOp op, ffi::AnyBuffer a, ffi::AnyBuffer b,
                         ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                         ffi::Dictionary attrs) {
  DecodedConv dec;
  if (auto err = decode_conv_call(op, a, b, *out, attrs, &dec); !err.success()) return err;
  CudaConvCall call{op, dec.algo, dec.problem, dec.in_dtype, dec.out_dtype, dec.precision};
  if (std::string why = cuda::can_implement(call); !why.empty())
    return ffi::Error::InvalidArgument(std::string("jaxdnn convolution (") +
                                       conv_algo_name(dec.algo) + ", " + conv_op_name(op) +
                                       "): " + why);
  const size_t need = cuda::workspace_bytes(call);
  if (workspace->size_bytes() < need)
    return ffi::Error::InvalidArgument("jaxdnn convolution: workspace buffer is too small (" +
                                       std::to_string(workspace->size_bytes()) + " < " +
                                       std::to_string(need) + " bytes)");
  CudaConvBuffers io{a.untyped_data(), b.untyped_data(), out->untyped_data(),
                     workspace->untyped_data(), workspace->size_bytes(), stream};
  std::string err = cuda::run_conv(call, io);
  if (!err.empty())
    return ffi::Error::Internal(std::string("jaxdnn convolution (") + conv_algo_name(dec.algo) +
                                ", " + conv_op_name(op) + "): " + err);
  return ffi::Error::Success();
}

template <ConvOp kOp>
ffi::Error conv_handler_impl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                             ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> workspace, ffi::Dictionary attrs) {
  // No C++ exception may cross the FFI boundary.
  try {
    return run_conv_call(stream, kOp, a, b, out, workspace, attrs);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn convolution: unexpected exception: ") +
                                e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxdnn convolution: unexpected exception");
  }
}

auto conv_binding() {
  return bind_conv_call(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>());
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvForward, conv_handler_impl<ConvOp::kForward>, conv_binding(),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvBackwardData, conv_handler_impl<ConvOp::kBackwardData>,
                              conv_binding(), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvBackwardFilter, conv_handler_impl<ConvOp::kBackwardFilter>,
                              conv_binding(), {ffi::Traits::kCmdBufferCompatible});

}  // namespace jaxdnn::cuda

// ---------------------------------------------------------------------------------------------
// Activations and softmax (pointwise.cu); the call contract is jaxdnn/ffi_pointwise.h. Like the
// convolution handlers they only enqueue kernels on XLA's stream (no synchronization, no
// allocation), so they are command-buffer compatible.

namespace jaxdnn::cuda {
namespace {

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

ffi::Error activation_call(cudaStream_t stream, const ffi::AnyBuffer& s, const ffi::AnyBuffer* dy,
                           ffi::Result<ffi::AnyBuffer> out, ffi::Dictionary attrs) {
  ActivationCall c;
  if (auto e = decode_activation_call(s, dy, *out, attrs, &c); !e.success()) return e;
  std::string err = cuda::run_activation(c, s.untyped_data(), dy ? dy->untyped_data() : nullptr,
                                         out->untyped_data(), stream);
  if (!err.empty()) return ffi::Error::Internal("jaxdnn activation: " + err);
  return ffi::Error::Success();
}

ffi::Error softmax_call(cudaStream_t stream, const ffi::AnyBuffer& x, const ffi::AnyBuffer* v,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Dictionary attrs) {
  SoftmaxCall c;
  if (auto e = decode_softmax_call(x, v, *out, attrs, &c); !e.success()) return e;
  std::string err = cuda::run_softmax(c, x.untyped_data(), v ? v->untyped_data() : nullptr,
                                      out->untyped_data(), stream);
  if (!err.empty()) return ffi::Error::Internal("jaxdnn softmax: " + err);
  return ffi::Error::Success();
}

ffi::Error activation_fwd_impl(cudaStream_t stream, ffi::AnyBuffer x,
                               ffi::Result<ffi::AnyBuffer> y, ffi::Dictionary attrs) {
  return guard_pointwise("activation",
                         [&] { return activation_call(stream, x, nullptr, y, attrs); });
}

ffi::Error activation_bwd_impl(cudaStream_t stream, ffi::AnyBuffer s, ffi::AnyBuffer dy,
                               ffi::Result<ffi::AnyBuffer> dx, ffi::Dictionary attrs) {
  return guard_pointwise("activation", [&] { return activation_call(stream, s, &dy, dx, attrs); });
}

ffi::Error softmax_fwd_impl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                            ffi::Dictionary attrs) {
  return guard_pointwise("softmax", [&] { return softmax_call(stream, x, nullptr, y, attrs); });
}

ffi::Error softmax_bwd_impl(cudaStream_t stream, ffi::AnyBuffer y, ffi::AnyBuffer v,
                            ffi::Result<ffi::AnyBuffer> out, ffi::Dictionary attrs) {
  return guard_pointwise("softmax", [&] { return softmax_call(stream, y, &v, out, attrs); });
}

auto stream_binding() { return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>(); }

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ActivationForward, activation_fwd_impl,
                              bind_unary_pointwise_call(stream_binding()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(ActivationBackward, activation_bwd_impl,
                              bind_binary_pointwise_call(stream_binding()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(SoftmaxForward, softmax_fwd_impl,
                              bind_unary_pointwise_call(stream_binding()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(SoftmaxBackward, softmax_bwd_impl,
                              bind_binary_pointwise_call(stream_binding()),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jaxdnn::cuda
