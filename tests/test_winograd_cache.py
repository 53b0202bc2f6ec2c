"""The Winograd families' filter-transform cache: U = G w G^T is an XLA value.

A WINOGRAD_NONFUSED (or WINOGRAD) forward or backward-data lowers to two custom calls,
jaxdnn_winograd_filter (w -> U) and the convolution on (x, U), so that XLA's CSE shares one U
between the convolutions of one filter with one tile geometry, and its loop-invariant code motion
hoists U out of while loops whose filter is loop-invariant. Checked on the optimized HLO of the
default backend (CPU in CI; the same tests run on the GPU), with the results against float64 lax.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdnn
from grid import NCHW, NHWC, Case
from helpers import LOWERING_PLATFORM, lax_conv_hi, rand
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvOp
from tolerances import BF16, F16, F32, F64, assert_close, tolerance

WINO = jaxdnn.ConvAlgo.WINOGRAD_NONFUSED
FUSED = jaxdnn.ConvAlgo.WINOGRAD
ALGOS = pytest.mark.parametrize("algo", [WINO, FUSED], ids=lambda a: a.value)
TRANSFORM = "jaxdnn_winograd_filter"
HI = jax.lax.Precision.HIGHEST

CASE = Case("cache", (2, 9, 10, 6), (3, 3, 6, 8), (1, 1), "SAME", dnums=NHWC)


def _conv(algo, case=CASE, **kw):
  return functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo, precision=HI, **kw)


def _ref(case=CASE):
  return functools.partial(lax_conv_hi, **case.kwargs())


# ---------------------------------------------------------------------------------------------
# HLO helpers: custom-call counts and what is inside while bodies.

def _optimized_hlo(fn, *args) -> str:
  return jax.jit(fn).lower(*args).compile().as_text()


def _count(hlo: str, target: str) -> int:
  """Custom calls to `target` in HLO text (optimized) or StableHLO (lowered)."""
  return len(re.findall(rf'custom_call_target="{target}"|custom_call @{target}\b', hlo))


def _computations(hlo: str) -> dict[str, str]:
  """Computation name -> its text (HLO text: `[ENTRY ]%name (...) -> ... {` ... `}`)."""
  comps, name, lines = {}, None, []
  for line in hlo.splitlines():
    m = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if name is None and m:
      name, lines = m.group(1), []
    elif name is not None and line.startswith("}"):
      comps[name] = "\n".join(lines)
      name = None
    elif name is not None:
      lines.append(line)
  return comps


def _called(text: str) -> set[str]:
  names = set()
  for key in ("body", "condition", "to_apply", "calls", "branch_computations"):
    for m in re.finditer(rf"{key}=\{{?([^}},\s]+(?:,\s*%[\w.\-]+)*)\}}?", text):
      names.update(n.strip().lstrip("%") for n in m.group(1).split(","))
  return names


def _transforms_in_loops(hlo: str) -> tuple[int, int]:
  """(transform calls reachable from some while body, while loops in the module)."""
  comps = _computations(hlo)
  bodies = set()
  for text in comps.values():
    bodies.update(m.group(1) for m in re.finditer(r"body=%?([\w.\-]+)", text))
  seen, todo = set(), list(bodies)
  while todo:
    c = todo.pop()
    if c in seen or c not in comps:
      continue
    seen.add(c)
    todo.extend(_called(comps[c]))
  return sum(_count(comps[c], TRANSFORM) for c in seen), len(bodies)


# ---------------------------------------------------------------------------------------------
# CSE: one U per (filter, tile geometry).

@ALGOS
def test_two_convs_of_one_filter_share_one_transform(algo):
  """Two convolutions of the same w in one jit (different inputs, even different image sizes
  with the same tile) get one filter-transform call after XLA's optimizations."""
  conv = _conv(algo)
  x1, w = rand(CASE.lhs, F32, seed=1), rand(CASE.rhs, F32, seed=2)
  x2 = rand((3, 12, 8, 6), F32, seed=3)

  def f(x1, x2, w):
    return jnp.sum(conv(x1, w)) + jnp.sum(conv(x2, w))

  lowered = jax.jit(f).lower(x1, x2, w).as_text()
  assert _count(lowered, TRANSFORM) == 2, "expected one transform per convolution before CSE"
  hlo = _optimized_hlo(f, x1, x2, w)
  assert _count(hlo, TRANSFORM) == 1, hlo
  assert _count(hlo, "jaxdnn_conv_fwd") == 2
  want = jnp.sum(_ref()(x1.astype(F64), w.astype(F64))) + jnp.sum(
      _ref()(x2.astype(F64), w.astype(F64)))
  np.testing.assert_allclose(float(jax.jit(f)(x1, x2, w)), float(want), rtol=1e-5)


