// Standalone check of the DIRECT family through run_conv: fp64 reference over many geometries,
// then timings. Usage: check [quick|full|none] [bench]  (none: timings only)
// Also built for the host by emulate.sh (JAXDNN_DIRECT_EMULATION: no graph capture, no timing;
// the kernel launch counts are printed).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "conv_cuda.h"

using namespace jaxdnn;
using namespace jaxdnn::cuda;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)

struct Case {
  const char* name;
  Layout layout; int nsd; int64_t N, C, K, G;
  std::vector<int64_t> in, filt, st, dl, lhs, plo, phi;
};

ConvProblem make(const Case& c) {
  ConvProblem p;
  p.layout = c.layout; p.spatial_dims = c.nsd; p.N = c.N; p.C = c.C; p.K = c.K; p.G = c.G;
  auto fill = [&](const std::vector<int64_t>& v, int64_t* dst, int64_t def) {
    for (int i = 0; i < 3; ++i) dst[i] = def;
    for (int i = 0; i < c.nsd; ++i) dst[3 - c.nsd + i] = v.empty() ? def : v[i];
  };
  fill(c.in, p.in, 1); fill(c.filt, p.filt, 1); fill(c.st, p.stride, 1); fill(c.dl, p.dilation, 1);
  fill(c.lhs, p.lhs_dilation, 1); fill(c.plo, p.pad_lo, 0); fill(c.phi, p.pad_hi, 0);
  for (int i = 0; i < 3; ++i)
    p.out[i] = conv_output_size(p.in[i], p.filt[i], p.stride[i], p.dilation[i], p.lhs_dilation[i], p.pad_lo[i], p.pad_hi[i]);
  return p;
}

int64_t aoff(const ConvProblem& p, int64_t n, int64_t c, int64_t d, int64_t h, int64_t w, int64_t ch, const int64_t* sp) {
  if (p.layout == Layout::kNHWC) return (((n * sp[0] + d) * sp[1] + h) * sp[2] + w) * ch + c;
  return (((n * ch + c) * sp[0] + d) * sp[1] + h) * sp[2] + w;
}
int64_t woff(const ConvProblem& p, int64_t k, int64_t ci, int64_t t, int64_t r, int64_t s) {
  if (p.layout == Layout::kNHWC) return ((((t * p.filt[1] + r) * p.filt[2] + s) * p.Cg() + ci) * p.K + k);
  return ((((k * p.Cg() + ci) * p.filt[0] + t) * p.filt[1] + r) * p.filt[2] + s);
}

// One scatter loop computing all three faces in fp64.
void reference(const ConvProblem& p, const std::vector<double>& x, const std::vector<double>& w,
               const std::vector<double>& dy, std::vector<double>& y, std::vector<double>& dx,
               std::vector<double>& dw) {
  y.assign(p.y_elems(), 0); dx.assign(p.x_elems(), 0); dw.assign(p.w_elems(), 0);
  auto src = [&](int ax, int64_t o, int64_t f) -> int64_t {
    int64_t j = o * p.stride[ax] - p.pad_lo[ax] + f * p.dilation[ax];
    if (j < 0 || j % p.lhs_dilation[ax]) return -1;
    j /= p.lhs_dilation[ax];
    return j < p.in[ax] ? j : -1;
  };
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t g = k / p.Kg();
      for (int64_t z = 0; z < p.out[0]; ++z) for (int64_t pp = 0; pp < p.out[1]; ++pp) for (int64_t q = 0; q < p.out[2]; ++q) {
        const int64_t yo = aoff(p, n, k, z, pp, q, p.K, p.out);
        double acc = 0;
        for (int64_t t = 0; t < p.filt[0]; ++t) { int64_t id = src(0, z, t); if (id < 0) continue;
        for (int64_t r = 0; r < p.filt[1]; ++r) { int64_t ih = src(1, pp, r); if (ih < 0) continue;
        for (int64_t s = 0; s < p.filt[2]; ++s) { int64_t iw = src(2, q, s); if (iw < 0) continue;
          for (int64_t ci = 0; ci < p.Cg(); ++ci) {
            const int64_t xo = aoff(p, n, g * p.Cg() + ci, id, ih, iw, p.C, p.in);
            const int64_t wo = woff(p, k, ci, t, r, s);
            acc += x[xo] * w[wo];
            dx[xo] += dy[yo] * w[wo];
            dw[wo] += x[xo] * dy[yo];
          }
        }}}
        y[yo] = acc;
      }
    }
}

