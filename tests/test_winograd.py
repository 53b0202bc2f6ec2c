"""WINOGRAD_NONFUSED and WINOGRAD on the CPU and (where the CUDA kernels take the case) on the
GPU: tile edge cases, both tile sizes, float32 error, refusals.

WINOGRAD_NONFUSED uses F(4x4, 3x3) unless the output of a pass is smaller than 4 on a side, where
it uses F(2x2, 3x3); WINOGRAD (fused) F(2x2, 3x3), except on CUDA for channels-last 32/16-bit
operands with channels per group a multiple of 8 and outputs of at least 4x4, which run F(4x4, 3x3)
on the tensor cores (test_lowering_cuda checks which tile the lowering takes). Images
smaller than a tile, sizes that are not multiples of the tile, negative and
asymmetric padding (tiles reading past the image), groups, channel counts 1 and 3, depth slices of
a 3-D problem and chunked tile loops (a float64 problem bigger than one chunk) are covered below,
each for forward, backward-data and backward-filter against float64 lax.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxdnn
from grid import NCHW, NDHWC, NHWC, NWC, Case
from helpers import (LOWERING_PLATFORM, PLATFORM, general_families_for, lax_conv_hi,
                     listed_families, problems, rand, require_supported)
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvOp
from tolerances import BF16, F16, F32, F64, assert_close, tolerance

WINO = jaxdnn.ConvAlgo.WINOGRAD_NONFUSED
FUSED = jaxdnn.ConvAlgo.WINOGRAD

CASES = [
    Case("1x1-image-c3", (2, 1, 1, 3), (3, 3, 3, 2), (1, 1), "SAME", dnums=NHWC),
    Case("2x3-image-c1", (1, 2, 3, 1), (3, 3, 1, 2), (1, 1), "SAME", dnums=NHWC),
    Case("3x3-image-valid-c1-nchw", (2, 1, 3, 3), (1, 1, 3, 3), (1, 1), "VALID", dnums=NCHW),
    Case("5x7-not-tile-multiple", (2, 5, 7, 3), (3, 3, 3, 4), (1, 1), "SAME", dnums=NHWC),
    Case("9x6-valid-nchw", (2, 3, 9, 6), (5, 3, 3, 3), (1, 1), "VALID", dnums=NCHW),
    Case("4x13-mixed-tiles", (1, 4, 13, 2), (3, 3, 2, 3), (1, 1), ((0, 0), (1, 1)), dnums=NHWC),
    Case("groups3-nhwc", (2, 8, 9, 6), (3, 3, 2, 9), (1, 1), "SAME", dnums=NHWC, fgc=3),
    Case("groups2-nchw", (1, 4, 10, 7), (6, 2, 3, 3), (1, 1), "SAME", dnums=NCHW, fgc=2),
    Case("depthwise-nhwc", (2, 7, 7, 4), (3, 3, 1, 4), (1, 1), "SAME", dnums=NHWC, fgc=4),
    Case("asymmetric-negative-padding-nchw", (2, 4, 10, 11), (3, 4, 3, 3), (1, 1),
         ((-1, 2), (3, -1)), dnums=NCHW),
    Case("padding-beyond-filter", (1, 6, 6, 2), (3, 3, 2, 3), (1, 1), ((4, 0), (0, 5)),
         dnums=NHWC),
    Case("3d-depth-slices", (2, 3, 5, 6, 2), (1, 3, 3, 2, 3), (1, 1, 1),
         ((0, 0), (1, 1), (1, 1)), dnums=NDHWC),
]
PARAMS = [pytest.param(c, id=c.id) for c in CASES]


def _vjp_all(conv):
  """(y, dx, dw) of conv at (x, w) with cotangent ct."""
  def f(x, w, ct):
    y, vjp = jax.vjp(conv, x, w)
    return (y, *vjp(ct))
  return f


def _check_all_ops(case, dtype, seed=0, algo=WINO):
  x = rand(case.lhs, dtype, seed=seed)
  w = rand(case.rhs, dtype, seed=seed + 1)
  ref = functools.partial(lax_conv_hi, **case.kwargs())
  ct = rand(jax.eval_shape(ref, x, w).shape, dtype, seed=seed + 2)
  # HIGHEST: on the GPU the float32 bound is then the Winograd one (1e-5), not TF32's.
  mine = _vjp_all(functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo,
                                    precision=jax.lax.Precision.HIGHEST))
  require_supported(algo, mine, x, w, ct)
  got = mine(x, w, ct)
  want = _vjp_all(ref)(x.astype(F64), w.astype(F64), ct.astype(F64))
  errors = {}
  for name, a, b in zip(("forward", "backward-data", "backward-filter"), got, want):
    assert a.dtype == dtype
    assert_close(a, b, tolerance(dtype, precision=jax.lax.Precision.HIGHEST, algo=algo),
                 f"{case.id} {algo.name} {name}")
    errors[name] = float(np.linalg.norm(np.asarray(a, F64) - b) / max(np.linalg.norm(b), 1e-300))
  assert len(errors) == 3
  return errors


def test_odd_cases_are_supported():
  """None of the cases above may be skipped: they are all 2-D 3x3 stride-1 problems."""
  for case in CASES:
    x, w = jnp.zeros(case.lhs, F32), jnp.zeros(case.rhs, F32)
    conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo=WINO)
    fn = jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1))
    for op, g, n, c, k, kin, kout, prec in problems(fn, x, w):
      assert algorithms.unsupported_reason(LOWERING_PLATFORM, op, WINO, g, n, c, k, kin, kout,
                                           prec) == ""


@pytest.mark.parametrize("algo", [WINO, FUSED], ids=lambda a: a.value)
@pytest.mark.parametrize("dtype", [pytest.param(F64, id="float64"), pytest.param(F32, id="float32")])
@pytest.mark.parametrize("case", PARAMS)
def test_all_ops_match_lax(case, dtype, algo):
  _check_all_ops(case, dtype, algo=algo)


def test_fused_many_tile_blocks():
  """More tiles than one fused block, blocks split over the threads, channels not a multiple of
  the transform's channel block."""
  case = Case("fused-blocks", (3, 21, 19, 20), (3, 3, 20, 18), (1, 1), "SAME", dnums=NHWC)
  for dtype in (F64, F32):
    _check_all_ops(case, dtype, algo=FUSED)


