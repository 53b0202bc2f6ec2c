"""Transposed convolutions (lhs_dilation > 1, unit window strides) through the backward-data of a
strided convolution (ConvGeometry.lhs_dilation_as_stride): F_P(x, w) = D_Q(x, w'),
D_P(dy, w) = F_Q(dy, w'), W_P(x, dy) = flip_swap(W_Q(dy, x)), w' the flipped, channel-swapped
filter. The CUDA GEMM families run every lhs-dilated problem this way. The CPU kernels take lhs
dilation themselves, and take the mapping only where it measured faster
(algorithms.MAPPING_PAYS); the tests force it everywhere (algorithms.map_lhs_dilation_always),
check it against float64 lax and that the lowered calls are the mapped ones."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxdnn
from grid import NCDHW, NCHW, NCW, NHWC, Case
from helpers import GENERAL_FAMILIES, LOWERING_PLATFORM, algo_id, lax_conv64, lax_conv_hi, rand
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvGeometry, Layout
from jaxdnn._src.primitives import conv as prims
from tolerances import F64, assert_close, tolerance

CASES = [
    Case("nhwc-pad-1-1-2-0", (2, 4, 4, 3), (3, 3, 3, 2), (1, 1), ((1, 1), (2, 0)),
         lhs_dilation=(2, 2), dnums=NHWC),
    Case("nhwc-rhs-dilation", (1, 5, 4, 2), (2, 2, 2, 3), (1, 1), ((1, 2), (0, 1)),
         lhs_dilation=(2, 1), rhs_dilation=(1, 2), dnums=NHWC),
    Case("1d-ncw", (2, 3, 4), (2, 3, 3), (1,), ((2, 2),), lhs_dilation=(3,), dnums=NCW),
    # padding beyond the dilated filter: the strided problem's padding is negative
    Case("nhwc-groups2-wide-pad", (2, 4, 5, 6), (3, 3, 3, 4), (1, 1), ((3, 0), (1, 4)),
         lhs_dilation=(2, 3), dnums=NHWC, fgc=2),
    Case("nchw-groups2", (1, 6, 3, 3), (6, 3, 2, 3), (1, 1), ((0, 0), (1, 1)),
         lhs_dilation=(3, 2), rhs_dilation=(2, 1), dnums=NCHW, fgc=2),
    Case("3d-ncdhw", (1, 2, 3, 2, 3), (3, 2, 2, 3, 2), (1, 1, 1), ((1, 1), (0, 2), (1, 0)),
         lhs_dilation=(2, 1, 2), dnums=NCDHW),
    # as flax.linen.ConvTranspose / lax.conv_transpose lay it out (stride 2, SAME)
    Case("conv-transpose-same", (2, 5, 5, 4), (3, 3, 4, 6), (1, 1), ((2, 1), (2, 1)),
         lhs_dilation=(2, 2), dnums=NHWC),
]
CASE_PARAMS = [pytest.param(c, id=c.id) for c in CASES]
FAMILY_PARAMS = [pytest.param(a, id=algo_id(a)) for a in GENERAL_FAMILIES]


@pytest.fixture
def forced_mapping(monkeypatch):
  """The mapping on every lhs-dilated, unit-stride problem; compiled eager calls dropped on the
  way in and out (the flag is read when a call is lowered)."""
  monkeypatch.setattr(algorithms, "map_lhs_dilation_always", True)
  prims._jitted.cache_clear()
  yield
  prims._jitted.cache_clear()


def _targets(fn, *args) -> set[str]:
  text = jax.jit(fn).lower(*args).as_text()
  return {t for t in ("jaxdnn_conv_fwd", "jaxdnn_conv_bwd_data", "jaxdnn_conv_bwd_filter")
          if f"@{t}(" in text}


@pytest.mark.parametrize("case", CASE_PARAMS)
@pytest.mark.parametrize("algo", FAMILY_PARAMS)
def test_forward_and_grads_through_the_strided_problem(forced_mapping, case, algo):
  x, w = rand(case.lhs, F64, seed=1), rand(case.rhs, F64, seed=2)
  kwargs = case.kwargs()
  conv = lambda x, w: jaxdnn.conv(x, w, **kwargs, algo=algo)
  assert _targets(conv, x, w) == {"jaxdnn_conv_bwd_data"}
  ref = lax_conv64(x, w, **kwargs)
  assert_close(conv(x, w), ref, tolerance(F64), case.id)
  ct = rand(ref.shape, F64, seed=3)
  grad = lambda x, w: jax.vjp(conv, x, w)[1](ct)
  # D_P -> F_Q, W_P -> W_Q with the operands swapped
  assert _targets(grad, x, w) == {"jaxdnn_conv_fwd", "jaxdnn_conv_bwd_filter"}
  dx_ref, dw_ref = jax.vjp(lambda x, w: lax_conv_hi(x, w, **kwargs), x, w)[1](ct)
  dx, dw = grad(x, w)
  assert_close(dx, dx_ref, tolerance(F64), f"{case.id} dx")
  assert_close(dw, dw_ref, tolerance(F64), f"{case.id} dw")


@pytest.mark.parametrize("case", [CASE_PARAMS[0], CASE_PARAMS[3]])
def test_second_order(forced_mapping, case):
  x, w = rand(case.lhs, F64, seed=4), rand(case.rhs, F64, seed=5)
  conv = lambda x, w: jaxdnn.conv(x, w, **case.kwargs(), algo="implicit_precomp_gemm")
  check_grads(conv, (x, w), order=2, modes=("fwd", "rev"))


def test_vmap(forced_mapping):
  case = CASES[3]
  xs, ws = rand((3, *case.lhs), F64, seed=6), rand((3, *case.rhs), F64, seed=7)
  conv = lambda x, w: jaxdnn.conv(x, w, **case.kwargs(), algo="gemm")
  ref = jax.vmap(lambda x, w: lax_conv_hi(x, w, **case.kwargs()))(xs, ws)
  assert_close(jax.vmap(conv)(xs, ws), ref, tolerance(F64), "both batched")
  ref = jax.vmap(lambda x: lax_conv_hi(x, ws[0], **case.kwargs()))(xs)
  assert_close(jax.vmap(conv, (0, None))(xs, ws[0]), ref, tolerance(F64), "x batched")


def test_matches_lax_conv_transpose(forced_mapping):
  """jaxdnn.conv with lax.conv_transpose's arguments (what flax.linen.ConvTranspose calls)."""
  x, w = rand((2, 5, 5, 4), F64, seed=8), rand((3, 3, 4, 6), F64, seed=9)
  ref = lax.conv_transpose(x, w, (2, 2), "SAME", dimension_numbers=NHWC,
                           precision=lax.Precision.HIGHEST)
  y = jaxdnn.conv(x, w, (1, 1), ((2, 1), (2, 1)), lhs_dilation=(2, 2), dimension_numbers=NHWC,
                  algo="implicit_gemm")
  assert_close(y, ref, tolerance(F64), "conv_transpose")


