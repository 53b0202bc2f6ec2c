// XLA FFI handlers of the CUDA backend: decode (ffi_conv.h), dispatch (conv_cuda.cu), report
// errors. The handlers only enqueue work on XLA's stream: no host synchronization, no device
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
  if (takes_winograd_filter(op, dec.algo)) {  // b is U (ffi_conv.h)
    int tile;
    int64_t want[4];
    cuda::winograd_filter_shape(call, &tile, want);
    if (auto err = check_winograd_filter_dims(b, want, dec, op); !err.success()) return err;
  }
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

// jaxdnn_winograd_filter (ffi_conv.h): U = G w G^T, one kernel launch.
ffi::Error winograd_filter_impl(cudaStream_t stream, ffi::AnyBuffer w,
                                ffi::Result<ffi::AnyBuffer> u, ffi::Dictionary attrs) {
  try {
    DecodedWinogradFilter dec;
    if (auto err = decode_winograd_filter_call(w, *u, attrs, &dec); !err.success()) return err;
    int64_t want[4];
    cuda::winograd_filter_dims(dec.tile, dec.filter.G, dec.Cig, dec.Cog, want);
    if (auto err = check_winograd_filter_result(*u, want); !err.success()) return err;
    if (u->element_count() == 0) return ffi::Error::Success();
    std::string err = cuda::winograd_filter_run(dec.filter, dec.tile, dec.flip, dec.w_dtype,
                                                w.untyped_data(), u->untyped_data(), stream);
    if (!err.empty()) return ffi::Error::Internal("jaxdnn Winograd filter transform: " + err);
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn Winograd filter transform: unexpected "
                                            "exception: ") + e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxdnn Winograd filter transform: unexpected exception");
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
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    WinogradFilter, winograd_filter_impl,
    bind_winograd_filter_call(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});

}  // namespace jaxdnn::cuda
