// Standalone check of the CUDA activation and softmax kernels (ffi/cuda/pointwise.cu) against a
// float64 host reference (activation.h's host code), then bandwidth timings.
// Usage: check [quick|full] [bench]
//   every activation kind x forward / derivative 1 and 2 from the input and (where allowed) the
//   output x float32/float64/bfloat16/float16 x sizes with vector tails x buffer offsets (all
//   operands at one offset: the aligned-vector path after a scalar head; mixed offsets: the
//   scalar path); guard elements around the output must stay untouched.
//   softmax / log_softmax forward and the three backward operations over [outer, n, inner]
//   shapes reaching the warp-per-row (every kPer), block-per-row and strided-column kernels.
//   bench: effective bandwidth (bytes read + written) of the activations on ResNet-50 N=32 bf16
//   shapes; the bar is 3 TB/s.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "device_math.cuh"
#include "pointwise_cuda.h"

using namespace jaxdnn;

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__);         \
      exit(2);                                                                  \
    }                                                                           \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Host storage of each dtype: bytes, round-trip through the dtype, tolerance.

struct DT {
  DType id;
  const char* name;
  size_t size;
  double tol;
};
const DT kDTypes[] = {{DType::kF32, "f32", 4, 1e-5},
                      {DType::kF64, "f64", 8, 1e-12},
                      {DType::kBF16, "bf16", 2, 2e-2},
                      {DType::kF16, "f16", 2, 5e-3}};

void put(const DT& t, void* base, size_t i, double v) {
  switch (t.id) {
    case DType::kF32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::kF64: static_cast<double*>(base)[i] = v; break;
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16(static_cast<float>(v));
      break;
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half(static_cast<float>(v)); break;
  }
}

double get(const DT& t, const void* base, size_t i) {
  switch (t.id) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF64: return static_cast<const double*>(base)[i];
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
  }
  return 0;
}

double rounded(const DT& t, double v) {
  unsigned char buf[8];
  put(t, buf, 0, v);
  return get(t, buf, 0);
}

// A device buffer of n elements placed `offset` elements past a 256-byte boundary, with kGuard
// sentinel elements on both sides.
constexpr size_t kGuard = 16;
struct DevBuf {
  const DT* t;
  size_t n, offset;
  unsigned char* base = nullptr;
  DevBuf(const DT& dt, size_t n_, size_t off) : t(&dt), n(n_), offset(off) {
    CK(cudaMalloc(&base, (n + 2 * kGuard + off) * dt.size + 256));
  }
  ~DevBuf() { cudaFree(base); }
  void* ptr() const { return base + (kGuard + offset) * t->size; }
  size_t total() const { return n + 2 * kGuard + offset; }
  // Fill the whole allocation (guards included) with host values; `vals` lands at ptr().
  void upload(const std::vector<double>& vals, double sentinel) {
    std::vector<unsigned char> h(total() * t->size);
    for (size_t i = 0; i < total(); ++i) put(*t, h.data(), i, sentinel);
    for (size_t i = 0; i < n; ++i) put(*t, h.data(), kGuard + offset + i, vals[i]);
    CK(cudaMemcpy(base, h.data(), h.size(), cudaMemcpyHostToDevice));
  }
  // Values at ptr(); *guards_ok is false when a guard element changed from `sentinel`.
  std::vector<double> download(double sentinel, bool* guards_ok) const {
    std::vector<unsigned char> h(total() * t->size);
    CK(cudaMemcpy(h.data(), base, h.size(), cudaMemcpyDeviceToHost));
    std::vector<double> out(n);
    *guards_ok = true;
    const double s = rounded(*t, sentinel);
    for (size_t i = 0; i < total(); ++i) {
      const double v = get(*t, h.data(), i);
      const bool inside = i >= kGuard + offset && i < kGuard + offset + n;
      if (inside) out[i - kGuard - offset] = v;
      else if (!(v == s)) *guards_ok = false;
    }
    return out;
  }
};

double rel_error(const std::vector<double>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(ref[i]) != std::isnan(out[i])) return INFINITY;
    if (std::isnan(ref[i])) continue;
    const double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

int failures = 0, checks = 0;

void report(bool ok, const std::string& what, double err, double tol) {
  ++checks;
  if (!ok) {
    ++failures;
    printf("FAIL %s  rel.err %.3e (tol %.1e)\n", what.c_str(), err, tol);
  }
}

