"""Every GPU family x operation x dtype on small problems, for compute-sanitizer (gpu-check)."""

import jax
import jax.numpy as jnp
import numpy as np

import jaxdnn
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvGeometry, ConvOp, Layout

jax.config.update("jax_enable_x64", True)
rng = np.random.default_rng(0)
# (layout, N, C, K, spatial, filter, stride, dilation, pad, groups)
CASES = [
    (Layout.NHWC, 2, 8, 16, (9, 7), (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (Layout.NHWC, 1, 3, 5, (11, 10), (5, 3), (2, 2), (1, 2), (2, 0), 1),
    (Layout.NHWC, 2, 16, 16, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), 16),
    (Layout.NHWC, 2, 16, 32, (7, 9), (3, 3), (2, 1), (1, 1), (1, 1), 4),
    (Layout.NCHW, 2, 6, 4, (7, 6), (3, 2), (1, 2), (2, 1), (2, 1), 2),
    (Layout.NHWC, 1, 4, 4, (5, 5, 5), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
]
checked = 0
for layout, n, c, k, sp, filt, stride, dil, pad, groups in CASES:
  g = ConvGeometry(layout, sp, filt, stride, dil, (1,) * len(sp), pad, pad, groups)
  for dtype in (jnp.float32, jnp.bfloat16, jnp.float64):
    x = jnp.asarray(rng.standard_normal(g.x_shape(n, c)), dtype)
    w = jnp.asarray(rng.standard_normal(g.w_shape(c // groups, k)), dtype)
    dy = jnp.asarray(rng.standard_normal(g.y_shape(n, k)), dtype)
    for algo in jaxdnn.ConvAlgo:
      for op, fn, a, b in ((ConvOp.FORWARD, jaxdnn.conv_forward, x, w),
                           (ConvOp.BACKWARD_DATA, jaxdnn.conv_backward_data, dy, w),
                           (ConvOp.BACKWARD_FILTER, jaxdnn.conv_backward_filter, x, dy)):
        if algorithms.unsupported_reason("cuda", op, algo, g, n, c, k, dtype, dtype,
                                         algorithms.MathPrecision.DEFAULT):
          continue
        jax.block_until_ready(jax.jit(lambda a, b: fn(a, b, g, algo))(a, b))
        checked += 1
print(f"checked {checked} (family, op, dtype, geometry) combinations")
