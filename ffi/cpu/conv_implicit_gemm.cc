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
//                    With small Cg (<= NR / 4) the same gathered panel is reduced against the Cg
//                    weight rows by vectorized dot products instead of the NR-padded micro-kernel.
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

// Steps (n, pix, o) to the next output pixel in (n, z, p, q) order.
inline void next_output_pixel(const ConvProblem& p, int64_t opix, int64_t& pix, int64_t& n,
                              int64_t o[3]) {
  if (++pix == opix) {
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

// IMPLICIT_GEMM's per-pixel tap offsets, computed on the fly into `loc`.
inline const int64_t* computed_tap_offsets(const ConvProblem& p, const int64_t o[3],
                                           const int64_t sp[3], int64_t t0, int64_t t1,
                                           int64_t* loc) {
  conv_tap_offsets(p, o, sp, t0, t1, loc);
  return loc;
}



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
void forward(const ConvProblem& p, const ConvGemmDims& g, const ConvOperands<T>& io,
    bool pre) {
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
    gemm_driver_conv_fwd<T>(
        g.M, g.Kg, g.KK,
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
            const int64_t* toff =
                pre ? table + pix * g.TRS : computed_tap_offsets(p, o, g.xs.sp, t0, t1, loc);
            conv_gather_row(dst + i * KC, xg + n * g.xs.n, toff, g.TRS, g.Cg, g.xs.c, g.nhwc, k0,
                            kc);
            next_output_pixel(p, g.opix, pix, n, o);
          }
        },
        [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
          gemm_pack_b_view<T>(dst, wv.p, wv.kk, wv.k, k0, kc, j0, nc);
        },
        [&](int64_t i) { return yb + ypix.off(i); }, g.ys.c, io.epi, gg * g.Kg);
  }
}

// Byte offset of backward-filter's dw^T staging buffer (NHWC) in the workspace.
size_t wgrad_tmp_offset(const ConvProblem& p, bool pre) {
  return pre ? (fwd_table_elems(p) * sizeof(int64_t) + 63) / 64 * 64 : 0;
}

