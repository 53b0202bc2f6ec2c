// DIRECT family: window-loop convolutions in fp32 (fp64 for float64), no tensor cores.
//
// Kernels (chosen by select_direct, a function of the call alone so that the workspace size
// known at trace time matches what runs):
//   dws_*  NHWC depthwise with multiplier 1 (G == C == K), C a multiple of the 16-byte vector,
//          unit lhs_dilation: register sliding window, thread = 16 bytes of channels x a strip
//          of TW output pixels along W. fwd: filter width S <= 7, any stride / dilation (window
//          kernels for S = 3, 5, 7 with unit W stride and dilation, a per-tap kernel otherwise);
//          dgrad: same kernels, all strides 1 (flipped filter); wgrad: S = 3, W dilation 1,
//          W stride 1 or 2, T * R <= 3 (all taps in fp32 registers); with T == 1 and unit H
//          stride and dilation a thread takes runs of 8 output rows, loading each x row once.
//   dw_*   other NHWC depthwise (G == C), taps <= 9, unit lhs_dilation, 16-byte channel vectors
//          (8 x 16-bit or 4 x f32 channels per thread; filter taps held in registers).
//          fwd: any channel multiplier M = K/C;  dgrad: M == 1;  wgrad: any M.
//   grp_*  NHWC, C/G and K/G multiples of 4 (ResNeXt-style groups, also dense convs), unit
//          lhs_dilation: each thread owns 4 channels x 4 pixels along W (fwd/dgrad) or a 4x4
//          (in-channel x out-channel) block of one tap (wgrad).
//   gen_*  everything else (NCHW, float64, odd channel counts, lhs_dilation, ...): one output
//          element per thread, layout handled through index arithmetic.
// Backward-data is a gather: each input pixel visits only the taps whose output position is an
// integer (divisibility by the stride is tested per axis before any load), no atomics.
// Backward-filter is deterministic: each (slice of N x output pixels) writes fp32 (fp64)
// partials of the whole filter into the workspace, then colsum_kernel adds the slices in a fixed
// order. Nothing depends on timing or on the device, so results are bitwise reproducible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>
#include <cstdint>
#include <string>

#include "conv_cuda.h"
#include "epilogue.cuh"
#include "gemm_primitives.cuh"

namespace jaxdnn::cuda {
namespace {

using i64 = int64_t;

// ---------------------------------------------------------------------------------------------
// Geometry handed to the kernels (spatial quantities fit in int; checked in can_implement).
struct Geo {
  int N, C, K, G, Cg, Kg, M;  // M = K / C (depthwise multiplier), only meaningful for depthwise
  int in[3], out[3], filt[3], st[3], dl[3], lhs[3], pad[3];
  int taps;
  bool nhwc;
  EpiDev epi;  // fused epilogue of a forward call (off otherwise)
};

constexpr int kMaxDwTaps = 9;
struct DwTaps {
  int t[kMaxDwTaps], r[kMaxDwTaps], s[kMaxDwTaps];  // f * dilation per axis for each tap f
};

// ---------------------------------------------------------------------------------------------
// Element conversions.
template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ double to_f(double v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T ldg(const T* p) { return __ldg(p); }

// Scalar store of an accumulator in the runtime output dtype.
__device__ __forceinline__ void store_scalar(void* dst, i64 i, float v, DType out) {
  switch (out) {
    case DType::kF32: static_cast<float*>(dst)[i] = v; break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v); break;
    case DType::kF16: static_cast<__half*>(dst)[i] = __float2half_rn(v); break;
    case DType::kF64: static_cast<double*>(dst)[i] = v; break;
  }
}
__device__ __forceinline__ void store_scalar(void* dst, i64 i, double v, DType) {
  static_cast<double*>(dst)[i] = v;
}

// 16-byte vectors: V = 16 / sizeof(T) elements.
template <typename T> struct Vec16 { static constexpr int V = 16 / sizeof(T); };

// bf16 is the high half of an fp32: widening is a shift or a mask (exact, NaN and inf included),
// on whole 32-bit words, so a 16-byte load stays one instruction.
__device__ __forceinline__ void unpack2(uint32_t u, float* o, __nv_bfloat16*) {
  o[0] = __uint_as_float(u << 16), o[1] = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ void unpack2(uint32_t u, float* o, __half*) {
  __half2 h = *reinterpret_cast<__half2*>(&u);
  float2 f = __half22float2(h);
  o[0] = f.x, o[1] = f.y;
}

// Load 16 bytes (aligned) as V floats.
__device__ __forceinline__ void load16(const float* p, float* o) {
  float4 v = __ldg(reinterpret_cast<const float4*>(p));
  o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
}
template <typename H>
__device__ __forceinline__ void load16(const H* p, float* o) {
  uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  unpack2(v.x, o, (H*)nullptr);
  unpack2(v.y, o + 2, (H*)nullptr);
  unpack2(v.z, o + 4, (H*)nullptr);
  unpack2(v.w, o + 6, (H*)nullptr);
}
// Load 4 consecutive elements (aligned to 4 elements) as floats.
__device__ __forceinline__ void load4(const float* p, float* o) { load16(p, o); }
template <typename H>
__device__ __forceinline__ void load4(const H* p, float* o) {
  uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
  unpack2(v.x, o, (H*)nullptr);
  unpack2(v.y, o + 2, (H*)nullptr);
}

// a, b rounded to the 16-bit type H, packed (a in the low half); relu applied when asked
// (pack2_16, epilogue.cuh).
template <typename H>
__device__ __forceinline__ uint32_t pack2(float a, float b, H*, bool relu = false) {
  static_assert(std::is_same_v<H, __half> || std::is_same_v<H, __nv_bfloat16>, "16-bit type");
  return pack2_16(a, b, std::is_same_v<H, __half>, relu);
}

// Store n (4 or 8, n * sizeof(T) a multiple of 8) values, as T or (out_f32) as float; relu16
// (16-bit T only) applies a relu in the conversion.
template <int n>
__device__ __forceinline__ void store_vec(float* dst, const float* v, bool, bool = false) {
#pragma unroll
  for (int i = 0; i < n; i += 4)
    *reinterpret_cast<float4*>(dst + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
}
template <int n, typename H>
__device__ __forceinline__ void store_vec(H* dst, const float* v, bool out_f32,
                                          bool relu16 = false) {
  if (out_f32) {
    store_vec<n>(reinterpret_cast<float*>(dst), v, true);
    return;
  }
  if constexpr (n == 8) {
    uint4 u;
    u.x = pack2(v[0], v[1], (H*)nullptr, relu16), u.y = pack2(v[2], v[3], (H*)nullptr, relu16);
    u.z = pack2(v[4], v[5], (H*)nullptr, relu16), u.w = pack2(v[6], v[7], (H*)nullptr, relu16);
    *reinterpret_cast<uint4*>(dst) = u;
  } else {
    static_assert(n == 4, "");
    uint2 u;
    u.x = pack2(v[0], v[1], (H*)nullptr, relu16), u.y = pack2(v[2], v[3], (H*)nullptr, relu16);
    *reinterpret_cast<uint2*>(dst) = u;
  }
}
// Pointer to element i of an output of dtype T (or float when out_f32).
template <typename T>
__device__ __forceinline__ T* out_ptr(void* dst, i64 i, bool out_f32) {
  if (out_f32) return reinterpret_cast<T*>(static_cast<float*>(dst) + i);
  return static_cast<T*>(dst) + i;
}
// (store_vec<n>(out_ptr<T>(...)) reinterprets back to float* when out_f32.)

// ---------------------------------------------------------------------------------------------
// Index helpers. Source coordinate of output o through tap offset fd (= f * dilation):
// forward / wgrad mapping, virtual (lhs-dilated) input.
__device__ __forceinline__ int fwd_src(int o, int fd, int st, int pad, int lhs, int in) {
  int j = o * st - pad + fd;
  if (j < 0) return -1;
  if (lhs != 1) {
    if (j % lhs) return -1;
    j /= lhs;
  }
  return j < in ? j : -1;
}
// Backward-data mapping: output position reached from input i through tap offset fd.
__device__ __forceinline__ int bwd_src(int i, int fd, int st, int pad, int lhs, int out) {
  int num = i * lhs + pad - fd;
  if (num < 0) return -1;
  if (st != 1) {
    if (num % st) return -1;
    num /= st;
  }
  return num < out ? num : -1;
}

// Activation offset of (n, c, d, h, w) with `ch` channels and spatial extents sp.
__device__ __forceinline__ i64 act_off(bool nhwc, int n, int c, int d, int h, int w, int ch,
                                       const int* sp) {
  if (nhwc) return ((((i64)n * sp[0] + d) * sp[1] + h) * sp[2] + w) * ch + c;
  return ((((i64)n * ch + c) * sp[0] + d) * sp[1] + h) * sp[2] + w;
}
// Stride between consecutive channels.
__device__ __forceinline__ i64 act_cstride(bool nhwc, const int* sp) {
  return nhwc ? 1 : (i64)sp[0] * sp[1] * sp[2];
}
// Filter offset of (k, ci, t, r, s).
__device__ __forceinline__ i64 w_off(const Geo& g, int k, int ci, int t, int r, int s) {
  if (g.nhwc) return ((((i64)t * g.filt[1] + r) * g.filt[2] + s) * g.Cg + ci) * g.K + k;
  return ((((i64)k * g.Cg + ci) * g.filt[0] + t) * g.filt[1] + r) * g.filt[2] + s;
}
// Decode a linear activation index (in memory order) into (n, c, d, h, w).
__device__ __forceinline__ void act_decode(bool nhwc, i64 idx, int ch, const int* sp, int& n,
                                           int& c, int& d, int& h, int& w) {
  if (nhwc) {
    c = (int)(idx % ch); idx /= ch;
    w = (int)(idx % sp[2]); idx /= sp[2];
    h = (int)(idx % sp[1]); idx /= sp[1];
    d = (int)(idx % sp[0]); n = (int)(idx / sp[0]);
  } else {
    w = (int)(idx % sp[2]); idx /= sp[2];
    h = (int)(idx % sp[1]); idx /= sp[1];
    d = (int)(idx % sp[0]); idx /= sp[0];
    c = (int)(idx % ch); n = (int)(idx / ch);
  }
}

// ---------------------------------------------------------------------------------------------
// Generic kernels (any layout, group structure, dtype, lhs_dilation): one element per thread.
template <typename T>
__global__ void __launch_bounds__(256)
    gen_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, void* __restrict__ y,
                   DType out_dt, Geo g) {
  using Acc = typename AccOf<T>::type;
  const i64 total = (i64)g.N * g.K * g.out[0] * g.out[1] * g.out[2];
  const i64 xcs = act_cstride(g.nhwc, g.in);
  const i64 wcs = g.nhwc ? (i64)g.K : (i64)g.taps;
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (i64)gridDim.x * blockDim.x) {
    int n, k, z, p, q;
    act_decode(g.nhwc, idx, g.K, g.out, n, k, z, p, q);
    const int c0 = (k / g.Kg) * g.Cg;
    Acc acc = 0;
    for (int t = 0; t < g.filt[0]; ++t) {
      const int id = fwd_src(z, t * g.dl[0], g.st[0], g.pad[0], g.lhs[0], g.in[0]);
      if (id < 0) continue;
      for (int r = 0; r < g.filt[1]; ++r) {
        const int ih = fwd_src(p, r * g.dl[1], g.st[1], g.pad[1], g.lhs[1], g.in[1]);
        if (ih < 0) continue;
        for (int s = 0; s < g.filt[2]; ++s) {
          const int iw = fwd_src(q, s * g.dl[2], g.st[2], g.pad[2], g.lhs[2], g.in[2]);
          if (iw < 0) continue;
          const T* xp = x + act_off(g.nhwc, n, c0, id, ih, iw, g.C, g.in);
          const T* wp = w + w_off(g, k, 0, t, r, s);
          for (int ci = 0; ci < g.Cg; ++ci)
            acc += (Acc)to_f(ldg(xp + ci * xcs)) * (Acc)to_f(ldg(wp + ci * wcs));
        }
      }
    }
    if (g.epi.on) acc = epi_apply<Acc>(g.epi, idx, k, acc);
    store_scalar(y, idx, acc, out_dt);
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
    gen_bwd_data_kernel(const T* __restrict__ dy, const T* __restrict__ w, void* __restrict__ dx,
                        DType out_dt, Geo g) {
  using Acc = typename AccOf<T>::type;
  const i64 total = (i64)g.N * g.C * g.in[0] * g.in[1] * g.in[2];
  const i64 ycs = act_cstride(g.nhwc, g.out);
  const i64 wks = g.nhwc ? (i64)1 : (i64)g.Cg * g.taps;
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (i64)gridDim.x * blockDim.x) {
    int n, c, d, h, wx;
    act_decode(g.nhwc, idx, g.C, g.in, n, c, d, h, wx);
    const int grp = c / g.Cg, ci = c - grp * g.Cg, k0 = grp * g.Kg;
    Acc acc = 0;
    for (int t = 0; t < g.filt[0]; ++t) {
      const int z = bwd_src(d, t * g.dl[0], g.st[0], g.pad[0], g.lhs[0], g.out[0]);
      if (z < 0) continue;
      for (int r = 0; r < g.filt[1]; ++r) {
        const int p = bwd_src(h, r * g.dl[1], g.st[1], g.pad[1], g.lhs[1], g.out[1]);
        if (p < 0) continue;
        for (int s = 0; s < g.filt[2]; ++s) {
          const int q = bwd_src(wx, s * g.dl[2], g.st[2], g.pad[2], g.lhs[2], g.out[2]);
          if (q < 0) continue;
          const T* yp = dy + act_off(g.nhwc, n, k0, z, p, q, g.K, g.out);
          const T* wp = w + w_off(g, k0, ci, t, r, s);
          for (int kl = 0; kl < g.Kg; ++kl)
            acc += (Acc)to_f(ldg(yp + kl * ycs)) * (Acc)to_f(ldg(wp + kl * wks));
        }
      }
    }
    store_scalar(dx, idx, acc, out_dt);
  }
}

// Walks the flattened (n, z, p, q) output pixels of a slice incrementally.
struct PixelWalker {
  int n, z, p, q;
  __device__ __forceinline__ void start(i64 pix, const int* out) {
    q = (int)(pix % out[2]); pix /= out[2];
    p = (int)(pix % out[1]); pix /= out[1];
    z = (int)(pix % out[0]); n = (int)(pix / out[0]);
  }
  __device__ __forceinline__ void next(const int* out) {
    if (++q == out[2]) {
      q = 0;
      if (++p == out[1]) {
        p = 0;
        if (++z == out[0]) z = 0, ++n;
      }
    }
  }
};

// Generic backward-filter partials: thread = one filter element (memory order) of one slice.
template <typename T>
__global__ void __launch_bounds__(256)
    gen_wgrad_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                     typename AccOf<T>::type* __restrict__ part, Geo g, i64 pix_per_slice) {
  using Acc = typename AccOf<T>::type;
  const i64 wE = (i64)g.K * g.Cg * g.taps;
  const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= wE) return;
  const int slice = blockIdx.y;
  int k, ci, t, r, s;
  {
    i64 v = e;
    if (g.nhwc) {
      k = (int)(v % g.K); v /= g.K;
      ci = (int)(v % g.Cg); v /= g.Cg;
      s = (int)(v % g.filt[2]); v /= g.filt[2];
      r = (int)(v % g.filt[1]); t = (int)(v / g.filt[1]);
    } else {
      s = (int)(v % g.filt[2]); v /= g.filt[2];
      r = (int)(v % g.filt[1]); v /= g.filt[1];
      t = (int)(v % g.filt[0]); v /= g.filt[0];
      ci = (int)(v % g.Cg); k = (int)(v / g.Cg);
    }
  }
  const int c = (k / g.Kg) * g.Cg + ci;
  const i64 npix = (i64)g.N * g.out[0] * g.out[1] * g.out[2];
  const i64 p0 = slice * pix_per_slice, p1 = min(npix, p0 + pix_per_slice);
  Acc acc = 0;
  if (p0 < p1) {
    PixelWalker pw;
    pw.start(p0, g.out);
    for (i64 pix = p0; pix < p1; ++pix, pw.next(g.out)) {
      const int id = fwd_src(pw.z, t * g.dl[0], g.st[0], g.pad[0], g.lhs[0], g.in[0]);
      const int ih = fwd_src(pw.p, r * g.dl[1], g.st[1], g.pad[1], g.lhs[1], g.in[1]);
      const int iw = fwd_src(pw.q, s * g.dl[2], g.st[2], g.pad[2], g.lhs[2], g.in[2]);
      if ((id | ih | iw) < 0) continue;
      acc += (Acc)to_f(ldg(x + act_off(g.nhwc, pw.n, c, id, ih, iw, g.C, g.in))) *
             (Acc)to_f(ldg(dy + act_off(g.nhwc, pw.n, k, pw.z, pw.p, pw.q, g.K, g.out)));
    }
  }
  part[slice * wE + e] = acc;
}

// out[m] = sum over s of part[s * M + m], in fixed order (deterministic).
template <typename Acc>
__global__ void __launch_bounds__(1024)
    colsum_kernel(const Acc* __restrict__ part, int S, i64 M, void* __restrict__ out,
                  DType out_dt) {
  __shared__ Acc red[32][33];
  const i64 m = (i64)blockIdx.x * 32 + threadIdx.x;
  Acc acc = 0;
  if (m < M) {
#pragma unroll 4
    for (int s = threadIdx.y; s < S; s += 32) acc += part[(i64)s * M + m];
  }
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && m < M) {
    Acc v = red[0][threadIdx.x];
#pragma unroll
    for (int i = 1; i < 32; ++i) v += red[i][threadIdx.x];
    store_scalar(out, m, v, out_dt);
  }
}

