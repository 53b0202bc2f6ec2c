// CUDA convolution families on the ConvProblem descriptor (conv_problem.h). Kernels know nothing
// of JAX or XLA: they take device pointers, the problem, a workspace and a stream.
//
// Operand dtypes: a and b share `in`; the result dtype `out` is either `in` or, for 16-bit `in`,
// float32 (the Python layer casts around any other combination). float32 arithmetic follows
// `precision`: kHighest = true fp32 (no TF32 anywhere); kDefault/kHigh = TF32 tensor cores.
// bf16/fp16 use tensor cores with fp32 accumulation; float64 uses the FP64 units.
#ifndef JAXDNN_CUDA_CONV_CUDA_H_
#define JAXDNN_CUDA_CONV_CUDA_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "jaxdnn/conv_problem.h"
#include "jaxdnn/winograd_filter.h"

namespace jaxdnn::cuda {

struct CudaConvCall {
  ConvOp op;
  ConvAlgo algo;
  ConvProblem problem;
  DType in;
  DType out;
  MathPrecision precision;
};

struct CudaConvBuffers {
  const void* a;     // fwd: x, bwd_data: dy, bwd_filter: x
  const void* b;     // fwd: w, bwd_data: w,  bwd_filter: dy
  void* out;         // fwd: y, bwd_data: dx, bwd_filter: dw
  void* workspace;   // at least workspace_bytes(call) bytes, 256-byte aligned (from XLA)
  size_t workspace_size;
  cudaStream_t stream;
  ConvEpilogue epi = {};  // fused forward epilogue (empty: plain convolution)
};

// Each family: a support predicate ("" = supported, else the reason), its workspace size, and a
// launcher that returns "" or an error message (every launch checked with cudaGetLastError).
// DIRECT (conv_direct.cu)
std::string direct_can_implement(const CudaConvCall& c);
size_t direct_workspace_bytes(const CudaConvCall& c);
std::string direct_run(const CudaConvCall& c, const CudaConvBuffers& io);

// IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM and GEMM (conv_gemm_family.cu)
std::string gemm_family_can_implement(const CudaConvCall& c);
size_t gemm_family_workspace_bytes(const CudaConvCall& c);
std::string gemm_family_run(const CudaConvCall& c, const CudaConvBuffers& io);

// FFT and FFT_TILING (conv_fft.cu): stride 1, no dilation; own shared-memory FFTs.
std::string fft_can_implement(const CudaConvCall& c);
size_t fft_workspace_bytes(const CudaConvCall& c);
std::string fft_run(const CudaConvCall& c, const CudaConvBuffers& io);

// IMPLICIT_PRECOMP_GEMM forward, and backward-data at stride 1 (as the forward of dy with the
// flipped, channel-swapped filter), on Hopper wgmma, NHWC, 16-bit or float32 below HIGHEST (TF32)
// (conv_wgmma.cu): "" when the problem qualifies; its workspace (the rearranged filter);
// wgmma_try runs it and returns true when it took the call (result or error in *err), false to
// leave it to the mma.sync kernel (not eligible, not an sm_90 device, or wgmma_switched_off():
// JAXDNN_NO_WGMMA=1, for testing).
std::string wgmma_reason(const CudaConvCall& c);
size_t wgmma_workspace_bytes(const CudaConvCall& c);
bool wgmma_try(const CudaConvCall& c, const CudaConvBuffers& io, std::string* err);
bool wgmma_switched_off();

// WINOGRAD (fused: F(4x4,3x3) on the tensor cores, or F(2x2,3x3)) and WINOGRAD_NONFUSED
// (F(4x4,3x3) / F(2x2,3x3) with batched
// GEMMs through the workspace), both algorithm ids (conv_winograd.cu)
std::string winograd_can_implement(const CudaConvCall& c);
size_t winograd_workspace_bytes(const CudaConvCall& c);
std::string winograd_run(const CudaConvCall& c, const CudaConvBuffers& io);
// Both families' forward and backward-data take io.b = U, the transformed filter
// (takes_winograd_filter, jaxdnn/winograd_filter.h), made by winograd_filter_run (the
// jaxdnn_winograd_filter call): per (point, group) a zero-padded Cgp x Kgp matrix in the compute
// type (float32; float64 for float64), dims {(m + 2)^2, G, round_up(Cig, 8), round_up(Cog, 8)}.
// The tile edge m of `algo` for (op, p): NONFUSED p.tile when set (2, 4, 6; 6 for float32 /
// float64 operands only), else 4 unless the pass output is < 4 on a side; WINOGRAD p.tile when
// set (2, or 4: the tensor-core F(4x4) kernel, channels-last and float compute only), else 4
// where that kernel applies and the pass output is >= 4 on a side, else 2 (backward-filter: 2;
// JAXDNN_WINO_FUSED_TILE=2: always 2).
int winograd_tile(const CudaConvCall& c);
void winograd_filter_dims(int tile, long long G, long long Cig, long long Cog, int64_t dims[4]);
// The tile and dims of U that a takes_winograd_filter call takes.
void winograd_filter_shape(const CudaConvCall& c, int* tile, int64_t dims[4]);
// U = G w G^T of a filter (`filter`: layout, G, C, K, filt), flipped and channel-swapped for
// backward-data when `flip`; w has w_dtype. One kernel launch on `st`; "" or the error.
std::string winograd_filter_run(const ConvProblem& filter, int tile, bool flip, DType w_dtype,
                                const void* w, void* u, cudaStream_t st);

// Dispatch over all families (conv_cuda.cu).
std::string can_implement(const CudaConvCall& c);
// The forward with a fused epilogue (io.epi): the families whose kernels carry it (fused.cu).
std::string can_implement_fused(const CudaConvCall& c);
size_t workspace_bytes(const CudaConvCall& c);
std::string run_conv(const CudaConvCall& c, const CudaConvBuffers& io);

}  // namespace jaxdnn::cuda

#endif  // JAXDNN_CUDA_CONV_CUDA_H_