// ---------------------------------------------------------------------------------------------
// The kernels' float math (device_math.cuh) elementwise against double precision, on a fine grid
// of [-12, 12], a coarser one of [-100, 100] and the special values:
//   DeviceMath (float results): erfc and expm1, relative error at most 1e-6;
//   DeviceMath16 (16-bit results): exp, expm1, gelu, relative error at most 2e-5, and gelu', whose
//   error is bounded relative to Phi(x) + |x| phi(x) (it crosses zero near x = -0.75).
// Relative errors count where the reference is above 1e-30 in magnitude (erfc: x < 8.1); NaN must
// give NaN, and infinite arguments, zero results and overflows the reference exactly.
enum class MathFn { kErfc, kExpm1, kExp16, kExpm116, kGelu16, kGeluGrad16 };

__global__ void math_kernel(MathFn f, const float* x, float* y, int n) {
  using jaxdnn::cuda::DeviceMath;
  using jaxdnn::cuda::DeviceMath16;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  switch (f) {
    case MathFn::kErfc: y[i] = DeviceMath::erfc(x[i]); break;
    case MathFn::kExpm1: y[i] = DeviceMath::expm1(x[i]); break;
    case MathFn::kExp16: y[i] = DeviceMath16::exp(x[i]); break;
    case MathFn::kExpm116: y[i] = DeviceMath16::expm1(x[i]); break;
    case MathFn::kGelu16: y[i] = DeviceMath16::gelu(x[i]); break;
    case MathFn::kGeluGrad16: y[i] = DeviceMath16::gelu_grad(x[i]); break;
  }
}

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double normal_pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }

