"""Every GPU family x operation x dtype on small problems, every pooling kernel, and the
activation and softmax kernels, for compute-sanitizer (gpu-check)."""

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

# Pooling: forward, JVP (arg-max gather), gradient (arg-max scatter) and avg backward, both
# layouts, a global window (split kernels) and one of more than 255 taps (int32 arg-max).
POOL_CASES = [  # (layout, shape, window, strides, padding)
    ("NHWC", (2, 9, 8, 16), (3, 3), (2, 2), ((1, 1), (1, 1))),
    ("NHWC", (2, 7, 6, 3), (2, 3), (1, 2), "SAME"),
    ("NCHW", (2, 3, 9, 8), (3, 3), (2, 2), "SAME"),
    ("NHWC", (2, 7, 7, 64), (7, 7), (1, 1), "VALID"),
    ("NCHW", (2, 8, 7, 7), (7, 7), (1, 1), "VALID"),
    ("NHWC", (1, 17, 17, 8), (16, 16), (1, 1), "VALID"),
]
pooled = 0
for layout, shape, window, strides, padding in POOL_CASES:
  for dtype in (jnp.float32, jnp.bfloat16, jnp.float64):
    x = jnp.asarray(rng.standard_normal(shape), dtype)
    for pool in (jaxdnn.max_pool, jaxdnn.avg_pool):
      f = lambda x: pool(x, window, strides, padding, layout=layout)
      jax.block_until_ready(jax.jit(lambda x: jax.jvp(f, (x,), (x,)))(x))
      jax.block_until_ready(jax.jit(jax.grad(lambda x: jnp.sum(f(x).astype(jnp.float32))))(x))
      pooled += 1
# Activations (forward, first and second derivatives; odd sizes and an offset slice) and softmax
# (warp-per-row, block-per-row and strided kernels, forward and backward).
pointwise = 0
for dtype in (jnp.float32, jnp.bfloat16, jnp.float64):
  x = jnp.asarray(rng.standard_normal((1037,)), dtype)
  for kind in ("relu", "elu", "sigmoid", "gelu", "gelu_tanh", "silu"):
    f = lambda x, kind=kind: jnp.sum(jaxdnn.activation(x, kind).astype(jnp.float32))
    d2 = jax.grad(lambda x, f=f: jnp.sum(jax.grad(f)(x) ** 2))
    jax.block_until_ready(jax.jit(d2)(x[3:]))
    pointwise += 1
  for shape, axis in (((5, 100), -1), ((3, 3000), -1), ((4, 30, 7), 1)):
    y = jnp.asarray(rng.standard_normal(shape), dtype)
    for fn in (jaxdnn.softmax, jaxdnn.log_softmax):
      g = jax.grad(lambda y, fn=fn, axis=axis: jnp.sum(fn(y, axis).astype(jnp.float32) ** 2))
      jax.block_until_ready(jax.jit(g)(y))
      pointwise += 1
print(f"checked {checked} (family, op, dtype, geometry) combinations, {pooled} pooling cases and "
      f"{pointwise} activation/softmax cases")
