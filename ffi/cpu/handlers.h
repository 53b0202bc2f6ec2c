#ifndef JAXDNN_CPU_HANDLERS_H_
#define JAXDNN_CPU_HANDLERS_H_

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/api.h"

namespace jaxdnn::cpu {
XLA_FFI_DECLARE_HANDLER_SYMBOL(ConvForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ConvBackwardData);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ConvBackwardFilter);
XLA_FFI_DECLARE_HANDLER_SYMBOL(WinogradFilter);  // jaxdnn_winograd_filter
XLA_FFI_DECLARE_HANDLER_SYMBOL(ConvForwardFused);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BiasActBackward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MaxPoolForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MaxPoolGather);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MaxPoolScatter);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AvgPoolForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AvgPoolBackward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ActivationForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ActivationBackward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ActivationMaskForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ActivationMaskBackward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(SoftmaxForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(SoftmaxBackward);
}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_HANDLERS_H_
