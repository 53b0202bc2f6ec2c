// Standalone check of the CUDA WINOGRAD_NONFUSED and WINOGRAD families through run_conv: fp64
// host reference over many geometries, every dtype, forward / backward-data / backward-filter
// of both families, refusals, bitwise repeatability of backward-filter; then timings.
// Usage: check [quick|full|none|sweep] [bench]   (none: timings only; sweep: the float32 error of
// NONFUSED F(4x4), F(6x6), F(2x2) and the fused tensor-core F(4x4) against the reduction length,
// C/G or K/G = 16 .. SWEEP_MAX_C (default 2048), printed per case)
// Each line: ok/FAIL, case, family, op, dtypes, tile, rel = ||out - ref|| / ||ref|| against the
// stated bound, and max = max |out - ref| / max |ref|. Exits nonzero on any failure.
// Built with nvcc by run.sh, or with g++ against tests/cuda/winograd/emu (emulate.sh); it links
// conv_winograd.cu alone and calls the family's entry points.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "conv_cuda.h"

using namespace jaxdnn;
using namespace jaxdnn::cuda;

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__);           \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

// The family's own entry points (not conv_cuda.cu's dispatch, so that this check links only
// conv_winograd.cu); the checks the dispatch adds (validate_problem, dtype pairs) hold for every
// call made here.
std::string wino_can_implement(const CudaConvCall& c) {
  if (std::string v = validate_problem(c.problem); !v.empty()) return v;
  return winograd_can_implement(c);
}
size_t wino_workspace_bytes(const CudaConvCall& c) { return winograd_workspace_bytes(c); }
// Forward and backward-data take U = G w G^T (the jaxdnn_winograd_filter call) in place of w: made
// here on the call's stream into a buffer kept across calls (grown when needed; a growth
// synchronizes, so timed loops reuse the size of their warm-up), so timings include the
// transform as the two FFI calls of one convolution do.
std::string wino_run(const CudaConvCall& c, const CudaConvBuffers& io) {
  if (std::string why = wino_can_implement(c); !why.empty()) return why;
  if (io.workspace_size < wino_workspace_bytes(c)) return "workspace too small";
  if (!takes_winograd_filter(c.op, c.algo)) return winograd_run(c, io);
  static void* u = nullptr;
  static size_t u_bytes = 0;
  int tile = 0;
  int64_t dims[4];
  winograd_filter_shape(c, &tile, dims);
  const size_t need = static_cast<size_t>(dims[0] * dims[1] * dims[2] * dims[3]) *
                      dtype_bytes(winograd_filter_dtype(c.in, c.out));
  if (need > u_bytes) {
    if (u) CK(cudaFree(u));
    CK(cudaMalloc(&u, need));
    u_bytes = need;
  }
  if (std::string e = winograd_filter_run(c.problem, tile, c.op == ConvOp::kBackwardData, c.in,
                                          io.b, u, io.stream);
      !e.empty())
    return "filter transform: " + e;
  CudaConvBuffers uio = io;
  uio.b = u;
  return winograd_run(c, uio);
}


struct Case {
  const char* name;
  Layout layout;
  int nsd;
  int64_t N, C, K, G;
  std::vector<int64_t> in, filt, plo, phi;
};

ConvProblem make(const Case& c) {
  ConvProblem p;
  p.layout = c.layout, p.spatial_dims = c.nsd, p.N = c.N, p.C = c.C, p.K = c.K, p.G = c.G;
  auto fill = [&](const std::vector<int64_t>& v, int64_t* dst, int64_t def) {
    for (int i = 0; i < 3; ++i) dst[i] = def;
    for (int i = 0; i < c.nsd; ++i) dst[3 - c.nsd + i] = v.empty() ? def : v[i];
  };
  fill(c.in, p.in, 1), fill(c.filt, p.filt, 1), fill(c.plo, p.pad_lo, 0), fill(c.phi, p.pad_hi, 0);
  for (int i = 0; i < 3; ++i)
    p.out[i] = conv_output_size(p.in[i], p.filt[i], 1, 1, 1, p.pad_lo[i], p.pad_hi[i]);
  return p;
}

int64_t aoff(const ConvProblem& p, int64_t n, int64_t c, int64_t d, int64_t h, int64_t w,
             int64_t ch, const int64_t* sp) {
  if (p.layout == Layout::kNHWC) return (((n * sp[0] + d) * sp[1] + h) * sp[2] + w) * ch + c;
  return (((n * ch + c) * sp[0] + d) * sp[1] + h) * sp[2] + w;
}
int64_t woff(const ConvProblem& p, int64_t k, int64_t ci, int64_t t, int64_t r, int64_t s) {
  if (p.layout == Layout::kNHWC)
    return (((t * p.filt[1] + r) * p.filt[2] + s) * p.Cg() + ci) * p.K + k;
  return (((k * p.Cg() + ci) * p.filt[0] + t) * p.filt[1] + r) * p.filt[2] + s;
}