double round_to(double v, DType t) {
  switch (t) {
    case DType::kF32: return (float)v;
    case DType::kBF16: return (double)__bfloat162float(__float2bfloat16((float)v));
    case DType::kF16: return (double)__half2float(__float2half((float)v));
    default: return v;
  }
}
std::vector<char> pack(const std::vector<double>& v, DType t) {
  std::vector<char> b(v.size() * dtype_bytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case DType::kF64: ((double*)b.data())[i] = v[i]; break;
      case DType::kF32: ((float*)b.data())[i] = (float)v[i]; break;
      case DType::kBF16: ((__nv_bfloat16*)b.data())[i] = __float2bfloat16((float)v[i]); break;
      case DType::kF16: ((__half*)b.data())[i] = __float2half((float)v[i]); break;
    }
  }
  return b;
}
double unpack1(const char* b, size_t i, DType t) {
  switch (t) {
    case DType::kF64: return ((const double*)b)[i];
    case DType::kF32: return ((const float*)b)[i];
    case DType::kBF16: return __bfloat162float(((const __nv_bfloat16*)b)[i]);
    case DType::kF16: return __half2float(((const __half*)b)[i]);
  }
  return 0;
}

void* dev_upload(const std::vector<char>& b) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(b.size(), 16)));
  if (!b.empty()) CK(cudaMemcpy(p, b.data(), b.size(), cudaMemcpyHostToDevice));
  return p;
}

int g_fail = 0, g_run = 0;

void check_case(const Case& cs, DType in, DType out, double tol, std::mt19937& rng) {
  ConvProblem p = make(cs);
  if (std::string v = validate_problem(p); !v.empty()) { printf("BAD CASE %s: %s\n", cs.name, v.c_str()); g_fail++; return; }
  std::uniform_real_distribution<double> U(-1, 1);
  std::vector<double> x(p.x_elems()), w(p.w_elems()), dy(p.y_elems());
  for (auto& v : x) v = round_to(U(rng), in);
  for (auto& v : w) v = round_to(U(rng), in);
  for (auto& v : dy) v = round_to(U(rng), in);
  std::vector<double> ry, rdx, rdw;
  reference(p, x, w, dy, ry, rdx, rdw);
  void* dx_ = dev_upload(pack(x, in)); void* dw_ = dev_upload(pack(w, in)); void* ddy = dev_upload(pack(dy, in));
  for (int op = 0; op < 3; ++op) {
    CudaConvCall call{(ConvOp)op, ConvAlgo::kDirect, p, in, out, MathPrecision::kHighest};
    std::string why = can_implement(call);
    if (!why.empty()) { printf("REJECT %-28s op=%d in=%d out=%d: %s\n", cs.name, op, (int)in, (int)out, why.c_str()); g_fail++; continue; }
    size_t ws = workspace_bytes(call);
    const std::vector<double>& ref = op == 0 ? ry : op == 1 ? rdx : rdw;
    size_t nout = ref.size();
    void* o = nullptr; CK(cudaMalloc(&o, std::max<size_t>(nout * dtype_bytes(out), 16)));
    CK(cudaMemset(o, 0x7f, std::max<size_t>(nout * dtype_bytes(out), 16)));  // garbage
    void* wsp = nullptr; if (ws) CK(cudaMalloc(&wsp, ws));
    CudaConvBuffers io{op == 1 ? ddy : dx_, op == 0 ? dw_ : op == 1 ? dw_ : ddy, o, wsp, ws, 0};
    std::string err = run_conv(call, io);
    CK(cudaDeviceSynchronize());
    g_run++;
    if (!err.empty()) { printf("ERROR %s op=%d: %s\n", cs.name, op, err.c_str()); g_fail++; }
    else {
      std::vector<char> hb(nout * dtype_bytes(out));
      if (nout) CK(cudaMemcpy(hb.data(), o, hb.size(), cudaMemcpyDeviceToHost));
      double maxref = 0, maxerr = 0;
      for (size_t i = 0; i < nout; ++i) {
        double g = unpack1(hb.data(), i, out);
        maxref = std::max(maxref, std::fabs(ref[i]));
        double e = std::fabs(g - ref[i]);
        if (!(e == e)) e = 1e30;
        maxerr = std::max(maxerr, e);
      }
      double rel = maxref > 0 ? maxerr / maxref : maxerr;
      bool ok = rel <= tol;
      if (!ok) g_fail++;
      if (!ok || getenv("VERBOSE"))
        printf("%s %-28s op=%d in=%d out=%d ws=%zu n=%zu rel=%.3g\n", ok ? "ok  " : "FAIL", cs.name, op, (int)in, (int)out, ws, nout, rel);
    }
    CK(cudaFree(o)); if (wsp) CK(cudaFree(wsp));
  }
  CK(cudaFree(dx_)); CK(cudaFree(dw_)); CK(cudaFree(ddy));
}

