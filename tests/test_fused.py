"""Fused convolution act(conv(x, w) + bias + residual): values, derivatives, vmap, lowering, errors.

The oracle is the unfused float64 computation: lax.conv_general_dilated at HIGHEST precision, the
bias and residual added, then jax.nn's activation (an implementation independent of jaxdnn's).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxdnn
from grid import NCDHW, NCHW, NHWC, NWC
from helpers import FAMILIES, GENERAL_FAMILIES, LOWERING_PLATFORM, PLATFORM, algo_id, f64, rand
from jaxdnn._src import activations, algorithms, ffi
from jaxdnn._src.geometry import ConvOp
from jaxdnn._src.primitives import fused as fused_prims
from tolerances import BF16, F16, F32, F64, RTOL, assert_close, tolerance

A = jaxdnn.ConvAlgo
# The GPU carries the epilogue in the general families (the CUDA Winograd kernels carry none).
if PLATFORM != "cpu":
  FAMILIES = GENERAL_FAMILIES

# ---------------------------------------------------------------------------------------------
# The oracle.

# Every activation kind with a parameter other than its default where it has one.
PARAMS = {"leaky_relu": 0.2, "clipped_relu": 3.0, "elu": 0.7}
REF_ACT = {
    "identity": lambda z, p: z,
    "relu": lambda z, p: jax.nn.relu(z),
    "leaky_relu": lambda z, p: jax.nn.leaky_relu(z, p),
    "clipped_relu": lambda z, p: jnp.minimum(jax.nn.relu(z), p),
    "elu": lambda z, p: jax.nn.elu(z, p),
    "sigmoid": lambda z, p: jax.nn.sigmoid(z),
    "tanh": lambda z, p: jnp.tanh(z),
    "gelu": lambda z, p: jax.nn.gelu(z, approximate=False),
    "gelu_tanh": lambda z, p: jax.nn.gelu(z, approximate=True),
    "silu": lambda z, p: jax.nn.silu(z),
}
ACTS = tuple(activations.KINDS)
assert set(ACTS) == set(REF_ACT)
SMOOTH = ("identity", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu")


def _channel_axis(dnums, ndim):
  out_spec = lax.conv_dimension_numbers((1,) * ndim, (1,) * ndim, dnums).out_spec
  return out_spec[1]


def reference(case, x, w, bias, residual, act, param=None):
  """The unfused computation on the given (float64 or traced) values."""
  y = lax.conv_general_dilated(x, w, **case.conv_kwargs(), precision=lax.Precision.HIGHEST)
  if bias is not None:
    shape = [1] * y.ndim
    shape[_channel_axis(case.dnums, y.ndim)] = -1
    y = y + bias.reshape(shape)
  if residual is not None:
    y = y + residual
  act = act or "identity"
  return REF_ACT[act](y, activations.KINDS[act].default_param if param is None else param)


# ---------------------------------------------------------------------------------------------
# Problems.

class FCase:
  def __init__(self, id, lhs, rhs, strides, padding, dnums, fgc=1, bgc=1, rhs_dilation=None):
    self.id, self.lhs, self.rhs, self.dnums = id, lhs, rhs, dnums
    self.strides, self.padding, self.fgc, self.bgc = strides, padding, fgc, bgc
    self.rhs_dilation = rhs_dilation

  def conv_kwargs(self):
    return dict(window_strides=self.strides, padding=self.padding, dimension_numbers=self.dnums,
                feature_group_count=self.fgc, batch_group_count=self.bgc,
                rhs_dilation=self.rhs_dilation)

  def out_shape(self):
    return jax.eval_shape(lambda x, w: lax.conv_general_dilated(x, w, **self.conv_kwargs()),
                          jax.ShapeDtypeStruct(self.lhs, F64),
                          jax.ShapeDtypeStruct(self.rhs, F64)).shape

  def k(self):
    return self.out_shape()[_channel_axis(self.dnums, len(self.lhs))]

  def inputs(self, dtype=F64, seed=0, scale=2.0):
    """x, w, bias, residual (pre-activations of order `scale`, crossing every kink)."""
    x = rand(self.lhs, F64, seed=seed)
    w = rand(self.rhs, F64, seed=seed + 1)
    fan_in = np.prod(self.rhs) / self.k()
    w = w * (scale / np.sqrt(fan_in))
    b = rand((self.k(),), F64, seed=seed + 2)
    r = rand(self.out_shape(), F64, seed=seed + 3)
    return tuple(jnp.asarray(v).astype(dtype) for v in (x, w, b, r))


# Winograd-capable geometries (2-D 3x3, stride 1) and general ones; every family runs each of its
# list (the DIRECT kernel's three vector modes: BCAST, EXP (depthwise), DOT (tiny K)).
WINO_CASES = [
    FCase("nhwc-3x3", (2, 6, 5, 3), (3, 3, 3, 5), (1, 1), "SAME", NHWC),
    FCase("nchw-3x3", (2, 3, 6, 5), (5, 3, 3, 3), (1, 1), "SAME", NCHW),
    FCase("nhwc-3x3-groups2", (1, 5, 6, 4), (3, 3, 2, 6), (1, 1), ((1, 0), (1, 1)), NHWC, fgc=2),
]
GENERAL_CASES = WINO_CASES + [
    FCase("nhwc-groups2-stride2", (2, 7, 6, 4), (3, 3, 2, 6), (2, 2), "SAME", NHWC, fgc=2),
    FCase("nchw-depthwise-x2", (1, 4, 6, 6), (8, 1, 3, 3), (1, 1), "SAME", NCHW, fgc=4),
    FCase("nhwc-1x1", (2, 4, 4, 8), (1, 1, 8, 4), (1, 1), "VALID", NHWC),
    FCase("nchw-tiny-k-dilated", (1, 24, 6, 5), (1, 24, 3, 3), (1, 1), "SAME", NCHW,
          rhs_dilation=(2, 1)),
    FCase("nwc-1d-stride3", (2, 9, 3), (3, 3, 4), (3,), "SAME", NWC),
    FCase("ncdhw-3d", (1, 2, 3, 4, 3), (3, 2, 2, 2, 2), (1, 1, 1), "SAME", NCDHW),
    FCase("odd-layout-batch-groups", (4, 5, 5, 2), (3, 3, 2, 4), (1, 1), "SAME",
          ("NHWC", "HWIO", "NCHW"), bgc=2),
]


# FFT and FFT_TILING: the stride-1, undilated general geometries, a 5x5 filter with 16 output
# channels (whole lane blocks: the channels-last vector store) and a long 1-D filter.
FFT_CASES = [c for c in GENERAL_CASES
             if all(s == 1 for s in c.strides) and not c.rhs_dilation] + [
    FCase("nhwc-5x5-k16", (2, 9, 7, 3), (5, 5, 3, 16), (1, 1), "SAME", NHWC),
    FCase("nwc-1d-31-taps", (2, 70, 2), (31, 2, 3), (1,), ((20, 10),), NWC),
]


def cases_for(algo):
  if algo in (A.WINOGRAD, A.WINOGRAD_NONFUSED):
    return WINO_CASES
  return FFT_CASES if algo in (A.FFT, A.FFT_TILING) else GENERAL_CASES


def fused(case, algo, act=None, param=None, **extra):
  return functools.partial(jaxdnn.conv, **case.conv_kwargs(), algo=algo, activation=act,
                           activation_param=param, **extra)


def _call(fn, x, w, b, r):
  return fn(x, w, bias=b, residual=r)


OPERANDS = [(True, True), (True, False), (False, True), (False, False)]


# ---------------------------------------------------------------------------------------------
# Forward values.

@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("algo", FAMILIES, ids=algo_id)
def test_forward_every_family_and_activation(algo, act):
  """Every family x every activation, rotating through the family's geometries and the four
  bias / residual combinations."""
  i = FAMILIES.index(algo) + ACTS.index(act)
  case = cases_for(algo)[i % len(cases_for(algo))]
  has_b, has_r = OPERANDS[i % 4] if act != "identity" else (True, True)
  x, w, b, r = case.inputs(seed=i)
  b, r = (b if has_b else None), (r if has_r else None)
  p = PARAMS.get(act)
  y = _call(fused(case, algo, act, p), x, w, b, r)
  want = reference(case, x, w, b, r, act, p)
  assert y.dtype == F64
  assert_close(y, want, RTOL[F64], f"{case.id} bias={has_b} residual={has_r}")


@pytest.mark.parametrize("algo", FAMILIES, ids=algo_id)
def test_forward_every_geometry_and_operand_combination(algo):
  """Each family on all its geometries (both layouts, groups, 1-D / 3-D, odd layouts) with each
  bias / residual combination (relu6 or elu), in jit."""
  for j, case in enumerate(cases_for(algo)):
    x, w, b, r = case.inputs(seed=10 + j)
    for has_b, has_r in OPERANDS:
      act = "clipped_relu" if (j + has_b) % 2 else "elu"
      bb, rr = (b if has_b else None), (r if has_r else None)
      y = jax.jit(lambda x, w, b, r: _call(fused(case, algo, act), x, w, b, r))(x, w, bb, rr)
      want = reference(case, x, w, bb, rr, act, activations.KINDS[act].default_param)
      assert_close(y, want, RTOL[F64], f"{case.id} bias={has_b} residual={has_r}")


DTYPE_PARAMS = [(F32, None), (BF16, None), (F16, None), (BF16, F32)]


@pytest.mark.parametrize("dtype,pet", DTYPE_PARAMS, ids=lambda v: str(v))
@pytest.mark.parametrize("algo", FAMILIES, ids=algo_id)
def test_forward_low_precision(algo, dtype, pet):
  """16-bit and float32 operands: one rounding of the float32-accumulated result."""
  case = cases_for(algo)[1]  # NCHW
  out = np.dtype(pet or dtype)
  x, w, b, r = case.inputs(dtype, seed=5)
  act = "silu" if dtype != F16 else "gelu_tanh"
  y = fused(case, algo, act, preferred_element_type=pet)(x, w, bias=b, residual=r)
  assert y.dtype == out
  b64, r64 = f64(b.astype(out)), f64(r.astype(out))
  want = reference(case, f64(x), f64(w), b64, r64, act)
  assert_close(y, want, tolerance(dtype, out), f"{dtype} -> {out}")


@pytest.mark.parametrize("filt", [3, 5, 7])
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
def test_direct_depthwise_channels_last_epilogue(dtype, filt):
  """DIRECT's channels-last depthwise kernel on the GPU takes 16-byte channel vectors (C a
  multiple of 8 16-bit or 4 float32 values) and strips of pixels along W; it loads the biases
  once and a strip's residuals before its stores. Widths that leave a partial last strip, every
  bias / residual combination, 16 channels (two vectors, two biases each)."""
  case = FCase(f"nhwc-depthwise-{filt}x{filt}", (2, 5, 11, 16), (filt, filt, 1, 16), (1, 1),
               "SAME", NHWC, fgc=16)
  for i, (has_b, has_r) in enumerate(OPERANDS):
    x, w, b, r = case.inputs(dtype, seed=90 + i)
    b, r = (b if has_b else None), (r if has_r else None)
    y = jax.jit(fused(case, A.DIRECT, "leaky_relu", 0.2))(x, w, bias=b, residual=r)
    assert y.dtype == dtype
    want = reference(case, f64(x), f64(w), None if b is None else f64(b),
                     None if r is None else f64(r), "leaky_relu", 0.2)
    assert_close(y, want, tolerance(dtype, dtype), f"bias={has_b} residual={has_r}")


# Shapes that reach the CUDA kernels' vector forms and their epilogues (the kernel named beside
# each), which the small mixed-layout cases above do not; on the CPU the same checks run the CPU
# families.
PATH_CASES = {
    # DIRECT grp_kernel: channels-last, channels per group multiples of 4, not depthwise
    # (ResNeXt-like; auto picks DIRECT for small groups on the GPU)
    "grp": (A.DIRECT, FCase("nhwc-grouped-c4k4", (2, 7, 9, 32), (3, 3, 4, 32), (1, 1), "SAME",
                            NHWC, fgc=8)),
    "grp-s2": (A.DIRECT, FCase("nhwc-grouped-s2", (2, 7, 9, 32), (3, 3, 4, 32), (2, 2), "SAME",
                               NHWC, fgc=8)),
    # DIRECT dws_kernel's per-tap form: depthwise with a W stride or W dilation (MobileNet's
    # stride-2 depthwise layers)
    "dws-s2": (A.DIRECT, FCase("nhwc-depthwise-s2", (2, 9, 11, 16), (3, 3, 1, 16), (2, 2),
                               "SAME", NHWC, fgc=16)),
    "dws-dil": (A.DIRECT, FCase("nhwc-depthwise-wdil2", (2, 9, 11, 16), (3, 3, 1, 16), (1, 1),
                                "SAME", NHWC, fgc=16, rhs_dilation=(1, 2))),
    # DIRECT dw_kernel: depthwise with a channel multiplier, and a 9-wide filter row
    "dw-x2": (A.DIRECT, FCase("nhwc-depthwise-x2", (2, 5, 11, 16), (3, 3, 1, 32), (1, 1), "SAME",
                              NHWC, fgc=16)),
    "dw-1x9": (A.DIRECT, FCase("nhwc-depthwise-1x9", (2, 5, 11, 16), (1, 9, 1, 16), (1, 1),
                               "SAME", NHWC, fgc=16)),
    # IMPLICIT_PRECOMP_GEMM on Hopper's wgmma kernel (16-bit, or f32 at DEFAULT: channels per
    # group a multiple of 64 / 32, K a multiple of 8): 128- or 64-wide tiles, staged epilogue
    "wgmma": (A.IMPLICIT_PRECOMP_GEMM, FCase("nhwc-c64k72", (2, 9, 9, 64), (3, 3, 64, 72),
                                             (1, 1), "SAME", NHWC)),
    # mma.sync GEMM family, channels-last: full 8-column 16-bit runs of the vector epilogue
    "mma": (A.IMPLICIT_GEMM, FCase("nhwc-c16k24", (2, 9, 9, 16), (3, 3, 16, 24), (1, 1), "SAME",
                                   NHWC)),
}
PATH_DTYPES = [(F32, None), (BF16, None), (F16, None), (BF16, F32)]


def _low_precision_reference(case, x, w, b, r, out, act, param=None):
  """The float64 reference of operands rounded as the call sees them (bias and residual in the
  result dtype)."""
  rnd = lambda v: None if v is None else f64(v.astype(out))
  return reference(case, f64(x), f64(w), rnd(b), rnd(r), act, param)


@pytest.mark.parametrize("dtype,pet", PATH_DTYPES, ids=lambda v: str(v))
@pytest.mark.parametrize("path", sorted(PATH_CASES))
def test_kernel_path_forward_epilogue(path, dtype, pet):
  """Every bias / residual combination through the path's epilogue, a piecewise-linear and a
  transcendental activation, in jit."""
  algo, case = PATH_CASES[path]
  out = np.dtype(pet or dtype)
  for i, (has_b, has_r) in enumerate(OPERANDS):
    act, p = (("leaky_relu", 0.2), ("silu", None))[i % 2]
    x, w, b, r = case.inputs(dtype, seed=110 + i)
    b, r = (b if has_b else None), (r if has_r else None)
    y = jax.jit(fused(case, algo, act, p, preferred_element_type=pet))(x, w, bias=b, residual=r)
    assert y.dtype == out
    want = _low_precision_reference(case, x, w, b, r, out, act, p)
    assert_close(y, want, tolerance(dtype, out), f"{act} bias={has_b} residual={has_r}")


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("path", ["grp", "dws-s2", "dw-x2", "wgmma"])
def test_kernel_path_grads_store_the_preactivation(path, dtype):
  """silu's derivative reads the pre-activation, which the forward kernel then stores beside its
  result (the epilogue's preact output): d/d(x, w, bias, residual) against float64."""
  algo, case = PATH_CASES[path]
  x, w, b, r = case.inputs(dtype, seed=120)
  c = rand(case.out_shape(), F64, seed=121)
  loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a).astype(F64)) * c)
  ours = jax.grad(loss(lambda *a: _call(fused(case, algo, "silu"), *a)),
                  argnums=(0, 1, 2, 3))(x, w, b, r)
  want = jax.grad(loss(lambda *a: reference(case, *a, "silu")),
                  argnums=(0, 1, 2, 3))(*(f64(v) for v in (x, w, b, r)))
  tol = 5e-2 if dtype == BF16 else tolerance(F32, F32)
  for name, o, e in zip(("x", "w", "bias", "residual"), ours, want):
    assert o.dtype == dtype
    assert_close(o, e, tol, f"d/d{name}")


