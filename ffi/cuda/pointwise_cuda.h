// CUDA activation and softmax kernels (pointwise.cu) on the descriptors of pointwise_problem.h.
// Kernels know nothing of JAX or XLA: device pointers, the call descriptor and a stream. Each
// launcher returns "" or an error message (every launch is checked with cudaGetLastError).
#ifndef JAXDNN_CUDA_POINTWISE_CUDA_H_
#define JAXDNN_CUDA_POINTWISE_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "jaxdnn/pointwise_problem.h"

namespace jaxdnn::cuda {

// c.derivative == 0: out = f(s). Otherwise out = dy * (derivative of f, read from s).
std::string run_activation(const ActivationCall& c, const void* s, const void* dy, void* out,
                           cudaStream_t stream);

// Mask forward (c.backward false): out = f(data), bits = [f'(data) = 1]. Mask backward: out =
// bit ? data : lower * data, data = dy (pointwise_problem.h, ActivationMaskCall).
std::string run_activation_mask(const ActivationMaskCall& c, const void* data, void* out,
                                uint8_t* bits, cudaStream_t stream);

// Forward (v == nullptr): out = softmax or log_softmax of x. Backward: see SoftmaxOp.
std::string run_softmax(const SoftmaxCall& c, const void* x, const void* v, void* out,
                        cudaStream_t stream);

}  // namespace jaxdnn::cuda

#endif  // JAXDNN_CUDA_POINTWISE_CUDA_H_
