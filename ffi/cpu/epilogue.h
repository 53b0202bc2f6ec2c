// The epilogue of fused forward convolutions on the CPU (ConvEpilogue, conv_problem.h), applied by
// each kernel family right where it stores a block of its output, while the block is in cache:
//   z = acc + bias[k] + residual[i],   preact[i] = z (when stored),   y[i] = act(z)
// in the kernel's compute type T (float or double), so the result is rounded once: by the store of
// a T result, or by the final narrowing of a 16-bit one (conv_cpu.cc). bias is widened to T once
// per call; residual and preact keep the result's dtype and are converted per element. Contiguous
// runs with a T residual and no preact take one fused pass per element; the rest go through
// blocks of 256 elements (gather, add, convert, store preact, activate, scatter).
#ifndef JAXDNN_CPU_EPILOGUE_H_
#define JAXDNN_CPU_EPILOGUE_H_

#include <algorithm>
#include <cstdint>

#include "activation_math.h"
#include "float16.h"
#include "jaxdnn/conv_problem.h"

namespace jaxdnn::cpu {

namespace epilogue_detail {

template <Activation A, typename T>
inline void activate_run(T* z, int64_t n, T param) {
  for (int64_t j = 0; j < n; ++j) z[j] = act_forward<A, T>(z[j], param);
}

// z[j] = act(z[j]) with the switch outside the loop (each case a branch-free, vectorizable loop).
template <typename T>
inline void activate_block(Activation a, T* z, int64_t n, T param) {
  switch (a) {
    case Activation::kIdentity: return;
    case Activation::kRelu: return activate_run<Activation::kRelu>(z, n, param);
    case Activation::kLeakyRelu: return activate_run<Activation::kLeakyRelu>(z, n, param);
    case Activation::kClippedRelu: return activate_run<Activation::kClippedRelu>(z, n, param);
    case Activation::kElu: return activate_run<Activation::kElu>(z, n, param);
    case Activation::kSigmoid: return activate_run<Activation::kSigmoid>(z, n, param);
    case Activation::kTanh: return activate_run<Activation::kTanh>(z, n, param);
    case Activation::kGelu: return activate_run<Activation::kGelu>(z, n, param);
    case Activation::kGeluTanh: return activate_run<Activation::kGeluTanh>(z, n, param);
    case Activation::kSilu: return activate_run<Activation::kSilu>(z, n, param);
  }
}

enum class BiasMode { kNone, kVector, kScalar };

// y[i] = act(y[i] + bias + r[i]) in one pass (the fast path: unit stride, residual in T, no
// preact). kVector: bias b[i]; kScalar: bias b[0] for all.
template <Activation A, BiasMode kBias, bool kRes, typename T>
inline void fused_run(T* __restrict y, const T* __restrict b, const T* __restrict r, int64_t n,
                      T param) {
  const T b0 = kBias == BiasMode::kScalar ? b[0] : T(0);
  for (int64_t i = 0; i < n; ++i) {
    T z = y[i];
    if constexpr (kBias == BiasMode::kVector) z += b[i];
    if constexpr (kBias == BiasMode::kScalar) z += b0;
    if constexpr (kRes) z += r[i];
    y[i] = act_forward<A, T>(z, param);
  }
}

template <Activation A, typename T>
inline void fused_run_any(T* y, const T* b, BiasMode bm, const T* r, int64_t n, T param) {
  if (r != nullptr) {
    switch (bm) {
      case BiasMode::kNone: return fused_run<A, BiasMode::kNone, true>(y, b, r, n, param);
      case BiasMode::kVector: return fused_run<A, BiasMode::kVector, true>(y, b, r, n, param);
      case BiasMode::kScalar: return fused_run<A, BiasMode::kScalar, true>(y, b, r, n, param);
    }
  }
  switch (bm) {
    case BiasMode::kNone: return fused_run<A, BiasMode::kNone, false>(y, b, r, n, param);
    case BiasMode::kVector: return fused_run<A, BiasMode::kVector, false>(y, b, r, n, param);
    case BiasMode::kScalar: return fused_run<A, BiasMode::kScalar, false>(y, b, r, n, param);
  }
}

template <typename T>
inline void fused_block(Activation a, T* y, const T* b, BiasMode bm, const T* r, int64_t n,
                        T param) {
  switch (a) {
    case Activation::kIdentity: return fused_run_any<Activation::kIdentity>(y, b, bm, r, n, param);
    case Activation::kRelu: return fused_run_any<Activation::kRelu>(y, b, bm, r, n, param);
    case Activation::kLeakyRelu: return fused_run_any<Activation::kLeakyRelu>(y, b, bm, r, n, param);
    case Activation::kClippedRelu:
      return fused_run_any<Activation::kClippedRelu>(y, b, bm, r, n, param);
    case Activation::kElu: return fused_run_any<Activation::kElu>(y, b, bm, r, n, param);
    case Activation::kSigmoid: return fused_run_any<Activation::kSigmoid>(y, b, bm, r, n, param);
    case Activation::kTanh: return fused_run_any<Activation::kTanh>(y, b, bm, r, n, param);
    case Activation::kGelu: return fused_run_any<Activation::kGelu>(y, b, bm, r, n, param);
    case Activation::kGeluTanh: return fused_run_any<Activation::kGeluTanh>(y, b, bm, r, n, param);
    case Activation::kSilu: return fused_run_any<Activation::kSilu>(y, b, bm, r, n, param);
  }
}

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }

}  // namespace epilogue_detail

