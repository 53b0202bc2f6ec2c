// Standalone check of the CUDA pooling kernels (ffi/cuda/pool_cuda.cu) through run_pool, against
// a straightforward host reference that follows pool_problem.h and the CPU kernels' arithmetic:
//   max forward     max over the in-bounds taps (NaN wins)                     compared by value
//   gather          tangent at the arg-max (first tap, replaced unless s >= v;   bitwise
//                   padding is a -inf candidate with tangent 0)
//   scatter         dy onto the arg-max, summed over covering windows in         bitwise
//                   increasing tap order (float accumulation for 16-bit)
//   avg forward     window-order sum / divisor (counting region)                 bitwise expected;
//                                                                              error bound decides
//   avg backward    sum of dy * (1/divisor) with fused multiply-adds             the same
// over many geometries (1-D/2-D/3-D, padding, dilation, ceil-mode extension, windows larger than
// the input, empty outputs, uncovered inputs, global windows, > 255 taps), channel counts
// (1, 3, odd, multiples of 8), all four dtypes, three value patterns (normal; ties with signed
// zeros; NaN/+-inf), and misaligned buffers (the scalar fallback). Outputs start as a sentinel,
// so unwritten elements fail.
//
// Usage: check [quick|full] [bench] [--no-check] [--only NAME_PART] [--csv FILE]
// JAXDNN_POOL_SPLIT=0/1 (read by pool_cuda.cu) forces the forward's plain / split kernels;
// JAXDNN_POOL_CHAN=0 turns the channel tiles off, =TH,TW,CB forces their sizes.
// Prints a summary line; exits 1 on any failure. Compiles with nvcc (a GPU) or, through
// emulate.sh, with g++ against the emulated runtime in emu/ (host execution, sanitizers); with
// -DJAXDNN_POOL_CHECK_CPU the kernels under test are the CPU ones (pool_cpu.cc), which checks
// that this reference is the CPU backend's contract.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "host_fp.h"
#include "jaxdnn/pool_problem.h"
#include "pool_cuda.h"
#ifdef JAXDNN_POOL_CHECK_CPU
#include "pool_cpu.h"
#endif

using namespace jaxdnn;
using i64 = int64_t;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__);   \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Element access in host buffers of any dtype.

size_t dsize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    default: return 2;
  }
}
const char* dname(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBF16: return "bf16";
    default: return "f16";
  }
}

double get(DType t, const std::vector<unsigned char>& b, i64 i) {
  switch (t) {
    case DType::kF32: { float v; std::memcpy(&v, &b[i * 4], 4); return v; }
    case DType::kF64: { double v; std::memcpy(&v, &b[i * 8], 8); return v; }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      return hostfp::bf16_to_float(h);
    }
    default: {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      return hostfp::f16_to_float(h);
    }
  }
}

// Stores v rounded to the dtype (v is already float for the 16-bit types' accumulators).
void put(DType t, std::vector<unsigned char>& b, i64 i, double v) {
  switch (t) {
    case DType::kF32: { float f = static_cast<float>(v); std::memcpy(&b[i * 4], &f, 4); break; }
    case DType::kF64: std::memcpy(&b[i * 8], &v, 8); break;
    case DType::kBF16: {
      const uint16_t h = hostfp::float_to_bf16(static_cast<float>(v));
      std::memcpy(&b[i * 2], &h, 2);
      break;
    }
    default: {
      const uint16_t h = hostfp::float_to_f16(static_cast<float>(v));
      std::memcpy(&b[i * 2], &h, 2);
      break;
    }
  }
}

uint64_t bits(DType t, const std::vector<unsigned char>& b, i64 i) {
  uint64_t r = 0;
  std::memcpy(&r, &b[i * dsize(t)], dsize(t));
  return r;
}

// ---------------------------------------------------------------------------------------------
// Problems.

struct Spec {
  const char* name;
  int nsd;
  i64 N, C;
  std::vector<i64> in, win, st, dl, plo, phi;
  bool include_pad = true;
  bool ceil = false;
};

// PyTorch's ceil_mode as extra high padding (jaxdnn/pooling.py's _ceil_extension).
i64 ceil_extension(i64 size, i64 eff, i64 stride, i64 lo, i64 hi) {
  const i64 span = size + lo + hi - eff;  // negative: a window longer than the padded input
  i64 out = (span >= 0 ? (span + stride - 1) / stride : -(-span / stride)) + 1;
  if ((out - 1) * stride >= size + lo) out -= 1;
  out = std::max(out, span >= 0 ? span / stride + 1 : 0);
  return out > 0 ? (out - 1) * stride + eff - (size + lo + hi) : 0;
}

PoolProblem make(const Spec& s) {
  PoolProblem p;
  p.N = s.N;
  p.C = s.C;
  for (int d = 0; d < 3; ++d) {
    const int j = d - (3 - s.nsd);
    const bool real = j >= 0;
    p.in[d] = real ? s.in[j] : 1;
    p.window[d] = real ? s.win[j] : 1;
    p.stride[d] = real && !s.st.empty() ? s.st[j] : 1;
    p.dilation[d] = real && !s.dl.empty() ? s.dl[j] : 1;
    const i64 lo = real && !s.plo.empty() ? s.plo[j] : 0;
    i64 hi = real && !s.phi.empty() ? s.phi[j] : 0;
    p.pad_lo[d] = lo;
    p.count_lo[d] = s.include_pad ? lo : 0;
    p.count_hi[d] = s.include_pad ? hi : 0;
    const i64 eff = (p.window[d] - 1) * p.dilation[d] + 1;
    if (s.ceil) hi += ceil_extension(p.in[d], eff, p.stride[d], lo, hi);
    const i64 span = p.in[d] + lo + hi - (p.window[d] - 1) * p.dilation[d];
    p.out[d] = span <= 0 ? 0 : (span - 1) / p.stride[d] + 1;
  }
  return p;
}

