// XLA FFI handlers of the CPU backend: decode (ffi_conv.h), run (conv_cpu.cc), report errors.
#include "handlers.h"

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

template <ConvOp kOp>
ffi::Error conv_handler_impl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> workspace, ffi::Dictionary attrs) {
  return run_conv_call(kOp, a, b, out, workspace, attrs);
}

template <ConvOp kOp>
constexpr auto conv_binding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Attrs<ffi::Dictionary>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvForward, conv_handler_impl<ConvOp::kForward>,
                              conv_binding<ConvOp::kForward>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvBackwardData, conv_handler_impl<ConvOp::kBackwardData>,
                              conv_binding<ConvOp::kBackwardData>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvBackwardFilter, conv_handler_impl<ConvOp::kBackwardFilter>,
                              conv_binding<ConvOp::kBackwardFilter>());

}  // namespace jaxdnn::cpu
