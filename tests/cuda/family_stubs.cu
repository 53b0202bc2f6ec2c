// Every CUDA family's entry points as weak stubs ("stub" = not supported), for the standalone
// checkers that link the dispatch (conv_cuda.cu) with only the families they check: the real
// definitions of the linked family files override these.
#include "conv_cuda.h"

#define JAXDNN_STUB_FAMILY(name)                                                             \
  __attribute__((weak)) std::string name##_can_implement(const CudaConvCall&) { return "stub"; } \
  __attribute__((weak)) size_t name##_workspace_bytes(const CudaConvCall&) { return 0; }       \
  __attribute__((weak)) std::string name##_run(const CudaConvCall&, const CudaConvBuffers&) {  \
    return "stub";                                                                           \
  }

namespace jaxdnn::cuda {
JAXDNN_STUB_FAMILY(direct)
JAXDNN_STUB_FAMILY(gemm_family)
JAXDNN_STUB_FAMILY(winograd)
JAXDNN_STUB_FAMILY(fft)
}  // namespace jaxdnn::cuda
