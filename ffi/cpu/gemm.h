// Cache-blocked, multithreaded matrix product (GotoBLAS / BLIS style) with pluggable packing.
//
//   C = alpha * A * B + beta * C,   A: M x K,  B: K x N,  C: M x N
//
// The blocked driver (gemm_driver) never reads A or B itself: it calls two packer functors that fill
// packed panels, so the same driver serves a plain strided product (gemm() below, the GEMM family)
// and convolutions whose A panel is gathered straight from the image (the IMPLICIT_GEMM family).
//
// Packed formats (MR, NR, KC from GemmShape<T>):
//   A block: rows i in [0, mc) of the block at dst + i * KC, entries [0, kc) of each row (row-major
//            with the fixed leading dimension KC). The driver zero-fills rows mc..round_up(mc, MR).
//   B block: columns in slivers of NR; sliver s (columns [s*NR, s*NR+NR)) at dst + s * kc * NR,
//            laid out [kc][NR]; columns past nc must be written as zeros.
// C is addressed through a row functor: crow(i) -> T* to C(i, 0); column j is at crow(i)[j * csc].
//
// Threading: the driver packs B for a (K, N) super-block cooperatively, then splits the product
// into (M block x N block) tasks with parallel_for; each task packs its own A block into a
// thread-local buffer. Small products run on the calling thread.
#ifndef JAXDNN_CPU_GEMM_H_
#define JAXDNN_CPU_GEMM_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "epilogue.h"
#include "jaxdnn/conv_problem.h"
#include "parallel.h"

