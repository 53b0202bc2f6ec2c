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
    d["jaxdnn_max_pool_fwd"] = ffi_capsule(cpu::MaxPoolForward);
    d["jaxdnn_max_pool_gather"] = ffi_capsule(cpu::MaxPoolGather);
    d["jaxdnn_max_pool_scatter"] = ffi_capsule(cpu::MaxPoolScatter);
    d["jaxdnn_avg_pool_fwd"] = ffi_capsule(cpu::AvgPoolForward);
    d["jaxdnn_avg_pool_bwd"] = ffi_capsule(cpu::AvgPoolBackward);
    d["jaxdnn_activation_fwd"] = ffi_capsule(cpu::ActivationForward);
    d["jaxdnn_activation_bwd"] = ffi_capsule(cpu::ActivationBackward);
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
  m.def("ffi_api_version", [] { return std::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); });
  m.attr("built_jaxlib_version") = JAXDNN_BUILT_JAXLIB_VERSION;
  m.def("num_threads", &cpu::num_threads);
}
