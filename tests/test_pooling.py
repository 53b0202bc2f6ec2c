"""jaxdnn.max_pool / avg_pool / global pools against lax.reduce_window, flax and a NumPy loop.

Oracles at float64: lax.reduce_window (max with -inf padding; avg as a padded sum over a padded
count), flax.linen.max_pool/avg_pool, and jax.grad / jax.jvp of those. ceil_mode follows
PyTorch's documented output size and divisor rule, checked on hand-computed PyTorch outputs and a
NumPy loop.

Every test runs on the CPU device and, when jax has one, on the GPU (the `device` fixture makes
it jax's default device). The references always run on the CPU (`oracle`): XLA:CPU's
select_and_scatter, which jax.grad of a max reduce_window uses, takes padding as -inf
candidates, and jaxdnn follows that rule on every backend.
"""

from __future__ import annotations

import functools
import itertools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxdnn
from helpers import rand
from jaxdnn._src.primitives import pooling as pool_prims
from tolerances import BF16, F16, F32, F64, RTOL, assert_close

LAYOUTS = {  # layout -> (spatial dims, channels last)
    "NWC": (1, True), "NCW": (1, False), "NHWC": (2, True), "NCHW": (2, False),
    "NDHWC": (3, True), "NCDHW": (3, False),
}


# ---------------------------------------------------------------------------------------------
# Oracles.

def _full(values, channels_last, fill):
  """Per-spatial-dimension values -> per-array-dimension values (batch, channel get `fill`)."""
  values = tuple(values)
  return (fill, *values, fill) if channels_last else (fill, fill, *values)


def _spatial(x, channels_last):
  nsd = x.ndim - 2
  return x.shape[1:1 + nsd] if channels_last else x.shape[2:]


def _pads(x, window, strides, padding, dilation, channels_last):
  spatial = _spatial(x, channels_last)
  eff = [(k - 1) * d + 1 for k, d in zip(window, dilation)]
  if isinstance(padding, str):
    return [tuple(p) for p in lax.padtype_to_pads(spatial, eff, strides, padding)]
  return [tuple(p) for p in padding]


def _ceil_extra(size, eff, stride, lo, hi):
  """PyTorch's ceil_mode output size, as extra high padding (its documented formula; no extra
  padding where it gives no output)."""
  out_floor = max(0, (size + lo + hi - eff) // stride + 1)
  out = math.ceil((size + lo + hi - eff) / stride) + 1
  if (out - 1) * stride >= size + lo:
    out -= 1
  out = max(out, out_floor)
  return (out - 1) * stride + eff - (size + lo + hi) if out > 0 else 0


def lax_max_pool(x, window, strides=None, padding="VALID", dilation=None, layout="NHWC",
                 ceil_mode=False):
  nsd, cl = LAYOUTS[layout]
  strides = strides or (1,) * nsd
  dilation = dilation or (1,) * nsd
  pads = _pads(x, window, strides, padding, dilation, cl)
  if ceil_mode:
    eff = [(k - 1) * d + 1 for k, d in zip(window, dilation)]
    pads = [(lo, hi + _ceil_extra(s, e, st, lo, hi))
            for (lo, hi), s, e, st in zip(pads, _spatial(x, cl), eff, strides)]
  return lax.reduce_window(x, -jnp.inf, lax.max, _full(window, cl, 1), _full(strides, cl, 1),
                           _full(pads, cl, (0, 0)), window_dilation=_full(dilation, cl, 1))


def lax_avg_pool(x, window, strides=None, padding="VALID", dilation=None, layout="NHWC",
                 count_include_pad=True, ceil_mode=False):
  """Window sum of the zero-padded input over the window count of a padded 1/0 mask."""
  nsd, cl = LAYOUTS[layout]
  strides = strides or (1,) * nsd
  dilation = dilation or (1,) * nsd
  pads = _pads(x, window, strides, padding, dilation, cl)
  extra = [(0, 0)] * nsd
  if ceil_mode:
    eff = [(k - 1) * d + 1 for k, d in zip(window, dilation)]
    extra = [(0, _ceil_extra(s, e, st, lo, hi))
             for (lo, hi), s, e, st in zip(pads, _spatial(x, cl), eff, strides)]
  full_pads = _full(pads, cl, (0, 0))
  reduce = functools.partial(lax.reduce_window, init_value=0., computation=lax.add,
                             window_dimensions=_full(window, cl, 1),
                             window_strides=_full(strides, cl, 1),
                             padding=_full(extra, cl, (0, 0)),
                             window_dilation=_full(dilation, cl, 1))
  total = reduce(jnp.pad(x, full_pads))
  mask = jnp.pad(jnp.ones(x.shape, x.dtype), full_pads,
                 constant_values=1 if count_include_pad else 0)
  return total / reduce(mask)


def stacked_max_pool(x, window, strides=None, padding="VALID", dilation=None, layout="NHWC",
                     ceil_mode=False):
  """Max over a stack of the window's strided taps (lax has no max-pool VJP with dilation)."""
  nsd, cl = LAYOUTS[layout]
  strides = strides or (1,) * nsd
  dilation = dilation or (1,) * nsd
  y_shape = lax_max_pool(x, window, strides, padding, dilation, layout, ceil_mode).shape
  out = y_shape[1:1 + nsd] if cl else y_shape[2:]
  pads = _pads(x, window, strides, padding, dilation, cl)
  hi = [max(0, (o - 1) * s + (k - 1) * d + 1 - (n + lo))
        for o, s, k, d, n, (lo, _) in zip(out, strides, window, dilation, _spatial(x, cl), pads)]
  xp = jnp.pad(x, _full([(lo, h) for (lo, _), h in zip(pads, hi)], cl, (0, 0)),
               constant_values=-jnp.inf)
  taps = []
  for k in itertools.product(*(range(w) for w in window)):
    idx = tuple(slice(kk * d, kk * d + (o - 1) * s + 1, s)
                for kk, d, o, s in zip(k, dilation, out, strides))
    taps.append(xp[(slice(None), *idx, slice(None))] if cl else xp[(slice(None), slice(None),
                                                                     *idx)])
  return jnp.max(jnp.stack(taps), axis=0)


def case_inputs(shape, dtype=F64, seed=0):
  return rand(shape, dtype, seed=seed)


# ---------------------------------------------------------------------------------------------
# Geometry grid: (layout, input shape, window, strides, padding, dilation, ceil_mode).

GRID = [
    ("NHWC", (2, 9, 8, 3), (3, 3), (2, 2), "SAME", None, False),
    ("NHWC", (2, 9, 8, 3), (3, 3), (2, 2), "VALID", None, False),
    ("NHWC", (2, 7, 6, 5), (2, 3), (1, 2), ((1, 0), (2, 1)), None, False),  # asymmetric
    ("NHWC", (1, 3, 2, 2), (5, 4), (1, 1), ((2, 2), (1, 2)), None, False),  # window > input
    ("NHWC", (2, 8, 9, 3), (3, 2), (2, 3), ((1, 1), (0, 1)), (2, 3), False),  # dilation
    ("NHWC", (2, 8, 7, 4), (3, 3), (2, 2), ((1, 1), (1, 1)), None, True),  # ceil_mode
    ("NHWC", (2, 6, 6, 17), (2, 2), (2, 2), "VALID", None, True),
    ("NCHW", (2, 3, 9, 8), (3, 3), (2, 2), "SAME", None, False),
    ("NCHW", (2, 3, 7, 6), (2, 3), (1, 2), ((1, 0), (2, 1)), (1, 2), True),
    ("NWC", (3, 11, 4), (4,), (3,), ((1, 2),), None, False),
    ("NWC", (3, 10, 4), (3,), (2,), ((1, 1),), (2,), True),
    ("NCW", (3, 4, 11), (3,), (2,), "SAME", None, True),
    ("NDHWC", (1, 5, 6, 7, 3), (2, 3, 2), (2, 2, 1), "SAME", None, False),
    ("NDHWC", (1, 5, 6, 5, 2), (3, 2, 2), (2, 1, 2), ((1, 1), (0, 1), (1, 0)), (1, 2, 1), True),
    ("NCDHW", (2, 3, 5, 4, 6), (2, 2, 3), (1, 2, 2), "SAME", None, True),
    ("NCDHW", (1, 2, 6, 5, 4), (3, 3, 2), (2, 2, 2), "VALID", (1, 1, 2), False),
]


def _grid_id(case):
  layout, shape, window, strides, padding, dilation, ceil = case
  pad = padding if isinstance(padding, str) else "explicit"
  return (f"{layout}-{'x'.join(map(str, shape))}-w{'x'.join(map(str, window))}"
          f"-s{'x'.join(map(str, strides))}-{pad}" + (f"-d{dilation}" if dilation else "")
          + ("-ceil" if ceil else ""))


GRID_PARAMS = [pytest.param(c, id=_grid_id(c)) for c in GRID]


def _fns(case, op):
  """(jaxdnn pooling, lax oracle) of a grid case for op in max, avg, avg_exclusive."""
  layout, _, window, strides, padding, dilation, ceil = case
  common = dict(strides=strides, padding=padding)
  if op == "max":
    ours = functools.partial(jaxdnn.max_pool, window_shape=window, layout=layout,
                             window_dilation=dilation, ceil_mode=ceil, **common)
    # lax has no max-pool VJP with window dilation: the tap-stack oracle stands in.
    ref = functools.partial(stacked_max_pool if dilation else lax_max_pool, window=window,
                            dilation=dilation, layout=layout, ceil_mode=ceil, **common)
  else:
    include = op == "avg"
    ours = functools.partial(jaxdnn.avg_pool, window_shape=window, layout=layout,
                             window_dilation=dilation, ceil_mode=ceil,
                             count_include_pad=include, **common)
    ref = functools.partial(lax_avg_pool, window=window, dilation=dilation, layout=layout,
                            ceil_mode=ceil, count_include_pad=include, **common)
  return ours, ref


OPS = ("max", "avg", "avg_exclusive")


def _assert_same(out, ref, tol=1e-12, what="result"):
  out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
  assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
  np.testing.assert_array_equal(np.isnan(out), np.isnan(ref), err_msg=f"{what}: NaN positions")
  finite = np.isfinite(ref)
  np.testing.assert_array_equal(out[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)],
                                err_msg=f"{what}: infinities")
  np.testing.assert_allclose(out[finite], ref[finite], rtol=tol, atol=tol, err_msg=what)


