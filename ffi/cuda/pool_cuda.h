// CUDA pooling kernels (pool_cuda.cu) on the PoolProblem descriptor (pool_problem.h): the same
// five operations and the same results as the CPU kernels (pool_cpu.cc). They know nothing of
// JAX or XLA: device pointers, the problem, a workspace and a stream.
#ifndef JAXDNN_CUDA_POOL_CUDA_H_
#define JAXDNN_CUDA_POOL_CUDA_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "jaxdnn/conv_problem.h"
#include "jaxdnn/pool_problem.h"

namespace jaxdnn::cuda {

// Workspace bytes of `op`: kMaxScatter keeps one arg-max tap per output element, as uint8 when
// the window has at most 255 taps (255: no tap) and as int32 otherwise (-1: no tap); the other
// operations need none. jaxdnn/_src/primitives/pooling.py (_cuda_workspace_bytes) mirrors this.
size_t pool_workspace_bytes(PoolOp op, const PoolProblem& p);

// "" when the CUDA kernels take the problem, else the reason (extents beyond their int range).
std::string pool_can_implement(const PoolProblem& p);

// Enqueues `op` on `stream`; every buffer has dtype `dtype`. `b` is the second operand (t of
// kMaxGather, dy of kMaxScatter), else unused. No allocation, no synchronization, no host reads
// of device memory. Returns "" on success, else the reason (a failed launch included).
std::string run_pool(PoolOp op, const PoolProblem& p, DType dtype, const void* a, const void* b,
                     void* out, void* workspace, size_t workspace_size, cudaStream_t stream);

}  // namespace jaxdnn::cuda

#endif  // JAXDNN_CUDA_POOL_CUDA_H_
