// Standalone check of the CUDA bias/activation backward (ffi/cuda/bias_act.cu, through
// bias_act_backward) against a float64 host reference:
//   dz[o, k, i] = (t[o, k, i] + tb[k]) f'(s[o, k, i]),   db[k] = sum over (o, i) of dz[o, k, i]
// for f32, f64, bf16 and f16; every activation kind, s being the output for the kinds whose
// derivative reads it and the input for gelu, gelu_tanh and silu (the contract in ffi_conv.h:
// the kind decides); with and without tb and db; channels-last rows (K a multiple of the 16-byte
// vector and not, one and several channel groups and slices), channels-first planes (inner a
// multiple of the vector and not), t, s and dz misaligned (all three, or s alone: the scalar
// kernels), tiny and empty shapes. dz and db start as NaN with guard bytes around them; the
// workspace, exactly as large as bias_act_workspace_bytes says, starts as garbage (the call must
// zero its arrival counters). Every case with db runs twice, the second time with other garbage
// and, under emulation, the blocks in reverse order: both runs must give the same bits.
//
// Usage: check [smoke|quick|full] [--old] [--only SHAPE_NAME_PART] [bench] [--no-check]
//   --old  checks the kernels from before bias_act.cu (baseline.cuh) instead: a second
//          implementation under the same reference.
//   bench  (GPU only) times bf16 relu with db on ResNet-50 shapes (and a few others), for the
//          kernels of bias_act.cu and the older ones, with several input sets in rotation so that
//          the tensors do not stay in the 50 MB L2.
// JAXDNN_BAB_BLOCKS (read by bias_act.cu) overrides the grid's target block count.
// Compiles with nvcc (a GPU) or, through emulate.sh, with g++ against the emulated runtime in
// emu/. Prints a summary line; exits 1 on any failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "baseline.cuh"
#include "host_fp.h"  // tests/cuda/pool
#include "bias_act_cuda.h"

using namespace jaxdnn;
using cuda::BiasActCall;
using i64 = long long;
using Bytes = std::vector<unsigned char>;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__);   \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Host values of any dtype.

size_t dsize(DType t) { return dtype_bytes(t); }
const char* dname(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBF16: return "bf16";
    default: return "f16";
  }
}

double get(DType t, const Bytes& b, i64 i) {
  switch (t) {
    case DType::kF32: { float v; std::memcpy(&v, &b[i * 4], 4); return v; }
    case DType::kF64: { double v; std::memcpy(&v, &b[i * 8], 8); return v; }
    default: {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      return t == DType::kBF16 ? hostfp::bf16_to_float(h) : hostfp::f16_to_float(h);
    }
  }
}