std::vector<Spec> specs() {
  std::vector<Spec> v;
  auto add = [&](Spec s) { v.push_back(std::move(s)); };
  // name, nsd, N, C, in, win, st, dl, pad_lo, pad_hi, include_pad, ceil
  add({"stem3x3s2p1", 2, 2, 64, {15, 16}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}});
  add({"c1-3x3s2-same-excl", 2, 6, 1, {9, 8}, {3, 3}, {2, 2}, {}, {0, 1}, {1, 1}, false});
  add({"c3-asym", 2, 2, 3, {7, 6}, {2, 3}, {1, 2}, {}, {1, 2}, {0, 1}});
  add({"window>input", 2, 1, 2, {3, 2}, {5, 4}, {1, 1}, {}, {2, 1}, {2, 2}, false});
  add({"dilated-c5", 2, 2, 5, {8, 9}, {3, 2}, {2, 3}, {2, 3}, {1, 0}, {1, 1}});
  add({"ceil-c8-excl", 2, 2, 8, {8, 7}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, false, true});
  add({"ceil-c8-incl", 2, 2, 8, {8, 7}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, true, true});
  add({"ceil-2x2s2-c17", 2, 2, 17, {6, 7}, {2, 2}, {2, 2}, {}, {}, {}, true, true});
  add({"1d-c4", 1, 3, 4, {11}, {4}, {3}, {}, {1}, {2}});
  add({"1d-dil-ceil-c16", 1, 3, 16, {10}, {3}, {2}, {2}, {1}, {1}, false, true});
  add({"3d-c3", 3, 1, 3, {5, 6, 7}, {2, 3, 2}, {2, 2, 1}, {}, {0, 1, 0}, {1, 1, 1}});
  add({"3d-dil-ceil-c24", 3, 1, 24, {5, 6, 5}, {3, 2, 2}, {2, 1, 2}, {1, 2, 1}, {1, 0, 1},
       {1, 1, 0}, false, true});
  add({"global7x7-c64", 2, 4, 64, {7, 7}, {7, 7}});
  add({"global7x7-c1", 2, 40, 1, {7, 7}, {7, 7}});
  add({"global18x18-c8", 2, 2, 8, {18, 18}, {18, 18}});  // 324 taps: int32 arg-max
  add({"1d-260taps-c2", 1, 2, 2, {300}, {260}, {7}, {}, {3}, {0}});
  add({"empty-out", 2, 2, 8, {2, 2}, {3, 3}});
  add({"gaps-s3w2", 2, 2, 8, {9, 9}, {2, 2}, {3, 3}});
  add({"all-padding-c1", 2, 1, 1, {2, 2}, {2, 2}, {1, 1}, {}, {3, 0}, {0, 0}, false});
  add({"neg-padding", 1, 2, 8, {10}, {3}, {2}, {}, {-1}, {-2}});
  add({"c13-2x2s2", 2, 2, 13, {12, 12}, {2, 2}, {2, 2}});
  add({"c12-3x3s1-same", 2, 2, 12, {5, 5}, {3, 3}, {1, 1}, {}, {1, 1}, {1, 1}});
  add({"avg2x2s2-c256", 2, 2, 256, {8, 8}, {2, 2}, {2, 2}});
  add({"overlap3x3s1-c40", 2, 1, 40, {6, 7}, {3, 3}, {1, 1}, {}, {1, 1}, {1, 1}});
  add({"4x4s1p1-c8", 2, 2, 8, {10, 10}, {4, 4}, {1, 1}, {}, {1, 1}, {1, 1}});
  add({"c1-5x5s1-same", 2, 3, 1, {9, 11}, {5, 5}, {1, 1}, {}, {2, 2}, {2, 2}, false});
  add({"empty-in-padded", 1, 2, 8, {0}, {1}, {1}, {}, {2}, {0}});
  add({"batch0", 2, 0, 8, {4, 4}, {2, 2}, {2, 2}});
  // Walks across load batches (8 taps), rows and planes with padding between them; covering
  // windows of stride 3 with dilation 1; split runs of several batches; one-channel strides.
  add({"5x5s3p2-c16", 2, 2, 16, {13, 11}, {5, 5}, {3, 3}, {}, {2, 2}, {2, 2}});
  add({"3d-3x3x3s1p1-excl-c8", 3, 1, 8, {4, 5, 6}, {3, 3, 3}, {1, 1, 1}, {}, {1, 1, 1},
       {1, 1, 1}, false});
  add({"3d-2x3x2-dil-c16", 3, 1, 16, {5, 6, 5}, {2, 3, 2}, {1, 2, 2}, {2, 1, 2}, {1, 0, 1},
       {0, 1, 1}});
  add({"global9x9-c24", 2, 3, 24, {9, 9}, {9, 9}});
  add({"global11x13-c1", 2, 7, 1, {11, 13}, {11, 13}});
  add({"c1-3x3s2p1-ceil", 2, 3, 1, {11, 12}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, true, true});
  add({"r50stem-c64", 2, 1, 64, {14, 13}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}});
  add({"2x2s2-valid-c32-odd", 2, 2, 32, {7, 7}, {2, 2}, {2, 2}});
  add({"window>input-dil-c8", 2, 1, 8, {3, 4}, {4, 3}, {1, 2}, {2, 2}, {3, 2}, {3, 2}});
  // Channel tiles (chan_tile_kernel: 16-byte channel vectors, several tiles down and across,
  // halos of 1-2 outputs) and 2x2 cells (cell_avg_kernel); emulate.sh / run.sh also force tiny
  // tiles (JAXDNN_POOL_CHAN=2,3,1) so that the small specs above cross tile borders.
  add({"ct-3x3s2p1-c16", 2, 2, 16, {37, 70}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}});
  add({"ct-3x3s1-same-c8", 2, 1, 8, {19, 40}, {3, 3}, {1, 1}, {}, {1, 1}, {1, 1}});
  add({"ct-5x5s3p2-ceil-c24", 2, 1, 24, {26, 35}, {5, 5}, {3, 3}, {}, {2, 2}, {2, 2}, true, true});
  add({"ct-dil2-c8", 2, 1, 8, {21, 36}, {3, 3}, {2, 1}, {2, 2}, {1, 2}, {2, 1}});
  add({"ct-negpad-c8", 2, 1, 8, {23, 41}, {3, 2}, {2, 2}, {}, {-1, 1}, {-2, 0}});
  add({"ct-gaps-2x2s3-c16", 2, 1, 16, {20, 35}, {2, 2}, {3, 3}});
  add({"ct-3d-1x3x3-c8", 3, 1, 8, {3, 18, 17}, {1, 3, 3}, {1, 2, 2}, {}, {0, 1, 1}, {0, 1, 1}});
  add({"ct-global5x5-c64", 2, 2, 64, {5, 5}, {5, 5}});
  add({"cells-2x2s2-odd-ceil-c16", 2, 2, 16, {9, 7}, {2, 2}, {2, 2}, {}, {1, 0}, {0, 0}, false,
       true});
  add({"cells-2x2s2-3d-c8", 3, 1, 8, {2, 6, 10}, {1, 2, 2}, {1, 2, 2}});
  // Quads (quad_kernel: 3x3 stride 2, 16-byte vectors): every padding from -1 to 2, odd and
  // even extents, inputs that no window covers (VALID), a single window, ceil_mode, depth.
  add({"q-3x3s2-valid-c16", 2, 2, 16, {9, 10}, {3, 3}, {2, 2}});
  add({"q-3x3s2-same-c8", 2, 2, 8, {8, 11}, {3, 3}, {2, 2}, {}, {0, 0}, {1, 1}});
  add({"q-3x3s2p2-excl-c8", 2, 1, 8, {7, 6}, {3, 3}, {2, 2}, {}, {2, 2}, {2, 2}, false});
  add({"q-3x3s2-negpad-c16", 2, 1, 16, {11, 12}, {3, 3}, {2, 2}, {}, {-1, 0}, {0, -1}});
  add({"q-3x3s2p1-tiny-c8", 2, 3, 8, {1, 2}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, false});
  add({"q-3x3s2p1-ceil-c32", 2, 2, 32, {12, 13}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, true, true});
  add({"q-3d-1x3x3s2-c8", 3, 2, 8, {2, 9, 8}, {1, 3, 3}, {1, 2, 2}, {}, {0, 1, 0}, {0, 1, 1}});
  add({"q-3x3s2p1-c3", 2, 2, 3, {10, 9}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}});  // 1-element vectors
  // One window over a padded input (global_avg_bwd_kernel), counting the padding or not.
  add({"global-pad-excl-c1", 2, 3, 1, {5, 6}, {7, 8}, {1, 1}, {}, {1, 1}, {1, 1}, false});
  add({"global-pad-incl-c24", 2, 2, 24, {5, 6}, {6, 8}, {1, 1}, {}, {1, 1}, {0, 1}, true});
  // One-channel images large enough for the tiled forward (partial tiles, 1-4 rows a thread).
  add({"c1-tiles-3x3s2p1", 2, 3, 1, {40, 37}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}});
  // one-channel row vectors (16-byte rows, low width padding 1): odd output rows, a partial last
  // column group (f32: 4 outputs of 2), exclusive counts with high padding, ceil mode (the
  // extension keeps out <= in / 2 only sometimes: else the quads), a 3-D problem's depth
  // folded into the planes, and widths of 8 (one vector) and 40
  add({"c1-rowvec-3x3s2p1", 2, 3, 1, {13, 24}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}});
  add({"c1-rowvec-excl-hi2", 2, 2, 1, {9, 40}, {3, 3}, {2, 2}, {}, {2, 1}, {2, 1}, false});
  add({"c1-rowvec-ceil", 2, 2, 1, {12, 16}, {3, 3}, {2, 2}, {}, {1, 1}, {0, 0}, true, true});
  add({"c1-rowvec-w8-hpad0", 2, 5, 1, {6, 8}, {3, 3}, {2, 2}, {}, {0, 1}, {0, 0}});
  add({"c1-rowvec-3d", 3, 2, 1, {3, 7, 16}, {1, 3, 3}, {1, 2, 2}, {}, {0, 1, 1}, {0, 1, 1}});
  add({"c1-tiles-2x2s2", 2, 2, 1, {34, 66}, {2, 2}, {2, 2}});
  add({"c1-tiles-3x3s1-same-excl", 2, 2, 1, {20, 35}, {3, 3}, {1, 1}, {}, {1, 1}, {1, 1}, false});
  add({"c1-tiles-dil2", 2, 1, 1, {24, 40}, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {2, 2}});
  add({"c1-tiles-ceil-excl", 2, 2, 1, {33, 35}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, false, true});
  add({"c1-tiles-2x2s1-tall", 2, 1, 1, {64, 40}, {2, 2}, {1, 1}});
  return v;
}

