"""jaxdnn convolution benchmark: every algorithm family against lax.conv (and torch on a GPU).

For each (dtype, layer, operation) it prints a cuDNN-find-style table: per family the time,
TFLOP/s and workspace, or "not supported" with the reason; lax.conv and torch beside them; the
fastest family and its speedup over lax.conv.

Timing (design.md section 6): K independent convolutions on distinct random inputs inside one
jitted function that returns all full outputs; the median over repeats of the call time, divided
by K. FLOPs = 2*N*P*Q*K*C/G*R*S. Backward operations are timed through jax.linear_transpose of the
forward, so only the backward convolution is computed, for jaxdnn and lax alike.

    python -m jaxdnn.bench                          # ResNet-50/VGG set for this platform, float32
    jaxdnn-bench --set sweep --ops fwd --plot sweep  # filter/channel/batch sweeps, two PNGs
    jaxdnn-bench --platform gpu --dtypes bf16,tf32,fp32 --csv out.csv --markdown out.md
    jaxdnn-bench --layers my_layers.txt   # lines: name N C H W K R S stride pad groups [lhs]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.resources
import math
import os
import platform as pyplatform
import statistics
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxdnn
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvGeometry, ConvOp, Layout

DN = ("NHWC", "HWIO", "NHWC")
OPS = {"fwd": ConvOp.FORWARD, "dgrad": ConvOp.BACKWARD_DATA, "wgrad": ConvOp.BACKWARD_FILTER}
# name -> (array dtype, lax precision)
DTYPES = {
    "fp32": (jnp.float32, lax.Precision.HIGHEST),
    "tf32": (jnp.float32, lax.Precision.DEFAULT),
    "bf16": (jnp.bfloat16, lax.Precision.DEFAULT),
    "fp16": (jnp.float16, lax.Precision.DEFAULT),
}
# lhs: lhs_dilation (a transposed convolution upsampling by it); optional in a layer file (1)
LAYER_FIELDS = ("N", "C", "H", "W", "K", "R", "S", "stride", "pad", "groups", "lhs")
CSV_FIELDS = ("dtype", "layer", "op", "impl", "ms", "tflops", "workspace_mb", "note", "reason",
              *LAYER_FIELDS, "gflop")
NOT_SUPPORTED = "not supported"
SETS = ("resnet", "sweep", "tiny")

# A few small layers (3x3, strided 5x5, depthwise, grouped 1x1) for smoke tests.
TINY_LAYERS = """\
tiny_3x3 2 8 10 10 8 3 3 1 1 1
tiny_5x5_s2 2 4 9 9 6 5 5 2 2 1
tiny_dw_3x3 2 8 8 8 8 3 3 1 1 8
tiny_g2_1x1 1 8 6 6 4 1 1 1 0 2
"""


# ---------------------------------------------------------------------------------------------
# Layer sets.

def parse_layers(text: str, source: str = "<layers>") -> list[dict]:
  """Layer lines `name N C H W K R S stride pad groups [lhs]` ('#' starts a comment) -> layer
  dicts."""
  layers = []
  for lineno, line in enumerate(text.splitlines(), 1):
    line = line.split("#", 1)[0].strip()
    if not line:
      continue
    name, *nums = line.split()
    where = f"{source}:{lineno}"
    if len(nums) == len(LAYER_FIELDS) - 1:
      nums.append("1")  # lhs
    if len(nums) != len(LAYER_FIELDS):
      raise ValueError(f"{where}: expected a name and {len(LAYER_FIELDS) - 1} integers "
                       f"({' '.join(LAYER_FIELDS[:-1])}) and optionally lhs, got {line!r}")
    try:
      layer = dict(name=name, **dict(zip(LAYER_FIELDS, map(int, nums))))
    except ValueError:
      raise ValueError(f"{where}: non-integer field in {line!r}") from None
    check_layer(layer, where)
    layers.append(layer)
  return layers


def check_layer(L: dict, where: str) -> None:
  if any(L[f] <= 0 for f in LAYER_FIELDS if f != "pad") or L["pad"] < 0:
    raise ValueError(f"{where}: sizes must be positive and pad non-negative: {L}")
  if L["C"] % L["groups"] or L["K"] % L["groups"]:
    raise ValueError(f"{where}: C={L['C']} and K={L['K']} must be multiples of "
                     f"groups={L['groups']}")
  h_in, w_in = ((L[a] - 1) * L.get("lhs", 1) + 1 for a in ("H", "W"))  # lhs-dilated
  if h_in + 2 * L["pad"] < L["R"] or w_in + 2 * L["pad"] < L["S"]:
    raise ValueError(f"{where}: the filter is larger than the padded image: {L}")


def read_layers(path: str) -> list[dict]:
  with open(path) as f:
    return parse_layers(f.read(), path)


def packaged_layer_file(plat: str):
  """The ResNet-50/VGG layer file shipped in the package for plat ("cpu" or "gpu")."""
  return importlib.resources.files("jaxdnn").joinpath("benchsets", f"layers-{plat}.txt")


def sweep_layers(plat: str) -> list[dict]:
  """cuDNN-study sweeps around a ResNet 3x3 layer, varying one parameter at a time.

  Base: N=32 (N=4 on a CPU) C=K=64, 28x28, 3x3, stride 1, pad 1. Sweeps: filter size 1..11
  (pad (r-1)/2), channels C=K 16..1024 (16..512 on a CPU), batch 1..128 (1..64 on a CPU).
  """
  cpu = plat != "gpu"
  base = dict(N=4 if cpu else 32, C=64, H=28, W=28, K=64, R=3, S=3, stride=1, pad=1, groups=1,
              lhs=1)
  layers = []
  for r in (1, 3, 5, 7, 9, 11):
    layers.append(dict(base, name=f"sweep_r{r}", R=r, S=r, pad=(r - 1) // 2))
  for c in (2**i for i in range(4, 10 if cpu else 11)):
    layers.append(dict(base, name=f"sweep_c{c}", C=c, K=c))
  for n in (2**i for i in range(0, 7 if cpu else 8)):
    layers.append(dict(base, name=f"sweep_n{n}", N=n))
  return layers


def select_layers(args, plat: str) -> list[dict]:
  if args.layers:
    layers = read_layers(args.layers)
  elif args.set == "sweep":
    layers = sweep_layers(plat)
  elif args.set == "tiny":
    layers = parse_layers(TINY_LAYERS, "tiny")
  else:
    f = packaged_layer_file(plat)
    layers = parse_layers(f.read_text(), str(f))
  if args.only:
    keep = set(args.only.split(","))
    unknown = keep - {L["name"] for L in layers}
    if unknown:
      raise SystemExit(f"--only: no layer named {', '.join(sorted(unknown))}")
    layers = [L for L in layers if L["name"] in keep]
  return layers


def layer_shapes(L):
  """(x shape, w shape, y shape, FLOPs) of the NHWC/HWIO convolution of layer L."""
  x = (L["N"], L["H"], L["W"], L["C"])
  w = (L["R"], L["S"], L["C"] // L["groups"], L["K"])
  h_in, w_in = ((L[a] - 1) * L.get("lhs", 1) + 1 for a in ("H", "W"))  # lhs-dilated
  p = (h_in + 2 * L["pad"] - L["R"]) // L["stride"] + 1
  q = (w_in + 2 * L["pad"] - L["S"]) // L["stride"] + 1
  y = (L["N"], p, q, L["K"])
  # lhs > 1: the products of input pixels only (lax and cuDNN count a transposed convolution as
  # the strided convolution's backward-data), not the inserted zeros
  pix = p * q if L.get("lhs", 1) == 1 else L["H"] * L["W"]
  flops = 2 * L["N"] * pix * L["K"] * (L["C"] // L["groups"]) * L["R"] * L["S"]
  return x, w, y, flops


def layer_geometry(L) -> ConvGeometry:
  return ConvGeometry(Layout.NHWC, (L["H"], L["W"]), (L["R"], L["S"]), (L["stride"],) * 2,
                      (1, 1), (L.get("lhs", 1),) * 2, (L["pad"],) * 2, (L["pad"],) * 2, L["groups"])


# ---------------------------------------------------------------------------------------------
# Timing.

def conv_fn(L, impl, precision):
  """x, w -> y for impl in ("lax", or a ConvAlgo)."""
  kw = dict(window_strides=(L["stride"],) * 2, padding=[(L["pad"], L["pad"])] * 2,
            lhs_dilation=(L.get("lhs", 1),) * 2, dimension_numbers=DN,
            feature_group_count=L["groups"], precision=precision)
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


def torch_available() -> bool:
  """Whether torch is importable and sees a CUDA device (then it joins the GPU tables)."""
  try:
    import torch
  except ImportError:
    return False
  return torch.cuda.is_available()


def torch_time(L, op, dtype_name, k_ops, repeats):
  """torch cuDNN (benchmark mode, channels_last) captured in a CUDA graph: ms per conv."""
  import torch

  torch.backends.cudnn.benchmark = True
  torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
  torch.backends.cudnn.allow_tf32 = dtype_name == "tf32"
  tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
         "fp16": torch.float16}[dtype_name]
  _, _, y_shape, _ = layer_shapes(L)
  dev = "cuda"
  mk = lambda shape_nchw: torch.randn(*shape_nchw, device=dev, dtype=tdt).to(
      memory_format=torch.channels_last)
  groups, transposed = L["groups"], L.get("lhs", 1) != 1
  if not transposed:
    w_shape = (L["K"], L["C"] // groups, L["R"], L["S"])
    stride, pad = [L["stride"]] * 2, [L["pad"]] * 2
  else:
    # lhs dilation s with padding p is torch's transposed convolution of stride s and padding
    # R-1-p (the same extents; the filter flipped, which does not change the timing)
    if L["stride"] != 1 or L["pad"] > min(L["R"], L["S"]) - 1:
      raise ValueError("torch has no transposed convolution for a window stride > 1 or padding "
                       "beyond the filter")
    w_shape = (L["C"], L["K"] // groups, L["R"], L["S"])
    stride, pad = [L.get("lhs", 1)] * 2, [L["R"] - 1 - L["pad"], L["S"] - 1 - L["pad"]]
  xs = [mk((L["N"], L["C"], L["H"], L["W"])) for _ in range(k_ops)]
  ws = [mk(w_shape) for _ in range(k_ops)]
  dys = [mk((L["N"], L["K"], y_shape[1], y_shape[2])) for _ in range(k_ops)]
  conv = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
  # dgrad / wgrad through aten.convolution_backward, the op autograd runs (cuDNN's backward
  # algorithms), asking for one gradient at a time.
  mask = {"dgrad": [True, False, False], "wgrad": [False, True, False]}.get(op)

  def body():
    for i in range(k_ops):
      if op == "fwd":
        conv(xs[i], ws[i], stride=stride, padding=pad, groups=groups)
      else:
        torch.ops.aten.convolution_backward(dys[i], xs[i], ws[i], None, stride, pad, [1, 1],
                                            transposed, [0, 0], groups, mask)

  return torch_graph_time(body, k_ops, repeats)


def torch_graph_time(body, k_ops, repeats):
  """Median ms per op of body() (k_ops torch ops), warmed up on a side stream, captured in a CUDA
  graph and replayed `repeats` times between CUDA events."""
  import torch
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
  """$JAXDNN_COMMIT, else the commit of the git checkout in the working directory ("unknown")."""
  if os.environ.get("JAXDNN_COMMIT"):
    return os.environ["JAXDNN_COMMIT"]
  try:
    return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"],
                                   stderr=subprocess.DEVNULL).decode().strip()
  except Exception:
    return "unknown"


class _Progress:
  """A tqdm bar over measurements when tqdm is importable (and enabled); lines go around it."""

  def __init__(self, total: int, enabled: bool):
    self.bar = None
    if enabled:
      try:
        from tqdm import tqdm
        # disable=None: no bar when stderr is not a terminal (logs stay clean).
        self.bar = tqdm(total=total, unit="meas", desc="jaxdnn-bench", disable=None, leave=False)
      except ImportError:
        pass

  def write(self, line: str):
    if self.bar is not None and not self.bar.disable:
      self.bar.write(line)
    else:
      print(line, flush=True)

  def step(self, desc: str):
    if self.bar is not None:
      self.bar.set_postfix_str(desc, refresh=False)
      self.bar.update()

  def close(self):
    if self.bar is not None:
      self.bar.close()


def run_benchmark(layers, *, plat, dtypes, ops, families, with_lax, k_ops, repeats, budget,
                  inner, progress=True, time_limit=None):
  """Measures every (dtype, layer, op, implementation); returns CSV rows (dicts of strings).

  Layers with identical geometry are measured once (a sweep repeats its base layer). With
  `time_limit` (seconds), measuring stops once it is spent and the rows so far are returned.
  """
  stop_at = None if time_limit is None else time.monotonic() + time_limit
  layers = [dict(L, lhs=L.get("lhs", 1)) for L in layers]  # lhs: optional (1)
  lower_plat = "cuda" if plat == "gpu" else plat
  impls = (["lax"] if with_lax else []) + [f for f in families if f != algorithms.AUTO]
  if algorithms.AUTO in families:
    impls.append(algorithms.AUTO)
  if plat == "gpu" and torch_available():
    impls.append("torch")
  bar = _Progress(len(dtypes) * len(layers) * len(ops) * len(impls), progress)
  rows, done = [], {}
  rng = np.random.default_rng(0)
  try:
    for dname in dtypes:
      dtype, precision = DTYPES[dname]
      mprec = algorithms.MathPrecision(int(precision.value))
      for L in layers:
        x_shape, w_shape, y_shape, flops = layer_shapes(L)
        geometry = layer_geometry(L)
        base = dict(dtype=dname, layer=L["name"], **{f: L[f] for f in LAYER_FIELDS},
                    gflop="%.3g" % (flops / 1e9))
        shape_key = (dname, *(L[f] for f in LAYER_FIELDS))
        operands = None  # made on first use: layers whose every result is cached need none
        for op in ops:
          for impl in impls:
            name = getattr(impl, "name", impl)
            bar.step(f"{dname} {L['name']} {op} {name}")
            key = (*shape_key, op, name)
            if stop_at is not None and time.monotonic() > stop_at:
              print(f"time limit reached: stopping before {dname} {L['name']} {op} {name}",
                    flush=True)
              return rows
            if key in done:
              rows.append(dict(done[key], **base))
              continue
            row = dict(base, op=op, impl=name, ms="", tflops="", workspace_mb="", note="",
                       reason="")
            if impl == algorithms.AUTO:
              # what jaxdnn.conv runs by default: the family auto picks, timed once (shared
              # with that family's column when it is measured too)
              try:
                pick = algorithms.choose_algorithm(lower_plat, OPS[op], impl, geometry, L["N"],
                                                   L["C"], L["K"], dtype, dtype, mprec)
              except ValueError as e:
                row.update(note=NOT_SUPPORTED, reason=str(e))
              else:
                picked = done.get((*shape_key, op, pick.name))
                if picked is not None and picked["ms"]:
                  row.update({f: picked[f] for f in ("ms", "tflops", "workspace_mb")}, note=pick.name)
                  done[key] = row
                  rows.append(row)
                  bar.write(_row_line(row))
                  continue
                row.update(note=pick.name, workspace_mb="%.3g" % (algorithms.workspace_bytes(
                    lower_plat, OPS[op], pick, geometry, L["N"], L["C"], L["K"], dtype, dtype,
                    mprec) / 2**20))
            elif impl not in ("lax", "torch"):
              why = algorithms.unsupported_reason(lower_plat, OPS[op], impl, geometry, L["N"],
                                                  L["C"], L["K"], dtype, dtype, mprec)
              if why:
                row.update(note=NOT_SUPPORTED, reason=why)
              else:
                row["workspace_mb"] = "%.3g" % (algorithms.workspace_bytes(
                    lower_plat, OPS[op], impl, geometry, L["N"], L["C"], L["K"], dtype, dtype,
                    mprec) / 2**20)
            if row["note"] != NOT_SUPPORTED:
              try:
                if impl == "torch":
                  t = torch_time(L, op, dname, k_ops, repeats) * 1e-3
                else:
                  if operands is None:
                    mk = lambda shape: [jnp.asarray(rng.standard_normal(shape), dtype)
                                        for _ in range(k_ops)]
                    xs, ws, dys = mk(x_shape), mk(w_shape), mk(y_shape)
                    operands = {"fwd": (xs, ws), "dgrad": (dys, ws), "wgrad": (xs, dys)}
                  fn = op_fn(L, impl, op, precision, x_shape, w_shape, dtype)
                  t = time_call(fn, operands[op], repeats, budget, inner) / k_ops
                row.update(ms="%.5g" % (t * 1e3), tflops="%.4g" % (flops / t / 1e12))
              except Exception as e:  # report, keep going
                msg = str(e).splitlines()[0][:200] if str(e) else ""
                row.update(note="error", reason=f"{type(e).__name__}: {msg}")
            done[key] = row
            rows.append(row)
            bar.write(_row_line(row))
  finally:
    bar.close()
  return rows


def _row_line(r) -> str:
  head = f"{r['dtype']:5} {r['layer']:16} {r['op']:6} {r['impl']:22}"
  if r["ms"]:
    ws = f"  ws {r['workspace_mb']} MB" if r["workspace_mb"] else ""
    pick = f"  ({r['note']})" if r["impl"] == algorithms.AUTO else ""
    return f"{head} {float(r['ms']):10.4f} ms {float(r['tflops']):9.4g} TFLOP/s{ws}{pick}"
  return f"{head} {r['note']} ({r['reason']})"


# ---------------------------------------------------------------------------------------------
# Reports.

def _group(rows):
  """{(dtype, layer, op): {impl: row}} in first-seen order, and the implementations in order."""
  keyed, impls = {}, []
  for r in rows:
    keyed.setdefault((r["dtype"], r["layer"], r["op"]), {})[r["impl"]] = r
    if r["impl"] not in impls:
      impls.append(r["impl"])
  return keyed, impls


def fastest_family(by_impl):
  """(family name, ms) of the fastest jaxdnn family among by_impl's rows, or (None, None)."""
  timed = [(float(r["ms"]), impl) for impl, r in by_impl.items()
           if r["ms"] and impl not in ("lax", "torch", algorithms.AUTO)]
  if not timed:
    return None, None
  ms, impl = min(timed)
  return impl, ms


