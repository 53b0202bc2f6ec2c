// XLA FFI handlers of the CUDA activation and softmax targets: decode (ffi_pointwise.h, shared
// with the CPU handlers), run (pointwise.cu), report errors. Like the convolution handlers they
// only enqueue kernels on XLA's stream (no synchronization, no allocation, no host reads of
// device memory), so they are marked command-buffer compatible.
// The XLA FFI headers trip two nvcc front-end diagnostics (see handlers.cu); they are not ours.
#ifdef __NVCC__
#pragma nv_diag_suppress 940
#pragma nv_diag_suppress 2473
#endif
#include <cuda_runtime.h>

#include <exception>
#include <string>

#include "handlers.h"
#include "jaxdnn/ffi_pointwise.h"
#include "pointwise_cuda.h"

namespace jaxdnn::cuda {
namespace {

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

ffi::Error activation_mask_fwd_impl(cudaStream_t stream, ffi::AnyBuffer x,
                                    ffi::Result<ffi::AnyBuffer> y,
                                    ffi::Result<ffi::AnyBuffer> bits, ffi::Dictionary attrs) {
  return run_activation_mask_call(
      x, *bits, *y, attrs, false,
      [&](const ActivationMaskCall& c, const void* data, void* out, uint8_t* mask) {
        return cuda::run_activation_mask(c, data, out, mask, stream);
      });
}

ffi::Error activation_mask_bwd_impl(cudaStream_t stream, ffi::AnyBuffer bits, ffi::AnyBuffer dy,
                                    ffi::Result<ffi::AnyBuffer> dx, ffi::Dictionary attrs) {
  return run_activation_mask_call(
      dy, bits, *dx, attrs, true,
      [&](const ActivationMaskCall& c, const void* data, void* out, uint8_t* mask) {
        return cuda::run_activation_mask(c, data, out, mask, stream);
      });
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
XLA_FFI_DEFINE_HANDLER_SYMBOL(ActivationMaskForward, activation_mask_fwd_impl,
                              stream_binding()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attrs<ffi::Dictionary>(),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(ActivationMaskBackward, activation_mask_bwd_impl,
                              bind_binary_pointwise_call(stream_binding()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(SoftmaxForward, softmax_fwd_impl,
                              bind_unary_pointwise_call(stream_binding()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(SoftmaxBackward, softmax_bwd_impl,
                              bind_binary_pointwise_call(stream_binding()),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jaxdnn::cuda
