"""A/B timing on a shared machine: implementations measured in turn, round after round.

    python -P benchmarks/interleaved.py benchmarks/layers-cpu-fft.txt --only inc_5x5 \\
        --impls lax,fft,fft_tiling,implicit_precomp_gemm --rounds 30

jaxdnn.bench times one implementation after the other, so on a host that other jobs share a
burst of load lands on whichever implementation runs then. Here every round times each
implementation once (K convolutions in one jitted call, the same harness as jaxdnn.bench), so a
burst hits all of them alike; the table gives the median and the minimum over rounds, in ms per
convolution, and the ratio of lax's median to each median.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np
from jax import lax

from jaxdnn import bench
from jaxdnn._src import algorithms


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("layers")
  ap.add_argument("--only", default="")
  ap.add_argument("--ops", default="fwd,dgrad,wgrad")
  ap.add_argument("--impls", default="lax,fft,fft_tiling,implicit_precomp_gemm,direct")
  ap.add_argument("--rounds", type=int, default=20)
  ap.add_argument("--k", type=int, default=2)
  args = ap.parse_args(argv)
  layers = bench.read_layers(args.layers)
  if args.only:
    keep = set(args.only.split(","))
    layers = [L for L in layers if L["name"] in keep]
  impls = [i if i == "lax" else algorithms.parse_algo(i) for i in args.impls.split(",")]
  names = [i if i == "lax" else i.name for i in impls]
  print("| layer | op | " + " | ".join(names) + " |")
  print("|---|---|" + "---|" * len(names))
  rng = np.random.default_rng(0)
  for L in layers:
    x_shape, w_shape, y_shape, _ = bench.layer_shapes(L)
    for op in args.ops.split(","):
      a_shape, b_shape = {"fwd": (x_shape, w_shape), "dgrad": (y_shape, w_shape),
                          "wgrad": (x_shape, y_shape)}[op]
      As = [np.asarray(rng.standard_normal(a_shape), np.float32) for _ in range(args.k)]
      Bs = [np.asarray(rng.standard_normal(b_shape), np.float32) for _ in range(args.k)]
      fns = {}
      for impl, name in zip(impls, names):
        if impl != "lax":
          why = algorithms.unsupported_reason("cpu", bench.OPS[op], impl, bench.layer_geometry(L),
                                              L["N"], L["C"], L["K"], "float32", "float32",
                                              algorithms.MathPrecision.HIGHEST)
          if why:
            continue
        fn = bench.op_fn(L, impl, op, lax.Precision.HIGHEST, x_shape, w_shape, np.float32)
        jax.block_until_ready(fn(As, Bs))
        fns[name] = fn
      times = {name: [] for name in fns}
      for _ in range(args.rounds):
        for name, fn in fns.items():
          t0 = time.perf_counter()
          jax.block_until_ready(fn(As, Bs))
          times[name].append((time.perf_counter() - t0) * 1e3 / args.k)
      med = {n: float(np.median(t)) for n, t in times.items()}
      cells = []
      for name in names:
        if name not in times:
          cells.append("not supported")
          continue
        cell = f"{med[name]:.3f} (min {min(times[name]):.3f})"
        if "lax" in med and name != "lax":
          cell += f" {med['lax'] / med[name]:.2f}x"
        cells.append(cell)
      print(f"| {L['name']} | {op} | " + " | ".join(cells) + " |", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
