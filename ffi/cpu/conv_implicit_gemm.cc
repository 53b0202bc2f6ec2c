// IMPLICIT_GEMM / IMPLICIT_PRECOMP_GEMM: the blocked product of gemm.h with packers that gather the
// column matrix straight from the activations (no im2col buffer).
//
//   forward:         y(m, k)  = sum_kk col(m, kk) w(kk, k)       A packer gathers rows of col
//   backward-filter: dw(kk, k) = sum_m col(m, kk) dy(m, k)       A packer gathers columns of col
//   backward-data:   gather form split by stride phase: input pixels i whose virtual position
//                    i*lhs + pad_lo is congruent to phi (mod stride) read exactly the taps f with
//                    f*dil = phi (mod stride), at o = (i*lhs + pad_lo - f*dil) / stride. Per phase
//                    class and group: dx(i, c) = sum_(tap, k) dy(o(i, tap), k) w(tap, c, k),
//                    with the dy rows gathered by the A packer; no zero taps are multiplied.
// IMPLICIT_GEMM computes each row's tap offsets with index arithmetic inside the packer;
// IMPLICIT_PRECOMP_GEMM reads them from a table built once per call in the workspace
// (int64 offsets, -1 = padding): [output pixel][tap] for forward / backward-filter, and
// [phase class][input pixel of the class][tap of the class] for backward-data.
#include <algorithm>
#include <cstring>
#include <vector>

#include "conv_cpu.h"
#include "gemm.h"
#include "parallel.h"

