// Decoding of the pooling FFI calls (jaxdnn_max_pool_{fwd,gather,scatter},
// jaxdnn_avg_pool_{fwd,bwd}), shared by the CPU and CUDA handlers so both read the same contract.
//
// Call signature (the same for every operation and platform):
//   operands: 1 (fwd: x; avg bwd: dy) or 2 (gather: x, t; scatter: x, dy), as remaining args
//   results:  the result, plus (scatter only) a u8 workspace sized at trace time
//   attributes (a dictionary): window, stride, dilation, pad_lo, pad_hi, count_lo, count_hi:
//     i64 arrays, one entry per spatial dimension (1 to 3)
// Buffers are channels-last (N, spatial..., C); channels-first arrays arrive folded into N*C
// images of one channel. The output spatial shape is checked against the geometry.
#ifndef JAXDNN_FFI_POOL_H_
#define JAXDNN_FFI_POOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "jaxdnn/conv_problem.h"
#include "jaxdnn/ffi_conv.h"
#include "jaxdnn/pool_problem.h"
#include "xla/ffi/api/ffi.h"

namespace jaxdnn {

// Result of decoding one pooling call.
struct DecodedPool {
  PoolProblem problem;
  DType dtype = DType::kF32;
  const void* a = nullptr;   // first operand
  const void* b = nullptr;   // second operand (t of the gather, dy of the scatter), else null
  void* out = nullptr;       // the result
  void* workspace = nullptr; // the scatter's workspace result, else null
  size_t workspace_bytes = 0;
  // Nothing to compute: both the input and the output are empty.
  bool empty() const { return problem.y_elems() == 0 && problem.x_elems() == 0; }
};

namespace internal {

inline ffi::Error pool_invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument("jaxdnn pooling: " + msg);
}

inline ffi::Error pool_spatial(const ffi::Dictionary& attrs, const char* name, int nsd,
                               int64_t fill, int64_t out[3]) {
  auto span = attrs.get<ffi::Span<const int64_t>>(name);
  if (span.has_error() || static_cast<int>(span->size()) != nsd)
    return pool_invalid(std::string("missing or mistyped attribute '") + name + "'");
  for (int i = 0; i < 3; ++i) out[i] = fill;
  for (int i = 0; i < nsd; ++i) out[3 - nsd + i] = (*span)[i];
  return ffi::Error::Success();
}

// (N, spatial[3], C) of a channels-last buffer with nsd spatial dimensions.
inline bool pool_split(ffi::AnyBuffer::Dimensions d, int nsd, int64_t* n, int64_t sp[3],
                       int64_t* c) {
  if (static_cast<int>(d.size()) != nsd + 2) return false;
  *n = d[0];
  *c = d[nsd + 1];
  for (int i = 0; i < 3; ++i) sp[i] = 1;
  for (int i = 0; i < nsd; ++i) sp[3 - nsd + i] = d[1 + i];
  return true;
}

inline bool same_dims(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b) {
  if (a.dimensions().size() != b.dimensions().size()) return false;
  for (size_t i = 0; i < a.dimensions().size(); ++i)
    if (a.dimensions()[i] != b.dimensions()[i]) return false;
  return true;
}

}  // namespace internal

// Appends what every jaxdnn pooling handler binds after its platform context (if any).
template <typename Binding>
auto bind_pool_call(Binding&& binding) {
  return std::forward<Binding>(binding)
      .RemainingArgs()
      .RemainingRets()
      .template Attrs<ffi::Dictionary>();
}