void check_device_math() {
  std::vector<float> x;
  for (double v = -12.0; v <= 12.0; v += 1.0 / 4096) x.push_back(static_cast<float>(v));
  for (double v = -100.0; v <= 100.0; v += 1.0 / 64) x.push_back(static_cast<float>(v));
  x.insert(x.end(), {-INFINITY, INFINITY, NAN, 0.0f, -0.0f, 1e-30f, -1e-30f});
  const int n = static_cast<int>(x.size());
  float *dx, *dy;
  CK(cudaMalloc(&dx, n * 4));
  CK(cudaMalloc(&dy, n * 4));
  CK(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice));
  struct Case {
    MathFn f;
    const char* name;
    double (*ref)(double);
    double (*scale)(double);  // the error bound's unit; nullptr: |ref|
    double tol;
  };
  const Case cases[] = {
      {MathFn::kErfc, "DeviceMath::erfc", [](double v) { return std::erfc(v); }, nullptr, 1e-6},
      {MathFn::kExpm1, "DeviceMath::expm1", [](double v) { return std::expm1(v); }, nullptr, 1e-6},
      {MathFn::kExp16, "DeviceMath16::exp", [](double v) { return std::exp(v); }, nullptr, 2e-5},
      {MathFn::kExpm116, "DeviceMath16::expm1", [](double v) { return std::expm1(v); }, nullptr,
       2e-5},
      {MathFn::kGelu16, "DeviceMath16::gelu", [](double v) { return v * normal_cdf(v); }, nullptr,
       2e-5},
      {MathFn::kGeluGrad16, "DeviceMath16::gelu_grad",
       [](double v) { return normal_cdf(v) + v * normal_pdf(v); },
       [](double v) { return normal_cdf(v) + std::fabs(v) * normal_pdf(v); }, 2e-5},
  };
  std::vector<float> y(n);
  for (const Case& c : cases) {
    math_kernel<<<(n + 255) / 256, 256>>>(c.f, dx, dy, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(y.data(), dy, n * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    bool special = true;
    for (int i = 0; i < n; ++i) {
      const double xi = x[i], ref = c.ref(xi);
      if (std::isnan(ref) || std::isnan(y[i])) {
        special &= std::isnan(ref) == std::isnan(y[i]);
      } else if (std::isinf(xi) || ref == 0.0 || std::fabs(ref) > 3.4e38) {
        special &= static_cast<double>(y[i]) == static_cast<double>(static_cast<float>(ref));
      } else {
        const double unit = c.scale ? c.scale(xi) : std::fabs(ref);
        if (unit > 1e-30) worst = std::max(worst, std::fabs(y[i] - ref) / unit);
      }
    }
    report(special && worst <= c.tol,
           std::string(c.name) + " (special values " + (special ? "ok" : "WRONG") + ")", worst,
           c.tol);
    printf("%s worst relative error %.3e over %d points\n", c.name, worst, n);
  }
  CK(cudaFree(dx));
  CK(cudaFree(dy));
}

// ---------------------------------------------------------------------------------------------
// Activations.

const char* kActNames[] = {"identity", "relu", "leaky_relu", "clipped_relu", "elu",
                           "sigmoid", "tanh", "gelu", "gelu_tanh", "silu"};
const double kActParams[] = {0, 0, 0.2, 2.5, 0.7, 0, 0, 0, 0, 0};

double act_ref(Activation a, int derivative, bool from_output, double s, double dy, double p) {
  if (derivative == 0) return activate<double>(a, s, p);
  double g;
  if (derivative == 1)
    g = from_output ? activation_grad_from_output<double>(a, s, p)
                    : activation_grad_from_input<double>(a, s, p);
  else
    g = from_output ? activation_grad2_from_output<double>(a, s, p)
                    : activation_grad2_from_input<double>(a, s, p);
  if (derivative == 1 && (a == Activation::kRelu || a == Activation::kClippedRelu))
    return g != 0 ? dy : 0.0;
  return dy * g;
}

void check_activations(bool full) {
  std::mt19937_64 rng(1);
  std::normal_distribution<double> normal(0.0, 3.0);
  std::vector<size_t> sizes = {1, 5, 8, 13, 1000, 4099};
  if (full) sizes.push_back((1 << 20) + 7);
  const size_t offsets[][3] = {{0, 0, 0}, {1, 1, 1}, {3, 3, 3}, {1, 2, 0}};
  for (const DT& t : kDTypes)
    for (int k = 0; k < kNumActivations; ++k) {
      const Activation a = static_cast<Activation>(k);
      for (int derivative = 0; derivative <= 2; ++derivative)
        for (int fo = 0; fo <= (derivative > 0 ? 1 : 0); ++fo) {
          if (fo && !activation_grad_from_output(a)) continue;
          for (size_t n : sizes)
            for (const auto& off : offsets) {
              if (!full && n > 1000 && off[0] == 3) continue;
              std::vector<double> x(n), s(n), dy(n), ref(n);
              for (size_t i = 0; i < n; ++i) {
                x[i] = rounded(t, normal(rng));
                if (i < 4) x[i] = (i == 0 ? 0.0 : (i == 1 ? kActParams[k] : x[i]));  // kinks
                // from the output, s is f(x) rounded to the dtype, as the forward stores it
                s[i] = fo ? rounded(t, activate<double>(a, x[i], kActParams[k])) : x[i];
                dy[i] = rounded(t, normal(rng));
              }
              for (size_t i = 0; i < n; ++i)
                ref[i] = act_ref(a, derivative, fo, s[i], dy[i], kActParams[k]);
              DevBuf bs(t, n, off[0]), bd(t, n, off[1]), bo(t, n, off[2]);
              bs.upload(s, 0.0);
              bd.upload(dy, 0.0);
              bo.upload(std::vector<double>(n, 0.0), 123.0);
              ActivationCall c;
              c.activation = a;
              c.param = kActParams[k];
              c.from_output = fo;
              c.derivative = derivative;
              c.dtype = t.id;
              c.n = static_cast<int64_t>(n);
              const std::string err = cuda::run_activation(
                  c, bs.ptr(), derivative ? bd.ptr() : nullptr, bo.ptr(), nullptr);
              CK(cudaDeviceSynchronize());
              bool guards = false;
              const std::vector<double> out = bo.download(123.0, &guards);
              const double e = rel_error(out, ref);
              char what[256];
              snprintf(what, sizeof what, "act %s %s d%d%s n=%zu off=%zu/%zu/%zu%s%s", t.name,
                       kActNames[k], derivative, fo ? " from_output" : "", n, off[0], off[1],
                       off[2], err.empty() ? "" : " error: ", err.c_str());
              // 16-bit outputs round each element: allow a little above the input bound
              report(err.empty() && guards && e <= 2 * t.tol, what, e, 2 * t.tol);
              if (!guards) printf("     ^ guard elements overwritten\n");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax.

void softmax_ref(const std::vector<double>& x, std::vector<double>& y, int64_t outer, int64_t n,
                 int64_t inner, bool log) {
  y.assign(x.size(), 0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&](int64_t r) { return (o * n + r) * inner + j; };
      double m = -INFINITY;
      for (int64_t r = 0; r < n; ++r) m = std::max(m, x[at(r)]);
      double s = 0;
      for (int64_t r = 0; r < n; ++r) s += std::exp(x[at(r)] - m);
      for (int64_t r = 0; r < n; ++r)
        y[at(r)] = log ? (x[at(r)] - m) - std::log(s) : std::exp(x[at(r)] - m) / s;
    }
}

void softmax_bwd_ref(const std::vector<double>& y, const std::vector<double>& v,
                     std::vector<double>& out, int64_t outer, int64_t n, int64_t inner,
                     SoftmaxOp op) {
  out.assign(y.size(), 0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&](int64_t r) { return (o * n + r) * inner + j; };
      double s = 0;
      for (int64_t r = 0; r < n; ++r) {
        const double yy = y[at(r)], vv = v[at(r)];
        s += op == SoftmaxOp::kSoftmax ? vv * yy
                                       : (op == SoftmaxOp::kLogSoftmax ? vv : vv * std::exp(yy));
      }
      for (int64_t r = 0; r < n; ++r) {
        const double yy = y[at(r)], vv = v[at(r)];
        out[at(r)] = op == SoftmaxOp::kSoftmax
                         ? yy * (vv - s)
                         : (op == SoftmaxOp::kLogSoftmax ? vv - std::exp(yy) * s : vv - s);
      }
    }
}

void check_softmax(bool full) {
  std::mt19937_64 rng(2);
  std::normal_distribution<double> normal(0.0, 3.0);
  struct Shape { int64_t outer, n, inner; };
  std::vector<Shape> shapes = {{7, 1, 1},   {5, 17, 1},  {3, 32, 1},    {3, 33, 1},
                               {4, 100, 1}, {3, 200, 1}, {2, 400, 1},   {2, 1024, 1},
                               {2, 1025, 1}, {2, 5000, 1}, {3, 7, 5},   {2, 300, 130},
                               {1, 3, 1000}, {1000, 1, 2},
                               // the vector-row kernels (n a multiple of the vector width):
                               // 1 to 32 lanes per row, 1, 2 and 4 vectors per lane, row
                               // counts that leave a warp's last row groups empty
                               {9, 8, 1},   {37, 16, 1}, {37, 64, 1},   {33, 256, 1},
                               {5, 512, 1}, {131, 24, 1}};
  if (full) shapes.push_back({64, 50000, 1});
  for (const DT& t : kDTypes)
    for (const Shape& sh : shapes)
      for (size_t off : {0, 1}) {
        const size_t total = static_cast<size_t>(sh.outer * sh.n * sh.inner);
        std::vector<double> x(total), v(total);
        for (auto& e : x) e = rounded(t, normal(rng));
        for (auto& e : v) e = rounded(t, normal(rng));
        for (int log = 0; log <= 1; ++log) {
          std::vector<double> ref;
          softmax_ref(x, ref, sh.outer, sh.n, sh.inner, log);
          DevBuf bx(t, total, off), bo(t, total, off);
          bx.upload(x, 0.0);
          bo.upload(std::vector<double>(total, 0.0), 123.0);
          SoftmaxCall c;
          c.op = log ? SoftmaxOp::kLogSoftmax : SoftmaxOp::kSoftmax;
          c.backward = false;
          c.dtype = t.id;
          c.outer = sh.outer, c.n = sh.n, c.inner = sh.inner;
          const std::string err = cuda::run_softmax(c, bx.ptr(), nullptr, bo.ptr(), nullptr);
          CK(cudaDeviceSynchronize());
          bool guards = false;
          const auto out = bo.download(123.0, &guards);
          const double e = rel_error(out, ref);
          char what[256];
          snprintf(what, sizeof what, "%s fwd %s [%lld,%lld,%lld] off=%zu %s",
                   log ? "log_softmax" : "softmax", t.name, (long long)sh.outer, (long long)sh.n,
                   (long long)sh.inner, off, err.c_str());
          report(err.empty() && guards && e <= 2 * t.tol, what, e, 2 * t.tol);

          // Backward from the (rounded) output.
          std::vector<double> y(total);
          for (size_t i = 0; i < total; ++i) y[i] = rounded(t, ref[i]);
          const SoftmaxOp ops[2][2] = {{SoftmaxOp::kSoftmax, SoftmaxOp::kSoftmax},
                                       {SoftmaxOp::kLogSoftmax, SoftmaxOp::kLogSoftmaxJvp}};
          for (int which = 0; which < (log ? 2 : 1); ++which) {
            const SoftmaxOp op = ops[log][which];
            std::vector<double> bref;
            softmax_bwd_ref(y, v, bref, sh.outer, sh.n, sh.inner, op);
            DevBuf by(t, total, off), bv(t, total, off ^ 1), bb(t, total, off);
            by.upload(y, 0.0);
            bv.upload(v, 0.0);
            bb.upload(std::vector<double>(total, 0.0), 123.0);
            c.op = op;
            c.backward = true;
            const std::string err2 = cuda::run_softmax(c, by.ptr(), bv.ptr(), bb.ptr(), nullptr);
            CK(cudaDeviceSynchronize());
            const auto bout = bb.download(123.0, &guards);
            const double e2 = rel_error(bout, bref);
            snprintf(what, sizeof what, "softmax bwd op=%d %s [%lld,%lld,%lld] off=%zu %s",
                     static_cast<int>(op), t.name, (long long)sh.outer, (long long)sh.n,
                     (long long)sh.inner, off, err2.c_str());
            report(err2.empty() && guards && e2 <= 4 * t.tol, what, e2, 4 * t.tol);
          }
        }
      }
}

// ---------------------------------------------------------------------------------------------
// Bandwidth.

void bench() {
  struct Shape { const char* name; int64_t n; };
  const Shape shapes[] = {{"32x112x112x64", 32LL * 112 * 112 * 64},
                          {"32x56x56x256", 32LL * 56 * 56 * 256},
                          {"32x56x56x64", 32LL * 56 * 56 * 64},
                          {"32x28x28x512", 32LL * 28 * 28 * 512},
                          {"32x14x14x1024", 32LL * 14 * 14 * 1024},
                          {"32x7x7x2048", 32LL * 7 * 7 * 2048}};
  const DT& t = kDTypes[2];  // bf16
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const Shape& sh : shapes) {
    void *a, *b, *c;
    const size_t bytes = sh.n * t.size;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMalloc(&c, bytes));
    {  // normal values (both signs: elu and gelu take different branches), not constants
      std::mt19937 rng(7);
      std::normal_distribution<float> normal(0.0f, 2.0f);
      std::vector<__nv_bfloat16> h(sh.n);
      for (auto& v : h) v = __float2bfloat16(normal(rng));
      CK(cudaMemcpy(a, h.data(), bytes, cudaMemcpyHostToDevice));
      for (auto& v : h) v = __float2bfloat16(normal(rng));
      CK(cudaMemcpy(b, h.data(), bytes, cudaMemcpyHostToDevice));
    }
    for (int k : {1, 4, 5, 7, 9}) {  // relu, elu, sigmoid, gelu (exact), silu
      for (int derivative = 0; derivative <= 1; ++derivative) {
        ActivationCall call;
        call.activation = static_cast<Activation>(k);
        call.derivative = derivative;
        call.from_output = derivative && activation_grad_from_output(call.activation);
        call.dtype = t.id;
        call.n = sh.n;
        for (int w = 0; w < 3; ++w) cuda::run_activation(call, a, b, c, nullptr);
        const int iters = 20;
        CK(cudaEventRecord(e0));
        for (int it = 0; it < iters; ++it) cuda::run_activation(call, a, b, c, nullptr);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= iters;
        const double moved = (derivative ? 3.0 : 2.0) * bytes;
        printf("BENCH %-14s %-8s %s  %.4f ms  %.2f TB/s\n", sh.name, kActNames[k],
               derivative ? "bwd" : "fwd", ms, moved / (ms * 1e-3) / 1e12);
      }
    }
    // softmax over the channels (rows of C), bf16
    SoftmaxCall sc;
    sc.dtype = t.id;
    sc.inner = 1;
    sc.n = std::strtoll(strrchr(sh.name, 'x') + 1, nullptr, 10);
    sc.outer = sh.n / sc.n;
    for (int backward = 0; backward <= 1; ++backward) {
      sc.backward = backward;
      sc.op = SoftmaxOp::kSoftmax;
      for (int w = 0; w < 3; ++w) cuda::run_softmax(sc, a, b, c, nullptr);
      CK(cudaEventRecord(e0));
      for (int it = 0; it < 20; ++it) cuda::run_softmax(sc, a, b, c, nullptr);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      ms /= 20;
      printf("BENCH %-14s %-8s %s  %.4f ms  %.2f TB/s\n", sh.name, "softmax",
             backward ? "bwd" : "fwd", ms, (backward ? 3.0 : 2.0) * bytes / (ms * 1e-3) / 1e12);
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
  }
}

int main(int argc, char** argv) {
  bool full = false, do_bench = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "full")) full = true;
    if (!strcmp(argv[i], "bench")) do_bench = true;
  }
  check_device_math();
  check_activations(full);
  check_softmax(full);
  printf("%d checks, %d failures\n", checks, failures);
  if (do_bench) bench();
  return failures ? 1 : 0;
}