def speedup_over(by_impl, ref, impl):
  """ref's time / impl's time (> 1: impl is faster), or None without both times."""
  a, b = by_impl.get(ref, {}).get("ms"), by_impl.get(impl, {}).get("ms")
  return float(a) / float(b) if a and b else None


def _cell(r) -> str:
  if r is None:
    return ""
  if r["ms"]:
    ws = f" / {r['workspace_mb']}" if r["workspace_mb"] else ""
    pick = f" ({r['note']})" if r["impl"] == algorithms.AUTO else ""
    return f"{float(r['ms']):.3f} / {float(r['tflops']):.3g}{ws}{pick}"
  return r["note"]


def markdown_table(rows, header):
  """The find-style table: one row per (dtype, layer, op), one column per implementation."""
  keyed, impls = _group(rows)
  refs = [i for i in ("lax", "torch") if i in impls]
  fams = [i for i in impls if i not in refs]
  cols = refs + fams
  auto = algorithms.AUTO in impls and "lax" in refs  # its own speedup column
  lines = [f"<!-- {header} -->", "",
           "| dtype | layer | op | GFLOP | " + " | ".join(cols)
           + " | fastest family | vs lax" + (" | vs torch" if "torch" in refs else "")
           + (" | auto vs lax" if auto else "") + " |",
           "|---" * (len(cols) + 6 + ("torch" in refs) + auto) + "|"]
  speedups, auto_speedups = {}, {}
  for (dtype, layer, op), by_impl in keyed.items():
    best, _ = fastest_family(by_impl)
    gflop = next(iter(by_impl.values()))["gflop"]
    cells = [_cell(by_impl.get(i)) for i in cols]
    if best:
      cells[cols.index(best)] = f"**{cells[cols.index(best)]}**"
    vs_lax = speedup_over(by_impl, "lax", best) if best else None
    if vs_lax:
      speedups.setdefault((dtype, op), []).append(vs_lax)
    tail = [best or "", f"{vs_lax:.2f}x" if vs_lax else ""]
    if "torch" in refs:
      vs_torch = speedup_over(by_impl, "torch", best) if best else None
      tail.append(f"{vs_torch:.2f}x" if vs_torch else "")
    if auto:
      auto_vs_lax = speedup_over(by_impl, "lax", algorithms.AUTO)
      if auto_vs_lax:
        auto_speedups.setdefault((dtype, op), []).append(auto_vs_lax)
      tail.append(f"{auto_vs_lax:.2f}x" if auto_vs_lax else "")
    lines.append(f"| {dtype} | {layer} | {op} | {gflop} | " + " | ".join(cells + tail) + " |")
  lines.append("")
  lines.append("Cells: ms per convolution / TFLOP/s / workspace MB (jaxdnn families); the fastest "
               "family in bold. 'vs lax': lax time / fastest family time (> 1: jaxdnn is "
               "faster). Reasons for 'not supported' are in the CSV."
               + (" auto: what jaxdnn.conv runs by default (the family it picks in brackets; "
                  "'auto vs lax': lax time / auto time)." if auto else ""))
  for what, table in (("the fastest family", speedups), ("auto", auto_speedups)):
    if table:
      lines.append("")
      lines.append(f"Geometric-mean speedup of {what} over lax: " + ", ".join(
          f"{d} {o} {math.exp(statistics.fmean(map(math.log, v))):.2f}x ({len(v)} layers)"
          for (d, o), v in table.items()))
  return "\n".join(lines) + "\n"


