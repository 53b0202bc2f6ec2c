"""WINOGRAD_NONFUSED with an explicit output tile: algo="winograd_nonfused_f2x2" / "_f4x4" /
"_f6x6" (jaxdnn.TiledAlgo). Parsing, refusals, every operation against float64 lax within the
tile's bound (tests/tolerances.py TILE_RTOL), the tile kept through grad / jvp / vmap and on
every custom call (the convolutions' and the filter transforms' `tile` attributes), and `auto`
never picking an explicit tile. The same tests run on the GPU (F(6x6): float32 / float64 only).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxdnn
from grid import NCHW, NHWC, Case
from helpers import LOWERING_PLATFORM, jaxdnn_eqns, lax_conv_hi, problems, rand
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvOp
from tolerances import BF16, F32, F64, assert_close, relative_error, tolerance

WINO = jaxdnn.ConvAlgo.WINOGRAD_NONFUSED
TILED = {m: jaxdnn.TiledAlgo(WINO, m) for m in (2, 4, 6)}
HI = jax.lax.Precision.HIGHEST
TILE_PARAMS = [pytest.param(m, id=f"f{m}x{m}") for m in (2, 4, 6)]

CASES = [
    Case("1x1-image-c3", (2, 1, 1, 3), (3, 3, 3, 2), (1, 1), "SAME", dnums=NHWC),
    Case("5x7-not-tile-multiple", (2, 5, 7, 3), (3, 3, 3, 4), (1, 1), "SAME", dnums=NHWC),
    Case("13x11-nchw", (2, 5, 13, 11), (4, 5, 3, 3), (1, 1), "SAME", dnums=NCHW),
    Case("groups3-nhwc", (2, 8, 9, 6), (3, 3, 2, 9), (1, 1), "SAME", dnums=NHWC, fgc=3),
    Case("asymmetric-negative-padding-nchw", (2, 4, 10, 11), (3, 4, 3, 3), (1, 1),
         ((-1, 2), (3, -1)), dnums=NCHW),
    Case("padding-beyond-filter", (1, 6, 6, 2), (3, 3, 2, 3), (1, 1), ((4, 0), (0, 5)),
         dnums=NHWC),
]


def _ops(case, algo, dtype, seed=0):
  """(forward, backward-data, backward-filter) of jaxdnn and of float64 lax."""
  x, w = rand(case.lhs, dtype, seed=seed), rand(case.rhs, dtype, seed=seed + 1)
  ref = functools.partial(lax_conv_hi, **case.kwargs())
  ct = rand(jax.eval_shape(ref, x, w).shape, dtype, seed=seed + 2)
  mine = functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo, precision=HI)

  def vjp_all(f, *args):
    y, vjp = jax.vjp(f, *args[:2])
    return (y, *vjp(args[2]))
  return (vjp_all(mine, x, w, ct),
          vjp_all(ref, x.astype(F64), w.astype(F64), ct.astype(F64)))


# ---------------------------------------------------------------------------------------------
# The algo argument.

@pytest.mark.parametrize("text, tile", [("winograd_nonfused_f2x2", 2), ("WINOGRAD_NONFUSED_F4X4", 4),
                                        (" Winograd_Nonfused_f6x6 ", 6)])
def test_parse_tile_strings(text, tile):
  algo = algorithms.parse_algo(text)
  assert algo == jaxdnn.TiledAlgo(WINO, tile) and hash(algo) == hash(TILED[tile])
  assert algo.family is WINO and algo.tile == tile and algo.id == WINO.id
  assert algo.name == f"WINOGRAD_NONFUSED_F{tile}X{tile}"
  assert algorithms.parse_algo(algo.value) == algo
  assert algorithms.parse_algo("winograd_nonfused") is WINO  # the default tile: the family


@pytest.mark.parametrize("text", ["winograd_nonfused_f3x3", "winograd_nonfused_f8x8",
                                  "winograd_nonfused_f4x2", "winograd_f2x2", "gemm_f4x4",
                                  "winograd_nonfused_6"])
def test_bad_tile_strings_raise_naming_algo(text):
  with pytest.raises(ValueError, match="algo"):
    jaxdnn.conv(jnp.zeros((1, 5, 5, 2)), jnp.zeros((3, 3, 2, 2)), (1, 1), "SAME",
                dimension_numbers=NHWC, algo=text)


def test_tiled_algo_checks_family_and_tile():
  with pytest.raises(ValueError, match="only WINOGRAD_NONFUSED takes an explicit tile"):
    jaxdnn.TiledAlgo(jaxdnn.ConvAlgo.GEMM, 4)
  with pytest.raises(ValueError, match="WINOGRAD_NONFUSED tile must be one of"):
    jaxdnn.TiledAlgo(WINO, 3)


def test_unsupported_geometry_names_the_tiled_algo():
  x, w = rand((1, 9, 9, 2), F32), rand((5, 5, 2, 3), F32)
  with pytest.raises(ValueError, match=r"algo=WINOGRAD_NONFUSED_F6X6 cannot run .*3x3 filter"
                                       r".*Families that can:"):
    jaxdnn.conv(x, w, (1, 1), "SAME", dimension_numbers=NHWC, algo="winograd_nonfused_f6x6")


def test_backend_refuses_a_tile_on_another_family():
  """The C++ support query: a tile with another family, and a tile that does not exist."""
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1),
                          (1, 1))
  module = jaxdnn._src.ffi.extension(LOWERING_PLATFORM)
  problem = dict(g.problem_dict(1, 4, 4), tile=6)
  why = module.can_implement(0, jaxdnn.ConvAlgo.DIRECT.id, problem, 0, 0, 2)
  assert "takes no output tile" in why
  assert module.can_implement(0, WINO.id, problem, 0, 0, 2) == ""
  with pytest.raises(ValueError, match="tile must be 2, 4 or 6"):
    module.can_implement(0, WINO.id, dict(problem, tile=5), 0, 0, 2)


# ---------------------------------------------------------------------------------------------
# Numbers.

@pytest.mark.parametrize("dtype", [pytest.param(F64, id="float64"), pytest.param(F32, id="float32")])
@pytest.mark.parametrize("tile", TILE_PARAMS)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_all_ops_match_lax(case, tile, dtype):
  algo = TILED[tile]
  got, want = _ops(case, algo, dtype)
  for name, a, b in zip(("forward", "backward-data", "backward-filter"), got, want):
    assert a.dtype == dtype
    assert_close(a, b, tolerance(dtype, precision=HI, algo=algo), f"{case.id} {algo.name} {name}")


@pytest.mark.parametrize("tile", TILE_PARAMS)
def test_float32_error_on_a_realistic_layer(tile):
  """The tile's float32 bound on a ResNet-like layer (C = K = 128, N*tiles in the hundreds);
  F(6x6) measured 4.4e-6 here against its 5e-5 bound, F(2x2) 3.6e-7, F(4x4) 2.3e-6."""
  case = Case("r50-like", (2, 28, 28, 128), (3, 3, 128, 128), (1, 1), "SAME", dnums=NHWC)
  got, want = _ops(case, TILED[tile], F32, seed=5)
  errs = [relative_error(a, b) for a, b in zip(got, want)]
  assert max(errs) <= {2: 2e-6, 4: 1e-5, 6: 2e-5}[tile], errs
  if tile == 6:  # larger tiles lose accuracy: F(6x6) is measurably worse than F(2x2)
    errs2 = [relative_error(a, b) for a, b in zip(*_ops(case, TILED[2], F32, seed=5))]
    assert min(errs) > max(errs2), (errs, errs2)


def test_16bit_operands():
  case = CASES[1]
  for algo in (TILED[2], TILED[6]):
    x, w = rand(case.lhs, BF16, seed=1), rand(case.rhs, BF16, seed=2)
    conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo)
    if LOWERING_PLATFORM == "cuda" and algo.tile == 6:
      with pytest.raises(ValueError, match=r"F\(6x6,3x3\) runs float32 and float64"):
        conv(x, w)
      continue
    y = conv(x, w)
    assert y.dtype == BF16
    assert_close(y, lax_conv_hi(x.astype(F64), w.astype(F64), **case.kwargs()),
                 tolerance(BF16, algo=algo))


def test_check_grads_second_order_f6x6():
  case = CASES[2]
  x, w = rand(case.lhs, F64, seed=3), rand(case.rhs, F64, seed=4)
  conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo="winograd_nonfused_f6x6")
  check_grads(conv, (x, w), order=2, modes=("fwd", "rev"))


# ---------------------------------------------------------------------------------------------
# The tile survives transformations and reaches every custom call.

def _algos_of(fn, *args):
  return {e.params["algo"] for e in jaxdnn_eqns(fn, *args)}


@pytest.mark.parametrize("tile", TILE_PARAMS)
def test_grad_jvp_vmap_keep_the_tile(tile):
  case = CASES[2]
  algo = TILED[tile]
  x, w = rand(case.lhs, F32, seed=1), rand(case.rhs, F32, seed=2)
  conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo, precision=HI)
  loss = lambda x, w: jnp.sum(conv(x, w) ** 2)
  fns = {
      "grad": (jax.grad(loss, argnums=(0, 1)), (x, w)),
      "grad-of-grad": (jax.grad(lambda x, w: jnp.sum(jax.grad(loss)(x, w) ** 2), argnums=1),
                       (x, w)),
      "jvp": (lambda x, w: jax.jvp(conv, (x, w), (x, w)), (x, w)),
      "vmap-x": (jax.vmap(conv, in_axes=(0, None)), (jnp.stack([x, x]), w)),
      "vmap-w": (jax.vmap(conv, in_axes=(None, 0)), (x, jnp.stack([w, w]))),
      "vmap-both": (jax.vmap(jax.grad(loss, argnums=1)), (jnp.stack([x, x]), jnp.stack([w, w]))),
  }
  for name, (fn, args) in fns.items():
    assert _algos_of(fn, *args) == {algo}, name
    ops = {op for op, *_ in problems(fn, *args)}
    assert ops, name
    # and every custom call carries the tile: convolutions and filter transforms
    hlo = jax.jit(fn).lower(*args).as_text()
    calls = [l for l in hlo.splitlines() if "custom_call @jaxdnn_" in l]
    assert calls, name
    for line in calls:
      assert f"tile = {tile} : i32" in line, (name, line[:200])
      if "@jaxdnn_winograd_filter" in line:
        assert re.search(rf"-> tensor<{(tile + 2) ** 2}x", line), (name, line[-120:])


def test_vmap_results_match_unbatched():
  case = CASES[3]
  algo = TILED[6]
  xs, ws = rand((3, *case.lhs), F32, seed=1), rand((3, *case.rhs), F32, seed=2)
  conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo, precision=HI)
  want = jnp.stack([conv(xs[i], ws[i]) for i in range(3)])
  assert_close(jax.vmap(conv)(xs, ws), want, 1e-6, "vmap both")
  assert_close(jax.vmap(conv, in_axes=(0, None))(xs, ws[0]),
               jnp.stack([conv(xs[i], ws[0]) for i in range(3)]), 1e-6, "vmap x")


def test_filter_shape_query_gives_the_explicit_tile():
  """F(6x6) on a 1x1 image (a mostly cropped tile): the queries keep tile 6 for every op."""
  case = CASES[0]
  x, w = jnp.zeros(case.lhs, F32), jnp.zeros(case.rhs, F32)
  conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo=TILED[6])
  fn = jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1))
  for op, g, n, c, k, kin, kout, prec in problems(fn, x, w):
    spec = algorithms.winograd_filter_shape(LOWERING_PLATFORM, op, TILED[6], g, n, c, k, kin,
                                            kout, prec)
    if op == ConvOp.BACKWARD_FILTER:
      assert spec is None
    else:
      assert spec[0] == 6 and spec[1][0] == 64
      default = algorithms.winograd_filter_shape(LOWERING_PLATFORM, op, WINO, g, n, c, k, kin,
                                                 kout, prec)
      assert default[0] == 2  # the family's own choice for a 1x1 output
    assert algorithms.workspace_bytes(LOWERING_PLATFORM, op, TILED[6], g, n, c, k, kin, kout,
                                      prec) > 0


def test_different_tiles_do_not_share_a_transform():
  case = CASES[2]
  x, w = rand(case.lhs, F32, seed=1), rand(case.rhs, F32, seed=2)
  f = lambda x, w: [jaxdnn.conv(x, w, **case.kwargs(), algo=a, precision=HI)
                    for a in (TILED[6], TILED[4], WINO, TILED[6])]
  hlo = jax.jit(f).lower(x, w).compile().as_text()
  # F(6x6) twice shares one U; F(4x4) explicit and the family default (F(4x4) here) share one.
  assert len(re.findall(r"custom_call_target=\"jaxdnn_winograd_filter\"", hlo)) == 2, hlo
  ys = jax.jit(f)(x, w)
  np.testing.assert_array_equal(np.asarray(ys[0]), np.asarray(ys[3]))
  np.testing.assert_array_equal(np.asarray(ys[1]), np.asarray(ys[2]))


def test_fused_epilogue_with_a_tile():
  case = CASES[2]
  x, w = rand(case.lhs, F32, seed=1), rand(case.rhs, F32, seed=2)
  b = rand((case.rhs[0],), F32, seed=3)
  y = jaxdnn.conv(x, w, **case.kwargs(), algo="winograd_nonfused_f6x6", precision=HI, bias=b,
                  activation="relu")
  ref = lax_conv_hi(x.astype(F64), w.astype(F64), **case.kwargs())
  ref = np.maximum(ref + np.asarray(b, F64).reshape(1, -1, 1, 1), 0)
  assert_close(y, ref, tolerance(F32, precision=HI, algo=TILED[6]), "fused f6x6")
  jaxpr = jax.make_jaxpr(lambda x, w: jaxdnn.conv(x, w, **case.kwargs(), algo=TILED[6], bias=b,
                                                   activation="relu"))(x, w)
  algos = {e.params["algo"] for e in jaxpr.jaxpr.eqns if "algo" in e.params}
  assert algos == {TILED[6]}


# ---------------------------------------------------------------------------------------------
# auto.

@pytest.mark.parametrize("op", list(ConvOp))
def test_auto_never_picks_an_explicit_tile(op):
  for hw, c in (((56, 56), 64), ((7, 7), 512), ((3, 3), 2048)):
    g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, hw, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1),
                            (1, 1))
    for platform in ("cpu", "cuda"):
      order = algorithms._heuristic_order(platform, op, g, 4, c, c, np.float32,
                                          algorithms.MathPrecision.HIGHEST)
      assert all(isinstance(a, jaxdnn.ConvAlgo) for a in order)
    pick = algorithms.choose_algorithm("cpu", op, "auto", g, 4, c, c, np.float32, np.float32,
                                       algorithms.MathPrecision.HIGHEST)
    assert isinstance(pick, jaxdnn.ConvAlgo)
  assert algorithms.supported_algorithms("cpu", op, g, 4, 64, 64, np.float32, np.float32,
                                         algorithms.MathPrecision.HIGHEST)


def test_gpu_auto_stops_picking_f4x4_past_2048_channels():
  """On the GPU, auto's WINOGRAD_NONFUSED (F(4x4)) needs C/G and K/G <= 2048, the largest
  channel count whose float32 error was measured (2.2e-6 on the H200)."""
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1),
                          (1, 1))
  order = functools.partial(algorithms._heuristic_order, "cuda", ConvOp.FORWARD, g, 4,
                            in_dtype=np.float32, precision=algorithms.MathPrecision.HIGHEST)
  assert order(2048, 2048)[0] == WINO
  assert WINO not in order(4096, 256)
  assert WINO not in order(256, 4096)
