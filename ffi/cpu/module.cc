// nanobind module `jaxdnn._jaxdnn_cpu`: FFI handler capsules and the trace-time queries.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "conv_cpu.h"
#include "handlers.h"
#include "jaxdnn/nb_problem.h"
#include "parallel.h"

#ifndef JAXDNN_BUILT_JAXLIB_VERSION
#define JAXDNN_BUILT_JAXLIB_VERSION "unknown"
#endif

namespace nb = nanobind;
using namespace jaxdnn;

NB_MODULE(_jaxdnn_cpu, m) {
  m.def("registrations", [] {
    nb::dict d;
    d["jaxdnn_conv_fwd"] = ffi_capsule(cpu::ConvForward);
    d["jaxdnn_conv_bwd_data"] = ffi_capsule(cpu::ConvBackwardData);
    d["jaxdnn_conv_bwd_filter"] = ffi_capsule(cpu::ConvBackwardFilter);
    d["jaxdnn_conv_fwd_fused"] = ffi_capsule(cpu::ConvForwardFused);
    d["jaxdnn_winograd_filter"] = ffi_capsule(cpu::WinogradFilter);
    d["jaxdnn_bias_act_bwd"] = ffi_capsule(cpu::BiasActBackward);
    d["jaxdnn_max_pool_fwd"] = ffi_capsule(cpu::MaxPoolForward);
    d["jaxdnn_max_pool_gather"] = ffi_capsule(cpu::MaxPoolGather);
    d["jaxdnn_max_pool_scatter"] = ffi_capsule(cpu::MaxPoolScatter);
    d["jaxdnn_avg_pool_fwd"] = ffi_capsule(cpu::AvgPoolForward);
    d["jaxdnn_avg_pool_bwd"] = ffi_capsule(cpu::AvgPoolBackward);
    d["jaxdnn_activation_fwd"] = ffi_capsule(cpu::ActivationForward);
    d["jaxdnn_activation_bwd"] = ffi_capsule(cpu::ActivationBackward);
    d["jaxdnn_activation_mask_fwd"] = ffi_capsule(cpu::ActivationMaskForward);
    d["jaxdnn_activation_mask_bwd"] = ffi_capsule(cpu::ActivationMaskBackward);
    d["jaxdnn_softmax_fwd"] = ffi_capsule(cpu::SoftmaxForward);
    d["jaxdnn_softmax_bwd"] = ffi_capsule(cpu::SoftmaxBackward);
    return d;
  });
  m.def(
      "can_implement",
      [](int op, int algo, nb::dict problem, int in_dtype, int out_dtype, int precision) {
        (void)in_dtype, (void)out_dtype, (void)precision;  // every dtype and precision runs
        return cpu::can_implement(static_cast<ConvOp>(op), static_cast<ConvAlgo>(algo),
                                  problem_from_dict(problem));
      },
      "Empty string when the CPU backend can run (op, algo) on the problem, else the reason.");
  m.def(
      "workspace_bytes",
      [](int op, int algo, nb::dict problem, int in_dtype, int out_dtype, int precision) {
        (void)precision;
        return cpu::workspace_bytes(static_cast<ConvOp>(op), static_cast<ConvAlgo>(algo),
                                    problem_from_dict(problem), static_cast<DType>(in_dtype),
                                    static_cast<DType>(out_dtype));
      });
  // Queries of the fused forward (jaxdnn_conv_fwd_fused): the same arguments as can_implement /
  // workspace_bytes without the operation.
  m.def(
      "can_implement_fused",
      [](int algo, nb::dict problem, int in_dtype, int out_dtype, int precision) {
        (void)in_dtype, (void)out_dtype, (void)precision;
        return cpu::can_implement_fused(static_cast<ConvAlgo>(algo), problem_from_dict(problem));
      },
      "Empty string when the CPU backend can run the fused forward convolution (conv + bias + "
      "residual + activation) with `algo` on the problem, else the reason.");
  m.def("workspace_bytes_fused",
        [](int algo, nb::dict problem, int in_dtype, int out_dtype, int precision) {
          (void)precision;
          return cpu::workspace_bytes(ConvOp::kForward, static_cast<ConvAlgo>(algo),
                                      problem_from_dict(problem), static_cast<DType>(in_dtype),
                                      static_cast<DType>(out_dtype), /*epilogue=*/true);
        });
  m.def(
      "winograd_filter_shape",
      [](int op, int algo, nb::dict problem, int in_dtype, int out_dtype,
         int precision) -> nb::object {
        (void)precision;
        const ConvOp o = static_cast<ConvOp>(op);
        const ConvAlgo a = static_cast<ConvAlgo>(algo);
        const ConvProblem p = problem_from_dict(problem);
        if (!takes_winograd_filter(o, a) || !cpu::can_implement(o, a, p).empty())
          return nb::none();
        int tile;
        int64_t d[4];
        cpu::winograd_filter_shape(o, a, p, static_cast<DType>(in_dtype),
                                   static_cast<DType>(out_dtype), &tile, d);
        return nb::make_tuple(tile, nb::make_tuple(d[0], d[1], d[2], d[3]));
      },
      "(tile, dims of U) of the transformed filter that the Winograd families' forward and "
      "backward-data calls take (jaxdnn_winograd_filter), or None for other (op, algo) pairs.");
  m.def(
      "bias_act_workspace_bytes",
      [](long long, long long, long long, int, bool) -> size_t { return 0; },
      "Workspace bytes of jaxdnn_bias_act_bwd on an (outer, K, inner) view (none on the CPU).");
  m.def(
      "fft_tiles",
      [](int op, int algo, nb::dict problem) {
        int64_t L[3], tiles[3];
        cpu::fft_tiles(static_cast<ConvOp>(op), problem_from_dict(problem),
                       static_cast<ConvAlgo>(algo) == ConvAlgo::kFftTiling, L, tiles);
        return std::make_tuple(std::make_tuple(L[0], L[1], L[2]),
                               std::make_tuple(tiles[0], tiles[1], tiles[2]));
      },
      "((L_D, L_H, L_W), (tiles_D, tiles_H, tiles_W)): the float32 FFT / FFT_TILING kernels' "
      "transform lengths and tile counts per axis for (op, problem).");
  m.def("ffi_api_version", [] { return std::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); });
  m.attr("built_jaxlib_version") = JAXDNN_BUILT_JAXLIB_VERSION;
  m.def("num_threads", &cpu::num_threads);
}