CPU = jax.devices("cpu")[0]


def _test_devices():
  devices = [CPU]
  try:
    devices.append(jax.devices("gpu")[0])
  except RuntimeError:  # no GPU backend
    pass
  return devices


@pytest.fixture(autouse=True, params=_test_devices(), ids=lambda d: d.platform)
def device(request):
  """Runs the test with jax's default device set to the CPU, then to the GPU if there is one."""
  with jax.default_device(request.param):
    yield request.param


def oracle(fn, *args):
  """fn(*args) on the CPU device (arguments moved there), whatever device the test runs on."""
  with jax.default_device(CPU):
    return fn(*jax.device_put(args, CPU))


# ---------------------------------------------------------------------------------------------
# Forward.

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", GRID_PARAMS)
def test_forward_matches_lax(case, op):
  x = case_inputs(case[1])
  ours, ref = _fns(case, op)
  out, expected = ours(x), oracle(ref, x)
  if op == "max":
    np.testing.assert_array_equal(out, expected)
  else:
    _assert_same(out, expected)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", GRID_PARAMS)
def test_grad_matches_lax(case, op):
  x = case_inputs(case[1], seed=1)
  ours, ref = _fns(case, op)
  ct = case_inputs(jax.eval_shape(ref, x).shape, seed=2)
  loss = lambda f: (lambda x: jnp.vdot(f(x), ct))
  g_ref = oracle(lambda x, ct: jax.grad(lambda x: jnp.vdot(ref(x), ct))(x), x, ct)
  _assert_same(jax.grad(loss(ours))(x), g_ref, what="grad")
  t = case_inputs(x.shape, seed=3)
  _assert_same(jax.jvp(ours, (x,), (t,))[1],
               oracle(lambda x, t: jax.jvp(ref, (x,), (t,))[1], x, t), what="jvp")


