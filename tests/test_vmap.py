"""vmap of jaxdnn.conv and of its derivatives, in every operand-batching combination."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import pytest

import jaxdnn
from grid import NCHW, NCW, NHWC, Case
from helpers import algo_params, count_primitives, lax_conv_hi, rand, require_supported
from tolerances import F64, assert_close, tolerance

TOL = tolerance(F64)
B = 3

VMAP_CASES = [
    Case("nhwc", (2, 5, 5, 3), (3, 3, 3, 4), (1, 1), "SAME", dnums=NHWC),
    Case("nchw-groups2-stride2", (2, 4, 6, 5), (6, 2, 3, 3), (2, 2), "SAME", dnums=NCHW, fgc=2),
    Case("nhwc-depthwise-x2", (1, 5, 4, 3), (3, 3, 1, 6), (1, 1), "SAME", dnums=NHWC, fgc=3),
    Case("odd-layout-lhs-dilation", (5, 2, 4, 3), (2, 3, 3, 2), (1, 1), ((1, 1), (0, 2)),
         lhs_dilation=(2, 1), dnums=("HNWC", "HWIO", "NCHW")),
    Case("1d-ncw-batch-groups2", (4, 2, 7), (4, 2, 3), (1,), "SAME", dnums=NCW, bgc=2),
]
VMAP_PARAMS = [pytest.param(c, id=c.id) for c in VMAP_CASES]

# (id, in_axes for (x, w)); None = not batched; -1 = last axis.
COMBOS = [
    ("lhs@0", (0, None)),
    ("lhs@2", (2, None)),
    ("rhs@0", (None, 0)),
    ("rhs@last", (None, -1)),
    ("both@0,0", (0, 0)),
    ("both@1,last", (1, -1)),
]
COMBO_PARAMS = [pytest.param(axes, id=name) for name, axes in COMBOS]


def _batched(arr_shape, axis, size, seed):
  """A (size, ...) stack moved to `axis`, and the list of its members."""
  stacked = rand((size, *arr_shape), F64, seed=seed)
  members = [stacked[i] for i in range(size)]
  if axis is None:
    return members[0], None
  return jnp.moveaxis(stacked, 0, axis), members


def _member(arr, axis, i):
  return arr if axis is None else jnp.take(arr, i, axis=axis)


def _conv(case, algo):
  return functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo)


def _ref(case):
  return functools.partial(lax_conv_hi, **case.kwargs())


CONV_TARGETS = ("jaxdnn_conv_fwd", "jaxdnn_conv_bwd_data", "jaxdnn_conv_bwd_filter")


def _compiled_count(fn, *args):
  """The jaxdnn convolution custom calls of fn's compiled HLO (a transposed convolution may run
  as another operation's target: algorithms.lhs_dilation_mapping)."""
  text = jax.jit(fn).lower(*args).compile().as_text()
  return sum(text.count(f'custom_call_target="{t}"') for t in CONV_TARGETS), text


@pytest.mark.parametrize("case", VMAP_PARAMS)
@pytest.mark.parametrize("in_axes", COMBO_PARAMS)
@algo_params
def test_vmap_forward(case, in_axes, algo):
  ax, aw = in_axes
  x, _ = _batched(case.lhs, ax, B, seed=1)
  w, _ = _batched(case.rhs, aw, B, seed=2)
  f = jax.vmap(_conv(case, algo), in_axes=in_axes)
  require_supported(algo, f, x, w)
  y = f(x, w)
  want = jnp.stack([_ref(case)(_member(x, ax, i), _member(w, aw, i)) for i in range(B)])
  assert y.dtype == want.dtype
  assert_close(y, want, TOL, "vmap forward")
  # One batched primitive, one custom call: no loop over the batch.
  assert count_primitives(f, x, w)["jaxdnn_conv_forward"] == 1
  n, text = _compiled_count(f, x, w)
  assert n == 1, text
  assert " while(" not in text and "while" not in text.split("ENTRY")[-1]


@pytest.mark.parametrize("in_axes", COMBO_PARAMS)
@algo_params
def test_vmap_forward_out_axes(in_axes, algo):
  case = VMAP_CASES[1]
  ax, aw = in_axes
  x, _ = _batched(case.lhs, ax, B, seed=3)
  w, _ = _batched(case.rhs, aw, B, seed=4)
  f = jax.vmap(_conv(case, algo), in_axes=in_axes, out_axes=2)
  require_supported(algo, f, x, w)
  want = jax.vmap(_ref(case), in_axes=in_axes, out_axes=2)(x, w)
  assert_close(f(x, w), want, TOL, "vmap out_axes=2")


@pytest.mark.parametrize("case", VMAP_PARAMS[:3])
@pytest.mark.parametrize("in_axes", [pytest.param((0, None), id="lhs"),
                                     pytest.param((None, 0), id="rhs"),
                                     pytest.param((0, 0), id="both")])
@pytest.mark.parametrize("algo", ["auto", jaxdnn.ConvAlgo.DIRECT, jaxdnn.ConvAlgo.GEMM],
                         ids=lambda a: a if isinstance(a, str) else a.value)