// All three faces in fp64 by one loop over (output pixel, tap, channel) (stride 1, no dilation).
void reference(const ConvProblem& p, const std::vector<double>& x, const std::vector<double>& w,
               const std::vector<double>& dy, std::vector<double>& y, std::vector<double>& dx,
               std::vector<double>& dw) {
  y.assign(p.y_elems(), 0), dx.assign(p.x_elems(), 0), dw.assign(p.w_elems(), 0);
  auto src = [&](int ax, int64_t o, int64_t f) -> int64_t {
    const int64_t j = o - p.pad_lo[ax] + f;
    return j >= 0 && j < p.in[ax] ? j : -1;
  };
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t g = k / p.Kg();
      for (int64_t z = 0; z < p.out[0]; ++z)
        for (int64_t pp = 0; pp < p.out[1]; ++pp)
          for (int64_t q = 0; q < p.out[2]; ++q) {
            const int64_t yo = aoff(p, n, k, z, pp, q, p.K, p.out);
            double acc = 0;
            for (int64_t t = 0; t < p.filt[0]; ++t) {
              const int64_t id = src(0, z, t);
              if (id < 0) continue;
              for (int64_t r = 0; r < p.filt[1]; ++r) {
                const int64_t ih = src(1, pp, r);
                if (ih < 0) continue;
                for (int64_t s = 0; s < p.filt[2]; ++s) {
                  const int64_t iw = src(2, q, s);
                  if (iw < 0) continue;
                  for (int64_t ci = 0; ci < p.Cg(); ++ci) {
                    const int64_t xo = aoff(p, n, g * p.Cg() + ci, id, ih, iw, p.C, p.in);
                    const int64_t wo = woff(p, k, ci, t, r, s);
                    acc += x[xo] * w[wo];
                    dx[xo] += dy[yo] * w[wo];
                    dw[wo] += x[xo] * dy[yo];
                  }
                }
              }
            }
            y[yo] = acc;
          }
    }
}

double round_to(double v, DType t) {
  switch (t) {
    case DType::kF32: return (float)v;
    case DType::kBF16: return (double)__bfloat162float(__float2bfloat16_rn((float)v));
    case DType::kF16: return (double)__half2float(__float2half_rn((float)v));
    default: return v;
  }
}
std::vector<char> pack(const std::vector<double>& v, DType t) {
  std::vector<char> b(v.size() * dtype_bytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case DType::kF64: ((double*)b.data())[i] = v[i]; break;
      case DType::kF32: ((float*)b.data())[i] = (float)v[i]; break;
      case DType::kBF16: ((__nv_bfloat16*)b.data())[i] = __float2bfloat16_rn((float)v[i]); break;
      case DType::kF16: ((__half*)b.data())[i] = __float2half_rn((float)v[i]); break;
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
const char* dname(DType t) {
  switch (t) {
    case DType::kF64: return "f64";
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}
const char* opname[3] = {"fwd", "dgrad", "wgrad"};

void* dev_upload(const std::vector<char>& b) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(b.size(), 16)));
  if (!b.empty()) CK(cudaMemcpy(p, b.data(), b.size(), cudaMemcpyHostToDevice));
  return p;
}

int g_fail = 0, g_run = 0;
bool g_verbose = false;  // print ok lines too (VERBOSE=1, and the bench's error lines)

// The tile F(m x m) NONFUSED uses for this pass (the CPU's rule), for the log line.
int tile_of(const ConvProblem& p, int op, ConvAlgo algo) {
  if (algo == ConvAlgo::kWinograd) return op != 2 && p.tile == 4 ? 4 : 2;
  if (p.tile != 0) return p.tile;
  const int64_t P = op == 1 ? p.in[1] : p.out[1], Q = op == 1 ? p.in[2] : p.out[2];
  return std::min(P, Q) >= 4 ? 4 : 2;
}

// Bound on ||out - ref|| / ||ref|| (tests/tolerances.py's ALGO_RTOL / TILE_RTOL, by result
// dtype; F(6x6) has its own float32 bound).
double bound(DType out, int tile = 0) {
  switch (out) {
    case DType::kF64: return 1e-12;
    case DType::kF32: return tile == 6 ? 5e-5 : 1e-5;
    case DType::kBF16: return 2e-2;
    case DType::kF16: return 5e-3;
  }
  return 0;
}

// Runs one call into a fresh (garbage-filled) output; returns the host copy, or empty on error.
std::vector<char> run_one(const CudaConvCall& call, const void* a, const void* b, size_t nout,
                          std::string* err) {
  const size_t ws = wino_workspace_bytes(call);
  const size_t ob = std::max<size_t>(nout * dtype_bytes(call.out), 16);
  void* o = nullptr;
  CK(cudaMalloc(&o, ob));
  CK(cudaMemset(o, 0x7f, ob));
  void* wsp = nullptr;
  if (ws) {
    CK(cudaMalloc(&wsp, ws));
    CK(cudaMemset(wsp, 0x7f, ws));  // the kernels must not read workspace they did not write
  }
  CudaConvBuffers io{a, b, o, wsp, ws, 0};
  *err = wino_run(call, io);
  CK(cudaDeviceSynchronize());
  std::vector<char> hb(nout * dtype_bytes(call.out));
  if (err->empty() && nout) CK(cudaMemcpy(hb.data(), o, hb.size(), cudaMemcpyDeviceToHost));
  CK(cudaFree(o));
  if (wsp) CK(cudaFree(wsp));
  return hb;
}