void put(DType t, Bytes& b, i64 i, double v) {
  switch (t) {
    case DType::kF32: { const float f = static_cast<float>(v); std::memcpy(&b[i * 4], &f, 4); break; }
    case DType::kF64: std::memcpy(&b[i * 8], &v, 8); break;
    default: {
      const float f = static_cast<float>(v);
      const uint16_t h = t == DType::kBF16 ? hostfp::float_to_bf16(f) : hostfp::float_to_f16(f);
      std::memcpy(&b[i * 2], &h, 2);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The reference: activation.h's contract written out again in float64.

const char* kind_name(Activation a) {
  static const char* names[] = {"identity", "relu", "leaky_relu", "clipped_relu", "elu",
                                "sigmoid", "tanh", "gelu", "gelu_tanh", "silu"};
  return names[static_cast<int>(a)];
}
double kind_param(Activation a) {
  switch (a) {
    case Activation::kLeakyRelu: return 0.2;
    case Activation::kClippedRelu: return 3.0;
    case Activation::kElu: return 0.7;
    default: return 0.0;
  }
}
bool takes_output(Activation a) {
  return a != Activation::kGelu && a != Activation::kGeluTanh && a != Activation::kSilu;
}
// The four piecewise-linear kinds: f' is 0, 1 or the parameter, computed exactly.
bool piecewise_linear(Activation a) { return static_cast<int>(a) <= 3; }

constexpr double kGeluC = 0.7978845608028654, kGeluK = 0.044715;

double act_ref(Activation a, double x, double p) {
  switch (a) {
    case Activation::kIdentity: return x;
    case Activation::kRelu: return x > 0 ? x : 0;
    case Activation::kLeakyRelu: return x >= 0 ? x : p * x;
    case Activation::kClippedRelu: return std::min(std::max(x, 0.0), p);
    case Activation::kElu: return x > 0 ? x : p * std::expm1(x);
    case Activation::kSigmoid: return 1 / (1 + std::exp(-x));
    case Activation::kTanh: return std::tanh(x);
    default: return x;  // the input kinds keep z
  }
}

// f'(s) with s the output (takes_output) or the input; kinks as jax.nn (activation.h).
double grad_ref(Activation a, double s, double p) {
  switch (a) {
    case Activation::kIdentity: return 1;
    case Activation::kRelu: return s > 0 ? 1 : 0;
    case Activation::kLeakyRelu: return s >= 0 ? 1 : p;
    case Activation::kClippedRelu: return s > 0 && s < p ? 1 : 0;
    case Activation::kElu: return s > 0 ? 1 : s + p;
    case Activation::kSigmoid: return s * (1 - s);
    case Activation::kTanh: return 1 - s * s;
    case Activation::kGelu:
      return 0.5 * std::erfc(-s / std::sqrt(2.0)) + s * std::exp(-0.5 * s * s) / std::sqrt(2 * M_PI);
    case Activation::kGeluTanh: {
      const double t = std::tanh(kGeluC * (s + kGeluK * s * s * s));
      return 0.5 * (1 + t) + 0.5 * s * (1 - t * t) * kGeluC * (1 + 3 * kGeluK * s * s);
    }
    case Activation::kSilu: {
      const double g = 1 / (1 + std::exp(-s));
      return g * (1 + s * (1 - g));
    }
  }
  return 1;
}

// ---------------------------------------------------------------------------------------------
// Cases.

struct Shape {
  const char* name;
  i64 outer, K, inner;
};

std::vector<Shape> shapes() {
  return {
      // Channels-last (inner 1). Vectors: 8 bf16/f16, 4 f32, 2 f64 channels.
      {"rows-k64", 600, 64, 1},      // one group, several slices
      {"rows-k8", 1500, 8, 1},       // one vector a row (bf16)
      {"rows-k24", 700, 24, 1},      // 3, 6, 12 vectors a row
      {"rows-k72", 300, 72, 1},      // bf16: 9 vectors, a second group of one
      {"rows-k136", 200, 136, 1},    // three groups
      {"rows-k3", 2000, 3, 1},       // scalar kernels only
      {"rows-k100", 400, 100, 1},    // scalar for 16-bit, vectors for f32 and f64
      {"rows-k1", 5000, 1, 1},       // scalar, padded partial rows
      {"rows-k264", 64, 264, 1},     // many groups, few rows
      {"rows-one-row", 1, 40, 1},
      // Channels-first (outer, K, inner).
      {"planes-49", 3, 5, 49},       // scalar: 49 < 256 elements a plane
      {"planes-64", 4, 6, 64},       // vectors, several planes per 256 vectors
      {"planes-304", 2, 3, 304},     // vectors, planes across the 256-vector steps
      {"planes-slices", 40, 2, 520}, // many slices of one channel
      {"planes-k1", 3, 1, 1000},
      {"planes-tiny", 1, 1, 2},
      // Tiny and empty.
      {"one", 1, 1, 1},
      {"empty-outer", 0, 5, 1},
      {"empty-inner", 3, 4, 0},
      {"empty-k", 3, 0, 1},
  };
}

struct Inputs {
  Bytes t, tb, s;
};

Inputs make_inputs(DType dt, const Shape& sh, Activation a, uint64_t seed) {
  const i64 n = sh.outer * sh.K * sh.inner;
  const double p = kind_param(a);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Inputs in{Bytes(n * dsize(dt)), Bytes(sh.K * dsize(dt)), Bytes(n * dsize(dt))};
  for (i64 i = 0; i < n; ++i) {
    put(dt, in.t, i, 2 * u(rng));
    // z in [-4, 4], with exact kinks: 0 (every kind) and the clipped ceiling.
    const uint64_t pick = rng() % 16;
    double z = pick == 0 ? 0.0 : pick == 1 ? p : 4 * u(rng);
    put(dt, in.s, i, z);
    z = get(dt, in.s, i);
    if (takes_output(a)) put(dt, in.s, i, act_ref(a, z, p));
  }
  for (i64 k = 0; k < sh.K; ++k) put(dt, in.tb, k, u(rng));
  return in;
}

// ---------------------------------------------------------------------------------------------
// Device runs.

constexpr size_t kGuard = 64;  // poisoned bytes before and after dz and db

struct DevBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    if (n) CK(cudaMalloc(&ptr, n));
  }
  ~DevBuf() {
    if (ptr) cudaFree(ptr);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  unsigned char* at(size_t off) const { return static_cast<unsigned char*>(ptr) + off; }
};

struct Outputs {
  Bytes dz, db;
  std::string err;
  bool guards_ok = true;
};

// misalign: 0 all 16-byte aligned, 1 t, s and dz one element off, 2 s alone one element off.
Outputs run_device(const BiasActCall& c, bool old, const Inputs& in, bool has_tb, bool has_db,
                   int misalign, unsigned char ws_fill) {
  const size_t sz = dsize(c.dtype), n = static_cast<size_t>(c.outer * c.K * c.inner);
  const size_t bytes = n * sz, db_bytes = static_cast<size_t>(c.K) * sz;
  const size_t off_ts = misalign == 1 ? sz : 0, off_s = misalign ? sz : 0;
  DevBuf t(bytes + kGuard), s(bytes + kGuard), tb(db_bytes), dz(bytes + 2 * kGuard),
      db(db_bytes + 2 * kGuard);
  if (bytes) {
    CK(cudaMemcpy(t.at(off_ts), in.t.data(), bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.at(off_s), in.s.data(), bytes, cudaMemcpyHostToDevice));
  }
  if (db_bytes) CK(cudaMemcpy(tb.ptr, in.tb.data(), db_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemset(dz.ptr, 0xff, dz.bytes));  // NaN in every dtype
  CK(cudaMemset(db.ptr, 0xff, db.bytes));
  const size_t ws_bytes = old ? bab_baseline::baseline_workspace_bytes(c.outer, c.K, c.inner,
                                                                       c.dtype, has_db)
                              : cuda::bias_act_workspace_bytes(c.outer, c.K, c.inner, c.dtype,
                                                               has_db);
  DevBuf ws(ws_bytes);
  if (ws_bytes) CK(cudaMemset(ws.ptr, ws_fill, ws_bytes));
  void* dz_ptr = dz.at(kGuard + off_ts);
  void* db_ptr = has_db ? db.at(kGuard) : nullptr;
  const void* tb_ptr = has_tb ? tb.ptr : nullptr;
  Outputs out;
  out.err = old ? bab_baseline::run(c, t.at(off_ts), tb_ptr, s.at(off_s), dz_ptr, db_ptr, ws.ptr,
                                    ws_bytes, nullptr)
                : cuda::bias_act_backward(c, t.at(off_ts), tb_ptr, s.at(off_s), dz_ptr, db_ptr,
                                          ws.ptr, ws_bytes, nullptr);
  CK(cudaDeviceSynchronize());
  Bytes dz_all(dz.bytes), db_all(db.bytes);
  CK(cudaMemcpy(dz_all.data(), dz.ptr, dz.bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(db_all.data(), db.ptr, db.bytes, cudaMemcpyDeviceToHost));
  const size_t dz0 = kGuard + off_ts;
  out.dz.assign(dz_all.begin() + dz0, dz_all.begin() + dz0 + bytes);
  out.db.assign(db_all.begin() + kGuard, db_all.begin() + kGuard + db_bytes);
  const auto poisoned = [](const Bytes& b, size_t from, size_t to) {
    return std::all_of(b.begin() + from, b.begin() + to, [](unsigned char v) { return v == 0xff; });
  };
  out.guards_ok = poisoned(dz_all, 0, dz0) && poisoned(dz_all, dz0 + bytes, dz_all.size()) &&
                  poisoned(db_all, 0, kGuard) && (has_db || poisoned(db_all, kGuard, db_all.size())) &&
                  poisoned(db_all, kGuard + db_bytes, db_all.size());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Comparison.

struct Tally {
  long compared = 0, failed = 0, runs = 0, printed = 0;
  void fail(const std::string& what) {
    ++failed;
    if (printed++ < 40) std::printf("FAIL %s\n", what.c_str());
  }
};

std::string where(const Shape& sh, DType dt, Activation a, bool tb, bool db, int mis) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%s (%lld,%lld,%lld) %s %s%s%s%s", sh.name, sh.outer, sh.K,
                sh.inner, dname(dt), kind_name(a), tb ? " tb" : "", db ? " db" : "",
                mis == 1 ? " misaligned" : mis == 2 ? " s-misaligned" : "");
  return buf;
}

void check_case(Tally& tl, const Shape& sh, DType dt, Activation a, bool has_tb, bool has_db,
                int mis, bool old, uint64_t seed) {
  const i64 n = sh.outer * sh.K * sh.inner, per_k = sh.outer * sh.inner;
  const double p = kind_param(a);
  const Inputs in = make_inputs(dt, sh, a, seed);
  // Error bounds: the accumulator's roundings of t + tb, of the product and of f'(s) (a few
  // roundings for the piecewise-linear kinds; for the others the derivative's math, whose
  // absolute error grows with |f'| and |s|), then dz's own rounding; db adds the roundings of
  // the sum over its terms.
  const bool f64 = dt == DType::kF64;
  const double eps_acc = f64 ? 0x1p-53 : 0x1p-24;
  const double eps_out = f64 ? 0x1p-53 : dt == DType::kF32 ? 0x1p-24
                         : dt == DType::kBF16 ? 0x1p-8 : 0x1p-11;
  const double abs_out = dt == DType::kF16 ? 0x1p-25 : dt == DType::kBF16 ? 0x1p-134 : 0;
  const double c_acc = piecewise_linear(a) ? 4 : 64;
  std::vector<double> exact(n), acc_err(n);
  std::vector<double> db_exact(sh.K, 0.0), db_err(sh.K, 0.0), db_mag(sh.K, 0.0);
  for (i64 i = 0; i < n; ++i) {
    const i64 k = (i / sh.inner) % sh.K;
    const double tp = get(dt, in.t, i) + (has_tb ? get(dt, in.tb, k) : 0.0);
    const double s = get(dt, in.s, i), g = grad_ref(a, s, p);
    exact[i] = tp * g;
    acc_err[i] = c_acc * eps_acc * std::fabs(tp) * (1 + std::fabs(g) + std::fabs(s));
    db_exact[k] += exact[i];
    db_err[k] += acc_err[i];
    db_mag[k] += std::fabs(exact[i]);
  }
  const BiasActCall call{sh.outer, sh.K, sh.inner, dt, a, p};
  const std::string at = where(sh, dt, a, has_tb, has_db, mis) + (old ? " [old]" : "");
  auto compare = [&](const Outputs& o) {
    if (!o.err.empty()) return tl.fail(at + ": " + o.err);
    if (!o.guards_ok) tl.fail(at + ": wrote outside dz or db");
    for (i64 i = 0; i < n; ++i) {
      ++tl.compared;
      const double got = get(dt, o.dz, i);
      const double bound = acc_err[i] + eps_out * std::fabs(exact[i]) + abs_out;
      if (!(std::fabs(got - exact[i]) <= bound)) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), ": dz[%lld] = %.9g, want %.12g (bound %.3g)", i, got,
                      exact[i], bound);
        tl.fail(at + buf);
      }
    }
    for (i64 k = 0; has_db && k < sh.K; ++k) {
      ++tl.compared;
      const double got = get(dt, o.db, k);
      const double bound = db_err[k] + (per_k + 2) * eps_acc * db_mag[k] +
                           eps_out * std::fabs(db_exact[k]) + abs_out;
      if (!(std::fabs(got - db_exact[k]) <= bound)) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), ": db[%lld] = %.9g, want %.12g (bound %.3g)", k, got,
                      db_exact[k], bound);
        tl.fail(at + buf);
      }
    }
  };
  ++tl.runs;
  const Outputs first = run_device(call, old, in, has_tb, has_db, mis, 0xa5);
  compare(first);
  if (!has_db || n == 0 || !first.err.empty()) return;
  // Determinism: other workspace garbage, and under emulation the blocks in reverse order.