def _random_pool_case(draw, st):
  """A random (layout, shape, window, strides, padding, dilation, ceil_mode) of _fns."""
  layout = draw(st.sampled_from(list(LAYOUTS)))
  nsd, cl = LAYOUTS[layout]
  spatial = [draw(st.integers(0 if nsd == 1 else 1, 7 if nsd < 3 else 4)) for _ in range(nsd)]
  n, c = draw(st.integers(0, 2)), draw(st.sampled_from([1, 2, 3, 8]))
  shape = (n, *spatial, c) if cl else (n, c, *spatial)
  window = tuple(draw(st.integers(1, 4)) for _ in range(nsd))
  strides = tuple(draw(st.integers(1, 3)) for _ in range(nsd))
  dilation = draw(st.sampled_from([None, tuple(draw(st.integers(1, 2)) for _ in range(nsd))]))
  padding = draw(st.sampled_from(["SAME", "VALID", "explicit"]))
  if padding == "explicit":
    padding = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(nsd))
  ceil = draw(st.booleans())
  return layout, shape, window, strides, padding, dilation, ceil


def test_random_geometries_match_lax():
  """Random layouts, sizes (empty axes and batches too), windows, strides, dilations, paddings and
  ceil_mode: forward, gradient and JVP of max / avg / exclusive avg against the float64 oracle."""
  hypothesis = pytest.importorskip("hypothesis")
  st = hypothesis.strategies

  @hypothesis.settings(max_examples=40, deadline=None, database=None)
  @hypothesis.given(data=st.data())
  def check(data):
    case = _random_pool_case(data.draw, st)
    op = data.draw(st.sampled_from(OPS))
    hypothesis.note(f"{case} {op}")
    ours, ref = _fns(case, op)
    x = case_inputs(case[1], seed=data.draw(st.integers(0, 2**16)))
    try:
      y_aval = jax.eval_shape(ref, x)
    except (ValueError, TypeError):
      hypothesis.assume(False)  # not a valid reduce_window (e.g. a window past the padded input)
    out = ours(x)
    expected = oracle(ref, x)
    assert out.shape == y_aval.shape
    if op == "max":
      np.testing.assert_array_equal(out, expected)
    else:
      _assert_same(out, expected)
    ct = case_inputs(y_aval.shape, seed=5)
    g = jax.grad(lambda x: jnp.vdot(ours(x), ct))(x)
    t = case_inputs(x.shape, seed=6)
    ty = jax.jvp(ours, (x,), (t,))[1]
    if x.size == 0:  # nothing to compare (and lax's select_and_scatter VJP fails on it)
      assert g.shape == x.shape and ty.shape == y_aval.shape
      return
    try:
      g_ref = oracle(lambda x, ct: jax.grad(lambda x: jnp.vdot(ref(x), ct))(x), x, ct)
    except TypeError:
      # lax's own reduce_window VJP rejects some geometries that its forward accepts (seen:
      # NDHWC (1, 1, 1, 2, 1), window (1, 1, 1), strides (1, 1, 2), SAME, ceil mode: "slice
      # limit_indices must be less than or equal to operand shape"); no reference gradient
      hypothesis.assume(False)
    _assert_same(g, g_ref, what="grad")
    _assert_same(ty, oracle(lambda x, t: jax.jvp(ref, (x,), (t,))[1], x, t), what="jvp")

  check()


FLAX_CASES = [
    ((2, 8, 7, 3), (3, 3), (2, 2), "SAME"),
    ((2, 8, 7, 3), (2, 2), None, "VALID"),
    ((2, 6, 5, 4), (3, 2), (2, 1), ((2, 1), (0, 1))),
    ((3, 9, 2), (3,), (2,), "SAME"),
    ((1, 4, 5, 4, 2), (2, 3, 2), (2, 2, 1), ((1, 0), (1, 1), (0, 1))),
    ((7, 6, 3), (3, 3), (1, 2), "SAME"),  # no batch dimension
    ((2, 3, 7, 6, 3), (3, 3), (2, 2), "SAME"),  # two batch dimensions
]


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("shape,window,strides,padding", FLAX_CASES)
def test_matches_flax(shape, window, strides, padding, count_include_pad):
  nn = pytest.importorskip("flax.linen")
  x = case_inputs(shape, seed=4)
  np.testing.assert_array_equal(jaxdnn.max_pool(x, window, strides, padding),
                                oracle(lambda x: nn.max_pool(x, window, strides, padding), x))
  _assert_same(jaxdnn.avg_pool(x, window, strides, padding, count_include_pad),
               oracle(lambda x: nn.avg_pool(x, window, strides, padding, count_include_pad), x))
  ct = case_inputs(jax.eval_shape(lambda x: nn.max_pool(x, window, strides, padding), x).shape,
                   seed=5)
  for ours, ref in ((jaxdnn.max_pool, nn.max_pool), (jaxdnn.avg_pool, nn.avg_pool)):
    kw = {} if ours is jaxdnn.max_pool else dict(count_include_pad=count_include_pad)
    g = jax.grad(lambda x: jnp.vdot(ours(x, window, strides, padding, **kw), ct))(x)
    g_ref = oracle(lambda x, ct: jax.grad(
        lambda x: jnp.vdot(ref(x, window, strides, padding, **kw), ct))(x), x, ct)
    _assert_same(g, g_ref, what=f"{ours.__name__} grad")


def test_ceil_mode_pytorch_values():
  """Outputs PyTorch's documented rules give (computed by hand from them)."""
  x = jnp.arange(5.0).reshape(1, 5, 1)
  assert jaxdnn.max_pool(x, (2,), (2,), ceil_mode=True).ravel().tolist() == [1, 3, 4]
  assert jaxdnn.avg_pool(x, (2,), (2,), ceil_mode=True).ravel().tolist() == [0.5, 2.5, 4.0]
  assert jaxdnn.max_pool(x, (2,), (2,)).ravel().tolist() == [1, 3]
  # The last window must start inside input + low padding: k=2, s=2, p=1 on 5 gives 3, not 4.
  y = jaxdnn.avg_pool(x, (2,), (2,), ((1, 1),), ceil_mode=True)
  assert y.ravel().tolist() == [0.0, 1.5, 3.5]
  x6 = jnp.arange(6.0).reshape(1, 6, 1)
  # Last window [5, pad, ceil-extension]: divisor 2 with the padding, 1 without.
  y = jaxdnn.avg_pool(x6, (3,), (2,), ((1, 1),), ceil_mode=True)
  np.testing.assert_allclose(y.ravel(), [1 / 3, 2, 4, 2.5], rtol=1e-15)
  y = jaxdnn.avg_pool(x6, (3,), (2,), ((1, 1),), count_include_pad=False, ceil_mode=True)
  np.testing.assert_allclose(y.ravel(), [0.5, 2, 4, 5], rtol=1e-15)
  assert jaxdnn.max_pool(x6, (3,), (2,), ((1, 1),), ceil_mode=True).ravel().tolist() == [1, 3, 5, 5]
  # A window longer than the padded input still gives one output in ceil mode (PyTorch:
  # (1 - 1 - 1 + 1) // 2 + 1 = 1), where floor mode gives none.
  x1 = jnp.arange(1.0, 2.0).reshape(1, 1, 1)
  assert jaxdnn.max_pool(x1, (2,), (2,), ceil_mode=True).ravel().tolist() == [1.0]
  assert jaxdnn.avg_pool(x1, (2,), (2,), ceil_mode=True).ravel().tolist() == [1.0]
  assert jaxdnn.max_pool(x1, (2,), (2,)).shape == (1, 0, 1)