def test_kernel_path_wgmma_many_tiles():
  """A 1x1 layer with 64 input channels: one K step per tile, 1024 tiles, more than the resident
  CTAs. The plain convolution walks them persistently; with an epilogue (each operand
  combination) every CTA takes one tile, its biases and residuals copied into shared memory
  during the K loop."""
  case = FCase("nhwc-1x1-c64k64-many", (16, 64, 64, 64), (1, 1, 64, 64), (1, 1), "VALID", NHWC)
  for dtype in (BF16, F16):
    x, w, b, r = case.inputs(dtype, seed=130)
    f = jax.jit(fused(case, A.IMPLICIT_PRECOMP_GEMM, "relu"))
    for has_b, has_r in OPERANDS:
      bb, rr = (b if has_b else None), (r if has_r else None)
      want = _low_precision_reference(case, x, w, bb, rr, dtype, "relu")
      assert_close(f(x, w, bias=bb, residual=rr), want, tolerance(dtype), f"{dtype} {has_b} {has_r}")
    plain = jax.jit(fused(case, A.IMPLICIT_PRECOMP_GEMM))(x, w)
    assert_close(plain, _low_precision_reference(case, x, w, None, None, dtype, None),
                 tolerance(dtype), f"{dtype} plain")


# Paths whose 16-bit stores apply a relu epilogue in the rounding (cvt.rn.relu on the GPU):
# DIRECT's depthwise kernel (whose accumulators also start at the biases) and the wgmma kernel
# (many one-tile CTAs, biases and residuals from shared memory).
RELU16_CASES = {
    "dws": (A.DIRECT, FCase("nhwc-depthwise-3x3", (2, 5, 11, 16), (3, 3, 1, 16), (1, 1), "SAME",
                            NHWC, fgc=16)),
    "wgmma-persistent": (A.IMPLICIT_PRECOMP_GEMM, FCase("nhwc-1x1-c64k64-many", (16, 64, 64, 64),
                                                        (1, 1, 64, 64), (1, 1), "VALID", NHWC)),
}


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
@pytest.mark.parametrize("path", sorted(RELU16_CASES))
def test_relu_epilogue_in_16_bit_nan_and_negatives(path, dtype):
  """A NaN residual stays NaN through relu, a pre-activation far below zero gives exactly 0, one
  far above passes, no result is negative, and the rest match float64, with and without a bias."""
  algo, case = RELU16_CASES[path]
  for has_b in (True, False):
    x, w, b, r = case.inputs(dtype, seed=150)
    b = b if has_b else None
    r = r.at[0, 0, 0, :3].set(jnp.array([jnp.nan, -1e4, 1e4], dtype))
    y = np.asarray(jax.jit(fused(case, algo, "relu"))(x, w, bias=b, residual=r), np.float64)
    want = _low_precision_reference(case, x, w, b, r, dtype, "relu")
    what = f"{dtype} bias={has_b}"
    assert np.isnan(y[0, 0, 0, 0]), what
    assert y[0, 0, 0, 1] == 0 and y[0, 0, 0, 2] > 9e3, what
    finite = np.isfinite(np.asarray(want))
    assert np.array_equal(finite, np.isfinite(y)), what
    assert np.all(y[finite] >= 0), what
    assert_close(y[finite], np.asarray(want)[finite], tolerance(dtype), what)