namespace jaxdnn::cpu {
namespace {


int64_t* tls_offsets(size_t n) {
  thread_local std::vector<int64_t> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Builds table[pix * TRS + tap] for all output pixels.
void build_fwd_table(const ConvProblem& p, const ConvGemmDims& g, int64_t* table) {
  parallel_for(
      g.opix,
      [&](int64_t b, int64_t e) {
        for (int64_t pix = b; pix < e; ++pix) {
          int64_t o[3];
          conv_decode(pix, p.out, o);
          conv_tap_offsets(p, o, g.xs.sp, 0, g.TRS, table + pix * g.TRS);
        }
      },
      64);
}

size_t fwd_table_elems(const ConvProblem& p) {
  return static_cast<size_t>(p.out_pixels()) * static_cast<size_t>(p.filt_taps());
}


template <typename T>
void forward(const ConvProblem& p, const ConvGemmDims& g, const ConvOperands<T>& io, bool pre) {
  const T* x = io.a;
  const T* w = io.b;
  T* y = io.out;
  if (g.M == 0) return;
  constexpr int KC = GemmShape<T>::KC;
  int64_t* table = static_cast<int64_t*>(io.workspace);
  if (pre) build_fwd_table(p, g, table);
  const GemmAxis ypix = g.ypix();
  for (int64_t gg = 0; gg < g.G; ++gg) {
    const WView<T> wv = weight_kk_k(g, w, gg);
    const T* xg = x + gg * g.Cg * g.xs.c;
    T* yb = y + gg * g.Kg * g.ys.c;
    gemm_driver<T>(
        g.M, g.Kg, g.KK, T(1), T(0),
        [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
          int64_t t0 = 0, t1 = g.TRS;
          if (g.nhwc) {
            t0 = k0 / g.Cg;
            t1 = (k0 + kc - 1) / g.Cg + 1;
          }
          int64_t* loc = pre ? nullptr : tls_offsets(g.TRS);
          int64_t m = i0, n = m / g.opix, pix = m % g.opix;
          int64_t o[3];
          conv_decode(pix, p.out, o);
          for (int64_t i = 0; i < mc; ++i) {
            const int64_t* toff;
            if (pre) {
              toff = table + pix * g.TRS;
            } else {
              conv_tap_offsets(p, o, g.xs.sp, t0, t1, loc);
              toff = loc;
            }
            conv_gather_row(dst + i * KC, xg + n * g.xs.n, toff, g.TRS, g.Cg, g.xs.c, g.nhwc, k0,
                            kc);
            // Next output pixel.
            if (++pix == g.opix) {
              pix = 0;
              ++n;
              o[0] = o[1] = o[2] = 0;
            } else if (++o[2] == p.out[2]) {
              o[2] = 0;
              if (++o[1] == p.out[1]) {
                o[1] = 0;
                ++o[0];
              }
            }
          }
        },
        [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
          gemm_pack_b_view<T>(dst, wv.p, wv.kk, wv.k, k0, kc, j0, nc);
        },
        [&](int64_t i) { return yb + ypix.off(i); }, g.ys.c);
  }
}

// Byte offset of backward-filter's dw^T staging buffer (NHWC) in the workspace.
size_t wgrad_tmp_offset(const ConvProblem& p, bool pre) {
  return pre ? (fwd_table_elems(p) * sizeof(int64_t) + 63) / 64 * 64 : 0;
}

template <typename T>
void backward_filter(const ConvProblem& p, const ConvGemmDims& g, const ConvOperands<T>& io, bool pre) {
  const T* x = io.a;
  const T* dy = io.b;
  T* dw = io.out;
  constexpr int KC = GemmShape<T>::KC;
  int64_t* table = static_cast<int64_t*>(io.workspace);
  if (pre && g.M > 0) build_fwd_table(p, g, table);
  T* dwt = reinterpret_cast<T*>(static_cast<char*>(io.workspace) + wgrad_tmp_offset(p, pre));
  const GemmAxis ypix = g.ypix();
  for (int64_t gg = 0; gg < g.G; ++gg) {
    const T* xg = x + gg * g.Cg * g.xs.c;
    const T* dyb = dy + gg * g.Kg * g.ys.c;
    T* dwb = g.nhwc ? dw + gg * g.Kg : dw + gg * g.Kg * g.KK;
    const int64_t rs = g.nhwc ? g.G * g.Kg : 1, csc = g.nhwc ? 1 : g.KK;
    if (g.nhwc && conv_is_pointwise(p)) {
      // 1x1: x itself is the column matrix; dw(c, k) = sum_m x(m, c) dy(m, k).
      gemm_driver<T>(
          g.KK, g.Kg, g.M, T(1), T(0),
          [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
            gemm_pack_a_view<T>(dst, xg, gemm_axis(1), gemm_axis(g.xs.pix), i0, mc, k0, kc);
          },
          [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
            gemm_pack_b_view<T>(dst, dyb, ypix, gemm_axis(1), k0, kc, j0, nc);
          },
          [&](int64_t i) { return dwb + i * rs; }, int64_t{1});
      continue;
    }
    if (g.nhwc) {
      // dw^T(k, kk) = sum_m dy(m, k) col(m, kk): col is the B operand (packed once per
      // super-block, shared by the threads), gathered as contiguous channel runs.
      constexpr int NR = GemmShape<T>::NR;
      gemm_driver<T>(
          g.Kg, g.KK, g.M, T(1), T(0),
          [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
            gemm_pack_a_view<T>(dst, dyb, gemm_axis(1), ypix, i0, mc, k0, kc);
          },
          [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
            const int64_t t0 = j0 / g.Cg, t1 = (j0 + nc - 1) / g.Cg + 1;
            const int64_t nsl = (nc + NR - 1) / NR;
            int64_t* loc = pre ? nullptr : tls_offsets(g.TRS);
            int64_t m = k0, n = m / g.opix, pix = m % g.opix;
            int64_t o[3];
            conv_decode(pix, p.out, o);
            for (int64_t k = 0; k < kc; ++k) {
              const int64_t* toff;
              if (pre) {
                toff = table + pix * g.TRS;
              } else {
                conv_tap_offsets(p, o, g.xs.sp, t0, t1, loc);
                toff = loc;
              }
              const T* xb = xg + n * g.xs.n;
              for (int64_t sl = 0; sl < nsl; ++sl) {
                T* d = dst + sl * kc * NR + k * NR;
                const int64_t w = std::min<int64_t>(NR, nc - sl * NR);
                conv_gather_row(d, xb, toff, g.TRS, g.Cg, int64_t{1}, true, j0 + sl * NR, w);
                for (int64_t j = w; j < NR; ++j) d[j] = T(0);
              }
              if (++pix == g.opix) {
                pix = 0;
                ++n;
                o[0] = o[1] = o[2] = 0;
              } else if (++o[2] == p.out[2]) {
                o[2] = 0;
                if (++o[1] == p.out[1]) {
                  o[1] = 0;
                  ++o[0];
                }
              }
            }
          },
          [&](int64_t i) { return dwt + i * g.KK; }, int64_t{1});
      transpose_into_dw(g, dwt, dw + gg * g.Kg, p.K);
      continue;
    }
    gemm_driver<T>(
        g.KK, g.Kg, g.M, T(1), T(0),
        // A(kk, m) = col(m, kk): rows kk = (tap, c), columns output pixels m.
        [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
          int64_t tap_i[1024], coff_i[1024];
          int64_t t0 = g.TRS, t1 = 0;
          for (int64_t i = 0; i < mc; ++i) {
            const int64_t kk = i0 + i;
            const int64_t tap = g.nhwc ? kk / g.Cg : kk % g.TRS;
            const int64_t c = g.nhwc ? kk % g.Cg : kk / g.TRS;
            tap_i[i] = tap;
            coff_i[i] = c * g.xs.c;
            t0 = std::min(t0, tap);
            t1 = std::max(t1, tap + 1);
          }
          int64_t* loc = pre ? nullptr : tls_offsets(g.TRS);
          int64_t m = k0, n = m / g.opix, pix = m % g.opix;
          int64_t o[3];
          conv_decode(pix, p.out, o);
          for (int64_t k = 0; k < kc; ++k) {
            const int64_t* toff;
            if (pre) {
              toff = table + pix * g.TRS;
            } else {
              conv_tap_offsets(p, o, g.xs.sp, t0, t1, loc);
              toff = loc;
            }
            const T* xb = xg + n * g.xs.n;
            for (int64_t i = 0; i < mc; ++i) {
              const int64_t off = toff[tap_i[i]];
              dst[i * KC + k] = off < 0 ? T(0) : xb[off + coff_i[i]];
            }
            if (++pix == g.opix) {
              pix = 0;
              ++n;
              o[0] = o[1] = o[2] = 0;
            } else if (++o[2] == p.out[2]) {
              o[2] = 0;
              if (++o[1] == p.out[1]) {
                o[1] = 0;
                ++o[0];
              }
            }
          }
        },
        [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
          gemm_pack_b_view<T>(dst, dyb, ypix, gemm_axis(g.ys.c), k0, kc, j0, nc);
        },
        [&](int64_t i) { return dwb + i * rs; }, csc);
  }
}

// Backward-data phase classes: per axis, the input indices and taps of each residue class.
struct AxisClasses {
  std::vector<std::vector<int64_t>> idx, taps;
};
AxisClasses axis_classes(const ConvProblem& p, int a) {
  AxisClasses ac;
  const int64_t s = p.stride[a];
  ac.idx.resize(s);
  ac.taps.resize(s);
  for (int64_t i = 0; i < p.in[a]; ++i) {
    const int64_t r = ((i * p.lhs_dilation[a] + p.pad_lo[a]) % s + s) % s;
    ac.idx[r].push_back(i);
  }
  for (int64_t f = 0; f < p.filt[a]; ++f) ac.taps[(f * p.dilation[a]) % s].push_back(f);
  return ac;
}

size_t dgrad_table_elems(const ConvProblem& p) {
  size_t total = 1;
  for (int a = 0; a < 3; ++a) {
    const AxisClasses ac = axis_classes(p, a);
    size_t s = 0;
    for (int64_t r = 0; r < p.stride[a]; ++r) s += ac.idx[r].size() * ac.taps[r].size();
    total *= s;
  }
  return total;
}

template <typename T>
void backward_data(const ConvProblem& p, const ConvGemmDims& g, const ConvOperands<T>& io, bool pre) {
  const T* dy = io.a;
  const T* w = io.b;
  T* dx = io.out;
  constexpr int KC = GemmShape<T>::KC;
  if (p.N == 0 || g.ipix == 0) return;
  const AxisClasses cls[3] = {axis_classes(p, 0), axis_classes(p, 1), axis_classes(p, 2)};
  int64_t* table_base = static_cast<int64_t*>(io.workspace);
  int64_t table_used = 0;
  const int64_t R = p.filt[1], S = p.filt[2];
  for (int64_t r0 = 0; r0 < p.stride[0]; ++r0)
    for (int64_t r1 = 0; r1 < p.stride[1]; ++r1)
      for (int64_t r2 = 0; r2 < p.stride[2]; ++r2) {
        const std::vector<int64_t>* I[3] = {&cls[0].idx[r0], &cls[1].idx[r1], &cls[2].idx[r2]};
        const std::vector<int64_t>* F[3] = {&cls[0].taps[r0], &cls[1].taps[r1], &cls[2].taps[r2]};
        const int64_t in_n[3] = {(int64_t)I[0]->size(), (int64_t)I[1]->size(),
                                 (int64_t)I[2]->size()};
        const int64_t f_n[3] = {(int64_t)F[0]->size(), (int64_t)F[1]->size(),
                                (int64_t)F[2]->size()};
        const int64_t ipc = in_n[0] * in_n[1] * in_n[2];
        if (ipc == 0) continue;
        const int64_t ntap = f_n[0] * f_n[1] * f_n[2];
        // Full tap index of each class tap.
        std::vector<int64_t> tfull(ntap);
        for (int64_t t = 0; t < ntap; ++t) {
          const int64_t a2 = t % f_n[2], a1 = (t / f_n[2]) % f_n[1], a0 = t / (f_n[2] * f_n[1]);
          tfull[t] = ((*F[0])[a0] * R + (*F[1])[a1]) * S + (*F[2])[a2];
        }
        // Tap offsets (into dy's spatial part) of class pixel r.
        auto class_offsets = [&](int64_t r, int64_t* toff) {
          int64_t u[3];
          u[2] = r % in_n[2];
          u[1] = (r / in_n[2]) % in_n[1];
          u[0] = r / (in_n[2] * in_n[1]);
          int64_t t = 0;
          for (int64_t a0 = 0; a0 < f_n[0]; ++a0) {
            const int64_t v0 = (*I[0])[u[0]] * p.lhs_dilation[0] + p.pad_lo[0] -
                               (*F[0])[a0] * p.dilation[0];
            const int64_t o0 = v0 / p.stride[0];
            const bool ok0 = v0 >= 0 && o0 < p.out[0];
            for (int64_t a1 = 0; a1 < f_n[1]; ++a1) {
              const int64_t v1 = (*I[1])[u[1]] * p.lhs_dilation[1] + p.pad_lo[1] -
                                 (*F[1])[a1] * p.dilation[1];
              const int64_t o1 = v1 / p.stride[1];
              const bool ok1 = ok0 && v1 >= 0 && o1 < p.out[1];
              for (int64_t a2 = 0; a2 < f_n[2]; ++a2, ++t) {
                const int64_t v2 = (*I[2])[u[2]] * p.lhs_dilation[2] + p.pad_lo[2] -
                                   (*F[2])[a2] * p.dilation[2];
                const int64_t o2 = v2 / p.stride[2];
                toff[t] = ok1 && v2 >= 0 && o2 < p.out[2]
                              ? o0 * g.ys.sp[0] + o1 * g.ys.sp[1] + o2 * g.ys.sp[2]
                              : -1;
              }
            }
          }
        };
        int64_t* table = table_base + table_used;
        if (pre && ntap > 0) {
          table_used += ipc * ntap;
          parallel_for(
              ipc,
              [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) class_offsets(r, table + r * ntap);
              },
              64);
        }
        auto spatial = [&](int64_t r) {
          const int64_t u2 = r % in_n[2], u1 = (r / in_n[2]) % in_n[1],
                        u0 = r / (in_n[2] * in_n[1]);
          return (*I[0])[u0] * g.xs.sp[0] + (*I[1])[u1] * g.xs.sp[1] + (*I[2])[u2] * g.xs.sp[2];
        };
        for (int64_t gg = 0; gg < g.G; ++gg) {
          const T* dyg = dy + gg * g.Kg * g.ys.c;
          T* dxg = dx + gg * g.Cg * g.xs.c;
          // B(kk = tap * Kg + k, c) = w(tap, c, k).
          const T* wb;
          int64_t wcs;
          if (g.nhwc) {  // w[(tf * Cg + c) * K + g*Kg + k]
            wb = w + gg * g.Kg;
            wcs = p.K;
          } else {  // w[(g*Kg + k) * Cg*TRS + c * TRS + tf]
            wb = w + gg * g.Kg * g.KK;
            wcs = g.TRS;
          }
          gemm_driver<T>(
              p.N * ipc, g.Cg, ntap * g.Kg, T(1), T(0),
              [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
                int64_t* loc = pre ? nullptr : tls_offsets(ntap);
                for (int64_t i = 0; i < mc; ++i) {
                  const int64_t m = i0 + i, n = m / ipc, r = m % ipc;
                  const int64_t* toff;
                  if (pre) {
                    toff = table + r * ntap;
                  } else {
                    class_offsets(r, loc);
                    toff = loc;
                  }
                  conv_gather_row(dst + i * KC, dyg + n * g.ys.n, toff, ntap, g.Kg, g.ys.c, true,
                                  k0, kc);
                }
              },
              [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
                gemm_pack_b_rows<T>(
                    dst, wb,
                    [&](int64_t kk) {
                      const int64_t tf = tfull[kk / g.Kg], k = kk % g.Kg;
                      return g.nhwc ? tf * g.Cg * p.K + k : k * g.KK + tf;
                    },
                    wcs, k0, kc, j0, nc);
              },
              [&](int64_t m) { return dxg + (m / ipc) * g.xs.n + spatial(m % ipc); }, g.xs.c);
        }
      }
}

}  // namespace

size_t implicit_gemm_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes,
                                     bool precomputed) {
  if (op == ConvOp::kBackwardData) return precomputed ? dgrad_table_elems(p) * sizeof(int64_t) : 0;
  if (op == ConvOp::kBackwardFilter && p.layout == Layout::kNHWC && !conv_is_pointwise(p))
    return wgrad_tmp_offset(p, precomputed) +
           static_cast<size_t>(p.Kg() * p.Cg() * p.filt_taps()) * elem_bytes;
  return precomputed ? fwd_table_elems(p) * sizeof(int64_t) : 0;
}

template <typename T>
void implicit_gemm_conv(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io,
                        bool precomputed) {
  const ConvGemmDims g(p);
  switch (op) {
    case ConvOp::kForward: forward<T>(p, g, io, precomputed); break;
    case ConvOp::kBackwardData: backward_data<T>(p, g, io, precomputed); break;
    case ConvOp::kBackwardFilter: backward_filter<T>(p, g, io, precomputed); break;
  }
}

template void implicit_gemm_conv<float>(ConvOp, const ConvProblem&, const ConvOperands<float>&,
                                        bool);
template void implicit_gemm_conv<double>(ConvOp, const ConvProblem&, const ConvOperands<double>&,
                                         bool);

}  // namespace jaxdnn::cpu