def _numpy_pool_1d(x, k, s, p, d, ceil, op, include):
  """A NumPy loop over PyTorch's definitions (1-D, channels-last (N, L, C))."""
  n, size, c = x.shape
  span = size + 2 * p - d * (k - 1) - 1
  out = (span + (s - 1 if ceil else 0)) // s + 1
  if ceil and (out - 1) * s >= size + p:
    out -= 1
  y = np.empty((n, out, c))
  for o in range(out):
    taps = [o * s - p + j * d for j in range(k)]
    inside = [i for i in taps if 0 <= i < size]
    counted = [i for i in taps if (-p <= i < size + p) if include or 0 <= i < size]
    if op == "max":
      y[:, o] = x[:, inside].max(axis=1) if inside else -np.inf
    else:
      y[:, o] = x[:, inside].sum(axis=1) / len(counted)
  return y


@pytest.mark.parametrize("size,k,s,p,d", [(5, 2, 2, 0, 1), (6, 3, 2, 1, 1), (7, 3, 3, 1, 1),
                                          (10, 3, 2, 1, 2), (4, 4, 3, 2, 1), (9, 2, 4, 1, 1),
                                          (1, 2, 2, 0, 1), (3, 3, 2, 0, 2)])
@pytest.mark.parametrize("ceil", [False, True])
def test_ceil_mode_numpy_loop(size, k, s, p, d, ceil):
  x = np.asarray(case_inputs((2, size, 3), seed=6))
  pad = ((p, p),)
  for op, include in (("max", True), ("avg", True), ("avg", False)):
    if op == "max":
      y = jaxdnn.max_pool(x, (k,), (s,), pad, window_dilation=(d,), ceil_mode=ceil)
    else:
      y = jaxdnn.avg_pool(x, (k,), (s,), pad, count_include_pad=include,
                          window_dilation=(d,), ceil_mode=ceil)
    _assert_same(y, _numpy_pool_1d(x, k, s, p, d, ceil, op, include), what=f"{op} {include}")


# ---------------------------------------------------------------------------------------------
# Ties, infinities, NaN.

def _ref_max_nhwc(x, window=(3, 3), strides=(2, 2), padding="SAME"):
  return lax_max_pool(x, window, strides, padding)


def test_ties_gradient_goes_to_first_index():
  x = jnp.array([1.0, 3.0, 3.0, 2.0, 3.0]).reshape(1, 5, 1)
  g = jax.grad(lambda x: jaxdnn.max_pool(x, (2,), (1,)).sum())(x)
  assert g.ravel().tolist() == [0, 2, 1, 0, 1]  # windows [1,3] [3,3] [3,2] [2,3]
  g = jax.grad(lambda x: jaxdnn.max_pool(x, (3,), (1,), "SAME").sum())(x)
  g_ref = oracle(jax.grad(lambda x: lax_max_pool(x, (3,), (1,), "SAME", layout="NWC").sum()), x)
  np.testing.assert_array_equal(g, g_ref)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_ties_match_lax(layout):
  """Gradients go where jax.grad of lax's max reduce_window sends them; the JVP picks the same
  arg-max (lax's own JVP, select_and_gather_add, breaks 2-D ties differently on XLA:CPU, so the
  oracle is the tangent at the arg-max that lax's gradient selects)."""
  shape = (2, 7, 8, 3) if layout == "NHWC" else (2, 3, 7, 8)
  x = jnp.asarray(np.random.default_rng(7).integers(0, 3, shape), jnp.float64)  # many ties
  ours = lambda x: jaxdnn.max_pool(x, (3, 3), (2, 2), "SAME", layout=layout)
  ref = lambda x: lax_max_pool(x, (3, 3), (2, 2), "SAME", layout=layout)
  y_ref = oracle(ref, x)
  ct = case_inputs(y_ref.shape, seed=8)
  np.testing.assert_array_equal(ours(x), y_ref)
  # the same positions; the sums of overlapping windows may round differently
  _assert_same(jax.grad(lambda x: jnp.vdot(ours(x), ct))(x),
               oracle(lambda x, ct: jax.grad(lambda x: jnp.vdot(ref(x), ct))(x), x, ct),
               what="grad")
  # one-hot rows from lax's grad
  selection = np.asarray(oracle(jax.jacrev(ref), x)).reshape(y_ref.size, x.size)
  assert np.all(selection.sum(axis=1) == 1)
  t = case_inputs(x.shape, seed=9)
  np.testing.assert_array_equal(jax.jvp(ours, (x,), (t,))[1].ravel(),
                                selection @ np.asarray(t).ravel())


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("special", ["neg_inf", "nan", "pos_inf", "mixed"])
def test_inf_nan_like_lax(special, layout):
  x = np.array(case_inputs((2, 6, 7, 3), seed=10))
  rng = np.random.default_rng(11)
  mask = rng.random(x.shape) < 0.25
  values = {"neg_inf": -np.inf, "nan": np.nan, "pos_inf": np.inf}
  if special == "mixed":
    x[mask] = rng.choice([-np.inf, np.inf, np.nan], size=mask.sum())
  else:
    x[mask] = values[special]
  x[0, :3, :3, 0] = -np.inf  # a window of only -inf
  x = jnp.asarray(x)
  # jaxdnn runs in `layout`; the oracles in NHWC
  to_layout = (lambda a: a) if layout == "NHWC" else (lambda a: jnp.transpose(a, (0, 3, 1, 2)))
  from_layout = (lambda a: a) if layout == "NHWC" else (lambda a: jnp.transpose(a, (0, 2, 3, 1)))
  max_pool = lambda x: from_layout(jaxdnn.max_pool(to_layout(x), (3, 3), (2, 2), "SAME",
                                                   layout=layout))
  avg_pool = lambda x, include: from_layout(jaxdnn.avg_pool(to_layout(x), (3, 3), (2, 2), "SAME",
                                                            include, layout=layout))
  y_ref = oracle(_ref_max_nhwc, x)
  _assert_same(max_pool(x), y_ref, what="max")
  for include in (True, False):
    _assert_same(avg_pool(x, include),
                 oracle(lambda x: lax_avg_pool(x, (3, 3), (2, 2), "SAME",
                                               count_include_pad=include), x), what="avg")
  ct = case_inputs(y_ref.shape, seed=12)
  g = jax.grad(lambda x: jnp.vdot(max_pool(x), ct))(x)
  g_ref = oracle(lambda x, ct: jax.grad(lambda x: jnp.vdot(_ref_max_nhwc(x), ct))(x), x, ct)
  _assert_same(g, g_ref, what="grad")


