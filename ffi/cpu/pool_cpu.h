// CPU pooling kernels (pool_cpu.cc) on the PoolProblem descriptor (channels-last, 3-D).
#ifndef JAXDNN_CPU_POOL_CPU_H_
#define JAXDNN_CPU_POOL_CPU_H_

#include <cstddef>
#include <string>

#include "jaxdnn/conv_problem.h"
#include "jaxdnn/pool_problem.h"

namespace jaxdnn::cpu {

// Workspace bytes `op` needs: the scatter keeps one int32 arg-max tap per output element.
size_t pool_workspace_bytes(PoolOp op, const PoolProblem& p);

// Runs `op`; every buffer has dtype `dtype`. `b` is the second operand (t of kMaxGather, dy of
// kMaxScatter), else unused. Returns "" on success, else the reason.
std::string run_pool(PoolOp op, const PoolProblem& p, DType dtype, const void* a, const void* b,
                     void* out, void* workspace, size_t workspace_size);

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_POOL_CPU_H_
