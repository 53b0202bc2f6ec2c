// Standalone check of the CUDA FFT and FFT_TILING families through run_conv: an fp64 host
// reference over many geometries, both families, all three operations, every dtype; then
// timings. Usage: check [quick|full|none] [bench]   (none: timings only)
// Each run prints "ok" or "FAIL" with its max error relative to the largest reference value and
// the bound; the exit status is nonzero on any failure. JAXDNN_FFT_CHUNK_BYTES (read by the
// kernels) cuts the rows into chunks; run.sh runs the quick set with a tiny value.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "conv_cuda.h"
#include "host_fp.h"

using namespace jaxdnn;
using namespace jaxdnn::cuda;

#define CK(x)                                                                 \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__);       \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

struct Case {
  const char* name;
  Layout layout;
  int nsd;
  int64_t N, C, K, G;
  std::vector<int64_t> in, filt, plo, phi;
  bool fft = true;  // FFT (whole image) supports it; FFT_TILING always must
};

ConvProblem make(const Case& c) {
  ConvProblem p;
  p.layout = c.layout;
  p.spatial_dims = c.nsd;
  p.N = c.N, p.C = c.C, p.K = c.K, p.G = c.G;
  auto fill = [&](const std::vector<int64_t>& v, int64_t* dst, int64_t def) {
    for (int i = 0; i < 3; ++i) dst[i] = def;
    for (int i = 0; i < c.nsd; ++i) dst[3 - c.nsd + i] = v.empty() ? def : v[i];
  };
  fill(c.in, p.in, 1);
  fill(c.filt, p.filt, 1);
  fill(c.plo, p.pad_lo, 0);
  fill(c.phi, p.pad_hi, 0);
  for (int i = 0; i < 3; ++i)
    p.out[i] = conv_output_size(p.in[i], p.filt[i], 1, 1, 1, p.pad_lo[i], p.pad_hi[i]);
  return p;
}

int64_t aoff(const ConvProblem& p, int64_t n, int64_t c, const int64_t sp[3], const int64_t j[3],
             int64_t ch) {
  if (p.layout == Layout::kNHWC)
    return (((n * sp[0] + j[0]) * sp[1] + j[1]) * sp[2] + j[2]) * ch + c;
  return (((n * ch + c) * sp[0] + j[0]) * sp[1] + j[1]) * sp[2] + j[2];
}
int64_t woff(const ConvProblem& p, int64_t k, int64_t ci, const int64_t f[3]) {
  if (p.layout == Layout::kNHWC)
    return (((f[0] * p.filt[1] + f[1]) * p.filt[2] + f[2]) * p.Cg() + ci) * p.K + k;
  return (((k * p.Cg() + ci) * p.filt[0] + f[0]) * p.filt[1] + f[1]) * p.filt[2] + f[2];
}

// One scatter loop computing all three faces in fp64 (stride 1, no dilation).
void reference(const ConvProblem& p, const std::vector<double>& x, const std::vector<double>& w,
               const std::vector<double>& dy, std::vector<double>& y, std::vector<double>& dx,
               std::vector<double>& dw) {
  y.assign(p.y_elems(), 0);
  dx.assign(p.x_elems(), 0);
  dw.assign(p.w_elems(), 0);
  int64_t o[3], f[3], i[3];
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t g = k / p.Kg();
      for (o[0] = 0; o[0] < p.out[0]; ++o[0])
        for (o[1] = 0; o[1] < p.out[1]; ++o[1])
          for (o[2] = 0; o[2] < p.out[2]; ++o[2]) {
            const int64_t yo = aoff(p, n, k, p.out, o, p.K);
            double acc = 0;
            for (f[0] = 0; f[0] < p.filt[0]; ++f[0])
              for (f[1] = 0; f[1] < p.filt[1]; ++f[1])
                for (f[2] = 0; f[2] < p.filt[2]; ++f[2]) {
                  bool inside = true;
                  for (int a = 0; a < 3; ++a) {
                    i[a] = o[a] + f[a] - p.pad_lo[a];
                    inside = inside && i[a] >= 0 && i[a] < p.in[a];
                  }
                  if (!inside) continue;
                  for (int64_t ci = 0; ci < p.Cg(); ++ci) {
                    const int64_t xo = aoff(p, n, g * p.Cg() + ci, p.in, i, p.C);
                    const int64_t wo = woff(p, k, ci, f);
                    acc += x[xo] * w[wo];
                    dx[xo] += dy[yo] * w[wo];
                    dw[wo] += x[xo] * dy[yo];
                  }
                }
            y[yo] = acc;
          }
    }
}

