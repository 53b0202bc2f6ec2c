// Standalone checker/timer for the GEMM-family convolution kernels (conv_gemm_family.cu).
// Usage: check [--quick] [--no-time] [--no-check] [--fwd-only] [--op OP] [--only DT[,DT..]]
//              [--case NAME[,NAME..]] [--layers FILE] [--csv FILE]
//   --fwd-only: forward only (checks and timing; timing: IMPLICIT_PRECOMP_GEMM, bf16 unless --only)
//   --only: the dtype combinations by name (bf16, f16, tf32, f32, f64, bf16>f32, f16>f32)
//   --case: the geometry cases by name (both layouts)
// Also built for the host by emulate.sh (JAXDNN_GEMM_EMULATION: no wgmma, no timing; the kernel
// launch counts are printed).
// Every forward check is repeated with a fused epilogue (kEpiVariants: bias, residual, preact and
// the activation kind rotate over the runs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "conv_cuda.h"
#include "jaxdnn/activation.h"

using namespace jaxdnn;
using namespace jaxdnn::cuda;

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, \
              __LINE__);                                                            \
      exit(2);                                                                      \
    }                                                                               \
  } while (0)

struct Strides {
  long long xsN, xsC, xsPix, ysN, ysC, ysPix, wsK, wsC, wsT, wsR, wsS;
};
Strides strides_of(const ConvProblem& pb) {
  Strides s;
  const long long C = pb.C, K = pb.K, Cg = pb.Cg(), dhw = pb.in_pixels(), zpq = pb.out_pixels();
  const long long T = pb.filt[0], R = pb.filt[1], S = pb.filt[2];
  if (pb.layout == Layout::kNHWC) {
    s.xsC = 1; s.xsPix = C; s.xsN = dhw * C;
    s.ysC = 1; s.ysPix = K; s.ysN = zpq * K;
    s.wsK = 1; s.wsC = K; s.wsS = Cg * K; s.wsR = S * Cg * K; s.wsT = R * S * Cg * K;
  } else {
    s.xsPix = 1; s.xsC = dhw; s.xsN = C * dhw;
    s.ysPix = 1; s.ysC = zpq; s.ysN = K * zpq;
    s.wsS = 1; s.wsR = S; s.wsT = R * S; s.wsC = T * R * S; s.wsK = Cg * T * R * S;
  }
  return s;
}
struct RefP {
  int N, G, Cg, Kg, D, H, W, T, R, S, Z, P, Q, str[3], dil[3], pad[3];
  Strides s;
};
RefP refp_of(const ConvProblem& pb) {
  RefP r;
  r.N = pb.N; r.G = pb.G; r.Cg = pb.Cg(); r.Kg = pb.Kg();
  r.D = pb.in[0]; r.H = pb.in[1]; r.W = pb.in[2];
  r.T = pb.filt[0]; r.R = pb.filt[1]; r.S = pb.filt[2];
  r.Z = pb.out[0]; r.P = pb.out[1]; r.Q = pb.out[2];
  for (int a = 0; a < 3; ++a) { r.str[a] = pb.stride[a]; r.dil[a] = pb.dilation[a]; r.pad[a] = pb.pad_lo[a]; }
  r.s = strides_of(pb);
  return r;
}
__device__ long long xoff(const RefP& p, int n, int c, int d, int h, int w) {
  return n * p.s.xsN + c * p.s.xsC + ((long long)(d * p.H + h) * p.W + w) * p.s.xsPix;
}
__device__ long long yoff(const RefP& p, int n, int k, int z, int y, int x) {
  return n * p.s.ysN + k * p.s.ysC + ((long long)(z * p.P + y) * p.Q + x) * p.s.ysPix;
}
__device__ long long woff(const RefP& p, int k, int c, int t, int r, int s) {
  return k * p.s.wsK + c * p.s.wsC + t * p.s.wsT + r * p.s.wsR + s * p.s.wsS;
}
// one thread per output element; logical index order (n, k, z, y, x) etc.
__global__ void ref_fwd(RefP p, const double* x, const double* w, double* y) {
  long long total = (long long)p.N * p.G * p.Kg * p.Z * p.P * p.Q;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    long long r = i;
    int xq = r % p.Q; r /= p.Q; int yq = r % p.P; r /= p.P; int zq = r % p.Z; r /= p.Z;
    int k = r % (p.G * p.Kg); int n = r / (p.G * p.Kg);
    int g = k / p.Kg;
    double s = 0;
    for (int c = 0; c < p.Cg; ++c)
      for (int t = 0; t < p.T; ++t) for (int rr = 0; rr < p.R; ++rr) for (int ss = 0; ss < p.S; ++ss) {
        int d = zq * p.str[0] + t * p.dil[0] - p.pad[0], h = yq * p.str[1] + rr * p.dil[1] - p.pad[1],
            ww = xq * p.str[2] + ss * p.dil[2] - p.pad[2];
        if (d < 0 || d >= p.D || h < 0 || h >= p.H || ww < 0 || ww >= p.W) continue;
        s += x[xoff(p, n, g * p.Cg + c, d, h, ww)] * w[woff(p, k, c, t, rr, ss)];
      }
    y[yoff(p, n, k, zq, yq, xq)] = s;
  }
}
__global__ void ref_dgrad(RefP p, const double* dy, const double* w, double* dx) {
  long long total = (long long)p.N * p.G * p.Cg * p.D * p.H * p.W;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    long long r = i;
    int ww = r % p.W; r /= p.W; int h = r % p.H; r /= p.H; int d = r % p.D; r /= p.D;
    int c = r % (p.G * p.Cg); int n = r / (p.G * p.Cg);
    int g = c / p.Cg, cl = c % p.Cg;
    double s = 0;
    for (int k = 0; k < p.Kg; ++k)
      for (int t = 0; t < p.T; ++t) for (int rr = 0; rr < p.R; ++rr) for (int ss = 0; ss < p.S; ++ss) {
        int nz = d + p.pad[0] - t * p.dil[0], ny = h + p.pad[1] - rr * p.dil[1], nx = ww + p.pad[2] - ss * p.dil[2];
        if (nz % p.str[0] || ny % p.str[1] || nx % p.str[2]) continue;
        int zq = nz / p.str[0], yq = ny / p.str[1], xq = nx / p.str[2];
        if (zq < 0 || zq >= p.Z || yq < 0 || yq >= p.P || xq < 0 || xq >= p.Q) continue;
        s += dy[yoff(p, n, g * p.Kg + k, zq, yq, xq)] * w[woff(p, g * p.Kg + k, cl, t, rr, ss)];
      }
    dx[xoff(p, n, c, d, h, ww)] = s;
  }
}
__global__ void ref_wgrad(RefP p, const double* x, const double* dy, double* dw) {
  long long total = (long long)p.G * p.Kg * p.Cg * p.T * p.R * p.S;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    long long r = i;
    int ss = r % p.S; r /= p.S; int rr = r % p.R; r /= p.R; int t = r % p.T; r /= p.T;
    int c = r % p.Cg; int k = r / p.Cg;
    int g = k / p.Kg;
    double s = 0;
    for (int n = 0; n < p.N; ++n)
      for (int zq = 0; zq < p.Z; ++zq) for (int yq = 0; yq < p.P; ++yq) for (int xq = 0; xq < p.Q; ++xq) {
        int d = zq * p.str[0] + t * p.dil[0] - p.pad[0], h = yq * p.str[1] + rr * p.dil[1] - p.pad[1],
            ww = xq * p.str[2] + ss * p.dil[2] - p.pad[2];
        if (d < 0 || d >= p.D || h < 0 || h >= p.H || ww < 0 || ww >= p.W) continue;
        s += x[xoff(p, n, g * p.Cg + c, d, h, ww)] * dy[yoff(p, n, k, zq, yq, xq)];
      }
    dw[woff(p, k, c, t, rr, ss)] = s;
  }
}

