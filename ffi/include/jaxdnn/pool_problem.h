// Pooling problem descriptor, shared by the handlers and kernels of every backend.
//
// Kernels see one layout: channels-last (N, D, H, W, C), 1-D and 2-D problems padded to 3-D with
// leading unit dimensions. Channels-first arrays (N, C, D, H, W) are the same problem with N*C
// images of one channel, so callers fold them without moving data.
//
// Output position o of dimension d covers input positions o*stride - pad_lo + k*dilation for
// window taps k in [0, window). Taps outside [0, in) are padding: -inf for max (never selected),
// 0 for the sum of avg. The avg divisor of a window counts its taps inside the counting region
// [-count_lo, in + count_hi) of every dimension (the user's padding when count_include_pad, else
// [0, in)); the ceil-mode extension of the high padding is never counted, as in PyTorch.
#ifndef JAXDNN_POOL_PROBLEM_H_
#define JAXDNN_POOL_PROBLEM_H_

#include <cstdint>

namespace jaxdnn {

enum class PoolOp : int32_t {
  kMaxForward = 0,  // x -> y = max over each window
  kMaxGather = 1,   // (x, t) -> t at each window's arg-max of x       (JVP of max pooling)
  kMaxScatter = 2,  // (x, dy) -> dy summed onto the arg-max positions (its transpose)
  kAvgForward = 3,  // x -> y = window sum / divisor
  kAvgBackward = 4, // dy -> dx, the transpose of kAvgForward
};

struct PoolProblem {
  int64_t N = 0, C = 0;
  int64_t in[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  int64_t window[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1};
  int64_t dilation[3] = {1, 1, 1};
  int64_t pad_lo[3] = {0, 0, 0};
  int64_t count_lo[3] = {0, 0, 0};
  int64_t count_hi[3] = {0, 0, 0};

  int64_t x_elems() const { return N * in[0] * in[1] * in[2] * C; }
  int64_t y_elems() const { return N * out[0] * out[1] * out[2] * C; }
  int64_t window_elems() const { return window[0] * window[1] * window[2]; }
};

}  // namespace jaxdnn

#endif  // JAXDNN_POOL_PROBLEM_H_