#ifdef JAXDNN_BAB_EMULATION
  emu::block_order = emu::Order::kReverse;
#endif
  ++tl.runs;
  const Outputs second = run_device(call, old, in, has_tb, has_db, mis, 0x5a);
#ifdef JAXDNN_BAB_EMULATION
  emu::block_order = emu::Order::kForward;
#endif
  ++tl.compared;
  if (second.err.empty() && (second.dz != first.dz || second.db != first.db))
    tl.fail(at + ": a second run gave other bits");
}

// The plain API's refusals and the workspace query.
void check_errors(Tally& tl) {
  auto expect = [&](bool ok, const char* what) {
    ++tl.compared;
    if (!ok) tl.fail(what);
  };
  const BiasActCall big{100000, 64, 1, DType::kBF16, Activation::kRelu, 0};
  const size_t need = cuda::bias_act_workspace_bytes(big.outer, big.K, big.inner, big.dtype, true);
  expect(need > 0, "a multi-slice shape needs no workspace");
  expect(cuda::bias_act_workspace_bytes(big.outer, big.K, big.inner, big.dtype, false) == 0,
         "workspace without the bias gradient");
  expect(cuda::bias_act_workspace_bytes(0, 64, 1, big.dtype, true) == 0, "workspace of an empty shape");
  void* fake = reinterpret_cast<void*>(uintptr_t(256));  // never dereferenced: refused first
  std::string e = cuda::bias_act_backward(big, fake, nullptr, fake, fake, fake, fake, need - 1,
                                          nullptr);
  expect(e.find("workspace") != std::string::npos, "a short workspace was accepted");
  e = cuda::bias_act_backward({-1, 4, 1, DType::kF32, Activation::kRelu, 0}, fake, nullptr, fake,
                              fake, nullptr, nullptr, 0, nullptr);
  expect(!e.empty(), "a negative extent was accepted");
  e = cuda::bias_act_backward({4, 4, 1, DType::kF32, static_cast<Activation>(42), 0}, fake,
                              nullptr, fake, fake, nullptr, nullptr, 0, nullptr);
  expect(!e.empty(), "an unknown activation was accepted");
}