// What check_case runs: NONFUSED with the backend's tile choice and with an explicit tile
// (ConvProblem::tile: F(6x6), and F(2x2) where the default would be F(4x4)), and each of the
// fused family's kernels by its tile: F(2x2) (FFMA/DFMA) and F(4x4) (tensor cores, in its scope).
// The fused family's default routing (F(4x4) where it applies) is test_lowering_cuda's.
struct Variant {
  const char* name;
  ConvAlgo algo;
  int tile;
};
const Variant kVariants[] = {{"NONFUSED", ConvAlgo::kWinogradNonfused, 0},
                             {"FUSED", ConvAlgo::kWinograd, 2},  // the F(2x2) kernel
                             {"NF_F6", ConvAlgo::kWinogradNonfused, 6},
                             {"NF_F2", ConvAlgo::kWinogradNonfused, 2},
                             {"FUSED_F4", ConvAlgo::kWinograd, 4}};
// rel of every fp32 case run, by "case|variant|op" (the BENCH lines print it beside the time).
std::map<std::string, double> g_rel;
bool g_skip_fused = false;  // sweep mode: the NONFUSED variants and FUSED_F4 only

void check_case(const Case& cs, DType in, DType out, std::mt19937& rng) {
  const ConvProblem p = make(cs);
  if (std::string v = validate_problem(p); !v.empty()) {
    printf("BAD CASE %s: %s\n", cs.name, v.c_str());
    g_fail++;
    return;
  }
  std::uniform_real_distribution<double> U(-1, 1);
  std::vector<double> x(p.x_elems()), w(p.w_elems()), dy(p.y_elems());
  for (auto& v : x) v = round_to(U(rng), in);
  for (auto& v : w) v = round_to(U(rng), in);
  for (auto& v : dy) v = round_to(U(rng), in);
  std::vector<double> ry, rdx, rdw;
  reference(p, x, w, dy, ry, rdx, rdw);
  void* dx_ = dev_upload(pack(x, in));
  void* dw_ = dev_upload(pack(w, in));
  void* ddy = dev_upload(pack(dy, in));
  for (const Variant& var : kVariants) {
    const ConvAlgo algo = var.algo;
    const char* an = var.name;
    if (g_skip_fused && algo == ConvAlgo::kWinograd && var.tile != 4) continue;
    ConvProblem pv = p;
    pv.tile = var.tile;
    for (int op = 0; op < 3; ++op) {
      const CudaConvCall call{(ConvOp)op, algo, pv, in, out, MathPrecision::kHighest};
      const std::string why = wino_can_implement(call);
      if (var.tile == 6 && in != DType::kF32 && in != DType::kF64) {
        // F(6x6) is float32 / float64 only: the refusal must say so.
        const bool ok = why.find("F(6x6") != std::string::npos;
        if (!ok) {
          printf("FAIL %-26s %s %s %s: expected the F(6x6) dtype refusal, got '%s'\n", cs.name,
                 an, opname[op], dname(in), why.c_str());
          g_fail++;
        }
        continue;
      }
      if (algo == ConvAlgo::kWinograd && var.tile == 4 && op == 2) continue;  // = FUSED's F(2x2)
      if (algo == ConvAlgo::kWinograd && var.tile == 4 &&
          (in == DType::kF64 || p.layout != Layout::kNHWC ||
           (op == 1 ? p.K : p.C) / p.G % 8 != 0)) {
        // The tensor-core F(4x4) kernel's scope: the refusal must say why.
        if (why.find("F(4x4") == std::string::npos) {
          printf("FAIL %-26s %s %s %s: expected the F(4x4) scope refusal, got '%s'\n", cs.name,
                 an, opname[op], dname(in), why.c_str());
          g_fail++;
        }
        continue;
      }
      if (!why.empty()) {
        printf("FAIL %-26s %s %s refused: %s\n", cs.name, an, opname[op], why.c_str());
        g_fail++;
        continue;
      }
      const std::vector<double>& ref = op == 0 ? ry : op == 1 ? rdx : rdw;
      std::string err;
      const std::vector<char> hb =
          run_one(call, op == 1 ? ddy : dx_, op == 2 ? ddy : dw_, ref.size(), &err);
      g_run++;
      if (!err.empty()) {
        printf("FAIL %-26s %s %s error: %s\n", cs.name, an, opname[op], err.c_str());
        g_fail++;
        continue;
      }
      double maxref = 0, maxerr = 0, se = 0, sr = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double gv = unpack1(hb.data(), i, out);
        double e = std::fabs(gv - ref[i]);
        if (!(e == e)) e = 1e300;
        maxref = std::max(maxref, std::fabs(ref[i]));
        maxerr = std::max(maxerr, e);
        se += e * e, sr += ref[i] * ref[i];
      }
      const double rel = sr > 0 ? std::sqrt(se / sr) : std::sqrt(se);
      const double mx = maxref > 0 ? maxerr / maxref : maxerr;
      const int tile = tile_of(pv, op, algo);
      const bool ok = rel <= bound(out, tile);
      if (in == DType::kF32 && out == DType::kF32)
        g_rel[std::string(cs.name) + "|" + an + "|" + opname[op]] = rel;
      if (!ok) g_fail++;
      if (!ok || g_verbose)
        printf("%s %-26s %-8s %-5s %s->%s F(%dx%d) ws=%zu rel=%.3g (bound %.0e) max=%.3g\n",
               ok ? "ok  " : "FAIL", cs.name, an, opname[op], dname(in), dname(out), tile, tile,
               wino_workspace_bytes(call), rel, bound(out, tile), mx);
    }
  }
  CK(cudaFree(dx_));
  CK(cudaFree(dw_));
  CK(cudaFree(ddy));
}

