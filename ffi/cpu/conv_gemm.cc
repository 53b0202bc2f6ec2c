// GEMM family: explicit im2col / col2im in the workspace + the blocked product of gemm.h.
//
// Column matrix (per chunk of output pixels m = (n, z, p, q)): col[m][g][kk], kk over the group's
// reduction index in the weight's own order: NHWC (DHWIO) kk = tap * Cg + c, NCHW (OIDHW)
// kk = c * TRS + tap. Per group g:
//   forward:         y(m, k)   = sum_kk col(m, kk) * w(kk, k)
//   backward-data:   col(m, kk) = sum_k dy(m, k) * w(kk, k);  dx = col2im(col)  (gather form)
//   backward-filter: dw(kk, k) += sum_m col(m, kk) * dy(m, k)
// The column buffer is capped (kColCapBytes): the output pixels are processed in chunks (whole
// images when they fit). 1x1 / stride 1 / unpadded / undilated problems skip im2col entirely.
#include <algorithm>
#include <cstring>

#include "conv_cpu.h"
#include "gemm.h"
#include "parallel.h"

namespace jaxdnn::cpu {
namespace {

constexpr size_t kColCapBytes = size_t{64} << 20;

bool is_pointwise(const ConvProblem& p) { return conv_is_pointwise(p); }

// Output pixels per chunk of the column buffer.
int64_t chunk_rows(const ConvProblem& p, size_t elem_bytes) {
  const int64_t M = p.N * p.out_pixels();
  if (M <= 0) return 0;
  const int64_t row_elems = std::max<int64_t>(1, p.C * p.filt_taps());
  int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(kColCapBytes / elem_bytes) / row_elems);
  const int64_t opix = p.out_pixels();
  if (rows >= opix) rows = rows / opix * opix;
  return std::min(rows, M);
}

// Column buffer bytes (rounded to 64 so that a staging buffer can follow).
size_t col_bytes(const ConvProblem& p, size_t elem_bytes) {
  const size_t b = static_cast<size_t>(chunk_rows(p, elem_bytes)) *
                   static_cast<size_t>(p.C * p.filt_taps()) * elem_bytes;
  return (b + 63) / 64 * 64;
}


// im2col of output pixels [m0, m1) into col[(m - m0)][g][kk].
template <typename T>
void im2col(const ConvProblem& p, const ConvGemmDims& g, const T* x, int64_t m0, int64_t m1, T* col) {
  const int64_t GKK = g.G * g.KK;
  parallel_for(
      m1 - m0,
      [&](int64_t b, int64_t e) {
        std::vector<int64_t> toff(g.TRS);
        for (int64_t i = b; i < e; ++i) {
          const int64_t m = m0 + i, n = m / g.opix, pix = m % g.opix;
          int64_t o[3];
          conv_decode(pix, p.out, o);
          conv_tap_offsets(p, o, g.xs.sp, 0, g.TRS, toff.data());
          T* row = col + i * GKK;
          const T* xb = x + n * g.xs.n;
          if (g.nhwc && g.G == 1) {
            conv_gather_row(row, xb, toff.data(), g.TRS, g.Cg, g.xs.c, true, 0, g.KK);
          } else {
            for (int64_t gg = 0; gg < g.G; ++gg)
              conv_gather_row(row + gg * g.KK, xb + gg * g.Cg * g.xs.c, toff.data(), g.TRS, g.Cg,
                              g.xs.c, g.nhwc, 0, g.KK);
          }
        }
      },
      16);
}


template <typename T>
void forward(const ConvProblem& p, const ConvGemmDims& g, const ConvOperands<T>& io) {
  const T* x = io.a;
  const T* w = io.b;
  T* y = io.out;
  if (g.M == 0) return;
  const GemmAxis ypix = g.ypix();
  auto run = [&](int64_t gg, int64_t m0, int64_t rows, const T* ap, GemmAxis ar, GemmAxis ac) {
    const WView<T> wv = weight_kk_k(g, w, gg);
    T* yb = y + gg * g.Kg * g.ys.c;
    gemm_driver_conv_fwd<T>(
        rows, g.Kg, g.KK,
        [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
          gemm_pack_a_view<T>(dst, ap, ar, ac, i0, mc, k0, kc);
        },
        [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
          gemm_pack_b_view<T>(dst, wv.p, wv.kk, wv.k, k0, kc, j0, nc);
        },
        [&](int64_t i) { return yb + ypix.off(m0 + i); }, g.ys.c, io.epi, gg * g.Kg);
  };
  if (is_pointwise(p)) {
    for (int64_t gg = 0; gg < g.G; ++gg)
      run(gg, 0, g.M, x + gg * g.Cg * g.xs.c, g.xpix(), gemm_axis(g.xs.c));
    return;
  }
  T* col = static_cast<T*>(io.workspace);
  const int64_t CR = chunk_rows(p, sizeof(T));
  for (int64_t m0 = 0; m0 < g.M; m0 += CR) {
    const int64_t m1 = std::min(g.M, m0 + CR);
    im2col(p, g, x, m0, m1, col);
    for (int64_t gg = 0; gg < g.G; ++gg)
      run(gg, m0, m1 - m0, col + gg * g.KK, gemm_axis(g.G * g.KK), gemm_axis(1));
  }
}

// dx[n, i, g, c] += sum over (tap, o) with o reading i: col[(m(n, o) - m0)][g][kk(tap, c)].
template <typename T>
void col2im(const ConvProblem& p, const ConvGemmDims& g, const T* col, int64_t m0, int64_t m1, T* dx) {
  const int64_t n0 = m0 / g.opix, n1 = (m1 - 1) / g.opix + 1;
  const int64_t GKK = g.G * g.KK;
  const int64_t R = p.filt[1], S = p.filt[2];
  parallel_for(
      (n1 - n0) * g.ipix,
      [&](int64_t b, int64_t e) {
        // Per-axis (tap, output index) pairs reading input index i.
        std::vector<int64_t> fo[3];
        for (int64_t u = b; u < e; ++u) {
          const int64_t n = n0 + u / g.ipix, ipx = u % g.ipix;
          int64_t iv[3];
          conv_decode(ipx, p.in, iv);
          bool any = true;
          for (int a = 0; a < 3; ++a) {
            fo[a].clear();
            const int64_t j = iv[a] * p.lhs_dilation[a] + p.pad_lo[a];
            for (int64_t f = 0; f < p.filt[a]; ++f) {
              const int64_t v = j - f * p.dilation[a];
              if (v < 0 || v % p.stride[a] != 0) continue;
              const int64_t o = v / p.stride[a];
              if (o >= p.out[a]) continue;
              fo[a].push_back(f);
              fo[a].push_back(o);
            }
            if (fo[a].empty()) any = false;
          }
          if (!any) continue;
          T* xo = dx + n * g.xs.n + ipx * (g.nhwc ? g.xs.pix : 1);
          for (size_t a0 = 0; a0 < fo[0].size(); a0 += 2)
            for (size_t a1 = 0; a1 < fo[1].size(); a1 += 2)
              for (size_t a2 = 0; a2 < fo[2].size(); a2 += 2) {
                const int64_t m =
                    n * g.opix + (fo[0][a0 + 1] * p.out[1] + fo[1][a1 + 1]) * p.out[2] +
                    fo[2][a2 + 1];
                if (m < m0 || m >= m1) continue;
                const int64_t tap = (fo[0][a0] * R + fo[1][a1]) * S + fo[2][a2];
                const T* row = col + (m - m0) * GKK;
                if (g.nhwc) {
                  for (int64_t gg = 0; gg < g.G; ++gg) {
                    const T* src = row + gg * g.KK + tap * g.Cg;
                    T* d = xo + gg * g.Cg;
                    for (int64_t c = 0; c < g.Cg; ++c) d[c] += src[c];
                  }
                } else {
                  for (int64_t c = 0; c < p.C; ++c)
                    xo[c * g.xs.c] += row[(c / g.Cg) * g.KK + (c % g.Cg) * g.TRS + tap];
                }
              }
        }
      },
      4);
}

template <typename T>
void backward_data(const ConvProblem& p, const ConvGemmDims& g, const ConvOperands<T>& io) {
  const T* dy = io.a;
  const T* w = io.b;
  T* dx = io.out;
  const int64_t xel = p.x_elems();
  const GemmAxis ypix = g.ypix();
  // B(k, kk) = w(kk, k): the transposed forward view.
  auto run = [&](int64_t gg, int64_t m0, int64_t rows, int64_t ncols, const WView<T>& wv,
                 const std::function<T*(int64_t)>& crow, int64_t csc) {
    const T* dyb = dy + gg * g.Kg * g.ys.c;
    gemm_driver<T>(
        rows, ncols, g.Kg, T(1), T(0),
        [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
          gemm_pack_a_view<T>(dst, dyb, ypix, gemm_axis(g.ys.c), m0 + i0, mc, k0, kc);
        },
        [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
          gemm_pack_b_view<T>(dst, wv.p, wv.k, wv.kk, k0, kc, j0, nc);
        },
        crow, csc);
  };
  if (is_pointwise(p)) {
    const GemmAxis xpix = g.xpix();
    for (int64_t gg = 0; gg < g.G; ++gg) {
      T* dxb = dx + gg * g.Cg * g.xs.c;
      run(gg, 0, g.M, g.Cg, weight_kk_k(g, w, gg), [&](int64_t i) { return dxb + xpix.off(i); },
          g.xs.c);
    }
    return;
  }
  parallel_for(xel, [&](int64_t b, int64_t e) { std::memset(dx + b, 0, sizeof(T) * (e - b)); },
               int64_t{1} << 16);
  if (g.M == 0) return;
  T* col = static_cast<T*>(io.workspace);
  const int64_t CR = chunk_rows(p, sizeof(T));
  const int64_t GKK = g.G * g.KK;
  for (int64_t m0 = 0; m0 < g.M; m0 += CR) {
    const int64_t m1 = std::min(g.M, m0 + CR);
    for (int64_t gg = 0; gg < g.G; ++gg) {
      T* cb = col + gg * g.KK;
      run(gg, m0, m1 - m0, g.KK, weight_kk_k(g, w, gg),
          [&](int64_t i) { return cb + (i - m0 + m0) * GKK; }, 1);
    }
    col2im(p, g, col, m0, m1, dx);
  }
}

template <typename T>
void backward_filter(const ConvProblem& p, const ConvGemmDims& g, const ConvOperands<T>& io) {
  const T* x = io.a;
  const T* dy = io.b;
  T* dw = io.out;
  const GemmAxis ypix = g.ypix();
  const bool direct = g.M == 0 || is_pointwise(p);
  T* dwt = nullptr;
  // dw(kk, k): NHWC dw[kk * K + g*Kg + k]; NCHW dw[(g*Kg + k) * KK + kk].
  auto run = [&](int64_t gg, int64_t m0, int64_t rows, T beta, const T* ap, GemmAxis ar,
                 GemmAxis ac) {
    const T* dyb = dy + gg * g.Kg * g.ys.c;
    if (g.nhwc && !direct) {
      // dw^T(k, kk) = sum_m dy(m, k) col(m, kk): the column matrix is the (shared, packed once)
      // B operand and is read along its contiguous rows.
      gemm_driver<T>(
          g.Kg, g.KK, rows, T(1), beta,
          [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
            gemm_pack_a_view<T>(dst, dyb, gemm_axis(1), ypix, i0, mc, m0 + k0, kc);
          },
          [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
            gemm_pack_b_view<T>(dst, ap, ac, ar, k0, kc, j0, nc);
          },
          [&](int64_t i) { return dwt + i * g.KK; }, int64_t{1});
      return;
    }
    T* dwb = g.nhwc ? dw + gg * g.Kg : dw + gg * g.Kg * g.KK;
    const int64_t rs = g.nhwc ? g.G * g.Kg : 1, csc = g.nhwc ? 1 : g.KK;
    gemm_driver<T>(
        g.KK, g.Kg, rows, T(1), beta,
        [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
          gemm_pack_a_view<T>(dst, ap, ar, ac, i0, mc, k0, kc);
        },
        [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
          gemm_pack_b_view<T>(dst, dyb, ypix, gemm_axis(g.ys.c), m0 + k0, kc, j0, nc);
        },
        [&](int64_t i) { return dwb + i * rs; }, csc);
  };
  const int64_t CR = chunk_rows(p, sizeof(T));
  T* col = static_cast<T*>(io.workspace);
  T* dwt_all = reinterpret_cast<T*>(static_cast<char*>(io.workspace) +
                                    (direct ? 0 : col_bytes(p, sizeof(T))));
  // NHWC: per group, stage dw^T (Kg x KK, contiguous) then transpose into dw.
  for (int64_t gg = 0; gg < g.G; ++gg) {
    dwt = dwt_all;
    if (direct) {
      run(gg, 0, g.M, T(0), x + gg * g.Cg * g.xs.c, gemm_axis(g.xs.c), g.xpix());
    } else if (g.G == 1 || !g.nhwc) {
      if (gg > 0) break;
      for (int64_t m0 = 0; m0 < g.M; m0 += CR) {
        const int64_t m1 = std::min(g.M, m0 + CR);
        im2col(p, g, x, m0, m1, col);
        for (int64_t g2 = 0; g2 < g.G; ++g2) {
          if (g.nhwc && g2 > 0) break;
          run(g2, m0, m1 - m0, m0 == 0 ? T(0) : T(1), col + g2 * g.KK, gemm_axis(1),
              gemm_axis(g.G * g.KK));
        }
      }
    } else {
      // Grouped NHWC: one staging buffer, so the groups run one after another.
      for (int64_t m0 = 0; m0 < g.M; m0 += CR) {
        const int64_t m1 = std::min(g.M, m0 + CR);
        if (gg == 0 || CR < g.M) im2col(p, g, x, m0, m1, col);
        run(gg, m0, m1 - m0, m0 == 0 ? T(0) : T(1), col + gg * g.KK, gemm_axis(1),
            gemm_axis(g.G * g.KK));
      }
    }
    if (g.nhwc && !direct) transpose_into_dw(g, dwt, dw + gg * g.Kg, p.K);
  }
}

}  // namespace

size_t gemm_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes) {
  const bool direct = is_pointwise(p) || p.N * p.out_pixels() == 0;
  const size_t col = direct ? 0 : col_bytes(p, elem_bytes);
  if (op == ConvOp::kBackwardFilter && p.layout == Layout::kNHWC && !direct)
    return col + static_cast<size_t>(p.Kg() * p.Cg() * p.filt_taps()) * elem_bytes;
  return col;
}

template <typename T>
void gemm_conv(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io) {
  const ConvGemmDims g(p);
  switch (op) {
    case ConvOp::kForward: forward<T>(p, g, io); break;
    case ConvOp::kBackwardData: backward_data<T>(p, g, io); break;
    case ConvOp::kBackwardFilter: backward_filter<T>(p, g, io); break;
  }
}

template void gemm_conv<float>(ConvOp, const ConvProblem&, const ConvOperands<float>&);
template void gemm_conv<double>(ConvOp, const ConvProblem&, const ConvOperands<double>&);

}  // namespace jaxdnn::cpu
