// The convolution problem descriptor shared by the CPU and CUDA backends.
//
// Kernels see this struct, plain pointers and a workspace pointer; they know nothing of JAX or XLA.
// Every problem is expressed with three spatial dimensions (D, H, W): 1-D and 2-D convolutions are
// padded with unit dimensions at the front (size 1, filter 1, stride 1, dilations 1, padding 0).
//
// Memory layouts (row-major, last index fastest):
//   kNHWC: x[N][D][H][W][C]   w[T][R][S][C/G][K]   (DHWIO)   y[N][Z][P][Q][K]
//   kNCHW: x[N][C][D][H][W]   w[K][C/G][T][R][S]   (OIDHW)   y[N][K][Z][P][Q]
// Group g reads input channels [g*Cg, (g+1)*Cg) and writes output channels [g*Kg, (g+1)*Kg).
//
// Geometry (per spatial axis; "virtual input" = the input with lhs_dilation-1 zeros between
// elements, then padded by pad_lo/pad_hi, which may be negative):
//   y[o] = sum_f w[f] * xv[o*stride + f*dilation - pad_lo],   xv[j] = x[j / lhs_dil] if j % lhs_dil == 0
//   out = floor((lhs_dil*(in-1) + 1 + pad_lo + pad_hi - (dilation*(filt-1) + 1)) / stride) + 1,
//   clamped at 0.
// The three operations are the faces of one trilinear form <F(x,w), dy> = <x, D(dy,w)> = <w, W(x,dy)>:
//   kForward:        out = y  from (a = x,  b = w)
//   kBackwardData:   out = dx from (a = dy, b = w)
//   kBackwardFilter: out = dw from (a = x,  b = dy)
#ifndef JAXDNN_CONV_PROBLEM_H_
#define JAXDNN_CONV_PROBLEM_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "jaxdnn/activation.h"

namespace jaxdnn {

enum class Layout : int32_t { kNHWC = 0, kNCHW = 1 };

enum class ConvOp : int32_t { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };

// Numbered as cuDNN's CUDNN_CONVOLUTION_FWD_ALGO_* families.
enum class ConvAlgo : int32_t {
  kImplicitGemm = 0,
  kImplicitPrecompGemm = 1,
  kGemm = 2,
  kDirect = 3,
  kFft = 4,
  kFftTiling = 5,
  kWinograd = 6,
  kWinogradNonfused = 7,
};
constexpr int kNumConvAlgos = 8;

enum class DType : int32_t { kF32 = 0, kF64 = 1, kBF16 = 2, kF16 = 3 };

// Arithmetic allowed for float32 operands (lax's Precision): kHighest forbids TF32.
enum class MathPrecision : int32_t { kDefault = 0, kHigh = 1, kHighest = 2 };

inline const char* conv_algo_name(ConvAlgo a) {
  switch (a) {
    case ConvAlgo::kImplicitGemm: return "IMPLICIT_GEMM";
    case ConvAlgo::kImplicitPrecompGemm: return "IMPLICIT_PRECOMP_GEMM";
    case ConvAlgo::kGemm: return "GEMM";
    case ConvAlgo::kDirect: return "DIRECT";
    case ConvAlgo::kFft: return "FFT";
    case ConvAlgo::kFftTiling: return "FFT_TILING";
    case ConvAlgo::kWinograd: return "WINOGRAD";
    case ConvAlgo::kWinogradNonfused: return "WINOGRAD_NONFUSED";
  }
  return "UNKNOWN";
}

inline const char* conv_op_name(ConvOp op) {
  switch (op) {
    case ConvOp::kForward: return "forward";
    case ConvOp::kBackwardData: return "backward-data";
    case ConvOp::kBackwardFilter: return "backward-filter";
  }
  return "unknown";
}

inline size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::kF64: return 8;
    case DType::kF32: return 4;
    default: return 2;
  }
}

struct ConvProblem {
  Layout layout = Layout::kNHWC;
  int spatial_dims = 2;  // what the user asked for (1..3); kernels always see 3
  int64_t N = 0, C = 0, K = 0, G = 1;  // batch, input channels, output channels, groups (totals)
  int64_t in[3] = {1, 1, 1};            // D H W
  int64_t filt[3] = {1, 1, 1};          // T R S
  int64_t out[3] = {1, 1, 1};           // Z P Q
  int64_t stride[3] = {1, 1, 1};
  int64_t dilation[3] = {1, 1, 1};      // filter (rhs) dilation
  int64_t lhs_dilation[3] = {1, 1, 1};  // input dilation (transposed convolution)
  int64_t pad_lo[3] = {0, 0, 0};
  int64_t pad_hi[3] = {0, 0, 0};
  // Algorithm parameter, not geometry: the output tile edge m of F(m x m, 3 x 3) that
  // WINOGRAD_NONFUSED must use (2, 4 or 6), or 0 for the family's own choice (every other
  // family requires 0). From the FFI call's optional `tile` attribute / the queries' "tile" key.
  int tile = 0;