std::vector<Case> cases() {
  const Layout H = Layout::kNHWC, C = Layout::kNCHW;
  // name, layout, spatial dims, N, C, K, G, input, filter, pad_lo, pad_hi
  return {
      {"nhwc_same_9x11", H, 2, 2, 8, 16, 1, {9, 11}, {3, 3}, {1, 1}, {1, 1}},
      {"nchw_same_9x11", C, 2, 2, 8, 16, 1, {9, 11}, {3, 3}, {1, 1}, {1, 1}},
      {"nhwc_c3_k5_odd", H, 2, 2, 3, 5, 1, {13, 7}, {3, 3}, {1, 1}, {1, 1}},
      {"nchw_c1_k3_valid", C, 2, 3, 1, 3, 1, {10, 9}, {3, 3}, {0, 0}, {0, 0}},
      {"nhwc_c1_k1", H, 2, 2, 1, 1, 1, {6, 8}, {3, 3}, {1, 1}, {1, 1}},
      {"nhwc_img1x1", H, 2, 2, 3, 2, 1, {1, 1}, {3, 3}, {1, 1}, {1, 1}},
      {"nhwc_img2x3", H, 2, 1, 1, 2, 1, {2, 3}, {3, 3}, {1, 1}, {1, 1}},
      {"nchw_img3x3_valid", C, 2, 2, 4, 4, 1, {3, 3}, {3, 3}, {0, 0}, {0, 0}},
      {"nhwc_4x13_mixed", H, 2, 1, 2, 3, 1, {4, 13}, {3, 3}, {0, 1}, {0, 1}},
      {"nhwc_groups3", H, 2, 2, 6, 9, 3, {8, 9}, {3, 3}, {1, 1}, {1, 1}},
      {"nchw_groups2", C, 2, 1, 4, 6, 2, {10, 7}, {3, 3}, {1, 1}, {1, 1}},
      {"nhwc_depthwise", H, 2, 2, 4, 4, 4, {7, 7}, {3, 3}, {1, 1}, {1, 1}},
      {"nchw_negpad_asym", C, 2, 2, 4, 3, 1, {10, 11}, {3, 3}, {-1, 3}, {2, -1}},
      {"nhwc_pad_beyond", H, 2, 1, 2, 3, 1, {6, 6}, {3, 3}, {4, 0}, {0, 5}},
      {"nhwc_3d_slices", H, 3, 2, 2, 3, 1, {3, 5, 6}, {1, 3, 3}, {0, 1, 1}, {0, 1, 1}},
      {"nchw_3d_slices", C, 3, 1, 3, 2, 1, {2, 6, 5}, {1, 3, 3}, {0, 1, 1}, {0, 0, 1}},
      {"nhwc_N0", H, 2, 0, 4, 4, 1, {8, 8}, {3, 3}, {1, 1}, {1, 1}},
      // channel counts past one GEMM tile / fused block, several M blocks
      {"nhwc_c40_k136", H, 2, 2, 40, 136, 1, {12, 10}, {3, 3}, {1, 1}, {1, 1}},
      {"nchw_c136_k40", C, 2, 1, 136, 40, 1, {9, 14}, {3, 3}, {1, 1}, {1, 1}},
      {"nhwc_g2_c72_k72", H, 2, 1, 72, 72, 2, {17, 16}, {3, 3}, {1, 1}, {1, 1}},
      // GEMM K past the cp.async ring (17 BK steps, K tail of 8), wide and narrow N
      {"nhwc_c264_k72", H, 2, 1, 264, 72, 1, {10, 12}, {3, 3}, {1, 1}, {1, 1}},
      {"nchw_c72_k264", C, 2, 1, 72, 264, 1, {9, 6}, {3, 3}, {1, 1}, {1, 1}},
      // many tiles: several GEMM M blocks, wgrad splits
      {"nhwc_many_tiles", H, 2, 4, 8, 8, 1, {64, 64}, {3, 3}, {1, 1}, {1, 1}},
      // inside the tensor-core fused F(4x4) scope (channels-last, channels per group % 8 == 0):
      // groups, negative / asymmetric padding, an image smaller than a tile, depth slices,
      // K past one 32-channel block with a tail, 16 chunks of 8 channels
      {"nhwc_g3_c24_k48", H, 2, 2, 24, 48, 3, {11, 9}, {3, 3}, {1, 1}, {1, 1}},
      {"nhwc_c8_negpad_asym", H, 2, 2, 8, 8, 1, {10, 11}, {3, 3}, {-1, 3}, {2, -1}},
      {"nhwc_c8_img2x3", H, 2, 3, 8, 16, 1, {2, 3}, {3, 3}, {1, 1}, {1, 1}},
      {"nhwc_c8_3d_slices", H, 3, 2, 8, 8, 1, {3, 6, 9}, {1, 3, 3}, {0, 1, 1}, {0, 1, 1}},
      {"nhwc_c128_k40_tiles", H, 2, 3, 128, 40, 1, {13, 21}, {3, 3}, {1, 1}, {1, 1}},
      {"nchw_many_tiles", C, 2, 2, 16, 24, 1, {46, 50}, {3, 3}, {1, 1}, {1, 1}},
  };
}