double round_to(double v, DType t) {
  switch (t) {
    case DType::kF32: return static_cast<float>(v);
    case DType::kBF16: return hostfp::bf16_to_float(hostfp::float_to_bf16(static_cast<float>(v)));
    case DType::kF16: return hostfp::f16_to_float(hostfp::float_to_f16(static_cast<float>(v)));
    default: return v;
  }
}
std::vector<char> pack(const std::vector<double>& v, DType t) {
  std::vector<char> b(v.size() * dtype_bytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case DType::kF64: reinterpret_cast<double*>(b.data())[i] = v[i]; break;
      case DType::kF32: reinterpret_cast<float*>(b.data())[i] = static_cast<float>(v[i]); break;
      case DType::kBF16:
        reinterpret_cast<uint16_t*>(b.data())[i] = hostfp::float_to_bf16(static_cast<float>(v[i]));
        break;
      case DType::kF16:
        reinterpret_cast<uint16_t*>(b.data())[i] = hostfp::float_to_f16(static_cast<float>(v[i]));
        break;
    }
  }
  return b;
}
double unpack1(const char* b, size_t i, DType t) {
  switch (t) {
    case DType::kF64: return reinterpret_cast<const double*>(b)[i];
    case DType::kF32: return reinterpret_cast<const float*>(b)[i];
    case DType::kBF16: return hostfp::bf16_to_float(reinterpret_cast<const uint16_t*>(b)[i]);
    case DType::kF16: return hostfp::f16_to_float(reinterpret_cast<const uint16_t*>(b)[i]);
  }
  return 0;
}
const char* dname(DType t) {
  switch (t) {
    case DType::kF64: return "f64";
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    default: return "f16";
  }
}

void* dev_upload(const std::vector<char>& b) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(b.size(), 16)));
  if (!b.empty()) CK(cudaMemcpy(p, b.data(), b.size(), cudaMemcpyHostToDevice));
  return p;
}

int g_fail = 0, g_run = 0;
const char* kOpName[3] = {"fwd", "dgrad", "wgrad"};

void check_case(const Case& cs, DType in, DType out, double tol, std::mt19937& rng) {
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
  for (ConvAlgo algo : {ConvAlgo::kFft, ConvAlgo::kFftTiling})
    for (int op = 0; op < 3; ++op) {
      const CudaConvCall call{static_cast<ConvOp>(op), algo, p, in, out, MathPrecision::kHighest};
      const std::string why = can_implement(call);
      const char* an = algo == ConvAlgo::kFft ? "FFT" : "FFT_TILING";
      if (algo == ConvAlgo::kFft && !cs.fft) {  // must be refused, naming FFT_TILING
        const bool ok = why.find("use FFT_TILING") != std::string::npos;
        printf("%s %-30s %-10s %-5s refused as expected: %s\n", ok ? "ok  " : "FAIL", cs.name, an,
               kOpName[op], why.c_str());
        g_fail += ok ? 0 : 1;
        continue;
      }
      if (!why.empty()) {
        printf("FAIL %-30s %-10s %-5s %s->%s refused: %s\n", cs.name, an, kOpName[op], dname(in),
               dname(out), why.c_str());
        g_fail++;
        continue;
      }
      const size_t ws = workspace_bytes(call);
      const std::vector<double>& ref = op == 0 ? ry : op == 1 ? rdx : rdw;
      const size_t nout = ref.size(), ob = std::max<size_t>(nout * dtype_bytes(out), 16);
      void* o = nullptr;
      CK(cudaMalloc(&o, ob));
      CK(cudaMemset(o, 0x7f, ob));  // garbage: every element must be written
      void* wsp = nullptr;
      if (ws) CK(cudaMalloc(&wsp, ws));
      CudaConvBuffers io{op == 1 ? ddy : dx_, op == 2 ? ddy : dw_, o, wsp, ws, 0};
      const std::string err = run_conv(call, io);
      CK(cudaDeviceSynchronize());
      g_run++;
      if (!err.empty()) {
        printf("FAIL %-30s %-10s %-5s error: %s\n", cs.name, an, kOpName[op], err.c_str());
        g_fail++;
      } else {
        std::vector<char> hb(nout * dtype_bytes(out));
        if (nout) CK(cudaMemcpy(hb.data(), o, hb.size(), cudaMemcpyDeviceToHost));
        double maxref = 0, maxerr = 0;
        for (size_t i = 0; i < nout; ++i) {
          const double g = unpack1(hb.data(), i, out);
          maxref = std::max(maxref, std::fabs(ref[i]));
          double e = std::fabs(g - ref[i]);
          if (!(e == e)) e = 1e30;
          maxerr = std::max(maxerr, e);
        }
        const double rel = maxref > 0 ? maxerr / maxref : maxerr;
        const bool ok = rel <= tol;
        g_fail += ok ? 0 : 1;
        printf("%s %-30s %-10s %-5s %4s->%-4s ws=%-9zu n=%-7zu rel=%.2e bound %.0e\n",
               ok ? "ok  " : "FAIL", cs.name, an, kOpName[op], dname(in), dname(out), ws, nout,
               rel, tol);
      }
      CK(cudaFree(o));
      if (wsp) CK(cudaFree(wsp));
    }
  CK(cudaFree(dx_));
  CK(cudaFree(dw_));
  CK(cudaFree(ddy));
}