def test_weight_tied_layers_share_one_transform():
  """y = conv(relu(conv(x, w)), w): a weight-tied stack has one transform; its gradient w.r.t. x
  needs U of w (forward) and U of the flipped filter (backward-data): two in all."""
  case = Case("tied", (2, 9, 10, 6), (3, 3, 6, 6), (1, 1), "SAME", dnums=NHWC)
  conv = _conv(WINO, case)
  x, w = rand(case.lhs, F32, seed=4), rand(case.rhs, F32, seed=5)
  f = lambda x, w: conv(jax.nn.relu(conv(x, w)), w)
  assert _count(_optimized_hlo(f, x, w), TRANSFORM) == 1
  g = jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2))
  hlo = _optimized_hlo(g, x, w)
  assert _count(hlo, TRANSFORM) == 2, hlo
  ref = _ref(case)
  want = ref(jax.nn.relu(ref(x.astype(F64), w.astype(F64))), w.astype(F64))
  assert_close(jax.jit(f)(x, w), want, tolerance(F32, precision=HI, algo=WINO), "tied")


def test_different_tiles_and_flips_do_not_share():
  """U depends on the tile (F(4x4) for outputs >= 4 on a side, else F(2x2)) and on the flip
  (backward-data's filter): those are different values, never merged."""
  conv = _conv(WINO)
  w = rand(CASE.rhs, F32, seed=2)
  x_big, x_small = rand(CASE.lhs, F32, seed=1), rand((2, 3, 3, 6), F32, seed=3)
  f = lambda a, b, w: (conv(a, w), conv(b, w))
  assert _count(_optimized_hlo(f, x_big, x_small, w), TRANSFORM) == 2
  got = jax.jit(f)(x_big, x_small, w)
  for x, y in zip((x_big, x_small), got):
    assert_close(y, _ref()(x.astype(F64), w.astype(F64)), tolerance(F32, precision=HI, algo=WINO),
                 "tiles")


def test_remat_recompute_transform_count():
  """jax.checkpoint recomputes the forward in the backward pass (the lowered module has three
  transforms: forward, recompute, backward-data's flipped one). With prevent_cse=False the
  recompute's U is the forward's after CSE; with the default prevent_cse=True the optimization
  barrier on the recompute's inputs may keep it apart (on the CPU XLA still ends with two)."""
  conv = _conv(WINO)
  x, w = rand(CASE.lhs, F32, seed=1), rand(CASE.rhs, F32, seed=2)

  def loss(prevent_cse):
    layer = jax.checkpoint(lambda x, w: jnp.tanh(conv(x, w)), prevent_cse=prevent_cse)
    return lambda x, w: jnp.sum(layer(x, w) ** 2)

  assert _count(jax.jit(jax.grad(loss(False))).lower(x, w).as_text(), TRANSFORM) == 3
  # forward U (w) = the recompute's U, and backward-data's U (flipped w).
  assert _count(_optimized_hlo(jax.grad(loss(False)), x, w), TRANSFORM) == 2
  assert _count(_optimized_hlo(jax.grad(loss(True)), x, w), TRANSFORM) in (2, 3)
  g1, g2 = jax.jit(jax.grad(loss(False)))(x, w), jax.jit(jax.grad(loss(True)))(x, w)
  np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Loop-invariant code motion.