def test_vmap_batch_size_zero(case, in_axes, algo):
  ax, aw = in_axes
  x = jnp.zeros((0, *case.lhs) if ax is not None else case.lhs, F64)
  w = jnp.zeros((0, *case.rhs) if aw is not None else case.rhs, F64)
  y = jax.vmap(_conv(case, algo), in_axes=in_axes)(x, w)
  want = jax.eval_shape(jax.vmap(_ref(case), in_axes=in_axes), x, w)
  assert y.shape == want.shape and y.dtype == want.dtype
  # And its derivatives (per-example gradients: both come out batched).
  def grads(conv):
    return jax.vmap(jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1)),
                    in_axes=in_axes)

  dx, dw = grads(_conv(case, algo))(x, w)
  want_dx, want_dw = jax.eval_shape(grads(_ref(case)), x, w)
  assert dx.shape == want_dx.shape == (0, *case.lhs)
  assert dw.shape == want_dw.shape == (0, *case.rhs)
  assert dx.dtype == dw.dtype == jnp.float64


def test_nested_vmap():
  case = VMAP_CASES[1]
  x = rand((2, 3, *case.lhs), F64, seed=5)
  w = rand((2, *case.rhs), F64, seed=6)
  f = jax.vmap(jax.vmap(_conv(case, "auto"), in_axes=(0, None)), in_axes=(0, 0))
  g = jax.vmap(jax.vmap(_ref(case), in_axes=(0, None)), in_axes=(0, 0))
  assert_close(f(x, w), g(x, w), TOL, "nested vmap")
  assert count_primitives(f, x, w)["jaxdnn_conv_forward"] == 1


# ---------------------------------------------------------------------------------------------
# vmap of the derivatives: batches D and W in all their operand combinations.

GRAD_COMBOS = [c for r in (1, 2, 3) for c in itertools.combinations(("x", "w", "ct"), r)]


def _vjp(conv):
  def f(x, w, ct):
    _, vjp = jax.vjp(conv, x, w)
    return vjp(ct)
  return f


def _vjp_inputs(case, batched):
  y_shape = jax.eval_shape(_ref(case), jnp.zeros(case.lhs, F64), jnp.zeros(case.rhs, F64)).shape
  axes = {name: (1 if name == "x" else 0) if name in batched else None
          for name in ("x", "w", "ct")}
  x, _ = _batched(case.lhs, axes["x"], B, seed=7)
  w, _ = _batched(case.rhs, axes["w"], B, seed=8)
  ct, _ = _batched(y_shape, axes["ct"], B, seed=9)
  return (x, w, ct), (axes["x"], axes["w"], axes["ct"])


@functools.lru_cache(maxsize=None)
def _vjp_reference(case, batched):
  """Per-member lax vjps (a Python loop), stacked."""
  args, in_axes = _vjp_inputs(case, batched)
  ref = _vjp(_ref(case))
  outs = [ref(*(_member(a, ax, i) for a, ax in zip(args, in_axes))) for i in range(B)]
  return tuple(jnp.stack(parts) for parts in zip(*outs))


@pytest.mark.parametrize("case", [VMAP_PARAMS[0], VMAP_PARAMS[1], VMAP_PARAMS[2]])
@pytest.mark.parametrize("batched", GRAD_COMBOS, ids=lambda c: "+".join(c))
@algo_params
def test_vmap_of_vjp(case, batched, algo):
  (x, w, ct), in_axes = _vjp_inputs(case, batched)
  f = jax.vmap(_vjp(_conv(case, algo)), in_axes=in_axes)
  require_supported(algo, f, x, w, ct)
  dx, dw = f(x, w, ct)
  want_dx, want_dw = _vjp_reference(case, batched)
  assert_close(dx, want_dx, TOL, "dx")
  assert_close(dw, want_dw, TOL, "dw")
  counts = count_primitives(f, x, w, ct)
  assert counts["jaxdnn_conv_backward_data"] == 1
  assert counts["jaxdnn_conv_backward_filter"] == 1
  n, text = _compiled_count(f, x, w, ct)
  assert n == 2, text  # one for dx, one for dw


def _per_example(conv):
  return jax.grad(lambda x, w: jnp.sum(jnp.sin(conv(x, w))), argnums=(0, 1))


def _batched_loss(conv, in_axes):
  return lambda x, w: jnp.sum(jnp.cos(jax.vmap(conv, in_axes=in_axes)(x, w)))


def _grad_inputs(case, in_axes):
  x, _ = _batched(case.lhs, in_axes[0], B, seed=10)
  w, _ = _batched(case.rhs, in_axes[1], B, seed=11)
  return x, w


@functools.lru_cache(maxsize=None)
def _grad_reference(case, in_axes):
  x, w = _grad_inputs(case, in_axes)
  return (jax.vmap(_per_example(_ref(case)), in_axes=in_axes)(x, w),
          jax.grad(_batched_loss(_ref(case), in_axes), argnums=(0, 1))(x, w))


@pytest.mark.parametrize("case", [VMAP_PARAMS[1], VMAP_PARAMS[3], VMAP_PARAMS[4]])
@pytest.mark.parametrize("in_axes", COMBO_PARAMS[::2])
@algo_params
def test_vmap_of_grad_and_grad_of_vmap(case, in_axes, algo):
  x, w = _grad_inputs(case, in_axes)
  f = jax.vmap(_per_example(_conv(case, algo)), in_axes=in_axes)
  require_supported(algo, f, x, w)
  want_vmap_grad, want_grad_vmap = _grad_reference(case, in_axes)
  for g, r, name in zip(f(x, w), want_vmap_grad, ("dx", "dw")):
    assert_close(g, r, TOL, f"vmap(grad) {name}")
  got = jax.grad(_batched_loss(_conv(case, algo), in_axes), argnums=(0, 1))(x, w)
  for g, r, name in zip(got, want_grad_vmap, ("dx", "dw")):
    assert_close(g, r, TOL, f"grad(vmap) {name}")