// ---------------------------------------------------------------------------------------------
// Depthwise NHWC forward / backward-data. Thread = V consecutive destination channels of a
// sequence of destination pixels; the filter taps for those channels live in registers.
//   fwd: dst = y (K channels), src = x (C channels), dst channel k reads src channel k / M.
//   bwd: dst = dx, src = dy (M == 1, so K == C).
constexpr int kDwThreads = 256;

__device__ __forceinline__ void decode_pix(i64 pix, const int* sp, bool small, int& n, int& a,
                                           int& b, int& c) {
  if (small) {
    unsigned v = (unsigned)pix;
    c = (int)(v % (unsigned)sp[2]); v /= (unsigned)sp[2];
    b = (int)(v % (unsigned)sp[1]); v /= (unsigned)sp[1];
    a = (int)(v % (unsigned)sp[0]); n = (int)(v / (unsigned)sp[0]);
  } else {
    c = (int)(pix % sp[2]); pix /= sp[2];
    b = (int)(pix % sp[1]); pix /= sp[1];
    a = (int)(pix % sp[0]); n = (int)(pix / sp[0]);
  }
}

template <typename T, bool BWD>
__global__ void __launch_bounds__(kDwThreads)
    dw_kernel(const T* __restrict__ src, const T* __restrict__ w, void* __restrict__ dst,
              bool out_f32, Geo g, DwTaps tp, int cb, int lanes, int nchunks, int ppt) {
  constexpr int V = Vec16<T>::V;
  const int DCH = BWD ? g.C : g.K;
  const int SCH = BWD ? g.K : g.C;
  const int nvec = DCH / V;
  const int chunk = blockIdx.x % nchunks;
  const i64 pb = blockIdx.x / nchunks;
  const int cv = threadIdx.x % cb, py = threadIdx.x / cb;
  const int vi = chunk * cb + cv;
  if (py >= lanes || vi >= nvec) return;
  const int c0 = vi * V;
  const int* dsp = BWD ? g.in : g.out;
  const int* ssp = BWD ? g.out : g.in;

  float wr[kMaxDwTaps][V];
#pragma unroll
  for (int f = 0; f < kMaxDwTaps; ++f) {
    if (f < g.taps) load16(w + (i64)f * g.K + c0, wr[f]);
  }
  const bool vec_src = BWD || g.M == 1;
  float bias[V];  // this thread's V channels on every pixel it stores
  if (!BWD && g.epi.on) epi_bias_run<V>(g.epi, c0, V, bias);
  const i64 npix = (i64)g.N * dsp[0] * dsp[1] * dsp[2];
  const bool small = npix < (i64(1) << 31);
  for (int it = 0; it < ppt; ++it) {
    const i64 pix = (pb * ppt + it) * lanes + py;
    if (pix >= npix) break;
    int n, a, b, c;
    decode_pix(pix, dsp, small, n, a, b, c);
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
#pragma unroll
    for (int f = 0; f < kMaxDwTaps; ++f) {
      if (f < g.taps) {
        int sa, sb, sc;
        if (!BWD) {
          sa = a * g.st[0] - g.pad[0] + tp.t[f];
          sb = b * g.st[1] - g.pad[1] + tp.r[f];
          sc = c * g.st[2] - g.pad[2] + tp.s[f];
        } else {
          sa = bwd_src(a, tp.t[f], g.st[0], g.pad[0], 1, ssp[0]);
          sb = bwd_src(b, tp.r[f], g.st[1], g.pad[1], 1, ssp[1]);
          sc = bwd_src(c, tp.s[f], g.st[2], g.pad[2], 1, ssp[2]);
        }
        if ((unsigned)sa < (unsigned)ssp[0] && (unsigned)sb < (unsigned)ssp[1] &&
            (unsigned)sc < (unsigned)ssp[2]) {
          const i64 soff = ((((i64)n * ssp[0] + sa) * ssp[1] + sb) * ssp[2] + sc) * SCH;
          float xv[V];
          if (vec_src) {
            load16(src + soff + c0, xv);
          } else {
#pragma unroll
            for (int j = 0; j < V; ++j) xv[j] = to_f(ldg(src + soff + (c0 + j) / g.M));
          }
#pragma unroll
          for (int j = 0; j < V; ++j) acc[j] = fmaf(xv[j], wr[f][j], acc[j]);
        }
      }
    }
    if (!BWD && g.epi.on) epi_apply_run<V>(g.epi, pix * DCH + c0, bias, acc);
    store_vec<V>(out_ptr<T>(dst, pix * DCH + c0, out_f32), acc, out_f32);
  }
}