@pytest.mark.parametrize("values,pad,window", [
    ([-np.inf, -np.inf], (1, 0), 3), ([-np.inf, -np.inf], (0, 1), 3), ([np.nan, 1.0], (1, 0), 3),
    ([np.nan, -np.inf], (0, 1), 3), ([np.nan, -np.inf], (0, 0), 2), ([2.0, np.nan, 2.0], (1, 1), 3),
])
def test_padding_takes_part_in_selection(values, pad, window):
  """lax's select_and_scatter treats padding as -inf candidates that route nowhere."""
  x = jnp.asarray(values).reshape(1, -1, 1)
  ours = jax.grad(lambda x: jaxdnn.max_pool(x, (window,), (1,), (pad,)).sum())(x)
  ref = oracle(jax.grad(lambda x: lax_max_pool(x, (window,), (1,), (pad,), layout="NWC").sum()),
               x)
  np.testing.assert_array_equal(ours, ref)


def test_all_padding_windows():
  """Windows entirely in the padding: -inf for max, NaN (0/0) for exclusive avg, like lax."""
  x = case_inputs((1, 2, 2, 1))
  pads = ((3, 0), (0, 0))
  y = jaxdnn.max_pool(x, (2, 2), (1, 1), pads)
  assert np.isneginf(y[0, 0, 0, 0])
  _assert_same(y, oracle(lambda x: lax_max_pool(x, (2, 2), (1, 1), pads), x))
  y = jaxdnn.avg_pool(x, (2, 2), (1, 1), pads, count_include_pad=False)
  assert np.isnan(y[0, 0, 0, 0])
  _assert_same(y, oracle(lambda x: lax_avg_pool(x, (2, 2), (1, 1), pads, count_include_pad=False),
                         x))
  g = jax.grad(lambda x: jaxdnn.max_pool(x, (2, 2), (1, 1), pads).sum())(x)
  np.testing.assert_array_equal(
      g, oracle(jax.grad(lambda x: lax_max_pool(x, (2, 2), (1, 1), pads).sum()), x))


# ---------------------------------------------------------------------------------------------
# Sizes and dtypes.

@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_size_zero(layout):
  shape = (0, 5, 5, 3) if layout == "NHWC" else (0, 3, 5, 5)
  x = jnp.zeros(shape, jnp.float32)
  for fn in (jaxdnn.max_pool, jaxdnn.avg_pool):
    y = fn(x, (2, 2), (2, 2), "SAME", layout=layout)
    assert y.shape == ((0, 3, 3, 3) if layout == "NHWC" else (0, 3, 3, 3))
    g = jax.grad(lambda x: fn(x, (2, 2), (2, 2), "SAME", layout=layout).sum())(x)
    assert g.shape == shape
  # lax gives an empty output when the window does not fit
  y = jaxdnn.max_pool(jnp.ones((1, 2, 2, 1)), (3, 3))
  assert y.shape == (1, 0, 0, 1) == lax_max_pool(jnp.ones((1, 2, 2, 1)), (3, 3)).shape
  assert jaxdnn.global_avg_pool(jnp.zeros((0, 4, 4, 2))).shape == (0, 2)


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_narrow_dtypes(dtype, layout):
  shape = (2, 9, 8, 16) if layout == "NHWC" else (2, 16, 9, 8)
  x = case_inputs(shape, dtype, seed=13)
  x64 = x.astype(F64)
  y = jaxdnn.max_pool(x, (3, 3), (2, 2), "SAME", layout=layout)
  assert y.dtype == dtype
  np.testing.assert_array_equal(
      y.astype(F64), oracle(lambda x: lax_max_pool(x, (3, 3), (2, 2), "SAME", layout=layout), x64))
  for include in (True, False):
    y = jaxdnn.avg_pool(x, (3, 3), (2, 2), "SAME", include, layout=layout)
    assert y.dtype == dtype
    assert_close(y, oracle(lambda x: lax_avg_pool(x, (3, 3), (2, 2), "SAME", layout=layout,
                                                  count_include_pad=include), x64),
                 RTOL[dtype], "avg")
  ct = case_inputs(y.shape, dtype, seed=14)
  for ours, ref in ((jaxdnn.max_pool, lax_max_pool), (jaxdnn.avg_pool, lax_avg_pool)):
    g = jax.grad(lambda x: jnp.vdot(ours(x, (3, 3), (2, 2), "SAME", layout=layout), ct)
                 .astype(F32))(x)
    assert g.dtype == dtype
    g_ref = oracle(lambda x, ct: jax.grad(lambda x: jnp.vdot(
        ref(x, (3, 3), (2, 2), "SAME", layout=layout), ct.astype(F64)))(x), x64, ct)
    assert_close(g, g_ref, RTOL[dtype], f"{ours.__name__} grad")