def test_fused_backward_filter_slices():
  """The fused backward-filter's tile slices: more tile blocks than slices (several blocks per
  slice), a slice count set by the accumulator memory cap (many channels), groups; and the
  result is the same bitwise on a second call (slices are added in a fixed order)."""
  cases = [
      Case("fused-wgrad-blocks", (5, 30, 31, 6), (3, 3, 6, 5), (1, 1), "SAME", dnums=NHWC),
      Case("fused-wgrad-groups-nchw", (2, 8, 20, 17), (12, 4, 3, 3), (1, 1), ((0, 2), (1, 0)),
           dnums=NCHW, fgc=2),
  ]
  for case in cases:
    _check_all_ops(case, F32, algo=FUSED)
    x, w = rand(case.lhs, F32, seed=5), rand(case.rhs, F32, seed=6)
    conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo=FUSED)
    dw = jax.jit(jax.grad(lambda w: jnp.sum(conv(x, w) ** 2)))
    np.testing.assert_array_equal(np.asarray(dw(w)), np.asarray(dw(w)))


def test_chunked_tile_loop_float64():
  """More tiles than one workspace chunk holds: the chunk loop and the backward-filter
  accumulation across chunks (float64: the chunk holds fewer tiles)."""
  _check_all_ops(Case("chunked", (2, 30, 30, 64), (3, 3, 64, 64), (1, 1), "SAME", dnums=NHWC),
                 F64)


def test_float32_error_on_a_realistic_layer():
  """F(4x4, 3x3) in float32 stays within the 1e-5 bound on a ResNet-like layer (C = K = 128;
  measured 2-3e-6 on the benchmark layers up to C = K = 256)."""
  case = Case("r50-like", (2, 28, 28, 128), (3, 3, 128, 128), (1, 1), "SAME", dnums=NHWC)
  errors = _check_all_ops(case, F32, seed=5)
  assert max(errors.values()) <= 1e-5, errors