const char* kQuick[] = {"nhwc_c3_k5_odd", "nchw_negpad_asym", "nhwc_groups3", "nhwc_img2x3",
                        "nhwc_3d_slices", "nhwc_c40_k136", "nchw_c1_k3_valid",
                        "nhwc_c264_k72", "nhwc_g3_c24_k48", "nhwc_c8_negpad_asym",
                        "nhwc_c8_img2x3"};

// Refusals: each must come back with a reason naming what is wrong.
void check_refusals() {
  struct R {
    const char* what;
    Case c;
    int op;
    ConvAlgo algo;
    const char* needle;
  };
  const Layout H = Layout::kNHWC;
  const ConvAlgo NF = ConvAlgo::kWinogradNonfused;
  std::vector<R> rs = {
      {"5x5", {"", H, 2, 1, 4, 4, 1, {9, 9}, {5, 5}, {2, 2}, {2, 2}}, 0, NF, "3x3"},
      {"1-D", {"", H, 1, 1, 4, 4, 1, {9}, {3}, {1}, {1}}, 0, NF, "3x3"},
      {"3x3x3", {"", H, 3, 1, 4, 4, 1, {4, 5, 5}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}}, 0, NF, "depth"},
      {"depth pad", {"", H, 3, 1, 4, 4, 1, {4, 5, 5}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}}, 2, NF,
       "depth"},
  };
  for (auto& r : rs) {
    const CudaConvCall call{(ConvOp)r.op, r.algo, make(r.c), DType::kF32, DType::kF32,
                            MathPrecision::kHighest};
    const std::string why = wino_can_implement(call);
    const bool ok = why.find(r.needle) != std::string::npos;
    printf("%s refuse %-12s '%s'\n", ok ? "ok  " : "FAIL", r.what, why.c_str());
    if (!ok) g_fail++;
  }
  // An explicit tile on the fused family, and a tile that does not exist.
  {
    ConvProblem pt = make({"", H, 2, 1, 4, 4, 1, {9, 9}, {3, 3}, {1, 1}, {1, 1}});
    pt.tile = 6;
    std::string why = wino_can_implement({ConvOp::kForward, ConvAlgo::kWinograd, pt, DType::kF32,
                                          DType::kF32, MathPrecision::kHighest});
    // winograd_can_implement refuses the tiles the fused family has no kernel for (it runs 2 and
    // 4 from C++ callers); through conv_cuda.cu's common_checks, tile_unsupported refuses every
    // explicit tile of the fused family (the API does not offer one): both must refuse.
    bool ok = why.find("F(2x2,3x3) or F(4x4,3x3)") != std::string::npos &&
              tile_unsupported(ConvAlgo::kWinograd, pt).find("takes no output tile") !=
                  std::string::npos;
    printf("%s refuse fused+tile   '%s'\n", ok ? "ok  " : "FAIL", why.c_str());
    if (!ok) g_fail++;
    pt.tile = 3;
    why = wino_can_implement({ConvOp::kForward, ConvAlgo::kWinogradNonfused, pt, DType::kF32,
                              DType::kF32, MathPrecision::kHighest});
    ok = why.find("tile must be 2, 4 or 6") != std::string::npos;
    printf("%s refuse tile3        '%s'\n", ok ? "ok  " : "FAIL", why.c_str());
    if (!ok) g_fail++;
  }
  // Strides and dilations (set directly: make() builds stride-1 problems).
  ConvProblem p = make({"", H, 2, 1, 4, 4, 1, {9, 9}, {3, 3}, {1, 1}, {1, 1}});
  p.stride[2] = 2, p.out[2] = conv_output_size(9, 3, 2, 1, 1, 1, 1);
  std::string why = wino_can_implement({ConvOp::kForward, ConvAlgo::kWinogradNonfused, p,
                                        DType::kF32, DType::kF32, MathPrecision::kHighest});
  printf("%s refuse stride2      '%s'\n",
         why.find("strides") != std::string::npos ? "ok  " : "FAIL", why.c_str());
  if (why.find("strides") == std::string::npos) g_fail++;
  p = make({"", H, 2, 1, 4, 4, 1, {9, 9}, {3, 3}, {2, 2}, {2, 2}});
  p.dilation[1] = p.dilation[2] = 2;
  for (int i = 1; i < 3; ++i) p.out[i] = conv_output_size(9, 3, 1, 2, 1, 2, 2);
  why = wino_can_implement({ConvOp::kBackwardData, ConvAlgo::kWinograd, p, DType::kBF16,
                            DType::kBF16, MathPrecision::kDefault});
  printf("%s refuse dilation2    '%s'\n",
         why.find("rhs_dilation") != std::string::npos ? "ok  " : "FAIL", why.c_str());
  if (why.find("rhs_dilation") == std::string::npos) g_fail++;
}