// ---------------------------------------------------------------------------------------------
// Host reference.

struct Ref {
  const PoolProblem& p;
  DType t;

  i64 xi(i64 n, const i64 i[3], i64 c) const {
    return (((n * p.in[0] + i[0]) * p.in[1] + i[1]) * p.in[2] + i[2]) * p.C + c;
  }
  i64 yi(i64 n, const i64 o[3], i64 c) const {
    return (((n * p.out[0] + o[0]) * p.out[1] + o[1]) * p.out[2] + o[2]) * p.C + c;
  }

  // fn(tap, inside, input index) for every tap of output o in window order.
  template <typename Fn>
  void taps(i64 n, const i64 o[3], i64 c, Fn&& fn) const {
    i64 k[3], i[3];
    for (k[0] = 0; k[0] < p.window[0]; ++k[0])
      for (k[1] = 0; k[1] < p.window[1]; ++k[1])
        for (k[2] = 0; k[2] < p.window[2]; ++k[2]) {
          bool inside = true;
          for (int d = 0; d < 3; ++d) {
            i[d] = o[d] * p.stride[d] - p.pad_lo[d] + k[d] * p.dilation[d];
            inside = inside && i[d] >= 0 && i[d] < p.in[d];
          }
          fn((k[0] * p.window[1] + k[1]) * p.window[2] + k[2], inside,
             inside ? xi(n, i, c) : -1);
        }
  }

