"""jaxdnn activations and softmax against jax.nn (XLA) on conv-layer activation shapes.

Harness (design.md section 6, jaxdnn.bench.time_call): K independent applications on distinct
random inputs inside one jitted function that returns all outputs; median call time over
repeats, divided by K. Both implementations run in the same harness.

  fwd  y = f(x)                                     bytes: x read + y written
  bwd  the VJP alone, from the residuals the forward saved (a jax.vjp closure passed into the
       jitted function, so the forward is not re-run): jaxdnn reads a one-bit mask (relu,
       leaky_relu, relu6), y (elu, sigmoid, tanh) or x (gelu, silu) and dy, writes dx; XLA reads whatever its VJP saved (relu-likes: a bool).
                                                    bytes: 2 arrays read + 1 written (a common
                                                    yardstick, not either side's real traffic)
  fwd+bwd  y and dx together (jax.vjp inside the jitted function, both returned), as a training
       step needs them: XLA fuses jax.nn's forward and backward into one loop, jaxdnn runs its two
       kernels.                                     bytes: x, dy read + y, dx written
Softmax runs over the channel axis (last) of the same shapes, and over H (a strided axis) on
the first shape. GB/s is the effective bandwidth of those minimal byte counts.

--inner I issues I calls back to back per timing sample (jaxdnn.bench.time_call), so that
asynchronous dispatch hides the host's per-call launch latency, as in a training loop (default 1 on
the CPU; 10 on the GPU, where one jitted call of K ~20-100 us kernels is otherwise dominated by the
host round trip of a single dispatch).

On a shared host, --rounds R repeats each (jaxdnn, jax.nn) pair of measurements R times,
interleaved, and keeps each side's fastest median (load from other processes only slows a run
down, so the minimum is the least disturbed one).

Shapes: the NHWC outputs of the conv layers in the layer file (--layers; default: the packaged
layers-cpu.txt on the CPU, ResNet-50 N=32 activation shapes on the GPU).

    python benchmarks/pointwise_bench.py --device cpu [--dtype float32] [--k 4] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxdnn
from jaxdnn.bench import git_commit, layer_shapes, packaged_layer_file, read_layers, time_call

# kind -> (jaxdnn function, jax.nn function)
ACTIVATIONS = {
    "relu": (jaxdnn.relu, jax.nn.relu),
    "leaky_relu": (jaxdnn.leaky_relu, jax.nn.leaky_relu),
    "relu6": (jaxdnn.relu6, jax.nn.relu6),
    "elu": (jaxdnn.elu, jax.nn.elu),
    "sigmoid": (jaxdnn.sigmoid, jax.nn.sigmoid),
    "tanh": (jaxdnn.tanh, jnp.tanh),
    "gelu_tanh": (jaxdnn.gelu, jax.nn.gelu),
    "gelu": (lambda x: jaxdnn.gelu(x, approximate=False),
             lambda x: jax.nn.gelu(x, approximate=False)),
    "silu": (jaxdnn.silu, jax.nn.silu),
}
SOFTMAX = {
    "softmax": (jaxdnn.softmax, jax.nn.softmax),
    "log_softmax": (jaxdnn.log_softmax, jax.nn.log_softmax),
}

# ResNet-50 activation shapes, N = 32, NHWC (the GPU default).
GPU_SHAPES = [
    ("r50_stem_112x112x64", (32, 112, 112, 64)),
    ("r50_c2_56x56x64", (32, 56, 56, 64)),
    ("r50_c2_56x56x256", (32, 56, 56, 256)),
    ("r50_c3_28x28x512", (32, 28, 28, 512)),
    ("r50_c4_14x14x1024", (32, 14, 14, 1024)),
    ("r50_c5_7x7x2048", (32, 7, 7, 2048)),
]


def commit() -> str:
  """$JAXDNN_COMMIT, the checkout's commit in the working directory, or this script's."""
  c = git_commit()
  if c != "unknown":
    return c
  try:
    return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"],
                                   cwd=os.path.dirname(os.path.abspath(__file__)),
                                   stderr=subprocess.DEVNULL).decode().strip()
  except Exception:
    return "unknown"


def layer_file_shapes(path) -> list[tuple[str, tuple[int, ...]]]:
  """(name, NHWC output shape) per layer, first occurrence of each shape only."""
  seen, out = set(), []
  for L in read_layers(str(path)):
    y = layer_shapes(L)[2]
    if y not in seen:
      seen.add(y)
      out.append((L["name"], y))
  return out


def _fwd_fn(fn, k):
  return jax.jit(lambda xs: [fn(x) for x in xs])


def _bwd_fn(k):
  return jax.jit(lambda vjps, cts: [v(ct)[0] for v, ct in zip(vjps, cts)])


def _both_fn(fn, k):
  def both(xs, cts):
    out = []
    for x, ct in zip(xs, cts):
      y, vjp = jax.vjp(fn, x)
      out.append((y, vjp(ct)[0]))
    return out
  return jax.jit(both)


def timed(fn, xs, cts, direction):
  """(jitted function, its arguments) timing K applications of fn's forward or backward."""
  k = len(xs)
  if direction == "fwd":
    return _fwd_fn(fn, k), (xs,)
  if direction == "fwd+bwd":
    return _both_fn(fn, k), (xs, cts)
  vjps = [jax.vjp(fn, x)[1] for x in xs]  # residuals computed outside the timed function
  return _bwd_fn(k), (vjps, cts)


