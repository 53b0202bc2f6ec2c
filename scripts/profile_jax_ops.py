"""Which GPU kernels one jitted call runs, for ops whose JAX-harness time sits above their
kernel-only time (activations, pooling, fused conv). Each function is compiled and warmed up,
then called once between two `marker` kernels; run it under Nsight Compute:

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        python3 scripts/profile_jax_ops.py > ops.csv

and read the launches between consecutive markers (an XLA copy or transpose next to a jaxdnn
kernel shows as an extra launch)."""

import os

import jax
import jax.numpy as jnp
import numpy as np

import jaxdnn

rng = np.random.default_rng(0)
bf16 = jnp.bfloat16
x_act = jnp.asarray(rng.standard_normal((32, 112, 112, 64)), bf16)
x_pool = x_act
x_conv = jnp.asarray(rng.standard_normal((32, 28, 28, 128)), bf16)
w_conv = jnp.asarray(rng.standard_normal((3, 3, 128, 128)) * 0.05, bf16)
b_conv = jnp.asarray(rng.standard_normal((128,)), bf16)
conv_kw = dict(window_strides=(1, 1), padding=[(1, 1), (1, 1)],
               dimension_numbers=("NHWC", "HWIO", "NHWC"), algo="IMPLICIT_PRECOMP_GEMM")

CASES = {
    "jaxdnn.relu": (lambda x: jaxdnn.relu(x), (x_act,)),
    "jax.nn.relu": (lambda x: jax.nn.relu(x), (x_act,)),
    "jaxdnn.gelu": (lambda x: jaxdnn.gelu(x, approximate=False), (x_act,)),
    "jaxdnn.relu bwd": (lambda x, g: jax.vjp(jaxdnn.relu, x)[1](g), (x_act, x_act)),
    "jaxdnn.max_pool": (lambda x: jaxdnn.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1))),
                        (x_pool,)),
    "jaxdnn.max_pool bwd": (lambda x: jax.grad(lambda x: jaxdnn.max_pool(
        x, (3, 3), (2, 2), ((1, 1), (1, 1))).astype(jnp.float32).sum())(x), (x_pool,)),
    "jaxdnn.conv plain": (lambda x, w, b: jaxdnn.conv(x, w, **conv_kw), (x_conv, w_conv, b_conv)),
    "jaxdnn.conv fused": (lambda x, w, b: jaxdnn.conv(x, w, **conv_kw, bias=b, activation="relu"),
                          (x_conv, w_conv, b_conv)),
}
# Forward + VJP of the fused conv + bias + relu against the unfused sequence (fused_bench.py's
# f+b columns), r50_c2_3x3 in bf16.
x_fb = jnp.asarray(rng.standard_normal((32, 56, 56, 64)), bf16)
w_fb = jnp.asarray(rng.standard_normal((3, 3, 64, 64)) * 0.05, bf16)
b_fb = jnp.asarray(rng.standard_normal((64,)), bf16)
ct_fb = jnp.asarray(rng.standard_normal((32, 56, 56, 64)), bf16)


def _fwd_bwd(f):
  def run(x, w, b, ct):
    y, vjp = jax.vjp(f, x, w, b)
    return y, vjp(ct)
  return run


CASES["conv f+b fused"] = (
    _fwd_bwd(lambda x, w, b: jaxdnn.conv(x, w, **conv_kw, bias=b, activation="relu")),
    (x_fb, w_fb, b_fb, ct_fb))
CASES["conv f+b unfused"] = (
    _fwd_bwd(lambda x, w, b: jax.nn.relu(jaxdnn.conv(x, w, **conv_kw) + b)),
    (x_fb, w_fb, b_fb, ct_fb))
# The Winograd families in float32 at HIGHEST precision (#4's bar), r50_c3_3x3: the filter
# transform call and the transforms / products kernels of one convolution.
x_w32 = jnp.asarray(rng.standard_normal((32, 28, 28, 128)), jnp.float32)
w_w32 = jnp.asarray(rng.standard_normal((3, 3, 128, 128)) * 0.05, jnp.float32)
for algo in ("winograd_nonfused", "winograd"):
  CASES[f"conv fp32 {algo}"] = (
      lambda x, w, algo=algo: jaxdnn.conv(x, w, **{**conv_kw, "algo": algo},
                                          precision=jax.lax.Precision.HIGHEST),
      (x_w32, w_w32))
# DIRECT depthwise (mnv2_dw_3x3), plain against the fused bias + relu forward.
x_dw = jnp.asarray(rng.standard_normal((32, 56, 56, 144)), bf16)
w_dw = jnp.asarray(rng.standard_normal((3, 3, 1, 144)) * 0.1, bf16)
b_dw = jnp.asarray(rng.standard_normal((144,)), bf16)
dw_kw = {**conv_kw, "algo": "direct", "feature_group_count": 144}
CASES["conv dws plain"] = (lambda x, w, b: jaxdnn.conv(x, w, **dw_kw), (x_dw, w_dw, b_dw))
CASES["conv dws fused"] = (lambda x, w, b: jaxdnn.conv(x, w, **dw_kw, bias=b, activation="relu"),
                           (x_dw, w_dw, b_dw))
if os.environ.get("PROFILE_CASES"):  # comma-separated substrings of the case names
  keep = os.environ["PROFILE_CASES"].split(",")
  CASES = {k: v for k, v in CASES.items() if any(t in k for t in keep)}
marker = jax.jit(lambda v: v * 3 + 1)  # a one-block XLA fusion kernel between cases
m = jnp.ones((8,), jnp.float32)
fns = {name: jax.jit(fn) for name, (fn, _) in CASES.items()}
for name, (_, args) in CASES.items():  # compile and warm up everything first
  jax.block_until_ready(fns[name](*args))
  jax.block_until_ready(fns[name](*args))
jax.block_until_ready(marker(m))
for name, (_, args) in CASES.items():
  print("CASE", name, flush=True)
  jax.block_until_ready(marker(m))
  jax.block_until_ready(fns[name](*args))
jax.block_until_ready(marker(m))
print("ORDER", list(CASES), flush=True)
