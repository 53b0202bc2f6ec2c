"""Fused conv + bias + activation (+ residual) against the same family's plain conv, and forward
plus backward of the fused op against the unfused jaxdnn sequence (conv, then jnp bias and the
jax.nn activation). --activation picks it (default relu).

Per layer of layers-cpu.txt (NHWC, float32; on a GPU layers-gpu.txt in bfloat16; the family `auto` picks for the fused op, or
--algo): K independent applications (distinct random inputs) inside one jitted function that
returns every output; median over repeats of the call time, divided by K (jaxdnn.bench.time_call).
The variants are measured interleaved, --rounds times, and each keeps its best median: on a
shared machine a burst of load then hits every variant alike instead of one.

  plain       conv(x, w)
  fused       conv(x, w, bias=b, activation="relu")                      one kernel pass
  fused+res   conv(x, w, bias=b, residual=r, activation="relu")
  unfused     relu(conv(x, w) + b [+ r])   (XLA fuses the bias / residual / activation into one pass)
  f+b         forward and the VJP to x, w, b (and r): fused vs unfused

    python benchmarks/fused_bench.py [--only r50_c2_3x3,...] [--k 2] [--repeats 10]
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

import jaxdnn
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvOp
from jaxdnn.bench import layer_geometry, layer_shapes, read_layers, time_call

DN = ("NHWC", "HWIO", "NHWC")
# --activation: jaxdnn's name -> the jax.nn function of the unfused sequence
JAX_ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": lambda v: jax.nn.gelu(v, approximate=False),
    "gelu_tanh": jax.nn.gelu,
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}
DEFAULT_LAYERS = ("r50_c2_3x3", "r50_c2_1x1_up", "r50_c3_3x3_s2", "r50_c4_3x3", "r50_c5_1x1",
                  "mnv2_dw_3x3")


def _fns(L, algo, act):
  kw = dict(window_strides=(L["stride"],) * 2, padding=[(L["pad"], L["pad"])] * 2,
            dimension_numbers=DN, feature_group_count=L["groups"], algo=algo)
  plain = lambda x, w, b, r: jaxdnn.conv(x, w, **kw)
  f = JAX_ACTIVATIONS[act]
  fused = lambda x, w, b, r: jaxdnn.conv(x, w, **kw, bias=b, activation=act)
  fused_res = lambda x, w, b, r: jaxdnn.conv(x, w, **kw, bias=b, residual=r, activation=act)
  unfused = lambda x, w, b, r: f(jaxdnn.conv(x, w, **kw) + b)
  unfused_res = lambda x, w, b, r: f(jaxdnn.conv(x, w, **kw) + b + r)
  return dict(plain=plain, fused=fused, fused_res=fused_res, unfused=unfused,
              unfused_res=unfused_res)


def _forward(fn):
  return jax.jit(lambda xs, ws, bs, rs: [fn(*a) for a in zip(xs, ws, bs, rs)])


def _fwd_bwd(fn, with_residual):
  def one(x, w, b, r, ct):
    if with_residual:
      y, vjp = jax.vjp(fn, x, w, b, r)
      return y, vjp(ct)
    y, vjp = jax.vjp(lambda x, w, b: fn(x, w, b, r), x, w, b)
    return y, vjp(ct)
  return jax.jit(lambda xs, ws, bs, rs, cts: [one(*a) for a in zip(xs, ws, bs, rs, cts)])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", default=None,
                      help="layer file (default: layers-cpu.txt, or layers-gpu.txt on a GPU)")
  parser.add_argument("--dtype", default=None, help="default: float32 on cpu, bfloat16 on gpu")
  parser.add_argument("--only", default=",".join(DEFAULT_LAYERS))
  parser.add_argument("--algo", default="auto")
  parser.add_argument("--activation", default="relu", choices=sorted(JAX_ACTIVATIONS))
  parser.add_argument("--k", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--budget", type=float, default=4.0, help="seconds per measurement")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--inner", type=int, default=None,
                      help="calls issued back to back per sample, so that asynchronous dispatch "
                      "hides the host's per-call latency (default: 1 on the CPU, 10 on a GPU)")
  args = parser.parse_args()
  gpu = jax.default_backend() == "gpu"
  inner = args.inner or (10 if gpu else 1)
  platform = "cuda" if gpu else "cpu"
  layers_file = args.layers or os.path.join(os.path.dirname(__file__),
                                            "layers-gpu.txt" if gpu else "layers-cpu.txt")
  keep = set(args.only.split(","))
  layers = [L for L in read_layers(layers_file) if L["name"] in keep]
  dtype = np.dtype(args.dtype or ("bfloat16" if gpu else "float32"))
  rng = np.random.default_rng(0)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} host cores, "
        f"jaxdnn threads {jaxdnn._src.ffi.load_cpu_extension().num_threads()}, {dtype} NHWC, "
        f"K={args.k}, activation {args.activation}, {inner} calls per sample, best of {args.rounds} interleaved rounds of a median of up to "
        f"{args.repeats}, load average {os.getloadavg()[0]:.1f}")
  print("| layer | family | plain ms | fused ms | fused/plain | fused+res ms | fused+res/plain "
        "| unfused ms | unfused+res ms | f+b fused ms | f+b unfused ms | unfused/fused | "
        "f+b+res fused ms | f+b+res unfused ms | unfused/fused |")
  print("|---" * 15 + "|")
  for L in layers:
    x_shape, w_shape, y_shape, _ = layer_shapes(L)
    g = layer_geometry(L)
    algo = algorithms.parse_algo(args.algo)
    if algo == "auto":
      algo = algorithms.choose_algorithm(platform, ConvOp.FORWARD, "auto", g, L["N"], L["C"],
                                         L["K"], dtype, dtype, jaxdnn.MathPrecision.DEFAULT,
                                         fused=True)
    k = args.k
    mk = lambda shape, scale=1.0: [jnp.asarray(scale * rng.standard_normal(shape), dtype)
                                   for _ in range(k)]
    fan_in = L["R"] * L["S"] * L["C"] // L["groups"]
    xs, ws = mk(x_shape), mk(w_shape, 1 / np.sqrt(fan_in))
    bs, rs, cts = mk((L["K"],)), mk(y_shape), mk(y_shape)
    fns = _fns(L, algo, args.activation)
    calls = {}
    for name in ("plain", "fused", "fused_res", "unfused", "unfused_res"):
      calls[name] = (_forward(fns[name]), (xs, ws, bs, rs))
    for name in ("fused", "unfused"):
      calls["fb_" + name] = (_fwd_bwd(fns[name], False), (xs, ws, bs, rs, cts))
      calls["fbr_" + name] = (_fwd_bwd(fns[name + "_res"], True), (xs, ws, bs, rs, cts))
    t = {}
    for _ in range(args.rounds):
      for name, (fn, fargs) in calls.items():
        t[name] = min(t.get(name, np.inf), time_call(fn, fargs, args.repeats, args.budget, inner) / k)
    ms = {n: 1e3 * v for n, v in t.items()}
    print(f"| {L['name']} | {algo.name} | {ms['plain']:.3f} | {ms['fused']:.3f} | "
          f"{t['fused'] / t['plain']:.2f}x | {ms['fused_res']:.3f} | "
          f"{t['fused_res'] / t['plain']:.2f}x | {ms['unfused']:.3f} | {ms['unfused_res']:.3f} | "
          f"{ms['fb_fused']:.3f} | {ms['fb_unfused']:.3f} | "
          f"{t['fb_unfused'] / t['fb_fused']:.2f}x | {ms['fbr_fused']:.3f} | "
          f"{ms['fbr_unfused']:.3f} | {t['fbr_unfused'] / t['fbr_fused']:.2f}x |", flush=True)


if __name__ == "__main__":
  main()