// Depthwise NHWC backward-filter partials: thread = V output channels x all taps, over a
// strided subset of the block's slice of output pixels; block-level fixed-order reduction.
template <typename T>
__global__ void __launch_bounds__(kDwThreads)
    dw_wgrad_kernel(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ part,
                    Geo g, DwTaps tp, int cb, int lanes, int nchunks, i64 pix_per_slice) {
  constexpr int V = Vec16<T>::V;
  __shared__ float red[kDwThreads * 8];  // lanes * cb * V <= kDwThreads * V floats
  const int nvec = g.K / V;
  const int chunk = blockIdx.x % nchunks;
  const i64 slice = blockIdx.x / nchunks;
  const int cv = threadIdx.x % cb, py = threadIdx.x / cb;
  const int vi = chunk * cb + cv;
  const bool active = py < lanes && vi < nvec;
  const int c0 = vi * V;
  float acc[kMaxDwTaps][V];
#pragma unroll
  for (int f = 0; f < kMaxDwTaps; ++f)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[f][j] = 0.f;
  if (active) {
    const i64 npix = (i64)g.N * g.out[0] * g.out[1] * g.out[2];
    const bool small = npix < (i64(1) << 31);
    const i64 p1 = min(npix, (slice + 1) * pix_per_slice);
    for (i64 pix = slice * pix_per_slice + py; pix < p1; pix += lanes) {
      int n, z, p, q;
      decode_pix(pix, g.out, small, n, z, p, q);
      float dv[V];
      load16(dy + pix * g.K + c0, dv);
#pragma unroll
      for (int f = 0; f < kMaxDwTaps; ++f) {
        if (f < g.taps) {
          const int id = z * g.st[0] - g.pad[0] + tp.t[f];
          const int ih = p * g.st[1] - g.pad[1] + tp.r[f];
          const int iw = q * g.st[2] - g.pad[2] + tp.s[f];
          if ((unsigned)id < (unsigned)g.in[0] && (unsigned)ih < (unsigned)g.in[1] &&
              (unsigned)iw < (unsigned)g.in[2]) {
            const i64 xoff = ((((i64)n * g.in[0] + id) * g.in[1] + ih) * g.in[2] + iw) * g.C;
            float xv[V];
            if (g.M == 1) {
              load16(x + xoff + c0, xv);
            } else {
#pragma unroll
              for (int j = 0; j < V; ++j) xv[j] = to_f(ldg(x + xoff + (c0 + j) / g.M));
            }
#pragma unroll
            for (int j = 0; j < V; ++j) acc[f][j] = fmaf(xv[j], dv[j], acc[f][j]);
          }
        }
      }
    }
  }
  const int row = cb * V;  // floats per lane row in `red`
  float* out = part + slice * ((i64)g.taps * g.K);
#pragma unroll
  for (int f = 0; f < kMaxDwTaps; ++f) {
    if (f < g.taps) {  // uniform over the block
      if (py < lanes) {
#pragma unroll
        for (int j = 0; j < V; ++j) red[py * row + cv * V + j] = acc[f][j];
      }
      __syncthreads();
      for (int e = threadIdx.x; e < row; e += blockDim.x) {
        const int ch = chunk * row + e;
        if (ch < g.K) {
          float s = 0.f;
          for (int l = 0; l < lanes; ++l) s += red[l * row + e];
          out[(i64)f * g.K + ch] = s;
        }
      }
      __syncthreads();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Depthwise NHWC, channel multiplier 1 (K == C), register sliding window ("dws").
// All three operations are written in "forward form": dst[o] = sum_f w'[f] * src[o * st - pad + f * dl]
// per axis, with zeros outside src.
//   fwd:   src = x (extents in),  dst = y  (extents out), w' = w.
//   dgrad: src = dy (extents out), dst = dx (extents in), stride 1 on every axis, w' = w flipped
//          on every axis, pad' = dl * (F - 1) - pad_lo (M == 1 makes it the same computation).
//   wgrad: dw[f] = sum_o x[o * st - pad + f * dl] * dy[o]  (src = x, dst extents = out).
// Thread = V consecutive channels (one 16-byte vector) x a strip of TW consecutive output pixels
// along W of one output row (n, z, p). Threads of a block: cb channel vectors (fastest) x lanes
// strips (consecutive strips of the flattened (n, z, p, strip) index, so neighbours share rows).
// Each (t, r) input row visited by the strip is read once as a window of columns (16-byte
// loads, predicated on the column bounds computed once per strip; zeros for padding) and all
// S taps are accumulated from registers in fp32. Row bounds are tested once per row.
struct DwsArgs {
  int N, C;                    // batch, channels (== K)
  int sd[3], dd[3];            // src and dst extents (D H W)
  int F[3], st[3], dl[3], pad[3];
  int nstrips;                 // ceil(dd[2] / TW)
  int cb, lanes;               // channel vectors x strips per block (cb * lanes == blockDim.x)
  bool flip;                   // read the filter flipped (dgrad)
  bool out_f32;                // 16-bit inputs, fp32 result
  EpiDev epi;                  // fused epilogue of a forward call (off otherwise)
};

__device__ __forceinline__ uint4 ld16u(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
// 16 raw bytes to V floats.
__device__ __forceinline__ void cvt16(const uint4& u, float* o, float*) {
  o[0] = __uint_as_float(u.x), o[1] = __uint_as_float(u.y);
  o[2] = __uint_as_float(u.z), o[3] = __uint_as_float(u.w);
}
template <typename H>
__device__ __forceinline__ void cvt16(const uint4& u, float* o, H*) {
  unpack2(u.x, o, (H*)nullptr);
  unpack2(u.y, o + 2, (H*)nullptr);
  unpack2(u.z, o + 4, (H*)nullptr);
  unpack2(u.w, o + 6, (H*)nullptr);
}

// Decode a flattened strip index into (n, z, p, strip).
__device__ __forceinline__ void dws_decode(i64 sidx, const DwsArgs& a, bool small, int& n, int& z,
                                           int& p, int& ws) {
  if (small) {
    unsigned v = (unsigned)sidx;
    ws = (int)(v % (unsigned)a.nstrips); v /= (unsigned)a.nstrips;
    p = (int)(v % (unsigned)a.dd[1]); v /= (unsigned)a.dd[1];
    z = (int)(v % (unsigned)a.dd[0]); n = (int)(v / (unsigned)a.dd[0]);
  } else {
    ws = (int)(sidx % a.nstrips); sidx /= a.nstrips;
    p = (int)(sidx % a.dd[1]); sidx /= a.dd[1];
    z = (int)(sidx % a.dd[0]); n = (int)(sidx / a.dd[0]);
  }
}

// Forward / stride-1 backward-data. S > 0: sliding window, filter width S, unit stride and
// dilation along W (TW + S - 1 columns per row). S == 0: any filter width <= kDwsMaxS, stride
// and dilation along W; each tap reads its TW columns directly (no reuse across taps).
constexpr int kDwsMaxS = 7;
constexpr int kDwsThreads = 256;

// Two resident blocks per SM (<= 128 registers), except f32 with S = 7 (wider window).
template <typename T, int TW, int S>
__global__ void __launch_bounds__(kDwsThreads, (S == 7 && sizeof(T) == 4) ? 1 : 2)
    dws_kernel(const T* __restrict__ src, const T* __restrict__ w, void* __restrict__ dst,
               DwsArgs a) {
  constexpr int V = Vec16<T>::V;
  const int cv = threadIdx.x % a.cb, lane = threadIdx.x / a.cb;
  const int vi = blockIdx.y * a.cb + cv;
  if (vi * V >= a.C) return;  // no barriers below
  const int c0 = vi * V;
  const int C = a.C;
  const i64 total = (i64)a.N * a.dd[0] * a.dd[1] * a.nstrips;
  const bool small = total < (i64(1) << 31);
  // Epilogue operands loaded ahead, raw (epilogue.cuh): the thread's V biases, the same at every
  // pixel it stores, once; a strip's residuals before its first store. Only where the registers
  // allow (ptxas, sm_90a: the 16-bit 7-wide kernels spill with either, f32 with the residuals).
  // The kernel is issue-bound, and the epilogue's adds and selects were 16 of ~130 instructions
  // per output pixel (bf16, 3x3), so the biases start the accumulators (kBiasInAcc; not in the
  // 16-bit 5-wide kernels, which spilled 16 bytes so), and a relu goes into the 16-bit
  // conversion of the store (pack2_16).
  constexpr bool kBiasOnce = !(S == 7 && sizeof(T) == 2);
  constexpr bool kBiasInAcc = kBiasOnce && !(S == 5 && sizeof(T) == 2);
  constexpr bool kResidualsAhead = sizeof(T) == 2 && S != 7;
  const bool bias_raw = kBiasOnce && a.epi.on && a.epi.bias && epi_raw16_ok<V>(a.epi, c0);
  const uint4 braw = bias_raw ? epi_raw16_load<V>(a.epi.bias, c0) : make_uint4(0u, 0u, 0u, 0u);
  for (i64 sidx = (i64)blockIdx.x * a.lanes + lane; sidx < total;
       sidx += (i64)gridDim.x * a.lanes) {
    int n, z, p, ws;
    dws_decode(sidx, a, small, n, z, p, ws);
    const int q0 = ws * TW;
    // the strip's residuals toward L2 while the taps accumulate (not in the 16-bit 5-wide
    // kernels: 32 bytes of spills there)
    if (!(S == 5 && sizeof(T) == 2) && a.epi.residual) {
      const i64 ob = ((((i64)n * a.dd[0] + z) * a.dd[1] + p) * a.dd[2] + q0) * C + c0;
#pragma unroll
      for (int i = 0; i < TW; ++i)
        if (q0 + i < a.dd[2]) epi_prefetch_l2(a.epi, a.epi.residual, ob + (i64)i * C);
    }
    float acc[TW][V], acc0[V];
    if (kBiasInAcc && bias_raw) epi_raw16_unpack<V>(a.epi, braw, acc0);
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (!(kBiasInAcc && bias_raw)) acc0[j] = 0.f;
#pragma unroll
    for (int i = 0; i < TW; ++i)
#pragma unroll
      for (int j = 0; j < V; ++j) acc[i][j] = acc0[j];

    constexpr int NC = S > 0 ? TW + S - 1 : 1;
    const int clo = q0 * a.st[2] - a.pad[2];  // source column of (pixel 0, tap 0)
    unsigned cok = 0;                          // bit c: window column c inside the source row
    if constexpr (S > 0) {
#pragma unroll
      for (int c = 0; c < NC; ++c) cok |= ((unsigned)(clo + c) < (unsigned)a.sd[2]) ? 1u << c : 0u;
    }
    for (int t = 0; t < a.F[0]; ++t) {
      const int sdd = z * a.st[0] - a.pad[0] + t * a.dl[0];
      if ((unsigned)sdd >= (unsigned)a.sd[0]) continue;
      for (int r = 0; r < a.F[1]; ++r) {
        const int sh = p * a.st[1] - a.pad[1] + r * a.dl[1];
        if ((unsigned)sh >= (unsigned)a.sd[1]) continue;
        const T* rowp = src + (((i64)n * a.sd[0] + sdd) * a.sd[1] + sh) * a.sd[2] * C + c0;
        // filter tap (t, r, s) (or its mirror) sits at w[tap * C + c]
        const int tr = a.flip ? (a.F[0] - 1 - t) * a.F[1] + (a.F[1] - 1 - r) : t * a.F[1] + r;
        const T* wrow = w + (i64)tr * a.F[2] * C + c0;
        if constexpr (S > 0) {
          uint4 wraw[S], win[NC];
#pragma unroll
          for (int s = 0; s < S; ++s) wraw[s] = ld16u(wrow + (i64)(a.flip ? S - 1 - s : s) * C);
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            win[c] = make_uint4(0u, 0u, 0u, 0u);
            if (cok & (1u << c)) win[c] = ld16u(rowp + (i64)(clo + c) * C);
          }
          float wf[S][V];
#pragma unroll
          for (int s = 0; s < S; ++s) cvt16(wraw[s], wf[s], (T*)nullptr);
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            float xv[V];
            cvt16(win[c], xv, (T*)nullptr);
#pragma unroll
            for (int s = 0; s < S; ++s) {
              const int i = c - s;
              if (i >= 0 && i < TW) {
#pragma unroll
                for (int j = 0; j < V; ++j) acc[i][j] = fmaf(xv[j], wf[s][j], acc[i][j]);
              }
            }
          }
        } else {
#pragma unroll 1
          for (int s = 0; s < a.F[2]; ++s) {
            {
              const uint4 wraw = ld16u(wrow + (i64)(a.flip ? a.F[2] - 1 - s : s) * C);
              const int cs = clo + s * a.dl[2];
              uint4 xr[TW];
#pragma unroll
              for (int i = 0; i < TW; ++i) {
                const int col = cs + i * a.st[2];
                xr[i] = make_uint4(0u, 0u, 0u, 0u);
                if ((unsigned)col < (unsigned)a.sd[2]) xr[i] = ld16u(rowp + (i64)col * C);
              }
              float wf[V];
              cvt16(wraw, wf, (T*)nullptr);
#pragma unroll
              for (int i = 0; i < TW; ++i) {
                float xv[V];
                cvt16(xr[i], xv, (T*)nullptr);
#pragma unroll
                for (int j = 0; j < V; ++j) acc[i][j] = fmaf(xv[j], wf[j], acc[i][j]);
              }
            }
          }
        }
      }
    }
    const i64 obase = ((((i64)n * a.dd[0] + z) * a.dd[1] + p) * a.dd[2] + q0) * C + c0;
    // the epilogue's copy: no bias where the accumulators started at it, no relu where the
    // store applies it (made here, after the main loop, so that it holds no registers there)
    EpiDev epi = a.epi;
    const bool relu16 = epi_take_relu_to_store(epi, sizeof(T) == 2 && !a.out_f32);
    if (kBiasInAcc && bias_raw) epi.bias = nullptr;
    const bool res_raw = kResidualsAhead && epi.on && epi.residual && epi_raw16_ok<V>(epi, obase);
    uint4 rraw[TW];
    if (res_raw) {
#pragma unroll
      for (int i = 0; i < TW; ++i)
        if (q0 + i < a.dd[2]) rraw[i] = epi_raw16_load<V>(epi.residual, obase + (i64)i * C);
    }
#pragma unroll
    for (int i = 0; i < TW; ++i) {
      if (q0 + i < a.dd[2]) {
        if (epi.on) {
          float bias[V];  // zeros when the accumulators started at the biases
          if (!kBiasInAcc && bias_raw) epi_raw16_unpack<V>(epi, braw, bias);
          else epi_bias_run<V>(epi, c0, V, bias);
          if (res_raw) {
            float res[V];
            epi_raw16_unpack<V>(epi, rraw[i], res);
            epi_apply_run_loaded<V>(epi, obase + (i64)i * C, bias, res, acc[i]);
          } else {
            epi_apply_run<V>(epi, obase + (i64)i * C, bias, acc[i]);
          }
        }
        store_vec<V>(out_ptr<T>(dst, obase + (i64)i * C, a.out_f32), acc[i], a.out_f32, relu16);
      }
    }
  }
}

// Fixed-order reduction of the per-thread tap accumulators acc[rr][s][:] over the lanes of a
// dws wgrad block, one tap at a time; the block's partial filter goes to slice `slice` of `part`.
template <int RM, int S, int V>
__device__ __forceinline__ void dws_wgrad_block_reduce(const float (&acc)[RM][S][V], float* red,
                                                       float* __restrict__ part, const DwsArgs& a,
                                                       i64 slice, int nrows, int cv, int lane) {
  const int C = a.C;
  const int row = a.cb * V;  // floats per lane in `red`
  float* out = part + slice * ((i64)nrows * S * C);
#pragma unroll
  for (int rr = 0; rr < RM; ++rr) {
    if (rr < nrows) {  // uniform over the block
#pragma unroll
      for (int s = 0; s < S; ++s) {
#pragma unroll
        for (int j = 0; j < V; ++j) red[lane * row + cv * V + j] = acc[rr][s][j];
        __syncthreads();
        for (int e = threadIdx.x; e < row; e += blockDim.x) {
          const int ch = blockIdx.y * row + e;
          if (ch < C) {
            float v = 0.f;
            for (int l = 0; l < a.lanes; ++l) v += red[l * row + e];
            out[(i64)(rr * S + s) * C + ch] = v;
          }
        }
        __syncthreads();
      }
    }
  }
}

// Backward-filter partials, filter width 3 along W with unit dilation and W stride ST, at most
// kDwsWgradRows (t, r) filter rows. Thread = V channels x all taps (fp32 accumulators) over the
// strips lane, lane + lanes, ... of its block's slice; dy of the strip is read once, each x row
// once as a window of (TW - 1) * ST + 3 columns. Block-level fixed-order reduction over lanes,
// then one partial filter per (slice, channel chunk) in the workspace (colsum_kernel adds them).
constexpr int kDwsWgradRows = 3;
// 9 * V fp32 accumulators: 128-thread blocks, 3 resident per SM (<= 168 registers, no spills).
constexpr int kDwsWgThreads = 128;

template <typename T, int TW, int ST>
__global__ void __launch_bounds__(kDwsWgThreads, 3)
    dws_wgrad_kernel(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ part,
                     DwsArgs a, i64 strips_per_slice) {
  constexpr int V = Vec16<T>::V;
  constexpr int S = 3;
  constexpr int NC = (TW - 1) * ST + S;
  constexpr int RM = kDwsWgradRows;
  __shared__ float red[kDwsWgThreads * V];
  const int cv = threadIdx.x % a.cb, lane = threadIdx.x / a.cb;
  const int vi = blockIdx.y * a.cb + cv;
  const i64 slice = blockIdx.x;
  const int C = a.C;
  const int c0 = vi * V;
  const bool active = c0 < C;
  const int nrows = a.F[0] * a.F[1];
  float acc[RM][S][V];
#pragma unroll
  for (int rr = 0; rr < RM; ++rr)
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int j = 0; j < V; ++j) acc[rr][s][j] = 0.f;
  if (active) {
    const i64 total = (i64)a.N * a.dd[0] * a.dd[1] * a.nstrips;
    const bool small = total < (i64(1) << 31);
    const i64 s1 = min(total, (slice + 1) * strips_per_slice);
    for (i64 sidx = slice * strips_per_slice + lane; sidx < s1; sidx += a.lanes) {
      int n, z, p, ws;
      dws_decode(sidx, a, small, n, z, p, ws);
      const int q0 = ws * TW;
      const int nq = min(TW, a.dd[2] - q0);  // pixels of the strip inside the row
      float dv[TW][V];
      {
        const T* yp = dy + ((((i64)n * a.dd[0] + z) * a.dd[1] + p) * a.dd[2] + q0) * C + c0;
        uint4 yr[TW];
#pragma unroll
        for (int i = 0; i < TW; ++i) {
          yr[i] = make_uint4(0u, 0u, 0u, 0u);
          if (q0 + i < a.dd[2]) yr[i] = ld16u(yp + (i64)i * C);
        }
#pragma unroll
        for (int i = 0; i < TW; ++i) cvt16(yr[i], dv[i], (T*)nullptr);
      }
      const int clo = q0 * ST - a.pad[2];
      unsigned cok = 0;  // bit c: window column c inside the input row
#pragma unroll
      for (int c = 0; c < NC; ++c) cok |= ((unsigned)(clo + c) < (unsigned)a.sd[2]) ? 1u << c : 0u;
#pragma unroll
      for (int rr = 0; rr < RM; ++rr) {
        if (rr < nrows) {
          const int t = rr / a.F[1], r = rr - t * a.F[1];
          const int id = z * a.st[0] - a.pad[0] + t * a.dl[0];
          const int ih = p * a.st[1] - a.pad[1] + r * a.dl[1];
          if ((unsigned)id < (unsigned)a.sd[0] && (unsigned)ih < (unsigned)a.sd[1]) {
            const T* rowp = x + (((i64)n * a.sd[0] + id) * a.sd[1] + ih) * a.sd[2] * C + c0;
            uint4 win[NC];
#pragma unroll
            for (int c = 0; c < NC; ++c) {
              win[c] = make_uint4(0u, 0u, 0u, 0u);
              if (cok & (1u << c)) win[c] = ld16u(rowp + (i64)(clo + c) * C);
            }
#pragma unroll
            for (int c = 0; c < NC; ++c) {
              float xv[V];
              cvt16(win[c], xv, (T*)nullptr);
#pragma unroll
              for (int s = 0; s < S; ++s) {
                if ((c - s) >= 0 && (c - s) % ST == 0 && (c - s) / ST < TW) {
                  const int i = (c - s) / ST;
                  // pixels past the row end do not exist: skip them (not 0 * x, x may be inf)
                  if (i > 0 && i >= nq) continue;
#pragma unroll
                  for (int j = 0; j < V; ++j) acc[rr][s][j] = fmaf(xv[j], dv[i][j], acc[rr][s][j]);
                }
              }
            }
          }
        }
      }
    }
  }
  dws_wgrad_block_reduce<RM, S, V>(acc, red, part, a, blockIdx.x, nrows, cv, lane);
}

// Backward-filter partials for 2-D depthwise filters R x 3 (R <= 3, T == 1) with unit stride and
// dilation along H: the same thread mapping as dws_wgrad_kernel, but a work item is a run of PR
// consecutive output rows of one strip. The x rows of the run are loaded once each (PR + R - 1
// rows instead of PR * R) and paired, fully unrolled, with the dy rows they meet; dy rows stay
// packed in registers until used. Cuts the x traffic of the row-at-a-time kernel by ~2.4x.
constexpr int kDwsWgRun = 8;

template <typename T, int TW, int ST>
__global__ void __launch_bounds__(kDwsWgThreads, 3)
    dws_wgrad_rows_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                          float* __restrict__ part, DwsArgs a, i64 runs_per_slice) {
  constexpr int V = Vec16<T>::V;
  constexpr int S = 3, PR = kDwsWgRun;
  constexpr int NC = (TW - 1) * ST + S;
  constexpr int RM = kDwsWgradRows;
  __shared__ float red[kDwsWgThreads * V];
  const int cv = threadIdx.x % a.cb, lane = threadIdx.x / a.cb;
  const int vi = blockIdx.y * a.cb + cv;
  const int C = a.C;
  const int c0 = vi * V;
  const int R = a.F[1];
  float acc[RM][S][V];
#pragma unroll
  for (int rr = 0; rr < RM; ++rr)
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int j = 0; j < V; ++j) acc[rr][s][j] = 0.f;
  if (c0 < C) {
    const int nruns_p = (a.dd[1] + PR - 1) / PR;
    const i64 total = (i64)a.N * a.dd[0] * nruns_p * a.nstrips;
    const i64 s1 = min(total, ((i64)blockIdx.x + 1) * runs_per_slice);
    for (i64 ridx = (i64)blockIdx.x * runs_per_slice + lane; ridx < s1; ridx += a.lanes) {
      i64 t = ridx;
      const int ws = (int)(t % a.nstrips); t /= a.nstrips;
      const int pb = (int)(t % nruns_p); t /= nruns_p;
      const int z = (int)(t % a.dd[0]);
      const int n = (int)(t / a.dd[0]);
      const int q0 = ws * TW, p0 = pb * PR;
      const int nq = min(TW, a.dd[2] - q0);  // pixels of the strip inside the row
      const int np = min(PR, a.dd[1] - p0);  // output rows of the run inside the image
      const int clo = q0 * ST - a.pad[2];
      unsigned cok = 0;  // bit c: window column c inside the input row
#pragma unroll
      for (int c = 0; c < NC; ++c) cok |= ((unsigned)(clo + c) < (unsigned)a.sd[2]) ? 1u << c : 0u;
      const int id = z * a.st[0] - a.pad[0];  // T == 1
      if ((unsigned)id >= (unsigned)a.sd[0]) continue;
      const T* yrun = dy + ((((i64)n * a.dd[0] + z) * a.dd[1] + p0) * a.dd[2] + q0) * C + c0;
      const T* ximg = x + (((i64)n * a.sd[0] + id) * a.sd[1]) * a.sd[2] * C + c0;
      uint4 yr[PR][TW];       // packed dy rows of the run (only R of them live at a time)
      uint4 xr[PR + RM - 1][NC];  // packed x rows of the run
      // x row j of the run: input row p0 - pad + j, meets dy row j - r through filter row r
      auto x_row_ok = [&](int j) {
        return j < np + R - 1 && (unsigned)(p0 - a.pad[1] + j) < (unsigned)a.sd[1];
      };
      auto load_x_row = [&](int j) {
        const T* rowp = ximg + (i64)(p0 - a.pad[1] + j) * a.sd[2] * C;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          xr[j][c] = make_uint4(0u, 0u, 0u, 0u);
          if (cok & (1u << c)) xr[j][c] = ld16u(rowp + (i64)(clo + c) * C);
        }
      };
#pragma unroll
      for (int j = 0; j < PR + RM - 1; ++j) {
        if (j < PR) {
#pragma unroll
          for (int i = 0; i < TW; ++i) {
            yr[j][i] = make_uint4(0u, 0u, 0u, 0u);
            if (j < np && q0 + i < a.dd[2]) yr[j][i] = ld16u(yrun + ((i64)j * a.dd[2] + i) * C);
          }
        }
        if (!x_row_ok(j)) continue;
        load_x_row(j);
        float xv[NC][V];
#pragma unroll
        for (int c = 0; c < NC; ++c) cvt16(xr[j][c], xv[c], (T*)nullptr);
        for (int rr = 0; rr < RM; ++rr) {
          const int jp = j - rr;  // dy row of the run
          if (jp < 0 || jp >= PR) continue;
          if (rr >= R || jp >= np) continue;
          float dv[TW][V];
#pragma unroll
          for (int i = 0; i < TW; ++i) cvt16(yr[jp][i], dv[i], (T*)nullptr);
#pragma unroll
          for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int s = 0; s < S; ++s) {
              if ((c - s) >= 0 && (c - s) % ST == 0 && (c - s) / ST < TW) {
                const int i = (c - s) / ST;
                // pixels past the row end do not exist: skip them (not 0 * x, x may be inf)
                if (i > 0 && i >= nq) continue;
#pragma unroll
                for (int e = 0; e < V; ++e) acc[rr][s][e] = fmaf(xv[c][e], dv[i][e], acc[rr][s][e]);
              }
            }
        }
      }
    }
  }
  dws_wgrad_block_reduce<RM, S, V>(acc, red, part, a, blockIdx.x, R, cv, lane);
}