// ---------------------------------------------------------------------------------------------
// Timing (GPU only).

#ifndef JAXDNN_BAB_EMULATION
struct BenchCase {
  const char* name;
  i64 outer, K, inner;
  DType dt;
  Activation act;
  bool db;
};

void bench() {
  const BenchCase cases[] = {
      {"r50_c2 32x56x56x64 relu db", 32 * 56 * 56, 64, 1, DType::kBF16, Activation::kRelu, true},
      {"32x56x56x256 relu db", 32 * 56 * 56, 256, 1, DType::kBF16, Activation::kRelu, true},
      {"32x28x28x128 relu db", 32 * 28 * 28, 128, 1, DType::kBF16, Activation::kRelu, true},
      {"32x14x14x256 relu db", 32 * 14 * 14, 256, 1, DType::kBF16, Activation::kRelu, true},
      {"32x7x7x2048 relu db", 32 * 7 * 7, 2048, 1, DType::kBF16, Activation::kRelu, true},
      {"32x56x56x64 relu no db", 32 * 56 * 56, 64, 1, DType::kBF16, Activation::kRelu, false},
      {"32x56x56x64 gelu db", 32 * 56 * 56, 64, 1, DType::kBF16, Activation::kGelu, true},
      {"32x56x56x64 sigmoid db", 32 * 56 * 56, 64, 1, DType::kBF16, Activation::kSigmoid, true},
      {"f32 32x56x56x64 relu db", 32 * 56 * 56, 64, 1, DType::kF32, Activation::kRelu, true},
      {"NCHW 32x64x56x56 relu db", 32, 64, 56 * 56, DType::kBF16, Activation::kRelu, true},
      {"NCHW 32x256x14x14 relu db", 32, 256, 14 * 14, DType::kBF16, Activation::kRelu, true},
      {"NCHW 32x2048x7x7 relu db", 32, 2048, 7 * 7, DType::kBF16, Activation::kRelu, true},
  };
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // Median over 9 trials of 20 launches each, per launch.
  auto time_us = [&](auto&& launch) {
    for (int i = 0; i < 3; ++i) launch(i);
    CK(cudaStreamSynchronize(st));
    std::vector<float> ms;
    for (int trial = 0; trial < 9; ++trial) {
      CK(cudaEventRecord(e0, st));
      for (int i = 0; i < 20; ++i) launch(i);
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float m;
      CK(cudaEventElapsedTime(&m, e0, e1));
      ms.push_back(m / 20);
    }
    std::sort(ms.begin(), ms.end());
    return 1e3 * ms[ms.size() / 2];
  };
  {  // The copy ceiling: 256 MB read + 256 MB written.
    const size_t bytes = size_t(256) << 20;
    DevBuf a(bytes), b(bytes);
    CK(cudaMemset(a.ptr, 1, bytes));
    const double us = time_us([&](int) {
      CK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, st));
    });
    std::printf("BENCH %-30s %9.2f us %6.2f TB/s\n", "cudaMemcpy D2D 256 MB", us,
                2.0 * bytes / us * 1e-6);
  }
  std::printf("BENCH %-30s %9s    %9s  %9s    %9s  %s\n", "case (bytes read + written)", "new",
              "", "old", "", "old/new");
  for (const BenchCase& bc : cases) {
    const size_t n = static_cast<size_t>(bc.outer * bc.K * bc.inner), sz = dsize(bc.dt);
    const size_t tensor = n * sz, db_bytes = bc.db ? bc.K * sz : 0;
    const double moved = 3.0 * tensor + db_bytes;  // t, s read; dz (and db) written
    // Enough input sets in rotation that one launch's tensors are out of L2 at its next use.
    const int sets = static_cast<int>(std::max<size_t>(3, (size_t(200) << 20) / (3 * tensor) + 1));
    // One input set uploaded to every buffer: the addresses, not the values, defeat the cache.
    const Inputs in = make_inputs(bc.dt, {"", static_cast<i64>(n), 1, 1}, bc.act, 100);
    std::vector<std::unique_ptr<DevBuf>> t, s, dz;
    for (int k = 0; k < sets; ++k) {
      t.push_back(std::make_unique<DevBuf>(tensor));
      s.push_back(std::make_unique<DevBuf>(tensor));
      dz.push_back(std::make_unique<DevBuf>(tensor));
      CK(cudaMemcpy(t[k]->ptr, in.t.data(), tensor, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(s[k]->ptr, in.s.data(), tensor, cudaMemcpyHostToDevice));
    }
    DevBuf db(bc.K * sz);
    const BiasActCall call{bc.outer, bc.K, bc.inner, bc.dt, bc.act, kind_param(bc.act)};
    double us[2];
    for (int old = 0; old < 2; ++old) {
      const size_t wsb = old ? bab_baseline::baseline_workspace_bytes(bc.outer, bc.K, bc.inner,
                                                                      bc.dt, bc.db)
                             : cuda::bias_act_workspace_bytes(bc.outer, bc.K, bc.inner, bc.dt,
                                                              bc.db);
      DevBuf ws(wsb);
      us[old] = time_us([&](int i) {
        const int k = i % sets;
        void* dbp = bc.db ? db.ptr : nullptr;
        const std::string e =
            old ? bab_baseline::run(call, t[k]->ptr, nullptr, s[k]->ptr, dz[k]->ptr, dbp, ws.ptr,
                                    wsb, st)
                : cuda::bias_act_backward(call, t[k]->ptr, nullptr, s[k]->ptr, dz[k]->ptr, dbp,
                                          ws.ptr, wsb, st);
        if (!e.empty()) {
          std::printf("bench error: %s\n", e.c_str());
          std::exit(2);
        }
      });
    }
    std::printf("BENCH %-30s %9.2f us %5.2f TB/s %9.2f us %5.2f TB/s  %.2fx\n", bc.name, us[0],
                moved / us[0] * 1e-6, us[1], moved / us[1] * 1e-6, us[1] / us[0]);
  }
  cudaStreamDestroy(st);
}
#endif