# Shapes that reach the CUDA pooling kernels' vector and tiled forms (kernel named beside each;
# the standalone checker tests/cuda/pool covers them too), in the narrow dtypes: forward,
# gradient and, for max, the JVP against the float64 oracle.
KERNEL_PATHS = [
    # 16-byte channel vectors: window_fwd (packed 16-bit max), the arg-max selection with the
    # channel-tile backward, the disjoint-window backward / avg_bwd
    ("NHWC", (2, 16, 33, 16), (2, 2), (2, 2), "VALID", False),
    ("NHWC", (2, 16, 33, 16), (3, 3), (1, 1), "SAME", False),
    # avg over 2x2 cells (cell_avg forward / backward), ceil mode's partial cells
    ("NHWC", (2, 9, 7, 8), (2, 2), (2, 2), "VALID", True),
    # one-channel planes (channels-first): plane_fwd / plane_select / plane_bwd tiles
    ("NCHW", (2, 3, 16, 40), (2, 2), (2, 2), "VALID", False),
    ("NCHW", (2, 3, 16, 40), (3, 3), (1, 1), "SAME", False),
    # one-channel 3x3 stride 2, low width padding 1, rows of whole 16-byte vectors
    ("NCHW", (2, 4, 13, 24), (3, 3), (2, 2), ((1, 1), (1, 1)), False),
]


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
@pytest.mark.parametrize("path", KERNEL_PATHS, ids=lambda c: _grid_id((*c[:5], None, c[5])))
def test_kernel_paths(path, dtype):
  layout, shape, window, strides, padding, ceil = path
  x = case_inputs(shape, dtype, seed=17)
  x64 = x.astype(F64)
  t = case_inputs(shape, dtype, seed=18)
  for op in OPS:
    ours, ref = _fns((layout, shape, window, strides, padding, None, ceil), op)
    y = ours(x)
    assert y.dtype == dtype
    want = oracle(ref, x64)
    if op == "max":  # a selection: exact
      np.testing.assert_array_equal(y.astype(F64), want)
      _, ty = jax.jvp(ours, (x,), (t,))
      ty_ref = oracle(lambda x, t: jax.jvp(ref, (x,), (t,))[1], x64, t.astype(F64))
      np.testing.assert_array_equal(ty.astype(F64), ty_ref, err_msg="max jvp")
    else:
      assert_close(y, want, RTOL[dtype], op)
    ct = case_inputs(y.shape, dtype, seed=19)
    g = jax.grad(lambda x: jnp.vdot(ours(x), ct).astype(F32))(x)
    assert g.dtype == dtype
    g_ref = oracle(lambda x, ct: jax.grad(lambda x: jnp.vdot(ref(x), ct))(x), x64,
                   ct.astype(F64))
    assert_close(g, g_ref, RTOL[dtype], f"{op} grad")


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_global_pools_kernel_paths(dtype):
  """The ResNet head (7x7 windows over 16-byte channel vectors: the split forward, the vector
  avg backward) and a max window of more than 255 taps (arg-max taps kept as int32)."""
  for shape in ((4, 7, 7, 64), (2, 18, 18, 8)):
    x = case_inputs(shape, dtype, seed=24)
    x64 = x.astype(F64)
    ct = case_inputs((shape[0], shape[-1]), dtype, seed=25)
    # max: a one-window reduce_window, whose gradient goes to the first of tied taps (jnp.max
    # would share it among them)
    top = lambda x: lax_max_pool(x, shape[1:3]).reshape(shape[0], shape[-1])
    for ours, ref in ((jaxdnn.global_avg_pool, lambda x: jnp.mean(x, (1, 2))),
                      (jaxdnn.global_max_pool, top)):
      y = ours(x)
      assert y.dtype == dtype
      assert_close(y, oracle(ref, x64), RTOL[dtype], ours.__name__)
      g = jax.grad(lambda x: jnp.vdot(ours(x), ct).astype(F32))(x)
      g_ref = oracle(lambda x, ct: jax.grad(lambda x: jnp.vdot(ref(x), ct))(x), x64,
                     ct.astype(F64))
      assert_close(g, g_ref, RTOL[dtype], f"{ours.__name__} grad {shape}")


# ---------------------------------------------------------------------------------------------
# Derivatives of every order.

@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_check_grads_order2(layout):
  nsd, cl = LAYOUTS[layout]
  spatial = (5, 6, 4)[:nsd]
  shape = (2, *spatial, 3) if cl else (2, 3, *spatial)
  window, strides = (3, 2, 2)[:nsd], (2, 1, 2)[:nsd]
  x = case_inputs(shape, seed=15)  # continuous values: no ties
  for include in (True, False):
    f = lambda x: jaxdnn.avg_pool(x, window, strides, "SAME", include, layout=layout,
                                  ceil_mode=True)
    check_grads(f, (x,), order=2, modes=("fwd", "rev"))
  f = lambda x: jaxdnn.max_pool(x, window, strides, "SAME", layout=layout, ceil_mode=True)
  check_grads(f, (x,), order=2, modes=("fwd", "rev"), eps=1e-4)
  f = lambda x: jnp.sin(jaxdnn.max_pool(x * x, window, strides, "SAME", layout=layout)).sum()
  check_grads(f, (x,), order=2, modes=("fwd", "rev"), eps=1e-4)


def test_higher_order_max_pool_matches_lax():
  """grad-of-grad, jvp-of-grad and third order go through the gather/scatter pair only."""
  x = case_inputs((2, 7, 6, 3), seed=16)
  f = lambda pool: (lambda x: jnp.sum(jnp.sin(pool(x * x))))
  ours = f(lambda x: jaxdnn.max_pool(x, (3, 3), (2, 2), "SAME"))
  ref = f(lambda x: lax_max_pool(x, (3, 3), (2, 2), "SAME"))
  t = case_inputs(x.shape, seed=17)
  hvp = lambda fn: (lambda x, t: jax.jvp(jax.grad(fn), (x,), (t,))[1])
  _assert_same(hvp(ours)(x, t), oracle(hvp(ref), x, t), what="hvp")
  gg = lambda fn: (lambda x: jax.grad(lambda x: jnp.sum(jax.grad(fn)(x) ** 3))(x))
  _assert_same(gg(ours)(x), oracle(gg(ref), x), what="grad of grad")
  names = {e.primitive.name for e in jax.make_jaxpr(gg(ours))(x).jaxpr.eqns}
  assert not names & {"reduce_window_max", "select_and_scatter_add", "select_and_gather_add"}


# ---------------------------------------------------------------------------------------------
# vmap, jit, and what the HLO holds.

def _custom_calls(fn, *args):
  text = jax.jit(fn).lower(*args).as_text()
  calls = re.findall(r"stablehlo\.custom_call @(\w+)", text)
  assert "reduce_window" not in text and "select_and_scatter" not in text, text
  assert "while" not in text, "a loop in the lowered HLO"
  return calls