@ALGOS
@pytest.mark.parametrize("loop", ["scan", "fori_loop"])
def test_transform_is_hoisted_out_of_loops(algo, loop):
  """x_{t+1} = tanh(conv(x_t, w)) over time steps with a loop-invariant w: on the CPU the transform
  is outside the while body in the optimized HLO (the convolution stays inside)."""
  case = Case("rnn", (2, 8, 8, 6), (3, 3, 6, 6), (1, 1), "SAME", dnums=NHWC)
  conv = _conv(algo, case)
  x, w = rand(case.lhs, F32, seed=6), rand(case.rhs, F32, seed=7) * 0.2
  steps = 5

  if loop == "scan":
    def f(x, w):
      def step(h, _):
        h = jnp.tanh(conv(h, w))
        return h, jnp.sum(h)
      return jax.lax.scan(step, x, None, length=steps)
  else:
    def f(x, w):
      return jax.lax.fori_loop(0, steps, lambda i, h: jnp.tanh(conv(h, w)), x)

  hlo = _optimized_hlo(f, x, w)
  inside, loops = _transforms_in_loops(hlo)
  assert loops >= 1, hlo
  assert _count(hlo, TRANSFORM) == 1, hlo
  if jax.default_backend() == "cpu":
    assert inside == 0, hlo
  # XLA:GPU (jax 0.11.2 on the H200) leaves the transform inside the while body: its loop-invariant
  # code motion does not hoist it (U has 4x the elements of w, and the pass skips size-inflating
  # instructions by default), so there U is recomputed per step; CSE still shares it per step.
  ref = _ref(case)
  h = x.astype(F64)
  for _ in range(steps):
    h = jnp.tanh(ref(h, w.astype(F64)))
  out = jax.jit(f)(x, w)
  got = out[0] if loop == "scan" else out
  assert_close(got, h, tolerance(F32, precision=HI, algo=algo), f"{loop} {algo.name}")


def test_carried_filter_is_not_hoisted():
  """A filter that changes every step (part of the carry) is transformed inside the loop: the
  hoisting is XLA's invariance analysis, not a cache keyed on anything else."""
  conv = _conv(WINO)
  x, w = rand(CASE.lhs, F32, seed=1), rand(CASE.rhs, F32, seed=2) * 0.2

  def f(x, w):
    def step(carry, _):
      h, w = carry
      return (conv(h, w)[..., :6], w * 0.5), None
    return jax.lax.scan(step, (x, w), None, length=3)[0]

  inside, loops = _transforms_in_loops(_optimized_hlo(f, x, w))
  assert loops >= 1 and inside == 1


# ---------------------------------------------------------------------------------------------
# vmap: batching the activation keeps U shared; batching the filter batches the transform.

@ALGOS
def test_vmap_over_x_keeps_one_transform(algo):
  conv = _conv(algo)
  xs, w = rand((3, *CASE.lhs), F32, seed=1), rand(CASE.rhs, F32, seed=2)
  f = lambda xs, w: (jax.vmap(lambda x: conv(x, w))(xs), conv(xs[0], w))
  hlo = _optimized_hlo(f, xs, w)
  assert _count(hlo, TRANSFORM) == 1, hlo
  ys, y0 = jax.jit(f)(xs, w)
  tol = tolerance(F32, precision=HI, algo=algo)
  for i in range(xs.shape[0]):
    assert_close(ys[i], _ref()(xs[i].astype(F64), w.astype(F64)), tol, f"vmap x {i}")
  assert_close(y0, _ref()(xs[0].astype(F64), w.astype(F64)), tol, "unbatched")


@ALGOS
def test_vmap_over_w_batches_the_transform(algo):
  """Filter batched (folded into output channels, both operands into groups): one transform of
  the folded filter, per batch member the right result (forward and backward-data)."""
  conv = _conv(algo)
  x, ws = rand(CASE.lhs, F32, seed=1), rand((4, *CASE.rhs), F32, seed=2)
  xs = rand((4, *CASE.lhs), F32, seed=3)
  tol = tolerance(F32, precision=HI, algo=algo)
  only_w = jax.vmap(lambda w: conv(x, w))
  both = jax.vmap(conv)
  hlo = _optimized_hlo(only_w, ws)
  assert _count(hlo, TRANSFORM) == 1, hlo
  for i, (y, yb) in enumerate(zip(jax.jit(only_w)(ws), jax.jit(both)(xs, ws))):
    assert_close(y, _ref()(x.astype(F64), ws[i].astype(F64)), tol, f"vmap w {i}")
    assert_close(yb, _ref()(xs[i].astype(F64), ws[i].astype(F64)), tol, f"vmap both {i}")
  # backward-data of each batch member (the flipped transform of the folded filter)
  dx = jax.jit(jax.vmap(lambda w: jax.grad(lambda x: jnp.sum(conv(x, w) ** 2))(x)))(ws)
  for i in range(ws.shape[0]):
    want = jax.grad(lambda x: jnp.sum(_ref()(x, ws[i].astype(F64)) ** 2))(x.astype(F64))
    assert_close(dx[i], want, tol, f"vmap w dgrad {i}")


