// Blocked matrix product: microkernel (GCC/Clang vector extensions), macro kernel, packers.
#include "gemm.h"

#include <cstdlib>
#include <memory>
#include <new>

namespace jaxdnn::cpu {
namespace {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

typedef float vf __attribute__((vector_size(kVecBytes)));
typedef double vd __attribute__((vector_size(kVecBytes)));
typedef float vf_u __attribute__((vector_size(kVecBytes), aligned(4)));
typedef double vd_u __attribute__((vector_size(kVecBytes), aligned(8)));

template <typename T> struct Vec;
template <> struct Vec<float> { using V = vf; using VU = vf_u; };
template <> struct Vec<double> { using V = vd; using VU = vd_u; };

// MR x NR register tile over kc; A rows at a + i*KC, B sliver [kc][NR].
template <typename T>
__attribute__((noinline)) void micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b, T alpha, T beta,
                         T* const* rows, int64_t coff, int64_t csc, int mr, int nr) {
  using V = typename Vec<T>::V;
  using VU = typename Vec<T>::VU;
  constexpr int MR = GemmShape<T>::MR, NR = GemmShape<T>::NR, KC = GemmShape<T>::KC;
  constexpr int VL = kVecBytes / sizeof(T);
  constexpr int NV = NR / VL;
  static_assert(NV * VL == NR, "NR must be a multiple of the vector length");
  V acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = V{};
  if (mr == MR && csc == 1) {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) __builtin_prefetch(rows[i] + coff, 1, 3);
  }
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = *reinterpret_cast<const V*>(b + k * NR + v * VL);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const T s = a[i * KC + k];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] += s * bv[v];
    }
  }
  if (mr == MR && nr == NR && csc == 1) {
    if (beta == T(0)) {
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) {
        T* c = rows[i] + coff;
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) *reinterpret_cast<VU*>(c + v * VL) = alpha * acc[i][v];
      }
    } else {
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) {
        T* c = rows[i] + coff;
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          VU* p = reinterpret_cast<VU*>(c + v * VL);
          *p = alpha * acc[i][v] + beta * *p;
        }
      }
    }
    return;
  }
  alignas(64) T tile[MR * NR];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) *reinterpret_cast<V*>(tile + i * NR + v * VL) = acc[i][v];
  for (int i = 0; i < mr; ++i) {
    T* c = rows[i] + coff;
    if (beta == T(0)) {
      for (int j = 0; j < nr; ++j) c[j * csc] = alpha * tile[i * NR + j];
    } else {
      for (int j = 0; j < nr; ++j) c[j * csc] = alpha * tile[i * NR + j] + beta * c[j * csc];
    }
  }
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

struct Scratch {
  std::unique_ptr<char, AlignedFree> ptr;
  size_t bytes = 0;
};

}  // namespace

template <typename T>
T* gemm_scratch(int slot, size_t elems) {
  thread_local Scratch slots[4];
  Scratch& s = slots[slot];
  const size_t bytes = std::max<size_t>(64, (elems * sizeof(T) + 63) / 64 * 64);
  if (s.bytes < bytes) {
    s.ptr.reset();
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    s.ptr.reset(static_cast<char*>(p));
    s.bytes = bytes;
  }
  return reinterpret_cast<T*>(s.ptr.get());
}

template <typename T>
void gemm_macro(int64_t mc, int64_t nc, int64_t kc, const T* Ap, const T* Bp, T alpha, T beta,
                T* const* crow, int64_t csc, int64_t coff) {
  constexpr int MR = GemmShape<T>::MR, NR = GemmShape<T>::NR, KC = GemmShape<T>::KC;
  for (int64_t ir = 0; ir < mc; ir += MR) {
    const int mr = static_cast<int>(std::min<int64_t>(MR, mc - ir));
    for (int64_t jr = 0; jr < nc; jr += NR) {
      const int nr = static_cast<int>(std::min<int64_t>(NR, nc - jr));
      micro_kernel<T>(kc, Ap + ir * KC, Bp + (jr / NR) * kc * NR, alpha, beta, crow + ir,
                      coff + jr * csc, csc, mr, nr);
    }
  }
}

template <typename T>
void gemm_pack_a_strided(T* dst, const T* A, int64_t rs, int64_t cs, int64_t i0, int64_t mc,
                         int64_t k0, int64_t kc) {
  constexpr int KC = GemmShape<T>::KC;
  if (cs == 1) {
    for (int64_t i = 0; i < mc; ++i)
      std::memcpy(dst + i * KC, A + (i0 + i) * rs + k0, sizeof(T) * kc);
  } else if (rs == 1) {
    // Transposed source: read along rows (contiguous), write with stride KC.
    for (int64_t k = 0; k < kc; ++k) {
      const T* src = A + (k0 + k) * cs + i0;
      for (int64_t i = 0; i < mc; ++i) dst[i * KC + k] = src[i];
    }
  } else {
    for (int64_t i = 0; i < mc; ++i) {
      const T* src = A + (i0 + i) * rs + k0 * cs;
      for (int64_t k = 0; k < kc; ++k) dst[i * KC + k] = src[k * cs];
    }
  }
}

template <typename T>
void gemm_pack_b_strided(T* dst, const T* B, int64_t rs, int64_t cs, int64_t k0, int64_t kc,
                         int64_t j0, int64_t nc) {
  constexpr int NR = GemmShape<T>::NR;
  for (int64_t s = 0; s * NR < nc; ++s) {
    const int64_t w = std::min<int64_t>(NR, nc - s * NR);
    T* d = dst + s * kc * NR;
    const T* src = B + k0 * rs + (j0 + s * NR) * cs;
    if (cs == 1) {
      for (int64_t k = 0; k < kc; ++k) {
        std::memcpy(d + k * NR, src + k * rs, sizeof(T) * w);
        for (int64_t j = w; j < NR; ++j) d[k * NR + j] = T(0);
      }
    } else {
      for (int64_t j = 0; j < w; ++j)
        for (int64_t k = 0; k < kc; ++k) d[k * NR + j] = src[k * rs + j * cs];
      for (int64_t k = 0; k < kc; ++k)
        for (int64_t j = w; j < NR; ++j) d[k * NR + j] = T(0);
    }
  }
}

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  const int64_t ars = trans_a ? 1 : lda, acs = trans_a ? lda : 1;
  const int64_t brs = trans_b ? 1 : ldb, bcs = trans_b ? ldb : 1;
  gemm_driver<T>(
      M, N, K, alpha, beta,
      [&](T* dst, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
        gemm_pack_a_strided<T>(dst, A, ars, acs, i0, mc, k0, kc);
      },
      [&](T* dst, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
        gemm_pack_b_strided<T>(dst, B, brs, bcs, k0, kc, j0, nc);
      },
      [&](int64_t i) { return C + i * ldc; }, int64_t{1});
}

#define JAXDNN_GEMM_INSTANTIATE(T)                                                              \
  template T* gemm_scratch<T>(int, size_t);                                                     \
  template void gemm_macro<T>(int64_t, int64_t, int64_t, const T*, const T*, T, T, T* const*,   \
                              int64_t, int64_t);                                                \
  template void gemm_pack_a_strided<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t,        \
                                       int64_t, int64_t);                                       \
  template void gemm_pack_b_strided<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t,        \
                                       int64_t, int64_t);                                       \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*,  \
                        int64_t, T, T*, int64_t);

JAXDNN_GEMM_INSTANTIATE(float)
JAXDNN_GEMM_INSTANTIATE(double)

}  // namespace jaxdnn::cpu