def write_csv(rows, path):
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(CSV_FIELDS))
    writer.writeheader()
    writer.writerows(rows)


def plot(rows, prefix, title=""):
  """PREFIX-time.png (ms per implementation per layer, log scale) and PREFIX-speedup.png (lax
  time / time, per family and torch; bars up from 1 are faster than lax). Returns the paths."""
  from matplotlib import ticker
  from matplotlib.figure import Figure  # no pyplot: no global backend state, renders with Agg

  keyed, impls = _group(rows)
  panels = list(dict.fromkeys((d, o) for d, _, o in keyed))
  layers = list(dict.fromkeys(layer for _, layer, _ in keyed))
  timed = [i for i in impls if any(by.get(i, {}).get("ms") for by in keyed.values())]
  versus = [i for i in timed if i != "lax"]
  color = {impl: f"C{i % 10}" for i, impl in enumerate(timed)}
  x = np.arange(len(layers))
  label = ticker.FuncFormatter(lambda v, _: f"{v:g}")
  paths = []
  for kind, shown in (("time", timed), ("speedup", versus)):
    fig = Figure(figsize=(max(6.0, 0.45 * len(layers) + 2), 3.0 * len(panels) + 1.2),
                 layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (dtype, op) in zip(axes, panels):
      by_layer = [keyed.get((dtype, layer, op), {}) for layer in layers]
      if kind == "time":
        for impl in shown:
          ys = [float(by[impl]["ms"]) if by.get(impl, {}).get("ms") else np.nan
                for by in by_layer]
          ax.plot(x, ys, "o-" if impl in ("lax", "torch") else "s--", color=color[impl],
                  label=impl, lw=2 if impl == "lax" else 1, ms=4)
        ax.set_ylabel("ms per convolution")
      else:
        bw = 0.8 / max(len(shown), 1)
        for j, impl in enumerate(shown):
          ys = np.array([speedup_over(by, "lax", impl) or np.nan for by in by_layer])
          ax.bar(x - 0.4 + bw * (j + 0.5), ys - 1, bw, bottom=1, color=color[impl], label=impl)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("lax time / time")
      ax.set_yscale("log")
      ax.yaxis.set_major_formatter(label)
      lo, hi = ax.get_ylim()  # label the 2..9 ticks too when fewer than ~1.5 decades show
      ax.yaxis.set_minor_formatter(label if hi < 30 * lo else ticker.NullFormatter())
      ax.tick_params(axis="y", which="minor", labelsize=7)
      ax.set_title(f"{dtype} {op}" + (" speedup over lax.conv" if kind == "speedup" else ""))
      ax.set_xticks(x, layers, rotation=60, ha="right", fontsize=8)
      ax.grid(True, which="both", axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
      fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 5),
                 fontsize=7)
    if title:
      fig.suptitle(textwrap.fill(title, 110), fontsize=7)
    path = f"{prefix}-{kind}.png"
    fig.savefig(path, dpi=110)
    paths.append(path)
  return paths


