// XLA FFI handlers of the CPU backend: decode (ffi_conv.h), run (conv_cpu.cc), report errors.
#include "handlers.h"

#include <exception>
#include <string>

#include "conv_cpu.h"
#include "jaxdnn/ffi_conv.h"

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

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvForward, conv_handler_impl<ConvOp::kForward>,
                              bind_conv_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvBackwardData, conv_handler_impl<ConvOp::kBackwardData>,
                              bind_conv_call(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvBackwardFilter, conv_handler_impl<ConvOp::kBackwardFilter>,
                              bind_conv_call(ffi::Ffi::Bind()));

}  // namespace jaxdnn::cpu