// ---- host helpers
struct Dt {
  DType in, out;
  MathPrecision prec;
  const char* name;
  double tol;
};
double round_to(DType t, double v) {
  switch (t) {
    case DType::kBF16: return (double)__bfloat162float(__float2bfloat16_rn((float)v));
    case DType::kF16: return (double)__half2float(__float2half_rn((float)v));
    case DType::kF32: return (double)(float)v;
    default: return v;
  }
}
void to_bytes(DType t, const std::vector<double>& v, std::vector<unsigned char>& b) {
  size_t e = dtype_bytes(t);
  b.resize(v.size() * e);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kBF16) { __nv_bfloat16 h = __float2bfloat16_rn((float)v[i]); memcpy(&b[i * 2], &h, 2); }
    else if (t == DType::kF16) { __half h = __float2half_rn((float)v[i]); memcpy(&b[i * 2], &h, 2); }
    else if (t == DType::kF32) { float f = (float)v[i]; memcpy(&b[i * 4], &f, 4); }
    else memcpy(&b[i * 8], &v[i], 8);
  }
}
double from_bytes(DType t, const unsigned char* p) {
  if (t == DType::kBF16) { __nv_bfloat16 h; memcpy(&h, p, 2); return __bfloat162float(h); }
  if (t == DType::kF16) { __half h; memcpy(&h, p, 2); return __half2float(h); }
  if (t == DType::kF32) { float f; memcpy(&f, p, 4); return f; }
  double d; memcpy(&d, p, 8); return d;
}

ConvProblem make_problem(Layout L, int dims, int N, int C, int K, int G, std::vector<int> in,
                         std::vector<int> f, std::vector<int> st, std::vector<int> dil,
                         std::vector<int> plo, std::vector<int> phi) {
  ConvProblem p;
  p.layout = L; p.spatial_dims = dims; p.N = N; p.C = C; p.K = K; p.G = G;
  int off = 3 - dims;
  for (int a = 0; a < dims; ++a) {
    p.in[off + a] = in[a]; p.filt[off + a] = f[a]; p.stride[off + a] = st[a];
    p.dilation[off + a] = dil[a]; p.pad_lo[off + a] = plo[a]; p.pad_hi[off + a] = phi[a];
  }
  for (int a = 0; a < 3; ++a)
    p.out[a] = conv_output_size(p.in[a], p.filt[a], p.stride[a], p.dilation[a], 1, p.pad_lo[a], p.pad_hi[a]);
  return p;
}

std::mt19937_64 rng(1234);
std::vector<double> rnd(size_t n) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

const char* algo_s(ConvAlgo a) { return a == ConvAlgo::kImplicitGemm ? "IG" : a == ConvAlgo::kImplicitPrecompGemm ? "IPG" : "GEMM"; }
const char* op_s(ConvOp o) { return o == ConvOp::kForward ? "fwd" : o == ConvOp::kBackwardData ? "dgrad" : "wgrad"; }