# ---------------------------------------------------------------------------------------------
# Command line.

def _parser():
  ap = argparse.ArgumentParser(
      prog="jaxdnn-bench", description=__doc__.split("\n")[0],
      epilog="Layer file lines: name N C H W K R S stride pad groups ('#' comments).")
  src = ap.add_mutually_exclusive_group()
  src.add_argument("--set", choices=SETS, default="resnet",
                   help="built-in layer set: resnet (ResNet-50/VGG/... for the platform, the "
                        "default), sweep (filter size, channel and batch sweeps), tiny")
  src.add_argument("--tiny", dest="set", action="store_const", const="tiny",
                   help="the tiny built-in set (smoke tests); same as --set tiny")
  src.add_argument("--layers", default=None, help="a layer file of your own")
  ap.add_argument("--platform", default=None, help="cpu or gpu (default: jax's default backend)")
  ap.add_argument("--only", default=None, help="comma-separated layer names")
  ap.add_argument("--dtypes", default="fp32", help="comma-separated: " + ", ".join(DTYPES))
  ap.add_argument("--ops", default=",".join(OPS), help="comma-separated: " + ", ".join(OPS))
  ap.add_argument("--algos", default=None,
                  help="comma-separated families (default: all eight, as cuDNN's find lists, "
                       "and auto: the family jaxdnn.conv picks by default); explicit Winograd "
                       "tiles too, e.g. winograd_nonfused_f6x6")
  ap.add_argument("--k", type=int, default=None,
                  help="distinct convs per jitted call (default: 16 on GPU, 2 on CPU)")
  ap.add_argument("--repeats", type=int, default=None,
                  help="timing samples, at most (default: 20 on GPU, 5 on CPU)")
  ap.add_argument("--budget", type=float, default=3.0, help="seconds per measurement, at most")
  ap.add_argument("--time-limit", type=float, default=None,
                  help="stop measuring after this many seconds and report what was measured")
  ap.add_argument("--inner", type=int, default=None,
                  help="calls issued back to back per timing sample (default: 5 on GPU, 1 on CPU)")
  ap.add_argument("--no-lax", action="store_true", help="leave lax.conv out")
  ap.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
  ap.add_argument("--csv", default=None, help="write one row per measurement here")
  ap.add_argument("--markdown", default=None, help="write the markdown table here")
  ap.add_argument("--plot", default=None, metavar="PREFIX",
                  help="write PREFIX-time.png and PREFIX-speedup.png (needs matplotlib)")
  return ap