// ---------------------------------------------------------------------------------------------

enum class Level { kSmoke, kQuick, kFull };

// Which (kind, (tb, db) flags, misalignment) runs for shape si and dtype di. full: every flag
// pair aligned, tb and db misaligned both ways. quick: one flag pair per kind, rotating, and
// misaligned relu (both ways) and silu. smoke (for the sanitizers): one dtype per shape; relu
// with tb and db, aligned and misaligned; silu with tb and db; leaky_relu without either.
bool selected(Level level, size_t si, int di, Activation a, int flags, int mis) {
  const int ai = static_cast<int>(a);
  const bool both = flags == 3, relu = a == Activation::kRelu, silu = a == Activation::kSilu;
  switch (level) {
    case Level::kFull: return mis == 0 || both;
    case Level::kQuick:
      return (mis == 0 && flags == static_cast<int>((ai + si + di) % 4)) ||
             (mis > 0 && both && (relu || (mis == 1 && silu)));
    case Level::kSmoke:
      return static_cast<size_t>(di) == si % 4 && mis < 2 &&
             ((relu && both) || (silu && both && mis == 0) ||
              (a == Activation::kLeakyRelu && flags == 0 && mis == 0));
  }
  return false;
}

int main(int argc, char** argv) {
  Level level = Level::kQuick;
  bool old = false, do_bench = false, do_check = true;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "full") level = Level::kFull;
    else if (a == "quick") level = Level::kQuick;
    else if (a == "smoke") level = Level::kSmoke;
    else if (a == "--old") old = true;
    else if (a == "bench") do_bench = true;
    else if (a == "--no-check") do_check = false;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else { std::printf("unknown argument %s\n", a.c_str()); return 2; }
  }
  Tally tl;
  if (do_check && !old) check_errors(tl);
  const DType dtypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};
  const auto all = shapes();
  uint64_t seed = 1;
  int cases = 0;
  for (size_t si = 0; do_check && si < all.size(); ++si) {
    if (!only.empty() && std::string(all[si].name).find(only) == std::string::npos) continue;
    for (int di = 0; di < 4; ++di)
      for (int ai = 0; ai < kNumActivations; ++ai)
        for (int flags = 0; flags < 4; ++flags)
          for (int mis = 0; mis < 3; ++mis) {
            const Activation a = static_cast<Activation>(ai);
            if (!selected(level, si, di, a, flags, mis)) continue;
            ++cases;
            check_case(tl, all[si], dtypes[di], a, flags & 1, flags & 2, mis, old, seed++);
          }
  }
  const char* blocks = std::getenv("JAXDNN_BAB_BLOCKS");
  std::printf("bab check (%s%s, JAXDNN_BAB_BLOCKS=%s): %d cases, %ld runs, %ld comparisons, %ld "
              "failures\n",
              level == Level::kFull ? "full" : level == Level::kQuick ? "quick" : "smoke",
              old ? ", old kernels" : "", blocks ? blocks : "unset", cases,
              tl.runs, tl.compared, tl.failed);
#ifndef JAXDNN_BAB_EMULATION
  if (do_bench) bench();
#else
  (void)do_bench;
#endif
  return tl.failed ? 1 : 0;
}