def test_window_stride_keeps_the_native_path(forced_mapping):
  """lhs dilation with a window stride > 1 has no such identity: not mapped."""
  x, w = rand((1, 4, 5, 2), F64), rand((3, 2, 2, 3), F64)
  kwargs = dict(window_strides=(2, 1), padding=((2, 2), (1, 0)), lhs_dilation=(2, 3),
                dimension_numbers=NHWC)
  assert ConvGeometry(Layout.NHWC, (4, 5), (3, 2), (2, 1), (1, 1), (2, 3), (2, 1),
                      (2, 0)).lhs_dilation_as_stride() is None
  conv = lambda x, w: jaxdnn.conv(x, w, **kwargs, algo="direct")
  assert _targets(conv, x, w) == {"jaxdnn_conv_fwd"}
  assert_close(conv(x, w), lax_conv64(x, w, **kwargs), tolerance(F64), "strided")


@pytest.mark.parametrize("layout, groups", [(Layout.NHWC, 1), (Layout.NHWC, 3), (Layout.NCHW, 2)])
def test_flip_swap_filter(layout, groups):
  """w'[f'][k][g, c] = w[F-1-f'][c][g, k], and flip_swap is its own inverse."""
  cg, kg = 2, 4
  g = ConvGeometry(layout, (5, 5), (3, 2), (1, 1), (1, 1), (2, 2), (0, 0), (0, 0), groups=groups)
  hwio = rand((3, 2, cg, groups * kg), F64)
  to_native = (lambda a: a) if layout == Layout.NHWC else (lambda a: np.transpose(a, (3, 2, 0, 1)))
  out = np.asarray(prims.flip_swap_filter(jnp.asarray(to_native(hwio)), g))
  expect = np.empty((3, 2, kg, groups * cg))
  for gi in range(groups):
    block = hwio[::-1, ::-1, :, gi * kg:(gi + 1) * kg]  # (3, 2, cg, kg)
    expect[..., gi * cg:(gi + 1) * cg] = np.swapaxes(block, 2, 3)
  np.testing.assert_array_equal(out, to_native(expect))
  np.testing.assert_array_equal(np.asarray(prims.flip_swap_filter(jnp.asarray(out), g)),
                                to_native(hwio))


