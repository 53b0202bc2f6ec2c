// The other CUDA families, stubbed out: the FFT checker links only conv_fft.cu and the dispatch.
#include "conv_cuda.h"
namespace jaxdnn::cuda {
std::string direct_can_implement(const CudaConvCall&) { return "stub"; }
size_t direct_workspace_bytes(const CudaConvCall&) { return 0; }
std::string direct_run(const CudaConvCall&, const CudaConvBuffers&) { return "stub"; }
std::string gemm_family_can_implement(const CudaConvCall&) { return "stub"; }
size_t gemm_family_workspace_bytes(const CudaConvCall&) { return 0; }
std::string gemm_family_run(const CudaConvCall&, const CudaConvBuffers&) { return "stub"; }
}  // namespace jaxdnn::cuda
