"""FFT and FFT_TILING: transform sizes and tiles, odd geometries, dtypes, refusals.

FFT transforms whole images (one tile per image, 5-smooth lengths >= extent + filter - 1);
FFT_TILING cuts the output into overlap-save tiles whose lengths a cost model picks, so the cases
below run it both with one tile and with many tiles that do not divide the image. Every case is
checked for forward, backward-data and backward-filter against float64 lax: images smaller than
a tile, sizes that are not multiples of the tile, channel counts 1 and 3 (and counts that do not
fill a lane block), negative / asymmetric / beyond-the-filter padding, groups and depthwise, 1-D
(long filters), 2-D and 3-D, both layouts, and a batch large enough to be cut into chunks.

The numerical tests run on the default backend (the CUDA kernels on a GPU machine), skipping the
cases a backend's family refuses (the GPU's whole-image FFT is limited to 4096 transform
points); the tests of CPU tile plans and refusals ask the CPU extension, and those of the CUDA
plans ask the CUDA extension (on CPU-only machines too, when it is built).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxdnn
from grid import NCDHW, NCHW, NCW, NDHWC, NHWC, NWC, Case
from helpers import (FFT_FAMILIES, general_families_for, lax_conv_hi,
                     listed_families, problems, rand, require_supported)
from jaxdnn._src import algorithms, ffi
from jaxdnn._src.geometry import ConvOp
from tolerances import BF16, F16, F32, F64, assert_close, relative_error, tolerance

CUDA = ffi.extension("cuda")
needs_cuda_extension = pytest.mark.skipif(
    CUDA is None, reason="the jaxdnn CUDA extension (_jaxdnn_cuda) is not built in this install")
HIGHEST = algorithms.MathPrecision.HIGHEST

FFT = jaxdnn.ConvAlgo.FFT
TILING = jaxdnn.ConvAlgo.FFT_TILING

CASES = [
    Case("1x1-image-c3", (2, 1, 1, 3), (3, 3, 3, 2), (1, 1), "SAME", dnums=NHWC),
    Case("2x3-image-c1", (1, 2, 3, 1), (3, 3, 1, 2), (1, 1), "SAME", dnums=NHWC),
    Case("5x7-c3-k4", (2, 5, 7, 3), (3, 3, 3, 4), (1, 1), "SAME", dnums=NHWC),
    Case("9x6-valid-nchw", (2, 3, 9, 6), (5, 3, 3, 3), (1, 1), "VALID", dnums=NCHW),
    Case("5x5-filter-odd-image", (2, 13, 11, 3), (5, 5, 3, 4), (1, 1), "SAME", dnums=NHWC),
    Case("7x3-filter-asymmetric-padding-nchw", (1, 3, 12, 10), (4, 3, 7, 3), (1, 1),
         ((4, 1), (0, 2)), dnums=NCHW),
    Case("even-filter-same", (2, 8, 9, 2), (4, 2, 2, 5), (1, 1), "SAME", dnums=NHWC),
    Case("groups3-nhwc", (2, 8, 9, 6), (3, 3, 2, 9), (1, 1), "SAME", dnums=NHWC, fgc=3),
    Case("groups2-5x5-nchw", (1, 4, 10, 7), (6, 2, 5, 5), (1, 1), "SAME", dnums=NCHW, fgc=2),
    Case("depthwise-nhwc", (2, 7, 7, 4), (3, 3, 1, 4), (1, 1), "SAME", dnums=NHWC, fgc=4),
    Case("negative-padding-nchw", (2, 4, 10, 11), (3, 4, 3, 3), (1, 1), ((-1, 2), (3, -1)),
         dnums=NCHW),
    Case("padding-beyond-filter", (1, 6, 6, 2), (3, 3, 2, 3), (1, 1), ((4, 0), (0, 5)),
         dnums=NHWC),
    Case("channels-17-to-33", (2, 9, 9, 17), (3, 3, 17, 33), (1, 1), "SAME", dnums=NHWC),
    Case("tiled-2d-not-tile-multiple", (1, 70, 45, 3), (5, 5, 3, 2), (1, 1), "SAME",
         dnums=NHWC),
    Case("1d-ncw-valid", (2, 3, 40), (4, 3, 7), (1,), "VALID", dnums=NCW),
    Case("1d-long-filter-tiled", (2, 3000, 2), (127, 2, 3), (1,), ((70, 56),), dnums=NWC),
    Case("1x31-filter-2d", (2, 3, 100, 4), (1, 31, 4, 4), (1, 1), "SAME", dnums=NHWC),
    Case("3d-ndhwc", (1, 5, 6, 7, 2), (3, 3, 3, 2, 3), (1, 1, 1), "SAME", dnums=NDHWC),
    Case("3d-ncdhw-depth-1-filter", (2, 2, 3, 5, 6), (3, 2, 1, 3, 3), (1, 1, 1),
         ((0, 0), (1, 1), (2, 0)), dnums=NCDHW),
]
PARAMS = [pytest.param(c, id=c.id) for c in CASES]
ALGO_PARAMS = [pytest.param(a, id=a.value) for a in FFT_FAMILIES]


def _vjp_all(conv):
  """(y, dx, dw) of conv at (x, w) with cotangent ct."""
  def f(x, w, ct):
    y, vjp = jax.vjp(conv, x, w)
    return (y, *vjp(ct))
  return f


def _check_all_ops(case, dtype, algo, seed=0, preferred=None, tol=None):
  x = rand(case.lhs, dtype, seed=seed)
  w = rand(case.rhs, dtype, seed=seed + 1)
  ref = functools.partial(lax_conv_hi, **case.kwargs())
  out_dtype = dtype if preferred is None else preferred
  ct = rand(jax.eval_shape(ref, x, w).shape, out_dtype, seed=seed + 2)
  mine = _vjp_all(functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo,
                                    preferred_element_type=preferred))
  require_supported(algo, mine, x, w, ct)
  got = mine(x, w, ct)
  want = _vjp_all(ref)(x.astype(F64), w.astype(F64), ct.astype(F64))
  errors = {}
  for name, a, b in zip(("forward", "backward-data", "backward-filter"), got, want):
    # The gradients come back in the operands' dtype (16-bit with preferred_element_type).
    bound = (max(tolerance(dtype, preferred, algo=algo), tolerance(a.dtype, algo=algo))
             if tol is None else tol)
    assert_close(a, b, bound, f"{case.id} {algo.name} {name}")
    errors[name] = relative_error(a, b)
  return errors


def _tiles(op, algo, case_or_geometry, n, c, k):
  module = ffi.extension("cpu")
  return module.fft_tiles(int(op), algo.id, case_or_geometry.problem_dict(n, c, k))


def _geometries(case):
  """(op, geometry, N, C, K) of the kernels that fwd / dgrad / wgrad of the case run."""
  x, w = jnp.zeros(case.lhs, F32), jnp.zeros(case.rhs, F32)
  conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo=FFT)
  fn = jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1))
  return [(op, g, n, c, k) for op, g, n, c, k, *_ in problems(fn, x, w)]


def test_every_case_is_supported_and_the_tiles_vary():
  """None of the cases may be refused; FFT is one tile per image, FFT_TILING cuts the large
  ones into several tiles that do not divide the extent."""
  tiled_somewhere = []
  for case in CASES:
    geoms = _geometries(case)
    assert {g[0] for g in geoms} == set(ConvOp), case.id
    for op, g, n, c, k in geoms:
      for algo in FFT_FAMILIES:
        why = algorithms.unsupported_reason("cpu", op, algo, g, n, c, k, F32, F32,
                                            algorithms.MathPrecision.HIGHEST)
        assert why == "", (case.id, algo, why)
      lengths, tiles = _tiles(op, FFT, g, n, c, k)
      assert all(t <= 1 for t in tiles), (case.id, tiles)
      lengths, tiles = _tiles(op, TILING, g, n, c, k)
      if max(tiles) > 1:
        tiled_somewhere.append(case.id)
  assert {"tiled-2d-not-tile-multiple", "1d-long-filter-tiled"} <= set(tiled_somewhere)


def test_tiled_extent_is_not_a_multiple_of_the_tile():
  case = CASES[[c.id for c in CASES].index("1d-long-filter-tiled")]
  (op, g, n, c, k), *_ = _geometries(case)
  assert op == ConvOp.FORWARD
  (l0, l1, length), (t0, t1, tiles) = _tiles(op, TILING, g, n, c, k)
  out = g.out_spatial[0]
  tile_out = length - 127 + 1
  assert tiles > 1 and out % tile_out != 0, (length, tiles, out)


@pytest.mark.parametrize("algo", ALGO_PARAMS)
@pytest.mark.parametrize("dtype", [pytest.param(F64, id="float64"), pytest.param(F32, id="float32")])
@pytest.mark.parametrize("case", PARAMS)
def test_all_ops_match_lax(case, dtype, algo):
  _check_all_ops(case, dtype, algo)


@pytest.mark.parametrize("algo", ALGO_PARAMS)
def test_batch_and_channels_cut_into_chunks(algo):
  """More images (tiles) than one workspace chunk of spectra holds, and a filter spectrum cut
  into channel chunks (float64: wider spectra), so that FFT runs two row chunks x two channel
  chunks in all three operations."""
  case = Case("chunked", (40, 20, 20, 32), (5, 5, 32, 32), (1, 1), "SAME", dnums=NHWC)
  _check_all_ops(case, F64, algo)


@pytest.mark.parametrize("algo", ALGO_PARAMS)
def test_float32_error_on_the_inception_5x5_layer(algo):
  """inc_5x5 of benchmarks/layers-cpu.txt (N = 4, 28x28, 32 -> 64): float32 within 1e-5 of
  float64 (measured ~3e-7, benchmarks/results/cpu-2core-fft-2026-11-30.md)."""
  case = Case("inc_5x5", (4, 28, 28, 32), (5, 5, 32, 64), (1, 1), "SAME", dnums=NHWC)
  errors = _check_all_ops(case, F32, algo, seed=7, tol=1e-5)
  assert max(errors.values()) <= 1e-6, errors


def test_float32_error_on_a_long_1d_filter():
  case = Case("audio", (2, 4000, 4), (255, 4, 4), (1,), "SAME", dnums=NWC)
  errors = _check_all_ops(case, F32, TILING, seed=3, tol=1e-5)
  assert max(errors.values()) <= 1e-6, errors


@pytest.mark.parametrize("algo", ALGO_PARAMS)
@pytest.mark.parametrize("dtype", [pytest.param(BF16, id="bfloat16"), pytest.param(F16, id="float16")])
def test_16bit_inputs_go_through_float32(dtype, algo):
  _check_all_ops(CASES[4], dtype, algo)


@pytest.mark.parametrize("dtype, preferred", [(BF16, F32), (F32, F64)], ids=["bf16-f32", "f32-f64"])
def test_preferred_element_type(dtype, preferred):
  _check_all_ops(CASES[13], dtype, TILING, preferred=preferred)


@pytest.mark.parametrize("algo", ALGO_PARAMS)
@pytest.mark.parametrize("case", [CASES[3], CASES[7], CASES[15]], ids=lambda c: c.id)
def test_check_grads_second_order(case, algo):
  x = rand(case.lhs, F64, seed=3)
  w = rand(case.rhs, F64, seed=4)
  if case.id.startswith("1d-long"):  # keep the numerical differentiation cheap
    x, w = x[:, :400], w[:, :, :1]
  conv = functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo)
  check_grads(conv, (x, w), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0)], ids=["x", "w", "both"])
def test_vmap_folds_into_the_kernel(in_axes):
  """vmap over the operands: one kernel per operation, grouped when the filter is batched."""
  case = CASES[4]
  xb = rand((3, *case.lhs), F64, seed=1)
  wb = rand((3, *case.rhs), F64, seed=2)
  x = xb if in_axes[0] == 0 else xb[0]
  w = wb if in_axes[1] == 0 else wb[0]
  mine = jax.vmap(functools.partial(jaxdnn.conv, **case.kwargs(), algo=TILING), in_axes)
  ref = jax.vmap(functools.partial(lax_conv_hi, **case.kwargs()), in_axes)
  assert_close(mine(x, w), ref(x, w), tolerance(F64))
  grads = jax.grad(lambda x, w: jnp.sum(mine(x, w) ** 2), argnums=(0, 1))(x, w)
  want = jax.grad(lambda x, w: jnp.sum(ref(x, w) ** 2), argnums=(0, 1))(x, w)
  for a, b in zip(grads, want):
    assert_close(a, b, tolerance(F64))


REFUSED = [
    pytest.param(dict(window_strides=(2, 2)), "needs window_strides 1, got (2, 2)", id="stride2"),
    pytest.param(dict(window_strides=(1, 3)), "needs window_strides 1, got (1, 3)",
                 id="stride-1x3"),
    pytest.param(dict(window_strides=(1, 1), rhs_dilation=(2, 1)),
                 "needs rhs_dilation 1, got (2, 1)", id="rhs-dilation"),
    pytest.param(dict(window_strides=(1, 1), lhs_dilation=(2, 2), padding=((2, 2), (2, 2))),
                 "needs lhs_dilation 1, got (2, 2)", id="lhs-dilation"),
]


@pytest.mark.parametrize("algo", ALGO_PARAMS)
@pytest.mark.parametrize("kwargs, reason", REFUSED)
def test_unsupported_geometry_raises_naming_families_that_can(kwargs, reason, algo):
  x = rand((1, 9, 9, 2), F32)
  w = rand((5, 5, 2, 3), F32)
  kwargs = {"padding": "SAME", **kwargs}
  call = functools.partial(jaxdnn.conv, x, w, dimension_numbers=NHWC, **kwargs)
  with pytest.raises(ValueError, match="Families that can:") as info:
    call(algo=algo)
  msg = str(info.value)
  assert f"algo={algo.name}" in msg and f"{algo.name} {reason}" in msg, msg
  listed = listed_families(msg)
  assert set(general_families_for(kwargs.get("lhs_dilation"), kwargs.get("window_strides"))) <= {
      jaxdnn.ConvAlgo[n] for n in listed}, msg
  assert FFT.name not in listed and TILING.name not in listed, msg
  # `auto` never picks it there, and still runs.
  y = call(algo="auto")
  assert_close(y, lax_conv_hi(x.astype(F64), w.astype(F64), dimension_numbers=NHWC, **kwargs),
               tolerance(F32))


def test_1d_strided_refusal_names_the_axis_tuple():
  x, w = rand((2, 20, 3), F32), rand((5, 3, 4), F32)
  with pytest.raises(ValueError, match=r"FFT_TILING needs window_strides 1, got \(2,\)"):
    jaxdnn.conv(x, w, (2,), "SAME", dimension_numbers=NWC, algo=TILING)


def test_fft_refuses_huge_whole_images_but_tiling_runs_them():
  """FFT's whole-image transform is capped at 2^17 points; FFT_TILING takes any size."""
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (1024, 1024), (3, 3), (1, 1), (1, 1), (1, 1),
                          (1, 1), (1, 1))
  args = (g, 1, 1, 1, F32, F32, algorithms.MathPrecision.HIGHEST)
  why = algorithms.unsupported_reason("cpu", ConvOp.FORWARD, FFT, *args)
  assert "FFT transforms the whole image" in why and "use FFT_TILING" in why, why
  assert algorithms.unsupported_reason("cpu", ConvOp.FORWARD, TILING, *args) == ""
  assert algorithms.workspace_bytes("cpu", ConvOp.FORWARD, TILING, *args) < 64 << 20