// Backward-filter partials for 2-D depthwise R x 3 filters (R <= 3) with unit strides and
// dilations, staged through shared memory. A work item is a tile of kDwsTileP x kDwsTileQ output
// pixels of one image and the block's channel chunk (blockIdx.y): the block copies the tile's dy
// and its x window ((P + R - 1) x (Q + 2) pixels, zero-filled outside the image) into shared
// memory with cp.async, the next item's copy in flight while the current one is computed, so
// each SM keeps ~100 KB of loads outstanding instead of a few registers' worth per thread. The
// compute is the row kernel's: thread = V channels x all taps (fp32), over 2-pixel strips of the
// tile. Items are dealt round-robin to gridDim.x blocks; each block leaves one partial filter.
constexpr int kDwsTileP = 8, kDwsTileQ = 8, kDwsTileTw = 2;
constexpr int kDwsTileThreads = 256;
constexpr int kDwsTileMaxVec = 20;  // channel vectors per block: <= 52 KB per pipeline stage
constexpr int kDwsTileBlocks = 264;  // two resident blocks on each of H200's 132 SMs

// Shared-memory bytes of one pipeline stage for cvb channel vectors per block.
__host__ __device__ constexpr size_t dws_tile_stage_bytes(int cvb) {
  return (size_t)16 * cvb *
         ((kDwsTileP + kDwsWgradRows - 1) * (kDwsTileQ + 2) + kDwsTileP * kDwsTileQ);
}