// Backward-filter with several splits (NONFUSED) or tile slices (fused): run twice, compare
// bitwise.
void check_repeatable() {
  const ConvProblem p = make({"", Layout::kNHWC, 2, 4, 8, 8, 1, {64, 64}, {3, 3}, {1, 1}, {1, 1}});
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> U(-1, 1);
  std::vector<double> x(p.x_elems()), dy(p.y_elems());
  for (auto& v : x) v = U(rng);
  for (auto& v : dy) v = U(rng);
  void* dx_ = dev_upload(pack(x, DType::kF32));
  void* ddy = dev_upload(pack(dy, DType::kF32));
  for (const Variant& var : kVariants) {
    const ConvAlgo algo = var.algo;
    ConvProblem pv = p;
    pv.tile = var.tile;
    const CudaConvCall call{ConvOp::kBackwardFilter, algo, pv, DType::kF32, DType::kF32,
                            MathPrecision::kHighest};
    std::string e1, e2;
    const auto a = run_one(call, dx_, ddy, p.w_elems(), &e1);
    const auto b = run_one(call, dx_, ddy, p.w_elems(), &e2);
    const bool ok = e1.empty() && e2.empty() && a == b;
    printf("%s %s wgrad bitwise repeatable (ws %zu bytes) %s%s\n", ok ? "ok  " : "FAIL",
           var.name, wino_workspace_bytes(call), e1.c_str(), e2.c_str());
    if (!ok) g_fail++;
  }
  CK(cudaFree(dx_));
  CK(cudaFree(ddy));
}

#ifndef JAXDNN_WINO_EMULATION
// ---- timing ----
// Uniform(-1, 1) values from a hash of (seed, index), filled on the device (bench sizes are too
// large for a host generator to stay within the script's time).
template <typename T>
__global__ void fill_kernel(T* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed * 0x85EBCA77u;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    const float v = (h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) p[i] = __float2bfloat16_rn(v);
    else p[i] = static_cast<T>(v);
  }
}

void* dev_random(size_t n, DType t, uint32_t seed) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n * dtype_bytes(t), 16)));
  if (t == DType::kF32) fill_kernel<<<1024, 256>>>(static_cast<float*>(p), n, seed);
  else fill_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  CK(cudaGetLastError());
  return p;
}

struct Layer {
  const char* name;
  int64_t N, C, K, H, W;
};