std::vector<Case> cases() {
  const Layout H = Layout::kNHWC, C = Layout::kNCHW;
  return {
    {"nhwc_dw3x3_s1", H, 2, 2, 16, 16, 16, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nhwc_dw3x3_s2_asym", H, 2, 2, 16, 16, 16, {9, 10}, {3, 3}, {2, 2}, {1, 1}, {}, {0, 1}, {1, 2}},
    {"nhwc_dw_mult2", H, 2, 2, 8, 16, 8, {7, 9}, {3, 3}, {1, 2}, {1, 1}, {}, {1, 1}, {1, 0}},
    {"nhwc_dw_mult2_c16", H, 2, 1, 16, 32, 16, {6, 5}, {3, 2}, {1, 1}, {1, 1}, {}, {1, 0}, {1, 1}},
    {"nhwc_dw_dil2_odd", H, 2, 1, 24, 24, 24, {11, 7}, {3, 3}, {1, 1}, {2, 2}, {}, {2, 2}, {2, 1}},
    {"nhwc_dw_c12", H, 2, 2, 12, 12, 12, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nhwc_dw_s3", H, 2, 2, 16, 16, 16, {10, 11}, {3, 3}, {3, 3}, {1, 1}, {}, {1, 2}, {0, 1}},
    {"nhwc_dw_5x5", H, 2, 1, 16, 16, 16, {9, 9}, {5, 5}, {1, 1}, {1, 1}, {}, {2, 2}, {2, 2}},
    {"nhwc_grp4_c4k8", H, 2, 2, 16, 32, 4, {8, 9}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nhwc_grp2_s2", H, 2, 2, 16, 8, 2, {10, 9}, {3, 3}, {2, 2}, {1, 1}, {}, {1, 0}, {1, 1}},
    {"nhwc_grp2_s3_dil2", H, 2, 1, 8, 16, 2, {13, 14}, {3, 3}, {3, 3}, {2, 2}, {}, {2, 1}, {1, 2}},
    {"nhwc_grp32_resnext", H, 2, 2, 128, 128, 32, {6, 7}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nhwc_dense_5x5_s3", H, 2, 1, 8, 12, 1, {13, 11}, {5, 5}, {3, 3}, {1, 1}, {}, {2, 1}, {1, 2}},
    {"nhwc_dense_1x1", H, 2, 2, 16, 8, 1, {5, 6}, {1, 1}, {1, 1}, {1, 1}, {}, {0, 0}, {0, 0}},
    {"nhwc_g2_c6k10", H, 2, 2, 6, 10, 2, {7, 8}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nhwc_1d_s2_dil2", H, 1, 3, 8, 8, 1, {17}, {5}, {2}, {2}, {}, {3}, {2}},
    {"nhwc_1d_dw", H, 1, 2, 16, 16, 16, {20}, {7}, {1}, {1}, {}, {3}, {3}},
    {"nhwc_3d_dw27", H, 3, 1, 8, 8, 8, {5, 6, 7}, {3, 3, 3}, {1, 2, 1}, {1, 1, 1}, {}, {1, 1, 1}, {1, 0, 1}},
    {"nhwc_3d_grp2", H, 3, 2, 8, 8, 2, {5, 4, 6}, {2, 2, 2}, {2, 2, 2}, {1, 1, 1}, {}, {0, 1, 0}, {1, 0, 1}},
    {"nhwc_3d_dw133", H, 3, 2, 16, 16, 16, {4, 6, 6}, {1, 3, 3}, {2, 1, 2}, {1, 1, 1}, {}, {0, 1, 1}, {0, 1, 1}},
    {"nhwc_lhs2", H, 2, 2, 8, 8, 2, {5, 6}, {3, 3}, {1, 2}, {1, 1}, {2, 2}, {2, 1}, {2, 2}},
    {"nhwc_negpad", H, 2, 1, 8, 8, 1, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {}, {-1, 0}, {1, -2}},
    {"nhwc_dw_negpad", H, 2, 1, 16, 16, 16, {9, 9}, {3, 3}, {1, 2}, {1, 1}, {}, {-1, 1}, {0, -1}},
    {"nhwc_N0", H, 2, 0, 16, 16, 16, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nhwc_grp_N0", H, 2, 0, 16, 16, 4, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nhwc_out0", H, 2, 1, 8, 8, 2, {2, 2}, {3, 3}, {1, 1}, {1, 1}, {}, {0, 0}, {0, 0}},
    {"nhwc_N1_odd", H, 2, 1, 4, 4, 1, {3, 5}, {2, 3}, {1, 1}, {1, 1}, {}, {0, 1}, {1, 1}},
    {"nhwc_dw_big", H, 2, 4, 32, 32, 32, {20, 20}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nhwc_grp_big", H, 2, 4, 32, 32, 8, {20, 20}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nchw_dense", C, 2, 2, 3, 5, 1, {7, 8}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nchw_dw_s2", C, 2, 2, 6, 6, 6, {9, 8}, {3, 3}, {2, 2}, {1, 1}, {}, {1, 1}, {1, 0}},
    {"nchw_dw_mult2", C, 2, 1, 4, 8, 4, {6, 7}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"nchw_grp4_dil2", C, 2, 2, 8, 16, 4, {9, 9}, {3, 3}, {1, 1}, {2, 2}, {}, {2, 2}, {2, 2}},
    {"nchw_1d", C, 1, 2, 4, 6, 2, {15}, {4}, {3}, {1}, {}, {2}, {1}},
    {"nchw_3d", C, 3, 1, 4, 4, 1, {4, 5, 6}, {2, 3, 2}, {1, 2, 2}, {1, 1, 2}, {}, {1, 1, 1}, {0, 1, 1}},
    {"nchw_lhs2_s2", C, 2, 1, 4, 4, 2, {5, 5}, {3, 3}, {2, 1}, {1, 2}, {2, 3}, {1, 2}, {2, 0}},
    {"nchw_N0", C, 2, 0, 4, 4, 1, {5, 5}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    // depthwise multiplier 1 (dws kernels): borders, odd W, strides, dilations, wide filters
    {"dws_3x3_oddW", H, 2, 2, 16, 16, 16, {7, 13}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_3x3_W1", H, 2, 3, 16, 16, 16, {5, 1}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_3x3_W2_nopad", H, 2, 1, 8, 8, 8, {4, 4}, {3, 3}, {1, 1}, {1, 1}, {}, {0, 0}, {0, 0}},
    {"dws_3x3_s2", H, 2, 2, 24, 24, 24, {11, 17}, {3, 3}, {2, 2}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_3x3_s2_pad01", H, 2, 1, 16, 16, 16, {12, 12}, {3, 3}, {2, 2}, {1, 1}, {}, {0, 0}, {1, 1}},
    {"dws_3x3_s12", H, 2, 2, 16, 16, 16, {9, 10}, {3, 3}, {1, 2}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_3x3_s21", H, 2, 2, 16, 16, 16, {9, 10}, {3, 3}, {2, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_3x3_s3", H, 2, 1, 16, 16, 16, {10, 14}, {3, 3}, {3, 3}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_3x3_dil2", H, 2, 2, 16, 16, 16, {10, 13}, {3, 3}, {1, 1}, {2, 2}, {}, {2, 2}, {2, 2}},
    {"dws_3x3_dil2_s2", H, 2, 1, 16, 16, 16, {11, 12}, {3, 3}, {2, 2}, {2, 2}, {}, {2, 1}, {1, 2}},
    {"dws_3x3_dilH2", H, 2, 1, 16, 16, 16, {11, 12}, {3, 3}, {1, 1}, {2, 1}, {}, {2, 1}, {2, 1}},
    {"dws_5x5", H, 2, 2, 16, 16, 16, {9, 11}, {5, 5}, {1, 1}, {1, 1}, {}, {2, 2}, {2, 2}},
    {"dws_5x5_s2", H, 2, 1, 16, 16, 16, {13, 14}, {5, 5}, {2, 2}, {1, 1}, {}, {2, 2}, {1, 2}},
    {"dws_7x7", H, 2, 1, 16, 16, 16, {9, 15}, {7, 7}, {1, 1}, {1, 1}, {}, {3, 3}, {3, 3}},
    {"dws_7x7_dil2", H, 2, 1, 8, 8, 8, {15, 16}, {7, 7}, {1, 1}, {2, 2}, {}, {6, 5}, {6, 7}},
    {"dws_1x7", H, 2, 2, 16, 16, 16, {5, 12}, {1, 7}, {1, 1}, {1, 1}, {}, {0, 3}, {0, 3}},
    {"dws_7x1", H, 2, 2, 16, 16, 16, {12, 5}, {7, 1}, {1, 1}, {1, 1}, {}, {3, 0}, {3, 0}},
    {"dws_3x2_asym", H, 2, 2, 16, 16, 16, {8, 9}, {3, 2}, {1, 1}, {1, 1}, {}, {1, 0}, {1, 1}},
    {"dws_1x9_fallback", H, 2, 1, 16, 16, 16, {4, 12}, {1, 9}, {1, 1}, {1, 1}, {}, {0, 4}, {0, 4}},
    {"dws_negpad", H, 2, 1, 16, 16, 16, {9, 11}, {3, 3}, {1, 1}, {1, 1}, {}, {-1, -1}, {1, 0}},
    {"dws_bigpad", H, 2, 1, 16, 16, 16, {5, 6}, {3, 3}, {1, 1}, {1, 1}, {}, {3, 4}, {2, 3}},
    {"dws_N1_c144", H, 2, 1, 144, 144, 144, {14, 14}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_c1040_chunks", H, 2, 1, 1040, 1040, 1040, {5, 6}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_c1040_s2", H, 2, 1, 1040, 1040, 1040, {6, 7}, {3, 3}, {2, 2}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_c20_f32only", H, 2, 2, 20, 20, 20, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_c7_fallback", H, 2, 2, 7, 7, 7, {6, 7}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_mult2_s1", H, 2, 2, 16, 32, 16, {9, 10}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_1d_k3_s2", H, 1, 2, 16, 16, 16, {23}, {3}, {2}, {1}, {}, {1}, {1}},
    {"dws_1d_k5", H, 1, 2, 16, 16, 16, {23}, {5}, {1}, {1}, {}, {2}, {2}},
    // tiled wgrad (dws_wgrad_tile_kernel): more tiles than blocks (the cp.async pipeline runs),
    // partial edge tiles, R = 2 and 1-D
    {"dws_many_tiles", H, 2, 9, 16, 16, 16, {64, 61}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
    {"dws_2x3", H, 2, 2, 24, 24, 24, {9, 11}, {2, 3}, {1, 1}, {1, 1}, {}, {0, 1}, {1, 1}},
    {"dws_1d_k3", H, 1, 3, 16, 16, 16, {37}, {3}, {1}, {1}, {}, {1}, {1}},
    {"dws_3d_133", H, 3, 1, 16, 16, 16, {3, 6, 9}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {}, {0, 1, 1}, {0, 1, 1}},
    {"dws_3d_333", H, 3, 1, 16, 16, 16, {4, 5, 9}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {}, {1, 1, 1}, {1, 1, 1}},
    {"dws_3d_313_s2", H, 3, 1, 16, 16, 16, {5, 4, 9}, {3, 1, 3}, {2, 1, 2}, {1, 1, 1}, {}, {1, 0, 1}, {1, 0, 1}},
    {"dws_big_56", H, 2, 2, 48, 48, 48, {30, 29}, {3, 3}, {1, 1}, {1, 1}, {}, {1, 1}, {1, 1}},
  };
}

// ---- timing ----
struct Layer { const char* name; int64_t N, C, K, H, W, R, S, st, pad, G; };

void bench(const Layer& L, FILE* csv, DType T = DType::kBF16) {
  ConvProblem p;
  p.layout = Layout::kNHWC; p.spatial_dims = 2; p.N = L.N; p.C = L.C; p.K = L.K; p.G = L.G;
  p.in[1] = L.H; p.in[2] = L.W; p.filt[1] = L.R; p.filt[2] = L.S;
  p.stride[1] = p.stride[2] = L.st; p.pad_lo[1] = p.pad_lo[2] = p.pad_hi[1] = p.pad_hi[2] = L.pad;
  for (int i = 0; i < 3; ++i) p.out[i] = conv_output_size(p.in[i], p.filt[i], p.stride[i], p.dilation[i], 1, p.pad_lo[i], p.pad_hi[i]);
  const int NB = 6;
  const size_t eb = dtype_bytes(T);
  size_t bx = p.x_elems() * eb, bw = p.w_elems() * eb, by = p.y_elems() * eb;
  std::vector<void*> X(NB), W(NB), Y(NB), DX(NB), DY(NB), DW(NB);
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> U(-1, 1);
  auto randbuf = [&](size_t elems) { std::vector<double> v(elems); for (auto& e : v) e = U(rng); return dev_upload(pack(v, T)); };
  for (int i = 0; i < NB; ++i) {
    X[i] = randbuf(p.x_elems()); W[i] = randbuf(p.w_elems()); DY[i] = randbuf(p.y_elems());
    CK(cudaMalloc(&Y[i], by)); CK(cudaMalloc(&DX[i], bx)); CK(cudaMalloc(&DW[i], bw));
  }
  void* bias = randbuf(p.K);
  cudaStream_t s; CK(cudaStreamCreate(&s));
  // ops 0-2: fwd, dgrad, wgrad; 3: fwd + bias + relu; 4: fwd + bias + residual + relu (the
  // residual is the dy buffer: output-sized)
  for (int op = 0; op < 5; ++op) {
    const int cop = op > 2 ? 0 : op;
    CudaConvCall call{(ConvOp)cop, ConvAlgo::kDirect, p, T, T, MathPrecision::kDefault};
    size_t ws = workspace_bytes(call);
    void* wsp = nullptr; if (ws) CK(cudaMalloc(&wsp, ws));
    const int iters = 200;
    std::vector<cudaEvent_t> ev(iters + 1);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    auto launch = [&](int i) {
      int b = i % NB;
      CudaConvBuffers io{cop == 1 ? DY[b] : X[b], cop == 2 ? DY[b] : W[b], cop == 0 ? Y[b] : cop == 1 ? DX[b] : DW[b], wsp, ws, s};
      if (op > 2) io.epi.bias = bias, io.epi.activation = Activation::kRelu;
      if (op == 4) io.epi.residual = DY[(b + 1) % NB];
      std::string e = run_conv(call, io);
      if (!e.empty()) { printf("bench error: %s\n", e.c_str()); exit(1); }
    };
    for (int i = 0; i < 20; ++i) launch(i);
    std::vector<float> t(iters);
    CK(cudaEventRecord(ev[0], s));
    for (int i = 0; i < iters; ++i) { launch(i); CK(cudaEventRecord(ev[i + 1], s)); }
    CK(cudaEventSynchronize(ev[iters]));
    for (int i = 0; i < iters; ++i) CK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
    std::sort(t.begin(), t.end());
    double med = t[iters / 2];
    double bytes = (op == 4 ? by : 0) + (cop == 0 ? bx + bw + by : cop == 1 ? by + bw + bx : bx + by + bw);
    const char* on[5] = {"fwd", "dgrad", "wgrad", "fwd+bias+relu", "fwd+b+res+relu"};
    printf("BENCH %-14s %-4s %-14s median %.4f ms  min %.4f  p90 %.4f  %.0f GB/s  (%.1f MB, ws %.2f MB)\n", L.name, T == DType::kF32 ? "f32" : "bf16", on[op], med, t[0], t[iters * 9 / 10],
           bytes / (med * 1e-3) / 1e9, bytes / 1e6, ws / 1e6);
    if (csv) fprintf(csv, "%s,%s,%s,%.5f,%.5f,%.1f\n", L.name, T == DType::kF32 ? "f32" : "bf16", on[op], med, t[0], bytes / (med * 1e-3) / 1e9);
    for (auto& e : ev) CK(cudaEventDestroy(e));
    if (wsp) CK(cudaFree(wsp));
  }
  for (int i = 0; i < NB; ++i) { cudaFree(X[i]); cudaFree(W[i]); cudaFree(Y[i]); cudaFree(DX[i]); cudaFree(DY[i]); cudaFree(DW[i]); }
  cudaFree(bias);
  cudaStreamDestroy(s);
}

// Captures a depthwise wgrad (two kernels) and a dgrad into a CUDA graph, replays, compares.
void graph_check() {
  ConvProblem p = make(cases()[27]);  // nhwc_dw_big
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> U(-1, 1);
  std::vector<double> x(p.x_elems()), w(p.w_elems()), dy(p.y_elems());
  for (auto& v : x) v = round_to(U(rng), DType::kBF16);
  for (auto& v : w) v = round_to(U(rng), DType::kBF16);
  for (auto& v : dy) v = round_to(U(rng), DType::kBF16);
  std::vector<double> ry, rdx, rdw;
  reference(p, x, w, dy, ry, rdx, rdw);
  void* dx_ = dev_upload(pack(x, DType::kBF16)); void* ddy = dev_upload(pack(dy, DType::kBF16));
  CudaConvCall call{ConvOp::kBackwardFilter, ConvAlgo::kDirect, p, DType::kBF16, DType::kF32, MathPrecision::kDefault};
  size_t ws = workspace_bytes(call);
  void* wsp; CK(cudaMalloc(&wsp, ws));
  void* o; CK(cudaMalloc(&o, p.w_elems() * 4)); CK(cudaMemset(o, 0, p.w_elems() * 4));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  std::string err = run_conv(call, CudaConvBuffers{dx_, ddy, o, wsp, ws, s});
  CK(cudaStreamEndCapture(s, &g));
  if (!err.empty()) { printf("GRAPH capture error %s\n", err.c_str()); g_fail++; return; }
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  std::vector<float> h(p.w_elems());
  CK(cudaMemcpy(h.data(), o, h.size() * 4, cudaMemcpyDeviceToHost));
  double me = 0, mr = 0;
  for (size_t i = 0; i < h.size(); ++i) { me = std::max(me, std::fabs(h[i] - rdw[i])); mr = std::max(mr, std::fabs(rdw[i])); }
  // determinism: run again eagerly and compare bitwise
  std::vector<float> h2(p.w_elems());
  run_conv(call, CudaConvBuffers{dx_, ddy, o, wsp, ws, s});
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(h2.data(), o, h2.size() * 4, cudaMemcpyDeviceToHost));
  bool same = memcmp(h.data(), h2.data(), h.size() * 4) == 0;
  printf("GRAPH wgrad replay rel=%.3g bitwise-repeatable=%d\n", me / mr, (int)same);
  if (me / mr > 1e-5 || !same) g_fail++;
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g); cudaStreamDestroy(s);
  cudaFree(dx_); cudaFree(ddy); cudaFree(wsp); cudaFree(o);
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && !strcmp(argv[1], "quick");
  bool do_bench = argc > 2 && !strcmp(argv[2], "bench");  // (not under emulation)
  std::mt19937 rng(42);
  struct DT { DType in, out; double tol; };
  std::vector<DT> dts = {{DType::kF64, DType::kF64, 1e-12}, {DType::kF32, DType::kF32, 1e-5},
                         {DType::kBF16, DType::kBF16, 1e-2}, {DType::kF16, DType::kF16, 3e-3},
                         {DType::kBF16, DType::kF32, 1e-5}, {DType::kF16, DType::kF32, 1e-5}};
  auto cs = cases();
  const bool none = argc > 1 && !strcmp(argv[1], "none");  // timings only (profiling)
  if (none) cs.clear();
  if (quick) {
    std::vector<Case> q;
    for (auto& c : cs) {
      std::string n = c.name;
      if (n == "nhwc_dw3x3_s2_asym" || n == "nhwc_dw_mult2" || n == "nhwc_grp2_s2" || n == "nhwc_grp2_s3_dil2" ||
          n == "nhwc_lhs2" || n == "nchw_dw_s2" || n == "nhwc_out0" || n == "nhwc_N0" || n == "nhwc_dw_negpad" || n == "nhwc_1d_s2_dil2" ||
          n == "dws_3x3_oddW" || n == "dws_3x3_s2" || n == "dws_7x7_dil2" || n == "dws_c1040_s2" || n == "dws_3d_313_s2" || n == "dws_bigpad" ||
          n == "dws_many_tiles" || n == "dws_2x3")
        q.push_back(c);
    }
    cs = q;
    dts = {{DType::kF32, DType::kF32, 1e-5}, {DType::kBF16, DType::kF32, 1e-5}, {DType::kF16, DType::kF16, 3e-3}};
  }
  for (auto& d : dts)
    for (auto& c : cs) check_case(c, d.in, d.out, d.tol, rng);
  // Rejections
  if (!none) {
    ConvProblem p = make(cs[0]);
    CudaConvCall c1{ConvOp::kForward, ConvAlgo::kDirect, p, DType::kF32, DType::kBF16, MathPrecision::kDefault};
    printf("reject f32->bf16: '%s'\n", can_implement(c1).c_str());
    CudaConvCall c2{ConvOp::kForward, ConvAlgo::kWinograd, p, DType::kF32, DType::kF32, MathPrecision::kDefault};
    printf("reject winograd: '%s'\n", can_implement(c2).c_str());
  }
#ifdef JAXDNN_DIRECT_EMULATION
  do_bench = false;
  printf("LAUNCHES:");
  for (const auto& [name, n] : emu::launch_counts) printf(" %s=%ld", name.c_str(), n);
  printf("\n");
#else
  if (!none) graph_check();
#endif
  printf("CORRECTNESS: %d runs, %d failures\n", g_run, g_fail);
  if (do_bench) {
    FILE* csv = fopen(getenv("BENCH_CSV") ? getenv("BENCH_CSV") : "/dev/null", "w");
    bench({"mnv2_dw_3x3", 32, 144, 144, 56, 56, 3, 3, 1, 1, 144}, csv);
    bench({"mnv2_dw_3x3", 32, 144, 144, 56, 56, 3, 3, 1, 1, 144}, csv, DType::kF32);
    bench({"resnext_g32", 32, 128, 128, 56, 56, 3, 3, 1, 1, 32}, csv);
    bench({"dw_s2_96", 32, 96, 96, 112, 112, 3, 3, 2, 1, 96}, csv);
    bench({"dw_5x5_240", 32, 240, 240, 28, 28, 5, 5, 1, 2, 240}, csv);
    if (csv) fclose(csv);
  }
  return g_fail ? 1 : 0;
}
