"""jaxdnn convolution benchmark: every algorithm family against lax.conv (and torch on a GPU).

Harness (design.md section 6): for each layer, operation (fwd, dgrad, wgrad) and implementation,
K independent convolutions on distinct random inputs inside one jitted function that returns all
full outputs; the median over repeats of the call time, divided by K. FLOPs = 2*N*P*Q*K*C/G*R*S.
Backward operations are timed through jax.linear_transpose of the forward, so only the backward
convolution is computed, for jaxdnn and lax alike.

    python benchmarks/bench.py                       # CPU, benchmarks/layers-cpu.txt, float32
    python benchmarks/bench.py --platform gpu --dtypes bf16,tf32,fp32 --csv out.csv
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform as pyplatform
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxdnn
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvGeometry, ConvOp, Layout

HERE = os.path.dirname(os.path.abspath(__file__))
DN = ("NHWC", "HWIO", "NHWC")
OPS = ("fwd", "dgrad", "wgrad")
# name -> (array dtype, lax precision)
DTYPES = {
    "fp32": (jnp.float32, lax.Precision.HIGHEST),
    "tf32": (jnp.float32, lax.Precision.DEFAULT),
    "bf16": (jnp.bfloat16, lax.Precision.DEFAULT),
    "fp16": (jnp.float16, lax.Precision.DEFAULT),
}


def read_layers(path):
  layers = []
  with open(path) as f:
    for line in f:
      line = line.split("#", 1)[0].strip()
      if not line:
        continue
      name, *nums = line.split()
      n, c, h, w, k, r, s, stride, pad, groups = map(int, nums)
      layers.append(dict(name=name, N=n, C=c, H=h, W=w, K=k, R=r, S=s, stride=stride, pad=pad,
                         groups=groups))
  return layers


def layer_shapes(L):
  x = (L["N"], L["H"], L["W"], L["C"])
  w = (L["R"], L["S"], L["C"] // L["groups"], L["K"])
  p = (L["H"] + 2 * L["pad"] - L["R"]) // L["stride"] + 1
  q = (L["W"] + 2 * L["pad"] - L["S"]) // L["stride"] + 1
  y = (L["N"], p, q, L["K"])
  flops = 2 * L["N"] * p * q * L["K"] * (L["C"] // L["groups"]) * L["R"] * L["S"]
  return x, w, y, flops


def conv_fn(L, impl, precision):
  """x, w -> y for impl in ("lax", or a ConvAlgo)."""
  kw = dict(window_strides=(L["stride"],) * 2, padding=[(L["pad"], L["pad"])] * 2,
            dimension_numbers=DN, feature_group_count=L["groups"], precision=precision)
  if impl == "lax":
    return lambda x, w: lax.conv_general_dilated(x, w, **kw)
  return lambda x, w: jaxdnn.conv(x, w, **kw, algo=impl)


def op_fn(L, impl, op, precision, x_shape, w_shape, dtype):
  """The jitted function of K operand pairs for one (implementation, operation)."""
  f = conv_fn(L, impl, precision)
  if op == "fwd":
    one = f
  elif op == "dgrad":
    def one(dy, w):
      return jax.linear_transpose(lambda x: f(x, w), jax.ShapeDtypeStruct(x_shape, dtype))(dy)[0]
  else:
    def one(x, dy):
      return jax.linear_transpose(lambda w: f(x, w), jax.ShapeDtypeStruct(w_shape, dtype))(dy)[0]
  return jax.jit(lambda As, Bs: [one(a, b) for a, b in zip(As, Bs)])


def time_call(fn, args, repeats, budget_s, inner=1):
  """Median seconds per call of fn(*args); `inner` calls are issued back to back per sample, so
  asynchronous dispatch hides the host's per-call overhead as it does in a training loop."""
  jax.block_until_ready(fn(*args))  # compile + warm up
  times = []
  start = time.perf_counter()
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(inner - 1):
      fn(*args)
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - t0) / inner)
    if time.perf_counter() - start > budget_s and len(times) >= 2:
      break
  return statistics.median(times)


