"""A/B of a transposed convolution's two routes, interleaved round by round in one process.

    python -P benchmarks/transposed_mapping_ab.py benchmarks/layers-cpu-transposed.txt \\
        --algos implicit_precomp_gemm,gemm,implicit_gemm,direct --rounds 7

For each (layer, op, family): `native` runs the lhs-dilated problem on the family's own kernels;
`mapped` runs it as the other face of the strided convolution it transposes
(ConvGeometry.lhs_dilation_as_stride), compiled with algorithms.map_lhs_dilation_always set. Both
are compiled first, then timed in turn every round (K distinct convolutions per jitted call, the
harness of jaxdnn.bench), so load bursts on a shared host hit both alike. Prints the median ms per
convolution of each and native/mapped; lax beside them.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxdnn import bench
from jaxdnn._src import algorithms


def compiled(L, impl, op, precision, shapes, dtype, operands, mapped):
  algorithms.map_lhs_dilation_always = mapped
  try:
    fn = bench.op_fn(L, impl, op, precision, shapes[0], shapes[1], dtype)
    jax.block_until_ready(fn(*operands))  # lowered and compiled under the flag
  finally:
    algorithms.map_lhs_dilation_always = False
  return fn


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("layers")
  ap.add_argument("--only", default="")
  ap.add_argument("--ops", default="fwd,dgrad,wgrad")
  ap.add_argument("--algos", default="implicit_precomp_gemm,gemm,implicit_gemm,direct")
  ap.add_argument("--dtype", default="fp32", choices=tuple(bench.DTYPES))
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--k", type=int, default=2)
  args = ap.parse_args(argv)
  layers = bench.read_layers(args.layers)
  if args.only:
    layers = [L for L in layers if L["name"] in set(args.only.split(","))]
  dtype, precision = bench.DTYPES[args.dtype]
  rng = np.random.default_rng(0)
  print(f"# {jax.devices()[0].device_kind}, {args.dtype}, K={args.k}, median of {args.rounds} "
        "interleaved rounds, ms per convolution")
  print("| layer | op | family | lax | native | mapped | native/mapped |")
  print("|---|---|---|---|---|---|---|")
  for L in layers:
    x_shape, w_shape, y_shape, _ = bench.layer_shapes(L)
    mk = lambda shape: [jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(args.k)]
    xs, ws, dys = mk(x_shape), mk(w_shape), mk(y_shape)
    operands = {"fwd": (xs, ws), "dgrad": (dys, ws), "wgrad": (xs, dys)}
    for op in args.ops.split(","):
      lax_fn = compiled(L, "lax", op, precision, (x_shape, w_shape), dtype, operands[op], False)
      for name in args.algos.split(","):
        algo = algorithms.parse_algo(name)
        fns = [compiled(L, algo, op, precision, (x_shape, w_shape), dtype, operands[op], m)
               for m in (False, True)]
        times = [[], [], []]
        for _ in range(args.rounds):
          for t, fn in zip(times, (lax_fn, *fns)):
            t.append(bench.time_call(fn, operands[op], 1, 0.0) / args.k * 1e3)
        lax_ms, native, mapped = (statistics.median(t) for t in times)
        print(f"| {L['name']} | {op} | {algo.name} | {lax_ms:.3f} | {native:.3f} | {mapped:.3f} | "
              f"{native / mapped:.2f}x |", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
