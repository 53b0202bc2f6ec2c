"""Forward convolution against lax.conv_general_dilated, over a grid of geometries x algorithms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn
from grid import GRID, GRID_PARAMS, NCHW, NHWC, Case
from helpers import (FAMILIES, GENERAL_FAMILIES, RESTRICTED, PLATFORM, algo_id, algo_params, jaxdnn_eqns,
                     lax_conv64, problems, rand, require_supported)
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvGeometry, ConvOp, Layout
from tolerances import BF16, F16, F32, F64, assert_close, tolerance

DTYPES = [pytest.param(d, id=str(d)) for d in (F64, F32, BF16, F16)]


def _check_forward(case: Case, algo, dtype=F64, preferred=None, precision=None):
  x = rand(case.lhs, dtype, seed=1)
  w = rand(case.rhs, dtype, seed=2)
  kwargs = case.kwargs()

  def fn(x, w):
    return jaxdnn.conv(x, w, **kwargs, precision=precision, preferred_element_type=preferred,
                       algo=algo)

  require_supported(algo, fn, x, w)
  y = fn(x, w)
  expected = jax.eval_shape(
      lambda x, w: lax.conv_general_dilated(x, w, **kwargs, preferred_element_type=preferred),
      x, w)
  assert y.shape == expected.shape
  assert y.dtype == expected.dtype
  ref = lax_conv64(x, w, **kwargs)
  assert_close(y, ref, tolerance(dtype, preferred, precision), f"{case.id} {algo_id(algo)}")


@pytest.mark.parametrize("case", GRID_PARAMS)
@algo_params
def test_forward_grid_float64(case, algo):
  _check_forward(case, algo)


_DTYPE_CASES = [c for c in GRID if c.id in (
    "nhwc-hwio", "groups3-nchw-stride2", "lhs-dilation2-nhwc", "1d-depthwise", "3d-ndhwc",
    "batch-groups2-nhwc")]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in _DTYPE_CASES])
@pytest.mark.parametrize("dtype", DTYPES)
@algo_params
def test_forward_dtypes(case, dtype, algo):
  _check_forward(case, algo, dtype)


_PRECISIONS = [
    pytest.param(lax.Precision.HIGHEST, id="HIGHEST"),
    pytest.param("highest", id="str-highest"),
    pytest.param((lax.Precision.HIGHEST, lax.Precision.HIGHEST), id="pair-HIGHEST"),
    pytest.param(lax.Precision.DEFAULT, id="DEFAULT"),
    pytest.param(lax.Precision.HIGH, id="HIGH"),
]


@pytest.mark.parametrize("precision", _PRECISIONS)
@algo_params
def test_forward_float32_precision(precision, algo):
  case = Case("prec", (2, 6, 6, 16), (3, 3, 16, 8), (1, 1), "SAME", dnums=NHWC)
  _check_forward(case, algo, F32, precision=precision)


_PREFERRED = [
    pytest.param((BF16, F32), id="bf16-to-f32"),
    pytest.param((F16, F32), id="f16-to-f32"),
    pytest.param((F32, F64), id="f32-to-f64"),
    pytest.param((BF16, F64), id="bf16-to-f64"),
]


@pytest.mark.parametrize("case", [
    pytest.param(Case("nhwc", (2, 5, 5, 8), (3, 3, 8, 4), (1, 1), "SAME", dnums=NHWC), id="nhwc"),
    pytest.param(Case("nchw-groups2-stride2", (2, 8, 7, 6), (4, 4, 3, 3), (2, 2), "SAME",
                      dnums=NCHW, fgc=2), id="nchw-groups2-stride2"),
])
@pytest.mark.parametrize("dtypes", _PREFERRED)
@algo_params
def test_forward_preferred_element_type(case, dtypes, algo):
  in_dtype, out_dtype = dtypes
  _check_forward(case, algo, in_dtype, preferred=out_dtype)


def test_preferred_element_type_is_more_accurate_than_input_dtype():
  """bf16 -> f32 must not be computed (or rounded) in bf16: it has to meet the float32 bound."""
  x = rand((2, 6, 6, 32), BF16, seed=3)
  w = rand((3, 3, 32, 8), BF16, seed=4)
  args = ((1, 1), "SAME")
  kw = dict(dimension_numbers=NHWC)
  ref = lax_conv64(x, w, *args, **kw)
  y32 = jaxdnn.conv(x, w, *args, **kw, preferred_element_type=jnp.float32)
  y16 = jaxdnn.conv(x, w, *args, **kw)
  assert y32.dtype == jnp.float32 and y16.dtype == jnp.bfloat16
  assert_close(y32, ref, tolerance(BF16, F32))
  err16 = np.linalg.norm(np.asarray(y16, np.float64) - np.asarray(ref))
  err32 = np.linalg.norm(np.asarray(y32, np.float64) - np.asarray(ref))
  assert err32 < err16


def test_preferred_float64_without_x64_is_float32_with_lax_warning():
  """With jax_enable_x64 off, lax warns and computes a float64 preferred_element_type as
  float32; jaxdnn.conv does the same (it used to fail in lowering with a verifier error)."""
  with jax.enable_x64(False):
    x = jnp.asarray(rand((2, 3, 6, 5), F32, seed=5))
    w = jnp.asarray(rand((4, 3, 3, 3), F32, seed=6))
    args = ((1, 1), "SAME")
    with pytest.warns(UserWarning, match="truncated to dtype float32"):
      ref = lax.conv_general_dilated(x, w, *args, preferred_element_type=jnp.float64,
                                     precision=lax.Precision.HIGHEST)
    with pytest.warns(UserWarning, match="truncated to dtype float32"):
      y = jaxdnn.conv(x, w, *args, preferred_element_type=jnp.float64)
    assert y.dtype == ref.dtype == jnp.float32
    assert_close(y, np.asarray(ref, np.float64), tolerance(F32))


# ---------------------------------------------------------------------------------------------
# Support matrix: skips elsewhere may not hide CPU regressions.

def _all_ops(case: Case, dtype, preferred=None):
  kwargs = case.kwargs()

  def loss(x, w):
    y = jaxdnn.conv(x, w, **kwargs, preferred_element_type=preferred)
    return jnp.sum(y.astype(jnp.float32) ** 2)

  return jax.grad(loss, argnums=(0, 1))


@pytest.mark.parametrize("case", GRID_PARAMS)
def test_cpu_families_support_the_whole_grid(case):
  """On the CPU, the four general families run forward, backward-data and backward-filter of
  every geometry of the grid, in every dtype (WINOGRAD_NONFUSED: test_winograd.py)."""
  for dtype, preferred in ((F64, None), (F32, None), (BF16, None), (F16, None), (BF16, F32)):
    x = jnp.zeros(case.lhs, dtype)
    w = jnp.zeros(case.rhs, dtype)
    probs = problems(_all_ops(case, dtype, preferred), x, w)
    ops = {p[0] for p in probs}
    assert ops == {ConvOp.FORWARD, ConvOp.BACKWARD_DATA, ConvOp.BACKWARD_FILTER}, ops
    for op, g, n, c, k, kin, kout, prec in probs:
      for family in GENERAL_FAMILIES:
        why = algorithms.unsupported_reason("cpu", op, family, g, n, c, k, kin, kout, prec)
        assert why == "", f"{family.name} {op.name} {dtype}: {why}"
      able = algorithms.supported_algorithms("cpu", op, g, n, c, k, kin, kout, prec)
      assert set(GENERAL_FAMILIES) <= set(able)
      assert algorithms.choose_algorithm("cpu", op, "auto", g, n, c, k, kin, kout,
                                         prec) in FAMILIES


# A 3x3 convolution with stride 2: every family with geometry restrictions refuses it.
_GEOM = ConvGeometry(layout=Layout.NHWC, in_spatial=(5, 5), filter_spatial=(3, 3), stride=(2, 2),
                     rhs_dilation=(1, 1), lhs_dilation=(1, 1), pad_lo=(1, 1), pad_hi=(1, 1))
_X = jnp.ones((2, 5, 5, 4), jnp.float32)
_W = jnp.ones((3, 3, 4, 6), jnp.float32)
_Y = jnp.ones((2, 3, 3, 6), jnp.float32)
_OPS = {
    "forward": lambda algo: (lambda: jaxdnn.conv_forward(_X, _W, _GEOM, algo)),
    "backward-data": lambda algo: (lambda: jaxdnn.conv_backward_data(_Y, _W, _GEOM, algo)),
    "backward-filter": lambda algo: (lambda: jaxdnn.conv_backward_filter(_X, _Y, _GEOM, algo)),
}


@pytest.mark.parametrize("op", list(_OPS))
@pytest.mark.parametrize("algo", RESTRICTED, ids=algo_id)
def test_cpu_restricted_families_refuse_strided_geometry(algo, op):
  fn = _OPS[op](algo)
  with pytest.raises(ValueError, match="Families that can:") as info:
    jax.jit(fn).trace().lower(lowering_platforms=("cpu",))
  msg = str(info.value)
  assert algo.name in msg
  listed = msg.split("Families that can:")[1]
  for family in GENERAL_FAMILIES:
    assert family.name in listed, msg
  for family in RESTRICTED:
    assert family.name not in listed, msg


@pytest.mark.parametrize("algo", RESTRICTED, ids=algo_id)
def test_restricted_family_raises_eagerly_without_abort(algo):
  if PLATFORM != "cpu":
    pytest.skip("the CPU backend's refusal is checked here")
  x = rand((1, 4, 4, 2), F32)
  w = rand((3, 3, 2, 2), F32)
  with pytest.raises(ValueError, match="Families that can:"):
    jaxdnn.conv(x, w, (2, 2), "SAME", dimension_numbers=NHWC, algo=algo)
  with pytest.raises(ValueError, match="Families that can:"):
    jaxdnn.conv(x, w, (2, 2), "SAME", dimension_numbers=NHWC, algo=algo.value)
  # The process is still healthy afterwards.
  y = jaxdnn.conv(x, w, (2, 2), "SAME", dimension_numbers=NHWC, algo="direct")
  assert_close(y, lax_conv64(x, w, (2, 2), "SAME", dimension_numbers=NHWC), tolerance(F32))


@pytest.mark.parametrize("name", [a.value for a in FAMILIES] + [a.name for a in FAMILIES]
                         + ["Auto", " gemm "])
def test_algo_accepts_names(name):
  x = rand((1, 5, 5, 2), F64)
  w = rand((3, 3, 2, 3), F64)
  fn = lambda x, w: jaxdnn.conv(x, w, (1, 1), "SAME", dimension_numbers=NHWC, algo=name)
  parsed = algorithms.parse_algo(name)
  require_supported(parsed, fn, x, w)
  assert_close(fn(x, w), lax_conv64(x, w, (1, 1), "SAME", dimension_numbers=NHWC),
               tolerance(F64))
  # The requested family is the one bound (never silently substituted).
  (eqn_algo,) = {e.params["algo"] for e in jaxdnn_eqns(fn, x, w)}
  assert eqn_algo == parsed
