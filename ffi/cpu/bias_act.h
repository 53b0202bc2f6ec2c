// The backward of a fused epilogue's activation, with the bias gradient reduced in the same pass
// (jaxdnn_bias_act_bwd, ffi_conv.h):
//   t'[o, k, i] = t[o, k, i] + tb[k]         (tb optional)
//   dz[o, k, i] = t'[o, k, i] * f'(s[o, k, i])
//   db[k]       = sum over o, i of dz[o, k, i]  (optional)
// s is the activation's output y when f' is computable from it (activation_grad_from_output),
// else its input z. Tensors are viewed as (outer, K, inner): a channels-last tensor is
// (pixels, K, 1), a channels-first one (N, K, pixels).
#ifndef JAXDNN_CPU_BIAS_ACT_H_
#define JAXDNN_CPU_BIAS_ACT_H_

#include <cstdint>
#include <string>

#include "jaxdnn/activation.h"
#include "jaxdnn/conv_problem.h"

namespace jaxdnn::cpu {

struct BiasActProblem {
  int64_t outer = 0, K = 0, inner = 0;
  Activation act = Activation::kIdentity;
  double param = 0.0;
  DType dtype = DType::kF32;  // of every operand and result
};

// Computed in float (16-bit and float32 operands) or double; dz and db rounded once. db is summed
// over a fixed, shape-determined set of chunks in a fixed order: the result does not depend on
// the thread count. tb and db may be null. Returns "" or an error message.
std::string run_bias_act_backward(const BiasActProblem& p, const void* t, const void* tb,
                                  const void* s, void* dz, void* db);

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_BIAS_ACT_H_