std::vector<Case> cases() {
  const Layout H = Layout::kNHWC, C = Layout::kNCHW;
  return {
      {"inc5x5_small", H, 2, 2, 8, 16, 1, {12, 12}, {5, 5}, {2, 2}, {2, 2}},
      {"odd_7x9_c3k4", H, 2, 2, 3, 4, 1, {7, 9}, {3, 3}, {1, 1}, {1, 1}},
      {"image_smaller_than_filter", H, 2, 2, 3, 2, 1, {2, 3}, {5, 5}, {2, 2}, {2, 2}},
      {"1x1_image_c3", H, 2, 2, 3, 2, 1, {1, 1}, {3, 3}, {1, 1}, {1, 1}},
      {"c1_k1_nchw", C, 2, 1, 1, 1, 1, {9, 10}, {3, 4}, {1, 2}, {1, 1}},
      {"c3_k1_valid_nchw", C, 2, 2, 3, 1, 1, {9, 6}, {5, 3}, {0, 0}, {0, 0}},
      {"negpad_asym", H, 2, 2, 4, 3, 1, {11, 9}, {3, 3}, {-1, 2}, {1, -2}},
      {"pad_beyond_filter", H, 2, 1, 2, 3, 1, {5, 6}, {3, 3}, {3, 4}, {2, 5}},
      {"groups2_c6k10", H, 2, 2, 6, 10, 2, {8, 7}, {3, 3}, {1, 1}, {1, 1}},
      {"depthwise5x5_nchw", C, 2, 2, 8, 8, 8, {9, 9}, {5, 5}, {2, 2}, {2, 2}},
      {"groups3_nchw", C, 2, 1, 9, 6, 3, {6, 8}, {2, 3}, {0, 1}, {1, 1}},
      {"filter_1x3", H, 2, 2, 5, 3, 1, {6, 7}, {1, 3}, {0, 1}, {0, 1}},
      {"filter_4x2_even", H, 2, 1, 3, 3, 1, {10, 9}, {4, 2}, {2, 0}, {1, 1}},
      {"c40_k72_wide", H, 2, 2, 40, 72, 1, {10, 10}, {3, 3}, {1, 1}, {1, 1}},
      // 33 channels: one past the fp32 channel-product slab of 32; 65 past the 64-wide tile.
      {"c33_k65_nchw", C, 2, 3, 33, 65, 1, {6, 5}, {3, 2}, {1, 0}, {1, 1}},
      // A 4-tap filter in 16-point transforms: its window ends exactly at L / 4 (2 stages
      // skipped); 3-D with lengths 16 x 8 x 4 (the filter's: 3, 2 and 1 stages left).
      {"filter4_skip_edge", H, 2, 2, 3, 5, 1, {13, 13}, {4, 4}, {1, 2}, {2, 1}},
      {"3d_16x8x4_groups3", C, 3, 1, 6, 3, 3, {12, 6, 2}, {5, 3, 2}, {2, 1, 0}, {2, 1, 1}},
      {"1d_filter31", H, 1, 2, 2, 3, 1, {300}, {31}, {15}, {15}},
      {"1d_filter255_nchw", C, 1, 1, 1, 4, 1, {1000}, {255}, {127}, {127}},
      {"1d_groups2", H, 1, 2, 4, 6, 2, {40}, {7}, {3}, {2}},
      {"3d_nhwc", H, 3, 1, 2, 3, 1, {4, 5, 6}, {3, 2, 3}, {1, 0, 1}, {1, 1, 1}},
      {"3d_nchw_groups2", C, 3, 2, 4, 2, 2, {3, 6, 5}, {2, 3, 3}, {1, 1, 0}, {0, 1, 2}},
      {"tiles_not_multiple_70x45", H, 2, 2, 4, 4, 1, {70, 45}, {5, 5}, {2, 2}, {2, 2}, false},
      {"1d_long_5000_tiled", H, 1, 1, 1, 2, 1, {5000}, {101}, {50}, {50}, false},
      {"out_empty", H, 2, 2, 3, 2, 1, {2, 2}, {5, 5}, {0, 0}, {0, 0}},
      {"batch0", H, 2, 0, 3, 2, 1, {5, 5}, {3, 3}, {1, 1}, {1, 1}},
  };
}

