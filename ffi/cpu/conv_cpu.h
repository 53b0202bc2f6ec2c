// CPU convolution kernels: one family per file, all on the ConvProblem descriptor.
//
// Kernels compute in T = float or double. The handler converts 16-bit operands to float (and the
// result back) around them, so only these two types are instantiated. Every kernel:
//   - writes every element of `out` (including when N, an output extent, or the reduction is 0);
//   - supports any stride, filter dilation, lhs dilation, (negative) padding, groups, 1-3-D,
//     except where its *_unsupported function says otherwise (Winograd, FFT: stride 1 only);
//   - multithreads with parallel_for (parallel.h) and uses 64-bit offsets;
//   - uses only the workspace it declared through its *_workspace_bytes function.
#ifndef JAXDNN_CPU_CONV_CPU_H_
#define JAXDNN_CPU_CONV_CPU_H_

#include <cstddef>
#include <string>

#include "epilogue.h"
#include "jaxdnn/conv_problem.h"
#include "jaxdnn/winograd_filter.h"

namespace jaxdnn::cpu {

// Operands by operation (see conv_problem.h): forward (x, w) -> y; backward-data (dy, w) -> dx;
// backward-filter (x, dy) -> dw. `epi` (forward only; null for a plain convolution) is applied
// by every family where it stores its output (epilogue.h).
template <typename T>
struct ConvOperands {
  const T* a;
  const T* b;
  T* out;
  void* workspace;  // aligned to 64 bytes
  const CpuEpilogue<T>* epi = nullptr;
};

// DIRECT (conv_direct.cc): window loops; dedicated depthwise / grouped paths. No workspace.
template <typename T> void direct_conv(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io);
size_t direct_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes);

// GEMM (conv_gemm.cc): explicit im2col / col2im in workspace + blocked matrix product (gemm.h).
template <typename T> void gemm_conv(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io);
size_t gemm_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes);

// IMPLICIT_GEMM / IMPLICIT_PRECOMP_GEMM (conv_implicit_gemm.cc): im2col panels gathered while
// packing for the blocked product; PRECOMP reads per-tap offsets from a precomputed table.
template <typename T> void implicit_gemm_conv(ConvOp op, const ConvProblem& p,
                                              const ConvOperands<T>& io, bool precomputed);
size_t implicit_gemm_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes,
                                     bool precomputed);

// WINOGRAD_NONFUSED (conv_winograd.cc): F(4x4, 3x3) or F(2x2, 3x3) (or p.tile: 2, 4, 6) transforms
// through workspace,
// the per-point channel contractions as gemm() products. 2-D 3x3 filters, stride 1, no dilation.
// Both Winograd families' forward and backward-data take io.b = U, the transformed filter of
// winograd_filter_transform (takes_winograd_filter), in T; backward-filter takes dy as always.
template <typename T> void winograd_nonfused_conv(ConvOp op, const ConvProblem& p,
                                                  const ConvOperands<T>& io);
size_t winograd_nonfused_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes);
// WINOGRAD (conv_winograd.cc): fused F(2x2, 3x3) per block of tiles; forward and backward-data.
template <typename T> void winograd_fused_conv(ConvOp op, const ConvProblem& p,
                                               const ConvOperands<T>& io);
size_t winograd_fused_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes);
std::string winograd_fused_unsupported(ConvOp op, const ConvProblem& p);
// "" when the Winograd kernels handle the geometry of p, else the reason.
std::string winograd_unsupported(const ConvProblem& p);
// Output tile edge (2, 4 or 6) the Winograd family `algo` uses for (op, p): WINOGRAD_NONFUSED
// p.tile when set, else 4 unless the pass output is smaller than 4 on a side; WINOGRAD always 2.
int winograd_tile(ConvOp op, ConvAlgo algo, const ConvProblem& p);
// The shape of U that a takes_winograd_filter(op, algo) call on p takes: dims and the tile.
void winograd_filter_shape(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out,
                           int* tile, int64_t dims[4]);
// Dims of U for tile m (2, 4 or 6), G groups and pass channels Cig -> Cog per group:
// {(m + 2)^2, G, Cig, round_up(Cog, gemm NR)}: per (point, group), gemm.h's packed-B panels of a
// Cig x Cog matrix (columns zero-padded).
void winograd_filter_dims(int tile, int64_t G, int64_t Cig, int64_t Cog, DType u_dtype,
                          int64_t dims[4]);
// U = G w G^T (jaxdnn_winograd_filter): `filter` describes w (layout, G, C, K, filt); flip: the
// backward-data filter w'(r, s, c, k) = w(2 - r, 2 - s, k, c). w has w_dtype; U is float64 for a
// float64 w, else float32. Returns "" or the reason it cannot run.
std::string winograd_filter_transform(const ConvProblem& filter, int tile, bool flip,
                                      DType w_dtype, const void* w, void* u);

// FFT / FFT_TILING (conv_fft.cc): whole-image (FFT) or overlap-save tiles (FFT_TILING) of real
// transforms, per-frequency complex channel products, inverse transforms. Stride 1, no dilation.
template <typename T> void fft_conv(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io,
                                    bool tiled);
size_t fft_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes, bool tiled);
// The cyclic transform length and the number of tiles per axis (D, H, W) that the float32 FFT
// kernels use for (op, p): one tile per image for FFT; FFT_TILING's choice otherwise.
void fft_tiles(ConvOp op, const ConvProblem& p, bool tiled, int64_t L[3], int64_t tiles[3]);
// "" when the FFT kernels (algo kFft or kFftTiling) handle (op, p), else the reason.
std::string fft_unsupported(ConvOp op, ConvAlgo algo, const ConvProblem& p);

// Support predicate of the CPU backend: "" when `algo` can run `op` on `p`, else the reason.
std::string can_implement(ConvOp op, ConvAlgo algo, const ConvProblem& p);
// The same for a fused forward convolution (an epilogue, conv_problem.h): every CPU family that
// runs the forward convolution carries the epilogue.
std::string can_implement_fused(ConvAlgo algo, const ConvProblem& p);

// Bytes of workspace the CPU backend needs for (op, algo, p) with operands of `in` dtype and a
// result of `out` dtype: the algorithm's workspace plus buffers for 16-bit conversion, plus, with
// `epilogue` (fused forward), the bias widened to the compute type.
size_t workspace_bytes(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out,
                       bool epilogue = false);

// Runs the convolution. Returns "" on success, else an error message. `a`, `b` have dtype `in`,
// `out` has dtype `out_dtype`. A non-empty `epi` (forward only) fuses the epilogue; its bias,
// residual and preact have dtype `out_dtype`, and the workspace is workspace_bytes(..., true).
std::string run_conv(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out_dtype,
                     const void* a, const void* b, void* out, void* workspace,
                     size_t workspace_size, const ConvEpilogue& epi = ConvEpilogue{});

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_CONV_CPU_H_