@pytest.mark.parametrize("algo", GENERAL_FAMILIES, ids=algo_id)
def test_empty_input_with_padding_applies_the_epilogue(algo):
  """An input with no rows still has padded outputs: y = act(bias + residual) there (the CUDA
  families' epilogue fill), not zeros."""
  case = FCase("nhwc-empty-rows-padded", (2, 0, 5, 4), (3, 3, 4, 8), (1, 1), ((2, 2), (1, 1)),
               NHWC)
  x, w, b, r = case.inputs(F32, seed=140)
  assert r.shape == (2, 2, 5, 8)
  y = fused(case, algo, "elu")(x, w, bias=b, residual=r)
  want = jax.nn.elu(b + r)
  assert_close(y, want, RTOL[F32], "empty input")


def test_forward_casts_bias_and_residual_to_the_output_dtype():
  case = WINO_CASES[0]
  x, w, b, r = case.inputs(F32, seed=3)
  y = jaxdnn.conv(x, w, **case.conv_kwargs(), bias=b.astype(F64), residual=r.astype(F64),
                  activation="relu")
  assert y.dtype == F32
  y16 = jaxdnn.conv(x.astype(BF16), w.astype(BF16), **case.conv_kwargs(), bias=b,
                    residual=r.astype(F16), activation="relu")
  assert y16.dtype == BF16
  want = reference(case, f64(x.astype(BF16)), f64(w.astype(BF16)), f64(b.astype(BF16)),
                   f64(r.astype(F16).astype(BF16)), "relu")
  assert_close(y16, want, RTOL[BF16])


