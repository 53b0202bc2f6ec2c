"""Derivatives: numerical checks, agreement with lax at every order, the bilinear identity."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxdnn
from grid import NCHW, NCW, NHWC, NWC, Case
from helpers import algo_params, lax_conv_hi, rand, require_supported
from jaxdnn import ConvGeometry, Layout
from tolerances import F64, assert_close, tolerance

TOL = tolerance(F64)

GRAD_CASES = [
    Case("stride2-nhwc", (2, 5, 5, 2), (3, 3, 2, 3), (2, 2), "SAME", dnums=NHWC),
    Case("rhs-dilation-nchw", (1, 2, 6, 5), (3, 2, 2, 2), (1, 1), "VALID", rhs_dilation=(2, 2),
         dnums=NCHW),
    Case("groups2-nhwc", (1, 4, 4, 4), (3, 3, 2, 4), (1, 1), "SAME", dnums=NHWC, fgc=2),
    Case("depthwise-nchw-stride2", (1, 3, 5, 5), (6, 1, 3, 3), (2, 2), "SAME", dnums=NCHW,
         fgc=3),
    Case("lhs-dilation-nchw", (1, 2, 3, 3), (2, 2, 2, 2), (1, 1), ((1, 0), (0, 1)),
         lhs_dilation=(2, 2), dnums=NCHW),
    Case("lhs-dilation-stride2-nhwc", (1, 3, 3, 2), (3, 2, 2, 2), (2, 1), ((1, 1), (2, 0)),
         lhs_dilation=(2, 3), dnums=NHWC),
    Case("negative-padding-nhwc", (1, 6, 5, 2), (2, 2, 2, 2), (1, 1), ((-1, 1), (1, -1)),
         dnums=NHWC),
    Case("batch-groups2-nchw", (4, 2, 4, 4), (4, 2, 3, 3), (1, 1), "SAME", dnums=NCHW, bgc=2),
    Case("1d-stride3-ncw", (2, 2, 8), (3, 2, 3), (3,), "SAME", dnums=NCW),
    Case("3d-odd-layout", (2, 3, 3, 2, 2), (3, 2, 2, 2, 2), (1, 2, 1), "SAME",
         dnums=("NDHWC", "DHWIO", "NCDHW")),
]
GRAD_PARAMS = [pytest.param(c, id=c.id) for c in GRAD_CASES]


def _inputs(case):
  return rand(case.lhs, F64, seed=11), rand(case.rhs, F64, seed=12)


def _jaxdnn(case, algo):
  return functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo)


def _lax(case):
  return functools.partial(lax_conv_hi, **case.kwargs())


def _all_derivatives(conv):
  """Forward, backward-data and backward-filter all appear in this function's jaxpr."""
  return jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1))


