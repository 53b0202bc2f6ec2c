// CPU activation and softmax kernels (activation_cpu.cc, softmax_cpu.cc) on the descriptors of
// pointwise_problem.h. Each returns "" on success, else the reason.
#ifndef JAXDNN_CPU_POINTWISE_CPU_H_
#define JAXDNN_CPU_POINTWISE_CPU_H_

#include <cstdint>
#include <string>

#include "jaxdnn/pointwise_problem.h"

namespace jaxdnn::cpu {

// c.derivative == 0: out = f(s). Otherwise out = dy * (derivative of f, read from s).
std::string run_activation(const ActivationCall& c, const void* s, const void* dy, void* out);

// Mask forward (c.backward false): out = f(data), bits = [f'(data) = 1]. Mask backward: out =
// bit ? data : lower * data, data = dy (pointwise_problem.h, ActivationMaskCall).
std::string run_activation_mask(const ActivationMaskCall& c, const void* data, void* out,
                                uint8_t* bits);

// Forward (v == nullptr): out = softmax or log_softmax of x. Backward: see SoftmaxOp.
std::string run_softmax(const SoftmaxCall& c, const void* x, const void* v, void* out);

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_POINTWISE_CPU_H_
