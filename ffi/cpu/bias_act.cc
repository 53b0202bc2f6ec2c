// jaxdnn_bias_act_bwd on the CPU (bias_act.h): one pass over t and s, the activation derivative
// dispatched once per call (a branch-free loop per kind), the bias gradient as per-chunk partial
// sums reduced in chunk order. float32 / float64 operands take one fused loop per row or plane;
// 16-bit ones go through blocks converted to float32.
#include "bias_act.h"

#include <algorithm>
#include <vector>

#include "activation_math.h"
#include "float16.h"
#include "parallel.h"

namespace jaxdnn::cpu {
namespace {

constexpr int64_t kRun = 256;     // elements converted and processed together (stays in L1)
constexpr int64_t kChunks = 32;   // fixed number of partial-sum chunks of the bias gradient

// m[j] = f'(s[j]) from the saved s (output or input, as the kind needs).
template <Activation A, typename T>
void derivative_run(const T* s, T* m, int64_t n, T param) {
  if constexpr (A == Activation::kIdentity) {
    for (int64_t j = 0; j < n; ++j) m[j] = T(1);
  } else if constexpr (A == Activation::kGelu || A == Activation::kGeluTanh ||
                       A == Activation::kSilu) {
    for (int64_t j = 0; j < n; ++j) m[j] = act_grad_from_input<A, T>(s[j], param);
  } else {
    for (int64_t j = 0; j < n; ++j) m[j] = act_grad_from_output<A, T>(s[j], param);
  }
}

template <typename T>
void derivative_block(Activation a, const T* s, T* m, int64_t n, T param) {
  switch (a) {
    case Activation::kIdentity: return derivative_run<Activation::kIdentity>(s, m, n, param);
    case Activation::kRelu: return derivative_run<Activation::kRelu>(s, m, n, param);
    case Activation::kLeakyRelu: return derivative_run<Activation::kLeakyRelu>(s, m, n, param);
    case Activation::kClippedRelu: return derivative_run<Activation::kClippedRelu>(s, m, n, param);
    case Activation::kElu: return derivative_run<Activation::kElu>(s, m, n, param);
    case Activation::kSigmoid: return derivative_run<Activation::kSigmoid>(s, m, n, param);
    case Activation::kTanh: return derivative_run<Activation::kTanh>(s, m, n, param);
    case Activation::kGelu: return derivative_run<Activation::kGelu>(s, m, n, param);
    case Activation::kGeluTanh: return derivative_run<Activation::kGeluTanh>(s, m, n, param);
    case Activation::kSilu: return derivative_run<Activation::kSilu>(s, m, n, param);
  }
}

// f'(s) for one element of kind A (the kind's saved value: input or output).
template <Activation A, typename T>
inline T derivative_one(T s, T param) {
  if constexpr (A == Activation::kIdentity) {
    return T(1);
  } else if constexpr (A == Activation::kGelu || A == Activation::kGeluTanh ||
                       A == Activation::kSilu) {
    return act_grad_from_input<A, T>(s, param);
  } else {
    return act_grad_from_output<A, T>(s, param);
  }
}

// The fast path (operands already in T): one pass per element. Channels-last segment of
// consecutive channels: dz = (t + tb[i]) f'(s), part[i] += dz.
template <Activation A, typename T>
void fast_row(const T* __restrict t, const T* __restrict s, T* __restrict dz,
              const T* __restrict tb, T* __restrict part, int64_t n, T param) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = (t[i] + tb[i]) * derivative_one<A>(s[i], param);
    dz[i] = v;
    part[i] += v;
  }
}

// Channels-first plane of one channel: dz = (t + b) f'(s); returns the sum of dz (16 partial
// sums, so that the loop vectorizes without reassociating a single chain).
template <Activation A, typename T>
T fast_plane(const T* __restrict t, const T* __restrict s, T* __restrict dz, T b, int64_t n,
             T param) {
  constexpr int kL = 16;
  T acc[kL] = {};
  int64_t i = 0;
  for (; i + kL <= n; i += kL)
    for (int l = 0; l < kL; ++l) {
      const T v = (t[i + l] + b) * derivative_one<A>(s[i + l], param);
      dz[i + l] = v;
      acc[l] += v;
    }
  for (; i < n; ++i) {
    const T v = (t[i] + b) * derivative_one<A>(s[i], param);
    dz[i] = v;
    acc[0] += v;
  }
  T sum = T(0);
  for (int l = 0; l < kL; ++l) sum += acc[l];
  return sum;
}

