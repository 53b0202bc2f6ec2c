// CPU backend dispatch: support predicate, workspace sizing, dtype conversion around the kernels.
//
// Kernels compute in float or double. 16-bit operands are widened to float in the workspace
// (exact), and a 16-bit (or otherwise differing) result is accumulated in the compute type and
// rounded once at the end (round-to-nearest-even), so 16-bit types accumulate in float32.
#include <cstdint>
#include <cstring>
#include <string>

#include "conv_cpu.h"
#include "float16.h"
#include "parallel.h"

namespace jaxdnn::cpu {
namespace {

constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

template <typename From, typename To, typename Fn>
void map_range(const void* src, void* dst, int64_t b, int64_t e, Fn fn) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
  for (int64_t i = b; i < e; ++i) d[i] = fn(s[i]);
}

// Converts n elements of dtype `from` at src into T at dst, in parallel.
template <typename T>
void widen(DType from, const void* src, T* dst, int64_t n) {
  parallel_for(n, [&](int64_t b, int64_t e) {
    switch (from) {
      case DType::kF32: map_range<float, T>(src, dst, b, e, [](float v) { return T(v); }); break;
      case DType::kF64: map_range<double, T>(src, dst, b, e, [](double v) { return T(v); }); break;
      case DType::kBF16: map_range<uint16_t, T>(src, dst, b, e, bf16_to_float); break;
      case DType::kF16: map_range<uint16_t, T>(src, dst, b, e, f16_to_float); break;
    }
  }, 1 << 14);
}

// Rounds n elements of T at src into dtype `to` at dst (round to nearest even), in parallel.
template <typename T>
void narrow(const T* src, DType to, void* dst, int64_t n) {
  auto to_float = [](T v) { return static_cast<float>(v); };
  parallel_for(n, [&](int64_t b, int64_t e) {
    switch (to) {
      case DType::kF32: map_range<T, float>(src, dst, b, e, to_float); break;
      case DType::kF64: map_range<T, double>(src, dst, b, e, [](T v) { return double(v); }); break;
      case DType::kBF16:
        map_range<T, uint16_t>(src, dst, b, e, [](T v) { return float_to_bf16(float(v)); });
        break;
      case DType::kF16:
        map_range<T, uint16_t>(src, dst, b, e, [](T v) { return float_to_f16(float(v)); });
        break;
    }
  }, 1 << 14);
}

// Element counts of (a, b, out) for an operation.
void operand_sizes(ConvOp op, const ConvProblem& p, int64_t* a, int64_t* b, int64_t* out) {
  switch (op) {
    case ConvOp::kForward: *a = p.x_elems(); *b = p.w_elems(); *out = p.y_elems(); return;
    case ConvOp::kBackwardData: *a = p.y_elems(); *b = p.w_elems(); *out = p.x_elems(); return;
    case ConvOp::kBackwardFilter: *a = p.x_elems(); *b = p.y_elems(); *out = p.w_elems(); return;
  }
}

DType compute_dtype(DType in, DType out) {
  return (in == DType::kF64 || out == DType::kF64) ? DType::kF64 : DType::kF32;
}

size_t algo_workspace_bytes(ConvOp op, ConvAlgo algo, const ConvProblem& p, size_t elem) {
  switch (algo) {
    case ConvAlgo::kDirect: return direct_workspace_bytes(op, p, elem);
    case ConvAlgo::kGemm: return gemm_workspace_bytes(op, p, elem);
    case ConvAlgo::kImplicitGemm: return implicit_gemm_workspace_bytes(op, p, elem, false);
    case ConvAlgo::kImplicitPrecompGemm: return implicit_gemm_workspace_bytes(op, p, elem, true);
    case ConvAlgo::kWinogradNonfused: return winograd_nonfused_workspace_bytes(op, p, elem);
    case ConvAlgo::kWinograd: return winograd_fused_workspace_bytes(op, p, elem);
    case ConvAlgo::kFft: return fft_workspace_bytes(op, p, elem, false);
    case ConvAlgo::kFftTiling: return fft_workspace_bytes(op, p, elem, true);
  }
  return 0;
}

// Workspace layout: [a widened][b widened][out in compute type][bias widened][algorithm
// workspace]. The bias buffer exists for fused calls whose result type is not the compute type.
struct WorkspacePlan {
  size_t a_bytes = 0, b_bytes = 0, out_bytes = 0, bias_bytes = 0, algo_bytes = 0;
  size_t total() const { return a_bytes + b_bytes + out_bytes + bias_bytes + algo_bytes + kAlign; }
};

WorkspacePlan plan_workspace(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in,
                             DType out, bool epilogue) {
  const DType acc = compute_dtype(in, out);
  const size_t elem = dtype_bytes(acc);
  int64_t na, nb, nout;
  operand_sizes(op, p, &na, &nb, &nout);
  WorkspacePlan plan;
  if (in != acc) {
    plan.a_bytes = align_up(na * elem);
    // The Winograd families' forward and backward-data take U, already in the compute type.
    if (!takes_winograd_filter(op, algo)) plan.b_bytes = align_up(nb * elem);
  }
  if (out != acc) plan.out_bytes = align_up(nout * elem);
  if (epilogue && op == ConvOp::kForward && out != acc) plan.bias_bytes = align_up(p.K * elem);
  plan.algo_bytes = align_up(algo_workspace_bytes(op, algo, p, elem));
  return plan;
}

template <typename T>
void run_typed(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out_dtype,
               const void* a, const void* b, void* out, char* ws, const WorkspacePlan& plan,
               const ConvEpilogue& epi) {
  int64_t na, nb, nout;
  operand_sizes(op, p, &na, &nb, &nout);
  const DType acc = sizeof(T) == 8 ? DType::kF64 : DType::kF32;
  char* cursor = ws;
  const T* a_t = static_cast<const T*>(a);
  const T* b_t = static_cast<const T*>(b);
  T* out_t = static_cast<T*>(out);
  if (in != acc) {
    T* a_w = reinterpret_cast<T*>(cursor);
    widen(in, a, a_w, na);
    a_t = a_w;
    if (!takes_winograd_filter(op, algo)) {  // else b is U, in T already
      T* b_w = reinterpret_cast<T*>(cursor + plan.a_bytes);
      widen(in, b, b_w, nb);
      b_t = b_w;
    }
  }
  cursor += plan.a_bytes + plan.b_bytes;
  if (out_dtype != acc) out_t = reinterpret_cast<T*>(cursor);
  cursor += plan.out_bytes;
  CpuEpilogue<T> cpu_epi;
  if (!epi.empty()) {
    cpu_epi.y0 = out_t;
    if (epi.bias != nullptr) {
      if (out_dtype == acc) {
        cpu_epi.bias = static_cast<const T*>(epi.bias);
      } else {
        T* bias_w = reinterpret_cast<T*>(cursor);
        load_as<T>(out_dtype, epi.bias, 0, 1, p.K, bias_w);
        cpu_epi.bias = bias_w;
      }
    }
    cpu_epi.residual = epi.residual;
    cpu_epi.preact = epi.preact;
    cpu_epi.io_dtype = out_dtype;
    cpu_epi.act = epi.activation;
    cpu_epi.param = static_cast<T>(epi.param);
    cpu_epi.K = p.K;
  }
  cursor += plan.bias_bytes;
  ConvOperands<T> io{a_t, b_t, out_t, cursor, epi.empty() ? nullptr : &cpu_epi};
  switch (algo) {
    case ConvAlgo::kDirect: direct_conv<T>(op, p, io); break;
    case ConvAlgo::kGemm: gemm_conv<T>(op, p, io); break;
    case ConvAlgo::kImplicitGemm: implicit_gemm_conv<T>(op, p, io, false); break;
    case ConvAlgo::kImplicitPrecompGemm: implicit_gemm_conv<T>(op, p, io, true); break;
    case ConvAlgo::kWinogradNonfused: winograd_nonfused_conv<T>(op, p, io); break;
    case ConvAlgo::kWinograd: winograd_fused_conv<T>(op, p, io); break;
    case ConvAlgo::kFft: fft_conv<T>(op, p, io, false); break;
    case ConvAlgo::kFftTiling: fft_conv<T>(op, p, io, true); break;
  }
  if (out_dtype != acc) narrow(out_t, out_dtype, out, nout);
}

}  // namespace

