// nanobind module `jaxdnn._jaxdnn_cuda`: FFI handler capsules and the trace-time queries.
// Compiled by the host C++ compiler; links cudart.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>

#include "bias_act_cuda.h"
#include "conv_cuda.h"
#include "handlers.h"
#include "jaxdnn/nb_problem.h"

#ifndef JAXDNN_BUILT_JAXLIB_VERSION
#define JAXDNN_BUILT_JAXLIB_VERSION "unknown"
#endif

namespace nb = nanobind;
using namespace jaxdnn;

namespace {

// Range checks of the integer enums before they are cast; "" when all are valid.
std::string check_enums(int op, int algo, int in_dtype, int out_dtype, int precision) {
  if (op < 0 || op > 2) return "unknown convolution operation " + std::to_string(op);
  if (algo < 0 || algo >= kNumConvAlgos) return "unknown algorithm id " + std::to_string(algo);
  if (in_dtype < 0 || in_dtype > 3 || out_dtype < 0 || out_dtype > 3) return "unknown dtype";
  if (precision < 0 || precision > 2) return "unknown precision " + std::to_string(precision);
  return "";
}

cuda::CudaConvCall make_call(int op, int algo, const ConvProblem& p, int in_dtype, int out_dtype,
                             int precision) {
  return cuda::CudaConvCall{static_cast<ConvOp>(op), static_cast<ConvAlgo>(algo), p,
                            static_cast<DType>(in_dtype), static_cast<DType>(out_dtype),
                            static_cast<MathPrecision>(precision)};
}

}  // namespace

NB_MODULE(_jaxdnn_cuda, m) {
  m.def("registrations", [] {
    nb::dict d;
    d["jaxdnn_conv_fwd"] = ffi_capsule(cuda::ConvForward);
    d["jaxdnn_conv_bwd_data"] = ffi_capsule(cuda::ConvBackwardData);
    d["jaxdnn_conv_bwd_filter"] = ffi_capsule(cuda::ConvBackwardFilter);
    d["jaxdnn_conv_fwd_fused"] = ffi_capsule(cuda::ConvForwardFused);
    d["jaxdnn_winograd_filter"] = ffi_capsule(cuda::WinogradFilter);
    d["jaxdnn_bias_act_bwd"] = ffi_capsule(cuda::BiasActBackward);
    d["jaxdnn_max_pool_fwd"] = ffi_capsule(cuda::MaxPoolForward);
    d["jaxdnn_max_pool_gather"] = ffi_capsule(cuda::MaxPoolGather);
    d["jaxdnn_max_pool_scatter"] = ffi_capsule(cuda::MaxPoolScatter);
    d["jaxdnn_avg_pool_fwd"] = ffi_capsule(cuda::AvgPoolForward);
    d["jaxdnn_avg_pool_bwd"] = ffi_capsule(cuda::AvgPoolBackward);
    d["jaxdnn_activation_fwd"] = ffi_capsule(cuda::ActivationForward);
    d["jaxdnn_activation_bwd"] = ffi_capsule(cuda::ActivationBackward);
    d["jaxdnn_activation_mask_fwd"] = ffi_capsule(cuda::ActivationMaskForward);
    d["jaxdnn_activation_mask_bwd"] = ffi_capsule(cuda::ActivationMaskBackward);
    d["jaxdnn_softmax_fwd"] = ffi_capsule(cuda::SoftmaxForward);
    d["jaxdnn_softmax_bwd"] = ffi_capsule(cuda::SoftmaxBackward);
    return d;
  });
  m.def(
      "can_implement",
      [](int op, int algo, nb::dict problem, int in_dtype, int out_dtype,
         int precision) -> std::string {
        if (std::string why = check_enums(op, algo, in_dtype, out_dtype, precision); !why.empty())
          return why;
        return cuda::can_implement(
            make_call(op, algo, problem_from_dict(problem), in_dtype, out_dtype, precision));
      },
      "Empty string when the CUDA backend can run (op, algo) on the problem with these dtypes and "
      "precision, else the reason.");
  m.def(
      "workspace_bytes",
      [](int op, int algo, nb::dict problem, int in_dtype, int out_dtype,
         int precision) -> size_t {
        if (!check_enums(op, algo, in_dtype, out_dtype, precision).empty()) return 0;
        return cuda::workspace_bytes(
            make_call(op, algo, problem_from_dict(problem), in_dtype, out_dtype, precision));
      },
      "Workspace bytes the CUDA backend needs for (op, algo) on the problem (0 if unsupported).");
  // Queries of the fused forward (jaxdnn_conv_fwd_fused): can_implement's and workspace_bytes's
  // arguments without the operation.
  m.def(
      "can_implement_fused",
      [](int algo, nb::dict problem, int in_dtype, int out_dtype, int precision) -> std::string {
        if (std::string why = check_enums(0, algo, in_dtype, out_dtype, precision); !why.empty())
          return why;
        return cuda::can_implement_fused(
            make_call(0, algo, problem_from_dict(problem), in_dtype, out_dtype, precision));
      },
      "Empty string when the CUDA backend can run the fused forward convolution (conv + bias + "
      "residual + activation) with `algo` on the problem, else the reason.");
  m.def(
      "workspace_bytes_fused",
      [](int algo, nb::dict problem, int in_dtype, int out_dtype, int precision) -> size_t {
        if (!check_enums(0, algo, in_dtype, out_dtype, precision).empty()) return 0;
        const cuda::CudaConvCall c =
            make_call(0, algo, problem_from_dict(problem), in_dtype, out_dtype, precision);
        return cuda::can_implement_fused(c).empty() ? cuda::workspace_bytes(c) : 0;
      });
  m.def(
      "winograd_filter_shape",
      [](int op, int algo, nb::dict problem, int in_dtype, int out_dtype,
         int precision) -> nb::object {
        if (!check_enums(op, algo, in_dtype, out_dtype, precision).empty()) return nb::none();
        const cuda::CudaConvCall c =
            make_call(op, algo, problem_from_dict(problem), in_dtype, out_dtype, precision);
        if (!takes_winograd_filter(c.op, c.algo) || !cuda::can_implement(c).empty())
          return nb::none();
        int tile;
        int64_t d[4];
        cuda::winograd_filter_shape(c, &tile, d);
        return nb::make_tuple(tile, nb::make_tuple(d[0], d[1], d[2], d[3]));
      },
      "(tile, dims of U) of the transformed filter that the Winograd families' forward and "
      "backward-data calls take (jaxdnn_winograd_filter), or None for other (op, algo) pairs.");
  m.def(
      "bias_act_workspace_bytes",
      [](long long outer, long long k, long long inner, int dtype, bool reduce) -> size_t {
        if (dtype < 0 || dtype > 3) return 0;
        return cuda::bias_act_workspace_bytes(outer, k, inner, static_cast<DType>(dtype), reduce);
      },
      "Workspace bytes of jaxdnn_bias_act_bwd on an (outer, K, inner) view.");
  m.def("ffi_api_version", [] { return std::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); });
  m.attr("built_jaxlib_version") = JAXDNN_BUILT_JAXLIB_VERSION;
  m.def(
      "device_count",
      []() -> int {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
          cudaGetLastError();  // clear the error state
          return 0;
        }
        return n;
      },
      "Number of visible CUDA devices (0 when there is no usable driver or device).");
}