template <typename T>
struct FastFns {
  void (*row)(const T*, const T*, T*, const T*, T*, int64_t, T);
  T (*plane)(const T*, const T*, T*, T, int64_t, T);
};

template <typename T>
FastFns<T> fast_fns(Activation a) {
  switch (a) {
#define JAXDNN_FAST_CASE(A) \
    case A: return {&fast_row<A, T>, &fast_plane<A, T>};
    JAXDNN_FAST_CASE(Activation::kIdentity)
    JAXDNN_FAST_CASE(Activation::kRelu)
    JAXDNN_FAST_CASE(Activation::kLeakyRelu)
    JAXDNN_FAST_CASE(Activation::kClippedRelu)
    JAXDNN_FAST_CASE(Activation::kElu)
    JAXDNN_FAST_CASE(Activation::kSigmoid)
    JAXDNN_FAST_CASE(Activation::kTanh)
    JAXDNN_FAST_CASE(Activation::kGelu)
    JAXDNN_FAST_CASE(Activation::kGeluTanh)
    JAXDNN_FAST_CASE(Activation::kSilu)
#undef JAXDNN_FAST_CASE
  }
  return {&fast_row<Activation::kIdentity, T>, &fast_plane<Activation::kIdentity, T>};
}

template <typename T>
struct Job {
  const BiasActProblem& p;
  const void* t;
  const T* tb;  // widened, or null
  const void* s;
  void* dz;
  T param;

  // Applies fn(j, k, len) to the segments of [0, n) that hold consecutive channels k, k + 1, ...
  // when element 0 has channel k0 and channels wrap at K (channels-last rows).
  template <class Fn>
  static void channel_segments(int64_t n, int64_t k0, int64_t K, const Fn& fn) {
    for (int64_t j = 0, k = k0; j < n; k = 0) {
      const int64_t len = std::min(K - k, n - j);
      fn(j, k, len);
      j += len;
    }
  }

  // Elements [off, off + n), n <= kRun. Channels-last (`rows`): element j has channel
  // (k0 + j) mod K; channels-first: all have channel k0. Adds dz into part[k] when part is set.
  void block(int64_t off, int64_t n, int64_t k0, bool rows, T* part) const {
    alignas(64) T tv[kRun], sv[kRun], mv[kRun];
    const int64_t K = p.K;
    load_as<T>(p.dtype, t, off, 1, n, tv);
    if (tb != nullptr) {
      if (rows) {
        channel_segments(n, k0, K, [&](int64_t j, int64_t k, int64_t len) {
          for (int64_t i = 0; i < len; ++i) tv[j + i] += tb[k + i];
        });
      } else {
        const T b = tb[k0];
        for (int64_t j = 0; j < n; ++j) tv[j] += b;
      }
    }
    if (p.act != Activation::kIdentity) {
      load_as<T>(p.dtype, s, off, 1, n, sv);
      derivative_block<T>(p.act, sv, mv, n, param);
      for (int64_t j = 0; j < n; ++j) tv[j] *= mv[j];
    }
    store_as<T>(p.dtype, dz, off, 1, n, tv);
    if (part == nullptr) return;
    if (rows) {
      channel_segments(n, k0, K, [&](int64_t j, int64_t k, int64_t len) {
        for (int64_t i = 0; i < len; ++i) part[k + i] += tv[j + i];
      });
    } else {
      T acc = T(0);
      for (int64_t j = 0; j < n; ++j) acc += tv[j];
      part[k0] += acc;
    }
  }
};