template <typename T>
__global__ void __launch_bounds__(kDwsTileThreads, 2)
    dws_wgrad_tile_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                          float* __restrict__ part, DwsArgs a, int tiles_p, int tiles_q) {
  constexpr int V = Vec16<T>::V;
  constexpr int S = 3, TW = kDwsTileTw, NC = TW + S - 1;
  constexpr int BP = kDwsTileP, BQ = kDwsTileQ, XC = BQ + S - 1;
  constexpr int RM = kDwsWgradRows;
  extern __shared__ __align__(16) unsigned char dws_tile_smem[];
  const int cvb = a.cb;                          // channel vectors of this block's chunk
  const int R = a.F[1], XR = BP + R - 1;
  const int xvecs = XR * XC * cvb;
  const size_t stage = dws_tile_stage_bytes(cvb);
  const int C = a.C, H = a.sd[1], W = a.sd[2], P = a.dd[1], Q = a.dd[2];
  const int cvec0 = blockIdx.y * cvb;            // first channel vector of the chunk
  const int nvec = C / V;
  const int cv = threadIdx.x % cvb, lane = threadIdx.x / cvb;
  const unsigned items = (unsigned)a.N * tiles_p * tiles_q;  // < 2^31 (dws_wgrad_tiled)

  // Issues the cp.async copies of item `it` into stage buffer `buf`. Copy thread = channel
  // vector v of pixels l, l + lanes, ... (the compute mapping), so no division by cvb per copy.
  const int v = cv, l = lane;
  const bool copies = l < a.lanes && cvec0 + v < nvec;
  // 32-bit division: a 64-bit one costs about as much as a strip of arithmetic.
  auto load = [&](unsigned it, int buf) {
    uint4* xs = reinterpret_cast<uint4*>(dws_tile_smem + buf * stage);
    uint4* ys = xs + xvecs;
    const int tq = (int)(it % (unsigned)tiles_q);
    const unsigned rest = it / (unsigned)tiles_q;
    const int tp = (int)(rest % (unsigned)tiles_p);
    const int n = (int)(rest / (unsigned)tiles_p);
    const int p0 = tp * BP, q0 = tq * BQ;
    if (copies) {
      const T* ximg = x + (i64)n * H * W * C + (cvec0 + v) * V;
      const int ih0 = p0 - a.pad[1], iw0 = q0 - a.pad[2];
      for (int pix = l; pix < XR * XC; pix += a.lanes) {
        const int r = pix / XC, c = pix - r * XC;  // XC is a compile-time constant
        const int ih = ih0 + r, iw = iw0 + c;
        const bool ok = (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
        gemm::cp_async16(xs + pix * cvb + v, ok ? ximg + ((i64)ih * W + iw) * C : x, ok);
      }
      const T* yimg = dy + (i64)n * P * Q * C + (cvec0 + v) * V;
      for (int pix = l; pix < BP * BQ; pix += a.lanes) {
        const int p = p0 + pix / BQ, q = q0 + pix % BQ;
        const bool ok = p < P && q < Q;
        gemm::cp_async16(ys + pix * cvb + v, ok ? yimg + ((i64)p * Q + q) * C : dy, ok);
      }
    }
    gemm::cp_async_commit();
  };

  float acc[RM][S][V];
#pragma unroll
  for (int rr = 0; rr < RM; ++rr)
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int j = 0; j < V; ++j) acc[rr][s][j] = 0.f;

  int buf = 0;
  if (blockIdx.x < items) load(blockIdx.x, 0);
  for (unsigned it = blockIdx.x; it < items; it += gridDim.x, buf ^= 1) {
    if (it + gridDim.x < items) {
      load(it + gridDim.x, buf ^ 1);
      gemm::cp_async_wait<1>();
    } else {
      gemm::cp_async_wait<0>();
    }
    __syncthreads();
    const uint4* xs = reinterpret_cast<const uint4*>(dws_tile_smem + buf * stage);
    const uint4* ys = xs + xvecs;
    const int tq = (int)(it % (unsigned)tiles_q);
    const int tp = (int)((it / (unsigned)tiles_q) % (unsigned)tiles_p);
    const int np = min(BP, P - tp * BP), nqt = min(BQ, Q - tq * BQ);  // tile pixels in the image
    if (copies) {
      for (int sidx = lane; sidx < BP * (BQ / TW); sidx += a.lanes) {
        const int pr = sidx / (BQ / TW), qs = (sidx % (BQ / TW)) * TW;
        const int nq = min(TW, nqt - qs);  // strip pixels inside the image
        if (pr >= np || nq <= 0) continue;
        float dv[TW][V];
#pragma unroll
        for (int i = 0; i < TW; ++i) cvt16(ys[(pr * BQ + qs + i) * cvb + cv], dv[i], (T*)nullptr);
#pragma unroll
        for (int rr = 0; rr < RM; ++rr) {
          if (rr >= R) continue;
          float xv[NC][V];
#pragma unroll
          for (int c = 0; c < NC; ++c)
            cvt16(xs[((pr + rr) * XC + qs + c) * cvb + cv], xv[c], (T*)nullptr);
#pragma unroll
          for (int s = 0; s < S; ++s)
#pragma unroll
            for (int i = 0; i < TW; ++i) {
              // pixels past the image edge do not exist: skip them (not 0 * x, x may be inf)
              if (i > 0 && i >= nq) continue;
#pragma unroll
              for (int e = 0; e < V; ++e) acc[rr][s][e] = fmaf(xv[i + s][e], dv[i][e], acc[rr][s][e]);
            }
        }
      }
    }
    __syncthreads();  // the buffer is refilled next iteration
  }
  dws_wgrad_block_reduce<RM, S, V>(acc, reinterpret_cast<float*>(dws_tile_smem), part, a,
                                   blockIdx.x, R, cv, lane);
}

// ---------------------------------------------------------------------------------------------
// Grouped / dense NHWC forward and backward-data with 4-channel vectors: C/G and K/G are
// multiples of 4. Thread = 4 destination channels of one group x kPx pixels along W.
//   fwd: dst pixels (z, p, q0 + i); reduction over the group's input channels, 4 at a time.
//   bwd: dst pixels (d, h, rr + sw * (m0 + i)) share one residue rr mod stride_w, so a tap is
//        either valid (up to edges) for all of them or for none; reduction over the group's
//        output channels, 4 at a time.
constexpr int kPx = 4;