def test_huge_filter_spectrum_is_refused_with_its_size():
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (200, 200), (9, 9), (1, 1), (1, 1), (1, 1),
                          (4, 4), (4, 4))
  why = algorithms.unsupported_reason("cpu", ConvOp.FORWARD, FFT, g, 1, 1024, 1024, F32, F32,
                                      algorithms.MathPrecision.HIGHEST)
  assert "MiB of workspace" in why and "filter spectrum" in why, why


def test_tiling_workspace_stays_bounded_for_long_signals():
  """The 1-D audio layer (8 x 16 channels, 16k samples, 255 taps): FFT_TILING's workspace is a
  few chunks of tile spectra, well under the whole-signal FFT's."""
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (16384,), (255,), (1,), (1,), (1,), (127,),
                          (127,))
  args = (g, 8, 16, 16, F32, F32, algorithms.MathPrecision.HIGHEST)
  tiled = algorithms.workspace_bytes("cpu", ConvOp.FORWARD, TILING, *args)
  whole = algorithms.workspace_bytes("cpu", ConvOp.FORWARD, FFT, *args)
  assert tiled < whole
  long_g = g.replace(in_spatial=(1 << 20,))
  longer = algorithms.workspace_bytes("cpu", ConvOp.FORWARD, TILING, long_g, 8, 16, 16, F32,
                                      F32, algorithms.MathPrecision.HIGHEST)
  assert longer < 2 * tiled + (16 << 20), (tiled, longer)  # bounded by the chunk, not the signal