namespace jaxdnn::cpu {

// Register block (MR rows x NR columns of C) and the K block (KC) per type and instruction set.
template <typename T>
struct GemmShape;
#if defined(__AVX512F__)
template <> struct GemmShape<float> { static constexpr int MR = 12, NR = 32, KC = 256, MC = 144, NC = 512; };
template <> struct GemmShape<double> { static constexpr int MR = 12, NR = 16, KC = 192, MC = 144, NC = 256; };
#elif defined(__AVX__)
template <> struct GemmShape<float> { static constexpr int MR = 6, NR = 16, KC = 256, MC = 120, NC = 512; };
template <> struct GemmShape<double> { static constexpr int MR = 6, NR = 8, KC = 256, MC = 120, NC = 256; };
#else
template <> struct GemmShape<float> { static constexpr int MR = 6, NR = 8, KC = 256, MC = 120, NC = 256; };
template <> struct GemmShape<double> { static constexpr int MR = 6, NR = 4, KC = 256, MC = 120, NC = 256; };
#endif

// Largest packed-B super-block, in elements (the driver loops over (K, N) super-blocks).
constexpr int64_t kGemmPackBCapElems = int64_t{2} << 20;

// Thread-local, 64-byte aligned, grow-only scratch (slot 0: A blocks, 1: B super-block,
// 2..3: free for packers). Bounded by the callers' caps.
template <typename T>
T* gemm_scratch(int slot, size_t elems);

// The macro kernel: C block (mc x nc; element (i, j) at crow[i][coff + j * csc]) =
//   alpha * Apacked * Bpacked + beta * C   (beta == 0: C is not read).
template <typename T>
void gemm_macro(int64_t mc, int64_t nc, int64_t kc, const T* Ap, const T* Bp, T alpha, T beta,
                T* const* crow, int64_t csc, int64_t coff);

// Plain strided packers: A(i, k) = A[i * rs + k * cs], B(k, j) = B[k * rs + j * cs].
template <typename T>
void gemm_pack_a_strided(T* dst, const T* A, int64_t rs, int64_t cs, int64_t i0, int64_t mc,
                         int64_t k0, int64_t kc);
template <typename T>
void gemm_pack_b_strided(T* dst, const T* B, int64_t rs, int64_t cs, int64_t k0, int64_t kc,
                         int64_t j0, int64_t nc);

// Row-major product with optional transposes (BLAS sgemm/dgemm semantics, row-major):
//   C[M x N] (ldc) = alpha * op(A) * op(B) + beta * C;  op(A) is M x K, op(B) is K x N.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Runs fn(begin, end) over [0, n) task indices, one task per chunk, on the pool unless `serial`.
inline void gemm_run_tasks(int64_t n, bool serial, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (serial || n == 1) {
    fn(0, n);
    return;
  }
  parallel_for(n, fn, 1, static_cast<int>(std::min<int64_t>(n, 1 << 20)));
}

inline int64_t gemm_round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// The default epilogue of gemm_driver: none.
struct GemmNoEpilogue {
  static constexpr bool kActive = false;
  void operator()(int64_t, int64_t, int64_t, int64_t) const {}
};

// The blocked driver.
//   pack_a(T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc): rows [i0, i0+mc) x [k0, k0+kc)
//     into dst + i * KC (see above).
//   pack_b(T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc): [k0, k0+kc) x [j0, j0+nc)
//     into NR-column slivers, zero-padded to a multiple of NR columns.
//   crow(int64_t i) -> T*: C(i, 0).  csc: C column stride.
//   epi(int64_t i0, int64_t mc, int64_t j0, int64_t nc): called once for every block of C, rows
//     [i0, i0+mc) x columns [j0, j0+nc), right after the block's last K step has been stored
//     (the block is still in cache), by the thread that computed it. Blocks are disjoint and
//     cover C. Epi::kActive == false skips the calls.
template <typename T, class PackA, class PackB, class CRow, class Epi = GemmNoEpilogue>
void gemm_driver(int64_t M, int64_t N, int64_t K, T alpha, T beta, const PackA& pack_a,
                 const PackB& pack_b, const CRow& crow, int64_t csc, const Epi& epi = Epi()) {
  constexpr int MR = GemmShape<T>::MR, NR = GemmShape<T>::NR, KC = GemmShape<T>::KC;
  if (M <= 0 || N <= 0) return;
  const double work = 2.0 * static_cast<double>(M) * N * std::max<int64_t>(K, 1);
  const int nt = num_threads();
  const bool serial = nt <= 1 || work < 3.0e6;
  if (K <= 0) {  // C = beta * C
    gemm_run_tasks(M, serial || M * N < 65536, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        T* c = crow(i);
        for (int64_t j = 0; j < N; ++j) c[j * csc] = beta == T(0) ? T(0) : beta * c[j * csc];
        if constexpr (Epi::kActive) epi(i, 1, 0, N);
      }
    });
    return;
  }
  // N super-block NB (multiple of NR) and K super-block KB (multiple of KC) for the packed B.
  const int64_t Npad = gemm_round_up(N, NR);
  int64_t NB = std::min<int64_t>(Npad, std::max<int64_t>(NR, kGemmPackBCapElems / KC / NR * NR));
  const int64_t Kpad = gemm_round_up(K, KC);
  int64_t KB = std::min<int64_t>(Kpad, std::max<int64_t>(KC, kGemmPackBCapElems / NB / KC * KC));
  // Task blocking: tasks are (M block of MC rows) x (N group); a task packs its A block once per
  // K block and sweeps its N group in NC-column macro blocks (B block kc x NC stays in L2).
  int64_t MC = std::min<int64_t>(GemmShape<T>::MC, gemm_round_up(M, MR));
  const int64_t NC = std::min<int64_t>(NB, GemmShape<T>::NC);
  int64_t ngroups = 1;
  if (!serial) {
    while ((M + MC - 1) / MC < 4 * nt && MC > 4 * MR)
      MC = std::max<int64_t>(4 * MR, gemm_round_up(MC / 2, MR));
    int64_t nmb = (M + MC - 1) / MC;
    if (nmb < 4 * nt) {
      // Few row blocks: even them out to a multiple of the thread count and split N as well.
      nmb = std::max<int64_t>(1, (nmb + nt - 1) / nt * nt);
      MC = std::max<int64_t>(MR, gemm_round_up((M + nmb - 1) / nmb, MR));
      nmb = (M + MC - 1) / MC;
      ngroups = std::min<int64_t>((4 * nt + nmb - 1) / nmb, std::max<int64_t>(1, Npad / (2 * NR)));
    }
  }
  for (int64_t nb0 = 0; nb0 < N; nb0 += NB) {
    const int64_t nbw = std::min(NB, N - nb0);
    const int64_t nbpad = gemm_round_up(nbw, NR);
    const int64_t nsl = nbpad / NR;
    // N group width in slivers.
    const int64_t ng = std::max<int64_t>(1, std::min<int64_t>(ngroups, nsl));
    const int64_t gsl = (nsl + ng - 1) / ng;
    const int64_t ngr = (nsl + gsl - 1) / gsl;
    for (int64_t kb0 = 0; kb0 < K; kb0 += KB) {
      const int64_t kbw = std::min(KB, K - kb0);
      const int64_t nkb = (kbw + KC - 1) / KC;
      T* Bp = gemm_scratch<T>(1, static_cast<size_t>(nkb * KC * nbpad));
      // Pack B: units of (k block, group of up to 4 slivers).
      const int64_t sg = 4;
      const int64_t nsg = (nsl + sg - 1) / sg;
      gemm_run_tasks(nkb * nsg, serial || kbw * nbw < 32768, [&](int64_t b, int64_t e) {
        for (int64_t u = b; u < e; ++u) {
          const int64_t pcb = u / nsg, s0 = (u % nsg) * sg;
          const int64_t k0 = kb0 + pcb * KC, kc = std::min<int64_t>(KC, kb0 + kbw - k0);
          const int64_t j0 = s0 * NR, nc = std::min<int64_t>(sg * NR, nbw - j0);
          pack_b(Bp + pcb * KC * nbpad + s0 * kc * NR, k0, kc, nb0 + j0, nc);
        }
      });
      const T beff = kb0 == 0 ? beta : T(1);
      const int64_t nmb = (M + MC - 1) / MC;
      gemm_run_tasks(nmb * ngr, serial, [&](int64_t b, int64_t e) {
        T* Ap = gemm_scratch<T>(0, static_cast<size_t>(MC * KC));
        T* rows[1024];
        for (int64_t t = b; t < e; ++t) {
          const int64_t ib = t / ngr, jg = t % ngr;
          const int64_t i0 = ib * MC, mc = std::min<int64_t>(MC, M - i0);
          const int64_t g0 = jg * gsl * NR, g1 = std::min<int64_t>(nbw, (jg + 1) * gsl * NR);
          for (int64_t i = 0; i < mc; ++i) rows[i] = crow(i0 + i) + nb0 * csc;
          const int64_t mpad = gemm_round_up(mc, MR);
          for (int64_t pcb = 0; pcb < nkb; ++pcb) {
            const int64_t k0 = kb0 + pcb * KC, kc = std::min<int64_t>(KC, kb0 + kbw - k0);
            pack_a(Ap, i0, mc, k0, kc);
            for (int64_t i = mc; i < mpad; ++i) std::memset(Ap + i * KC, 0, sizeof(T) * kc);
            const T bk = pcb == 0 ? beff : T(1);
            const bool last_k = kb0 + kbw >= K && pcb == nkb - 1;
            for (int64_t j0 = g0; j0 < g1; j0 += NC) {
              const int64_t nc = std::min<int64_t>(NC, g1 - j0);
              gemm_macro<T>(mc, nc, kc, Ap, Bp + pcb * KC * nbpad + (j0 / NR) * kc * NR, alpha,
                            bk, rows, csc, j0 * csc);
              if constexpr (Epi::kActive) {
                if (last_k) epi(i0, mc, nb0 + j0, nc);
              }
            }
          }
        }
      });
    }
  }
}