  template <typename Fn>
  void outputs(Fn&& fn) const {
    i64 o[3];
    for (i64 n = 0; n < p.N; ++n)
      for (o[0] = 0; o[0] < p.out[0]; ++o[0])
        for (o[1] = 0; o[1] < p.out[1]; ++o[1])
          for (o[2] = 0; o[2] < p.out[2]; ++o[2])
            for (i64 c = 0; c < p.C; ++c) fn(n, o, c);
  }

  template <typename Fn>
  void inputs(Fn&& fn) const {
    i64 i[3];
    for (i64 n = 0; n < p.N; ++n)
      for (i[0] = 0; i[0] < p.in[0]; ++i[0])
        for (i[1] = 0; i[1] < p.in[1]; ++i[1])
          for (i[2] = 0; i[2] < p.in[2]; ++i[2])
            for (i64 c = 0; c < p.C; ++c) fn(n, i, c);
  }

  i64 divisor(const i64 o[3]) const {
    i64 f = 1;
    for (int d = 0; d < 3; ++d) {
      i64 cnt = 0;
      for (i64 k = 0; k < p.window[d]; ++k) {
        const i64 pos = o[d] * p.stride[d] - p.pad_lo[d] + k * p.dilation[d];
        cnt += pos >= -p.count_lo[d] && pos < p.in[d] + p.count_hi[d];
      }
      f *= cnt;
    }
    return f;
  }

  // (tap, output) pairs of the windows covering input index i along d, increasing tap.
  std::vector<std::pair<i64, i64>> covering(int d, i64 i) const {
    std::vector<std::pair<i64, i64>> r;
    for (i64 k = 0; k < p.window[d]; ++k) {
      const i64 t = i + p.pad_lo[d] - k * p.dilation[d];
      if (t < 0) break;
      if (t % p.stride[d] != 0 || t / p.stride[d] >= p.out[d]) continue;
      r.push_back({k, t / p.stride[d]});
    }
    return r;
  }

  template <typename Fn>
  void for_covering(const i64 i[3], Fn&& fn) const {
    const auto l0 = covering(0, i[0]), l1 = covering(1, i[1]), l2 = covering(2, i[2]);
    const i64 count = static_cast<i64>(l0.size() * l1.size() * l2.size());
    for (auto& a : l0)
      for (auto& b : l1)
        for (auto& c : l2) {
          const i64 o[3] = {a.second, b.second, c.second};
          fn((a.first * p.window[1] + b.first) * p.window[2] + c.first, o, count);
        }
  }

  template <typename A>
  void max_forward(const std::vector<unsigned char>& x, std::vector<unsigned char>& y) const {
    outputs([&](i64 n, const i64 o[3], i64 c) {
      A m = -std::numeric_limits<A>::infinity();
      taps(n, o, c, [&](i64, bool inside, i64 xi_) {
        if (!inside) return;
        const A v = static_cast<A>(get(t, x, xi_));
        m = (v > m || v != v) ? v : m;
      });
      put(t, y, yi(n, o, c), m);
    });
  }

  // Arg-max tap per output (-1: padding), and the tangent there if `tan` is given.
  template <typename A>
  void select(const std::vector<unsigned char>& x, const std::vector<unsigned char>* tan,
              std::vector<i64>& arg, std::vector<unsigned char>* y) const {
    arg.assign(p.y_elems(), -1);
    outputs([&](i64 n, const i64 o[3], i64 c) {
      A s = std::numeric_limits<A>::quiet_NaN(), g = 0;
      i64 k_sel = -1;
      taps(n, o, c, [&](i64 k, bool inside, i64 xi_) {
        const A v = inside ? static_cast<A>(get(t, x, xi_)) : -std::numeric_limits<A>::infinity();
        if (!(s >= v)) {
          s = v;
          k_sel = inside ? k : -1;
          g = inside && tan ? static_cast<A>(get(t, *tan, xi_)) : A(0);
        }
      });
      arg[yi(n, o, c)] = k_sel;
      if (y) put(t, *y, yi(n, o, c), g);
    });
  }

  template <typename A>
  void scatter(const std::vector<i64>& arg, const std::vector<unsigned char>& dy,
               std::vector<unsigned char>& dx) const {
    inputs([&](i64 n, const i64 i[3], i64 c) {
      A acc = 0;
      for_covering(i, [&](i64 k, const i64 o[3], i64) {
        const i64 j = yi(n, o, c);
        acc += arg[j] == k ? static_cast<A>(get(t, dy, j)) : A(0);
      });
      put(t, dx, xi(n, i, c), acc);
    });
  }