bool selected(const std::string& only, const char* name) {
  if (only.empty()) return true;
  std::stringstream ss(only);
  for (std::string t; std::getline(ss, t, ',');)
    if (t == name) return true;
  return false;
}

// Fused-epilogue variants: the kernels dispatch the activation per run of values (the
// piecewise-linear kinds inline, the others out of line) and skip absent operands, so the forward
// runs rotate over these (by case, dtype and algorithm).
struct EpiVariant {
  const char* name;
  bool bias, res, preact;
  Activation act;
  double param;
};
const EpiVariant kEpiVariants[] = {
    {"bias+res+preact+leaky", true, true, true, Activation::kLeakyRelu, 0.1},
    {"bias+relu", true, false, false, Activation::kRelu, 0.0},
    {"res+identity", false, true, false, Activation::kIdentity, 0.0},
    {"bias+preact+silu", true, false, true, Activation::kSilu, 0.0},
    {"bias+res+relu", true, true, false, Activation::kRelu, 0.0},
};
constexpr int kNumEpiVariants = sizeof(kEpiVariants) / sizeof(kEpiVariants[0]);

// Fused-epilogue reference on the plain result (same layout): z = y + bias[k] + res[i] (the
// variant's operands), out = act(z); preact = z.
void epi_ref(const ConvProblem& pb, const EpiVariant& ev, const std::vector<double>& y,
             const std::vector<double>& bias, const std::vector<double>& res,
             std::vector<double>& z, std::vector<double>& out) {
  const long long K = pb.K, pix = pb.out_pixels();
  z.resize(y.size());
  out.resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    const long long k = pb.layout == Layout::kNHWC ? i % K : (i / pix) % K;
    z[i] = y[i] + (ev.bias ? bias[k] : 0.0) + (ev.res ? res[i] : 0.0);
    out[i] = activate<double>(ev.act, z[i], ev.param);
  }
}