def test_forward_empty_batch_and_nan_propagation():
  case = WINO_CASES[0]
  x, w, b, r = case.inputs(seed=4)
  y = jaxdnn.conv(x[:0], w, **case.conv_kwargs(), bias=b, residual=r[:0], activation="gelu")
  assert y.shape == (0, *r.shape[1:])
  g = jax.grad(lambda x, b: jnp.sum(jaxdnn.conv(x, w, **case.conv_kwargs(), bias=b,
                                                activation="relu")), argnums=(0, 1))(x[:0], b)
  assert g[0].shape == x[:0].shape and np.all(np.asarray(g[1]) == 0)
  # NaN in the residual propagates through relu (as jax.nn.relu).
  r_nan = r.at[0, 0, 0, 0].set(jnp.nan)
  y = jaxdnn.conv(x, w, **case.conv_kwargs(), residual=r_nan, activation="relu", algo="direct")
  assert np.isnan(np.asarray(y)[0, 0, 0, 0]) and np.isfinite(np.asarray(y)[0, 1:]).all()


# ---------------------------------------------------------------------------------------------
# Derivatives.

def _loss(fn, c):
  return lambda *args: jnp.sum(jnp.sin(fn(*args)) * c)


GRAD_FAMILIES = GENERAL_FAMILIES + ((A.WINOGRAD_NONFUSED,) if PLATFORM == "cpu" else ())