def _split(value: str, allowed, flag: str) -> list[str]:
  items = [v.strip() for v in value.split(",") if v.strip()]
  bad = [v for v in items if v not in allowed]
  if bad or not items:
    raise SystemExit(f"{flag}: expected a comma-separated subset of {', '.join(allowed)}; "
                     f"got {value!r}")
  return items


def main(argv=None) -> int:
  """Runs the benchmark; 0 when every measurement ran (unsupported families are not failures)."""
  args = _parser().parse_args(argv)
  plat = args.platform or jax.default_backend()
  plat = "gpu" if plat in ("gpu", "cuda") else plat
  dtypes = _split(args.dtypes, DTYPES, "--dtypes")
  ops = _split(args.ops, OPS, "--ops")
  try:
    families = ([algorithms.parse_algo(a) for a in args.algos.split(",")] if args.algos
                else [*jaxdnn.ConvAlgo, algorithms.AUTO])
    layers = select_layers(args, plat)
  except (ValueError, OSError) as e:
    raise SystemExit(str(e)) from None
  if not layers:
    raise SystemExit("no layers to benchmark")
  k_ops = args.k or (16 if plat == "gpu" else 2)
  repeats = args.repeats or (20 if plat == "gpu" else 5)
  inner = args.inner or (5 if plat == "gpu" else 1)
  device = jax.devices()[0].device_kind
  header = (f"device: {device} ({pyplatform.machine()}, {os.cpu_count()} cores), jax "
            f"{jax.__version__}, jaxdnn {jaxdnn.__version__}, date {datetime.date.today()}, "
            f"commit {git_commit()}, K={k_ops} distinct convs per jit, {inner} jit calls back to "
            f"back per sample, median of up to {repeats}")
  print(header, flush=True)
  rows = run_benchmark(layers, plat=plat, dtypes=dtypes, ops=ops, families=families,
                       with_lax=not args.no_lax, k_ops=k_ops, repeats=repeats,
                       budget=args.budget, inner=inner, progress=not args.no_progress,
                       time_limit=args.time_limit)
  if args.csv:
    write_csv(rows, args.csv)
  table = markdown_table(rows, header)
  print(table, flush=True)
  if args.markdown:
    with open(args.markdown, "w") as f:
      f.write(table)
  if args.plot:
    for path in plot(rows, args.plot, header):
      print(f"wrote {path}")
  return 1 if any(r["note"] == "error" for r in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