template <typename T>
void backward_filter(const ConvProblem& p, const ConvGemmDims& g, const ConvOperands<T>& io,
    bool pre) {
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
              const int64_t* toff =
                  pre ? table + pix * g.TRS : computed_tap_offsets(p, o, g.xs.sp, t0, t1, loc);
              const T* xb = xg + n * g.xs.n;
              for (int64_t sl = 0; sl < nsl; ++sl) {
                T* d = dst + sl * kc * NR + k * NR;
                const int64_t w = std::min<int64_t>(NR, nc - sl * NR);
                conv_gather_row(d, xb, toff, g.TRS, g.Cg, int64_t{1}, true, j0 + sl * NR, w);
                for (int64_t j = w; j < NR; ++j) d[j] = T(0);
              }
              next_output_pixel(p, g.opix, pix, n, o);
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
          static_assert(GemmShape<T>::MC <= 1024, "packer row buffers hold at most 1024 rows");
          int64_t tap_i[1024], coff_i[1024];  // mc <= MC rows per packed block
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
            const int64_t* toff =
                pre ? table + pix * g.TRS : computed_tap_offsets(p, o, g.xs.sp, t0, t1, loc);
            const T* xb = xg + n * g.xs.n;
            for (int64_t i = 0; i < mc; ++i) {
              const int64_t off = toff[tap_i[i]];
              dst[i * KC + k] = off < 0 ? T(0) : xb[off + coff_i[i]];
            }
            next_output_pixel(p, g.opix, pix, n, o);
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

// ---- Small-Cg backward-data product ------------------------------------------------------------
// With few input channels per group the product's N side (Cg) would be padded to the micro-kernel
// width NR, wasting most of the multiply-adds. Instead each input pixel's gathered dy row (taps *
// Kg long, packed into a per-thread panel exactly as for the blocked product) is reduced against
// the Cg rows of the transposed weight panel with dot products vectorized along the reduction:
// the reduction is padded only to a multiple of two vectors, and the panel serves all Cg channels.
// The result does not depend on the thread split (each dx element is one fixed-order sum).
constexpr int64_t kSmallCgMax = 8;  // acc[] capacity; the path is taken for Cg <= min(8, NR / 4)

typedef float SmallVecF __attribute__((vector_size(64)));
typedef double SmallVecD __attribute__((vector_size(64)));
template <typename T> struct SmallVec;
template <> struct SmallVec<float> { using type = SmallVecF; };
template <> struct SmallVec<double> { using type = SmallVecD; };

// acc[r * ldacc + c] += sum_kk A[r * lda + kk] * B[c * ldb + kk] for r < RB, c < CB, kk < kcp
// (kcp a multiple of two vectors; tails zero-padded by the caller). Fixed summation order.
template <typename T, int RB, int CB>
inline void small_dot_block(int64_t kcp, const T* A, int64_t lda, const T* B, int64_t ldb, T* acc,
                            int64_t ldacc) {
  using V = typename SmallVec<T>::type;
  constexpr int L = static_cast<int>(sizeof(V) / sizeof(T));
  constexpr int U = RB * CB >= 6 ? 1 : 2;  // independent chains per (r, c)
  V s[RB][CB][U];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c)
      for (int u = 0; u < U; ++u) s[r][c][u] = V{};
  for (int64_t kk = 0; kk < kcp; kk += U * L) {
    for (int u = 0; u < U; ++u) {
      V b[CB];
      for (int c = 0; c < CB; ++c) std::memcpy(&b[c], B + c * ldb + kk + u * L, sizeof(V));
      for (int r = 0; r < RB; ++r) {
        V a;
        std::memcpy(&a, A + r * lda + kk + u * L, sizeof(V));
        for (int c = 0; c < CB; ++c) s[r][c][u] += a * b[c];
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) {
      V v = s[r][c][0];
      for (int u = 1; u < U; ++u) v += s[r][c][u];
      T t = T(0);
      for (int l = 0; l < L; ++l) t += v[l];
      acc[r * ldacc + c] += t;
    }
}

template <typename T, int RB>
inline void small_dot_rows(int64_t kcp, const T* A, int64_t lda, const T* B, int64_t ldb,
                           int64_t ncb, T* acc, int64_t ldacc) {
  int64_t c = 0;
  for (; c + 4 <= ncb; c += 4)
    small_dot_block<T, RB, 4>(kcp, A, lda, B + c * ldb, ldb, acc + c, ldacc);
  switch (ncb - c) {
    case 3: small_dot_block<T, RB, 3>(kcp, A, lda, B + c * ldb, ldb, acc + c, ldacc); break;
    case 2: small_dot_block<T, RB, 2>(kcp, A, lda, B + c * ldb, ldb, acc + c, ldacc); break;
    case 1: small_dot_block<T, RB, 1>(kcp, A, lda, B + c * ldb, ldb, acc + c, ldacc); break;
    default: break;
  }
}

// acc[r * ldacc + c] += A(r, :) . B(c, :) for r < mc, c < ncb.
template <typename T>
void small_dot_panel(int64_t mc, int64_t kcp, const T* A, int64_t lda, const T* B, int64_t ldb,
                     int64_t ncb, T* acc, int64_t ldacc) {
  // Rows per block: about eight independent (row, channel) accumulators.
  const int rb = ncb == 1 ? 8 : ncb == 2 ? 4 : 2;
  int64_t r = 0;
  if (rb == 8)
    for (; r + 8 <= mc; r += 8)
      small_dot_rows<T, 8>(kcp, A + r * lda, lda, B, ldb, ncb, acc + r * ldacc, ldacc);
  if (rb >= 4)
    for (; r + 4 <= mc; r += 4)
      small_dot_rows<T, 4>(kcp, A + r * lda, lda, B, ldb, ncb, acc + r * ldacc, ldacc);
  for (; r + 2 <= mc; r += 2)
    small_dot_rows<T, 2>(kcp, A + r * lda, lda, B, ldb, ncb, acc + r * ldacc, ldacc);
  for (; r < mc; ++r)
    small_dot_rows<T, 1>(kcp, A + r * lda, lda, B, ldb, ncb, acc + r * ldacc, ldacc);
}

// conv_gather_row for tap-major rows with unit channel stride, copying each run (the group's Kg
// output channels of one tap) inline rather than through a library call.
template <typename T>
inline void small_gather_row(T* dst, const T* base, const int64_t* toff, int64_t nch, int64_t k0,
                             int64_t kc) {
  int64_t tap = k0 / nch, c = k0 % nch, k = 0;
  while (k < kc) {
    const int64_t run = std::min(nch - c, kc - k);
    const int64_t off = toff[tap];
    T* d = dst + k;
    if (off < 0) {
      for (int64_t r = 0; r < run; ++r) d[r] = T(0);
    } else {
      const T* src = base + off + c;
      for (int64_t r = 0; r < run; ++r) d[r] = src[r];
    }
    k += run;
    ++tap;
    c = 0;
  }
}

template <typename T>
void backward_data(const ConvProblem& p, const ConvGemmDims& g, const ConvOperands<T>& io,
    bool pre) {
  const T* dy = io.a;
  const T* w = io.b;
  T* dx = io.out;
  constexpr int KC = GemmShape<T>::KC;
  if (p.N == 0 || g.ipix == 0) return;
  const AxisClasses cls[3] = {axis_classes(p, 0), axis_classes(p, 1), axis_classes(p, 2)};
  int64_t* table_base = static_cast<int64_t*>(io.workspace);
  int64_t table_used = 0;
  const int64_t R = p.filt[1], S = p.filt[2];
  // Small path where it beats the padded product: Cg <= NR / 4 (<= 8 for float with AVX-512).
  const bool small = g.Cg <= std::min<int64_t>(kSmallCgMax, GemmShape<T>::NR / 4);
  std::vector<T> wt;  // small-Cg path: each group's weights as Cg rows of the reduction
  for (int64_t r0 = 0; r0 < p.stride[0]; ++r0)
    for (int64_t r1 = 0; r1 < p.stride[1]; ++r1)
      for (int64_t r2 = 0; r2 < p.stride[2]; ++r2) {
        const int64_t rr[3] = {r0, r1, r2};
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
        // Per axis, with phi the class residue: input index i of the class sits at virtual
        // position i*lhs + pad_lo = phi + stride*qi, tap f at f*dil = phi + stride*qf, and reads
        // output index o = qi - qf (valid when 0 <= o < out). Exact divisions.
        std::vector<int64_t> qi[3], qf[3];
        for (int a = 0; a < 3; ++a) {
          const int64_t s = p.stride[a];
          for (int64_t i : *I[a])
            qi[a].push_back((i * p.lhs_dilation[a] + p.pad_lo[a] - rr[a]) / s);
          for (int64_t f : *F[a]) qf[a].push_back((f * p.dilation[a] - rr[a]) / s);
        }
        // Tap offsets (into dy's spatial part) of class pixel r for class taps [t0, t1).
        auto class_offsets = [&](int64_t r, int64_t t0, int64_t t1, int64_t* toff) {
          if (t0 >= t1) return;
          const int64_t b2 = qi[2][r % in_n[2]], b1 = qi[1][(r / in_n[2]) % in_n[1]],
                        b0 = qi[0][r / (in_n[2] * in_n[1])];
          int64_t a2 = t0 % f_n[2], a1 = (t0 / f_n[2]) % f_n[1], a0 = t0 / (f_n[2] * f_n[1]);
          auto base01 = [&]() -> int64_t {
            const int64_t o0 = b0 - qf[0][a0], o1 = b1 - qf[1][a1];
            return o0 >= 0 && o0 < p.out[0] && o1 >= 0 && o1 < p.out[1]
                       ? o0 * g.ys.sp[0] + o1 * g.ys.sp[1]
                       : -1;
          };
          int64_t base = base01();
          const int64_t* q2 = qf[2].data();
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t o2 = b2 - q2[a2];
            toff[t] = base >= 0 && o2 >= 0 && o2 < p.out[2] ? base + o2 * g.ys.sp[2] : -1;
            if (++a2 == f_n[2]) {
              a2 = 0;
              if (++a1 == f_n[1]) {
                a1 = 0;
                ++a0;
              }
              if (t + 1 < t1) base = base01();
            }
          }
        };
        int64_t* table = table_base + table_used;
        if (pre && ntap > 0) {
          table_used += ipc * ntap;
          parallel_for(
              ipc,
              [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) class_offsets(r, 0, ntap, table + r * ntap);
              },
              64);
        }
        auto spatial = [&](int64_t r) {
          const int64_t u2 = r % in_n[2], u1 = (r / in_n[2]) % in_n[1],
                        u0 = r / (in_n[2] * in_n[1]);
          return (*I[0])[u0] * g.xs.sp[0] + (*I[1])[u1] * g.xs.sp[1] + (*I[2])[u2] * g.xs.sp[2];
        };
        const int64_t M = p.N * ipc, KKc = ntap * g.Kg;
        // B(kk = tap * Kg + k, c) = w(tap, c, k) of group gg: wb(gg)[w_row(kk) + c * wcs].
        auto wb = [&](int64_t gg) {
          return g.nhwc ? w + gg * g.Kg           // w[(tf * Cg + c) * K + g*Kg + k]
                        : w + gg * g.Kg * g.KK;  // w[(g*Kg + k) * Cg*TRS + c * TRS + tf]
        };
        const int64_t wcs = g.nhwc ? p.K : g.TRS;
        auto w_row = [&](int64_t kk) {
          const int64_t tf = tfull[kk / g.Kg], k = kk % g.Kg;
          return g.nhwc ? tf * g.Cg * p.K + k : k * g.KK + tf;
        };
        // Gathers the dy rows (group gg) of class pixels [i0, i0+mc), reduction entries
        // [k0, k0+kc), into dst with row stride ld.
        // (The small-Cg path copies the short contiguous dy channel runs inline.)
        const bool inline_copy = small && g.ys.c == 1;
        auto pack_rows = [&](int64_t gg, T* dst, int64_t ld, int64_t i0, int64_t mc, int64_t k0,
                             int64_t kc) {
          const T* dyg = dy + gg * g.Kg * g.ys.c;
          const int64_t t0 = k0 / g.Kg, t1 = (k0 + kc - 1) / g.Kg + 1;
          int64_t* loc = pre ? nullptr : tls_offsets(ntap);
          for (int64_t i = 0; i < mc; ++i) {
            const int64_t m = i0 + i, n = m / ipc, r = m % ipc;
            const int64_t* toff;
            if (pre) {
              toff = table + r * ntap;
            } else {
              class_offsets(r, t0, t1, loc);
              toff = loc;
            }
            if (inline_copy) {
              small_gather_row(dst + i * ld, dyg + n * g.ys.n, toff, g.Kg, k0, kc);
            } else {
              conv_gather_row(dst + i * ld, dyg + n * g.ys.n, toff, ntap, g.Kg, g.ys.c, true, k0,
                              kc);
            }
          }
        };
        if (!small) {
          for (int64_t gg = 0; gg < g.G; ++gg) {
            T* dxg = dx + gg * g.Cg * g.xs.c;
            const T* wg = wb(gg);
            gemm_driver<T>(
                M, g.Cg, KKc, T(1), T(0),
                [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
                  pack_rows(gg, dst, KC, i0, mc, k0, kc);
                },
                [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
                  gemm_pack_b_rows<T>(dst, wg, w_row, wcs, k0, kc, j0, nc);
                },
                [&](int64_t m) { return dxg + (m / ipc) * g.xs.n + spatial(m % ipc); }, g.xs.c);
          }
          continue;
        }
        // Small Cg: dx(i, c) = A(i, :) . Wt(c, :), A = the gathered dy rows (per-thread panel of
        // MB rows x KB reduction entries), Wt(c, kk) = w(tap(kk), c, k(kk)). Tasks are
        // (group, row block) pairs, so that many small groups also spread over the threads.
        using V = typename SmallVec<T>::type;
        constexpr int64_t VL2 = 2 * static_cast<int64_t>(sizeof(V) / sizeof(T));
        const int64_t KB = KKc <= 1536 ? KKc : 512;  // 512: a multiple of VL2
        const int64_t ldw = gemm_round_up(std::max<int64_t>(KKc, 1), VL2);
        const int64_t lda = gemm_round_up(std::max<int64_t>(KB, 1), VL2);
        const int64_t MB = std::max<int64_t>(
            8, std::min<int64_t>(64, (int64_t{96} << 10) / (lda * int64_t(sizeof(T))) / 8 * 8));
        wt.assign(static_cast<size_t>(p.C * ldw), T(0));
        for (int64_t gg = 0; gg < g.G; ++gg) {
          const T* wg = wb(gg);
          for (int64_t c = 0; c < g.Cg; ++c)
            for (int64_t kk = 0; kk < KKc; ++kk)
              wt[(gg * g.Cg + c) * ldw + kk] = wg[w_row(kk) + c * wcs];
        }
        const int64_t nblk = (M + MB - 1) / MB;
        auto task = [&](int64_t b, int64_t e) {
          T* Ap = gemm_scratch<T>(2, static_cast<size_t>(MB * lda));
          T acc[64 * kSmallCgMax];
          for (int64_t u = b; u < e; ++u) {
            // Groups vary fastest: the blocks of one pixel range share dy's and dx's cache lines.
            const int64_t gg = u % g.G, blk = u / g.G;
            const int64_t i0 = blk * MB, mc = std::min(MB, M - i0);
            const T* wtg = wt.data() + gg * g.Cg * ldw;
            std::fill(acc, acc + mc * g.Cg, T(0));
            for (int64_t k0 = 0; k0 < KKc; k0 += KB) {
              const int64_t kc = std::min(KB, KKc - k0), kcp = gemm_round_up(kc, VL2);
              pack_rows(gg, Ap, lda, i0, mc, k0, kc);
              if (kcp > kc)
                for (int64_t i = 0; i < mc; ++i)
                  std::memset(Ap + i * lda + kc, 0, sizeof(T) * (kcp - kc));
              small_dot_panel<T>(mc, kcp, Ap, lda, wtg + k0, ldw, g.Cg, acc, g.Cg);
            }
            T* dxg = dx + gg * g.Cg * g.xs.c;
            for (int64_t i = 0; i < mc; ++i) {
              const int64_t m = i0 + i;
              T* d = dxg + (m / ipc) * g.xs.n + spatial(m % ipc);
              for (int64_t c = 0; c < g.Cg; ++c) d[c * g.xs.c] = acc[i * g.Cg + c];
            }
          }
        };
        const double work = 2.0 * static_cast<double>(M) * std::max<int64_t>(KKc, 1) * p.C;
        if (work < 1.0e6 || num_threads() <= 1) {
          task(0, g.G * nblk);
        } else {
          parallel_for(g.G * nblk, task, 1);
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