void bench(const Layer& L, DType T, Layout layout, const Variant& var, FILE* csv) {
  const ConvAlgo algo = var.algo;
  // BENCH_LAYERS (names, comma-separated), BENCH_ITERS, BENCH_MAIN_ONLY (fp32 NHWC
  // WINOGRAD_NONFUSED alone) and BENCH_VARIANT narrow the table, e.g. for ncu.
  if (const char* only = getenv("BENCH_LAYERS"); only && !strstr(only, L.name)) return;
  if (getenv("BENCH_MAIN_ONLY") && (T != DType::kF32 || layout != Layout::kNHWC ||
                                    algo != ConvAlgo::kWinogradNonfused || var.tile != 0))
    return;
  // BENCH_NHWC_F32: float32 channels-last rows alone (any variant).
  if (getenv("BENCH_NHWC_F32") && (T != DType::kF32 || layout != Layout::kNHWC)) return;
  // BENCH_VARIANT=NAME: that variant's rows alone (e.g. FUSED_F4, both dtypes).
  if (const char* v = getenv("BENCH_VARIANT"); v && strcmp(v, var.name) != 0) return;
  ConvProblem p;
  p.layout = layout, p.spatial_dims = 2, p.N = L.N, p.C = L.C, p.K = L.K, p.G = 1;
  p.in[1] = L.H, p.in[2] = L.W, p.filt[1] = p.filt[2] = 3;
  p.pad_lo[1] = p.pad_lo[2] = p.pad_hi[1] = p.pad_hi[2] = 1;
  p.out[1] = L.H, p.out[2] = L.W;
  p.tile = var.tile;
  const int NB = 2, iters = getenv("BENCH_ITERS") ? std::max(2, atoi(getenv("BENCH_ITERS"))) : 20;
  const size_t eb = dtype_bytes(T);
  std::vector<void*> X(NB), W(NB), DY(NB), O(NB);
  uint32_t seed = 1;
  auto randbuf = [&](size_t n) { return dev_random(n, T, seed++); };
  const size_t omax = std::max({p.x_elems(), p.y_elems(), p.w_elems()}) * eb;
  for (int i = 0; i < NB; ++i) {
    X[i] = randbuf(p.x_elems()), W[i] = randbuf(p.w_elems()), DY[i] = randbuf(p.y_elems());
    CK(cudaMalloc(&O[i], omax));
  }
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const double flops = 2.0 * p.macs();
  for (int op = 0; op < 3; ++op) {
    const CudaConvCall call{(ConvOp)op, algo, p, T, T, MathPrecision::kHighest};
    if (!wino_can_implement(call).empty()) continue;
    if (algo == ConvAlgo::kWinograd && var.tile == 4 && op == 2) continue;  // FUSED's F(2x2)
    const size_t ws = wino_workspace_bytes(call);
    void* wsp = nullptr;
    if (ws) CK(cudaMalloc(&wsp, ws));
    auto launch = [&](int i) {
      const int b = i % NB;
      CudaConvBuffers io{op == 1 ? DY[b] : X[b], op == 2 ? DY[b] : W[b], O[b], wsp, ws, s};
      const std::string e = wino_run(call, io);
      if (!e.empty()) {
        printf("bench error: %s\n", e.c_str());
        exit(1);
      }
    };
    for (int i = 0; i < 3; ++i) launch(i);
    std::vector<cudaEvent_t> ev(iters + 1);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    CK(cudaEventRecord(ev[0], s));
    for (int i = 0; i < iters; ++i) {
      launch(i);
      CK(cudaEventRecord(ev[i + 1], s));
    }
    CK(cudaEventSynchronize(ev[iters]));
    std::vector<float> t(iters);
    for (int i = 0; i < iters; ++i) CK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
    std::sort(t.begin(), t.end());
    const double med = t[iters / 2];
    const char* an = var.name;
    const char* ln = layout == Layout::kNHWC ? "nhwc" : "nchw";
    // The error measured on one image of this layer (fp32 NHWC, before the timings), if any.
    const auto it = g_rel.find(std::string(L.name) + "|" + an + "|" + opname[op]);
    char err[32] = "";
    if (T == DType::kF32 && it != g_rel.end()) snprintf(err, sizeof(err), "  err %.2e", it->second);
    printf("BENCH %-12s %-8s %s %-4s %-5s F(%dx%d) median %.4f ms  min %.4f  %.2f TFLOP/s  "
           "(ws %.1f MB)%s\n",
           L.name, an, ln, dname(T), opname[op], tile_of(p, op, algo), tile_of(p, op, algo), med,
           t[0], flops / (med * 1e-3) / 1e12, ws / 1e6, err);
    if (csv)
      // layer,family,layout,dtype,op,median,min,tflops (sweep.sh reads these), then tile,err
      fprintf(csv, "%s,%s,%s,%s,%s,%.5f,%.5f,%.3f,%d,%s\n", L.name, an, ln, dname(T), opname[op],
              med, t[0], flops / (med * 1e-3) / 1e12, tile_of(p, op, algo),
              T == DType::kF32 && it != g_rel.end() ? std::to_string(it->second).c_str() : "");
    for (auto& e : ev) CK(cudaEventDestroy(e));
    if (wsp) CK(cudaFree(wsp));
  }
  for (int i = 0; i < NB; ++i) {
    CK(cudaFree(X[i]));
    CK(cudaFree(W[i]));
    CK(cudaFree(DY[i]));
    CK(cudaFree(O[i]));
  }
  CK(cudaStreamDestroy(s));
}
#endif

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // progress visible in logs, even when killed
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");
  const bool none = argc > 1 && !strcmp(argv[1], "none");
  const bool do_bench = argc > 2 && !strcmp(argv[2], "bench");
  std::mt19937 rng(42);
  if (argc > 1 && !strcmp(argv[1], "sweep")) {
    // Error growth with the reduction length: forward and backward-data reduce over C/G and K/G
    // (one case each way), backward-filter over the tiles.
    g_verbose = true, g_skip_fused = true;
    const int64_t cmax = getenv("SWEEP_MAX_C") ? atoll(getenv("SWEEP_MAX_C")) : 2048;
    std::vector<std::string> names;
    for (int64_t c = 16; c <= cmax; c *= 2)
      for (int way = 0; way < 2; ++way)
        names.push_back((way ? "sweep_c16_k" : "sweep_k16_c") + std::to_string(c));
    for (const std::string& n : names) {
      const int64_t c = atoll(n.c_str() + 11);
      const bool wide_c = n[6] == 'k';  // "sweep_k16_c..": C = c, K = 16
      const Case cs{n.c_str(), Layout::kNHWC, 2, 2, wide_c ? c : 16, wide_c ? 16 : c, 1,
                    {12, 12}, {3, 3}, {1, 1}, {1, 1}};
      check_case(cs, DType::kF32, DType::kF32, rng);
    }
    printf("SWEEP: %d runs, %d failures\n", g_run, g_fail);
    return g_fail ? 1 : 0;
  }
  struct DT {
    DType in, out;
  };
  std::vector<DT> dts = {{DType::kF64, DType::kF64},   {DType::kF32, DType::kF32},
                         {DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF16},
                         {DType::kBF16, DType::kF32},  {DType::kF16, DType::kF32}};
  g_verbose = getenv("VERBOSE") != nullptr;
  std::vector<Case> cs = cases();
  if (const char* only = getenv("WINO_CASE")) {
    std::vector<Case> q;
    for (auto& c : cs)
      if (!strcmp(c.name, only)) q.push_back(c);
    cs = q;
  }
  if (none) cs.clear();
  if (quick) {
    std::vector<Case> q;
    for (auto& c : cs)
      for (const char* n : kQuick)
        if (!strcmp(c.name, n)) q.push_back(c);
    cs = q;
    dts = {{DType::kF32, DType::kF32}, {DType::kF64, DType::kF64}, {DType::kBF16, DType::kF32},
           {DType::kF16, DType::kF16}};
  }
  if (const char* d = getenv("WINO_DTYPES")) {  // e.g. WINO_DTYPES=f64,f32
    std::vector<DT> q;
    for (auto& t : dts)
      if (strstr(d, dname(t.in)) && t.in == t.out) q.push_back(t);
    dts = q;
  }
  for (auto& d : dts)
    for (auto& c : cs) check_case(c, d.in, d.out, rng);
  if (!none && !getenv("WINO_CASE")) {
    check_refusals();
    check_repeatable();
  }
  printf("CORRECTNESS: %d runs, %d failures\n", g_run, g_fail);