VMAP_FNS = {
    # name -> (f(x, v) built from jaxdnn, same from lax, number of pooling custom calls)
    "max_fwd": (lambda x, v: jaxdnn.max_pool(x, (3, 3), (2, 2), "SAME"),
                lambda x, v: lax_max_pool(x, (3, 3), (2, 2), "SAME"), 1),
    "avg_fwd": (lambda x, v: jaxdnn.avg_pool(x, (3, 3), (2, 2), "SAME", False),
                lambda x, v: lax_avg_pool(x, (3, 3), (2, 2), "SAME", count_include_pad=False),
                1),
    "max_jvp": (lambda x, v: jax.jvp(lambda x: jaxdnn.max_pool(x, (3, 3), (2, 2), "SAME"),
                                     (x,), (v,))[1],
                lambda x, v: jax.jvp(lambda x: lax_max_pool(x, (3, 3), (2, 2), "SAME"),
                                     (x,), (v,))[1], 1),
    "avg_jvp": (lambda x, v: jax.jvp(lambda x: jaxdnn.avg_pool(x, (3, 3), (2, 2), "SAME"),
                                     (x,), (v,))[1],
                lambda x, v: jax.jvp(lambda x: lax_avg_pool(x, (3, 3), (2, 2), "SAME"),
                                     (x,), (v,))[1], 1),
    "max_vjp": (lambda x, v: jax.vjp(lambda x: jaxdnn.max_pool(x, (3, 3), (2, 2), "SAME"),
                                     x)[1](v[:, ::2, ::2])[0],
                lambda x, v: jax.vjp(lambda x: lax_max_pool(x, (3, 3), (2, 2), "SAME"),
                                     x)[1](v[:, ::2, ::2])[0], 1),
    "avg_vjp": (lambda x, v: jax.vjp(lambda x: jaxdnn.avg_pool(x, (3, 3), (2, 2), "SAME"),
                                     x)[1](v[:, ::2, ::2])[0],
                lambda x, v: jax.vjp(lambda x: lax_avg_pool(x, (3, 3), (2, 2), "SAME"),
                                     x)[1](v[:, ::2, ::2])[0], 1),
}


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0), (3, 1), (1, None)],
                         ids=str)
@pytest.mark.parametrize("name", list(VMAP_FNS))
def test_vmap(name, in_axes):
  ours, ref, n_calls = VMAP_FNS[name]
  if name.endswith("fwd") and in_axes[0] is None:
    pytest.skip("the forward ignores v")
  shape = (2, 6, 6, 3)
  xs = case_inputs(shape, seed=18)
  vs = case_inputs(shape, seed=19)
  batch = 3
  def batched(a, axis, seed):
    return a if axis is None else jnp.moveaxis(
        jnp.stack([a * (i + 1) + seed * i for i in range(batch)]), 0, axis)
  x, v = batched(xs, in_axes[0], 0.25), batched(vs, in_axes[1], 0.5)
  out = jax.vmap(ours, in_axes)(x, v)
  _assert_same(out, oracle(jax.vmap(ref, in_axes), x, v), what="vmap")
  calls = [c for c in _custom_calls(jax.vmap(ours, in_axes), x, v) if "pool" in c]
  assert len(calls) == n_calls, calls
  # nested vmap
  nested = [a if ax is None else jnp.stack([a, 2 * a], ax)
            for a, ax in ((x, in_axes[0]), (v, in_axes[1]))]
  _assert_same(jax.vmap(jax.vmap(ours, in_axes), in_axes)(*nested),
               oracle(jax.vmap(jax.vmap(ref, in_axes), in_axes), *nested), what="nested vmap")
  # a size-0 mapped axis
  if all(ax in (0, None) for ax in in_axes):
    empty = [a if ax is None else a[:0] for a, ax in ((x, in_axes[0]), (v, in_axes[1]))]
    assert jax.vmap(ours, in_axes)(*empty).shape[0] == 0


@pytest.mark.parametrize("layout", ["NCHW", "NDHWC", "NCW"])
def test_vmap_layouts_and_gather_scatter_pairs(layout):
  nsd, cl = LAYOUTS[layout]
  spatial = (5, 4, 6)[:nsd]
  shape = (2, *spatial, 3) if cl else (2, 3, *spatial)
  pool = lambda x: jaxdnn.max_pool(x, (2,) * nsd, (2,) * nsd, "SAME", layout=layout)
  ref = lambda x: lax_max_pool(x, (2,) * nsd, (2,) * nsd, "SAME", layout=layout)
  x = jnp.stack([case_inputs(shape, seed=s) for s in range(4)], axis=1)
  hvp = lambda f: (lambda x, t: jax.jvp(jax.grad(lambda x: jnp.sum(jnp.sin(f(x)))), (x,),
                                        (t,))[1])
  t = case_inputs(x.shape, seed=20)
  _assert_same(jax.vmap(hvp(pool), (1, 1))(x, t), oracle(jax.vmap(hvp(ref), (1, 1)), x, t))


def test_jit_matches_eager_and_one_call_per_op():
  x = case_inputs((2, 8, 8, 4), seed=21)
  f = lambda x: jaxdnn.max_pool(x, (3, 3), (2, 2), "SAME") + 0.5 * jaxdnn.avg_pool(
      x, (3, 3), (2, 2), "SAME")
  np.testing.assert_array_equal(jax.jit(f)(x), f(x))
  assert sorted(_custom_calls(f, x)) == ["jaxdnn_avg_pool_fwd", "jaxdnn_max_pool_fwd"]
  grad_calls = _custom_calls(jax.grad(lambda x: jnp.sum(f(x))), x)
  assert sorted(grad_calls) == ["jaxdnn_avg_pool_bwd", "jaxdnn_max_pool_scatter"]
  g = jax.grad(lambda x: jnp.sum(jnp.sin(f(x))))
  np.testing.assert_array_equal(jax.jit(g)(x), g(x))


def test_deterministic():
  x = jnp.asarray(np.random.default_rng(22).integers(0, 4, (4, 32, 32, 8)), jnp.float32)
  g = jax.jit(jax.grad(lambda x: jnp.sum(jnp.cos(jaxdnn.avg_pool(x, (5, 5), (1, 1), "SAME"))
                                         + jaxdnn.max_pool(x, (3, 3), (1, 1), "SAME") ** 2)))
  first = np.asarray(g(x))
  for _ in range(3):
    np.testing.assert_array_equal(np.asarray(g(x)), first)


# ---------------------------------------------------------------------------------------------
# Global pools.