// Decodes and validates one call. On success fills `dec`.
inline ffi::Error decode_pool_call(PoolOp op, const ffi::RemainingArgs& args,
                                   const ffi::RemainingRets& rets, const ffi::Dictionary& attrs,
                                   DecodedPool* dec) {
  using internal::pool_invalid;
  const bool binary = op == PoolOp::kMaxGather || op == PoolOp::kMaxScatter;
  const size_t want_rets = op == PoolOp::kMaxScatter ? 2 : 1;
  if (args.size() != (binary ? 2u : 1u) || rets.size() != want_rets)
    return pool_invalid("wrong number of operands or results");
  auto a = args.get<ffi::AnyBuffer>(0);
  auto out = rets.get<ffi::AnyBuffer>(0);
  if (a.has_error() || out.has_error()) return pool_invalid("operands must be arrays");
  // The second operand (t of the gather, dy of the scatter); unary operations have none.
  auto second = args.get<ffi::AnyBuffer>(binary ? 1 : 0);
  if (second.has_error()) return pool_invalid("operands must be arrays");
  const ffi::AnyBuffer* b = binary ? &*second : nullptr;

  const int nsd = static_cast<int>(a->dimensions().size()) - 2;
  if (nsd < 1 || nsd > 3) return pool_invalid("operands must have 1 to 3 spatial dimensions");
  PoolProblem& p = dec->problem;
  int64_t pad_hi[3];
  struct SpatialAttr { const char* name; int64_t fill; int64_t* dst; };
  const SpatialAttr spatial_attrs[] = {
      {"window", 1, p.window}, {"stride", 1, p.stride}, {"dilation", 1, p.dilation},
      {"pad_lo", 0, p.pad_lo}, {"pad_hi", 0, pad_hi}, {"count_lo", 0, p.count_lo},
      {"count_hi", 0, p.count_hi}};
  for (const SpatialAttr& s : spatial_attrs) {
    if (auto e = internal::pool_spatial(attrs, s.name, nsd, s.fill, s.dst); !e.success())
      return e;
  }

  // x-shaped and y-shaped buffers by operation.
  const bool forward_shaped = op != PoolOp::kMaxScatter && op != PoolOp::kAvgBackward;
  ffi::AnyBuffer& result = **out;
  const ffi::AnyBuffer& x = op == PoolOp::kAvgBackward ? result : *a;
  const ffi::AnyBuffer& y = forward_shaped ? result : (op == PoolOp::kMaxScatter ? *b : *a);
  int64_t xn, xc, yn, yc, ys[3];
  if (!internal::pool_split(x.dimensions(), nsd, &xn, p.in, &xc) ||
      !internal::pool_split(y.dimensions(), nsd, &yn, ys, &yc))
    return pool_invalid("operand ranks do not match");
  if (op == PoolOp::kMaxGather && !internal::same_dims(*b, x))
    return pool_invalid("the tangent must have the input's shape");
  if (op == PoolOp::kMaxScatter && !internal::same_dims(result, x))
    return pool_invalid("the result must have the input's shape");
  if (xn != yn || xc != yc) return pool_invalid("batch or channel counts do not match");
  p.N = xn;
  p.C = xc;
  for (int d = 0; d < 3; ++d) {
    if (p.window[d] <= 0 || p.stride[d] <= 0 || p.dilation[d] <= 0)
      return pool_invalid("window, strides and dilations must be positive");
    const int64_t span = p.in[d] + p.pad_lo[d] + pad_hi[d] - (p.window[d] - 1) * p.dilation[d];
    p.out[d] = span <= 0 ? 0 : (span - 1) / p.stride[d] + 1;
    if (p.out[d] != ys[d]) return pool_invalid("output spatial shape does not match the geometry");
  }

  if (!to_dtype(a->element_type(), &dec->dtype) || result.element_type() != a->element_type() ||
      (b && b->element_type() != a->element_type()))
    return pool_invalid("operands and result must share one dtype: float32, float64, bfloat16 "
                        "or float16");
  dec->a = a->untyped_data();
  dec->b = b ? b->untyped_data() : nullptr;
  dec->out = result.untyped_data();
  dec->workspace = nullptr;
  dec->workspace_bytes = 0;
  if (want_rets == 2) {
    auto w = rets.get<ffi::AnyBuffer>(1);
    if (w.has_error()) return pool_invalid("missing workspace result");
    dec->workspace = (*w)->untyped_data();
    dec->workspace_bytes = (*w)->size_bytes();
  }
  return ffi::Error::Success();
}

}  // namespace jaxdnn

#endif  // JAXDNN_FFI_POOL_H_