  // Also the double-precision value and its error scale (sum of |terms|) per output.
  template <typename A>
  void avg_forward(const std::vector<unsigned char>& x, std::vector<unsigned char>& y,
                   std::vector<double>& exact, std::vector<double>& scale,
                   std::vector<i64>& terms) const {
    exact.assign(p.y_elems(), 0);
    scale.assign(p.y_elems(), 0);
    terms.assign(p.y_elems(), 0);
    outputs([&](i64 n, const i64 o[3], i64 c) {
      A sum = 0;
      double s64 = 0, a64 = 0;
      i64 count = 0;
      taps(n, o, c, [&](i64, bool inside, i64 xi_) {
        if (!inside) return;
        const double v = get(t, x, xi_);
        sum += static_cast<A>(v);
        s64 += v;
        a64 += std::fabs(v);
        ++count;
      });
      const i64 div = divisor(o);
      const i64 j = yi(n, o, c);
      put(t, y, j, sum / static_cast<A>(div));
      exact[j] = s64 / static_cast<double>(div);
      scale[j] = a64 / static_cast<double>(div);
      terms[j] = count;
    });
  }

  template <typename A>
  void avg_backward(const std::vector<unsigned char>& dy, std::vector<unsigned char>& dx,
                    std::vector<double>& exact, std::vector<double>& scale,
                    std::vector<i64>& terms) const {
    exact.assign(p.x_elems(), 0);
    scale.assign(p.x_elems(), 0);
    terms.assign(p.x_elems(), 0);
    inputs([&](i64 n, const i64 i[3], i64 c) {
      A acc = 0;
      double s64 = 0, a64 = 0;
      i64 cnt = 0;
      for_covering(i, [&](i64, const i64 o[3], i64 count) {
        const double d = get(t, dy, yi(n, o, c));
        const A inv = A(1) / static_cast<A>(divisor(o));
        acc = count == 1 ? static_cast<A>(d) * inv : std::fma(static_cast<A>(d), inv, acc);
        s64 += d / static_cast<double>(divisor(o));
        a64 += std::fabs(d / static_cast<double>(divisor(o)));
        cnt = count;
      });
      const i64 j = xi(n, i, c);
      put(t, dx, j, acc);
      exact[j] = s64;
      scale[j] = a64;
      terms[j] = cnt;
    });
  }
};

// ---------------------------------------------------------------------------------------------
// Values.

enum class Pattern { kNormal, kTies, kSpecial };
const char* pname(Pattern p) {
  return p == Pattern::kNormal ? "normal" : p == Pattern::kTies ? "ties" : "special";
}

std::vector<unsigned char> values(DType t, i64 n, Pattern pat, uint64_t seed,
                                  bool finite = false) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> small(-2, 2), coin(0, 1), pick(0, 9);
  std::vector<unsigned char> b(n * dsize(t));
  const double inf = std::numeric_limits<double>::infinity();
  for (i64 i = 0; i < n; ++i) {
    double v = normal(rng);
    if (pat == Pattern::kTies) {
      v = small(rng);
      if (v == 0 && coin(rng)) v = -0.0;
    } else if (pat == Pattern::kSpecial && !finite) {
      const int r = pick(rng);
      if (r == 0) v = std::numeric_limits<double>::quiet_NaN();
      else if (r == 1) v = inf;
      else if (r == 2 || r == 3) v = -inf;
    }
    put(t, b, i, v);
  }
  return b;
}

// ---------------------------------------------------------------------------------------------
// Device runs.