#ifdef JAXDNN_WINO_EMULATION
  printf("LAUNCHES:");  // kernel=count, so that tests see which kernels ran
  for (const auto& [name, count] : emu::launch_counts) printf(" %s=%ld", name.c_str(), count);
  printf("\n");
  (void)do_bench;
#else
  if (do_bench) {
    FILE* csv = fopen(getenv("BENCH_CSV") ? getenv("BENCH_CSV") : "/dev/null", "w");
    const Layer layers[] = {{"vgg_c3_2", 32, 256, 256, 56, 56},
                            {"r50_c3_3x3", 32, 128, 128, 28, 28},
                            {"r50_c4_3x3", 32, 256, 256, 14, 14},
                            {"r50_c5_3x3", 32, 512, 512, 7, 7},
                            {"r50_c2_3x3", 32, 64, 64, 56, 56},
                            {"vgg_c1_2", 32, 64, 64, 224, 224}};
    // Errors against float64 on one image of each layer (fp32, HIGHEST; both families).
    // BENCH_NO_REF=1 skips them (host fp64 references: seconds per layer; sweep.sh).
    g_verbose = true;
    for (const Layer& L : layers) {
      if (getenv("BENCH_NO_REF")) break;
      if (const char* only = getenv("BENCH_LAYERS"); only && !strstr(only, L.name)) continue;
      const Case one{L.name, Layout::kNHWC, 2, 1, L.C, L.K, 1, {L.H, L.W}, {3, 3}, {1, 1}, {1, 1}};
      check_case(one, DType::kF32, DType::kF32, rng);
    }
    const Variant& nf = kVariants[0];
    const Variant& fused = kVariants[1];
    const Variant& f6 = kVariants[2];
    const Variant& f4 = kVariants[4];  // fused F(4x4) on the tensor cores
    for (const Layer& L : layers) {
      bench(L, DType::kF32, Layout::kNHWC, nf, csv);
      bench(L, DType::kF32, Layout::kNHWC, f6, csv);  // F(6x6) beside F(4x4)
      bench(L, DType::kF32, Layout::kNCHW, nf, csv);
      bench(L, DType::kF32, Layout::kNCHW, f6, csv);
      bench(L, DType::kBF16, Layout::kNHWC, nf, csv);
      bench(L, DType::kF32, Layout::kNHWC, fused, csv);
      bench(L, DType::kF32, Layout::kNHWC, f4, csv);
      bench(L, DType::kBF16, Layout::kNHWC, f4, csv);
    }
    if (csv) fclose(csv);
  }
#endif
  if (do_bench) printf("FINAL: %d runs, %d failures\n", g_run, g_fail);
  return g_fail ? 1 : 0;
}
