// CPU backend dispatch: support predicate, workspace sizing, dtype conversion around the kernels.
//
// Kernels compute in float or double. 16-bit operands are widened to float in the workspace
// (exact), and a 16-bit (or otherwise differing) result is accumulated in the compute type and
// rounded once at the end (round-to-nearest-even), so 16-bit types accumulate in float32.
#include <cstdint>
#include <cstring>
#include <string>

#include "conv_cpu.h"
#include "parallel.h"

namespace jaxdnn::cpu {
namespace {

constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;                      // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                     // overflow (rounds to inf)
  if (abs < 0x38800000u) {                                           // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;                              // below half the min subnormal
    const uint32_t exp = abs >> 23, mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;                                // 14..24
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);                    // round to nearest even
  return sign | static_cast<uint16_t>(((r >> 13) - (112u << 10)) & 0xffffu);
}

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
    default: return 0;
  }
}

// Workspace layout: [a widened][b widened][out in compute type][algorithm workspace].
struct WorkspacePlan {
  size_t a_bytes = 0, b_bytes = 0, out_bytes = 0, algo_bytes = 0;
  size_t total() const { return a_bytes + b_bytes + out_bytes + algo_bytes + kAlign; }
};

WorkspacePlan plan_workspace(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in,
                             DType out) {
  const DType acc = compute_dtype(in, out);
  const size_t elem = dtype_bytes(acc);
  int64_t na, nb, nout;
  operand_sizes(op, p, &na, &nb, &nout);
  WorkspacePlan plan;
  if (in != acc) {
    plan.a_bytes = align_up(na * elem);
    plan.b_bytes = align_up(nb * elem);
  }
  if (out != acc) plan.out_bytes = align_up(nout * elem);
  plan.algo_bytes = align_up(algo_workspace_bytes(op, algo, p, elem));
  return plan;
}

template <typename T>
void run_typed(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out_dtype,
               const void* a, const void* b, void* out, char* ws, const WorkspacePlan& plan) {
  int64_t na, nb, nout;
  operand_sizes(op, p, &na, &nb, &nout);
  const DType acc = sizeof(T) == 8 ? DType::kF64 : DType::kF32;
  char* cursor = ws;
  const T* a_t = static_cast<const T*>(a);
  const T* b_t = static_cast<const T*>(b);
  T* out_t = static_cast<T*>(out);
  if (in != acc) {
    T* a_w = reinterpret_cast<T*>(cursor);
    T* b_w = reinterpret_cast<T*>(cursor + plan.a_bytes);
    widen(in, a, a_w, na);
    widen(in, b, b_w, nb);
    a_t = a_w;
    b_t = b_w;
  }
  cursor += plan.a_bytes + plan.b_bytes;
  if (out_dtype != acc) out_t = reinterpret_cast<T*>(cursor);
  cursor += plan.out_bytes;
  ConvOperands<T> io{a_t, b_t, out_t, cursor};
  switch (algo) {
    case ConvAlgo::kDirect: direct_conv<T>(op, p, io); break;
    case ConvAlgo::kGemm: gemm_conv<T>(op, p, io); break;
    case ConvAlgo::kImplicitGemm: implicit_gemm_conv<T>(op, p, io, false); break;
    case ConvAlgo::kImplicitPrecompGemm: implicit_gemm_conv<T>(op, p, io, true); break;
    case ConvAlgo::kWinogradNonfused: winograd_nonfused_conv<T>(op, p, io); break;
    case ConvAlgo::kWinograd: winograd_fused_conv<T>(op, p, io); break;
    default: break;
  }
  if (out_dtype != acc) narrow(out_t, out_dtype, out, nout);
}

}  // namespace

std::string can_implement(ConvOp op, ConvAlgo algo, const ConvProblem& p) {
  if (std::string why = validate_problem(p); !why.empty()) return why;
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
    default:
      return std::string(conv_algo_name(algo)) + " has no CPU kernel yet";
  }
}

size_t workspace_bytes(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out) {
  return plan_workspace(op, algo, p, in, out).total();
}

std::string run_conv(ConvOp op, ConvAlgo algo, const ConvProblem& p, DType in, DType out_dtype,
                     const void* a, const void* b, void* out, void* workspace,
                     size_t workspace_size) {
  if (std::string why = can_implement(op, algo, p); !why.empty()) return why;
  const WorkspacePlan plan = plan_workspace(op, algo, p, in, out_dtype);
  if (workspace_size < plan.total()) return "workspace buffer is too small";
  // Align the workspace start: XLA's buffers are aligned, but do not rely on more than 16 bytes.
  char* ws = static_cast<char*>(workspace);
  ws += (kAlign - reinterpret_cast<uintptr_t>(ws) % kAlign) % kAlign;
  if (compute_dtype(in, out_dtype) == DType::kF64)
    run_typed<double>(op, algo, p, in, out_dtype, a, b, out, ws, plan);
  else
    run_typed<float>(op, algo, p, in, out_dtype, a, b, out, ws, plan);
  return "";
}

}  // namespace jaxdnn::cpu
