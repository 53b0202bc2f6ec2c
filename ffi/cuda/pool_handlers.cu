// XLA FFI handlers of the CUDA pooling targets: decode (ffi_pool.h, shared with the CPU
// handlers), run (pool_cuda.cu), report errors. Like the convolution handlers they only enqueue
// work on XLA's stream (no synchronization, no allocation, no host reads of device memory), so
// they are marked command-buffer compatible.
// The XLA FFI headers trip two nvcc front-end diagnostics (see handlers.cu); they are not ours.
#ifdef __NVCC__
#pragma nv_diag_suppress 940
#pragma nv_diag_suppress 2473
#endif
#include <cuda_runtime.h>

#include <exception>
#include <string>

#include "handlers.h"
#include "jaxdnn/ffi_pool.h"
#include "pool_cuda.h"

namespace jaxdnn::cuda {
namespace {

ffi::Error run_pool_call(cudaStream_t stream, PoolOp op, ffi::RemainingArgs args,
                         ffi::RemainingRets rets, ffi::Dictionary attrs) {
  DecodedPool dec;
  if (auto e = decode_pool_call(op, args, rets, attrs, &dec); !e.success()) return e;
  if (std::string why = pool_can_implement(dec.problem); !why.empty())
    return internal::pool_invalid(why);
  const size_t need = pool_workspace_bytes(op, dec.problem);
  if (dec.workspace_bytes < need)
    return internal::pool_invalid("workspace buffer is too small (" +
                                  std::to_string(dec.workspace_bytes) + " < " +
                                  std::to_string(need) + " bytes)");
  if (dec.empty()) return ffi::Error::Success();
  std::string err = run_pool(op, dec.problem, dec.dtype, dec.a, dec.b, dec.out, dec.workspace,
                             dec.workspace_bytes, stream);
  if (!err.empty()) return ffi::Error::Internal("jaxdnn pooling: " + err);
  return ffi::Error::Success();
}

template <PoolOp kOp>
ffi::Error pool_handler_impl(cudaStream_t stream, ffi::RemainingArgs args,
                             ffi::RemainingRets rets, ffi::Dictionary attrs) {
  // No C++ exception may cross the FFI boundary.
  try {
    return run_pool_call(stream, kOp, args, rets, attrs);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn pooling: unexpected exception: ") + e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxdnn pooling: unexpected exception");
  }
}

auto pool_binding() {
  return bind_pool_call(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>());
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxPoolForward, pool_handler_impl<PoolOp::kMaxForward>,
                              pool_binding(), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxPoolGather, pool_handler_impl<PoolOp::kMaxGather>,
                              pool_binding(), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxPoolScatter, pool_handler_impl<PoolOp::kMaxScatter>,
                              pool_binding(), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(AvgPoolForward, pool_handler_impl<PoolOp::kAvgForward>,
                              pool_binding(), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(AvgPoolBackward, pool_handler_impl<PoolOp::kAvgBackward>,
                              pool_binding(), {ffi::Traits::kCmdBufferCompatible});

}  // namespace jaxdnn::cuda