double rel_err(DType t, const std::vector<unsigned char>& got, const std::vector<double>& ref,
               long long* nans) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double o = from_bytes(t, &got[i * dtype_bytes(t)]);
    if (std::isnan(o)) { ++*nans; continue; }
    num += (o - ref[i]) * (o - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Which operations a run covers: "" all, else "fwd", "dgrad" or "wgrad" (--op; --fwd-only = fwd).
bool op_selected(const std::string& ops, ConvOp op) { return ops.empty() || ops == op_s(op); }

int run_checks(bool quick, const std::string& ops, const std::string& only,
               const std::string& case_names) {
  struct Case { const char* name; ConvProblem p; };
  std::vector<Case> cases;
  auto add = [&](const char* n, ConvProblem p) { cases.push_back({n, p}); };
  for (Layout L : {Layout::kNHWC, Layout::kNCHW}) {
    add("2d_c16k24_3x3", make_problem(L, 2, 2, 16, 24, 1, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
    add("2d_c3k5_s2_asym", make_problem(L, 2, 1, 3, 5, 1, {15, 14}, {3, 3}, {2, 2}, {1, 1}, {1, 0}, {2, 1}));
    add("2d_c32k16_s2_d2", make_problem(L, 2, 2, 32, 16, 1, {10, 11}, {3, 3}, {2, 2}, {2, 2}, {1, 1}, {1, 1}));
    add("2d_g2_c16k32", make_problem(L, 2, 2, 16, 32, 2, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
    add("1d_c8k8_k5s2", make_problem(L, 1, 3, 8, 8, 1, {33}, {5}, {2}, {1}, {2}, {2}));
    add("3d_c8k16", make_problem(L, 3, 1, 8, 16, 1, {6, 7, 5}, {3, 3, 3}, {1, 2, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}));
    // Cg % 64 == 0: the 16-bit forward of IMPLICIT_PRECOMP_GEMM runs the wgmma kernel on sm_90
    // (partial M and N tiles, groups, strides, dilation, 1-D/3-D, several K tiles per tap)
    add("wg_c64k72_3x3_odd", make_problem(L, 2, 3, 64, 72, 1, {13, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
    add("wg_g2_c128k96_s2_d2", make_problem(L, 2, 2, 128, 96, 2, {15, 14}, {3, 3}, {2, 2}, {2, 2}, {2, 1}, {2, 2}));
    add("wg_3d_c64k64", make_problem(L, 3, 2, 64, 64, 1, {5, 6, 7}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}));
    add("wg_c192k256_5x5", make_problem(L, 2, 2, 192, 256, 1, {9, 10}, {5, 5}, {1, 1}, {1, 1}, {2, 2}, {2, 2}));
    add("wg_1d_c64k128_k7", make_problem(L, 1, 2, 64, 128, 1, {50}, {7}, {1}, {1}, {3}, {3}));
    // the loader's bounds tests on all three axes (depth dilation, uneven padding), and 49 taps
    // (more than 32: a loader with per-row tap bit masks would need a second word)
    add("wg_3d_c64k64_d2", make_problem(L, 3, 2, 64, 64, 1, {7, 6, 8}, {3, 3, 2}, {1, 1, 1}, {2, 1, 2}, {2, 1, 1}, {1, 1, 0}));
    add("wg_c64k64_7x7", make_problem(L, 2, 2, 64, 64, 1, {9, 8}, {7, 7}, {1, 1}, {1, 1}, {3, 3}, {3, 3}));
    // Cg % 32 == 0: the float32 forward at TF32 precision runs it too (32-wide K steps: one per
    // tap at Cg 32, three at Cg 96), with odd sizes, groups (Kg 24), stride 2, asymmetric padding
    add("tf_c32k40_3x3_odd", make_problem(L, 2, 3, 32, 40, 1, {13, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
    add("tf_g2_c64k48_s2", make_problem(L, 2, 2, 64, 48, 2, {15, 13}, {3, 3}, {2, 2}, {1, 1}, {1, 0}, {1, 1}));
    add("tf_c96k64_5x5", make_problem(L, 2, 2, 96, 64, 1, {11, 9}, {5, 5}, {1, 1}, {1, 1}, {2, 2}, {2, 2}));
    // a 1x1 layer with more 64x64 tiles (864) than resident CTAs: the persistent walk takes
    // several tiles per CTA (register-direct stores without an epilogue; with one, every tile is
    // staged through a C tile of its own); partial last N tile (Kg 136)
    add("wg_1x1_c64k136_many", make_problem(L, 2, 8, 64, 136, 1, {48, 48}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, {0, 0}));
    // 288 row tiles of 128 (the warp-specialized kernel, JAXDNN_WGMMA_WS=1: more tiles than its
    // one CTA per SM, so both consumer warpgroups of a CTA take tiles) with 9 K steps per tile, so
    // a stage's uses alternate between the two consumers
    add("wg_3x3_c64k64_walk", make_problem(L, 2, 4, 64, 64, 1, {96, 96}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
    // Backward-data at stride 1 takes the wgmma kernel when the forward view qualifies (Kg % 64
    // in 16-bit, % 32 in tf32; Cg % 8): asymmetric padding, groups with dilation, and padding
    // wider than the dilated filter (negative padding in the view)
    add("wgd_c72k64_asym", make_problem(L, 2, 2, 72, 64, 1, {11, 13}, {3, 3}, {1, 1}, {1, 1}, {1, 0}, {2, 1}));
    add("wgd_g2_c48k128_d2", make_problem(L, 2, 2, 48, 128, 2, {12, 10}, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {2, 1}));
    add("wgd_c64k64_widepad", make_problem(L, 2, 2, 64, 64, 1, {7, 9}, {3, 3}, {1, 1}, {1, 1}, {3, 3}, {3, 1}));
    if (quick) continue;
    add("1x1_c64k64", make_problem(L, 2, 2, 64, 64, 1, {8, 8}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, {0, 0}));
    add("2d_c64k128_s2", make_problem(L, 2, 2, 64, 128, 1, {16, 16}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}));
    add("dw_c8", make_problem(L, 2, 2, 8, 8, 8, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
    add("negpad", make_problem(L, 2, 1, 8, 8, 1, {10, 10}, {3, 3}, {1, 1}, {1, 1}, {-1, 0}, {-1, 1}));
    // strided with negative padding: a transposed convolution's strided view (jaxdnn runs an
    // lhs-dilated problem as this problem's backward-data / forward / backward-filter, with
    // padding (F-1)*d - pad, negative where pad exceeds the dilated filter)
    add("negpad_s2x3_d2", make_problem(L, 2, 2, 8, 12, 1, {9, 10}, {3, 3}, {2, 3}, {1, 2}, {-1, 0}, {1, -2}));
    add("c5k7_5x5_s3_d2", make_problem(L, 2, 2, 5, 7, 1, {17, 16}, {5, 5}, {3, 3}, {2, 2}, {3, 3}, {2, 3}));
    add("splitk_c256k128_7x7", make_problem(L, 2, 1, 256, 128, 1, {7, 7}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
    add("g4_c32k64_s2", make_problem(L, 2, 2, 32, 64, 4, {12, 12}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}));
    add("2d_s1x3_big", make_problem(L, 2, 1, 24, 40, 1, {20, 31}, {2, 4}, {1, 3}, {1, 1}, {0, 2}, {1, 1}));
  }
  cases.erase(std::remove_if(cases.begin(), cases.end(),
                             [&](const Case& c) { return !selected(case_names, c.name); }),
              cases.end());
  std::vector<Dt> dts = {
      {DType::kBF16, DType::kBF16, MathPrecision::kDefault, "bf16", 1e-2},
      {DType::kF16, DType::kF16, MathPrecision::kDefault, "f16", 3e-3},
      {DType::kF32, DType::kF32, MathPrecision::kDefault, "tf32", 3e-3},
      {DType::kF32, DType::kF32, MathPrecision::kHighest, "f32", 1e-5},
      {DType::kF64, DType::kF64, MathPrecision::kDefault, "f64", 1e-12},
      {DType::kBF16, DType::kF32, MathPrecision::kDefault, "bf16>f32", 1e-2},
      {DType::kF16, DType::kF32, MathPrecision::kDefault, "f16>f32", 3e-3},
  };
  if (quick) dts = {dts[0], dts[2], dts[4]};
  dts.erase(std::remove_if(dts.begin(), dts.end(), [&](const Dt& d) { return !selected(only, d.name); }),
            dts.end());
  int fails = 0, total = 0, rejected = 0;
  // worst relative error per dtype: every run; IMPLICIT_PRECOMP_GEMM forward and backward-data
  // (the wgmma kernel on sm_90 where eligible); the fused epilogue's result and preact
  double worst[7] = {0}, worst_ipg[7] = {0}, worst_epi[7] = {0};
  for (auto& cs : cases) {
    const ConvProblem& pb = cs.p;
    std::string v = validate_problem(pb);
    if (!v.empty()) { printf("BAD CASE %s: %s\n", cs.name, v.c_str()); continue; }
    RefP rp = refp_of(pb);
    for (size_t di = 0; di < dts.size(); ++di) {
      const Dt& dt = dts[di];
      std::vector<double> hx = rnd(pb.x_elems()), hw = rnd(pb.w_elems()), hy = rnd(pb.y_elems());
      for (auto& a : hx) a = round_to(dt.in, a);
      for (auto& a : hw) a = round_to(dt.in, a);
      for (auto& a : hy) a = round_to(dt.in, a);
      double *dx, *dw, *dy, *dref;
      size_t maxe = std::max({pb.x_elems(), pb.w_elems(), pb.y_elems()});
      CK(cudaMalloc(&dx, hx.size() * 8)); CK(cudaMalloc(&dw, hw.size() * 8)); CK(cudaMalloc(&dy, hy.size() * 8));
      CK(cudaMalloc(&dref, maxe * 8));
      CK(cudaMemcpy(dx, hx.data(), hx.size() * 8, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dw, hw.data(), hw.size() * 8, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dy, hy.data(), hy.size() * 8, cudaMemcpyHostToDevice));
      std::vector<unsigned char> bx, bw, by;
      to_bytes(dt.in, hx, bx); to_bytes(dt.in, hw, bw); to_bytes(dt.in, hy, by);
      void *gx, *gw, *gy, *gout;
      CK(cudaMalloc(&gx, bx.size() + 16)); CK(cudaMalloc(&gw, bw.size() + 16)); CK(cudaMalloc(&gy, by.size() + 16));
      CK(cudaMalloc(&gout, maxe * 8 + 16));
      CK(cudaMemcpy(gx, bx.data(), bx.size(), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(gw, bw.data(), bw.size(), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(gy, by.data(), by.size(), cudaMemcpyHostToDevice));
      for (ConvOp op : {ConvOp::kForward, ConvOp::kBackwardData, ConvOp::kBackwardFilter}) {
        if (!op_selected(ops, op)) continue;
        size_t oe;
        if (op == ConvOp::kForward) { ref_fwd<<<256, 128>>>(rp, dx, dw, dref); oe = pb.y_elems(); }
        else if (op == ConvOp::kBackwardData) { ref_dgrad<<<256, 128>>>(rp, dy, dw, dref); oe = pb.x_elems(); }
        else { ref_wgrad<<<256, 128>>>(rp, dx, dy, dref); oe = pb.w_elems(); }
        CK(cudaGetLastError());
        std::vector<double> ref(oe);
        CK(cudaMemcpy(ref.data(), dref, oe * 8, cudaMemcpyDeviceToHost));
        int algo_idx = 0;
        for (ConvAlgo al : {ConvAlgo::kImplicitGemm, ConvAlgo::kImplicitPrecompGemm, ConvAlgo::kGemm}) {
          const EpiVariant& ev =
              kEpiVariants[(static_cast<int>(&cs - &cases[0]) + static_cast<int>(di) + algo_idx++) %
                           kNumEpiVariants];
          CudaConvCall call{op, al, pb, dt.in, dt.out, dt.prec};
          std::string why = gemm_family_can_implement(call);
          ++total;
          if (!why.empty()) { ++rejected; printf("REJECT %s %s %s %s %s: %s\n", cs.name, pb.layout == Layout::kNHWC ? "NHWC" : "NCHW", dt.name, op_s(op), algo_s(al), why.c_str()); continue; }
          size_t wsb = gemm_family_workspace_bytes(call);
          if (wsb != gemm_family_workspace_bytes(call)) printf("WS NONDETERMINISTIC\n");
          void* ws = nullptr;
          if (wsb) CK(cudaMalloc(&ws, wsb));
          CK(cudaMemset(gout, 0xFF, oe * dtype_bytes(dt.out)));
          const void* a = op == ConvOp::kBackwardData ? gy : gx;
          const void* b = op == ConvOp::kBackwardFilter ? gy : gw;
          CudaConvBuffers io{a, b, gout, ws, wsb, 0};
          std::string err = gemm_family_run(call, io);
          cudaError_t se = cudaDeviceSynchronize();
          std::vector<unsigned char> ob(oe * dtype_bytes(dt.out));
          CK(cudaMemcpy(ob.data(), gout, ob.size(), cudaMemcpyDeviceToHost));
          // rerun for determinism
          std::vector<unsigned char> ob2(ob.size());
          CK(cudaMemset(gout, 0xFF, ob.size()));
          gemm_family_run(call, io);
          CK(cudaDeviceSynchronize());
          CK(cudaMemcpy(ob2.data(), gout, ob.size(), cudaMemcpyDeviceToHost));
          bool det = memcmp(ob.data(), ob2.data(), ob.size()) == 0;
          long long nans = 0;
          double rel = rel_err(dt.out, ob, ref, &nans);
          bool ok = err.empty() && se == cudaSuccess && nans == 0 && rel <= dt.tol && det;
          worst[di] = std::max(worst[di], rel);
          if (op != ConvOp::kBackwardFilter && al == ConvAlgo::kImplicitPrecompGemm)
            worst_ipg[di] = std::max(worst_ipg[di], rel);
          if (!ok) {
            ++fails;
            printf("FAIL %-20s %s %-8s %-5s %-4s rel=%.3e nans=%lld det=%d err='%s' %s\n", cs.name,
                   pb.layout == Layout::kNHWC ? "NHWC" : "NCHW", dt.name, op_s(op), algo_s(al), rel,
                   nans, (int)det, err.c_str(), cudaGetErrorString(se));
            if (se != cudaSuccess) return 1000;
          }
          if (op != ConvOp::kForward) {
            if (ws) CK(cudaFree(ws));
            continue;
          }
          // The same forward with the fused epilogue (bias, residual and preact in the output
          // dtype), against the epilogue applied to the fp64 reference.
          std::vector<double> hb = rnd(pb.K), hr = rnd(oe), zref, eref;
          for (auto& a : hb) a = round_to(dt.out, a);
          for (auto& a : hr) a = round_to(dt.out, a);
          epi_ref(pb, ev, ref, hb, hr, zref, eref);
          std::vector<unsigned char> bb, br;
          to_bytes(dt.out, hb, bb); to_bytes(dt.out, hr, br);
          void *gb, *gr, *gz;
          CK(cudaMalloc(&gb, bb.size() + 16)); CK(cudaMalloc(&gr, br.size() + 16)); CK(cudaMalloc(&gz, br.size() + 16));
          CK(cudaMemcpy(gb, bb.data(), bb.size(), cudaMemcpyHostToDevice));
          CK(cudaMemcpy(gr, br.data(), br.size(), cudaMemcpyHostToDevice));
          CK(cudaMemset(gout, 0xFF, ob.size()));
          CK(cudaMemset(gz, 0xFF, br.size()));
          CudaConvBuffers eio = io;
          eio.epi.bias = ev.bias ? gb : nullptr;
          eio.epi.residual = ev.res ? gr : nullptr;
          eio.epi.preact = ev.preact ? gz : nullptr;
          eio.epi.activation = ev.act; eio.epi.param = ev.param;
          err = gemm_family_run(call, eio);
          se = cudaDeviceSynchronize();
          std::vector<unsigned char> oz(ob.size());
          CK(cudaMemcpy(ob.data(), gout, ob.size(), cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(oz.data(), gz, oz.size(), cudaMemcpyDeviceToHost));
          cudaFree(gb); cudaFree(gr); cudaFree(gz);
          if (ws) CK(cudaFree(ws));
          nans = 0;
          const double rel_y = rel_err(dt.out, ob, eref, &nans);
          const double rel_z = ev.preact ? rel_err(dt.out, oz, zref, &nans) : 0.0;
          worst_epi[di] = std::max({worst_epi[di], rel_y, rel_z});
          if (!(err.empty() && se == cudaSuccess && nans == 0 && rel_y <= dt.tol && rel_z <= dt.tol)) {
            ++fails;
            printf("FAIL %-20s %s %-8s fwd+epi(%s) %-4s rel=%.3e preact=%.3e nans=%lld err='%s' %s\n",
                   cs.name, pb.layout == Layout::kNHWC ? "NHWC" : "NCHW", dt.name, ev.name,
                   algo_s(al), rel_y, rel_z, nans, err.c_str(), cudaGetErrorString(se));
            if (se != cudaSuccess) return 1000;
          }
        }
      }
      cudaFree(dx); cudaFree(dw); cudaFree(dy); cudaFree(dref); cudaFree(gx); cudaFree(gw); cudaFree(gy); cudaFree(gout);
    }
  }
  printf("CHECK: %d runs, %d failed, %d rejected\n", total, fails, rejected);
  for (size_t di = 0; di < dts.size(); ++di)
    printf("  worst rel err %-9s %.3e (IPG fwd/dgrad %.3e, fused epilogue %.3e) (tol %.0e)\n", dts[di].name,
           worst[di], worst_ipg[di], worst_epi[di], dts[di].tol);
  // rejection reasons
  {
    ConvProblem p = make_problem(Layout::kNHWC, 2, 1, 8, 8, 1, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1});
    p.lhs_dilation[1] = 2;
    p.out[1] = conv_output_size(p.in[1], 3, 1, 1, 2, 1, 1);
    CudaConvCall call{ConvOp::kForward, ConvAlgo::kImplicitPrecompGemm, p, DType::kBF16, DType::kBF16, MathPrecision::kDefault};
    printf("  reason(lhs_dilation=2): %s\n", gemm_family_can_implement(call).c_str());
    CudaConvCall c2{ConvOp::kForward, ConvAlgo::kImplicitPrecompGemm, make_problem(Layout::kNHWC, 2, 1, 8, 8, 1, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}), DType::kF32, DType::kBF16, MathPrecision::kDefault};
    printf("  reason(f32->bf16): %s\n", gemm_family_can_implement(c2).c_str());
    // float32 takes the wgmma (TF32) kernel at DEFAULT and HIGH precision, never at HIGHEST
    ConvProblem q = make_problem(Layout::kNHWC, 2, 1, 32, 32, 1, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1});
    std::string r[3];
    for (int i = 0; i < 3; ++i)
      r[i] = wgmma_reason({ConvOp::kForward, ConvAlgo::kImplicitPrecompGemm, q, DType::kF32,
                               DType::kF32, static_cast<MathPrecision>(i)});
    printf("  wgmma reason(f32 C=32: DEFAULT, HIGH, HIGHEST): '%s', '%s', '%s'\n", r[0].c_str(),
           r[1].c_str(), r[2].c_str());
#ifndef JAXDNN_GEMM_EMULATION  // the emulated device has no wgmma kernel
    if (!r[0].empty() || !r[1].empty() || r[2].empty()) {
      ++fails;
      printf("FAIL wgmma eligibility of float32 by precision\n");
    }
#endif
  }
  return fails;
}

// ---- timing
struct Layer { std::string name; int N, C, H, W, K, R, S, st, pad, G; };
std::vector<Layer> read_layers(const char* f) {
  std::vector<Layer> v;
  std::ifstream in(f);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    Layer l;
    if (ss >> l.name >> l.N >> l.C >> l.H >> l.W >> l.K >> l.R >> l.S >> l.st >> l.pad >> l.G) v.push_back(l);
  }
  return v;
}
__global__ void fill_rand(unsigned char* p, size_t n, int esz, unsigned seed, int dt) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)(i * 2654435761u) ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    float v = ((h & 0xFFFF) / 32768.0f) - 1.0f;
    if (dt == 2) ((__nv_bfloat16*)p)[i] = __float2bfloat16(v);
    else if (dt == 3) ((__half*)p)[i] = __float2half(v);
    else if (dt == 0) ((float*)p)[i] = v;
    else ((double*)p)[i] = v;
  }
}

void run_timing(const char* layers_file, const char* csv, const std::string& ops, const std::string& only) {
  auto layers = read_layers(layers_file);
  FILE* fc = csv ? fopen(csv, "w") : nullptr;
  if (fc) fprintf(fc, "layer,dtype,op,algo,ms,tflops,ws_bytes\n");
  struct TDt { DType in; MathPrecision pr; const char* name; std::vector<ConvAlgo> algos; };
  std::vector<TDt> tdts = {
      {DType::kBF16, MathPrecision::kDefault, "bf16", {ConvAlgo::kImplicitGemm, ConvAlgo::kImplicitPrecompGemm, ConvAlgo::kGemm}},
      {DType::kF32, MathPrecision::kDefault, "tf32", {ConvAlgo::kImplicitPrecompGemm}},
      {DType::kF32, MathPrecision::kHighest, "f32", {ConvAlgo::kImplicitPrecompGemm}},
  };
  if (!ops.empty())  // one operation: IMPLICIT_PRECOMP_GEMM in bf16 unless --only says otherwise
    for (auto& t : tdts) t.algos = {ConvAlgo::kImplicitPrecompGemm};
  const std::string pick = only.empty() && !ops.empty() ? "bf16" : only;
  tdts.erase(std::remove_if(tdts.begin(), tdts.end(), [&](const TDt& t) { return !selected(pick, t.name); }),
             tdts.end());
  // GEMM_TIME_EPI: "" all three, "0" plain only, "1" the fused bias+relu epilogue only, "2" bias +
  // residual + relu only (profiling).
  const char* epi_env = std::getenv("GEMM_TIME_EPI");
  const std::string epi_sel = epi_env ? epi_env : "";
  printf("\n%-14s %-5s %-6s %9s %9s %9s %8s %10s %9s %10s %9s\n", "layer", "dtype", "op", "IG_ms",
         "IPG_ms", "GEMM_ms", "IPG_TF/s", "IPGepi_ms", "epi/plain", "IPGres_ms", "res/plain");
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (auto& L : layers) {
    ConvProblem pb = make_problem(Layout::kNHWC, 2, L.N, L.C, L.K, L.G, {L.H, L.W}, {L.R, L.S}, {L.st, L.st}, {1, 1}, {L.pad, L.pad}, {L.pad, L.pad});
    for (auto& td : tdts) {
      size_t es = dtype_bytes(td.in);
      const int NS = 3;
      void *x[NS], *w[NS], *y[NS], *o;
      for (int s = 0; s < NS; ++s) {
        CK(cudaMalloc(&x[s], pb.x_elems() * es)); CK(cudaMalloc(&w[s], pb.w_elems() * es)); CK(cudaMalloc(&y[s], pb.y_elems() * es));
        fill_rand<<<1024, 256>>>((unsigned char*)x[s], pb.x_elems(), es, 11 + s, (int)td.in);
        fill_rand<<<1024, 256>>>((unsigned char*)w[s], pb.w_elems(), es, 23 + s, (int)td.in);
        fill_rand<<<1024, 256>>>((unsigned char*)y[s], pb.y_elems(), es, 37 + s, (int)td.in);
      }
      CK(cudaMalloc(&o, std::max({pb.x_elems(), pb.y_elems(), pb.w_elems()}) * es));
      void* bias = nullptr;  // the fused timing's bias (output dtype = input dtype here)
      CK(cudaMalloc(&bias, pb.K * es + 16));
      fill_rand<<<64, 256>>>((unsigned char*)bias, pb.K, es, 51, (int)td.in);
      for (ConvOp op : {ConvOp::kForward, ConvOp::kBackwardData, ConvOp::kBackwardFilter}) {
        if (!op_selected(ops, op)) continue;
        double ms3[3] = {-1, -1, -1}, ms_epi = -1, ms_res = -1;
        // (algorithm, epilogue: 0 none, 1 bias + relu, 2 bias + residual + relu)
        std::vector<std::pair<ConvAlgo, int>> runs;
        for (ConvAlgo al : td.algos) {
          if (epi_sel == "" || epi_sel == "0") runs.push_back({al, 0});
          if (op == ConvOp::kForward && al == ConvAlgo::kImplicitPrecompGemm)
            for (int ek : {1, 2})
              if (epi_sel == "" || epi_sel == std::to_string(ek)) runs.push_back({al, ek});
        }
        for (const auto& run : runs) {
          const ConvAlgo al = run.first;
          const int epi_kind = run.second;
          CudaConvCall call{op, al, pb, td.in, td.in, td.pr};
          std::string why = gemm_family_can_implement(call);
          if (!why.empty()) { printf("  reject %s: %s\n", L.name.c_str(), why.c_str()); continue; }
          size_t wsb = gemm_family_workspace_bytes(call);
          void* ws = nullptr;
          if (wsb) CK(cudaMalloc(&ws, wsb));
          auto launch = [&](int s) {
            const void* a = op == ConvOp::kBackwardData ? y[s] : x[s];
            const void* b = op == ConvOp::kBackwardFilter ? y[s] : w[s];
            CudaConvBuffers io{a, b, o, ws, wsb, 0};
            if (epi_kind) io.epi.bias = bias, io.epi.activation = Activation::kRelu;
            if (epi_kind == 2) io.epi.residual = y[(s + 1) % NS];
            std::string err = gemm_family_run(call, io);
            if (!err.empty()) { printf("run error: %s\n", err.c_str()); exit(3); }
          };
          for (int i = 0; i < 3; ++i) launch(i % NS);
          CK(cudaDeviceSynchronize());
          // back-to-back launches (queue kept full), 5 repetitions, median of per-launch means
          CK(cudaEventRecord(e0)); for (int i = 0; i < 3; ++i) launch(i % NS); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
          float one; CK(cudaEventElapsedTime(&one, e0, e1)); one /= 3;
          int iters = std::max(3, std::min(200, (int)(12.0 / std::max(one, 0.005f))));
          std::vector<float> ts;
          for (int rep = 0; rep < 5; ++rep) {
            CK(cudaEventRecord(e0));
            for (int i = 0; i < iters; ++i) launch(i % NS);
            CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
            float t; CK(cudaEventElapsedTime(&t, e0, e1)); ts.push_back(t / iters);
          }
          std::sort(ts.begin(), ts.end());
          double med = ts[ts.size() / 2];
          int ai = al == ConvAlgo::kImplicitGemm ? 0 : al == ConvAlgo::kImplicitPrecompGemm ? 1 : 2;
          (epi_kind == 2 ? ms_res : epi_kind == 1 ? ms_epi : ms3[ai]) = med;
          double tf = 2.0 * pb.macs() / (med * 1e-3) / 1e12;
          if (fc) fprintf(fc, "%s,%s,%s,%s%s,%.4f,%.1f,%zu\n", L.name.c_str(), td.name, op_s(op), algo_s(al),
                          epi_kind == 2 ? "+bias+res+relu" : epi_kind ? "+bias+relu" : "", med, tf, wsb);
          if (ws) CK(cudaFree(ws));
        }
        double tf = ms3[1] > 0 ? 2.0 * pb.macs() / (ms3[1] * 1e-3) / 1e12 : 0;
        printf("%-14s %-5s %-6s %9.4f %9.4f %9.4f %8.1f %10.4f %9.3f %10.4f %9.3f\n", L.name.c_str(),
               td.name, op_s(op), ms3[0], ms3[1], ms3[2], tf, ms_epi,
               ms_epi > 0 && ms3[1] > 0 ? ms_epi / ms3[1] : -1.0, ms_res,
               ms_res > 0 && ms3[1] > 0 ? ms_res / ms3[1] : -1.0);
        fflush(stdout);
      }
      for (int s = 0; s < NS; ++s) { cudaFree(x[s]); cudaFree(w[s]); cudaFree(y[s]); }
      cudaFree(o);
      cudaFree(bias);
    }
  }
  if (fc) fclose(fc);
}

int main(int argc, char** argv) {
  bool quick = false, timing = true, checks = true;
  std::string ops;
  const char* layers = "benchmarks/layers-gpu.txt";
  const char* csv = nullptr;
  std::string only, case_names;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--no-time")) timing = false;
    else if (!strcmp(argv[i], "--fwd-only")) ops = "fwd";
    else if (!strcmp(argv[i], "--op")) ops = argv[++i];
    else if (!strcmp(argv[i], "--no-check")) checks = false;
    else if (!strcmp(argv[i], "--layers")) layers = argv[++i];
    else if (!strcmp(argv[i], "--csv")) csv = argv[++i];
    else if (!strcmp(argv[i], "--only")) only = argv[++i];
    else if (!strcmp(argv[i], "--case")) case_names = argv[++i];
  }
  int f = checks ? run_checks(quick, ops, only, case_names) : 0;
#ifdef JAXDNN_GEMM_EMULATION
  printf("LAUNCHES:");
  for (const auto& [name, n] : emu::launch_counts) printf(" %s=%ld", name.c_str(), n);
  printf("\n");
  timing = false;
#endif
  if (timing) run_timing(layers, csv, ops, only);
  return f ? 1 : 0;
}