struct DevBuf {
  unsigned char* base = nullptr;
  unsigned char* ptr = nullptr;
  size_t bytes = 0;
  DevBuf(size_t n, size_t offset) : bytes(n) {
    CK(cudaMalloc(reinterpret_cast<void**>(&base), n + offset + 16));
    ptr = base + offset;
  }
  ~DevBuf() { cudaFree(base); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<unsigned char>& h) {
    if (!h.empty()) CK(cudaMemcpy(ptr, h.data(), h.size(), cudaMemcpyHostToDevice));
  }
  void fill(int byte) { CK(cudaMemset(base, byte, bytes + 16)); }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> h(bytes);
    if (bytes) CK(cudaMemcpy(h.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

// Runs op on the device; returns the result (or an empty vector with *err set).
std::vector<unsigned char> run_device(PoolOp op, const PoolProblem& p, DType t,
                                      const std::vector<unsigned char>& a,
                                      const std::vector<unsigned char>* b, size_t out_bytes,
                                      bool misalign, std::string* err) {
  const size_t off = misalign ? dsize(t) : 0;
  DevBuf da(a.size(), off), db(b ? b->size() : 0, off), dout(out_bytes, off);
#ifdef JAXDNN_POOL_CHECK_CPU
  const size_t ws_bytes = cpu::pool_workspace_bytes(op, p);
#else
  const size_t ws_bytes = cuda::pool_workspace_bytes(op, p);
#endif
  DevBuf dws(ws_bytes, misalign ? 4 : 0);  // int32 arg-max entries need 4-byte alignment
  da.upload(a);
  if (b) db.upload(*b);
  dout.fill(0x5a);  // sentinel: unwritten outputs do not match
  dws.fill(0x3c);
#ifdef JAXDNN_POOL_CHECK_CPU
  *err = cpu::run_pool(op, p, t, da.ptr, b ? db.ptr : nullptr, dout.ptr, dws.ptr, ws_bytes);
#else
  *err = cuda::run_pool(op, p, t, da.ptr, b ? db.ptr : nullptr, dout.ptr, dws.ptr, ws_bytes,
                        nullptr);
#endif
  const cudaError_t sync = cudaDeviceSynchronize();
  if (err->empty() && sync != cudaSuccess) *err = cudaGetErrorString(sync);
  return dout.download();
}

// ---------------------------------------------------------------------------------------------
// Comparison.

struct Tally {
  long compared = 0, failed = 0, runs = 0, inexact = 0, printed = 0;
  void fail(const std::string& what) {
    ++failed;
    if (printed++ < 40) std::printf("FAIL %s\n", what.c_str());
  }
};

bool same_value(double a, double b) { return (a == b) || (a != a && b != b); }

std::string where(const char* op, const Spec& s, DType t, Pattern pat, bool mis, i64 i) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s %s %s %s%s at %lld", op, s.name, dname(t), pname(pat),
                mis ? " misaligned" : "", static_cast<long long>(i));
  return buf;
}

// Exact comparison: by value (max forward: +0 == -0) or by bits (NaN matches any NaN).
void compare_exact(Tally& tl, const char* op, const Spec& s, DType t, Pattern pat, bool mis,
                   const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                   bool by_value) {
  const i64 n = static_cast<i64>(want.size() / dsize(t));
  for (i64 i = 0; i < n; ++i) {
    ++tl.compared;
    const double g = get(t, got, i), w = get(t, want, i);
    const bool ok = by_value ? same_value(g, w)
                             : (bits(t, got, i) == bits(t, want, i) || (g != g && w != w));
    if (!ok) {
      char buf[128];
      std::snprintf(buf, sizeof(buf), ": got %.9g want %.9g", g, w);
      tl.fail(where(op, s, t, pat, mis, i) + buf);
    }
  }
}

// Rounded sums: bitwise equality with the reference is expected but only counted; failure is
// an error beyond the bound (terms + 2) * eps(accumulator) * scale + rounding to the dtype.
void compare_sum(Tally& tl, const char* op, const Spec& s, DType t, Pattern pat, bool mis,
                 const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                 const std::vector<double>& exact, const std::vector<double>& scale,
                 const std::vector<i64>& terms) {
  const double eps_acc = t == DType::kF64 ? 0x1p-53 : 0x1p-24;
  const double eps_out = t == DType::kF64 ? 0x1p-53 : t == DType::kF32 ? 0x1p-24
                         : t == DType::kBF16 ? 0x1p-8 : 0x1p-11;
  const double abs_out = t == DType::kF16 ? 0x1p-25 : t == DType::kBF16 ? 0x1p-134 : 0;
  const i64 n = static_cast<i64>(want.size() / dsize(t));
  for (i64 i = 0; i < n; ++i) {
    ++tl.compared;
    const double g = get(t, got, i), w = get(t, want, i);
    if (bits(t, got, i) == bits(t, want, i) || (g != g && w != w)) continue;
    ++tl.inexact;
    bool ok;
    if (!std::isfinite(w) || !std::isfinite(g)) {
      ok = same_value(g, w);
    } else {
      const double bound = 2 * ((terms[i] + 2) * eps_acc * scale[i] + eps_out * std::fabs(exact[i]))
                           + abs_out;
      ok = std::fabs(g - exact[i]) <= bound;
    }
    if (!ok) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), ": got %.9g want %.9g (exact %.12g)", g, w, exact[i]);
      tl.fail(where(op, s, t, pat, mis, i) + buf);
    }
  }
}

template <typename A>
void check_case(Tally& tl, const Spec& s, DType t, Pattern pat, bool mis, uint64_t seed) {
  const PoolProblem p = make(s);
  const Ref ref{p, t};
  const size_t xb = p.x_elems() * dsize(t), yb = p.y_elems() * dsize(t);
  const auto x = values(t, p.x_elems(), pat, seed);
  const auto tan = values(t, p.x_elems(), Pattern::kNormal, seed + 1);
  const auto dy = values(t, p.y_elems(), Pattern::kNormal, seed + 2);
  std::string err;
  auto device = [&](PoolOp op, const std::vector<unsigned char>& a,
                    const std::vector<unsigned char>* b, size_t bytes, const char* name) {
    ++tl.runs;
    auto r = run_device(op, p, t, a, b, bytes, mis, &err);
    if (!err.empty()) tl.fail(where(name, s, t, pat, mis, -1) + ": " + err);
    return r;
  };
  std::vector<unsigned char> want_y(yb), want_x(xb);
  std::vector<i64> arg;
  std::vector<double> exact, scale;
  std::vector<i64> terms;

  ref.max_forward<A>(x, want_y);
  compare_exact(tl, "max_fwd", s, t, pat, mis,
                device(PoolOp::kMaxForward, x, nullptr, yb, "max_fwd"), want_y, true);

  ref.select<A>(x, &tan, arg, &want_y);
  compare_exact(tl, "gather", s, t, pat, mis, device(PoolOp::kMaxGather, x, &tan, yb, "gather"),
                want_y, false);

  ref.scatter<A>(arg, dy, want_x);
  compare_exact(tl, "scatter", s, t, pat, mis, device(PoolOp::kMaxScatter, x, &dy, xb, "scatter"),
                want_x, false);

  ref.avg_forward<A>(x, want_y, exact, scale, terms);
  compare_sum(tl, "avg_fwd", s, t, pat, mis, device(PoolOp::kAvgForward, x, nullptr, yb, "avg_fwd"),
              want_y, exact, scale, terms);

  ref.avg_backward<A>(dy, want_x, exact, scale, terms);
  compare_sum(tl, "avg_bwd", s, t, pat, mis,
              device(PoolOp::kAvgBackward, dy, nullptr, xb, "avg_bwd"), want_x, exact, scale,
              terms);
}

