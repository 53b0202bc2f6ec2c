// Fused convolution on the GPU: the jaxdnn_conv_fwd_fused handler (the conv families carry the
// epilogue in their kernels, epilogue.cuh) and the jaxdnn_bias_act_bwd handler, the backward of
// the epilogue's activation with the bias gradient (kernels in bias_act.cu; contracts in
// ffi_conv.h).
#ifdef __NVCC__
#pragma nv_diag_suppress 940
#pragma nv_diag_suppress 2473
#endif
#include <cuda_runtime.h>

#include <exception>
#include <string>

#include "bias_act_cuda.h"
#include "conv_cuda.h"
#include "handlers.h"
#include "jaxdnn/ffi_conv.h"

namespace jaxdnn::cuda {

std::string can_implement_fused(const CudaConvCall& c) {
  switch (c.algo) {
    case ConvAlgo::kImplicitGemm:
    case ConvAlgo::kImplicitPrecompGemm:
    case ConvAlgo::kGemm:
    case ConvAlgo::kDirect:
      return can_implement(c);
    default:
      return std::string(conv_algo_name(c.algo)) + " has no CUDA kernel carrying a fused epilogue";
  }
}

namespace {

ffi::Error fused_conv_impl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w,
                           ffi::AnyBuffer bias, ffi::AnyBuffer residual,
                           ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> preact,
                           ffi::Result<ffi::AnyBuffer> workspace, ffi::Dictionary attrs) {
  try {
    DecodedConv dec;
    ConvEpilogue epi;
    if (auto err = decode_conv_fused_call(x, w, bias, residual, *out, *preact, attrs, &dec, &epi);
        !err.success())
      return err;
    CudaConvCall call{ConvOp::kForward, dec.algo, dec.problem, dec.in_dtype, dec.out_dtype,
                      dec.precision};
    if (std::string why = can_implement_fused(call); !why.empty())
      return ffi::Error::InvalidArgument(std::string("jaxdnn fused convolution (") +
                                         conv_algo_name(dec.algo) + "): " + why);
    CudaConvBuffers io{x.untyped_data(), w.untyped_data(), out->untyped_data(),
                       workspace->untyped_data(), workspace->size_bytes(), stream, epi};
    if (std::string err = run_conv(call, io); !err.empty())
      return ffi::Error::Internal(std::string("jaxdnn fused convolution (") +
                                  conv_algo_name(dec.algo) + "): " + err);
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxdnn fused convolution: unexpected exception: ") +
                                e.what());
  } catch (...) {
    return ffi::Error::Internal("jaxdnn fused convolution: unexpected exception");
  }
}

ffi::Error bias_act_impl(cudaStream_t stream, ffi::AnyBuffer t, ffi::AnyBuffer tb,
                         ffi::AnyBuffer s, ffi::Result<ffi::AnyBuffer> dz,
                         ffi::Result<ffi::AnyBuffer> db, ffi::Result<ffi::AnyBuffer> workspace,
                         ffi::Dictionary attrs) {
  try {
    DecodedBiasAct d;
    if (auto err = decode_bias_act_call(t, tb, s, *dz, *db, attrs, &d); !err.success()) return err;
    const BiasActCall call{d.outer, d.K, d.inner, d.dtype, d.activation, d.param};
    const std::string err = bias_act_backward(
        call, t.untyped_data(), d.has_tb ? tb.untyped_data() : nullptr, s.untyped_data(),
        dz->untyped_data(), d.has_db ? db->untyped_data() : nullptr, workspace->untyped_data(),
        workspace->size_bytes(), stream);
    if (!err.empty()) return ffi::Error::Internal("jaxdnn bias/activation backward: " + err);
    return ffi::Error::Success();
  } catch (...) {
    return ffi::Error::Internal("jaxdnn bias/activation backward: unexpected exception");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvForwardFused, fused_conv_impl,
                              bind_conv_fused_call(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(BiasActBackward, bias_act_impl,
                              bind_bias_act_call(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jaxdnn::cuda