template <typename T, bool BWD>
__global__ void __launch_bounds__(256)
    grp_kernel(const T* __restrict__ src, const T* __restrict__ w, void* __restrict__ dst,
               bool out_f32, Geo g, int nwt) {
  const int DCH = BWD ? g.C : g.K, SCH = BWD ? g.K : g.C;
  const int DG = BWD ? g.Cg : g.Kg, SG = BWD ? g.Kg : g.Cg;  // per-group dst / src channels
  const int* dsp = BWD ? g.in : g.out;
  const int* ssp = BWD ? g.out : g.in;
  const int nv = DCH / 4;
  const int sw = g.st[2];
  const i64 total = (i64)g.N * dsp[0] * dsp[1] * nwt * nv;
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (i64)gridDim.x * blockDim.x) {
    int vv, wt, b, a, n;
    if (total < (i64(1) << 31)) {
      unsigned v = (unsigned)idx;
      vv = (int)(v % (unsigned)nv); v /= (unsigned)nv;
      wt = (int)(v % (unsigned)nwt); v /= (unsigned)nwt;
      b = (int)(v % (unsigned)dsp[1]); v /= (unsigned)dsp[1];
      a = (int)(v % (unsigned)dsp[0]); n = (int)(v / (unsigned)dsp[0]);
    } else {
      i64 v = idx;
      vv = (int)(v % nv); v /= nv;
      wt = (int)(v % nwt); v /= nwt;
      b = (int)(v % dsp[1]); v /= dsp[1];
      a = (int)(v % dsp[0]); n = (int)(v / dsp[0]);
    }
    const int dc0 = vv * 4;
    const int grp = dc0 / DG, dloc = dc0 - grp * DG;
    int rr, m0;  // dst W position of pixel i: fwd m0 + i; bwd rr + sw * (m0 + i)
    if (BWD) {
      rr = wt % sw;
      m0 = (wt / sw) * kPx;
    } else {
      rr = 0;
      m0 = wt * kPx;
    }
    float acc[kPx][4];
#pragma unroll
    for (int i = 0; i < kPx; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
    if (!BWD || rr < dsp[2]) {
      for (int t = 0; t < g.filt[0]; ++t) {
        const int sa = BWD ? bwd_src(a, t * g.dl[0], g.st[0], g.pad[0], 1, ssp[0])
                           : fwd_src(a, t * g.dl[0], g.st[0], g.pad[0], 1, ssp[0]);
        if (sa < 0) continue;
        for (int r = 0; r < g.filt[1]; ++r) {
          const int sb = BWD ? bwd_src(b, r * g.dl[1], g.st[1], g.pad[1], 1, ssp[1])
                             : fwd_src(b, r * g.dl[1], g.st[1], g.pad[1], 1, ssp[1]);
          if (sb < 0) continue;
          const i64 rowoff = (((i64)n * ssp[0] + sa) * ssp[1] + sb) * ssp[2];
          for (int s = 0; s < g.filt[2]; ++s) {
            int sc0;  // src W position of pixel 0; pixel i adds i (bwd) or i * sw (fwd)
            if (BWD) {
              const int num = rr + g.pad[2] - s * g.dl[2];
              // floor-mod test on a possibly negative numerator
              if (((num % sw) + sw) % sw) continue;
              sc0 = num / sw + m0;  // exact division
            } else {
              sc0 = m0 * sw - g.pad[2] + s * g.dl[2];
            }
            const int sstep = BWD ? 1 : sw;
            bool ok[kPx];
            bool any = false;
#pragma unroll
            for (int i = 0; i < kPx; ++i) {
              const int sc = sc0 + i * sstep;
              const int dc = BWD ? rr + sw * (m0 + i) : m0 + i;
              ok[i] = dc < dsp[2] && (unsigned)sc < (unsigned)ssp[2];
              any |= ok[i];
            }
            if (!any) continue;
            const int tap = (t * g.filt[1] + r) * g.filt[2] + s;
            const T* sp0 = src + (rowoff + sc0) * SCH + grp * SG;
            const i64 spx = (i64)sstep * SCH;
            for (int u = 0; u < SG; u += 4) {
              float sv[kPx][4];
#pragma unroll
              for (int i = 0; i < kPx; ++i) {
                load4(ok[i] ? sp0 + i * spx + u : src, sv[i]);
                if (!ok[i]) {
#pragma unroll
                  for (int j = 0; j < 4; ++j) sv[i][j] = 0.f;
                }
              }
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                float wv[4];
                if (!BWD) {  // w[tap][ci = u + j][k = grp*Kg + dloc .. +4]
                  load4(w + ((i64)tap * g.Cg + u + j) * g.K + grp * g.Kg + dloc, wv);
#pragma unroll
                  for (int i = 0; i < kPx; ++i)
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) acc[i][kk] = fmaf(sv[i][j], wv[kk], acc[i][kk]);
                } else {  // w[tap][ci = dloc + j][k = grp*Kg + u .. +4]
                  load4(w + ((i64)tap * g.Cg + dloc + j) * g.K + grp * g.Kg + u, wv);
#pragma unroll
                  for (int i = 0; i < kPx; ++i)
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) acc[i][j] = fmaf(sv[i][kk], wv[kk], acc[i][j]);
                }
              }
            }
          }
        }
      }
    }
    if (BWD && rr >= dsp[2]) continue;
    const i64 drow = (((i64)n * dsp[0] + a) * dsp[1] + b) * dsp[2];
    float bias[4];  // the same 4 channels on the kPx pixels
    if (!BWD && g.epi.on) epi_bias_run<4>(g.epi, dc0, 4, bias);
#pragma unroll
    for (int i = 0; i < kPx; ++i) {
      const int dc = BWD ? rr + sw * (m0 + i) : m0 + i;
      if (dc < dsp[2]) {
        if (!BWD && g.epi.on) epi_apply_run<4>(g.epi, (drow + dc) * DCH + dc0, bias, acc[i]);
        store_vec<4>(out_ptr<T>(dst, (drow + dc) * DCH + dc0, out_f32), acc[i], out_f32);
      }
    }
  }
}

// Grouped / dense NHWC backward-filter partials: thread = one tap x 4 input channels x 4 output
// channels (same group) over a contiguous slice of output pixels.
template <typename T>
__global__ void __launch_bounds__(128)
    grp_wgrad_kernel(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ part,
                     Geo g, i64 pix_per_slice) {
  const int nk = g.K / 4, nc = g.Cg / 4;
  const i64 tps = (i64)g.taps * nc * nk;
  const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= tps) return;
  const i64 slice = blockIdx.y;
  const int kv = (int)(e % nk);
  const int cv = (int)((e / nk) % nc);
  const int f = (int)(e / ((i64)nk * nc));
  const int s = f % g.filt[2], r = (f / g.filt[2]) % g.filt[1], t = f / (g.filt[2] * g.filt[1]);
  const int k0 = kv * 4;
  const int c0 = (k0 / g.Kg) * g.Cg + cv * 4;
  const int td = t * g.dl[0], rd = r * g.dl[1], sd = s * g.dl[2];
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  const i64 npix = (i64)g.N * g.out[0] * g.out[1] * g.out[2];
  const i64 p0 = slice * pix_per_slice, p1 = min(npix, p0 + pix_per_slice);
  if (p0 < p1) {
    PixelWalker pw;
    pw.start(p0, g.out);
    constexpr int U = 4;  // pixels per step: all loads issued before the arithmetic
    for (i64 pix = p0; pix < p1; pix += U) {
      float xv[U][4], dv[U][4];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int id = pw.z * g.st[0] - g.pad[0] + td;
        const int ih = pw.p * g.st[1] - g.pad[1] + rd;
        const int iw = pw.q * g.st[2] - g.pad[2] + sd;
        const bool ok = pix + u < p1 && (unsigned)id < (unsigned)g.in[0] &&
                        (unsigned)ih < (unsigned)g.in[1] && (unsigned)iw < (unsigned)g.in[2];
        const i64 xo = ok ? ((((i64)pw.n * g.in[0] + id) * g.in[1] + ih) * g.in[2] + iw) * g.C + c0 : 0;
        const i64 yo = ok ? (pix + u) * g.K + k0 : 0;
        load4(x + xo, xv[u]);
        load4(dy + yo, dv[u]);
        if (!ok) {
#pragma unroll
          for (int j = 0; j < 4; ++j) xv[u][j] = 0.f;
        }
        pw.next(g.out);
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xv[u][i], dv[u][j], acc[i][j]);
    }
  }
  float* out = part + slice * ((i64)g.K * g.Cg * g.taps);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    *reinterpret_cast<float4*>(out + ((i64)f * g.Cg + cv * 4 + i) * g.K + k0) =
        make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
}

// ---------------------------------------------------------------------------------------------
// Host side.
enum class Kern { kNone, kDws, kDw, kGrp, kGen };

constexpr int kWgradTargetThreads = 132 * 1024;  // about one wave of resident threads on H200
constexpr int kMaxSlices = 4096;

bool fits_int(int64_t v) { return v >= -(int64_t(1) << 30) && v <= (int64_t(1) << 30); }

int vec16(DType t) { return static_cast<int>(16 / dtype_bytes(t)); }

Geo make_geo(const ConvProblem& p) {
  Geo g{};
  g.N = (int)p.N, g.C = (int)p.C, g.K = (int)p.K, g.G = (int)p.G;
  g.Cg = (int)p.Cg(), g.Kg = (int)p.Kg();
  g.M = p.C > 0 ? (int)(p.K / p.C) : 1;
  for (int i = 0; i < 3; ++i) {
    g.in[i] = (int)p.in[i], g.out[i] = (int)p.out[i], g.filt[i] = (int)p.filt[i];
    g.st[i] = (int)p.stride[i], g.dl[i] = (int)p.dilation[i], g.lhs[i] = (int)p.lhs_dilation[i];
    g.pad[i] = (int)p.pad_lo[i];
  }
  g.taps = (int)p.filt_taps();
  g.nhwc = p.layout == Layout::kNHWC;
  return g;
}

// Strip widths (output pixels along W per thread) of the dws kernels: TW * V = 32 fp32
// accumulators per thread for forward / backward-data; wgrad holds 9 * V accumulators plus the
// converted dy of its strip.
constexpr int kDwsTw16 = 4, kDwsTw32 = 8;            // fwd / dgrad, 16-bit and f32
constexpr int kDwsWgTw16 = 2, kDwsWgTw32 = 4;        // wgrad
constexpr int kDwsMaxChunks = 65535;                 // gridDim.y

int dws_tw(const CudaConvCall& c) {
  const bool f32 = c.in == DType::kF32;
  if (c.op == ConvOp::kBackwardFilter) return f32 ? kDwsWgTw32 : kDwsWgTw16;
  return f32 ? kDwsTw32 : kDwsTw16;
}

// Block shape of the dws kernels: cb channel vectors x lanes strips (cb * lanes <= threads),
// nchunks channel chunks.
void dws_shape(int64_t nvec, int threads, int* cb, int* lanes, int64_t* nchunks) {
  *nchunks = (nvec + 63) / 64;
  *cb = (int)((nvec + *nchunks - 1) / *nchunks);  // <= 64
  *lanes = threads / *cb;
}
int dws_threads(const CudaConvCall& c) {
  return c.op == ConvOp::kBackwardFilter ? kDwsWgThreads : kDwsThreads;
}