// Refusals: the workspace check and the extent limits.
#ifndef JAXDNN_POOL_CHECK_CPU
void check_errors(Tally& tl) {
  Spec s{"errors", 2, 1, 8, {6, 6}, {3, 3}, {1, 1}};
  PoolProblem p = make(s);
  const size_t need = cuda::pool_workspace_bytes(PoolOp::kMaxScatter, p);
  ++tl.compared;
  if (need != static_cast<size_t>(p.y_elems()))
    tl.fail("workspace of a 9-tap scatter is not one byte per output");
  std::string e = cuda::run_pool(PoolOp::kMaxScatter, p, DType::kF32, nullptr, nullptr, nullptr,
                                 nullptr, need - 1, nullptr);
  ++tl.compared;
  if (e.find("workspace") == std::string::npos) tl.fail("a short workspace was accepted: " + e);
  p.in[2] = i64(1) << 40;
  ++tl.compared;
  if (cuda::pool_can_implement(p).empty()) tl.fail("a 2^40 extent was accepted");
  Spec big{"big-window", 2, 1, 1, {20, 20}, {16, 16}};
  ++tl.compared;
  if (cuda::pool_workspace_bytes(PoolOp::kMaxScatter, make(big)) !=
      static_cast<size_t>(4 * make(big).y_elems()))
    tl.fail("workspace of a 256-tap scatter is not int32 per output");
}
#endif

// ---------------------------------------------------------------------------------------------
// Timing (GPU only): ResNet-50 shapes, bf16 NHWC, N = 32.

#ifndef JAXDNN_POOL_EMULATION
struct BenchCase {
  const char* name;
  Spec spec;
};

void bench(const char* csv_path) {
  const DType t = DType::kBF16;
  std::vector<BenchCase> cases = {
      {"maxpool3x3s2p1 32x112x112x64",
       {"", 2, 32, 64, {112, 112}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}}},
      {"maxpool3x3s2p1 NCHW 32x64x112x112",
       {"", 2, 32 * 64, 1, {112, 112}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}}},
      {"avgpool3x3s2p1 32x112x112x64",
       {"", 2, 32, 64, {112, 112}, {3, 3}, {2, 2}, {}, {1, 1}, {1, 1}}},
      {"avgpool2x2s2 32x112x112x64", {"", 2, 32, 64, {112, 112}, {2, 2}, {2, 2}}},
      {"avgpool2x2s2 32x56x56x256", {"", 2, 32, 256, {56, 56}, {2, 2}, {2, 2}}},
      {"avgpool2x2s2 32x7x7x2048", {"", 2, 32, 2048, {7, 7}, {2, 2}, {2, 2}}},
      {"avgpool3x3s1 excl 32x28x28x256",
       {"", 2, 32, 256, {28, 28}, {3, 3}, {1, 1}, {}, {1, 1}, {1, 1}, false}},
      {"global avg 32x7x7x2048", {"", 2, 32, 2048, {7, 7}, {7, 7}}},
      {"global avg NCHW 32x2048x7x7", {"", 2, 32 * 2048, 1, {7, 7}, {7, 7}}},
      {"avgpool2x2s2 NCHW 32x256x56x56", {"", 2, 32 * 256, 1, {56, 56}, {2, 2}, {2, 2}}},
      {"global max 32x7x7x2048", {"", 2, 32, 2048, {7, 7}, {7, 7}}},
  };
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv) std::fprintf(csv, "case,op,us,GBps\n");
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  {  // The device's copy bandwidth for scale: 64 MB read + 64 MB written.
    const size_t bytes = size_t(64) << 20;
    DevBuf a(bytes, 0), b(bytes, 0);
    CK(cudaMemset(a.ptr, 1, bytes));
    for (int i = 0; i < 3; ++i) CK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice,
                                                   stream));
    std::vector<float> ms;
    for (int trial = 0; trial < 7; ++trial) {
      CK(cudaEventRecord(e0, stream));
      for (int i = 0; i < 20; ++i)
        CK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, stream));
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      float m;
      CK(cudaEventElapsedTime(&m, e0, e1));
      ms.push_back(m / 20);
    }
    std::sort(ms.begin(), ms.end());
    const double us = ms[ms.size() / 2] * 1e3;
    std::printf("BENCH %-36s %-4s %9.2f us %8.1f GB/s\n", "cudaMemcpy D2D 64MB", "copy", us,
                2.0 * bytes / (us * 1e-6) / 1e9);
    if (csv) std::fprintf(csv, "%s,%s,%.3f,%.1f\n", "cudaMemcpy D2D 64MB", "copy", us,
                          2.0 * bytes / (us * 1e-6) / 1e9);
  }
  const char* only = std::getenv("POOL_BENCH_ONLY");  // a substring of the case names
  for (const BenchCase& bc : cases) {
    if (only != nullptr && *only != 0 && std::strstr(bc.name, only) == nullptr) continue;
    const PoolProblem p = make(bc.spec);
    const size_t xb = p.x_elems() * dsize(t), yb = p.y_elems() * dsize(t);
    const bool is_max = std::string(bc.name).find("max") != std::string::npos;
    DevBuf x(xb, 0), x2(xb, 0), y(yb, 0), y2(yb, 0), dx(xb, 0);
    DevBuf ws(cuda::pool_workspace_bytes(PoolOp::kMaxScatter, p), 0);
    x.upload(values(t, p.x_elems(), Pattern::kNormal, 1));
    x2.upload(values(t, p.x_elems(), Pattern::kNormal, 2));
    y2.upload(values(t, p.y_elems(), Pattern::kNormal, 3));
    struct OpRun {
      const char* op;
      PoolOp kind;
      const void* a;
      const void* b;
      void* out;
      double bytes;
    };
    std::vector<OpRun> ops;
    if (is_max) {
      ops = {{"fwd", PoolOp::kMaxForward, x.ptr, nullptr, y.ptr, double(xb + yb)},
             {"jvp", PoolOp::kMaxGather, x.ptr, x2.ptr, y.ptr, double(2 * xb + yb)},
             {"bwd", PoolOp::kMaxScatter, x.ptr, y2.ptr, dx.ptr, double(2 * xb + yb)}};
    } else {
      ops = {{"fwd", PoolOp::kAvgForward, x.ptr, nullptr, y.ptr, double(xb + yb)},
             {"bwd", PoolOp::kAvgBackward, y2.ptr, nullptr, dx.ptr, double(xb + yb)}};
    }
    for (const OpRun& r : ops) {
      auto launch = [&] {
        std::string e = cuda::run_pool(r.kind, p, t, r.a, r.b, r.out, ws.ptr, ws.bytes, stream);
        if (!e.empty()) { std::printf("bench error: %s\n", e.c_str()); std::exit(2); }
      };
      // POOL_BENCH_REPS=1 POOL_BENCH_TRIALS=1 POOL_BENCH_WARMUP=0: one launch per op (profilers).
      static const auto env_int = [](const char* name, int fallback) {
        const char* v = std::getenv(name);
        return v != nullptr && *v != 0 ? std::atoi(v) : fallback;
      };
      for (int i = 0; i < env_int("POOL_BENCH_WARMUP", 3); ++i) launch();
      CK(cudaStreamSynchronize(stream));
      const int reps = env_int("POOL_BENCH_REPS", 20), trials = env_int("POOL_BENCH_TRIALS", 7);
      std::vector<float> ms;
      for (int trial = 0; trial < trials; ++trial) {
        CK(cudaEventRecord(e0, stream));
        for (int i = 0; i < reps; ++i) launch();
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float m;
        CK(cudaEventElapsedTime(&m, e0, e1));
        ms.push_back(m / reps);
      }
      std::sort(ms.begin(), ms.end());
      const double us = ms[ms.size() / 2] * 1e3;
      const double gbps = r.bytes / (us * 1e-6) / 1e9;
      std::printf("BENCH %-36s %-4s %9.2f us %8.1f GB/s\n", bc.name, r.op, us, gbps);
      if (csv) std::fprintf(csv, "%s,%s,%.3f,%.1f\n", bc.name, r.op, us, gbps);
    }
  }
  if (csv) std::fclose(csv);
  cudaStreamDestroy(stream);
}
#endif