def test_auto_picks_fft_tiling_for_the_audio_layer():
  x = rand((2, 2048, 8), F32)
  w = rand((255, 8, 8), F32)
  fn = lambda x, w: jaxdnn.conv(x, w, (1,), "SAME", dimension_numbers=NWC)
  algos = {e[0]: e for e in problems(fn, x, w)}
  (op, g, n, c, k, kin, kout, prec), = algos.values()
  assert algorithms.choose_algorithm("cpu", op, "auto", g, n, c, k, kin, kout,
                                     prec) == TILING
  assert_close(fn(x, w), lax_conv_hi(x.astype(F64), w.astype(F64), (1,), "SAME",
                                     dimension_numbers=NWC), tolerance(F32))


# ---------------------------------------------------------------------------------------------
# The CUDA plans (trace-time queries of the CUDA extension; they run without a GPU).

@needs_cuda_extension
def test_cuda_supports_every_case_with_tiling_and_fft_where_the_image_fits():
  """FFT_TILING takes every case on the GPU; FFT takes those whose whole-image transform fits
  in 4096 points and names FFT_TILING for the others."""
  refused_by_fft = set()
  for case in CASES:
    for op, g, n, c, k in _geometries(case):
      for dtype in (F32, F64, BF16):
        why = algorithms.unsupported_reason("cuda", op, TILING, g, n, c, k, dtype, dtype, HIGHEST)
        assert why == "", (case.id, op, dtype, why)
        why = algorithms.unsupported_reason("cuda", op, FFT, g, n, c, k, dtype, dtype, HIGHEST)
        if why:
          assert "FFT transforms the whole image" in why and "use FFT_TILING" in why, why
          refused_by_fft.add(case.id)
  # 74 x 49 -> 128 x 64 points; the 1-D case's 3000 + 126 samples -> 4096 points still fit.
  assert refused_by_fft == {"tiled-2d-not-tile-multiple"}, refused_by_fft


