"""The Hopper wgmma path of IMPLICIT_PRECOMP_GEMM (NHWC; 16-bit with channels per group a multiple
of 64, or float32 at DEFAULT precision (TF32) with channels per group a multiple of 32), through
jaxdnn.conv on the GPU, against the float64 lax oracle: the forward, backward-data at stride 1
(the forward of dy with the flipped, channel-swapped filter: output channels per group a multiple
of 64 / 32, input channels per group a multiple of 8), and in 16-bit backward-filter (MN-major
operands, split over pixels; input channels per group a multiple of 64). The same calls with JAXDNN_NO_WGMMA=1 run
the mma.sync kernel and must agree to rounding. On a non-sm_90 GPU both runs use the mma.sync
kernel, as do the cases whose channel counts do not qualify. Skipped without a GPU."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdnn
from helpers import PLATFORM, lax_conv64, lax_conv_hi, rand
from tolerances import relative_error, tolerance

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(PLATFORM != "gpu", reason="needs a CUDA GPU")]

# (name, spatial, N, C, K, groups, filter, stride, dilation, padding)
CASES = [
    ("c64k72_odd", (13, 11), 3, 64, 72, 1, (3, 3), (1, 1), (1, 1), [(1, 1), (1, 1)]),
    ("g2_c128k96_s2_d2", (15, 14), 2, 128, 96, 2, (3, 3), (2, 2), (2, 2), [(2, 2), (1, 2)]),
    ("c192k256_5x5", (9, 10), 2, 192, 256, 1, (5, 5), (1, 1), (1, 1), [(2, 2), (2, 2)]),
    ("1x1_c64k64", (8, 8), 4, 64, 64, 1, (1, 1), (1, 1), (1, 1), [(0, 0), (0, 0)]),
    ("r50_c4_like", (14, 14), 8, 256, 256, 1, (3, 3), (1, 1), (1, 1), [(1, 1), (1, 1)]),
    ("1d_c64k128_k7", (50,), 2, 64, 128, 1, (7,), (1,), (1,), [(3, 3)]),
    ("3d_c64k64", (5, 6, 7), 2, 64, 64, 1, (3, 3, 3), (1, 1, 1), (1, 1, 1), [(1, 1)] * 3),
    # the loader's bounds tests on all three axes: depth dilation, uneven padding
    ("3d_c64k64_d2", (7, 6, 8), 2, 64, 64, 1, (3, 3, 2), (1, 1, 1), (2, 1, 2), [(2, 1), (1, 1), (1, 0)]),
    # 49 taps (more than 32: a loader with per-row tap bit masks would need a second word)
    ("c64k64_7x7", (9, 8), 2, 64, 64, 1, (7, 7), (1, 1), (1, 1), [(3, 3), (3, 3)]),
    # wgmma in float32 only (K steps of 32 channels)
    ("c32k40_odd", (13, 11), 3, 32, 40, 1, (3, 3), (1, 1), (1, 1), [(1, 1), (1, 1)]),
    ("g2_c64k48_s2", (15, 13), 2, 64, 48, 2, (3, 3), (2, 2), (1, 1), [(1, 1), (0, 1)]),
    ("c96k64_5x5", (11, 9), 2, 96, 64, 1, (5, 5), (1, 1), (1, 1), [(2, 2), (2, 2)]),
]
# Backward-data: the stride-1 cases above, and geometries particular to its forward view:
# asymmetric padding (its padding is dil*(F-1) - pad_lo), groups with dilation, and padding wider
# than the dilated filter (negative padding in the view)
DGRAD_CASES = [c for c in CASES if all(s == 1 for s in c[7])] + [
    ("c72k64_asym", (11, 13), 2, 72, 64, 1, (3, 3), (1, 1), (1, 1), [(1, 2), (0, 1)]),
    ("g2_c48k128_d2", (12, 10), 2, 48, 128, 2, (3, 3), (1, 1), (2, 2), [(2, 2), (2, 1)]),
    ("c64k64_widepad", (7, 9), 2, 64, 64, 1, (3, 3), (1, 1), (1, 1), [(3, 3), (3, 1)]),
]
DNUMS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}


@pytest.mark.parametrize("dtype,out_dtype", [(jnp.bfloat16, None), (jnp.float16, None),
                                             (jnp.bfloat16, jnp.float32), (jnp.float32, None)],
                         ids=["bf16", "f16", "bf16_to_f32", "tf32"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_wgmma_forward_matches_oracle_and_mma_sync(case, dtype, out_dtype, monkeypatch):
  _, spatial, n, c, k, g, filt, stride, dil, pad = case
  x = rand((n, *spatial, c), dtype, seed=1)
  w = rand((*filt, c // g, k), dtype, seed=2)
  kw = dict(window_strides=stride, padding=pad, rhs_dilation=dil,
            dimension_numbers=DNUMS[len(spatial)], feature_group_count=g)
  f = jax.jit(lambda a, b: jaxdnn.conv(a, b, **kw, preferred_element_type=out_dtype,
                                       algo="implicit_precomp_gemm"))
  ref = lax_conv64(x, w, **kw)
  y = f(x, w)
  assert y.dtype == (out_dtype or dtype)
  tol = tolerance(dtype, out_dtype)
  assert relative_error(y, ref) < tol
  monkeypatch.setenv("JAXDNN_NO_WGMMA", "1")  # read per call by the CUDA handler
  y_mma = f(x, w)
  assert relative_error(y_mma, ref) < tol
  # both accumulate in fp32; only summation order and the final rounding differ
  assert relative_error(y, y_mma) < tol


def _check_vjp(case, dtype, wrt, monkeypatch):
  """The VJP of jaxdnn.conv (IMPLICIT_PRECOMP_GEMM) in x (wrt=0: backward-data) or w (wrt=1:
  backward-filter, same algorithm) against the float64 oracle, then again on mma.sync."""
  _, spatial, n, c, k, g, filt, stride, dil, pad = case
  x = rand((n, *spatial, c), dtype, seed=1)
  w = rand((*filt, c // g, k), dtype, seed=2)
  kw = dict(window_strides=stride, padding=pad, rhs_dilation=dil,
            dimension_numbers=DNUMS[len(spatial)], feature_group_count=g)
  y_shape = jax.eval_shape(lambda a, b: lax_conv_hi(a, b, **kw), x, w).shape
  dy = rand(y_shape, dtype, seed=7)
  conv = lambda a, b: jaxdnn.conv(a, b, **kw, algo="implicit_precomp_gemm")
  f = jax.jit(lambda a, b, ct: jax.vjp(conv, a, b)[1](ct)[wrt])
  x64, w64, dy64 = (a.astype(jnp.float64) for a in (x, w, dy))
  ref = jax.vjp(lambda a, b: lax_conv_hi(a, b, **kw), x64, w64)[1](dy64)[wrt]
  got = f(x, w, dy)
  assert got.dtype == dtype and got.shape == (x, w)[wrt].shape
  tol = tolerance(dtype)
  assert relative_error(got, ref) < tol
  monkeypatch.setenv("JAXDNN_NO_WGMMA", "1")  # read per call by the CUDA handler
  got_mma = f(x, w, dy)
  assert relative_error(got_mma, ref) < tol
  assert relative_error(got, got_mma) < tol


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32], ids=["bf16", "f16", "tf32"])
@pytest.mark.parametrize("case", DGRAD_CASES, ids=[c[0] for c in DGRAD_CASES])
def test_wgmma_backward_data_matches_oracle_and_mma_sync(case, dtype, monkeypatch):
  _check_vjp(case, dtype, 0, monkeypatch)


# Backward-filter runs on wgmma in 16-bit with input channels per group a multiple of 64 (any
# stride, dilation, padding): the 16-bit-eligible forward cases and the backward-data extras.
WGRAD_CASES = [c for c in CASES if (c[3] // c[5]) % 64 == 0] + DGRAD_CASES[-1:]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", WGRAD_CASES, ids=[c[0] for c in WGRAD_CASES])
def test_wgmma_backward_filter_matches_oracle_and_mma_sync(case, dtype, monkeypatch):
  _check_vjp(case, dtype, 1, monkeypatch)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "tf32"])
@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]], ids=[CASES[i][0] for i in (0, 2, 5)])
def test_wgmma_split_k_with_fused_epilogue(case, dtype, monkeypatch):
  """Split-K forced on (3 splits: fp32 partials, then one pass that adds them in order and applies
  bias + residual + relu), forward and backward-data, against the float64 oracle. Without the
  override only few-tile layers with at least 64 K steps split (c192k256_5x5: 4 splits in 16-bit,
  9 in TF32, in the tests above)."""
  _, spatial, n, c, k, g, filt, stride, dil, pad = case
  monkeypatch.setenv("JAXDNN_WGMMA_SPLITS", "3")  # read when the call is lowered and when it runs
  x = rand((n, *spatial, c), dtype, seed=11)
  w = rand((*filt, c // g, k), dtype, seed=12)
  kw = dict(window_strides=stride, padding=pad, rhs_dilation=dil,
            dimension_numbers=DNUMS[len(spatial)], feature_group_count=g)
  y_shape = jax.eval_shape(lambda a, b: lax_conv_hi(a, b, **kw), x, w).shape
  bias = rand((k,), dtype, seed=13)
  res = rand(y_shape, dtype, seed=14)
  f = jax.jit(lambda a, b, bb, r: jaxdnn.conv(a, b, **kw, bias=bb, residual=r, activation="relu",
                                              algo="implicit_precomp_gemm"))
  x64, w64 = x.astype(jnp.float64), w.astype(jnp.float64)
  ref = jnp.maximum(lax_conv_hi(x64, w64, **kw) + bias.astype(jnp.float64) + res.astype(jnp.float64), 0)
  assert relative_error(f(x, w, bias, res), ref) < tolerance(dtype)
  if all(s == 1 for s in stride):
    dy = rand(y_shape, dtype, seed=15)
    dx = jax.jit(lambda a, b, ct: jax.vjp(lambda u: jaxdnn.conv(u, b, **kw, algo="implicit_precomp_gemm"),
                                          a)[1](ct)[0])(x, w, dy)
    dx_ref = jax.vjp(lambda u: lax_conv_hi(u, w64, **kw), x64)[1](dy.astype(jnp.float64))[0]
    assert relative_error(dx, dx_ref) < tolerance(dtype)


def _check_fused_epilogue(dtype, kw, x_shape, w_shape, seed):
  """jaxdnn.conv (IMPLICIT_PRECOMP_GEMM, NHWC) with bias + residual + relu, bias + relu, bias
  alone, and gelu's bias gradient (the forward stores the pre-activation, which the bias gradient
  reads), against the float64 oracle. Returns x and w."""
  k = w_shape[-1]
  x = rand(x_shape, dtype, seed=seed)
  w = rand(w_shape, dtype, seed=seed + 1)
  bias = rand((k,), dtype, seed=seed + 2)
  x64, w64 = x.astype(jnp.float64), w.astype(jnp.float64)
  z = lax_conv_hi(x64, w64, **kw)
  z_ref = z + bias.astype(jnp.float64)
  res = rand(z.shape, dtype, seed=seed + 3)
  conv = lambda a, b, bb, r, act: jaxdnn.conv(a, b, **kw, bias=bb, residual=r, activation=act,
                                               algo="implicit_precomp_gemm")
  y = jax.jit(lambda a, b, bb, r: conv(a, b, bb, r, "relu"))(x, w, bias, res)
  assert relative_error(y, jnp.maximum(z_ref + res.astype(jnp.float64), 0)) < tolerance(dtype)
  y = jax.jit(lambda a, b, bb: conv(a, b, bb, None, "relu"))(x, w, bias)
  assert relative_error(y, jnp.maximum(z_ref, 0)) < tolerance(dtype)
  y = jax.jit(lambda a, b, bb: conv(a, b, bb, None, None))(x, w, bias)
  assert relative_error(y, z_ref) < tolerance(dtype)
  gb = jax.jit(jax.grad(lambda bb: jnp.sum(conv(x, w, bb, None, "gelu").astype(jnp.float32))))(bias)
  gb_ref = jax.grad(lambda bb: jnp.sum(jax.nn.gelu(z + bb, approximate=False)))(bias.astype(jnp.float64))
  assert relative_error(gb, gb_ref) < 10 * tolerance(dtype)
  return x, w


@pytest.mark.parametrize("bias_acc", ["1", "0"], ids=["bias_in_acc", "bias_in_epilogue"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32], ids=["bf16", "f16", "tf32"])
@pytest.mark.parametrize("tile", ["64x64", "64x128"])
def test_wgmma_persistent_walk_with_fused_epilogue(tile, dtype, bias_acc, monkeypatch):
  """The persistent tile walk forced on a 1x1 layer with more tiles (576 of 64x64) than resident
  CTAs, with bias + residual + relu, and with gelu under differentiation (the pre-activation is
  stored too): every tile goes out through its own staged C tile while the next tile's operands
  load. With bias + relu alone the biases start the accumulators and, in 16-bit, the relu goes
  into the stores, so the tiles go out straight from the registers; 200 output channels leave a
  partial column tile. JAXDNN_WGMMA_BIAS_ACC=0 adds the biases in the (staged) epilogue instead,
  the path a residual takes. Without the override the walk runs for 64x64 tiles of at most 4 K
  steps, with any epilogue but a residual."""
  monkeypatch.setenv("JAXDNN_WGMMA_BIAS_ACC", bias_acc)
  monkeypatch.setenv("JAXDNN_WGMMA_PERSISTENT", "1")
  monkeypatch.setenv("JAXDNN_WGMMA_TILE", tile)
  kw = dict(window_strides=(1, 1), padding="VALID", dimension_numbers=DNUMS[2])
  _check_fused_epilogue(dtype, kw, (8, 48, 48, 128), (1, 1, 128, 200), seed=21)


@pytest.mark.parametrize("bn", ["64", "128"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
def test_wgmma_warp_specialized(dtype, bn, monkeypatch):
  """The warp-specialized forward (JAXDNN_WGMMA_WS=1, 16-bit only; read per call): a 3x3 layer
  with 144 row tiles of 128 pixels times 2 (BN = 128; the second one partial) or 3 column tiles,
  more tiles than the grid's CTAs (one per SM), so each CTA walks several and both of its consumer
  warpgroups get tiles. The plain conv, bias + residual + relu, gelu under differentiation (the
  stored pre-activation), and backward-data (the same kernel on dy) against the float64 oracle."""
  monkeypatch.setenv("JAXDNN_WGMMA_WS", "1")
  monkeypatch.setenv("JAXDNN_WGMMA_WS_BN", bn)
  kw = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=DNUMS[2])
  x, w = _check_fused_epilogue(dtype, kw, (8, 48, 48, 64), (3, 3, 64, 192), seed=31)
  conv = lambda a, b: jaxdnn.conv(a, b, **kw, algo="implicit_precomp_gemm")
  x64, w64 = x.astype(jnp.float64), w.astype(jnp.float64)
  assert relative_error(jax.jit(conv)(x, w), lax_conv_hi(x64, w64, **kw)) < tolerance(dtype)
  # backward-data: dx = conv(dy, flipped w) on the same kernel (its forward view: 192 input
  # channels, 64 output)
  dy = rand((8, 48, 48, 192), dtype, seed=35)
  dx = jax.jit(lambda a, b, ct: jax.vjp(lambda u: conv(u, b), a)[1](ct)[0])(x, w, dy)
  dx_ref = jax.vjp(lambda u: lax_conv_hi(u, w64, **kw), x64)[1](dy.astype(jnp.float64))[0]
  assert relative_error(dx, dx_ref) < tolerance(dtype)


def test_wgmma_forward_grad_and_vmap():
  x = rand((2, 9, 9, 64), jnp.bfloat16, seed=3)
  w = rand((3, 3, 64, 128), jnp.bfloat16, seed=4)
  kw = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=DNUMS[2])
  conv = lambda a, b: jaxdnn.conv(a, b, **kw, algo="implicit_precomp_gemm")
  ys = jax.vmap(conv, in_axes=(None, 0))(x, jnp.stack([w, -w]))
  ref = lax_conv64(x, w, **kw)
  assert relative_error(ys[0], ref) < tolerance(jnp.bfloat16)
  assert relative_error(ys[1], -ref) < tolerance(jnp.bfloat16)
  gw = jax.grad(lambda b: jnp.sum(conv(x, b).astype(jnp.float32) ** 2))(w)
  x64 = x.astype(jnp.float64)
  gref = jax.grad(lambda b: jnp.sum(lax_conv_hi(x64, b, **kw) ** 2))(w.astype(jnp.float64))
  assert relative_error(gw, gref) < 5e-2


@pytest.mark.parametrize("case", CASES[-3:], ids=[c[0] for c in CASES[-3:]])
def test_float32_highest_never_tf32(case):
  """float32 at HIGHEST precision is true fp32 (the wgmma kernel is TF32): the fp32 bound holds,
  which TF32 (~1e-4 relative error at best) would miss."""
  _, spatial, n, c, k, g, filt, stride, dil, pad = case
  x = rand((n, *spatial, c), jnp.float32, seed=5)
  w = rand((*filt, c // g, k), jnp.float32, seed=6)
  kw = dict(window_strides=stride, padding=pad, rhs_dilation=dil,
            dimension_numbers=DNUMS[len(spatial)], feature_group_count=g)
  y = jax.jit(lambda a, b: jaxdnn.conv(a, b, **kw, precision=jax.lax.Precision.HIGHEST,
                                       algo="implicit_precomp_gemm"))(x, w)
  tol = tolerance(jnp.float32, precision=jax.lax.Precision.HIGHEST)
  assert tol <= 1e-5
  assert relative_error(y, lax_conv64(x, w, **kw)) < tol