#ifndef JAXDNN_FFT_EMULATION
// ---- timing: median of per-launch cudaEvent times; error of the timed fp32 results against
// fp64 at sampled output elements ----
struct Layer {
  const char* name;
  int nsd;
  int64_t N, C, K, H, W, R, S, pad;
};

ConvProblem layer_problem(const Layer& L) {
  ConvProblem p;
  p.layout = Layout::kNHWC;
  p.spatial_dims = L.nsd;
  p.N = L.N, p.C = L.C, p.K = L.K;
  p.in[1] = L.H, p.in[2] = L.W, p.filt[1] = L.R, p.filt[2] = L.S;
  p.pad_lo[1] = p.pad_hi[1] = L.R > 1 ? L.pad : 0;
  p.pad_lo[2] = p.pad_hi[2] = L.pad;
  for (int i = 0; i < 3; ++i)
    p.out[i] = conv_output_size(p.in[i], p.filt[i], 1, 1, 1, p.pad_lo[i], p.pad_hi[i]);
  return p;
}

// fp64 value of output element e of operation op.
double ref_point(const ConvProblem& p, int op, int64_t e, const std::vector<double>& x,
                 const std::vector<double>& w, const std::vector<double>& dy) {
  double acc = 0;
  const int64_t H = p.in[1], W = p.in[2], P = p.out[1], Q = p.out[2], R = p.filt[1],
                S = p.filt[2], C = p.C, K = p.K;  // NHWC, 2-D (or 1-D as 1 x W), G = 1
  if (op == 0) {
    const int64_t k = e % K, q = e / K % Q, pp = e / (K * Q) % P, n = e / (K * Q * P);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t h = pp + r - p.pad_lo[1], wi = q + s - p.pad_lo[2];
        if (h < 0 || h >= H || wi < 0 || wi >= W) continue;
        for (int64_t c = 0; c < C; ++c)
          acc += x[((n * H + h) * W + wi) * C + c] * w[((r * S + s) * C + c) * K + k];
      }
  } else if (op == 1) {
    const int64_t c = e % C, wi = e / C % W, h = e / (C * W) % H, n = e / (C * W * H);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t pp = h - r + p.pad_lo[1], q = wi - s + p.pad_lo[2];
        if (pp < 0 || pp >= P || q < 0 || q >= Q) continue;
        for (int64_t k = 0; k < K; ++k)
          acc += dy[((n * P + pp) * Q + q) * K + k] * w[((r * S + s) * C + c) * K + k];
      }
  } else {
    const int64_t k = e % K, c = e / K % C, s = e / (K * C) % S, r = e / (K * C * S);
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t pp = 0; pp < P; ++pp)
        for (int64_t q = 0; q < Q; ++q) {
          const int64_t h = pp + r - p.pad_lo[1], wi = q + s - p.pad_lo[2];
          if (h < 0 || h >= H || wi < 0 || wi >= W) continue;
          acc += x[((n * H + h) * W + wi) * C + c] * dy[((n * P + pp) * Q + q) * K + k];
        }
  }
  return acc;
}