@needs_cuda_extension
@pytest.mark.parametrize("algo", ALGO_PARAMS)
@pytest.mark.parametrize("kwargs, reason", REFUSED)
def test_cuda_refuses_strides_and_dilations_with_the_reason(kwargs, reason, algo):
  x, w = rand((1, 9, 9, 2), F32), rand((5, 5, 2, 3), F32)
  conv = functools.partial(jaxdnn.conv, dimension_numbers=NHWC, algo=algo,
                           **{"padding": "SAME", **kwargs})
  (op, g, n, c, k, kin, kout, prec), = problems(conv, x, w)
  why = algorithms.unsupported_reason("cuda", op, algo, g, n, c, k, kin, kout, prec)
  assert why == f"{algo.name} {reason}", why


@needs_cuda_extension
def test_cuda_tiling_refuses_filters_longer_than_its_largest_tile():
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (100, 100), (70, 70), (1, 1), (1, 1), (1, 1),
                          (0, 0), (0, 0))
  why = algorithms.unsupported_reason("cuda", ConvOp.FORWARD, TILING, g, 1, 2, 2, F32, F32,
                                      HIGHEST)
  assert "needs a power-of-two tile longer than the filter" in why and "(70, 70)" in why, why
  g1 = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (20000,), (4095,), (1,), (1,), (1,), (0,), (0,))
  assert algorithms.unsupported_reason("cuda", ConvOp.FORWARD, TILING, g1, 1, 2, 2, F32, F32,
                                       HIGHEST) == ""


