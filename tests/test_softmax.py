"""jaxdnn.softmax / log_softmax against jax.nn: every axis form (int, tuple, None, ()), contiguous
and strided views, long rows, dtypes, NaN/inf rows, check_grads order 2, vmap over every operand
combination, jit and the HLO (no transpose for a single axis), size 0, errors, CUDA lowering,
and (marked gpu) the CUDA kernels' warp, block and strided paths.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxdnn
from helpers import PLATFORM
from jaxdnn._src import ffi
from jaxdnn._src.primitives import softmax as sm_prims
from tolerances import BF16, F16, F32, F64, RTOL, assert_close

CUDA = ffi.extension("cuda")
FUNCS = {"softmax": (jaxdnn.softmax, jax.nn.softmax),
         "log_softmax": (jaxdnn.log_softmax, jax.nn.log_softmax)}
AXES = [-1, 0, 1, 2, (1, 2), (0, 2), (2, 0), (0, 1, 2), None, ()]


def _x(shape, dtype=F64, seed=0, scale=3.0):
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype)


def _f64(a):
  return jnp.asarray(np.asarray(a, np.float64))


def _value_vjp_jvp(impl, cases):
  """jit of [(x, ct)] -> [{fn: (f(x), vjp(ct), jvp(ct))}] for impl 0 (jaxdnn) or 1 (jax.nn), one
  entry per (shape, axis) case (cases: the static axes)."""
  def run(xs, cts):
    out = []
    for x, ct, axis in zip(xs, cts, cases):
      row = {}
      for name, fns in FUNCS.items():
        f = lambda a, f=fns[impl], axis=axis: f(a, axis)
        row[name] = (f(x), jax.vjp(f, x)[1](ct)[0], jax.jvp(f, (x,), (ct,))[1])
      out.append(row)
    return out
  return jax.jit(run)


def test_forward_vjp_jvp_every_axis():
  xs = [_x((3, 4, 5))] * len(AXES)
  cts = [_x((3, 4, 5), seed=1)] * len(AXES)
  ours = _value_vjp_jvp(0, AXES)(xs, cts)
  refs = _value_vjp_jvp(1, AXES)(xs, cts)
  for axis, o, r in zip(AXES, ours, refs):
    for name in FUNCS:
      for what, out, ref in zip(("forward", "vjp", "jvp"), o[name], r[name]):
        assert_close(out, ref, 1e-12, f"{name} axis={axis} {what}")


@pytest.mark.parametrize("dtype", (F64, F32, BF16, F16), ids=str)
def test_dtypes_long_rows_and_strided(dtype):
  tol = RTOL[dtype]
  # (3, 4, 9000) over axis 1: rows wider than a column block (4096), split into 3 blocks.
  cases = [((6, 37), -1), ((4, 5000), -1), ((2, 70, 300), 1), ((3, 33, 7), 1), ((50, 3), 0),
           ((3, 4, 9000), 1)]
  xs = [_x(shape, dtype) for shape, _ in cases]
  cts = [_x(shape, dtype, seed=2) for shape, _ in cases]
  axes = [axis for _, axis in cases]
  ours = _value_vjp_jvp(0, axes)(xs, cts)
  refs = _value_vjp_jvp(1, axes)([_f64(x) for x in xs], [_f64(c) for c in cts])
  for (shape, _), o, r in zip(cases, ours, refs):
    for name in FUNCS:
      assert o[name][0].dtype == dtype
      assert_close(o[name][0], r[name][0], tol, f"{name} {shape} forward")
      # log_softmax's backward subtracts exp(y) sum(v): bound by the scale of its terms.
      assert_close(o[name][1], r[name][1], 4 * tol, f"{name} {shape} vjp")
      assert_close(o[name][2], r[name][2], 4 * tol, f"{name} {shape} jvp")


@pytest.mark.parametrize("dtype", (F64, F32), ids=str)
@pytest.mark.parametrize("fn", FUNCS)
def test_nan_and_inf_rows_like_jax_nn(fn, dtype):
  ours, ref = FUNCS[fn]
  inf, nan = np.inf, np.nan
  x = jnp.array([[-inf, -inf, -inf, -inf],   # all -inf: NaN
                 [1.0, -inf, 2.0, -inf],     # some -inf: 0 / -inf there
                 [1.0, inf, 2.0, 3.0],       # +inf: NaN
                 [1.0, nan, 2.0, 3.0],       # NaN: NaN
                 [1e30, -1e30, 0.0, 5.0]], dtype)
  for axis in (-1, 0):
    y = np.asarray(jax.jit(ours, static_argnums=1)(x, axis))
    y_ref = np.asarray(ref(x, axis))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(y_ref))
    np.testing.assert_allclose(y, y_ref, rtol=RTOL[dtype], atol=1e-30, equal_nan=True)
  g = jax.jit(jax.grad(lambda a: jnp.sum(ours(a[1:2]) * a[4:5])))(x)
  g_ref = jax.jit(jax.grad(lambda a: jnp.sum(ref(a[1:2]) * a[4:5])))(x)
  # The cotangent row [1e30, -1e30, 0, 5] sums to 5 exactly, but to 0 in a pairwise order (XLA's):
  # the result may differ by (rounding of 1e30) x |y|, so the absolute tolerance follows the row's
  # largest value.
  scale = np.max(np.abs(np.asarray(g_ref)[np.isfinite(g_ref)]), initial=0.0)
  np.testing.assert_allclose(g, g_ref, rtol=RTOL[dtype], atol=max(1e-30, RTOL[dtype] * scale),
                             equal_nan=True)


@pytest.mark.parametrize("fn,axis", [("softmax", -1), ("softmax", (0, 2)), ("log_softmax", -1),
                                     ("log_softmax", 0)], ids=str)
def test_check_grads_order2(fn, axis):
  ours = FUNCS[fn][0]
  x = _x((2, 3, 4), scale=1.0)
  check_grads(jax.jit(lambda a: ours(a, axis)), (x,), order=2, modes=("fwd", "rev"), eps=1e-4)


def test_third_order_matches_jax():
  x = _x((3, 4), scale=1.0)
  w = _x((3, 4), seed=5)

  def third(g):
    d1 = lambda a: jax.grad(lambda b: jnp.sum(g(b) * w))(a)
    d2 = lambda a: jax.grad(lambda b: jnp.sum(d1(b) ** 3))(a)
    return jax.jit(jax.grad(lambda a: jnp.sum(d2(a) ** 2)))

  for ours, ref in FUNCS.values():
    assert_close(third(ours)(x), third(ref)(x), 1e-10)


@pytest.mark.parametrize("in_axis,axis", [(0, -1), (1, -1), (2, 0), (0, 0), (1, (0, 1))], ids=str)
def test_vmap_forward(in_axis, axis):
  x = _x((3, 4, 5))
  for ours, ref in FUNCS.values():
    out = jax.jit(jax.vmap(lambda a: ours(a, axis), in_axes=in_axis))(x)
    assert_close(out, jax.vmap(lambda a: ref(a, axis), in_axes=in_axis)(x), 1e-12)


def _operand(rng, example_shape, size, axis):
  if axis is None:
    return jnp.asarray(rng.standard_normal(example_shape))
  return jnp.moveaxis(jnp.asarray(rng.standard_normal((size, *example_shape))), 0, axis)


@pytest.mark.parametrize("op", ["softmax", "log_vjp", "log_jvp"])
@pytest.mark.parametrize("in_axes", [(0, 0), (0, None), (None, 0), (1, 0), (None, 2), (2, 1)],
                         ids=str)
def test_vmap_backward_every_operand_combination(in_axes, op):  # noqa: D103
  rng = np.random.default_rng(3)
  y, v = (_operand(rng, (4, 5), 3, ax) for ax in in_axes)

  def run(fn):
    def per_axis(a, b):
      return [jax.vmap(lambda p, q, axis=axis: fn(p, q, axis), in_axes=in_axes)(a, b)
              for axis in (0, 1)]
    return jax.jit(per_axis)(y, v)

  ours = run(lambda p, q, axis: sm_prims.softmax_bwd(p, q, axis, op))
  refs = run(lambda p, q, axis: sm_prims._reference_bwd(p, q, axis=axis, op=op))
  for out, ref in zip(ours, refs):
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)


def test_backward_transposes():
  """softmax's backward is self-adjoint; log_softmax's VJP and JVP forms are transposes."""
  rng = np.random.default_rng(4)
  y = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((3, 6))))
  p = jnp.exp(y)
  a, b = (jnp.asarray(rng.standard_normal((3, 6))) for _ in range(2))
  ip = lambda u, w: float(jnp.vdot(u, w))
  assert np.isclose(ip(sm_prims.softmax_bwd(p, a, 1, "softmax"), b),
                    ip(a, sm_prims.softmax_bwd(p, b, 1, "softmax")), rtol=1e-12)
  assert np.isclose(ip(sm_prims.softmax_bwd(y, a, 1, "log_vjp"), b),
                    ip(a, sm_prims.softmax_bwd(y, b, 1, "log_jvp")), rtol=1e-12)


def test_jit_and_hlo():
  x = _x((4, 6, 8), F32)
  np.testing.assert_array_equal(jax.jit(jaxdnn.softmax)(x), jaxdnn.softmax(x))
  for axis in (-1, 1, 0, (1, 2)):  # one axis or contiguous axes: a reshape, never a transpose
    hlo = jax.jit(lambda a: jaxdnn.log_softmax(a, axis)).lower(x).as_text()
    assert "jaxdnn_softmax_fwd" in hlo and "transpose" not in hlo, axis
  hlo = jax.jit(lambda a: jaxdnn.softmax(a, (0, 2))).lower(x).as_text()
  assert "transpose" in hlo  # scattered axes are moved together first
  hlo = jax.jit(jax.grad(lambda a: jnp.sum(jaxdnn.softmax(a) * a))).lower(x).as_text()
  assert "jaxdnn_softmax_bwd" in hlo


@pytest.mark.parametrize("dtype", (F32, BF16), ids=str)
@pytest.mark.parametrize("n", (17, 64, 256, 300))
@pytest.mark.parametrize("name", ("softmax", "log_softmax"))
def test_row_independent_of_its_neighbours(name, n, dtype):
  """A row's result and its gradient are bitwise the same alone and among other rows: the CPU
  runs short rows four at a time, forward and backward, and threads split the rows differently
  on every machine."""
  f = getattr(jaxdnn, name)
  fn = jax.jit(f)
  bwd = jax.jit(lambda a, c: jax.vjp(f, a)[1](c)[0])
  x, ct = _x((7, n), dtype), _x((7, n), dtype, seed=3)
  together, grads = np.asarray(fn(x)), np.asarray(bwd(x, ct))
  for i in range(7):
    np.testing.assert_array_equal(np.asarray(fn(x[i:i + 1]))[0], together[i], err_msg=f"row {i}")
    np.testing.assert_array_equal(np.asarray(bwd(x[i:i + 1], ct[i:i + 1]))[0], grads[i],
                                  err_msg=f"gradient of row {i}")


@pytest.mark.parametrize("shape,axis", [((0, 5), -1), ((3, 0), -1), ((0, 5), 0), ((2, 0, 3), 1),
                                        ((0,), None), ((2, 0, 4), (0, 2))], ids=str)
def test_size_zero(shape, axis):
  x = jnp.zeros(shape, F32)
  for ours, ref in FUNCS.values():
    assert ours(x, axis).shape == ref(x, axis).shape == shape
    assert jax.grad(lambda a: jnp.sum(ours(a, axis)))(x).shape == shape


def test_scalar_axis_none_and_empty_tuple():
  for ours, ref in FUNCS.values():
    s = jnp.float64(2.0)
    assert_close(ours(s, None), ref(s, None), 1e-12)
    x = _x((2, 3))
    assert_close(ours(x, ()), ref(x, ()), 1e-12)


@pytest.mark.parametrize("call,exc,match", [
    (lambda x: jaxdnn.softmax(x, 2), ValueError, "axis 2 is out of bounds for an array of rank 2"),
    (lambda x: jaxdnn.softmax(x, -3), ValueError, "out of bounds"),
    (lambda x: jaxdnn.log_softmax(x, (0, -2)), ValueError, "axis has repeated entries"),
    (lambda x: jaxdnn.softmax(x, "a"), TypeError, "axis must be an int"),
    (lambda x: jaxdnn.softmax(x, 1.0), TypeError, "axis must be an int"),
    (lambda x: jaxdnn.softmax(x.astype(jnp.int32)), TypeError, "x has dtype int32"),
    (lambda x: jaxdnn.softmax(jnp.float32(1.0)), ValueError, "out of bounds"),
])
def test_errors(call, exc, match):
  with pytest.raises(exc, match=match):
    call(jnp.ones((2, 3), F32))


@pytest.mark.skipif(CUDA is None, reason="the jaxdnn CUDA extension is not built in this install")
def test_cuda_lowering():
  x = _x((8, 100), BF16)
  f = jax.grad(lambda a: jnp.sum(jaxdnn.log_softmax(a, 0).astype(F32) ** 2))
  text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert "jaxdnn_softmax_fwd" in text and "jaxdnn_softmax_bwd" in text


@pytest.mark.gpu
@pytest.mark.skipif(PLATFORM != "gpu", reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", (F64, F32, BF16, F16), ids=str)
@pytest.mark.parametrize("shape,axis", [
    ((37, 1), -1), ((37, 17), -1), ((9, 32), -1), ((9, 33), -1), ((5, 100), -1), ((5, 256), -1),
    ((5, 513), -1), ((5, 1024), -1),                     # one warp per row, every kPer
    ((3, 1025), -1), ((2, 20000), -1),                   # one block per row
    ((4, 300, 7), 1), ((3, 50, 130), 1), ((1000, 3), 0),  # strided columns
], ids=str)
@pytest.mark.parametrize("fn", FUNCS)
def test_gpu_kernels_match_jax_nn(fn, shape, axis, dtype):
  ours, ref = FUNCS[fn]
  x = _x(shape, dtype)
  ct = _x(shape, dtype, seed=2)
  tol = RTOL[dtype]
  assert_close(jax.jit(lambda a: ours(a, axis))(x), ref(_f64(x), axis), tol, "forward")
  g = jax.jit(lambda a, b: jax.vjp(lambda u: ours(u, axis), a)[1](b)[0])(x, ct)
  g_ref = jax.vjp(lambda u: ref(u, axis), _f64(x))[1](_f64(ct))[0]
  assert_close(g, g_ref, 4 * tol, "backward")
  t = jax.jit(lambda a, b: jax.jvp(lambda u: ours(u, axis), (a,), (b,))[1])(x, ct)
  t_ref = jax.jvp(lambda u: ref(u, axis), (_f64(x),), (_f64(ct),))[1]
  assert_close(t, t_ref, 4 * tol, "jvp")
