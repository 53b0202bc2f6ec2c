"""Float32 relative errors of jaxdnn's families against float64 lax, per layer and operation.

    python -P benchmarks/fft_errors.py benchmarks/layers-cpu-fft.txt [--algos fft,fft_tiling]

Inputs are standard normal; the reference is lax.conv_general_dilated at HIGHEST precision on
the float64 casts of the same float32 inputs, so the error is jaxdnn's arithmetic alone:
||out - ref|| / ||ref||. Prints a markdown table (families the layer does not support: "-").
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

jax.config.update("jax_enable_x64", True)

import jaxdnn  # noqa: E402
from jaxdnn import bench  # noqa: E402
from jaxdnn._src import algorithms  # noqa: E402

DEFAULT_ALGOS = "fft,fft_tiling,winograd_nonfused,implicit_precomp_gemm"


def _ops(L, impl):
  """fwd, dgrad, wgrad functions of (x, w, dy) for impl ("lax" or a ConvAlgo)."""
  f = bench.conv_fn(L, impl, lax.Precision.HIGHEST)
  fwd = lambda x, w, dy: f(x, w)
  dgrad = lambda x, w, dy: jax.linear_transpose(lambda x_: f(x_, w), x)(dy)[0]
  wgrad = lambda x, w, dy: jax.linear_transpose(lambda w_: f(x, w_), w)(dy)[0]
  return {"fwd": fwd, "dgrad": dgrad, "wgrad": wgrad}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("layers")
  ap.add_argument("--algos", default=DEFAULT_ALGOS)
  ap.add_argument("--only", default="")
  args = ap.parse_args(argv)
  with open(args.layers) as fh:
    layers = bench.parse_layers(fh.read(), args.layers)
  if args.only:
    keep = set(args.only.split(","))
    layers = [L for L in layers if L["name"] in keep]
  algos = [algorithms.parse_algo(a) for a in args.algos.split(",")]
  print("| layer | op | " + " | ".join(a.name for a in algos) + " |")
  print("|---|---|" + "---|" * len(algos))
  rng = np.random.default_rng(0)
  for L in layers:
    x_shape = (L["N"], L["H"], L["W"], L["C"])
    w_shape = (L["R"], L["S"], L["C"] // L["groups"], L["K"])
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
    w = jnp.asarray(rng.standard_normal(w_shape), jnp.float32)
    y_shape = jax.eval_shape(bench.conv_fn(L, "lax", lax.Precision.HIGHEST), x, w).shape
    dy = jnp.asarray(rng.standard_normal(y_shape), jnp.float32)
    ref_ops = _ops(L, "lax")
    geometry = bench.layer_geometry(L)
    for op in ("fwd", "dgrad", "wgrad"):
      ref = np.asarray(jax.jit(ref_ops[op])(x.astype(jnp.float64), w.astype(jnp.float64),
                                             dy.astype(jnp.float64)))
      cells = []
      for algo in algos:
        why = algorithms.unsupported_reason("cpu", bench.OPS[op], algo, geometry, L["N"], L["C"],
                                            L["K"], "float32", "float32",
                                            algorithms.MathPrecision.HIGHEST)
        if why:
          cells.append("-")
          continue
        out = np.asarray(jax.jit(_ops(L, algo)[op])(x, w, dy), np.float64)
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        cells.append(f"{err:.1e}")
      print(f"| {L['name']} | {op} | " + " | ".join(cells) + " |", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