@pytest.mark.parametrize("algo", GRAD_FAMILIES, ids=algo_id)
def test_grads_to_all_operands(algo):
  """d/d(x, w, bias, residual) against jax.grad of the unfused float64 computation: four
  activations per family (every activation on two families), rotating through its geometries."""
  f = GRAD_FAMILIES.index(algo)
  for i in ((2 * f + j) % len(ACTS) for j in range(4)):
    act = ACTS[i]
    case = cases_for(algo)[(i + f) % len(cases_for(algo))]
    x, w, b, r = case.inputs(seed=20 + i)
    c = rand(case.out_shape(), F64, seed=99)
    p = PARAMS.get(act)
    ours = jax.grad(_loss(lambda x, w, b, r: _call(fused(case, algo, act, p), x, w, b, r), c),
                    argnums=(0, 1, 2, 3))(x, w, b, r)
    want = jax.grad(_loss(lambda x, w, b, r: reference(case, x, w, b, r, act, p), c),
                    argnums=(0, 1, 2, 3))(x, w, b, r)
    for name, o, e in zip(("x", "w", "bias", "residual"), ours, want):
      assert_close(o, e, 1e-11, f"{case.id} {act} d/d{name}")


def test_grads_bias_only_and_low_precision():
  case = GENERAL_CASES[4]  # depthwise NCHW
  x, w, b, r = case.inputs(seed=30)
  gb = jax.grad(lambda b: jnp.sum(jaxdnn.conv(x, w, **case.conv_kwargs(), bias=b,
                                              activation="tanh") ** 2))(b)
  want = jax.grad(lambda b: jnp.sum(reference(case, x, w, b, None, "tanh") ** 2))(b)
  assert_close(gb, want, 1e-11, "bias only")
  xb, wb, bb, rb = (v.astype(BF16) for v in (x, w, b, r))
  ours = jax.grad(lambda *a: jnp.sum(_call(fused(case, "auto", "gelu"), *a).astype(F32) ** 2),
                  argnums=(0, 1, 2, 3))(xb, wb, bb, rb)
  ref = jax.grad(lambda *a: jnp.sum(reference(case, *a, "gelu") ** 2),
                 argnums=(0, 1, 2, 3))(*(f64(v) for v in (xb, wb, bb, rb)))
  for o, e in zip(ours, ref):
    assert o.dtype == BF16
    assert_close(o, e, 5e-2, "bfloat16 grads")


@pytest.mark.parametrize("act,algo", [("gelu", A.DIRECT), ("tanh", A.GEMM),
                                      ("silu", A.IMPLICIT_PRECOMP_GEMM),
                                      ("sigmoid", A.IMPLICIT_GEMM),
                                      ("gelu_tanh", A.WINOGRAD_NONFUSED if PLATFORM == "cpu"
                                       else A.DIRECT)])
def test_check_grads_order2(act, algo):
  case = WINO_CASES[1] if algo == A.WINOGRAD_NONFUSED else GENERAL_CASES[3]
  x, w, b, r = case.inputs(seed=40, scale=1.0)
  fn = fused(case, algo, act)
  check_grads(lambda x, w, b, r: _call(fn, x, w, b, r), (x, w, b, r), order=2,
              modes=("fwd", "rev"))


def test_jvp_and_grad_of_grad_match_the_reference():
  case = GENERAL_CASES[1]
  x, w, b, r = case.inputs(seed=41)
  for act in ("elu", "gelu"):
    fn = lambda *a: _call(fused(case, "auto", act), *a)
    ref = lambda *a: reference(case, *a, act)
    tangents = case.inputs(seed=42)
    _, t_ours = jax.jvp(fn, (x, w, b, r), tangents)
    _, t_ref = jax.jvp(ref, (x, w, b, r), tangents)
    assert_close(t_ours, t_ref, 1e-11, f"{act} jvp")
    gg = lambda f: jax.grad(lambda x, w, b: jnp.sum(
        jax.grad(lambda x, w, b: jnp.sum(jnp.sin(f(x, w, b, r))), argnums=(0, 1, 2))(x, w, b)[1]
        ** 2), argnums=(0, 1, 2))
    for o, e in zip(gg(fn)(x, w, b), gg(ref)(x, w, b)):
      assert_close(o, e, 1e-10, f"{act} grad of grad")


def test_bias_act_backward_is_its_own_transpose():
  """<dz(t, tb), c> = <t, dz(c)> + <tb, db(c)> for the channels-first and channels-last views."""
  for shape, axis in (((2, 3, 4, 5), 1), ((2, 4, 5, 3), 3)):
    t, c, s = (rand(shape, F64, seed=k) for k in (1, 2, 3))
    tb = rand((shape[axis],), F64, seed=4)
    for act in ("elu", "gelu"):
      kw = dict(activation=act, activation_param=0.5 if act == "elu" else 0.0,
                channel_axis=axis)
      lhs = jnp.vdot(fused_prims.bias_act_backward(t, tb, s, reduce=False, **kw), c)
      dz, db = fused_prims.bias_act_backward(c, None, s, reduce=True, **kw)
      assert abs(float(lhs - jnp.vdot(t, dz) - jnp.vdot(tb, db))) < 1e-10 * float(jnp.abs(lhs))
      d = fused_prims.derivative(act, s, kw["activation_param"])
      assert_close(dz, c * d, 1e-14, "dz")
      assert_close(db, jnp.sum(c * d, axis=tuple(i for i in range(4) if i != axis)), 1e-13)


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
def test_bias_act_backward_kernel_dtypes(dtype):
  """The kernel on channels-first planes, and channels-last rows shorter and longer than its
  256-element blocks, for every activation; on the GPU also its 16-byte vector forms (channel
  counts that are multiples of 8: rows, many rows split over several blocks per channel group,
  and planes)."""
  for shape, axis in (((3, 5, 7, 2), 1), ((50, 3), 1), ((7, 300), 1), ((40, 64), 1),
                      ((3000, 64), 1), ((3, 4, 8, 8), 1)):
    t, s = rand(shape, dtype, seed=1), rand(shape, dtype, seed=2)
    k = shape[axis]
    tb = rand((k,), dtype, seed=3)
    bshape = [1] * len(shape)
    bshape[axis] = k
    others = tuple(i for i in range(len(shape)) if i != axis)
    for act in ACTS:
      p = PARAMS.get(act, 0.0)
      dz, db = fused_prims.bias_act_backward(t, tb, s, activation=act, activation_param=p,
                                             channel_axis=axis)
      assert dz.dtype == dtype and db.dtype == dtype
      want = (f64(t) + f64(tb).reshape(bshape)) * fused_prims.derivative(act, f64(s), p)
      assert_close(dz, want, RTOL[dtype], f"{shape} {act} dz")
      assert_close(db, jnp.sum(want, axis=others), 4 * RTOL[dtype], f"{shape} {act} db")


