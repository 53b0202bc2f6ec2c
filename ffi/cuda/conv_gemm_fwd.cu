// The GEMM-family kernel instantiations of one operation (conv_gemm_kernel.cuh says why apart).
#include "conv_gemm_kernel.cuh"

namespace jaxdnn::cuda::gemm_conv {

std::string launch_fwd(const Plan& pl, const Params& p, cudaStream_t st) {
  return launch_path<OP_FWD>(pl, p, st);
}

}  // namespace jaxdnn::cuda::gemm_conv
