// Dispatch of the CUDA convolution families (conv_cuda.h).
#include "conv_cuda.h"

#include <string>

namespace jaxdnn::cuda {
namespace {

bool is16(DType t) { return t == DType::kBF16 || t == DType::kF16; }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
  }
  return "unknown";
}

// Whether the result sums over nothing: an operand of the reduction is empty while the result
// is not (e.g. an empty input axis whose padding spans windows, lax's rule). DIRECT and the GEMM
// family handle it themselves (zeros, or the fused epilogue over zeros); the transform families
// (which carry no epilogue) get zeros here instead of transforms of empty signals.
bool empty_reduction(const CudaConvCall& c) {
  const ConvProblem& p = c.problem;
  switch (c.op) {
    case ConvOp::kForward: return p.x_elems() == 0 || p.w_elems() == 0;
    case ConvOp::kBackwardData: return p.y_elems() == 0 || p.w_elems() == 0;
    case ConvOp::kBackwardFilter: return p.x_elems() == 0 || p.y_elems() == 0;
  }
  return false;
}

std::string zero_result(const CudaConvCall& c, const CudaConvBuffers& io) {
  const ConvProblem& p = c.problem;
  const int64_t n = c.op == ConvOp::kForward        ? p.y_elems()
                    : c.op == ConvOp::kBackwardData ? p.x_elems()
                                                    : p.w_elems();
  if (n == 0) return "";
  const cudaError_t e = cudaMemsetAsync(io.out, 0, static_cast<size_t>(n) * dtype_bytes(c.out),
                                        io.stream);
  return e == cudaSuccess ? "" : std::string("cudaMemsetAsync: ") + cudaGetErrorString(e);
}

// Checks that do not depend on the family.
std::string common_checks(const CudaConvCall& c) {
  const int op = static_cast<int>(c.op);
  if (op < 0 || op > 2) return "unknown convolution operation";
  const int algo = static_cast<int>(c.algo);
  if (algo < 0 || algo >= kNumConvAlgos) return "unknown algorithm id";
  const int in = static_cast<int>(c.in), out = static_cast<int>(c.out);
  if (in < 0 || in > 3 || out < 0 || out > 3) return "unknown dtype";
  const int prec = static_cast<int>(c.precision);
  if (prec < 0 || prec > 2) return "unknown precision";
  if (!(c.in == c.out || (is16(c.in) && c.out == DType::kF32)))
    return std::string("unsupported dtype combination: ") + dtype_name(c.in) + " operands with " +
           dtype_name(c.out) + " result (the result must have the operands' dtype, or be "
           "float32 for bfloat16/float16 operands)";
  if (std::string why = validate_problem(c.problem); !why.empty()) return why;
  if (std::string why = tile_unsupported(c.algo, c.problem); !why.empty()) return why;
  return "";
}

}  // namespace

std::string can_implement(const CudaConvCall& c) {
  if (std::string why = common_checks(c); !why.empty()) return why;
  switch (c.algo) {
    case ConvAlgo::kDirect:
      return direct_can_implement(c);
    case ConvAlgo::kImplicitGemm:
    case ConvAlgo::kImplicitPrecompGemm:
    case ConvAlgo::kGemm:
      return gemm_family_can_implement(c);
    case ConvAlgo::kWinograd:
    case ConvAlgo::kWinogradNonfused:
      return winograd_can_implement(c);
    case ConvAlgo::kFft:
    case ConvAlgo::kFftTiling:
      return fft_can_implement(c);
  }
  return "unknown algorithm id";
}

size_t workspace_bytes(const CudaConvCall& c) {
  if (!can_implement(c).empty()) return 0;
  switch (c.algo) {
    case ConvAlgo::kDirect:
      return direct_workspace_bytes(c);
    case ConvAlgo::kImplicitGemm:
    case ConvAlgo::kImplicitPrecompGemm:
    case ConvAlgo::kGemm:
      return gemm_family_workspace_bytes(c);
    case ConvAlgo::kWinograd:
    case ConvAlgo::kWinogradNonfused:
      return winograd_workspace_bytes(c);
    case ConvAlgo::kFft:
    case ConvAlgo::kFftTiling:
      return fft_workspace_bytes(c);
  }
  return 0;
}

std::string run_conv(const CudaConvCall& c, const CudaConvBuffers& io) {
  if (std::string why = can_implement(c); !why.empty()) return why;
  const size_t need = workspace_bytes(c);
  if (io.workspace_size < need || (need > 0 && io.workspace == nullptr))
    return "workspace buffer is too small (" + std::to_string(io.workspace_size) + " < " +
           std::to_string(need) + " bytes)";
  switch (c.algo) {
    case ConvAlgo::kDirect:
      return direct_run(c, io);
    case ConvAlgo::kImplicitGemm:
    case ConvAlgo::kImplicitPrecompGemm:
    case ConvAlgo::kGemm:
      return gemm_family_run(c, io);
    case ConvAlgo::kWinograd:
    case ConvAlgo::kWinogradNonfused:
      if (empty_reduction(c)) return zero_result(c, io);
      return winograd_run(c, io);
    case ConvAlgo::kFft:
    case ConvAlgo::kFftTiling:
      if (empty_reduction(c)) return zero_result(c, io);
      return fft_run(c, io);
  }
  return "unknown algorithm id";
}

}  // namespace jaxdnn::cuda