@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_global_pools(layout):
  nsd, cl = LAYOUTS[layout]
  spatial = (5, 3, 4)[:nsd]
  shape = (2, *spatial, 6) if cl else (2, 6, *spatial)
  axes = tuple(range(1, 1 + nsd)) if cl else tuple(range(2, 2 + nsd))
  x = case_inputs(shape, seed=23)
  mean, top = oracle(lambda x: (jnp.mean(x, axes, keepdims=True), jnp.max(x, axes,
                                                                          keepdims=True)), x)
  _assert_same(jaxdnn.global_avg_pool(x, layout=layout), mean.reshape(x.shape[0], -1))
  np.testing.assert_array_equal(jaxdnn.global_max_pool(x, layout=layout),
                                top.reshape(x.shape[0], -1))
  _assert_same(jaxdnn.global_avg_pool(x, layout=layout, keepdims=True), mean)
  np.testing.assert_array_equal(jaxdnn.global_max_pool(x, layout=layout, keepdims=True), top)
  check_grads(lambda x: jaxdnn.global_avg_pool(x, layout=layout), (x,), order=2)
  check_grads(lambda x: jaxdnn.global_max_pool(x, layout=layout), (x,), order=2, eps=1e-4)
  if cl and nsd == 2:
    np.testing.assert_array_equal(jaxdnn.global_max_pool(x), top.reshape(x.shape[0], -1))


@pytest.mark.parametrize("dtype", [F32, BF16, F64], ids=str)
@pytest.mark.parametrize("spatial", [(3, 3), (4, 4), (7, 7), (5, 10), (2, 17), (1, 1)], ids=str)
def test_global_max_channels_first_blocks_of_planes(spatial, dtype):
  """Channels-first global max over 40 planes (the CPU kernel reduces planes of rows <= 16 wide 16
  at a time in vector registers, then 8 planes one by one; wider rows take the scalar loop), with
  NaN, -inf-only and +-0 ties planted: bitwise jnp.max, and the gradient to the first of tied
  taps."""
  x = np.array(case_inputs((4, 10, *spatial), F64, seed=26)).reshape(40, -1)
  x[3, -1] = np.nan
  x[5, :] = -np.inf
  x[7, :] = -1.0
  x[7, -1] = 0.0
  x[8, :] = 0.0
  x[8, 0] = -0.0
  x[20, 0] = np.inf
  x[39, :] = np.nan
  x = jnp.asarray(x.reshape(4, 10, *spatial)).astype(dtype)
  y = jax.jit(lambda a: jaxdnn.global_max_pool(a, layout="NCHW"))(x)
  # compared in float32 (exact for every dtype here): some numpy / ml_dtypes versions do not
  # match bfloat16 NaNs as equal
  np.testing.assert_array_equal(np.asarray(y, F64), np.asarray(jnp.max(x, (2, 3)), F64))
  ct = case_inputs((4, 10), dtype, seed=27)
  top = lambda a: lax_max_pool(jnp.moveaxis(a, 1, -1), spatial).reshape(4, 10)
  g = jax.grad(lambda a: jnp.vdot(jaxdnn.global_max_pool(a, layout="NCHW"), ct).astype(F32))(x)
  g_ref = jax.grad(lambda a: jnp.vdot(top(a), ct).astype(F32))(x)
  np.testing.assert_array_equal(np.asarray(g, F64), np.asarray(g_ref, F64))


# ---------------------------------------------------------------------------------------------
# Errors (the CUDA lowering is checked in test_lowering_cuda.py).

X = jnp.zeros((2, 6, 6, 3), jnp.float32)

BAD = [
    (lambda: jaxdnn.max_pool(X, (2, 2), (2,)), ValueError, "strides"),
    (lambda: jaxdnn.max_pool(X, (2, 0)), ValueError, "window_shape"),
    (lambda: jaxdnn.max_pool(X, (2, "a")), TypeError, "window_shape"),
    (lambda: jaxdnn.max_pool(X, 2), TypeError, "window_shape"),
    (lambda: jaxdnn.max_pool(X, (2, 2, 2, 2)), ValueError, "window_shape"),
    (lambda: jaxdnn.max_pool(X, (2, 2), (0, 1)), ValueError, "strides"),
    (lambda: jaxdnn.max_pool(X, (2, 2), padding="FULL"), ValueError, "padding"),
    (lambda: jaxdnn.max_pool(X, (2, 2), padding=((1, 1),)), ValueError, "padding"),
    (lambda: jaxdnn.max_pool(X, (2, 2), padding=((1, "a"), (1, 1))), TypeError, "padding"),
    (lambda: jaxdnn.max_pool(X, (2, 2), layout="NHCW"), ValueError, "layout"),
    (lambda: jaxdnn.max_pool(X, (2, 2), layout="NDHWC"), ValueError, "layout"),
    (lambda: jaxdnn.max_pool(X, (2, 2), window_dilation=(1,)), ValueError, "window_dilation"),
    (lambda: jaxdnn.max_pool(X, (2, 2), ceil_mode="yes"), TypeError, "ceil_mode"),
    (lambda: jaxdnn.max_pool(X.astype(jnp.int32), (2, 2)), TypeError, "inputs"),
    (lambda: jaxdnn.avg_pool(jnp.zeros((6, 3)), (2, 2)), ValueError, "inputs"),
    (lambda: jaxdnn.global_avg_pool(jnp.zeros((2, 3))), ValueError, "rank"),
    (lambda: jaxdnn.global_max_pool(X, layout="NCW"), ValueError, "rank"),
    (lambda: jaxdnn.global_max_pool(jnp.zeros((2, 0, 3, 1))), ValueError, "non-empty"),
]


@pytest.mark.parametrize("fn,exc,match", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_arguments(fn, exc, match):
  with pytest.raises(exc, match=match):
    fn()


def test_primitive_shape_checks():
  geometry = pool_prims.PoolGeometry(True, (6, 6), (2, 2), (2, 2), (1, 1), (0, 0), (0, 0),
                                     (0, 0), (0, 0))
  with pytest.raises(ValueError, match="do not match the geometry"):
    pool_prims.max_pool(jnp.zeros((2, 5, 6, 3)), geometry)
  with pytest.raises(ValueError, match="rank"):
    pool_prims.avg_pool(jnp.zeros((2, 6, 6)), geometry)
  with pytest.raises(TypeError, match="share a dtype"):
    pool_prims.max_pool_gather_p.bind(jnp.zeros((2, 6, 6, 3)), jnp.zeros((2, 6, 6, 3),
                                      jnp.float32), geometry=geometry)