# ---------------------------------------------------------------------------------------------
# vmap.

VMAP_CASE = FCase("nchw-groups2", (2, 4, 5, 4), (6, 2, 3, 3), (1, 1), "SAME", NCHW, fgc=2)
VMAP_COMBOS = [axes for axes in itertools.product((None, 0), repeat=4) if any(
    a is not None for a in axes)]


def _stacked(case, axes, size=2):
  members = [case.inputs(seed=50 + i) for i in range(size)]
  args = []
  for j, ax in enumerate(axes):
    stack = jnp.stack([m[j] for m in members])
    args.append(members[0][j] if ax is None else jnp.moveaxis(stack, 0, ax))
  return args


@pytest.mark.parametrize("axes", VMAP_COMBOS, ids=lambda a: "".join("-" if v is None else "b"
                                                                    for v in a))
def test_vmap_every_operand_combination(axes):
  case = VMAP_CASE
  # Also a non-leading mapped axis for x and the residual.
  axes = tuple(None if a is None else (2 if j in (0, 3) else 0) for j, a in enumerate(axes))
  args = _stacked(case, axes)
  fn = lambda *a: _call(fused(case, "auto", "silu"), *a)
  ref = lambda *a: reference(case, *a, "silu")
  assert_close(jax.vmap(fn, in_axes=axes)(*args), jax.vmap(ref, in_axes=axes)(*args), 1e-12)
  if sum(a is not None for a in axes) in (1, 4):
    loss = lambda f: jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=(0, 1, 2, 3))
    for o, e in zip(jax.vmap(loss(fn), in_axes=axes)(*args),
                    jax.vmap(loss(ref), in_axes=axes)(*args)):
      assert_close(o, e, 1e-11, "vmap of grad")


def test_vmap_size_zero_and_nested():
  case = WINO_CASES[0]
  x, w, b, r = case.inputs(seed=60)
  fn = lambda x, b: jaxdnn.conv(x, w, **case.conv_kwargs(), bias=b, activation="relu")
  y = jax.vmap(fn)(x[None][:0], b[None][:0])
  assert y.shape == (0, *r.shape)
  xs, bs = jnp.stack([x, 2 * x]), jnp.stack([b, -b])
  got = jax.vmap(jax.vmap(fn, in_axes=(None, 0)), in_axes=(0, None))(xs, bs)
  want = jnp.stack([jnp.stack([reference(case, xi, w, bi, None, "relu") for bi in bs])
                    for xi in xs])
  assert_close(got, want, 1e-12)


# ---------------------------------------------------------------------------------------------
# What the HLO holds.

ELEMENTWISE_OPS = ("stablehlo.maximum", "stablehlo.minimum", "stablehlo.tanh",
                   "stablehlo.logistic", "stablehlo.exponential", "stablehlo.erf", "chlo.erf",
                   "stablehlo.select", "stablehlo.compare", "stablehlo.reduce")


def _hlo(fn, *args):
  return jax.jit(fn).lower(*args).as_text()


def test_hlo_one_fused_call_and_no_activation_op():
  case = WINO_CASES[0]
  x, w, b, r = case.inputs(seed=70)
  for act in ("relu", "gelu", "clipped_relu"):
    fn = lambda x, w, b, r: _call(fused(case, "gemm", act), x, w, b, r)
    text = _hlo(fn, x, w, b, r)
    assert text.count("@jaxdnn_conv_fwd_fused(") == 1 and "@jaxdnn_conv_fwd(" not in text
    assert "convolution" not in text
    for op in ELEMENTWISE_OPS + ("stablehlo.add",):
      assert op not in text, f"{act}: {op} outside the fused call"
    # The backward: one bias/activation pass (mask and bias reduction), dgrad, wgrad.
    grad = lambda x, w, b, r, ct: jax.vjp(fn, x, w, b, r)[1](ct)
    gtext = _hlo(grad, x, w, b, r, r)
    assert gtext.count("@jaxdnn_bias_act_bwd(") == 1
    assert "@jaxdnn_conv_bwd_data(" in gtext and "@jaxdnn_conv_bwd_filter(" in gtext
    for op in ELEMENTWISE_OPS:
      assert op not in gtext, f"{act} backward: {op} outside jaxdnn's calls"


def test_preact_stored_only_when_differentiating_an_input_kind():
  case = WINO_CASES[0]
  x, w, b, r = case.inputs(seed=71)

  def with_preact(fn, *args):
    eqns = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns
            if e.primitive is fused_prims.conv_fused_forward_p]
    assert len(eqns) == 1
    return eqns[0].params["with_preact"]

  for act, needs in (("gelu", True), ("silu", True), ("relu", False), ("tanh", False)):
    fn = lambda x, b: jaxdnn.conv(x, w, **case.conv_kwargs(), bias=b, activation=act)
    assert not with_preact(fn, x, b)
    assert with_preact(jax.grad(lambda x, b: jnp.sum(fn(x, b))), x, b) == needs