// gemm_driver epilogue of a convolution's forward product whose C(i, j) is the output element
// crow(i)[j * csc] of channel k0 + j: applies the fused epilogue (epilogue.h) to each finished
// block, along runs of rows that are contiguous in memory. Channels-last (csc == 1): a block
// spanning all K channels makes consecutive pixels one contiguous span, else each row is one.
// Channels-first: each channel along the block's pixels of one image.
template <typename T, class CRow>
struct ConvGemmEpilogue {
  static constexpr bool kActive = true;
  const CpuEpilogue<T>* epi;
  const CRow* crow;
  int64_t csc, k0;
  void operator()(int64_t i0, int64_t mc, int64_t j0, int64_t nc) const {
    const bool full_rows = csc == 1 && k0 + j0 == 0 && nc == epi->K;
    const int64_t step = csc == 1 ? nc : 1;
    for (int64_t a = 0; a < mc;) {
      T* base = (*crow)(i0 + a) + j0 * csc;
      int64_t b = a + 1;
      if (full_rows || csc != 1)
        while (b < mc && (*crow)(i0 + b) + j0 * csc == base + (b - a) * step) ++b;
      if (csc == 1) {
        epi->apply_channels_last(base, (b - a) * nc, k0 + j0);
      } else {
        for (int64_t j = 0; j < nc; ++j) epi->apply(base + j * csc, b - a, 1, k0 + j0 + j, 0);
      }
      a = b;
    }
  }
};