@pytest.mark.parametrize("case", GRAD_PARAMS)
@algo_params
def test_check_grads_both_operands(case, algo):
  x, w = _inputs(case)
  conv = _jaxdnn(case, algo)
  require_supported(algo, _all_derivatives(conv), x, w)
  check_grads(conv, (x, w), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("case", GRAD_PARAMS[:5])
@algo_params
def test_check_grads_per_operand(case, algo):
  x, w = _inputs(case)
  conv = _jaxdnn(case, algo)
  require_supported(algo, _all_derivatives(conv), x, w)
  check_grads(lambda x: conv(x, w), (x,), order=2, modes=("fwd", "rev"))
  check_grads(lambda w: conv(x, w), (w,), order=2, modes=("fwd", "rev"))


def _loss(conv, c):
  return lambda x, w: jnp.sum(jnp.tanh(conv(x, w)) * c)


def _compare_trees(got, want, what):
  got_leaves, got_tree = jax.tree.flatten(got)
  want_leaves, want_tree = jax.tree.flatten(want)
  assert got_tree == want_tree
  for i, (g, r) in enumerate(zip(got_leaves, want_leaves)):
    assert g.dtype == r.dtype, f"{what}[{i}]: dtype {g.dtype} != {r.dtype}"
    assert_close(g, r, TOL, f"{what}[{i}]")


def _derivatives(conv, x, w, c, tx, tw):
  """First and second derivatives of a nonlinear loss of conv(x, w), computed eagerly."""
  loss = _loss(conv, c)
  grad = jax.grad(loss, argnums=(0, 1))
  out = {"grad": grad(x, w)}
  # Each operand on its own (closing over the other).
  out["grad-lhs"] = jax.grad(lambda x: loss(x, w))(x)
  out["grad-rhs"] = jax.grad(lambda w: loss(x, w))(w)
  # grad of grad.
  out["grad-of-grad"] = jax.grad(
      lambda x, w: jnp.vdot(grad(x, w)[0], tx) + jnp.vdot(grad(x, w)[1], tw), argnums=(0, 1))(x, w)
  # jvp of grad (forward-over-reverse).
  out["jvp-of-grad"] = jax.jvp(grad, (x, w), (tx, tw))
  # The full cross second derivative d/dx (d loss / dw).
  out["jacfwd-of-grad"] = jax.jacfwd(jax.grad(loss, argnums=1), argnums=0)(x, w)
  return out


def _derivative_inputs(case):
  x, w = _inputs(case)
  y_shape = jax.eval_shape(_lax(case), x, w).shape
  return (x, w, rand(y_shape, F64, seed=13), rand(x.shape, F64, seed=14),
          rand(w.shape, F64, seed=15))


@functools.lru_cache(maxsize=None)
def _lax_derivatives(case):
  return _derivatives(_lax(case), *_derivative_inputs(case))


@pytest.mark.parametrize("case", GRAD_PARAMS)
@algo_params
def test_higher_order_derivatives_match_lax(case, algo):
  args = _derivative_inputs(case)
  mine = _jaxdnn(case, algo)
  require_supported(algo, _all_derivatives(mine), *args[:2])
  got = _derivatives(mine, *args)
  want = _lax_derivatives(case)
  for key in want:
    _compare_trees(got[key], want[key], key)


# ---------------------------------------------------------------------------------------------
# The three primitives, directly: <F(x,w),dy> = <x,D(dy,w)> = <w,W(x,dy)>.

def _geometry(layout, in_spatial, filt, stride=None, rdil=None, ldil=None, lo=None, hi=None,
              groups=1):
  n = len(in_spatial)
  one = (1,) * n
  return ConvGeometry(layout=layout, in_spatial=in_spatial, filter_spatial=filt,
                      stride=stride or one, rhs_dilation=rdil or one, lhs_dilation=ldil or one,
                      pad_lo=lo or (0,) * n, pad_hi=hi or (0,) * n, groups=groups)


PRIMITIVE_CASES = [
    ("nhwc-2d-pad1", _geometry(Layout.NHWC, (5, 6), (3, 3), lo=(1, 1), hi=(1, 1)), 2, 3, 4),
    ("nchw-2d-stride2", _geometry(Layout.NCHW, (7, 6), (3, 2), stride=(2, 2), lo=(1, 0),
                                  hi=(1, 1)), 2, 3, 4),
    ("nhwc-2d-groups2-dilated", _geometry(Layout.NHWC, (7, 7), (3, 3), rdil=(2, 2), lo=(2, 2),
                                          hi=(2, 2), groups=2), 1, 4, 6),
    ("nchw-2d-depthwise", _geometry(Layout.NCHW, (6, 6), (3, 3), lo=(1, 1), hi=(1, 1),
                                    groups=3), 2, 3, 3),
    ("nhwc-2d-lhs-dilation", _geometry(Layout.NHWC, (3, 4), (2, 3), ldil=(2, 2), lo=(1, 0),
                                       hi=(0, 2)), 1, 2, 3),
    ("nchw-2d-negative-pad", _geometry(Layout.NCHW, (7, 6), (2, 2), lo=(-1, 1), hi=(1, -2)),
     2, 2, 3),
    ("nhwc-1d-stride3", _geometry(Layout.NHWC, (10,), (3,), stride=(3,), lo=(1,), hi=(1,)),
     2, 3, 2),
    ("nchw-3d", _geometry(Layout.NCHW, (3, 4, 3), (2, 2, 2), stride=(1, 2, 1), lo=(1, 0, 1),
                          hi=(0, 1, 1)), 1, 2, 3),
    ("nhwc-3d-groups2", _geometry(Layout.NHWC, (3, 3, 4), (2, 2, 3), lo=(0, 1, 1),
                                  hi=(1, 0, 1), groups=2), 2, 4, 2),
]


@pytest.mark.parametrize("geometry,n,c,k", [pytest.param(*p[1:], id=p[0])
                                             for p in PRIMITIVE_CASES])
@algo_params
def test_primitives_bilinear_identity(geometry, n, c, k, algo):
  g = geometry
  x = rand(g.x_shape(n, c), F64, seed=21)
  w = rand(g.w_shape(c // g.groups, k), F64, seed=22)
  dy = rand(g.y_shape(n, k), F64, seed=23)

  def three(x, w, dy):
    return (jaxdnn.conv_forward(x, w, g, algo), jaxdnn.conv_backward_data(dy, w, g, algo),
            jaxdnn.conv_backward_filter(x, dy, g, algo))

  require_supported(algo, three, x, w, dy)
  y, dx, dw = three(x, w, dy)
  assert y.shape == dy.shape and dx.shape == x.shape and dw.shape == w.shape
  assert y.dtype == dx.dtype == dw.dtype == jnp.float64
  a, b, cc = (float(jnp.vdot(y, dy)), float(jnp.vdot(x, dx)), float(jnp.vdot(w, dw)))
  scale = float(jnp.linalg.norm(y) * jnp.linalg.norm(dy)) + 1e-300
  assert abs(a - b) <= TOL * scale, (a, b)
  assert abs(a - cc) <= TOL * scale, (a, cc)

  # And each one equals lax's (forward, and the two halves of its vjp).
  spatial = "DHW"[3 - g.spatial_dims:]
  dn = ((f"N{spatial}C", f"{spatial}IO", f"N{spatial}C") if g.layout == Layout.NHWC else
        (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}"))
  ref = lambda x, w: lax_conv_hi(x, w, g.stride, tuple(zip(g.pad_lo, g.pad_hi)),
                                 lhs_dilation=g.lhs_dilation, rhs_dilation=g.rhs_dilation,
                                 dimension_numbers=dn, feature_group_count=g.groups)
  y_ref, vjp = jax.vjp(ref, x, w)
  dx_ref, dw_ref = vjp(dy)
  assert_close(y, y_ref, TOL, "F")
  assert_close(dx, dx_ref, TOL, "D")
  assert_close(dw, dw_ref, TOL, "W")


@algo_params
def test_primitive_cotangent_dtype_follows_primal(algo):
  """Transposes produce cotangents in the primal's dtype even for preferred_element_type."""
  x = rand((2, 5, 5, 4), jnp.bfloat16, seed=1)
  w = rand((3, 3, 4, 3), jnp.bfloat16, seed=2)
  conv = functools.partial(jaxdnn.conv, window_strides=(1, 1), padding="SAME",
                           dimension_numbers=NHWC, preferred_element_type=jnp.float32, algo=algo)
  require_supported(algo, _all_derivatives(conv), x, w)
  y, vjp = jax.vjp(conv, x, w)
  assert y.dtype == jnp.float32
  ct = rand(y.shape, jnp.float32, seed=3)
  dx, dw = vjp(ct)
  assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
  ref = functools.partial(lax_conv_hi, window_strides=(1, 1), padding="SAME",
                          dimension_numbers=NHWC)
  _, vjp_ref = jax.vjp(ref, x.astype(F64), w.astype(F64))
  dx_ref, dw_ref = vjp_ref(ct.astype(F64))
  assert_close(dx, dx_ref, tolerance(jnp.bfloat16), "dx")
  assert_close(dw, dw_ref, tolerance(jnp.bfloat16), "dw")


@pytest.mark.parametrize("layout", [NWC, NCW], ids=["nwc", "ncw"])
@algo_params
def test_grad_float32(layout, algo):
  x = rand((2, 9, 4) if layout == NWC else (2, 4, 9), jnp.float32, seed=5)
  w = rand((3, 2, 6) if layout == NWC else (6, 2, 3), jnp.float32, seed=6)
  kw = dict(window_strides=(2,), padding="SAME", dimension_numbers=layout, feature_group_count=2)
  mine = functools.partial(jaxdnn.conv, **kw, algo=algo)
  require_supported(algo, _all_derivatives(mine), x, w)
  c = rand(jax.eval_shape(mine, x, w).shape, jnp.float32, seed=7)
  got = jax.grad(lambda x, w: jnp.vdot(mine(x, w), c), argnums=(0, 1))(x, w)
  ref = functools.partial(lax_conv_hi, **kw)
  want = jax.grad(lambda x, w: jnp.vdot(ref(x, w), c.astype(F64)), argnums=(0, 1))(
      x.astype(F64), w.astype(F64))
  for gi, wi, name in zip(got, want, ("dx", "dw")):
    assert gi.dtype == jnp.float32
    assert_close(gi, wi, tolerance(jnp.float32), name)


def test_check_grads_is_sensitive():
  """Sanity check of the checker itself: a wrong derivative is caught."""

  @jax.custom_jvp
  def bad(x):
    return jnp.sin(x)

  bad.defjvp(lambda p, t: (jnp.sin(p[0]), 1.1 * jnp.cos(p[0]) * t[0]))
  with pytest.raises(AssertionError):
    check_grads(bad, (np.linspace(0.1, 1.0, 5),), order=1, modes=("fwd",))