def torch_time(L, op, dtype_name, k_ops, repeats):
  """torch cuDNN (benchmark mode, channels_last) captured in a CUDA graph; ms per conv or None."""
  try:
    import torch
  except ImportError:
    return None
  if not torch.cuda.is_available():
    return None
  torch.backends.cudnn.benchmark = True
  torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
  torch.backends.cudnn.allow_tf32 = dtype_name == "tf32"
  tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
         "fp16": torch.float16}[dtype_name]
  x_shape, w_shape, y_shape, _ = layer_shapes(L)
  dev = "cuda"
  mk = lambda shape_nchw: torch.randn(*shape_nchw, device=dev, dtype=tdt).to(
      memory_format=torch.channels_last)
  xs = [mk((L["N"], L["C"], L["H"], L["W"])) for _ in range(k_ops)]
  ws = [mk((L["K"], L["C"] // L["groups"], L["R"], L["S"])) for _ in range(k_ops)]
  dys = [mk((L["N"], L["K"], y_shape[1], y_shape[2])) for _ in range(k_ops)]
  stride, pad, groups = [L["stride"]] * 2, [L["pad"]] * 2, L["groups"]
  # dgrad / wgrad through aten.convolution_backward, the op autograd runs (cuDNN's backward
  # algorithms), asking for one gradient at a time.
  mask = {"dgrad": [True, False, False], "wgrad": [False, True, False]}.get(op)

  def body():
    for i in range(k_ops):
      if op == "fwd":
        torch.nn.functional.conv2d(xs[i], ws[i], stride=stride, padding=pad, groups=groups)
      else:
        torch.ops.aten.convolution_backward(dys[i], xs[i], ws[i], None, stride, pad, [1, 1],
                                            False, [0, 0], groups, mask)

  s = torch.cuda.Stream()
  s.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(s):
    for _ in range(3):
      body()
  torch.cuda.current_stream().wait_stream(s)
  graph = torch.cuda.CUDAGraph()
  with torch.cuda.graph(graph):
    body()
  times = []
  for _ in range(repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end) / k_ops)
  return statistics.median(times)


def git_commit():
  try:
    return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                                   stderr=subprocess.DEVNULL).decode().strip()
  except Exception:
    return "unknown"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--platform", default=None, help="cpu or gpu (default: jax's default backend)")
  ap.add_argument("--layers", default=None, help="layer file (default: layers-<platform>.txt)")
  ap.add_argument("--only", default=None, help="comma-separated layer names")
  ap.add_argument("--dtypes", default="fp32", help="comma-separated: fp32, tf32, bf16, fp16")
  ap.add_argument("--ops", default="fwd,dgrad,wgrad")
  ap.add_argument("--algos", default=None, help="comma-separated families (default: all)")
  ap.add_argument("--k", type=int, default=None, help="distinct convs per jitted call")
  ap.add_argument("--repeats", type=int, default=None)
  ap.add_argument("--budget", type=float, default=3.0, help="seconds per measurement, at most")
  ap.add_argument("--inner", type=int, default=None,
                  help="calls issued back to back per timing sample (default: 5 on GPU, 1 on CPU)")
  ap.add_argument("--no-lax", action="store_true")
  ap.add_argument("--csv", default=None, help="write rows here")
  ap.add_argument("--markdown", default=None, help="write the markdown table here")
  args = ap.parse_args(argv)

  plat = args.platform or jax.default_backend()
  plat = "gpu" if plat in ("gpu", "cuda") else plat
  lower_plat = "cuda" if plat == "gpu" else plat
  layers = read_layers(args.layers or os.path.join(HERE, f"layers-{plat}.txt"))
  if args.only:
    keep = set(args.only.split(","))
    layers = [L for L in layers if L["name"] in keep]
  k_ops = args.k or (16 if plat == "gpu" else 2)
  repeats = args.repeats or (20 if plat == "gpu" else 5)
  inner = args.inner or (5 if plat == "gpu" else 1)
  families = [algorithms.parse_algo(a) for a in args.algos.split(",")] if args.algos else [
      a for a in jaxdnn.ConvAlgo]
  device = jax.devices()[0].device_kind
  header = (f"device: {device} ({pyplatform.machine()}, {os.cpu_count()} cores), jax "
            f"{jax.__version__}, date {datetime.date.today()}, commit {git_commit()}, K={k_ops} "
            f"distinct convs per jit, {inner} jit calls back to back per sample, median of up to "
            f"{repeats}")
  print(header, flush=True)
  rows = []
  rng = np.random.default_rng(0)
  for dname in args.dtypes.split(","):
    dtype, precision = DTYPES[dname]
    for L in layers:
      x_shape, w_shape, y_shape, flops = layer_shapes(L)
      geometry = ConvGeometry(Layout.NHWC, (L["H"], L["W"]), (L["R"], L["S"]), (L["stride"],) * 2,
                              (1, 1), (1, 1), (L["pad"],) * 2, (L["pad"],) * 2, L["groups"])
      mk = lambda shape: [jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(k_ops)]
      xs, ws, dys = mk(x_shape), mk(w_shape), mk(y_shape)
      operands = {"fwd": (xs, ws), "dgrad": (dys, ws), "wgrad": (xs, dys)}
      for op in args.ops.split(","):
        cop = {"fwd": ConvOp.FORWARD, "dgrad": ConvOp.BACKWARD_DATA,
               "wgrad": ConvOp.BACKWARD_FILTER}[op]
        impls = ([] if args.no_lax else ["lax"]) + families
        for impl in impls:
          row = dict(dtype=dname, layer=L["name"], op=op, impl=getattr(impl, "name", impl),
                     ms="", tflops="", workspace_mb="", note="")
          if impl != "lax":
            mprec = algorithms.MathPrecision(int(precision.value))
            why = algorithms.unsupported_reason(lower_plat, cop, impl, geometry, L["N"], L["C"],
                                                L["K"], dtype, dtype, mprec)
            if why:
              row["note"] = "not supported"
              rows.append(row)
              print(f"{dname:5} {L['name']:16} {op:6} {row['impl']:22} not supported ({why})",
                    flush=True)
              continue
            row["workspace_mb"] = "%.1f" % (algorithms.workspace_bytes(
                lower_plat, cop, impl, geometry, L["N"], L["C"], L["K"], dtype, dtype, mprec) / 2**20)
          fn = op_fn(L, impl, op, precision, x_shape, w_shape, dtype)
          try:
            t = time_call(fn, operands[op], repeats, args.budget, inner) / k_ops
          except Exception as e:  # report, keep going
            row["note"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            rows.append(row)
            print(f"{dname:5} {L['name']:16} {op:6} {row['impl']:22} {row['note']}", flush=True)
            continue
          row["ms"] = "%.4f" % (t * 1e3)
          row["tflops"] = "%.3f" % (flops / t / 1e12)
          rows.append(row)
          print(f"{dname:5} {L['name']:16} {op:6} {row['impl']:22} {t*1e3:10.4f} ms "
                f"{flops / t / 1e9:9.1f} GFLOP/s  ws {row['workspace_mb']} MB", flush=True)
        if plat == "gpu":
          t = torch_time(L, op, dname, k_ops, repeats)
          if t is not None:
            rows.append(dict(dtype=dname, layer=L["name"], op=op, impl="torch", ms="%.4f" % t,
                             tflops="%.3f" % (flops / (t * 1e-3) / 1e12), workspace_mb="",
                             note=""))
            print(f"{dname:5} {L['name']:16} {op:6} {'torch':22} {t:10.4f} ms", flush=True)
  if args.csv:
    with open(args.csv, "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=list(rows[0]))
      writer.writeheader()
      writer.writerows(rows)
  table = markdown_table(rows, header)
  print(table)
  if args.markdown:
    with open(args.markdown, "w") as f:
      f.write(table)
  return rows


def markdown_table(rows, header):
  """One row per (dtype, layer, op): ms (GFLOP/s or TFLOP/s) per implementation, best marked."""
  impls = []
  for r in rows:
    if r["impl"] not in impls:
      impls.append(r["impl"])
  keyed = {}
  for r in rows:
    keyed.setdefault((r["dtype"], r["layer"], r["op"]), {})[r["impl"]] = r
  lines = [f"<!-- {header} -->", "",
           "| dtype | layer | op | " + " | ".join(impls) + " | best jaxdnn / lax |",
           "|---" * (len(impls) + 4) + "|"]
  for (dtype, layer, op), by_impl in keyed.items():
    cells = []
    best = None
    for impl in impls:
      r = by_impl.get(impl)
      if r is None:
        cells.append("")
      elif r["ms"]:
        cells.append(f"{float(r['ms']):.3f} ({float(r['tflops']) * 1e3:.0f})"
                     if float(r["tflops"]) < 1 else f"{float(r['ms']):.3f} ({float(r['tflops']):.0f}T)")
        if impl not in ("lax", "torch") and (best is None or float(r["ms"]) < best):
          best = float(r["ms"])
      else:
        cells.append(r["note"] or "")
    lax_ms = by_impl.get("lax", {}).get("ms")
    ratio = f"{float(lax_ms) / best:.2f}x" if best and lax_ms else ""
    lines.append(f"| {dtype} | {layer} | {op} | " + " | ".join(cells) + f" | {ratio} |")
  lines.append("")
  lines.append("Cells: ms per convolution (GFLOP/s, or TFLOP/s with T). Last column: lax time / "
               "best jaxdnn time (>1 means jaxdnn is faster).")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