  int64_t Cg() const { return C / G; }
  int64_t Kg() const { return K / G; }
  int64_t in_pixels() const { return in[0] * in[1] * in[2]; }
  int64_t filt_taps() const { return filt[0] * filt[1] * filt[2]; }
  int64_t out_pixels() const { return out[0] * out[1] * out[2]; }
  int64_t x_elems() const { return N * C * in_pixels(); }
  int64_t w_elems() const { return K * Cg() * filt_taps(); }
  int64_t y_elems() const { return N * K * out_pixels(); }
  // Multiply-adds of the forward convolution (the same count for all three operations).
  double macs() const {
    return static_cast<double>(N) * out_pixels() * K * Cg() * filt_taps();
  }
  bool unit_lhs_dilation() const {
    return lhs_dilation[0] == 1 && lhs_dilation[1] == 1 && lhs_dilation[2] == 1;
  }
  bool depthwise() const { return G == C && Cg() == 1; }
};

// Output extent along one axis, clamped at 0 (as lax). An empty input axis dilates to 0
// elements, so its padding alone can still span windows: outputs that sum over no taps.
inline int64_t conv_output_size(int64_t in, int64_t filt, int64_t stride, int64_t dilation,
                                int64_t lhs_dilation, int64_t pad_lo, int64_t pad_hi) {
  if (filt <= 0) return 0;
  const int64_t virtual_in = (in > 0 ? lhs_dilation * (in - 1) + 1 : 0) + pad_lo + pad_hi;
  const int64_t window = dilation * (filt - 1) + 1;
  if (virtual_in < window) return 0;
  return (virtual_in - window) / stride + 1;
}

// Checks internal consistency. Returns an empty string when valid, otherwise a message.
inline std::string validate_problem(const ConvProblem& p) {
  if (p.spatial_dims < 1 || p.spatial_dims > 3) return "spatial_dims must be 1, 2 or 3";
  if (p.N < 0 || p.C <= 0 || p.K <= 0 || p.G <= 0)
    return "batch must be >= 0 and channels, output channels and groups must be positive";
  if (p.tile != 0 && p.tile != 2 && p.tile != 4 && p.tile != 6)
    return "the Winograd tile must be 2, 4 or 6 (or 0 for the family's choice)";
  if (p.C % p.G != 0) return "input channels must be divisible by feature_group_count";
  if (p.K % p.G != 0) return "output channels must be divisible by feature_group_count";
  for (int i = 0; i < 3; ++i) {
    if (p.stride[i] <= 0) return "window_strides must be positive";
    if (p.dilation[i] <= 0) return "rhs_dilation must be positive";
    if (p.lhs_dilation[i] <= 0) return "lhs_dilation must be positive";
    if (p.in[i] < 0 || p.filt[i] < 0) return "spatial sizes must be non-negative";
    const int64_t o = conv_output_size(p.in[i], p.filt[i], p.stride[i], p.dilation[i],
                                       p.lhs_dilation[i], p.pad_lo[i], p.pad_hi[i]);
    if (o != p.out[i]) return "output spatial size does not match the geometry";
  }
  return "";
}

// "" when `algo` accepts the problem's explicit tile (none: every family; 2, 4 or 6:
// WINOGRAD_NONFUSED only), else the reason.
inline std::string tile_unsupported(ConvAlgo algo, const ConvProblem& p) {
  if (p.tile == 0 || algo == ConvAlgo::kWinogradNonfused) return "";
  return std::string(conv_algo_name(algo)) + " takes no output tile (tile " +
         std::to_string(p.tile) + " is a WINOGRAD_NONFUSED parameter)";
}

// Epilogue of a fused forward convolution, applied where a kernel stores its output:
//   z = conv(x, w) + bias[k] + residual[n, ..., k],   y = act(z)
// bias ([K]) and residual (output-shaped) have the output's dtype; null when absent. When
// `preact` is set the kernel also stores z there (output-shaped, output dtype): the backward of
// activations whose derivative needs the input (gelu, silu) reads it. Only the forward operation
// takes an epilogue.
struct ConvEpilogue {
  const void* bias = nullptr;
  const void* residual = nullptr;
  void* preact = nullptr;
  Activation activation = Activation::kIdentity;
  double param = 0.0;  // the activation's parameter (activation.h)

  bool empty() const {
    return bias == nullptr && residual == nullptr && preact == nullptr &&
           activation == Activation::kIdentity;
  }
};

}  // namespace jaxdnn

#endif  // JAXDNN_CONV_PROBLEM_H_