// Runs gemm_driver with the fused epilogue of `epi` (when non-null) on output channels k0 + j.
template <typename T, class PackA, class PackB, class CRow>
void gemm_driver_conv_fwd(int64_t M, int64_t N, int64_t K, const PackA& pack_a,
                          const PackB& pack_b, const CRow& crow, int64_t csc,
                          const CpuEpilogue<T>* epi, int64_t k0) {
  if (epi == nullptr) {
    gemm_driver<T>(M, N, K, T(1), T(0), pack_a, pack_b, crow, csc);
    return;
  }
  gemm_driver<T>(M, N, K, T(1), T(0), pack_a, pack_b, crow, csc,
                 ConvGemmEpilogue<T, CRow>{epi, &crow, csc, k0});
}

// ---- Two-level strided views (used by the convolution families) -------------------------------
// Offset of index i along an axis: div == 0: i * lo;  else (i / div) * hi + (i % div) * lo.
// (E.g. the flattened (image, pixel) index of an NCHW tensor.)
struct GemmAxis {
  int64_t div = 0, hi = 0, lo = 1;
  int64_t off(int64_t i) const { return div == 0 ? i * lo : (i / div) * hi + (i % div) * lo; }
  bool unit() const { return div == 0 && lo == 1; }
};
inline GemmAxis gemm_axis(int64_t lo) { return GemmAxis{0, 0, lo}; }
inline GemmAxis gemm_axis2(int64_t div, int64_t hi, int64_t lo) { return GemmAxis{div, hi, lo}; }

// A(i, k) = p[r.off(i) + c.off(k)] into the packed A format.
template <typename T>
void gemm_pack_a_view(T* dst, const T* p, const GemmAxis& r, const GemmAxis& c, int64_t i0,
                      int64_t mc, int64_t k0, int64_t kc) {
  constexpr int KC = GemmShape<T>::KC;
  if (c.unit()) {
    for (int64_t i = 0; i < mc; ++i)
      std::memcpy(dst + i * KC, p + r.off(i0 + i) + k0, sizeof(T) * kc);
    return;
  }
  int64_t coff[KC];
  for (int64_t k = 0; k < kc; ++k) coff[k] = c.off(k0 + k);
  if (r.unit()) {
    for (int64_t k = 0; k < kc; ++k) {
      const T* src = p + coff[k] + i0;
      for (int64_t i = 0; i < mc; ++i) dst[i * KC + k] = src[i];
    }
    return;
  }
  for (int64_t i = 0; i < mc; ++i) {
    const T* src = p + r.off(i0 + i);
    for (int64_t k = 0; k < kc; ++k) dst[i * KC + k] = src[coff[k]];
  }
}

// B(k, j) = p[rowoff(k) + j * cs] into the packed B format (rowoff: functor int64 -> int64).
template <typename T, class RowOff>
void gemm_pack_b_rows(T* dst, const T* p, const RowOff& rowoff, int64_t cs, int64_t k0,
                      int64_t kc, int64_t j0, int64_t nc) {
  constexpr int NR = GemmShape<T>::NR;
  constexpr int KC = GemmShape<T>::KC;
  const int64_t nsl = (nc + NR - 1) / NR;
  if (cs != 1 && kc <= KC) {
    // Columns are strided: walk each column along k (rows usually contiguous there).
    int64_t roff[KC];
    for (int64_t k = 0; k < kc; ++k) roff[k] = rowoff(k0 + k);
    for (int64_t s = 0; s < nsl; ++s) {
      T* d = dst + s * kc * NR;
      const int64_t w = std::min<int64_t>(NR, nc - s * NR);
      for (int64_t j = 0; j < w; ++j) {
        const T* src = p + (j0 + s * NR + j) * cs;
        for (int64_t k = 0; k < kc; ++k) d[k * NR + j] = src[roff[k]];
      }
      for (int64_t j = w; j < NR; ++j)
        for (int64_t k = 0; k < kc; ++k) d[k * NR + j] = T(0);
    }
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    const T* src = p + rowoff(k0 + k) + j0 * cs;
    for (int64_t s = 0; s < nsl; ++s) {
      T* d = dst + s * kc * NR + k * NR;
      const int64_t w = std::min<int64_t>(NR, nc - s * NR);
      const T* sp = src + s * NR * cs;
      if (cs == 1) {
        std::memcpy(d, sp, sizeof(T) * w);
      } else {
        for (int64_t j = 0; j < w; ++j) d[j] = sp[j * cs];
      }
      for (int64_t j = w; j < NR; ++j) d[j] = T(0);
    }
  }
}