void bench(const Layer& L, ConvAlgo algo, DType T, FILE* csv) {
  // BENCH_LAYERS (names, comma-separated), BENCH_ITERS and BENCH_MAIN_ONLY (fp32 alone) narrow
  // the table, e.g. for ncu (scripts/profile-fast-kernels).
  if (const char* only = getenv("BENCH_LAYERS"); only && !strstr(only, L.name)) return;
  if (getenv("BENCH_MAIN_ONLY") && T != DType::kF32) return;
  const ConvProblem p = layer_problem(L);
  const int NB = 4;
  const int iters = getenv("BENCH_ITERS") ? std::max(2, atoi(getenv("BENCH_ITERS"))) : 25;
  const size_t eb = dtype_bytes(T);
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> U(-1, 1);
  std::vector<std::vector<double>> hx(NB), hw(NB), hdy(NB);
  std::vector<void*> X(NB), W(NB), DY(NB), Y(NB), DX(NB), DW(NB);
  for (int i = 0; i < NB; ++i) {
    hx[i].resize(p.x_elems()), hw[i].resize(p.w_elems()), hdy[i].resize(p.y_elems());
    for (auto& v : hx[i]) v = round_to(U(rng), T);
    for (auto& v : hw[i]) v = round_to(U(rng), T);
    for (auto& v : hdy[i]) v = round_to(U(rng), T);
    X[i] = dev_upload(pack(hx[i], T)), W[i] = dev_upload(pack(hw[i], T));
    DY[i] = dev_upload(pack(hdy[i], T));
    CK(cudaMalloc(&Y[i], p.y_elems() * eb));
    CK(cudaMalloc(&DX[i], p.x_elems() * eb));
    CK(cudaMalloc(&DW[i], p.w_elems() * eb));
  }
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  const double flops = 2.0 * p.macs();
  for (int op = 0; op < 3; ++op) {
    const CudaConvCall call{static_cast<ConvOp>(op), algo, p, T, T, MathPrecision::kHighest};
    const std::string why = can_implement(call);
    const char* an = algo == ConvAlgo::kFft ? "FFT" : "FFT_TILING";
    if (!why.empty()) {
      printf("BENCH %-12s %-10s %-4s %-5s refused: %s\n", L.name, an, dname(T), kOpName[op],
             why.c_str());
      continue;
    }
    const size_t ws = workspace_bytes(call);
    void* wsp = nullptr;
    if (ws) CK(cudaMalloc(&wsp, ws));
    auto io_of = [&](int b) {
      return CudaConvBuffers{op == 1 ? DY[b] : X[b], op == 2 ? DY[b] : W[b],
                             op == 0 ? Y[b] : op == 1 ? DX[b] : DW[b], wsp, ws, st};
    };
    auto launch = [&](int i) {
      const std::string e = run_conv(call, io_of(i % NB));
      if (!e.empty()) {
        printf("bench error: %s\n", e.c_str());
        exit(1);
      }
    };
    for (int i = 0; i < 5; ++i) launch(i);
    // Median of per-launch times between events: eagerly (host launch overhead included when
    // the GPU outruns the host) and replaying one CUDA graph per buffer set (as XLA's command
    // buffers run it).
    std::vector<cudaGraphExec_t> graphs(NB);
    for (int b = 0; b < NB; ++b) {
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      const std::string e = run_conv(call, io_of(b));
      CK(cudaStreamEndCapture(st, &g));
      if (!e.empty()) {
        printf("bench capture error: %s\n", e.c_str());
        exit(1);
      }
      CK(cudaGraphInstantiate(&graphs[b], g, 0));
      CK(cudaGraphDestroy(g));
    }
    auto timed = [&](bool graph) {
      std::vector<cudaEvent_t> ev(iters + 1);
      for (auto& e : ev) CK(cudaEventCreate(&e));
      CK(cudaEventRecord(ev[0], st));
      for (int i = 0; i < iters; ++i) {
        if (graph)
          CK(cudaGraphLaunch(graphs[i % NB], st));
        else
          launch(i);
        CK(cudaEventRecord(ev[i + 1], st));
      }
      CK(cudaEventSynchronize(ev[iters]));
      std::vector<float> t(iters);
      for (int i = 0; i < iters; ++i) CK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
      for (auto& e : ev) CK(cudaEventDestroy(e));
      std::sort(t.begin(), t.end());
      return t;
    };
    const std::vector<float> tg = timed(true), t = timed(false);
    for (auto& g : graphs) CK(cudaGraphExecDestroy(g));
    const double med = t[iters / 2], med_graph = tg[iters / 2];
    // Error of the last result (buffer (iters - 1) % NB) at 1500 sampled elements.
    const int b = (iters - 1) % NB;
    const size_t n = op == 0 ? p.y_elems() : op == 1 ? p.x_elems() : p.w_elems();
    std::vector<char> hb(n * eb);
    CK(cudaMemcpy(hb.data(), io_of(b).out, hb.size(), cudaMemcpyDeviceToHost));
    double maxerr = 0, maxref = 0;
    std::mt19937 pick(5);
    for (int s = 0; s < 1500; ++s) {
      const int64_t e = static_cast<int64_t>(pick() % n);
      const double r = ref_point(p, op, e, hx[b], hw[b], hdy[b]);
      maxref = std::max(maxref, std::fabs(r));
      maxerr = std::max(maxerr, std::fabs(unpack1(hb.data(), e, T) - r));
    }
    const double rel = maxref > 0 ? maxerr / maxref : maxerr;
    printf("BENCH %-12s %-10s %-4s %-5s median %.4f ms (graph %.4f, min %.4f)  %6.2f "
           "TFLOP/s-equiv  ws %.1f MB  rel.err %.2e\n", L.name, an, dname(T), kOpName[op], med,
           med_graph, tg[0], flops / (std::min(med, med_graph) * 1e-3) / 1e12, ws / 1e6, rel);
    if (csv)
      fprintf(csv, "%s,%s,%s,%s,%.5f,%.5f,%.3e\n", L.name, an, dname(T), kOpName[op], med,
              med_graph, rel);
    if (T == DType::kF32 && rel > 1e-5) {
      printf("FAIL bench layer %s %s %s fp32 error %.2e over 1e-5\n", L.name, an, kOpName[op],
             rel);
      g_fail++;
    }
    if (wsp) CK(cudaFree(wsp));
  }
  for (int i = 0; i < NB; ++i) {
    cudaFree(X[i]), cudaFree(W[i]), cudaFree(DY[i]), cudaFree(Y[i]), cudaFree(DX[i]);
    cudaFree(DW[i]);
  }
  cudaStreamDestroy(st);
}

