"""Every invalid argument raises ValueError or TypeError naming it, at trace time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn
from grid import NHWC
from helpers import RESTRICTED, PLATFORM, algo_id

X_SHAPE = (2, 5, 5, 4)  # NHWC
W_SHAPE = (3, 3, 4, 6)  # HWIO


def _call(x_shape=X_SHAPE, w_shape=W_SHAPE, x_dtype=jnp.float32, w_dtype=None, **overrides):
  kwargs = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC)
  if len(x_shape) != 4 or len(w_shape) != 4:
    kwargs["dimension_numbers"] = None
    kwargs["window_strides"] = (1,) * max(len(x_shape) - 2, 0)
  kwargs.update(overrides)
  x = jnp.zeros(x_shape, x_dtype)
  w = jnp.zeros(w_shape, w_dtype or x_dtype)
  return jaxdnn.conv(x, w, **kwargs)


# (id, call overrides, exception type, regex the message must match)
CASES = [
    # ranks and shapes
    ("rank-mismatch", dict(x_shape=(2, 5, 5, 4), w_shape=(3, 4, 6)), ValueError, "same rank"),
    ("rank-2", dict(x_shape=(2, 4), w_shape=(4, 6)), ValueError, r"lhs.*rank 3 to 5"),
    ("rank-6", dict(x_shape=(1, 2, 2, 2, 2, 2), w_shape=(1, 2, 1, 1, 1, 1)), ValueError,
     r"lhs.*rank 3 to 5"),
    ("channel-mismatch", dict(w_shape=(3, 3, 3, 6)), ValueError, "rhs input-feature"),
    ("bad-dimension-numbers", dict(dimension_numbers=("NHWC", "HWIO", "NHWQ")), ValueError,
     "dimension_numbers"),
    ("dimension-numbers-wrong-rank", dict(dimension_numbers=("NWC", "WIO", "NWC")), ValueError,
     "dimension_numbers"),
    # groups
    ("fgc-not-dividing-channels", dict(feature_group_count=3), ValueError,
     "feature_group_count=3 must divide the lhs feature"),
    ("fgc-not-dividing-out-channels", dict(w_shape=(3, 3, 1, 6), feature_group_count=4),
     ValueError, "feature_group_count=4 must divide the rhs output"),
    ("fgc-zero", dict(feature_group_count=0), ValueError, "feature_group_count"),
    ("fgc-negative", dict(feature_group_count=-2), ValueError, "feature_group_count"),
    ("fgc-float", dict(feature_group_count=1.5), TypeError, "feature_group_count"),
    ("both-group-counts", dict(x_shape=(4, 5, 5, 4), w_shape=(3, 3, 2, 6), feature_group_count=2,
                               batch_group_count=2), ValueError,
     "feature_group_count and batch_group_count"),
    ("bgc-not-dividing-batch", dict(x_shape=(3, 5, 5, 4), batch_group_count=2), ValueError,
     "batch_group_count=2 must divide the lhs batch"),
    ("bgc-not-dividing-out-channels", dict(x_shape=(4, 5, 5, 4), w_shape=(3, 3, 4, 3),
                                           batch_group_count=2), ValueError,
     "batch_group_count=2 must divide the rhs output"),
    ("bgc-zero", dict(batch_group_count=0), ValueError, "batch_group_count"),
    # strides and dilations
    ("stride-zero", dict(window_strides=(0, 1)), ValueError, "window_strides"),
    ("stride-negative", dict(window_strides=(1, -2)), ValueError, "window_strides"),
    ("stride-wrong-length", dict(window_strides=(1,)), ValueError, "window_strides"),
    ("stride-too-long", dict(window_strides=(1, 1, 1)), ValueError, "window_strides"),
    ("stride-float", dict(window_strides=(1.5, 1)), TypeError, "window_strides"),
    ("stride-not-sequence", dict(window_strides=2), TypeError, "window_strides"),
    ("rhs-dilation-zero", dict(rhs_dilation=(1, 0)), ValueError, "rhs_dilation"),
    ("rhs-dilation-wrong-length", dict(rhs_dilation=(2,)), ValueError, "rhs_dilation"),
    ("lhs-dilation-zero", dict(lhs_dilation=(0, 1), padding=((0, 0), (0, 0))), ValueError,
     "lhs_dilation"),
    ("lhs-dilation-negative", dict(lhs_dilation=(1, -1), padding=((0, 0), (0, 0))), ValueError,
     "lhs_dilation"),
    ("lhs-dilation-wrong-length", dict(lhs_dilation=(2, 2, 2), padding=((0, 0), (0, 0))),
     ValueError, "lhs_dilation"),
    # padding
    ("padding-wrong-length", dict(padding=((1, 1),)), ValueError, "padding"),
    ("padding-too-long", dict(padding=((1, 1), (1, 1), (1, 1))), ValueError, "padding"),
    ("padding-not-pairs", dict(padding=((1, 1, 1), (1, 1, 1))), ValueError, "padding"),
    ("padding-bad-string", dict(padding="FULL"), ValueError, "padding"),
    ("padding-float-pairs", dict(padding=((1.5, 1), (1, 1))), TypeError, "padding"),
    ("padding-int", dict(padding=1), TypeError, "padding"),
    ("string-padding-with-lhs-dilation", dict(padding="SAME", lhs_dilation=(2, 2)), ValueError,
     "padding.*lhs_dilation"),
    ("valid-padding-with-lhs-dilation", dict(padding="VALID", lhs_dilation=(1, 2)), ValueError,
     "padding.*lhs_dilation"),
    # algorithm
    ("unknown-algo", dict(algo="winograd2"), ValueError,
     r"algo.*'implicit_gemm'.*'implicit_precomp_gemm'.*'gemm'.*'direct'.*'fft'.*'winograd'"),
    ("algo-int", dict(algo=3), ValueError, "algo"),
    ("algo-none", dict(algo=None), ValueError, "algo"),
    # dtypes
    ("int32", dict(x_dtype=jnp.int32), TypeError, "lhs has dtype int32"),
    ("complex64", dict(x_dtype=jnp.complex64), TypeError, "lhs has dtype complex64"),
    ("int8-rhs", dict(w_dtype=jnp.int8), TypeError, "rhs has dtype int8"),
    ("bool", dict(x_dtype=jnp.bool_), TypeError, "lhs has dtype bool"),
    ("mismatched-dtypes", dict(x_dtype=jnp.float32, w_dtype=jnp.float64), TypeError,
     "lhs and rhs must have the same dtype"),
    ("mismatched-16-bit", dict(x_dtype=jnp.bfloat16, w_dtype=jnp.float16), TypeError,
     "same dtype"),
    ("preferred-int32", dict(preferred_element_type=jnp.int32), TypeError,
     "preferred_element_type"),
    ("preferred-complex", dict(preferred_element_type=jnp.complex64), TypeError,
     "preferred_element_type"),
    ("preferred-garbage", dict(preferred_element_type="not-a-dtype"), TypeError,
     "preferred_element_type.*not-a-dtype"),
    ("preferred-narrower", dict(x_dtype=jnp.float64, preferred_element_type=jnp.float32),
     TypeError, "preferred_element_type must not be narrower"),
    # precision
    ("precision-bad-string", dict(precision="bogus"), ValueError, "precision"),
    ("precision-int", dict(precision=7), ValueError, "precision"),
    ("precision-triple", dict(precision=(lax.Precision.HIGHEST,) * 3), ValueError, "precision"),
    ("precision-bad-pair", dict(precision=(lax.Precision.HIGHEST, "bogus")), ValueError,
     "precision"),
]


@pytest.mark.parametrize("overrides,exc,match", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_bad_argument(overrides, exc, match):
  with pytest.raises(exc, match=match):
    _call(**overrides)


@pytest.mark.parametrize("overrides,exc,match", [pytest.param(*c[1:], id=c[0]) for c in CASES
                                                 if c[0] in ("channel-mismatch", "stride-zero",
                                                             "padding-bad-string",
                                                             "unknown-algo", "int32")])
def test_bad_argument_under_jit(overrides, exc, match):
  """The same errors at trace time inside jit (nothing reaches a kernel)."""
  overrides = dict(overrides)
  x = jnp.zeros(overrides.pop("x_shape", X_SHAPE), overrides.pop("x_dtype", jnp.float32))
  w = jnp.zeros(overrides.pop("w_shape", W_SHAPE), x.dtype)
  kwargs = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC)
  kwargs.update(overrides)
  with pytest.raises(exc, match=match):
    jax.jit(lambda x, w: jaxdnn.conv(x, w, **kwargs)).lower(x, w)


@pytest.mark.parametrize("padding", ["same", "valid", "same_lower", "SAME_LOWER"])
def test_good_padding_strings_are_accepted(padding):
  y = _call(padding=padding)
  want = lax.conv_general_dilated(jnp.zeros(X_SHAPE, jnp.float32), jnp.zeros(W_SHAPE, jnp.float32),
                                  (1, 1), padding.upper(), dimension_numbers=NHWC)
  assert y.shape == want.shape


def test_valid_arguments_accept_numpy_integers_and_lists():
  y = _call(window_strides=[np.int64(1), np.int32(1)], padding=[[1, 1], [np.int64(1), 1]],
            rhs_dilation=np.array([1, 1]), feature_group_count=np.int64(1))
  assert y.shape == (2, 5, 5, 6)


@pytest.mark.parametrize("algo", RESTRICTED, ids=algo_id)
def test_explicit_family_refusing_the_geometry_raises_not_aborts(algo):
  if PLATFORM != "cpu":
    pytest.skip("checks the CPU backend's refusal")
  with pytest.raises(ValueError, match=f"algo={algo.name}.*Families that can:"):
    _call(window_strides=(2, 2), algo=algo)
  with pytest.raises(ValueError, match="Families that can:"):
    jax.jit(lambda x, w: jaxdnn.conv(x, w, (2, 2), "SAME", dimension_numbers=NHWC,
                                     algo=algo.value))(jnp.ones(X_SHAPE), jnp.ones(W_SHAPE))


def test_primitive_rejects_operands_not_matching_geometry():
  g = jaxdnn.ConvGeometry(layout=jaxdnn.Layout.NHWC, in_spatial=(5, 5), filter_spatial=(3, 3),
                          stride=(1, 1), rhs_dilation=(1, 1), lhs_dilation=(1, 1),
                          pad_lo=(1, 1), pad_hi=(1, 1))
  x = jnp.zeros((2, 6, 5, 4), jnp.float32)  # spatial 6 != 5
  w = jnp.zeros((3, 3, 4, 6), jnp.float32)
  with pytest.raises(ValueError, match="geometry"):
    jaxdnn.conv_forward(x, w, g)
  with pytest.raises(ValueError, match="rank"):
    jaxdnn.conv_forward(jnp.zeros((2, 5, 4), jnp.float32), w, g)
  with pytest.raises(TypeError, match="dtype"):
    jaxdnn.conv_forward(jnp.zeros((2, 5, 5, 4), jnp.float32), w.astype(jnp.float64), g)
  dy = jnp.zeros((2, 5, 5, 6), jnp.float32)
  with pytest.raises(ValueError, match="geometry"):
    jaxdnn.conv_backward_data(dy, jnp.zeros((3, 2, 4, 6), jnp.float32), g)
  with pytest.raises(ValueError, match="geometry"):
    jaxdnn.conv_backward_filter(x, dy, g)
  with pytest.raises(ValueError, match="group"):
    jaxdnn.conv_forward(jnp.zeros((2, 5, 5, 4), jnp.float32), jnp.zeros((3, 3, 2, 5), jnp.float32),
                        g.replace(groups=2))


@pytest.mark.parametrize("preset, expected", [
    (lax.DotAlgorithmPreset.F32_F32_F32, jaxdnn.MathPrecision.HIGHEST),
    (lax.DotAlgorithmPreset.TF32_TF32_F32, jaxdnn.MathPrecision.DEFAULT),
    (lax.DotAlgorithmPreset.BF16_BF16_F32_X3, jaxdnn.MathPrecision.HIGH),
], ids=lambda v: getattr(v, "name", str(v)))
def test_dot_algorithm_preset_precision(preset, expected):
  """lax accepts DotAlgorithmPreset precisions; jaxdnn maps them onto its TF32 rule."""
  from jaxdnn.conv import _math_precision
  assert _math_precision(preset) == expected
  x = jnp.ones((1, 5, 5, 2), jnp.float32)
  w = jnp.ones((3, 3, 2, 2), jnp.float32)
  y = jaxdnn.conv(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                  precision=preset)
  assert y.shape == (1, 5, 5, 2)