@needs_cuda_extension
def test_cuda_huge_filter_spectrum_is_refused_with_its_size():
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (60, 60), (5, 5), (1, 1), (1, 1), (1, 1),
                          (2, 2), (2, 2))
  why = algorithms.unsupported_reason("cuda", ConvOp.FORWARD, FFT, g, 1, 1024, 1024, F32, F32,
                                      HIGHEST)
  assert "MiB for its filter spectrum" in why and "GPU limit of 1024 MiB" in why, why


@needs_cuda_extension
def test_cuda_tiling_workspace_stays_bounded_for_long_signals():
  """The audio layer: FFT refuses the 16k-sample signal, FFT_TILING's workspace is bounded by
  its chunk of tile spectra (64 MiB) plus the filter spectrum, whatever the signal length."""
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (16384,), (255,), (1,), (1,), (1,), (127,),
                          (127,))
  args = (g, 8, 16, 16, F32, F32, HIGHEST)
  assert "use FFT_TILING" in algorithms.unsupported_reason("cuda", ConvOp.FORWARD, FFT, *args)
  tiled = algorithms.workspace_bytes("cuda", ConvOp.FORWARD, TILING, *args)
  assert 0 < tiled < 64 << 20
  longer = algorithms.workspace_bytes("cuda", ConvOp.FORWARD, TILING,
                                      g.replace(in_spatial=(1 << 22,)), 8, 16, 16, F32, F32,
                                      HIGHEST)
  assert longer <= (64 << 20) + (4 << 20), (tiled, longer)  # chunk + 2 MB filter spectrum


@needs_cuda_extension
def test_cuda_auto_picks_fft_tiling_only_for_float32_highest():
  g = jaxdnn.ConvGeometry(jaxdnn.Layout.NHWC, (28, 28), (5, 5), (1, 1), (1, 1), (1, 1),
                          (2, 2), (2, 2))
  pick = functools.partial(algorithms.choose_algorithm, "cuda", ConvOp.FORWARD, "auto", g, 32,
                           32, 64)
  assert pick(F32, F32, HIGHEST) == TILING
  assert pick(F32, F32, algorithms.MathPrecision.DEFAULT) != TILING
  assert pick(BF16, BF16, HIGHEST) != TILING