// A wgrad (several kernels, chunked) captured into a CUDA graph, replayed, and compared bitwise
// with an eager run (determinism).
void graph_check() {
  const Case cs{"graph", Layout::kNHWC, 2, 3, 5, 7, 1, {20, 17}, {5, 5}, {2, 2}, {2, 2}};
  const ConvProblem p = make(cs);
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> U(-1, 1);
  std::vector<double> x(p.x_elems()), dy(p.y_elems());
  for (auto& v : x) v = round_to(U(rng), DType::kF32);
  for (auto& v : dy) v = round_to(U(rng), DType::kF32);
  void* dx_ = dev_upload(pack(x, DType::kF32));
  void* ddy = dev_upload(pack(dy, DType::kF32));
  const CudaConvCall call{ConvOp::kBackwardFilter, ConvAlgo::kFftTiling, p, DType::kF32,
                          DType::kF32, MathPrecision::kHighest};
  const size_t ws = workspace_bytes(call);
  void *wsp, *o;
  CK(cudaMalloc(&wsp, ws));
  CK(cudaMalloc(&o, p.w_elems() * 4));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const std::string err = run_conv(call, CudaConvBuffers{dx_, ddy, o, wsp, ws, s});
  CK(cudaStreamEndCapture(s, &g));
  if (!err.empty()) {
    printf("FAIL graph capture: %s\n", err.c_str());
    g_fail++;
    return;
  }
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  std::vector<float> h(p.w_elems()), h2(p.w_elems());
  CK(cudaMemcpy(h.data(), o, h.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemset(o, 0, h.size() * 4));
  if (std::string e = run_conv(call, CudaConvBuffers{dx_, ddy, o, wsp, ws, s}); !e.empty()) {
    printf("FAIL eager after graph: %s\n", e.c_str());
    g_fail++;
  }
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(h2.data(), o, h2.size() * 4, cudaMemcpyDeviceToHost));
  const bool same = memcmp(h.data(), h2.data(), h.size() * 4) == 0;
  printf("%s graph-captured FFT_TILING wgrad replays bitwise equal to eager: %d\n",
         same ? "ok  " : "FAIL", static_cast<int>(same));
  g_fail += same ? 0 : 1;
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaFree(dx_), cudaFree(ddy), cudaFree(wsp), cudaFree(o);
}
#endif

