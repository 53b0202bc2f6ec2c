// The transformed filter of the Winograd families (WINOGRAD, WINOGRAD_NONFUSED), shared by the
// CPU and CUDA backends and their FFI decoding (ffi_conv.h: the jaxdnn_winograd_filter call).
#ifndef JAXDNN_WINOGRAD_FILTER_H_
#define JAXDNN_WINOGRAD_FILTER_H_

#include "jaxdnn/conv_problem.h"

namespace jaxdnn {

// The Winograd families' forward and backward-data calls take the transformed filter
// U = G w G^T (the output of the jaxdnn_winograd_filter call, ffi_conv.h) as operand b instead
// of w, so that XLA can share one U between convolutions of one filter (CSE) and hoist it out of
// loops. Backward-filter does not use U and takes (x, dy) as every family.
inline bool takes_winograd_filter(ConvOp op, ConvAlgo algo) {
  return (algo == ConvAlgo::kWinograd || algo == ConvAlgo::kWinogradNonfused) &&
         op != ConvOp::kBackwardFilter;
}
// The type U is stored in (the kernels' arithmetic): float64 when either the operands or the
// result are float64, else float32 (16-bit operands are widened).
inline DType winograd_filter_dtype(DType in, DType out) {
  return in == DType::kF64 || out == DType::kF64 ? DType::kF64 : DType::kF32;
}


}  // namespace jaxdnn

#endif  // JAXDNN_WINOGRAD_FILTER_H_