# The route each family takes unforced: the CUDA GEMM families have no lhs-dilation kernels
# (every operation mapped); on the CPU the mapping runs where it measured faster
# (algorithms.MAPPING_PAYS): the GEMM families' forward and backward-filter, GEMM's backward-data.
ROUTES = {  # family -> (forward's targets, gradient's targets)
    "cuda": {"IMPLICIT_GEMM": ({"bwd_data"}, {"fwd", "bwd_filter"}),
             "IMPLICIT_PRECOMP_GEMM": ({"bwd_data"}, {"fwd", "bwd_filter"}),
             "GEMM": ({"bwd_data"}, {"fwd", "bwd_filter"}),
             "DIRECT": ({"fwd"}, {"bwd_data", "bwd_filter"})},
    "cpu": {"IMPLICIT_GEMM": ({"bwd_data"}, {"bwd_data", "bwd_filter"}),
            "IMPLICIT_PRECOMP_GEMM": ({"bwd_data"}, {"bwd_data", "bwd_filter"}),
            "GEMM": ({"bwd_data"}, {"fwd", "bwd_filter"}),
            "DIRECT": ({"fwd"}, {"bwd_data", "bwd_filter"})},
}


@pytest.mark.parametrize("algo", FAMILY_PARAMS)
def test_route_of_each_family(algo):
  case = CASES[3]
  x, w = rand(case.lhs, F64, seed=12), rand(case.rhs, F64, seed=13)
  conv = lambda x, w: jaxdnn.conv(x, w, **case.kwargs(), algo=algo)
  ref = lax_conv64(x, w, **case.kwargs())
  ct = rand(ref.shape, F64, seed=14)
  grad = lambda x, w: jax.vjp(conv, x, w)[1](ct)
  fwd_targets, grad_targets = ROUTES[LOWERING_PLATFORM][algo.name]
  assert _targets(conv, x, w) == {f"jaxdnn_conv_{t}" for t in fwd_targets}
  assert _targets(grad, x, w) == {f"jaxdnn_conv_{t}" for t in grad_targets}
  assert_close(conv(x, w), ref, tolerance(F64), case.id)
  dx_ref, dw_ref = jax.vjp(lambda x, w: lax_conv_hi(x, w, **case.kwargs()), x, w)[1](ct)
  for got, want in zip(grad(x, w), (dx_ref, dw_ref)):
    assert_close(got, want, tolerance(F64), case.id)


@pytest.mark.skipif(LOWERING_PLATFORM != "cuda", reason="the CUDA GEMM families' own mapping")
@pytest.mark.parametrize("algo", ["implicit_gemm", "implicit_precomp_gemm", "gemm"])
def test_cuda_gemm_families_take_transposed_convolutions(algo):
  """Unforced: on the GPU these families have no lhs-dilation kernels, so the mapping runs."""
  case = CASES[-1]
  x, w = rand(case.lhs, np.float32, seed=10), rand(case.rhs, np.float32, seed=11)
  conv = lambda x, w: jaxdnn.conv(x, w, **case.kwargs(), algo=algo,
                                  precision=lax.Precision.HIGHEST)
  assert _targets(conv, x, w) == {"jaxdnn_conv_bwd_data"}
  assert_close(conv(x, w), lax_conv64(x, w, **case.kwargs()), tolerance(np.float32), case.id)


@pytest.mark.skipif(LOWERING_PLATFORM != "cpu", reason="the CPU heuristic")
def test_cpu_auto_takes_the_mapped_gemm_for_transposed_forward_and_filter_gradient():
  g = ConvGeometry(Layout.NHWC, (28, 28), (4, 4), (1, 1), (1, 1), (2, 2), (2, 2), (2, 2))
  pick = lambda op: algorithms.choose_algorithm("cpu", op, "auto", g, 4, 256, 128, np.float32,
                                                np.float32, algorithms.MathPrecision.HIGHEST)
  for op in (algorithms.ConvOp.FORWARD, algorithms.ConvOp.BACKWARD_FILTER):
    assert pick(op) == jaxdnn.ConvAlgo.IMPLICIT_PRECOMP_GEMM
    assert algorithms.lhs_dilation_mapping(
        "cpu", op, pick(op), g, 4, 256, 128, np.float32, np.float32,
        algorithms.MathPrecision.HIGHEST) is not None
  # with a fused epilogue the mapping cannot run (a backward-data carries none): DIRECT, as before
  fused = algorithms.choose_algorithm("cpu", algorithms.ConvOp.FORWARD, "auto", g, 4, 256, 128,
                                      np.float32, np.float32, algorithms.MathPrecision.HIGHEST,
                                      fused=True)
  assert fused == jaxdnn.ConvAlgo.DIRECT


@pytest.mark.skipif(LOWERING_PLATFORM != "cuda", reason="the CUDA GEMM families' refusal")
def test_cuda_gemm_families_refuse_lhs_dilation_with_a_window_stride():
  """No identity there (window stride > 1): a clear ValueError naming the families that can."""
  x, w = rand((1, 4, 5, 2), np.float32), rand((3, 2, 2, 3), np.float32)
  with pytest.raises(ValueError, match="lhs_dilation.*Families that can: DIRECT"):
    jaxdnn.conv(x, w, (2, 1), ((2, 2), (1, 0)), lhs_dilation=(2, 3), dimension_numbers=NHWC,
                algo="implicit_precomp_gemm")