std::string can_implement(ConvOp op, ConvAlgo algo, const ConvProblem& p) {
  if (std::string why = validate_problem(p); !why.empty()) return why;
  if (std::string why = tile_unsupported(algo, p); !why.empty()) return why;
  switch (algo) {
    case ConvAlgo::kDirect:
    case ConvAlgo::kGemm:
    case ConvAlgo::kImplicitGemm:
    case ConvAlgo::kImplicitPrecompGemm:
      return "";
    case ConvAlgo::kWinogradNonfused:
      return winograd_unsupported(p);
    case ConvAlgo::kWinograd:
      return winograd_fused_unsupported(op, p);
    case ConvAlgo::kFft:
    case ConvAlgo::kFftTiling:
      return fft_unsupported(op, algo, p);
  }
  return "unknown algorithm id";
}

std::string can_implement_fused(ConvAlgo algo, const ConvProblem& p) {
  // Each family applies the epilogue where it stores its output (epilogue.h): GEMM and the two
  // implicit GEMMs after the last K block of each macro tile, DIRECT per output row segment,
  // both Winograd families in their output transform, FFT / FFT_TILING as the inverse
  // transform stores each output row (or pixel of a block of channels).
  return can_implement(ConvOp::kForward, algo, p);
}

size_t workspace_bytes(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out,
                       bool epilogue) {
  return plan_workspace(op, algo, p, in, out, epilogue).total();
}

std::string run_conv(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out_dtype,
                     const void* a, const void* b, void* out, void* workspace,
                     size_t workspace_size, const ConvEpilogue& epi) {
  if (std::string why = can_implement(op, algo, p); !why.empty()) return why;
  if (!epi.empty() && op != ConvOp::kForward)
    return "only the forward convolution takes an epilogue";
  const WorkspacePlan plan = plan_workspace(op, algo, p, in, out_dtype, !epi.empty());
  if (workspace_size < plan.total()) return "workspace buffer is too small";
  // Align the workspace start: XLA's buffers are aligned, but do not rely on more than 16 bytes.
  char* ws = static_cast<char*>(workspace);
  ws += (kAlign - reinterpret_cast<uintptr_t>(ws) % kAlign) % kAlign;
  if (compute_dtype(in, out_dtype) == DType::kF64)
    run_typed<double>(op, algo, p, in, out_dtype, a, b, out, ws, plan, epi);
  else
    run_typed<float>(op, algo, p, in, out_dtype, a, b, out, ws, plan, epi);
  return "";
}

}  // namespace jaxdnn::cpu