// dws backward-filter over runs of output rows (dws_wgrad_rows_kernel): T == 1 and unit stride
// and dilation along H.
bool dws_wgrad_by_rows(const CudaConvCall& c) {
  const ConvProblem& p = c.problem;
  return p.filt[0] == 1 && p.stride[1] == 1 && p.dilation[1] == 1;
}

// dws backward-filter through shared-memory tiles (dws_wgrad_tile_kernel): 16-bit, 2-D (or 1-D)
// R x 3 filters with unit strides and dilations (fp32 measured faster on the row kernel). JAXDNN_DWS_WGRAD_ROWS=1 (testing) keeps the row kernels.
bool dws_wgrad_tiled(const CudaConvCall& c) {
  const ConvProblem& p = c.problem;
  static const bool rows_only = std::getenv("JAXDNN_DWS_WGRAD_ROWS") != nullptr;
  return !rows_only && c.in != DType::kF32 && p.in[0] == 1 && p.filt[0] == 1 && p.out[0] == 1 && p.stride[1] == 1 &&
         p.stride[2] == 1 && p.dilation[1] == 1 && p.dilation[2] == 1 && p.filt[2] == 3 &&
         p.filt[1] <= kDwsWgradRows &&
         p.N * ((p.out[1] + kDwsTileP - 1) / kDwsTileP) * ((p.out[2] + kDwsTileQ - 1) / kDwsTileQ) <
             (int64_t(1) << 31);
}

// Channel chunks of the tiled dws wgrad: at most kDwsTileMaxVec vectors each, balanced.
void dws_tile_shape(int64_t nvec, int* cvb, int* lanes, int64_t* nchunks) {
  *nchunks = (nvec + kDwsTileMaxVec - 1) / kDwsTileMaxVec;
  *cvb = (int)((nvec + *nchunks - 1) / *nchunks);
  *lanes = kDwsTileThreads / *cvb;
}
size_t dws_tile_smem_bytes(int cvb, int V) {
  return std::max(2 * dws_tile_stage_bytes(cvb), (size_t)kDwsTileThreads * V * sizeof(float));
}

// Does the dws family (depthwise, multiplier 1) take this call? A function of the call alone.
bool dws_supported(const CudaConvCall& c) {
  const ConvProblem& p = c.problem;
  const int V = vec16(c.in);
  if (!(p.G == p.C && p.K == p.C && p.C % V == 0)) return false;
  if ((p.C / V + 63) / 64 > kDwsMaxChunks) return false;
  // column arithmetic of the last strip (up to 8 pixels past the row end) stays in int
  if (!fits_int((p.out[2] + p.in[2] + 8) * p.stride[2] + p.dilation[2] * p.filt[2] +
                std::abs(p.pad_lo[2])))
    return false;
  switch (c.op) {
    case ConvOp::kForward:
      return p.filt[2] <= kDwsMaxS;
    case ConvOp::kBackwardData:
      return p.filt[2] <= kDwsMaxS && p.stride[0] == 1 && p.stride[1] == 1 && p.stride[2] == 1;
    case ConvOp::kBackwardFilter:
      return p.filt[2] == 3 && p.dilation[2] == 1 && (p.stride[2] == 1 || p.stride[2] == 2) &&
             p.filt[0] * p.filt[1] <= kDwsWgradRows;
  }
  return false;
}

Kern select_direct(const CudaConvCall& c) {
  const ConvProblem& p = c.problem;
  if (c.in == DType::kF64 || p.layout != Layout::kNHWC || !p.unit_lhs_dilation())
    return Kern::kGen;
  if (dws_supported(c)) return Kern::kDws;
  const int V = vec16(c.in);
  if (p.G == p.C && p.filt_taps() <= kMaxDwTaps && p.K % V == 0 &&
      (c.op != ConvOp::kBackwardData || p.K == p.C))
    return Kern::kDw;
  if (p.Cg() % 4 == 0 && p.Kg() % 4 == 0) return Kern::kGrp;
  return Kern::kGen;
}

// Depthwise block shape: cb channel vectors x lanes pixel rows (cb * lanes <= kDwThreads).
void dw_shape(int nvec, int* cb, int* lanes, int* nchunks) {
  *cb = std::min(nvec, 64);
  *lanes = kDwThreads / *cb;
  *nchunks = (nvec + *cb - 1) / *cb;
}

struct WgradPlan {
  int slices = 0;
  int64_t pix_per_slice = 0;  // output pixels per slice (dws: strips per slice)
  size_t bytes = 0;
};

WgradPlan wgrad_plan(const CudaConvCall& c, Kern k) {
  const ConvProblem& p = c.problem;
  WgradPlan w;
  const int64_t npix = p.N * p.out_pixels();
  if (npix <= 0) return w;
  int64_t slices;
  if (k == Kern::kDws && c.op == ConvOp::kBackwardFilter && dws_wgrad_tiled(c)) {
    // One slice per block of the grid: two resident blocks per SM across all channel chunks.
    int cvb, lanes;
    int64_t nchunks;
    dws_tile_shape(p.C / vec16(c.in), &cvb, &lanes, &nchunks);
    const int64_t items = p.N * ((p.out[1] + kDwsTileP - 1) / kDwsTileP) *
                          ((p.out[2] + kDwsTileQ - 1) / kDwsTileQ);
    w.slices = (int)std::max<int64_t>(
        1, std::min<int64_t>(items, std::max<int64_t>(1, kDwsTileBlocks / nchunks)));
    w.pix_per_slice = 0;  // items are dealt round-robin
    w.bytes = (size_t)w.slices * (size_t)p.w_elems() * 4;
    return w;
  }
  if (k == Kern::kDws) {
    // Slices of the flattened (n, z, p, strip) index: ~792 blocks in all (two waves of 3
    // resident 128-thread blocks per SM on H200's 132 SMs), and at least ~2 strips per lane.
    int cb, lanes;
    int64_t nchunks;
    dws_shape(p.C / vec16(c.in), dws_threads(c), &cb, &lanes, &nchunks);
    const int tw = dws_tw(c);
    const int64_t rows = dws_wgrad_by_rows(c) ? (p.out[1] + kDwsWgRun - 1) / kDwsWgRun : p.out[1];
    const int64_t strips = p.N * p.out[0] * rows * ((p.out[2] + tw - 1) / tw);  // work items
    if (dws_wgrad_by_rows(c)) {
      // one wave of 3 resident blocks per SM (H200: 132 SMs), every lane the same number of runs
      const int64_t per_lane =
          std::max<int64_t>(1, (strips * nchunks + int64_t(lanes) * 396 - 1) / (int64_t(lanes) * 396));
      slices = std::max<int64_t>(1, (strips + per_lane * lanes - 1) / (per_lane * lanes));
    } else {
      slices = std::max<int64_t>(1, 792 / nchunks);
      slices = std::min<int64_t>(slices, (strips + 2 * lanes - 1) / (2 * lanes));
    }
    slices = std::max<int64_t>(1, std::min<int64_t>(slices, kMaxSlices));
    w.pix_per_slice = (strips + slices - 1) / slices;  // strips per slice
    w.slices = (int)((strips + w.pix_per_slice - 1) / w.pix_per_slice);
    w.bytes = (size_t)w.slices * (size_t)p.w_elems() * 4;
    return w;
  } else if (k == Kern::kDw) {
    int cb, lanes, nchunks;
    dw_shape((int)(p.K / vec16(c.in)), &cb, &lanes, &nchunks);
    slices = std::max<int64_t>(1, 528 / nchunks);  // ~2 waves of 2 blocks per SM on H200
    slices = std::min<int64_t>(slices, (npix + lanes - 1) / lanes);
  } else {
    const int64_t tps = k == Kern::kGrp ? p.filt_taps() * (p.Cg() / 4) * (p.K / 4) : p.w_elems();
    slices = std::max<int64_t>(1, (kWgradTargetThreads + tps - 1) / tps);
    slices = std::min<int64_t>(slices, (npix + 7) / 8);  // at least ~8 pixels per thread
  }
  slices = std::max<int64_t>(1, std::min<int64_t>(slices, kMaxSlices));
  w.pix_per_slice = (npix + slices - 1) / slices;
  w.slices = (int)((npix + w.pix_per_slice - 1) / w.pix_per_slice);
  const size_t acc = c.in == DType::kF64 ? 8 : 4;
  w.bytes = (size_t)w.slices * (size_t)p.w_elems() * acc;
  return w;
}

// Kernel arguments of the dws family in forward form (see DwsArgs).
DwsArgs dws_args(const CudaConvCall& c, int tw, int64_t* nchunks) {
  const ConvProblem& p = c.problem;
  const bool bwd = c.op == ConvOp::kBackwardData;
  DwsArgs a{};
  a.N = (int)p.N, a.C = (int)p.C;
  for (int i = 0; i < 3; ++i) {
    a.sd[i] = (int)(bwd ? p.out[i] : p.in[i]);
    a.dd[i] = (int)(bwd ? p.in[i] : p.out[i]);
    a.F[i] = (int)p.filt[i];
    a.dl[i] = (int)p.dilation[i];
    a.st[i] = bwd ? 1 : (int)p.stride[i];
    a.pad[i] = (int)(bwd ? p.dilation[i] * (p.filt[i] - 1) - p.pad_lo[i] : p.pad_lo[i]);
  }
  a.nstrips = (a.dd[2] + tw - 1) / tw;
  dws_shape(p.C / vec16(c.in), dws_threads(c), &a.cb, &a.lanes, nchunks);
  a.flip = bwd;
  a.out_f32 = c.out == DType::kF32 && c.in != DType::kF32;
  return a;
}

std::string launch_check(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return std::string("CUDA error launching ") + what + ": " + cudaGetErrorString(e);
  return "";
}

int grid_1d(int64_t total, int threads) {
  int64_t b = (total + threads - 1) / threads;
  return (int)std::min<int64_t>(std::max<int64_t>(b, 1), 1 << 20);  // grid-stride beyond
}

