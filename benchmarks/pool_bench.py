"""jaxdnn pooling against XLA:CPU (lax.reduce_window, flax.linen) on ResNet-like shapes.

K independent applications (distinct random inputs) inside one jitted function that returns all
outputs; median over repeats of the call time, divided by K (jaxdnn.bench.time_call). "bwd" is
the VJP alone (the unused forward is dead code for both). GB/s counts bytes read plus written.

    python benchmarks/pool_bench.py [--k 4] [--repeats 20] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxdnn
from jaxdnn.bench import time_call

# name, input shape, layout, kind, window, strides, padding
CASES = [
    ("maxpool3x3s2 stem", (8, 112, 112, 64), "NHWC", "max", (3, 3), (2, 2), "SAME"),
    ("maxpool3x3s2 stem NCHW", (8, 64, 112, 112), "NCHW", "max", (3, 3), (2, 2), "SAME"),
    ("avgpool2x2s2", (8, 56, 56, 256), "NHWC", "avg", (2, 2), (2, 2), "VALID"),
    ("avgpool3x3s1 SAME excl", (8, 28, 28, 256), "NHWC", "avg_excl", (3, 3), (1, 1), "SAME"),
    ("global avg 7x7x2048", (8, 7, 7, 2048), "NHWC", "global_avg", None, None, None),
]


def _jaxdnn_fn(kind, layout, window, strides, padding):
  if kind == "max":
    return lambda x: jaxdnn.max_pool(x, window, strides, padding, layout=layout)
  if kind in ("avg", "avg_excl"):
    return lambda x: jaxdnn.avg_pool(x, window, strides, padding, kind == "avg", layout=layout)
  return lambda x: jaxdnn.global_avg_pool(x, layout=layout)


def _xla_fn(kind, layout, window, strides, padding):
  fn = _xla_fn_any_dtype(kind, layout, window, strides, padding)
  return lambda x: fn(x).astype(x.dtype)  # flax's exclusive avg_pool promotes 16-bit inputs


def _xla_fn_any_dtype(kind, layout, window, strides, padding):
  if kind == "global_avg":
    return lambda x: jnp.mean(x, axis=(1, 2) if layout == "NHWC" else (2, 3))
  if layout == "NHWC":  # flax's pooling is lax.reduce_window
    if kind == "max":
      return lambda x: nn.max_pool(x, window, strides, padding)
    return lambda x: nn.avg_pool(x, window, strides, padding, kind == "avg")
  dims, strd = (1, 1, *window), (1, 1, *strides)
  assert kind == "max"
  return lambda x: lax.reduce_window(x, -jnp.inf, lax.max, dims, strd, padding)


def _batched(fn, k):
  return jax.jit(lambda xs: [fn(x) for x in xs])


def _batched_vjp(fn, k):
  return jax.jit(lambda xs, cts: [jax.vjp(fn, x)[1](ct)[0] for x, ct in zip(xs, cts)])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--budget", type=float, default=10.0, help="seconds per measurement")
  parser.add_argument("--dtype", default="float32")
  args = parser.parse_args()
  dtype = jnp.dtype(args.dtype)
  rng = np.random.default_rng(0)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} host cores, "
        f"jaxdnn threads {jaxdnn._src.ffi.load_cpu_extension().num_threads()}, dtype {dtype}, "
        f"K={args.k}")
  print(f"{'case':28s} {'op':4s} {'jaxdnn ms':>10s} {'XLA ms':>10s} {'speedup':>8s} "
        f"{'jaxdnn GB/s':>12s}")
  for name, shape, layout, kind, window, strides, padding in CASES:
    ours = _jaxdnn_fn(kind, layout, window, strides, padding)
    ref = _xla_fn(kind, layout, window, strides, padding)
    xs = [jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(args.k)]
    y_shape = jax.eval_shape(ours, xs[0]).shape
    cts = [jnp.asarray(rng.standard_normal(y_shape), dtype) for _ in range(args.k)]
    in_bytes = np.prod(shape) * dtype.itemsize
    out_bytes = np.prod(y_shape) * dtype.itemsize
    for op in ("fwd", "bwd"):
      if op == "fwd":
        t_ours = time_call(_batched(ours, args.k), (xs,), args.repeats, args.budget) / args.k
        t_ref = time_call(_batched(ref, args.k), (xs,), args.repeats, args.budget) / args.k
        moved = in_bytes + out_bytes
      else:
        t_ours = time_call(_batched_vjp(ours, args.k), (xs, cts), args.repeats,
                           args.budget) / args.k
        t_ref = time_call(_batched_vjp(ref, args.k), (xs, cts), args.repeats,
                          args.budget) / args.k
        moved = (2 * in_bytes + out_bytes) if kind == "max" else (in_bytes + out_bytes)
      print(f"{name:28s} {op:4s} {t_ours * 1e3:10.3f} {t_ref * 1e3:10.3f} "
            f"{t_ref / t_ours:7.2f}x {moved / t_ours / 1e9:12.1f}", flush=True)


if __name__ == "__main__":
  main()