int main(int argc, char** argv) {
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");
  const bool none = argc > 1 && !strcmp(argv[1], "none");
  const bool do_bench = argc > 2 && !strcmp(argv[2], "bench");
  std::mt19937 rng(42);
  struct DT {
    DType in, out;
    double tol;
  };
  std::vector<DT> dts = {{DType::kF64, DType::kF64, 1e-12}, {DType::kF32, DType::kF32, 1e-5},
                         {DType::kBF16, DType::kBF16, 1e-2}, {DType::kF16, DType::kF16, 3e-3},
                         {DType::kBF16, DType::kF32, 1e-5},  {DType::kF16, DType::kF32, 1e-5}};
  std::vector<Case> cs = none ? std::vector<Case>{} : cases();
  if (const char* only = getenv("FFT_CHECK_ONLY")) {  // a comma-separated subset of case names
    std::vector<Case> q;
    for (auto& c : cs)
      if (strstr(only, c.name)) q.push_back(c);
    cs = q;
  }
  if (quick) {
    std::vector<Case> q;
    for (auto& c : cs) {
      const std::string n = c.name;
      if (n == "odd_7x9_c3k4" || n == "negpad_asym" || n == "groups3_nchw" ||
          n == "1d_groups2" || n == "3d_nhwc" || n == "image_smaller_than_filter" ||
          n == "out_empty" || n == "c40_k72_wide" || n == "c33_k65_nchw" ||
          n == "filter4_skip_edge" || n == "3d_16x8x4_groups3")
        q.push_back(c);
    }
    cs = q;
    dts = {{DType::kF32, DType::kF32, 1e-5}, {DType::kBF16, DType::kBF16, 1e-2}};
  }
  if (const char* dt = getenv("FFT_CHECK_DTYPES")) {  // e.g. "f32,f64"
    std::vector<DT> q;
    for (auto& d : dts) {
      const std::string tag = std::string(dname(d.in)) + "->" + dname(d.out);
      if (strstr(dt, dname(d.in)) && (d.in == d.out || strstr(dt, tag.c_str()))) q.push_back(d);
    }
    dts = q;
  }
  for (auto& d : dts)
    for (auto& c : cs) check_case(c, d.in, d.out, d.tol, rng);
  if (!none) {
    // Refusals name the reason.
    ConvProblem p = make(cases()[0]);
    p.stride[2] = 2;
    p.out[2] = conv_output_size(p.in[2], p.filt[2], 2, 1, 1, p.pad_lo[2], p.pad_hi[2]);
    const CudaConvCall c1{ConvOp::kForward, ConvAlgo::kFftTiling, p, DType::kF32, DType::kF32,
                          MathPrecision::kHighest};
    const std::string why = can_implement(c1);
    const bool ok = why.find("needs window_strides 1, got (1, 2)") != std::string::npos;
    printf("%s stride-2 refusal: '%s'\n", ok ? "ok  " : "FAIL", why.c_str());
    g_fail += ok ? 0 : 1;
  }
#ifndef JAXDNN_FFT_EMULATION
  if (!none) graph_check();
#else
  printf("LAUNCHES:");
  for (const auto& [name, n] : emu::launch_counts) printf(" %s=%ld", name.c_str(), n);
  printf("\n");
#endif
  printf("CORRECTNESS: %d runs, %d failures\n", g_run, g_fail);
#ifndef JAXDNN_FFT_EMULATION
  if (do_bench) {
    FILE* csv = fopen(getenv("BENCH_CSV") ? getenv("BENCH_CSV") : "/dev/null", "w");
    const Layer inc{"inc_5x5", 2, 32, 32, 64, 28, 28, 5, 5, 2};
    const Layer r50{"r50_c3_3x3", 2, 32, 128, 128, 28, 28, 3, 3, 1};
    const Layer audio{"audio_1x255", 1, 4, 1, 16, 1, 16384, 1, 255, 127};
    for (ConvAlgo a : {ConvAlgo::kFft, ConvAlgo::kFftTiling}) {
      bench(inc, a, DType::kF32, csv);
      bench(inc, a, DType::kBF16, csv);
      bench(r50, a, DType::kF32, csv);
    }
    bench(audio, ConvAlgo::kFftTiling, DType::kF32, csv);
    bench(audio, ConvAlgo::kFftTiling, DType::kBF16, csv);
    if (csv) fclose(csv);
    printf("BENCH done: %d failures in total\n", g_fail);
  }
#endif
  return g_fail ? 1 : 0;
}