def test_no_epilogue_lowers_as_plain_conv():
  case = WINO_CASES[0]
  x, w, _, _ = case.inputs(seed=72)
  plain = _hlo(lambda x, w: jaxdnn.conv(x, w, **case.conv_kwargs()), x, w)
  for kw in (dict(), dict(activation="identity"), dict(activation="linear")):
    text = _hlo(lambda x, w: jaxdnn.conv(x, w, **case.conv_kwargs(), **kw), x, w)
    assert "fused" not in text and text.count("@jaxdnn_conv_fwd(") == 1
    assert text == plain


def test_linen_conv_runs_one_fused_call():
  nn = pytest.importorskip("flax.linen")
  import jaxdnn.nn as dnn
  x = rand((2, 6, 6, 3), F32, seed=73)
  for act, extra in (("relu", ()), ("gelu", ()), (jax.nn.relu, ("stablehlo.maximum",))):
    mod = dnn.Conv(4, (3, 3), algo="direct", activation=act)
    v = mod.init(jax.random.key(0), x)
    text = _hlo(mod.apply, v, x)
    assert text.count("@jaxdnn_conv_fwd_fused(") == 1
    for op in ("stablehlo.maximum", "stablehlo.add"):
      assert (op in text) == (op in extra), f"{act}: {op}"
    want = REF_ACT["relu" if callable(act) else act](nn.Conv(4, (3, 3)).apply(v, x), None)
    assert_close(mod.apply(v, x), want, 1e-5)


# ---------------------------------------------------------------------------------------------
# Errors.

@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(bias=jnp.ones(3)), ValueError, r"bias must have shape \(5,\)"),
    (dict(bias=jnp.ones((1, 5))), ValueError, "bias"),
    (dict(bias=jnp.ones(5, bool)), TypeError, "bias"),
    (dict(bias=jnp.ones(5, jnp.complex64)), TypeError, "bias"),
    (dict(residual=jnp.ones((2, 6, 5, 4))), ValueError, r"residual must have shape \(2, 6, 5, 5\)"),
    (dict(residual=jnp.ones((2, 5, 6, 5))), ValueError, "residual"),
    (dict(activation="nope"), ValueError, "unknown activation"),
    (dict(activation=3), TypeError, "activation"),
    (dict(activation_param=0.1), ValueError, "needs an activation"),
    (dict(activation="relu", activation_param=0.1), ValueError, "takes no parameter"),
    (dict(activation="relu6", activation_param=5.0), ValueError, "fixes"),
    (dict(activation="clipped_relu", activation_param=-1.0), ValueError, "positive"),
    (dict(activation="leaky_relu", activation_param=-1.0), ValueError, "non-negative"),
])
def test_bad_arguments(kwargs, exc, match):
  case = WINO_CASES[0]
  x, w, _, _ = case.inputs(seed=80)
  with pytest.raises(exc, match=match):
    jaxdnn.conv(x, w, **case.conv_kwargs(), **kwargs)


def test_family_without_epilogue_is_refused_and_auto_avoids_it(monkeypatch):
  case = WINO_CASES[0]
  x, w, b, _ = case.inputs(seed=81)
  # Every CPU family carries the epilogue; one that cannot run the geometry is refused. On CUDA
  # the reason may instead be that the family has no kernel carrying the epilogue.
  strided = {**case.conv_kwargs(), "window_strides": (2, 2)}
  why = (r"(FFT needs window_strides 1, got \(2, 2\)|FFT has no CUDA kernel carrying a fused "
         r"epilogue)")
  with pytest.raises(ValueError, match=r"algo=FFT cannot run the fused .*" + why +
                     r".* Families that can:"):
    jaxdnn.conv(x, w, **strided, bias=b, activation="relu", algo="fft")

  # An extension without the fused queries (a CUDA build predating them) carries the epilogue
  # in the four general families only, with the plain forward's support and workspace.
  cpu = ffi.extension("cpu")

  class OldExtension:
    can_implement = staticmethod(cpu.can_implement)
    workspace_bytes = staticmethod(cpu.workspace_bytes)

  monkeypatch.setattr(algorithms.ffi, "extension", lambda platform: OldExtension)
  g = jaxdnn.ConvGeometry(layout=jaxdnn.Layout.NHWC, in_spatial=(8, 8), filter_spatial=(3, 3),
                          stride=(1, 1), rhs_dilation=(1, 1), lhs_dilation=(1, 1),
                          pad_lo=(1, 1), pad_hi=(1, 1))
  args = ("cpu", ConvOp.FORWARD)
  probs = (g, 2, 64, 64, F32, F32, jaxdnn.MathPrecision.DEFAULT)
  assert algorithms.choose_algorithm(*args, "auto", *probs) == A.WINOGRAD_NONFUSED
  assert algorithms.choose_algorithm(*args, "auto", *probs, fused=True) in GENERAL_FAMILIES
  assert "carries no fused epilogue" in algorithms.unsupported_reason(
      *args, A.WINOGRAD_NONFUSED, *probs, fused=True)
  assert algorithms.workspace_bytes(*args, A.GEMM, *probs, fused=True) == \
      algorithms.workspace_bytes(*args, A.GEMM, *probs)