// ---------------------------------------------------------------------------------------------

#if defined(JAXDNN_POOL_EMULATION) && defined(__F16C__)
#include <immintrin.h>
// The emulated conversions against the CPU's F16C instructions (exhaustive for half -> float,
// sampled float -> half).
bool f16_selftest() {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = hostfp::f16_to_float(static_cast<uint16_t>(h));
    const float b = _cvtsh_ss(static_cast<unsigned short>(h));
    if (!(hostfp::float_to_bits(a) == hostfp::float_to_bits(b) || (a != a && b != b))) return false;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < (1 << 24); ++i) {
    uint32_t b = rng();
    if (i & 1) b = (b & 0x8fffffffu) | 0x30000000u;  // near the half range
    const float f = hostfp::bits_to_float(b);
    const uint16_t mine = hostfp::float_to_f16(f);
    const uint16_t hw = static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
    if (f != f) { if ((mine & 0x7c00) != 0x7c00 || (mine & 0x3ff) == 0) return false; continue; }
    if (mine != hw) return false;
  }
  return true;
}
#endif

int main(int argc, char** argv) {
  bool full = false, do_bench = false, do_check = true;
  const char* csv = nullptr;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "full") full = true;
    else if (a == "quick") full = false;
    else if (a == "bench") do_bench = true;
    else if (a == "--no-check") do_check = false;
    else if (a == "--csv" && i + 1 < argc) csv = argv[++i];
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
  }
  Tally tl;
#if defined(JAXDNN_POOL_EMULATION) && defined(__F16C__)
  ++tl.compared;
  if (!f16_selftest()) tl.fail("host float16 conversions disagree with F16C");
#endif
#ifndef JAXDNN_POOL_CHECK_CPU
  check_errors(tl);
#endif
  const auto all = specs();
  const DType dtypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};
  const Pattern patterns[] = {Pattern::kNormal, Pattern::kTies, Pattern::kSpecial};
  int cases = 0;
  uint64_t seed = 11;
  for (size_t si = 0; do_check && si < all.size(); ++si) {
    const Spec& s = all[si];
    if (!only.empty() && std::string(s.name).find(only) == std::string::npos) continue;
    for (DType t : dtypes) {
      for (Pattern pat : patterns) {
        if (!full && (t == DType::kF64 || t == DType::kF16) && pat != Pattern::kTies) continue;
        if (!full && pat == Pattern::kSpecial && si % 2) continue;
        for (int mis = 0; mis < 2; ++mis) {
          // Misaligned buffers (scalar fallback) on every third spec, or all of them in full.
          if (mis && !(full || si % 3 == 0)) continue;
          ++cases;
          seed += 7;
          if (t == DType::kF64) check_case<double>(tl, s, t, pat, mis, seed);
          else check_case<float>(tl, s, t, pat, mis, seed);
        }
      }
    }
  }
  const char* split = std::getenv("JAXDNN_POOL_SPLIT");
  const char* chan = std::getenv("JAXDNN_POOL_CHAN");
#ifdef JAXDNN_POOL_CHECK_CPU
  std::printf("[CPU kernels] ");
#endif
  std::printf("pool check (%s, JAXDNN_POOL_SPLIT=%s, JAXDNN_POOL_CHAN=%s): %d cases, %ld kernel "
              "runs, %ld comparisons, %ld failures; avg results not bitwise equal to the "
              "reference (within bound): %ld\n",
              full ? "full" : "quick", split ? split : "unset", chan ? chan : "unset", cases,
              tl.runs, tl.compared, tl.failed, tl.inexact);
#ifndef JAXDNN_POOL_EMULATION
  if (do_bench) bench(csv);
#else
  (void)do_bench;
  (void)csv;
#endif
  return tl.failed ? 1 : 0;
}