template <typename T>
void run_typed(const BiasActProblem& p, const void* t, const void* tb, const void* s, void* dz,
               void* db) {
  const int64_t K = p.K;
  std::vector<T> tb_w;
  if (tb != nullptr) {
    tb_w.resize(K);
    load_as<T>(p.dtype, tb, 0, 1, K, tb_w.data());
  }
  const Job<T> job{p, t, tb != nullptr ? tb_w.data() : nullptr, s, dz, static_cast<T>(p.param)};
  // Operands already in T: the one-pass kernels, with a zero bias and a scratch gradient standing
  // in for absent ones.
  const bool fast = p.dtype == (sizeof(T) == 8 ? DType::kF64 : DType::kF32);
  const FastFns<T> fns = fast_fns<T>(p.act);
  if (fast && tb == nullptr) tb_w.assign(K, T(0));
  const T* tb_fast = tb_w.data();
  const T* tf = static_cast<const T*>(t);
  const T* sf = static_cast<const T*>(s);
  T* dzf = static_cast<T*>(dz);
  // Units: channels-last rows of K elements (processed as one contiguous span per chunk), or
  // channels-first planes of `inner` elements.
  const bool rows = p.inner == 1;
  const int64_t units = rows ? p.outer : p.outer * K;
  if (units == 0 || p.inner == 0) {  // no elements: db = 0
    if (db != nullptr) {
      std::vector<T> zero(K, T(0));
      store_as<T>(p.dtype, db, 0, 1, K, zero.data());
    }
    return;
  }
  const int64_t nchunks = std::min(kChunks, units);
  std::vector<T> partial(db != nullptr ? static_cast<size_t>(nchunks * K) : 0, T(0));
  const double work = static_cast<double>(p.outer) * K * p.inner;
  auto chunk_fn = [&](int64_t b, int64_t e) {
    std::vector<T> scratch;
    for (int64_t c = b; c < e; ++c) {
      T* part = db != nullptr ? partial.data() + c * K : nullptr;
      const int64_t u0 = c * units / nchunks, u1 = (c + 1) * units / nchunks;
      if (fast) {
        if (part == nullptr) {
          scratch.assign(rows ? K : 0, T(0));
          part = scratch.data();
        }
        if (rows) {
          for (int64_t u = u0; u < u1; ++u)
            fns.row(tf + u * K, sf + u * K, dzf + u * K, tb_fast, part, K, job.param);
        } else {
          for (int64_t u = u0; u < u1; ++u) {
            const int64_t o = u * p.inner, k = u % K;
            const T sum = fns.plane(tf + o, sf + o, dzf + o, tb_fast[k], p.inner, job.param);
            if (db != nullptr) part[k] += sum;
          }
        }
        continue;
      }
      if (rows) {
        for (int64_t off = u0 * K; off < u1 * K; off += kRun)
          job.block(off, std::min(kRun, u1 * K - off), off % K, true, part);
        continue;
      }
      for (int64_t u = u0; u < u1; ++u)
        for (int64_t off = u * p.inner; off < (u + 1) * p.inner; off += kRun)
          job.block(off, std::min(kRun, (u + 1) * p.inner - off), u % K, false, part);
    }
  };
  if (work < 32768.0 || num_threads() <= 1) {
    chunk_fn(0, nchunks);
  } else {
    parallel_for(nchunks, chunk_fn, 1);
  }
  if (db != nullptr) {
    std::vector<T> sum(partial.begin(), partial.begin() + K);
    for (int64_t c = 1; c < nchunks; ++c)
      for (int64_t k = 0; k < K; ++k) sum[k] += partial[c * K + k];
    store_as<T>(p.dtype, db, 0, 1, K, sum.data());
  }
}

}  // namespace

std::string run_bias_act_backward(const BiasActProblem& p, const void* t, const void* tb,
                                  const void* s, void* dz, void* db) {
  if (p.outer < 0 || p.K < 0 || p.inner < 0) return "negative extent";
  if (static_cast<int>(p.act) < 0 || static_cast<int>(p.act) >= kNumActivations)
    return "unknown activation id";
  if (p.K == 0) return "";
  if (p.dtype == DType::kF64)
    run_typed<double>(p, t, tb, s, dz, db);
  else
    run_typed<float>(p, t, tb, s, dz, db);
  return "";
}

}  // namespace jaxdnn::cpu