# ---------------------------------------------------------------------------------------------
# Correctness of the split for every dtype, forward and backward-data, both layouts.

DTYPES = [pytest.param(d, id=np.dtype(d).name) for d in (F64, F32, BF16, F16)]


@ALGOS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    CASE,
    Case("nchw-groups2", (2, 4, 7, 9), (6, 2, 3, 3), (1, 1), ((1, 0), (0, 2)), dnums=NCHW, fgc=2),
    Case("small-image-f2", (2, 3, 2, 5), (3, 3, 5, 7), (1, 1), "SAME", dnums=NHWC),
], ids=lambda c: c.id)
def test_forward_and_backward_data_all_dtypes(case, dtype, algo):
  conv = _conv(algo, case)
  x, w = rand(case.lhs, dtype, seed=1), rand(case.rhs, dtype, seed=2)
  y, vjp = jax.vjp(conv, x, w)
  ct = rand(y.shape, dtype, seed=3)
  dx, dw = vjp(ct)
  ref = _ref(case)
  y_ref, vjp_ref = jax.vjp(ref, x.astype(F64), w.astype(F64))
  dx_ref, dw_ref = vjp_ref(ct.astype(F64))
  tol = tolerance(dtype, precision=HI, algo=algo)
  for name, a, b in (("forward", y, y_ref), ("backward-data", dx, dx_ref),
                     ("backward-filter", dw, dw_ref)):
    assert a.dtype == dtype
    assert_close(a, b, tol, f"{case.id} {algo.name} {name}")


def test_preferred_element_type_float32_from_bfloat16():
  """16-bit operands with a float32 result: U is float32 and shared."""
  conv = _conv(WINO, preferred_element_type=F32)
  x, w = rand(CASE.lhs, BF16, seed=1), rand(CASE.rhs, BF16, seed=2)
  y = jax.jit(conv)(x, w)
  assert y.dtype == F32
  assert_close(y, _ref()(x.astype(F64), w.astype(F64)),
               tolerance(BF16, F32, precision=HI, algo=WINO),
               "bf16->f32")


# ---------------------------------------------------------------------------------------------
# Trace-time queries, workspace and errors.

def _geometry_and_sizes():
  x, w = jnp.zeros(CASE.lhs, F32), jnp.zeros(CASE.rhs, F32)
  from helpers import problems
  fn = jax.grad(lambda x, w: jnp.sum(_conv(WINO)(x, w) ** 2), argnums=(0, 1))
  return {op: (g, n, c, k) for op, g, n, c, k, *_ in problems(fn, x, w)}


