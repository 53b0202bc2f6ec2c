"""jaxdnn pooling against XLA (lax.reduce_window, flax.linen) and, on a GPU, torch.

K independent applications (distinct random inputs) inside one jitted function that returns all
outputs; median over repeats of the call time, divided by K (jaxdnn.bench.time_call). "bwd" is
the VJP alone (the unused forward is dead code for both); "jvp" (max pooling) the tangent alone.
Bandwidth counts the bytes an ideal kernel moves: read plus written (fwd: x + y; max bwd and jvp:
2 x + y; avg bwd: y + x). torch (when importable with CUDA) runs the same operations on tensors of
the same layout (channels_last for NHWC), captured in a CUDA graph, its backward given the saved
arg-max indices.

    python benchmarks/pool_bench.py                       # this machine's default backend
    python benchmarks/pool_bench.py --platform gpu --csv pool.csv   # ResNet-50 set, N=32, bf16
    python benchmarks/pool_bench.py --platform cpu --k 4 --dtype float32
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxdnn
from jaxdnn.bench import git_commit, time_call, torch_graph_time

# name, input shape, layout, kind, window, strides, padding
CPU_CASES = [
    ("maxpool3x3s2 stem", (8, 112, 112, 64), "NHWC", "max", (3, 3), (2, 2), "SAME"),
    ("maxpool3x3s2 stem NCHW", (8, 64, 112, 112), "NCHW", "max", (3, 3), (2, 2), "SAME"),
    ("avgpool2x2s2", (8, 56, 56, 256), "NHWC", "avg", (2, 2), (2, 2), "VALID"),
    ("avgpool3x3s1 SAME excl", (8, 28, 28, 256), "NHWC", "avg_excl", (3, 3), (1, 1), "SAME"),
    ("global avg 7x7x2048", (8, 7, 7, 2048), "NHWC", "global_avg", None, None, None),
    ("global avg NCHW 2048x7x7", (8, 2048, 7, 7), "NCHW", "global_avg", None, None, None),
    ("global max 7x7x2048", (8, 7, 7, 2048), "NHWC", "global_max", None, None, None),
    ("global max NCHW 2048x7x7", (8, 2048, 7, 7), "NCHW", "global_max", None, None, None),
]
PAD1 = ((1, 1), (1, 1))
# ResNet-50 at N = 32 (the bar: >= 3 TB/s for bf16 NHWC).
GPU_CASES = [
    ("maxpool3x3s2p1 32x112x112x64", (32, 112, 112, 64), "NHWC", "max", (3, 3), (2, 2), PAD1),
    ("maxpool3x3s2p1 NCHW", (32, 64, 112, 112), "NCHW", "max", (3, 3), (2, 2), PAD1),
    ("avgpool3x3s2p1 32x112x112x64", (32, 112, 112, 64), "NHWC", "avg", (3, 3), (2, 2), PAD1),
    ("avgpool2x2s2 32x112x112x64", (32, 112, 112, 64), "NHWC", "avg", (2, 2), (2, 2), "VALID"),
    ("avgpool2x2s2 32x56x56x256", (32, 56, 56, 256), "NHWC", "avg", (2, 2), (2, 2), "VALID"),
    ("avgpool2x2s2 32x7x7x2048", (32, 7, 7, 2048), "NHWC", "avg", (2, 2), (2, 2), "VALID"),
    ("avgpool3x3s1 excl 32x28x28x256", (32, 28, 28, 256), "NHWC", "avg_excl", (3, 3), (1, 1),
     "SAME"),
    ("global avg 32x7x7x2048", (32, 7, 7, 2048), "NHWC", "global_avg", None, None, None),
    ("global avg NCHW 32x2048x7x7", (32, 2048, 7, 7), "NCHW", "global_avg", None, None, None),
]


def _jaxdnn_fn(kind, layout, window, strides, padding):
  if kind == "max":
    return lambda x: jaxdnn.max_pool(x, window, strides, padding, layout=layout)
  if kind in ("avg", "avg_excl"):
    return lambda x: jaxdnn.avg_pool(x, window, strides, padding, kind == "avg", layout=layout)
  if kind == "global_max":
    return lambda x: jaxdnn.global_max_pool(x, layout=layout)
  return lambda x: jaxdnn.global_avg_pool(x, layout=layout)


def _xla_fn(kind, layout, window, strides, padding):
  """lax.reduce_window (flax's pooling for NHWC), in the input dtype."""
  spatial = (1, 2) if layout == "NHWC" else (2, 3)
  if kind == "global_avg":
    return lambda x: jnp.mean(x, axis=spatial)
  if kind == "global_max":
    return lambda x: jnp.max(x, axis=spatial)
  if layout == "NHWC":
    if kind == "max":
      return lambda x: nn.max_pool(x, window, strides, padding)
    # flax's exclusive avg_pool promotes 16-bit inputs: cast back.
    return lambda x: nn.avg_pool(x, window, strides, padding, kind == "avg").astype(x.dtype)
  full = lambda v, fill: (fill, fill, *v)
  pads = padding if isinstance(padding, str) else full(padding, (0, 0))
  reduce = lambda x, init, op: lax.reduce_window(x, init, op, full(window, 1), full(strides, 1),
                                                 pads)
  if kind == "max":
    return lambda x: reduce(x, -jnp.inf, lax.max)
  if kind == "avg":
    return lambda x: (reduce(x, 0.0, lax.add) / np.prod(window)).astype(x.dtype)
  return lambda x: (reduce(x, 0.0, lax.add) / reduce(jnp.ones_like(x), 0.0, lax.add)).astype(
      x.dtype)


def _batched(fn):
  return jax.jit(lambda xs: [fn(x) for x in xs])


def _batched_vjp(fn):
  return jax.jit(lambda xs, cts: [jax.vjp(fn, x)[1](ct)[0] for x, ct in zip(xs, cts)])


def _batched_jvp(fn):
  return jax.jit(lambda xs, ts: [jax.jvp(fn, (x,), (t,))[1] for x, t in zip(xs, ts)])


def _torch_time(kind, layout, window, strides, padding, shape, dtype, op, k, repeats):
  """Milliseconds per operation of torch's pooling (CUDA graph of k calls), or None."""
  try:
    import torch
  except ImportError:
    return None
  if not torch.cuda.is_available() or op == "jvp" or kind == "global_max":
    return None
  if isinstance(padding, str):
    if padding != "VALID" and kind != "avg_excl":
      return None
    pad = [0, 0] if padding == "VALID" else [w // 2 for w in window]  # SAME, odd windows
  elif kind != "global_avg":
    if any(lo != hi for lo, hi in padding):
      return None
    pad = [lo for lo, _ in padding]
  tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
         "float64": torch.float64}[jnp.dtype(dtype).name]
  nchw = shape if layout == "NCHW" else (shape[0], shape[3], shape[1], shape[2])
  fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
  mk = lambda s: torch.randn(*s, device="cuda", dtype=tdt).contiguous(memory_format=fmt)
  F = torch.nn.functional
  xs = [mk(nchw) for _ in range(k)]
  if kind == "max":
    ys_idx = [F.max_pool2d(x, window, strides, pad, return_indices=True) for x in xs]
  elif kind == "global_avg":
    ys_idx = [(F.adaptive_avg_pool2d(x, 1), None) for x in xs]
  else:
    ys_idx = [(F.avg_pool2d(x, window, strides, pad, count_include_pad=kind == "avg"), None)
              for x in xs]
  dys = [mk(tuple(y.shape)) for y, _ in ys_idx]

  def body():
    for i in range(k):
      x, (y, idx), dy = xs[i], ys_idx[i], dys[i]
      if op == "fwd":
        if kind == "max":
          F.max_pool2d(x, window, strides, pad)
        elif kind == "global_avg":
          F.adaptive_avg_pool2d(x, 1)
        else:
          F.avg_pool2d(x, window, strides, pad, count_include_pad=kind == "avg")
      elif kind == "max":
        torch.ops.aten.max_pool2d_with_indices_backward(dy, x, window, strides, pad, [1, 1],
                                                        False, idx)
      elif kind == "global_avg":
        torch.ops.aten._adaptive_avg_pool2d_backward(dy, x)
      else:
        torch.ops.aten.avg_pool2d_backward(dy, x, window, strides, pad, False, kind == "avg",
                                           None)

  return torch_graph_time(body, k, repeats)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--platform", choices=("cpu", "gpu"), default=None,
                      help="device to run on (default: jax's default backend)")
  parser.add_argument("--k", type=int, default=None, help="applications per call (cpu 4, gpu 8)")
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--budget", type=float, default=10.0, help="seconds per measurement")
  parser.add_argument("--dtype", default=None, help="default: float32 on cpu, bfloat16 on gpu")
  parser.add_argument("--csv", default=None, help="write the table as CSV")
  parser.add_argument("--cases", default=None,
                      help="run only the cases whose name contains this text (case-insensitive)")
  parser.add_argument("--no-torch", action="store_true")
  parser.add_argument("--inner", type=int, default=None,
                      help="calls issued back to back per sample, so that asynchronous dispatch "
                      "hides the host's per-call latency (default: 1 on the CPU, 10 on a GPU)")
  args = parser.parse_args()
  platform = args.platform or ("gpu" if jax.default_backend() == "gpu" else "cpu")
  device = jax.devices(platform)[0]
  gpu = platform == "gpu"
  dtype = jnp.dtype(args.dtype or ("bfloat16" if gpu else "float32"))
  k = args.k or (8 if gpu else 4)
  inner = args.inner or (10 if gpu else 1)
  cases = GPU_CASES if gpu else CPU_CASES
  if args.cases:
    cases = [c for c in cases if args.cases.lower() in c[0].lower()]
  rng = np.random.default_rng(0)
  threads = jaxdnn._src.ffi.load_cpu_extension().num_threads()
  header = (f"jax {jax.__version__}, {device.device_kind} ({platform}), {os.cpu_count()} host "
            f"cores, jaxdnn CPU threads {threads}, dtype {dtype}, K={k}, {inner} calls per "
            f"sample, commit {git_commit()}, "
            f"{datetime.date.today()}")
  print(header)
  print(f"{'case':32s} {'op':4s} {'jaxdnn ms':>10s} {'XLA ms':>10s} {'torch ms':>9s} "
        f"{'vs XLA':>7s} {'jaxdnn GB/s':>12s} {'XLA GB/s':>9s} {'torch GB/s':>10s}")
  rows = []
  with jax.default_device(device):
    for name, shape, layout, kind, window, strides, padding in cases:
      ours = _jaxdnn_fn(kind, layout, window, strides, padding)
      ref = _xla_fn(kind, layout, window, strides, padding)
      xs = [jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(k)]
      y_shape = jax.eval_shape(ours, xs[0]).shape
      cts = [jnp.asarray(rng.standard_normal(y_shape), dtype) for _ in range(k)]
      in_bytes = np.prod(shape) * dtype.itemsize
      out_bytes = np.prod(y_shape) * dtype.itemsize
      ops = ("fwd", "jvp", "bwd") if kind == "max" else ("fwd", "bwd")
      for op in ops:
        if op == "fwd":
          wrap, operands, moved = _batched, (xs,), in_bytes + out_bytes
        elif op == "jvp":
          wrap, operands, moved = _batched_jvp, (xs, xs[::-1]), 2 * in_bytes + out_bytes
        else:
          wrap, operands = _batched_vjp, (xs, cts)
          moved = (2 * in_bytes + out_bytes) if kind in ("max", "global_max") else (in_bytes +
                                                                               out_bytes)
        t_ours = time_call(wrap(ours), operands, args.repeats, args.budget, inner) / k
        t_ref = time_call(wrap(ref), operands, args.repeats, args.budget, inner) / k
        t_torch = None
        if gpu and not args.no_torch:
          ms = _torch_time(kind, layout, window, strides, padding, shape, dtype, op, k,
                           args.repeats)
          t_torch = None if ms is None else ms * 1e-3
        gbps = lambda t: moved / t / 1e9
        torch_ms = f"{t_torch * 1e3:9.3f}" if t_torch else f"{'-':>9s}"
        torch_gbps = f"{gbps(t_torch):10.1f}" if t_torch else f"{'-':>10s}"
        print(f"{name:32s} {op:4s} {t_ours * 1e3:10.3f} {t_ref * 1e3:10.3f} {torch_ms} "
              f"{t_ref / t_ours:6.2f}x {gbps(t_ours):12.1f} {gbps(t_ref):9.1f} {torch_gbps}",
              flush=True)
        rows.append(dict(case=name, layout=layout, op=op, dtype=dtype.name, k=k,
                         jaxdnn_ms=t_ours * 1e3, xla_ms=t_ref * 1e3,
                         torch_ms=t_torch * 1e3 if t_torch else "",
                         bytes=int(moved), jaxdnn_gbps=gbps(t_ours), xla_gbps=gbps(t_ref),
                         torch_gbps=gbps(t_torch) if t_torch else ""))
  if args.csv:
    with open(args.csv, "w", newline="") as f:
      f.write(f"# {header}\n")
      writer = csv.DictWriter(f, fieldnames=list(rows[0]))
      writer.writeheader()
      writer.writerows(rows)


if __name__ == "__main__":
  main()
