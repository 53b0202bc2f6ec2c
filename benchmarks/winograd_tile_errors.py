"""Float32 relative error of WINOGRAD_NONFUSED per explicit tile, F(2x2), F(4x4), F(6x6), on the
jaxdnn kernels of the running backend (CPU here; the GPU checker tests/cuda/winograd/check.cu
prints the same measure for the CUDA kernels), against lax.conv_general_dilated in float64.

  python benchmarks/winograd_tile_errors.py [--layers] [--sweep] [--n N] [--ops fwd,dgrad,wgrad]

--layers: the 3x3 stride-1 dense layers of benchmarks/layers-gpu.txt and layers-cpu.txt, batch
reduced to --n (default 1; the error is a per-output-element statistic, it does not grow with
N). --sweep: C/G = K/G = 16 .. 2048 (doubling) on a 12x12 image, N=2, to see how the error grows
with the reduction length. Inputs uniform(-1, 1) (float32-rounded; the reference sees the same
values). Error = ||out - ref|| / ||ref||; the max over 2 seeds is printed.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import numpy as np
from jax import lax

jax.config.update("jax_enable_x64", True)
import jaxdnn  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
TILES = ("winograd_nonfused_f2x2", "winograd_nonfused_f4x4", "winograd_nonfused_f6x6")
DN = ("NHWC", "HWIO", "NHWC")


def layers(n: int):
  seen = {}
  for f in ("layers-gpu.txt", "layers-cpu.txt"):
    for line in (HERE / f).read_text().splitlines():
      parts = line.split()
      if not parts or parts[0].startswith("#"):
        continue
      name, _, c, h, w, k, r, s, stride, pad, groups = parts[0], *map(int, parts[1:])
      if (r, s, stride, groups) == (3, 3, 1, 1) and name not in seen:
        seen[name] = (n, c, h, k, pad)
  return seen


def rel(out, ref):
  out = np.asarray(out, np.float64)
  return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def measure(n, c, h, k, pad, ops, seeds=(0, 1)):
  errs = {t: {op: 0.0 for op in ops} for t in TILES}
  for seed in seeds:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, h, h, c)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 3, c, k)).astype(np.float32)
    ref_f = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), [(pad, pad)] * 2,
                                                  dimension_numbers=DN, precision="highest")
    y64, vjp64 = jax.vjp(ref_f, x.astype(np.float64), w.astype(np.float64))
    dy = rng.uniform(-1, 1, y64.shape).astype(np.float32)
    dx64, dw64 = vjp64(dy.astype(np.float64))
    refs = {"fwd": np.asarray(y64), "dgrad": np.asarray(dx64), "wgrad": np.asarray(dw64)}
    for t in TILES:
      f = jax.jit(lambda x, w, t=t: jaxdnn.conv(x, w, (1, 1), [(pad, pad)] * 2,
                                                dimension_numbers=DN, precision="highest",
                                                algo=t))
      if "fwd" in ops:
        errs[t]["fwd"] = max(errs[t]["fwd"], rel(f(x, w), refs["fwd"]))
      if "dgrad" in ops or "wgrad" in ops:
        _, vjp = jax.vjp(f, x, w)
        dx, dw = vjp(dy)
        for op, v in (("dgrad", dx), ("wgrad", dw)):
          if op in ops:
            errs[t][op] = max(errs[t][op], rel(v, refs[op]))
  return errs


def report(name, shape, errs, ops):
  cells = "  ".join(f"{t[-4:]} " + " ".join(f"{errs[t][op]:.2e}" for op in ops) for t in TILES)
  print(f"{name:14s} {shape:24s} {cells}", flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layers", action="store_true")
  ap.add_argument("--sweep", action="store_true")
  ap.add_argument("--n", type=int, default=1)
  ap.add_argument("--ops", default="fwd,dgrad,wgrad")
  ap.add_argument("--max-c", type=int, default=2048)
  args = ap.parse_args(argv)
  ops = args.ops.split(",")
  print(f"# {jax.default_backend()} float32, ||out - ref|| / ||ref|| vs float64 lax; columns per "
        f"tile: {' '.join(ops)}")
  if args.layers:
    for name, (n, c, h, k, pad) in layers(args.n).items():
      report(name, f"N{n} C{c} {h}x{h} K{k}", measure(n, c, h, k, pad, ops), ops)
  if args.sweep:
    c = 16
    while c <= args.max_c:
      report(f"sweep_c{c}", f"N2 C{c} 12x12 K{c}", measure(2, c, 12, c, 1, ops, seeds=(0,)), ops)
      c *= 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
