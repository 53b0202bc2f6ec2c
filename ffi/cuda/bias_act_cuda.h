// The backward of the fused epilogue's activation with the bias gradient on the GPU
// (bias_act.cu; the jaxdnn_bias_act_bwd target, contract in ffi_conv.h):
//   dz[o, k, i] = (t[o, k, i] + tb[k]) * f'(s[o, k, i]),   db[k] = sum over (o, i) of dz[o, k, i]
// on an (outer, K, inner) view: (pixels, K, 1) for channels-last tensors, (N, K, pixels) for
// channels-first ones. s is the activation's output when activation_grad_from_output(kind), else
// its input. No XLA here: device pointers, the shape, a workspace and a stream.
#ifndef JAXDNN_CUDA_BIAS_ACT_CUDA_H_
#define JAXDNN_CUDA_BIAS_ACT_CUDA_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "jaxdnn/activation.h"
#include "jaxdnn/conv_problem.h"

namespace jaxdnn::cuda {

struct BiasActCall {
  long long outer = 0, K = 0, inner = 0;
  DType dtype = DType::kF32;  // of every operand and result
  Activation activation = Activation::kIdentity;
  double param = 0.0;
};

// Workspace bytes for the bias gradient (0 when `reduce` is false): one arrival counter per
// channel group (zeroed by each call) and the per-block partial sums. Depends on the shape and
// dtype only; queried at trace time to size the XLA workspace.
size_t bias_act_workspace_bytes(long long outer, long long K, long long inner, DType dtype,
                                bool reduce);

// Enqueues the backward on `stream`. tb (K values) may be null; db (K values) null when the bias
// gradient is not wanted, else the workspace must hold bias_act_workspace_bytes(..., true).
// 16-bit and float32 values are computed in float32, float64 in float64; dz and db rounded once.
// db is summed in an order fixed by the shape: identical calls give identical bits. No
// allocation, no synchronization. Returns "" or the reason for failing (a launch error included).
std::string bias_act_backward(const BiasActCall& call, const void* t, const void* tb,
                              const void* s, void* dz, void* db, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream);

}  // namespace jaxdnn::cuda

#endif  // JAXDNN_CUDA_BIAS_ACT_CUDA_H_