template <typename T>
void gemm_pack_b_view(T* dst, const T* p, const GemmAxis& r, const GemmAxis& c, int64_t k0,
                      int64_t kc, int64_t j0, int64_t nc) {
  if (c.div == 0) {
    gemm_pack_b_rows<T>(dst, p, [&](int64_t k) { return r.off(k); }, c.lo, k0, kc, j0, nc);
    return;
  }
  constexpr int NR = GemmShape<T>::NR;
  for (int64_t k = 0; k < kc; ++k) {
    const T* src = p + r.off(k0 + k);
    for (int64_t j = 0; j < gemm_round_up(nc, NR); ++j)
      dst[(j / NR) * kc * NR + k * NR + j % NR] = j < nc ? src[c.off(j0 + j)] : T(0);
  }
}

// ---- Convolution helpers shared by conv_gemm.cc and conv_implicit_gemm.cc ----------------------
// Element strides of an activation tensor with `ch` channels and spatial dims `dims`:
// n (image), c (channel), sp[3] (D, H, W), pix (between consecutive flattened pixels).
struct ActStrides {
  int64_t n, c, pix, sp[3];
};
inline ActStrides act_strides(bool nhwc, int64_t ch, const int64_t dims[3]) {
  ActStrides s;
  const int64_t npix = dims[0] * dims[1] * dims[2];
  if (nhwc) {
    s.c = 1;
    s.sp[2] = ch;
    s.sp[1] = dims[2] * ch;
    s.sp[0] = dims[1] * dims[2] * ch;
    s.pix = ch;
  } else {
    s.sp[2] = 1;
    s.sp[1] = dims[2];
    s.sp[0] = dims[1] * dims[2];
    s.c = npix;
    s.pix = 1;
  }
  s.n = npix * ch;
  return s;
}

// Im2col element gather for one row of the column matrix: dst[k] = column (k0 + k) for k < kc.
// toff[tap] = spatial element offset of the tap (or < 0 when it reads padding).
// tap_major: column = tap * nch + ch; else column = ch * ntaps + tap. chs: channel stride.
template <typename T>
inline void conv_gather_row(T* dst, const T* base, const int64_t* toff, int64_t ntaps, int64_t nch,
                            int64_t chs, bool tap_major, int64_t k0, int64_t kc) {
  if (tap_major) {
    int64_t tap = k0 / nch, c = k0 % nch, k = 0;
    while (k < kc) {
      const int64_t run = std::min(nch - c, kc - k);
      const int64_t off = toff[tap];
      if (off < 0) {
        for (int64_t r = 0; r < run; ++r) dst[k + r] = T(0);
      } else if (chs == 1) {
        const T* src = base + off + c;
        if (run >= 16) {
          std::memcpy(dst + k, src, sizeof(T) * run);
        } else {
          for (int64_t r = 0; r < run; ++r) dst[k + r] = src[r];
        }
      } else {
        const T* src = base + off + c * chs;
        for (int64_t r = 0; r < run; ++r) dst[k + r] = src[r * chs];
      }
      k += run;
      ++tap;
      c = 0;
    }
  } else {
    int64_t c = k0 / ntaps, tap = k0 % ntaps;
    for (int64_t k = 0; k < kc; ++k) {
      const int64_t off = toff[tap];
      dst[k] = off < 0 ? T(0) : base[off + c * chs];
      if (++tap == ntaps) {
        tap = 0;
        ++c;
      }
    }
  }
}


// Input index along axis a read by output index o through filter tap f, or -1 when the virtual
// input element there is padding or an lhs-dilation hole.
inline int64_t conv_in_index(const ConvProblem& p, int a, int64_t o, int64_t f) {
  int64_t j = o * p.stride[a] + f * p.dilation[a] - p.pad_lo[a];
  if (j < 0) return -1;
  const int64_t l = p.lhs_dilation[a];
  if (l != 1) {
    if (j % l != 0) return -1;
    j /= l;
  }
  return j < p.in[a] ? j : -1;
}

inline void conv_decode(int64_t idx, const int64_t dims[3], int64_t o[3]) {
  o[2] = idx % dims[2];
  idx /= dims[2];
  o[1] = idx % dims[1];
  o[0] = idx / dims[1];
}

