// Python-side queries (support predicate, workspace size) take the problem as a dict with the
// keys below, built by jaxdnn/_src/geometry.py. Shared by the CPU and CUDA nanobind modules.
//   layout, spatial_dims, N, C, K, G: int
//   in, filt, stride, dilation, lhs_dilation, pad_lo, pad_hi: sequences of 3 ints (D, H, W)
//   tile (optional, default 0): ConvProblem::tile, WINOGRAD_NONFUSED's explicit output tile
#ifndef JAXDNN_NB_PROBLEM_H_
#define JAXDNN_NB_PROBLEM_H_

#include <nanobind/nanobind.h>

#include <cstdint>

#include "jaxdnn/conv_problem.h"

namespace jaxdnn {

namespace nb = nanobind;

inline void read_triple(const nb::dict& d, const char* key, int64_t out[3]) {
  nb::sequence s = nb::cast<nb::sequence>(d[key]);
  if (nb::len(s) != 3) throw nb::value_error((std::string(key) + " must have 3 entries").c_str());
  for (size_t i = 0; i < 3; ++i) out[i] = nb::cast<int64_t>(s[i]);
}

inline ConvProblem problem_from_dict(const nb::dict& d) {
  ConvProblem p;
  p.layout = static_cast<Layout>(nb::cast<int32_t>(d["layout"]));
  p.spatial_dims = nb::cast<int>(d["spatial_dims"]);
  p.N = nb::cast<int64_t>(d["N"]);
  p.C = nb::cast<int64_t>(d["C"]);
  p.K = nb::cast<int64_t>(d["K"]);
  p.G = nb::cast<int64_t>(d["G"]);
  read_triple(d, "in", p.in);
  read_triple(d, "filt", p.filt);
  read_triple(d, "stride", p.stride);
  read_triple(d, "dilation", p.dilation);
  read_triple(d, "lhs_dilation", p.lhs_dilation);
  read_triple(d, "pad_lo", p.pad_lo);
  read_triple(d, "pad_hi", p.pad_hi);
  if (d.contains("tile")) p.tile = nb::cast<int>(d["tile"]);
  for (int i = 0; i < 3; ++i)
    p.out[i] = conv_output_size(p.in[i], p.filt[i], p.stride[i], p.dilation[i],
                                p.lhs_dilation[i], p.pad_lo[i], p.pad_hi[i]);
  std::string why = validate_problem(p);
  if (!why.empty()) throw nb::value_error(why.c_str());
  return p;
}

template <typename Fn>
nb::capsule ffi_capsule(Fn* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, Fn, XLA_FFI_CallFrame*>,
                "Encapsulated function must be an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace jaxdnn

#endif  // JAXDNN_NB_PROBLEM_H_