@pytest.mark.skipif(PLATFORM != "gpu", reason="the CUDA GEMM choice; a ~60 GFLOP float64 reference")
def test_float32_wgmma_gemm_regime_on_the_gpu():
  """A layer in the regime where, on sm_90, WINOGRAD_NONFUSED's per-point GEMMs of the forward
  and backward-data passes run on wgmma by default (reduction >= 256 channels, > 64 outputs,
  >= 4 waves of CTAs: 2048 tiles x 2 column blocks x 36 points here): within the float32 bound.
  On other GPUs the same case runs the mma.sync GEMM."""
  case = Case("wgmma-gemm", (2, 128, 128, 256), (3, 3, 256, 256), (1, 1), "SAME", dnums=NHWC)
  errors = _check_all_ops(case, F32, seed=7)
  assert max(errors.values()) <= 1e-5, errors


@pytest.mark.parametrize("dtype", [pytest.param(BF16, id="bfloat16"), pytest.param(F16, id="float16")])
def test_16bit_inputs_go_through_float32(dtype):
  _check_all_ops(CASES[3], dtype)


@pytest.mark.parametrize("case", [CASES[1], CASES[7], CASES[9]], ids=lambda c: c.id)
def test_check_grads_second_order(case):
  x = rand(case.lhs, F64, seed=3)
  w = rand(case.rhs, F64, seed=4)
  conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo=WINO)
  check_grads(conv, (x, w), order=2, modes=("fwd", "rev"))


REFUSED = [
    pytest.param(dict(window_strides=(2, 2)), (3, 3), "window_strides 1", id="stride2"),
    pytest.param(dict(window_strides=(1, 1)), (5, 5), "3x3 filter", id="5x5"),
    pytest.param(dict(window_strides=(1, 1)), (3, 1), "3x3 filter", id="3x1"),
    pytest.param(dict(window_strides=(1, 1), rhs_dilation=(2, 2)), (3, 3), "rhs_dilation 1",
                 id="rhs-dilation"),
    pytest.param(dict(window_strides=(1, 1), lhs_dilation=(2, 2), padding=((2, 2), (2, 2))),
                 (3, 3), "lhs_dilation 1", id="lhs-dilation"),
]


@pytest.mark.parametrize("kwargs, filt, reason", REFUSED)
def test_unsupported_geometry_raises_naming_families_that_can(kwargs, filt, reason):
  x = rand((1, 9, 9, 2), F32)
  w = rand((*filt, 2, 3), F32)
  kwargs = {"padding": "SAME", **kwargs}
  call = functools.partial(jaxdnn.conv, x, w, dimension_numbers=NHWC, **kwargs)
  with pytest.raises(ValueError, match="Families that can:") as info:
    call(algo=WINO)
  msg = str(info.value)
  assert "algo=WINOGRAD_NONFUSED" in msg and reason in msg, msg
  listed = listed_families(msg)
  for family in general_families_for(kwargs.get("lhs_dilation"), kwargs.get("window_strides")):
    assert family.name in listed, msg
  assert WINO.name not in listed and FUSED.name not in listed, msg
  with pytest.raises(ValueError, match=reason):
    call(algo=FUSED)
  # `auto` never picks it there, and still runs.
  y = call(algo="auto")
  assert_close(y, lax_conv_hi(x.astype(F64), w.astype(F64), dimension_numbers=NHWC, **kwargs),
               tolerance(F32))


def test_1d_filter_refused():
  x = rand((2, 9, 3), F32)
  w = rand((3, 3, 4), F32)
  for algo in (WINO, FUSED):
    with pytest.raises(ValueError, match="2-D 3x3 filter"):
      jaxdnn.conv(x, w, (1,), "SAME", dimension_numbers=NWC, algo=algo)


@pytest.mark.parametrize("op", list(ConvOp))
def test_auto_picks_winograd_for_dense_3x3_only(op):
  def geom(stride, filt=3):
    return jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (56, 56), (filt, filt), (stride, stride),
                               (1, 1), (1, 1), (filt // 2,) * 2, (filt // 2,) * 2)
  pick = functools.partial(algorithms.choose_algorithm, "cpu", op, "auto")
  args = (np.float32, np.float32, algorithms.MathPrecision.HIGHEST)
  assert pick(geom(1), 4, 64, 64, *args) == WINO
  assert pick(geom(1), 4, 256, 256, *args) == WINO
  assert pick(geom(2), 4, 64, 64, *args) != WINO
  assert pick(geom(1, 5), 4, 64, 64, *args) != WINO
  assert pick(geom(1), 4, 3, 64, *args) != WINO  # a 3-channel stem: transforms dominate
