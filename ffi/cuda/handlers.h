// XLA FFI handlers of the CUDA backend (platform "CUDA").
#ifndef JAXDNN_CUDA_HANDLERS_H_
#define JAXDNN_CUDA_HANDLERS_H_

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/api.h"

namespace jaxdnn::cuda {
XLA_FFI_DECLARE_HANDLER_SYMBOL(ConvForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ConvBackwardData);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ConvBackwardFilter);
XLA_FFI_DECLARE_HANDLER_SYMBOL(WinogradFilter);  // jaxdnn_winograd_filter
XLA_FFI_DECLARE_HANDLER_SYMBOL(ConvForwardFused);  // fused.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(BiasActBackward);   // fused.cu
// Pooling (pool_handlers.cu).
XLA_FFI_DECLARE_HANDLER_SYMBOL(MaxPoolForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MaxPoolGather);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MaxPoolScatter);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AvgPoolForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AvgPoolBackward);
// Activations and softmax (pointwise_handlers.cu).
XLA_FFI_DECLARE_HANDLER_SYMBOL(ActivationForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ActivationBackward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ActivationMaskForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ActivationMaskBackward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(SoftmaxForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(SoftmaxBackward);
}  // namespace jaxdnn::cuda

#endif  // JAXDNN_CUDA_HANDLERS_H_