// toff[t] for flattened taps t in [t0, t1) ((t * R + r) * S + s) of output pixel o: the spatial
// element offset sum_a in_index_a * sp[a], or -1 when any axis reads padding.
inline void conv_tap_offsets(const ConvProblem& p, const int64_t o[3], const int64_t sp[3],
                             int64_t t0, int64_t t1, int64_t* toff) {
  if (t0 >= t1) return;
  const int64_t R = p.filt[1], S = p.filt[2];
  int64_t f[3];
  conv_decode(t0, p.filt, f);
  int64_t i0 = conv_in_index(p, 0, o[0], f[0]);
  int64_t i1 = conv_in_index(p, 1, o[1], f[1]);
  for (int64_t t = t0; t < t1;) {
    const int64_t s_end = std::min<int64_t>(S, f[2] + (t1 - t));
    const bool ok01 = i0 >= 0 && i1 >= 0;
    const int64_t b01 = i0 * sp[0] + i1 * sp[1];
    for (int64_t s = f[2]; s < s_end; ++s, ++t) {
      const int64_t i2 = ok01 ? conv_in_index(p, 2, o[2], s) : -1;
      toff[t] = i2 >= 0 ? b01 + i2 * sp[2] : -1;
    }
    f[2] = 0;
    if (++f[1] == R) {
      f[1] = 0;
      ++f[0];
      i0 = f[0] < p.filt[0] ? conv_in_index(p, 0, o[0], f[0]) : -1;
    }
    i1 = conv_in_index(p, 1, o[1], f[1]);
  }
}


// dw[kk * ldw + k] = t[k * KK + kk] for k < Kg, kk < KK (NHWC backward-filter staging).
template <typename T, class Geo>
void transpose_into_dw(const Geo& g, const T* t, T* dw, int64_t ldw) {
  parallel_for(
      g.KK,
      [&](int64_t b, int64_t e) {
        constexpr int64_t kB = 16;
        for (int64_t kk0 = b; kk0 < e; kk0 += kB) {
          const int64_t kk1 = std::min(e, kk0 + kB);
          for (int64_t k = 0; k < g.Kg; ++k)
            for (int64_t kk = kk0; kk < kk1; ++kk) dw[kk * ldw + k] = t[k * g.KK + kk];
        }
      },
      64);
}


// 1x1 filter, unit strides, no padding, no dilation: the input is its own column matrix.
inline bool conv_is_pointwise(const ConvProblem& p) {
  for (int a = 0; a < 3; ++a) {
    if (p.filt[a] != 1 || p.stride[a] != 1 || p.lhs_dilation[a] != 1 || p.pad_lo[a] != 0 ||
        p.pad_hi[a] != 0)
      return false;
  }
  return true;
}

// The GEMM view of a convolution shared by the GEMM and implicit-GEMM families: per-group
// sizes (reduction KK = taps * Cg, M = N * output pixels) and activation strides.
struct ConvGemmDims {
  bool nhwc;
  int64_t G, Cg, Kg, TRS, KK, opix, ipix, M;
  ActStrides xs, ys;
  explicit ConvGemmDims(const ConvProblem& p) {
    nhwc = p.layout == Layout::kNHWC;
    G = p.G;
    Cg = p.Cg();
    Kg = p.Kg();
    TRS = p.filt_taps();
    KK = TRS * Cg;
    opix = p.out_pixels();
    ipix = p.in_pixels();
    M = p.N * opix;
    xs = act_strides(nhwc, p.C, p.in);
    ys = act_strides(nhwc, p.K, p.out);
  }
  // Flattened pixel axes (m = n * npix + pixel) of x and y.
  GemmAxis xpix() const { return nhwc ? gemm_axis(xs.pix) : gemm_axis2(ipix, xs.n, 1); }
  GemmAxis ypix() const { return nhwc ? gemm_axis(ys.pix) : gemm_axis2(opix, ys.n, 1); }
};

// Weight views. w(kk, k) for group gg (forward / backward-filter orientation).
template <typename T>
struct WView {
  const T* p;
  GemmAxis kk, k;
};
template <typename T>
WView<T> weight_kk_k(const ConvGemmDims& g, const T* w, int64_t gg) {
  if (g.nhwc) return {w + gg * g.Kg, gemm_axis(g.G * g.Kg), gemm_axis(1)};
  return {w + gg * g.Kg * g.KK, gemm_axis(1), gemm_axis(g.KK)};
}

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_GEMM_H_