@pytest.mark.parametrize("dtype", [F32, F64, BF16], ids=lambda d: np.dtype(d).name)
@ALGOS
def test_filter_shape_query_and_workspace(algo, dtype):
  """winograd_filter_shape gives (tile, dims) for forward and backward-data only, U in the
  compute type; the convolution's workspace no longer holds U (the fused family's forward needs
  none beyond alignment on the CPU)."""
  probs = _geometry_and_sizes()
  kout = dtype
  for op, (g, n, c, k) in probs.items():
    spec = algorithms.winograd_filter_shape(LOWERING_PLATFORM, op, algo, g, n, c, k, dtype,
                                            kout, algorithms.MathPrecision.HIGHEST)
    if op == ConvOp.BACKWARD_FILTER:
      assert spec is None
      continue
    tile, dims = spec
    cin, cout = (c, k) if op == ConvOp.FORWARD else (k, c)
    # The fused family: F(2x2) on the CPU; on CUDA the tensor-core F(4x4) kernel where it runs
    # (32/16-bit channels-last operands, pass input channels per group a multiple of 8: here the
    # backward-data pass, whose input is dy with 8 channels), else F(2x2).
    fused_tile = 4 if (LOWERING_PLATFORM == "cuda" and dtype != F64
                       and (cin // g.groups) % 8 == 0) else 2
    assert tile == (fused_tile if algo == FUSED else 4)
    assert dims[0] == (tile + 2) ** 2 and dims[1] == g.groups
    assert dims[2] >= cin // g.groups and dims[3] >= cout // g.groups
    ws = algorithms.workspace_bytes(LOWERING_PLATFORM, op, algo, g, n, c, k, dtype, kout,
                                    algorithms.MathPrecision.HIGHEST)
    u_bytes = int(np.prod(dims)) * (8 if dtype == F64 else 4)
    if algo == FUSED and LOWERING_PLATFORM == "cpu":
      # only the 16-bit operand widening of x (and the result) and the alignment slack
      assert ws <= 64 + 2 * 4 * n * max(c, k) * int(np.prod(g.in_spatial)) + 64 * 3
    if LOWERING_PLATFORM == "cuda" and algo == FUSED:
      assert ws == 0
    assert ws < u_bytes + 10 ** 9  # sanity
  for fam in (jaxdnn.ConvAlgo.DIRECT, jaxdnn.ConvAlgo.GEMM):
    g, n, c, k = probs[ConvOp.FORWARD]
    assert algorithms.winograd_filter_shape(LOWERING_PLATFORM, ConvOp.FORWARD, fam, g, n, c, k,
                                            dtype, kout, algorithms.MathPrecision.HIGHEST) is None


def _direct_call(target, out_shape, out_dtype, *args, **attrs):
  call = jax.ffi.ffi_call(target, (jax.ShapeDtypeStruct(out_shape, out_dtype),
                                   jax.ShapeDtypeStruct((1 << 20,), np.uint8)))
  return jax.block_until_ready(jax.jit(lambda *a: call(*a, **attrs)[0])(*args))


def test_convolution_refuses_a_raw_filter_and_a_wrong_u():
  """The Winograd forward takes U: a raw w (or a U of the wrong tile) is a clear error."""
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, CASE.lhs[1:3], (3, 3), (1, 1), (1, 1), (1, 1),
                          (1, 1), (1, 1))
  x, w = rand(CASE.lhs, F32, seed=1), rand(CASE.rhs, F32, seed=2)
  y_shape = (*CASE.lhs[:3], CASE.rhs[-1])
  attrs = dict(algo=np.int32(WINO.id), precision=np.int32(2), **g.ffi_attributes())
  with pytest.raises(Exception, match="jaxdnn convolution: .*takes the transformed filter U|"
                                      "transformed filter U has dims"):
    _direct_call("jaxdnn_conv_fwd", y_shape, F32, x, w, **attrs)
  u2 = jax.ffi.ffi_call(TRANSFORM, jax.ShapeDtypeStruct(
      algorithms.winograd_filter_shape(LOWERING_PLATFORM, ConvOp.FORWARD, FUSED, g, 2, 6, 8, F32,
                                       F32, algorithms.MathPrecision.HIGHEST)[1], F32))
  u_tile2 = jax.jit(lambda w: u2(w, layout=np.int32(0), groups=np.int64(1), tile=np.int32(2),
                                 flip=np.int32(0)))(w)
  with pytest.raises(Exception, match=r"transformed filter U has dims \(16, .*expected \(36, "):
    _direct_call("jaxdnn_conv_fwd", y_shape, F32, x, u_tile2, **attrs)


def test_transform_call_refuses_bad_attributes():
  w = rand(CASE.rhs, F32, seed=2)
  spec = algorithms.winograd_filter_shape(
      LOWERING_PLATFORM, ConvOp.FORWARD, WINO, jaxdnn.ConvGeometry(
          jaxdnn.Layout.NHWC, CASE.lhs[1:3], (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1)),
      2, 6, 8, F32, F32, algorithms.MathPrecision.HIGHEST)
  call = jax.ffi.ffi_call(TRANSFORM, jax.ShapeDtypeStruct(spec[1], F32))
  run = lambda **attrs: jax.block_until_ready(jax.jit(lambda w: call(w, **attrs))(w))
  base = dict(layout=np.int32(0), groups=np.int64(1), tile=np.int32(4), flip=np.int32(0))
  with pytest.raises(Exception, match="tile must be 2, 4 or 6"):
    run(**{**base, "tile": np.int32(3)})
  with pytest.raises(Exception, match="U has the wrong dims"):
    run(**{**base, "tile": np.int32(2)})
  with pytest.raises(Exception, match="3x3"):
    w5 = rand((5, 5, 6, 8), F32)
    jax.block_until_ready(jax.jit(lambda w: call(w, **base))(w5))
