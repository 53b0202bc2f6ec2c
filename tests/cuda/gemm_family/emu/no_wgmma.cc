// The wgmma kernel's entry points for the host emulation (../emulate.sh): the emulated device is
// not an sm_90 (wgmma is Hopper's warpgroup MMA, not emulated), so every call takes the mma.sync
// kernel and its own split-K plan, as on a pre-Hopper GPU running the compute_80 PTX.
#include "conv_cuda.h"

namespace jaxdnn::cuda {
std::string wgmma_reason(const CudaConvCall&) { return "host emulation: no wgmma kernel"; }
size_t wgmma_workspace_bytes(const CudaConvCall&) { return 0; }
bool wgmma_try(const CudaConvCall&, const CudaConvBuffers&, std::string*) { return false; }
bool wgmma_switched_off() { return true; }
}  // namespace jaxdnn::cuda