def measure_pair(ours, ref, xs, cts, direction, repeats, budget, rounds, inner=1):
  """Seconds per application of ours and ref: the fastest of `rounds` interleaved medians."""
  calls = [timed(f, xs, cts, direction) for f in (ours, ref)]
  best = [float("inf")] * 2
  for _ in range(rounds):
    for i, (fn, args) in enumerate(calls):
      best[i] = min(best[i], time_call(fn, args, repeats, budget, inner=inner) / len(xs))
  return best


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--device", choices=("cpu", "gpu"), default=jax.default_backend())
  parser.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16 (GPU "
                      "default), float16, float64")
  parser.add_argument("--layers", default=None, help="layer file (name N C H W K R S stride pad "
                      "groups per line); default: the packaged CPU set / ResNet-50 N=32 on GPU")
  parser.add_argument("--kinds", default=",".join([*ACTIVATIONS, *SOFTMAX]),
                      help="comma-separated subset of " + ",".join([*ACTIVATIONS, *SOFTMAX]))
  parser.add_argument("--directions", default="fwd,bwd,fwd+bwd")
  parser.add_argument("--k", type=int, default=None, help="independent ops per jit (4 CPU, 16 GPU)")
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--budget", type=float, default=3.0, help="seconds per measurement")
  parser.add_argument("--inner", type=int, default=None, help="calls issued back to back per "
                      "timing sample (default 1 on the CPU, 10 on the GPU)")
  parser.add_argument("--rounds", type=int, default=1, help="interleaved repetitions of each "
                      "pair of measurements; the fastest median is kept")
  parser.add_argument("--csv", default=None)
  parser.add_argument("--markdown", default=None, help="write the table as markdown here")
  args = parser.parse_args(argv)

  device = jax.devices(args.device)[0]
  jax.config.update("jax_default_device", device)
  dtype = jnp.dtype(args.dtype or ("float32" if args.device == "cpu" else "bfloat16"))
  k = args.k or (4 if args.device == "cpu" else 16)
  inner = args.inner or (1 if args.device == "cpu" else 10)
  if args.layers:
    shapes = layer_file_shapes(args.layers)
  elif args.device == "cpu":
    shapes = layer_file_shapes(packaged_layer_file("cpu"))
  else:
    shapes = GPU_SHAPES
  kinds = [s.strip() for s in args.kinds.split(",") if s.strip()]
  for kind in kinds:
    if kind not in ACTIVATIONS and kind not in SOFTMAX:
      raise SystemExit(f"--kinds: unknown {kind!r}")
  directions = [d.strip() for d in args.directions.split(",") if d.strip()]

  threads = jaxdnn._src.ffi.load_cpu_extension().num_threads()
  header = (f"jax {jax.__version__}, device {device.device_kind} ({args.device}), "
            f"{os.cpu_count()} host cores, jaxdnn CPU threads {threads}, dtype {dtype}, K={k}, "
            f"repeats {args.repeats}, inner {inner}, rounds {args.rounds}, "
            f"commit {commit()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
  print(header, flush=True)
  print(f"{'shape':22s} {'op':19s} {'dir':7s} {'jaxdnn ms':>10s} {'jax.nn ms':>10s} "
        f"{'speedup':>8s} {'jaxdnn GB/s':>12s} {'jax.nn GB/s':>12s}", flush=True)
  rng = np.random.default_rng(0)
  rows = []
  for name, shape in shapes:
    xs = [jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(k)]
    cts = [jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(k)]
    nbytes = int(np.prod(shape)) * dtype.itemsize
    cases = []
    for kind in kinds:
      if kind in ACTIVATIONS:
        cases.append((kind, *ACTIVATIONS[kind]))
      else:
        ours, ref = SOFTMAX[kind]
        cases.append((kind, ours, ref))
        if shape is shapes[0][1]:  # a strided (inner > 1) softmax over H
          cases.append((f"{kind}(axis=1)", lambda x, f=ours: f(x, 1), lambda x, f=ref: f(x, 1)))
    for op, ours, ref in cases:
      for direction in directions:
        moved = {"fwd": 2, "bwd": 3, "fwd+bwd": 4}[direction] * nbytes
        t_ours, t_ref = measure_pair(ours, ref, xs, cts, direction, args.repeats, args.budget,
                                     args.rounds, inner)
        row = dict(device=args.device, dtype=str(dtype), shape="x".join(map(str, shape)),
                   layer=name, op=op, direction=direction, jaxdnn_ms=t_ours * 1e3,
                   jaxnn_ms=t_ref * 1e3, speedup=t_ref / t_ours,
                   jaxdnn_gbps=moved / t_ours / 1e9, jaxnn_gbps=moved / t_ref / 1e9)
        rows.append(row)
        print(f"{row['shape']:22s} {op:19s} {direction:7s} {row['jaxdnn_ms']:10.4f} "
              f"{row['jaxnn_ms']:10.4f} {row['speedup']:7.2f}x {row['jaxdnn_gbps']:12.1f} "
              f"{row['jaxnn_gbps']:12.1f}", flush=True)
  if args.csv:
    with open(args.csv, "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=list(rows[0]))
      w.writeheader()
      w.writerows(rows)
  if args.markdown:
    with open(args.markdown, "w") as f:
      f.write(f"{header}\n\n")
      f.write("| shape | op | dir | jaxdnn ms | jax.nn ms | speedup | jaxdnn GB/s |\n")
      f.write("|---|---|---|---|---|---|---|\n")
      for r in rows:
        f.write(f"| {r['shape']} | {r['op']} | {r['direction']} | {r['jaxdnn_ms']:.3f} | "
                f"{r['jaxnn_ms']:.3f} | {r['speedup']:.2f}x | {r['jaxdnn_gbps']:.1f} |\n")
  return rows


if __name__ == "__main__":
  sys.exit(0 if main() is not None else 1)