template <typename T>
struct CpuEpilogue {
  const T* y0 = nullptr;           // the output buffer the kernel writes (compute type)
  const T* bias = nullptr;         // [K] in T, or null
  const void* residual = nullptr;  // output-shaped, dtype io_dtype, or null
  void* preact = nullptr;          // output-shaped, dtype io_dtype, or null
  DType io_dtype = DType::kF32;    // the result's dtype (residual, preact)
  Activation act = Activation::kIdentity;
  T param = T(0);
  int64_t K = 0;                   // output channels

  // Applies the epilogue to the n output elements y[j * stride], j < n, of output channels
  // k0 + j * kstep, which the kernel has just stored (plain convolution sums). y points into the
  // buffer starting at y0, and residual / preact share its element offsets.
  void apply(T* y, int64_t n, int64_t stride, int64_t k0, int64_t kstep) const {
    using epilogue_detail::BiasMode;
    if (stride == 1 && (kstep == 0 || kstep == 1) && fast()) {
      const BiasMode bm = bias == nullptr ? BiasMode::kNone
                          : kstep == 1    ? BiasMode::kVector
                                          : BiasMode::kScalar;
      epilogue_detail::fused_block<T>(act, y, bias == nullptr ? nullptr : bias + k0, bm,
                                      residual_at(y), n, param);
      return;
    }
    alignas(64) T z[kBlock];
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t nb = std::min(kBlock, n - j0);
      T* yb = y + j0 * stride;
      const int64_t kb = k0 + j0 * kstep;
      if (stride == 1) {
        for (int64_t j = 0; j < nb; ++j) z[j] = yb[j];
      } else {
        for (int64_t j = 0; j < nb; ++j) z[j] = yb[j * stride];
      }
      if (bias != nullptr) {
        if (kstep == 1) {
          for (int64_t j = 0; j < nb; ++j) z[j] += bias[kb + j];
        } else {
          for (int64_t j = 0; j < nb; ++j) z[j] += bias[kb + j * kstep];
        }
      }
      finish(z, nb, yb - y0, stride);
      if (stride == 1) {
        for (int64_t j = 0; j < nb; ++j) yb[j] = z[j];
      } else {
        for (int64_t j = 0; j < nb; ++j) yb[j * stride] = z[j];
      }
    }
  }

  // The same for n contiguous elements of a channels-last output whose first has channel k0
  // (channels wrap at K): whole output pixels, or a run of them, in one call.
  void apply_channels_last(T* y, int64_t n, int64_t k0) const {
    if (fast()) {
      using epilogue_detail::BiasMode;
      const T* r = residual_at(y);
      for (int64_t j = 0, k = k0; j < n; k = 0) {
        const int64_t len = std::min(K - k, n - j);
        epilogue_detail::fused_block<T>(act, y + j, bias == nullptr ? nullptr : bias + k,
                                        bias == nullptr ? BiasMode::kNone : BiasMode::kVector,
                                        r == nullptr ? nullptr : r + j, len, param);
        j += len;
      }
      return;
    }
    alignas(64) T z[kBlock];
    int64_t k = k0;
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t nb = std::min(kBlock, n - j0);
      T* yb = y + j0;
      for (int64_t j = 0; j < nb; ++j) z[j] = yb[j];
      if (bias != nullptr) {
        for (int64_t j = 0; j < nb;) {
          const int64_t len = std::min(K - k, nb - j);
          for (int64_t i = 0; i < len; ++i) z[j + i] += bias[k + i];
          j += len;
          k += len;
          if (k == K) k = 0;
        }
      }
      finish(z, nb, yb - y0, 1);
      for (int64_t j = 0; j < nb; ++j) yb[j] = z[j];
    }
  }

 private:
  static constexpr int64_t kBlock = 256;

  // One pass per element (epilogue_detail::fused_run) when nothing needs converting or storing
  // besides the result.
  bool fast() const {
    return preact == nullptr &&
           (residual == nullptr || io_dtype == epilogue_detail::dtype_of<T>());
  }
  const T* residual_at(const T* y) const {
    return residual == nullptr ? nullptr : static_cast<const T*>(residual) + (y - y0);
  }

  // z (the sums plus bias) += residual; preact = z; z = act(z); at element offset off.
  void finish(T* z, int64_t nb, int64_t off, int64_t stride) const {
    if (residual != nullptr) {
      alignas(64) T r[kBlock];
      load_as<T>(io_dtype, residual, off, stride, nb, r);
      for (int64_t j = 0; j < nb; ++j) z[j] += r[j];
    }
    if (preact != nullptr) store_as<T>(io_dtype, preact, off, stride, nb, z);
    epilogue_detail::activate_block<T>(act, z, nb, param);
  }
};

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_EPILOGUE_H_