template <typename T>
std::string run_typed(const CudaConvCall& c, const CudaConvBuffers& io, Kern kern) {
  using Acc = typename AccOf<T>::type;
  const ConvProblem& p = c.problem;
  Geo g = make_geo(p);
  if (c.op == ConvOp::kForward) g.epi = make_epi(io.epi, p, c.out);
  const bool out_f32 = c.out == DType::kF32 && c.in != DType::kF32;
  const T* a = static_cast<const T*>(io.a);
  const T* b = static_cast<const T*>(io.b);
  cudaStream_t st = io.stream;
  const int64_t out_elems = c.op == ConvOp::kForward        ? p.y_elems()
                            : c.op == ConvOp::kBackwardData ? p.x_elems()
                                                            : p.w_elems();
  if (out_elems == 0) return "";

  if (c.op == ConvOp::kBackwardFilter) {
    WgradPlan plan = wgrad_plan(c, kern);
    if (plan.slices == 0) {  // empty reduction: dw = 0
      cudaError_t e = cudaMemsetAsync(io.out, 0, (size_t)out_elems * dtype_bytes(c.out), st);
      if (e != cudaSuccess) return std::string("CUDA error in memset: ") + cudaGetErrorString(e);
      return "";
    }
    if (io.workspace_size < plan.bytes || (plan.bytes && io.workspace == nullptr))
      return "workspace too small for DIRECT backward-filter";
    Acc* part = static_cast<Acc*>(io.workspace);
    if (kern == Kern::kDws) {
      if constexpr (!std::is_same_v<T, double>) {
        constexpr int TW = std::is_same_v<T, float> ? kDwsWgTw32 : kDwsWgTw16;
        int64_t nchunks;
        const DwsArgs da = dws_args(c, TW, &nchunks);
        dim3 grid((unsigned)plan.slices, (unsigned)nchunks);
        if (dws_wgrad_tiled(c)) {
          DwsArgs ta = da;
          int64_t tchunks;
          dws_tile_shape(p.C / Vec16<T>::V, &ta.cb, &ta.lanes, &tchunks);
          const size_t smem = dws_tile_smem_bytes(ta.cb, Vec16<T>::V);
          auto tile_kern = dws_wgrad_tile_kernel<T>;
          cudaError_t e = cudaFuncSetAttribute(
              tile_kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
          if (e != cudaSuccess) return std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e);
          const int tiles_p = (int)((p.out[1] + kDwsTileP - 1) / kDwsTileP);
          const int tiles_q = (int)((p.out[2] + kDwsTileQ - 1) / kDwsTileQ);
          tile_kern<<<dim3((unsigned)plan.slices, (unsigned)tchunks), kDwsTileThreads, smem, st>>>(
              a, b, part, ta, tiles_p, tiles_q);
        } else if (dws_wgrad_by_rows(c)) {
          if (p.stride[2] == 1)
            dws_wgrad_rows_kernel<T, TW, 1><<<grid, da.cb * da.lanes, 0, st>>>(a, b, part, da,
                                                                              plan.pix_per_slice);
          else
            dws_wgrad_rows_kernel<T, TW, 2><<<grid, da.cb * da.lanes, 0, st>>>(a, b, part, da,
                                                                              plan.pix_per_slice);
        } else if (p.stride[2] == 1)
          dws_wgrad_kernel<T, TW, 1><<<grid, da.cb * da.lanes, 0, st>>>(a, b, part, da,
                                                                       plan.pix_per_slice);
        else
          dws_wgrad_kernel<T, TW, 2><<<grid, da.cb * da.lanes, 0, st>>>(a, b, part, da,
                                                                       plan.pix_per_slice);
      }
    } else if (kern == Kern::kDw) {
      if constexpr (!std::is_same_v<T, double>) {
        int cb, lanes, nchunks;
        dw_shape(g.K / Vec16<T>::V, &cb, &lanes, &nchunks);
        DwTaps tp{};
        for (int f = 0; f < g.taps; ++f) {
          tp.t[f] = (f / (g.filt[1] * g.filt[2])) * g.dl[0];
          tp.r[f] = ((f / g.filt[2]) % g.filt[1]) * g.dl[1];
          tp.s[f] = (f % g.filt[2]) * g.dl[2];
        }
        dw_wgrad_kernel<T><<<plan.slices * nchunks, kDwThreads, 0, st>>>(a, b, part, g, tp, cb, lanes,
                                                                 nchunks, plan.pix_per_slice);
      }
    } else if (kern == Kern::kGrp) {
      if constexpr (!std::is_same_v<T, double>) {
        const int64_t tps = (int64_t)g.taps * (g.Cg / 4) * (g.K / 4);
        dim3 grid((unsigned)((tps + 127) / 128), (unsigned)plan.slices);
        grp_wgrad_kernel<T><<<grid, 128, 0, st>>>(a, b, part, g, plan.pix_per_slice);
      }
    } else {
      dim3 grid((unsigned)((p.w_elems() + 255) / 256), (unsigned)plan.slices);
      gen_wgrad_kernel<T><<<grid, 256, 0, st>>>(a, b, part, g, plan.pix_per_slice);
    }
    if (auto e = launch_check("DIRECT backward-filter"); !e.empty()) return e;
    dim3 cgrid((unsigned)((p.w_elems() + 31) / 32));
    colsum_kernel<Acc><<<cgrid, dim3(32, 32), 0, st>>>(part, plan.slices, p.w_elems(), io.out,
                                                         c.out);
    return launch_check("DIRECT backward-filter reduction");
  }

  const bool bwd = c.op == ConvOp::kBackwardData;
  if (!bwd && p.x_elems() == 0 && g.epi.on) return epi_fill(g.epi, io.out, out_elems, st);
  if ((bwd ? p.y_elems() : p.x_elems()) == 0) {  // nothing to gather from: the result is zero
    cudaError_t e = cudaMemsetAsync(io.out, 0, (size_t)out_elems * dtype_bytes(c.out), st);
    if (e != cudaSuccess) return std::string("CUDA error in memset: ") + cudaGetErrorString(e);
    return "";
  }
  if (kern == Kern::kDws) {
    if constexpr (!std::is_same_v<T, double>) {
      constexpr int TW = std::is_same_v<T, float> ? kDwsTw32 : kDwsTw16;
      int64_t nchunks;
      DwsArgs da = dws_args(c, TW, &nchunks);
      da.epi = g.epi;
      const int64_t total = (int64_t)da.N * da.dd[0] * da.dd[1] * da.nstrips;
      const int64_t sblocks = std::min<int64_t>((total + da.lanes - 1) / da.lanes, 1 << 24);
      dim3 grid((unsigned)sblocks, (unsigned)nchunks);
      const int threads = da.cb * da.lanes;
      const bool slide = p.stride[2] == 1 && p.dilation[2] == 1;  // dgrad: stride 1 always
      if (slide && p.filt[2] == 3)
        dws_kernel<T, TW, 3><<<grid, threads, 0, st>>>(a, b, io.out, da);
      else if (slide && p.filt[2] == 5)
        dws_kernel<T, TW, 5><<<grid, threads, 0, st>>>(a, b, io.out, da);
      else if (slide && p.filt[2] == 7)
        dws_kernel<T, TW, 7><<<grid, threads, 0, st>>>(a, b, io.out, da);
      else
        dws_kernel<T, TW, 0><<<grid, threads, 0, st>>>(a, b, io.out, da);
    }
  } else if (kern == Kern::kDw) {
    if constexpr (!std::is_same_v<T, double>) {
      constexpr int V = Vec16<T>::V;
      const int dch = bwd ? g.C : g.K;
      int cb, lanes, nchunks;
      dw_shape(dch / V, &cb, &lanes, &nchunks);
      DwTaps tp{};
      for (int f = 0; f < g.taps; ++f) {
        tp.t[f] = (f / (g.filt[1] * g.filt[2])) * g.dl[0];
        tp.r[f] = ((f / g.filt[2]) % g.filt[1]) * g.dl[1];
        tp.s[f] = (f % g.filt[2]) * g.dl[2];
      }
      const int* dsp = bwd ? g.in : g.out;
      const int64_t npix = (int64_t)g.N * dsp[0] * dsp[1] * dsp[2];
      const int ppt = (int)std::max<int64_t>(1, std::min<int64_t>(8, npix / ((int64_t)lanes * 1024)));
      const int64_t pblocks = (npix + (int64_t)lanes * ppt - 1) / ((int64_t)lanes * ppt);
      if (pblocks * nchunks > INT32_MAX) return "problem too large for the depthwise kernel";
      const unsigned blocks = (unsigned)(pblocks * nchunks);
      if (bwd)
        dw_kernel<T, true><<<blocks, kDwThreads, 0, st>>>(a, b, io.out, out_f32, g, tp, cb, lanes,
                                                   nchunks, ppt);
      else
        dw_kernel<T, false><<<blocks, kDwThreads, 0, st>>>(a, b, io.out, out_f32, g, tp, cb, lanes,
                                                    nchunks, ppt);
    }
  } else if (kern == Kern::kGrp) {
    if constexpr (!std::is_same_v<T, double>) {
      const int* dsp = bwd ? g.in : g.out;
      const int dch = bwd ? g.C : g.K;
      const int sw = g.st[2];
      const int nwt = bwd ? sw * (((dsp[2] + sw - 1) / sw + kPx - 1) / kPx)
                          : (dsp[2] + kPx - 1) / kPx;
      const int64_t total = (int64_t)g.N * dsp[0] * dsp[1] * nwt * (dch / 4);
      if (bwd)
        grp_kernel<T, true><<<grid_1d(total, 256), 256, 0, st>>>(a, b, io.out, out_f32, g, nwt);
      else
        grp_kernel<T, false><<<grid_1d(total, 256), 256, 0, st>>>(a, b, io.out, out_f32, g, nwt);
    }
  } else {
    if (bwd)
      gen_bwd_data_kernel<T><<<grid_1d(out_elems, 256), 256, 0, st>>>(a, b, io.out, c.out, g);
    else
      gen_fwd_kernel<T><<<grid_1d(out_elems, 256), 256, 0, st>>>(a, b, io.out, c.out, g);
  }
  return launch_check(bwd ? "DIRECT backward-data" : "DIRECT forward");
}

}  // namespace

std::string direct_can_implement(const CudaConvCall& c) {
  const ConvProblem& p = c.problem;
  if (std::string why = validate_problem(p); !why.empty()) return why;
  // Every quantity the kernels index with int must fit comfortably.
  if (!fits_int(p.N) || !fits_int(p.C) || !fits_int(p.K) || !fits_int(p.filt_taps()))
    return "DIRECT: batch or channel counts too large";
  for (int i = 0; i < 3; ++i) {
    if (!fits_int(p.in[i] * p.lhs_dilation[i] + std::abs(p.pad_lo[i]) + std::abs(p.pad_hi[i])) ||
        !fits_int(p.out[i] * p.stride[i] + std::abs(p.pad_lo[i])) ||
        !fits_int(p.filt[i] * p.dilation[i]))
      return "DIRECT: spatial extents too large";
  }
  if (p.N * p.out_pixels() > (int64_t(1) << 40) || p.N * p.in_pixels() > (int64_t(1) << 40))
    return "DIRECT: too many pixels";
  return "";
}

size_t direct_workspace_bytes(const CudaConvCall& c) {
  if (c.op != ConvOp::kBackwardFilter || !direct_can_implement(c).empty()) return 0;
  return wgrad_plan(c, select_direct(c)).bytes;
}

std::string direct_run(const CudaConvCall& c, const CudaConvBuffers& io) {
  if (std::string why = direct_can_implement(c); !why.empty()) return why;
  Kern k = select_direct(c);
  // Vector kernels need 16-byte aligned base pointers (XLA and cudaMalloc give 256).
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const ConvEpilogue& e = io.epi;
  if (k != Kern::kGen && (!aligned(io.a) || !aligned(io.b) || !aligned(io.out) ||
                          (io.workspace && !aligned(io.workspace)) || !aligned(e.bias) ||
                          !aligned(e.residual) || !aligned(e.preact))) {
    if (c.op == ConvOp::kBackwardFilter &&
        wgrad_plan(c, Kern::kGen).bytes > io.workspace_size)
      return "DIRECT: unaligned buffers and workspace too small for the generic kernel";
    k = Kern::kGen;
  }
  switch (c.in) {
    case DType::kF32: return run_typed<float>(c, io, k);
    case DType::kF64: return run_typed<double>(c, io, k);
    case DType::kBF16: return run_typed<__nv_bfloat16>(c, io, k);
    case DType::kF16: return run_typed<__half>(c, io, k);
  }
  return "DIRECT: unknown dtype";
}

}  // namespace jaxdnn::cuda