def test_ffi_handler_rejects_bad_calls():
  """The handler's own checks (ffi_conv.h), reached by calling the target directly."""
  case = WINO_CASES[0]
  x, w, b, r = case.inputs(F32, seed=82)
  g = jaxdnn.ConvGeometry(layout=jaxdnn.Layout.NHWC, in_spatial=(6, 5), filter_spatial=(3, 3),
                          stride=(1, 1), rhs_dilation=(1, 1), lhs_dilation=(1, 1),
                          pad_lo=(1, 1), pad_hi=(1, 1))
  # HIGHEST: true float32 on the GPU too (no TF32), so the 1e-5 bounds below hold everywhere.
  ws = algorithms.workspace_bytes(LOWERING_PLATFORM, ConvOp.FORWARD, A.GEMM, g, 2, 3, 5, F32,
                                  F32, jaxdnn.MathPrecision.HIGHEST, fused=True)

  def call(bias, residual, act=1, preact_shape=(0,)):
    f = jax.ffi.ffi_call(fused_prims.FUSED_TARGET,
                         (jax.ShapeDtypeStruct(r.shape, F32),
                          jax.ShapeDtypeStruct(preact_shape, F32),
                          jax.ShapeDtypeStruct((ws,), np.uint8)))
    return f(x, w, bias, residual, algo=np.int32(A.GEMM.id), precision=np.int32(2),
             activation=np.int32(act), activation_param=np.float64(0), **g.ffi_attributes())

  none = jnp.zeros((0,), F32)
  y, z, _ = jax.jit(call, static_argnums=(2, 3))(b, r, 7, r.shape)
  assert_close(y, reference(case, f64(x), f64(w), f64(b), f64(r), "gelu"), 1e-5)
  assert_close(z, reference(case, f64(x), f64(w), f64(b), f64(r), None), 1e-5)
  for bias, residual, act, match in ((b[:3], none, 1, r"bias must have shape \[K\]"),
                                     (b.astype(F64), none, 1, "bias must have the result"),
                                     (none, r[:, :2], 1, "residual must have the result's shape"),
                                     (none, none, 42, "unknown activation id")):
    with pytest.raises(Exception, match=match):
      jax.block_until_ready(jax.jit(call, static_argnums=(2,))(bias, residual, act))


# ---------------------------------------------------------------------------------------------
# CUDA lowering (no GPU needed; needs the CUDA extension for its trace-time queries).

CUDA = ffi.extension("cuda")


@pytest.mark.skipif(CUDA is None, reason="the jaxdnn CUDA extension is not built in this install")
@pytest.mark.parametrize("algo", GENERAL_FAMILIES + ("auto",), ids=algo_id)
def test_cuda_lowering_emits_the_fused_target(algo):
  case = WINO_CASES[0]
  x, w, b, r = (v.astype(BF16) for v in case.inputs(seed=90))
  fn = lambda *a: _call(fused(case, algo, "relu"), *a)
  text = jax.jit(fn).trace(x, w, b, r).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("@jaxdnn_conv_fwd_fused(") == 1 and "convolution" not in text
  grad = jax.grad(lambda *a: jnp.sum(fn(*a).astype(F32)), argnums=(0, 1, 2, 3))
  gtext = jax.jit(grad).trace(x, w, b, r).lower(lowering_platforms=("cuda",)).as_text()
  assert "@jaxdnn_conv_bwd_data(" in gtext and "@jaxdnn_conv_bwd_filter(" in gtext
  if fused_prims.BIAS_ACT_TARGET in CUDA.registrations():
    assert "@jaxdnn_bias_act_bwd(" in gtext


def test_family_without_a_fused_kernel_runs_its_plain_kernel_and_a_separate_epilogue(
    monkeypatch):
  """A family that runs the problem but carries no epilogue on the backend (the CUDA Winograd
  and FFT families) computes its own plain forward kernel, then the epilogue in one XLA
  elementwise pass: never another family. Simulated on this backend by reporting
  WINOGRAD_NONFUSED's fused form unsupported; values and gradients against float64 lax."""
  real = algorithms.unsupported_reason

  def without_fused_winograd(platform, op, algo, *args, fused=False):
    if fused and algo == A.WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED carries no fused epilogue (simulated)"
    return real(platform, op, algo, *args, fused=fused)

  monkeypatch.setattr(algorithms, "unsupported_reason", without_fused_winograd)
  case = WINO_CASES[1]
  x, w, b, r = case.inputs(seed=84)
  fn = lambda *a: _call(fused(case, A.WINOGRAD_NONFUSED, "gelu"), *a)
  text = _hlo(fn, x, w, b, r)
  assert "@jaxdnn_conv_fwd(" in text and "@jaxdnn_conv_fwd_fused(" not in text
  assert_close(jax.jit(fn)(x, w, b, r), reference(case, x, w, b, r, "gelu"), tolerance(F64))
  loss = lambda *a: jnp.sum(fn(*a) ** 2)
  want = jax.grad(lambda *a: jnp.sum(reference(case, *a, "gelu") ** 2), argnums=(0, 1, 2, 3))
  for got, ref in zip(jax.grad(loss, argnums=(0, 1, 2, 3))(x, w, b, r), want(x, w, b, r)):
    assert_close(got, ref, tolerance(F64))


@pytest.mark.skipif(CUDA is None, reason="the jaxdnn CUDA extension is not built in this install")
@pytest.mark.parametrize("algo", [A.WINOGRAD_NONFUSED, A.WINOGRAD, A.FFT_TILING], ids=algo_id)
def test_cuda_family_without_a_fused_kernel_lowers_to_its_plain_kernel(algo):
  case = WINO_CASES[0]
  x, w, b, r = case.inputs(F32, seed=91)
  fn = lambda *a: _call(fused(case, algo, "relu", precision=lax.Precision.HIGHEST), *a)
  text = jax.jit(fn).trace(x, w, b, r).lower(lowering_platforms=("cuda",)).as_text()
  assert "@jaxdnn_conv_fwd(" in text and "@jaxdnn_conv_fwd_fused(" not in text
  assert "convolution" not in text  # no XLA convolution either
