"""`jaxdnn.conv`: lax.conv_general_dilated's arguments and semantics, on jaxdnn kernels.

The API layer normalises the arguments into a ConvGeometry, transposes operands whose layout is
neither NHWC/HWIO nor NCHW/OIHW into the nearer native one, decomposes batch_group_count into a
grouped convolution, and binds the forward primitive. Every invalid argument raises ValueError or
TypeError here, at trace time, naming the argument.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdnn._src import activations, algorithms
from jaxdnn._src.algorithms import ConvAlgo, MathPrecision
from jaxdnn._src.geometry import ConvGeometry, Layout
from jaxdnn._src.primitives.conv import conv_forward
from jaxdnn._src.primitives.fused import conv_fused_forward

_PADDING_STRINGS = ("SAME", "VALID", "SAME_LOWER")


def _int_tuple(name: str, value, length: int, *, positive: bool) -> tuple[int, ...]:
  try:
    out = tuple(operator.index(v) for v in value)
  except TypeError:
    raise TypeError(f"{name} must be a sequence of {length} integers, got {value!r}") from None
  if len(out) != length:
    raise ValueError(f"{name} must have one entry per spatial dimension ({length}), got {value!r}")
  if positive and any(v <= 0 for v in out):
    raise ValueError(f"{name} entries must be positive integers, got {value!r}")
  return out


def _positive_int(name: str, value) -> int:
  try:
    v = operator.index(value)
  except TypeError:
    raise TypeError(f"{name} must be a positive integer, got {value!r}") from None
  if v <= 0:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")
  return v


# Dot-algorithm presets that promise more than TF32 accuracy (the rest allow TF32 / 16-bit math).
_PRESET_PRECISION = {
    "F32_F32_F32": MathPrecision.HIGHEST,
    "F64_F64_F64": MathPrecision.HIGHEST,
    "BF16_BF16_F32_X6": MathPrecision.HIGHEST,
    "BF16_BF16_F32_X9": MathPrecision.HIGHEST,
    "BF16_BF16_F32_X3": MathPrecision.HIGH,
    "TF32_TF32_F32_X3": MathPrecision.HIGH,
}


def _math_precision(precision) -> MathPrecision:
  """lax's precision argument (None, Precision, string, or a pair) -> the loosest TF32 rule."""
  if precision is None:
    default = jax.config.jax_default_matmul_precision
    if default is None:
      return MathPrecision.DEFAULT
    precision = default
  pair = precision if isinstance(precision, (tuple, list)) else (precision, precision)
  if len(pair) != 2:
    raise ValueError(f"precision must be None, a lax.Precision, a string or a pair of them, got "
                     f"{precision!r}")
  levels = []
  for p in pair:
    if p is None:
      levels.append(MathPrecision.DEFAULT)
      continue
    if isinstance(p, lax.DotAlgorithmPreset):
      levels.append(_PRESET_PRECISION.get(p.name, MathPrecision.DEFAULT))
      continue
    try:
      levels.append(MathPrecision(int(lax.Precision(p).value)))
    except (ValueError, TypeError, KeyError):
      raise ValueError(f"precision: unrecognised value {p!r}") from None
  return max(levels)


def _check_dtype(name: str, dtype) -> np.dtype:
  try:
    dtype = np.dtype(dtype)
  except TypeError:
    raise TypeError(f"{name} must be a floating dtype, got {dtype!r}") from None
  if dtype not in algorithms.SUPPORTED_DTYPES:
    supported = ", ".join(str(d) for d in algorithms.SUPPORTED_DTYPES)
    raise TypeError(f"{name} has dtype {dtype}; jaxdnn supports {supported}")
  return dtype


def _canonical_result_dtype(dtype: np.dtype) -> np.dtype:
  """preferred_element_type as lax takes it: float64 without jax_enable_x64 becomes float32,
  with lax's warning."""
  canonical = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
  if canonical != dtype:
    warnings.warn(f"Explicitly requested dtype {dtype} requested in jaxdnn.conv is not "
                  f"available, and will be truncated to dtype {canonical}. To enable more "
                  f"dtypes, set the jax_enable_x64 configuration option or the JAX_ENABLE_X64 "
                  f"shell environment variable.", stacklevel=3)
  return canonical


def _native_layout(dnums: lax.ConvDimensionNumbers, ndim: int) -> Layout:
  """NHWC when the activations are channels-last, else NCHW."""
  lhs_spec = dnums.lhs_spec
  return Layout.NHWC if lhs_spec[1] == ndim - 1 else Layout.NCHW


def _native_order(layout: Layout, ndim: int) -> tuple[int, ...]:
  """Positions, in the canonical (N, C, spatial...) order, of the native layout's axes."""
  spatial = tuple(range(2, ndim))
  return (0, *spatial, 1) if layout == Layout.NHWC else (0, 1, *spatial)


def _to_native(arr, spec, layout):
  """Transposes an activation with dimension spec (batch, feature, spatial...) to native."""
  perm = tuple(spec[i] for i in _native_order(layout, arr.ndim))
  return arr if perm == tuple(range(arr.ndim)) else jnp.transpose(arr, perm)


def _filter_to_native(rhs, spec, layout):
  """(out, in, spatial...) spec -> HWIO (NHWC) or OIHW (NCHW)."""
  ndim = rhs.ndim
  if layout == Layout.NHWC:
    perm = (*spec[2:], spec[1], spec[0])
  else:
    perm = tuple(spec)
  return rhs if perm == tuple(range(ndim)) else jnp.transpose(rhs, perm)


def _from_native(y, out_spec, layout):
  """Native output -> the user's output layout (out_spec = (batch, feature, spatial...))."""
  native = _native_order(layout, y.ndim)
  perm = [0] * y.ndim
  for i, canonical_axis in enumerate(native):
    perm[out_spec[canonical_axis]] = i
  perm = tuple(perm)
  return y if perm == tuple(range(y.ndim)) else jnp.transpose(y, perm)


def _batch_groups_into_channels(x, layout: Layout, batch_group_count: int):
  """x (N, ..., C) -> (N / bgc, ..., bgc * C): batch group i becomes channel group i."""
  ch = x.ndim - 1 if layout == Layout.NHWC else 1
  n = x.shape[0]
  x = x.reshape(batch_group_count, n // batch_group_count, *x.shape[1:])
  x = jnp.moveaxis(x, 0, ch)  # (N', ..., bgc, C, ...) with bgc just before the channel axis
  return x.reshape(*x.shape[:ch], x.shape[ch] * x.shape[ch + 1], *x.shape[ch + 2:])


def conv_operands(lhs, rhs):
  """lhs and rhs as arrays of one rank with 1 to 3 spatial dimensions, or a clear error."""
  if not hasattr(lhs, "shape") or not hasattr(lhs, "dtype"):
    lhs = jnp.asarray(lhs)
  if not hasattr(rhs, "shape") or not hasattr(rhs, "dtype"):
    rhs = jnp.asarray(rhs)
  if lhs.ndim != rhs.ndim:
    raise ValueError(f"lhs and rhs must have the same rank, got lhs {lhs.shape} and rhs "
                     f"{rhs.shape}")
  if not 3 <= lhs.ndim <= 5:
    raise ValueError(f"lhs must have 1 to 3 spatial dimensions (rank 3 to 5), got shape "
                     f"{lhs.shape}")
  return lhs, rhs


def conv_dimension_numbers(lhs, rhs, dimension_numbers) -> lax.ConvDimensionNumbers:
  """lax.conv_dimension_numbers, its errors raised as ValueError naming the argument."""
  try:
    return lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  except (ValueError, TypeError) as e:
    raise ValueError(f"dimension_numbers: {e}") from None


def explicit_padding(padding, nsd: int) -> list[tuple[int, int]]:
  """`padding` as one (low, high) integer pair per spatial dimension, or a clear error."""
  try:
    pads = [tuple(operator.index(v) for v in pair) for pair in padding]
  except TypeError:
    raise TypeError(f"padding must be a string or a sequence of (low, high) integer pairs, got "
                    f"{padding!r}") from None
  if len(pads) != nsd or any(len(p) != 2 for p in pads):
    raise ValueError(f"padding must have one (low, high) pair per spatial dimension ({nsd}), "
                     f"got {padding!r}")
  return pads


def _epilogue_operand(name: str, value, shape: tuple[int, ...], out_dtype: np.dtype, what: str):
  """bias / residual as an array of `shape` cast to the output dtype, or a clear error."""
  if not hasattr(value, "shape") or not hasattr(value, "dtype"):
    value = jnp.asarray(value)
  if not (jnp.issubdtype(value.dtype, jnp.floating) or jnp.issubdtype(value.dtype, jnp.integer)):
    raise TypeError(f"{name} must be a real floating (or integer) array, got dtype {value.dtype}")
  if tuple(value.shape) != tuple(shape):
    raise ValueError(f"{name} must have shape {tuple(shape)} ({what}), got {tuple(value.shape)}")
  return value.astype(out_dtype)


def conv(lhs, rhs, window_strides: Sequence[int], padding, lhs_dilation=None, rhs_dilation=None,
         dimension_numbers=None, feature_group_count: int = 1, batch_group_count: int = 1,
         precision=None, preferred_element_type=None, *, algo: ConvAlgo | str = "auto",
         bias=None, activation: str | None = None, residual=None, activation_param=None):
  """General N-D convolution with lax.conv_general_dilated's arguments, on jaxdnn kernels.

  With any of bias, residual or activation it is the fused convolution
  act(conv(lhs, rhs) + bias + residual), computed in one kernel pass: the epilogue is applied
  where the kernel stores its output, in its accumulator type, and rounded once. Its derivatives
  run the activation-derivative mask and the bias-gradient reduction in one pass, then the
  backward-data and backward-filter convolutions (jaxdnn/_src/primitives/fused.py).

  Args:
    lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
    feature_group_count, batch_group_count, precision, preferred_element_type: exactly as
      jax.lax.conv_general_dilated (1 to 3 spatial dimensions).
    algo: a jaxdnn.ConvAlgo, its lowercase name ("direct", "gemm", ...), or "auto". The family
      runs the forward convolution and, under differentiation, its backward operations. A family
      that cannot run the problem raises ValueError naming the ones that can; with an epilogue,
      "auto" picks only families that carry it.
      WINOGRAD_NONFUSED's output tile: "winograd_nonfused" lets the backend choose F(4x4,3x3)
      (F(2x2,3x3) when an output side is < 4); "winograd_nonfused_f2x2", "_f4x4" or "_f6x6" (any
      case), or jaxdnn.TiledAlgo(ConvAlgo.WINOGRAD_NONFUSED, m), forces F(m x m, 3x3) for every
      Winograd operation of the call, its gradients included (tiles past the output are
      cropped, so any output size runs; the tile is never switched). Larger tiles do fewer
      multiplications and lose accuracy: float32 relative error bounds 1e-5 for F(2x2) and
      F(4x4), 5e-5 for F(6x6) (the contraction over C/G <= 4096 channels; measured in
      jaxdnn/_src/algorithms.py's FAMILY_NOTES). "auto" never picks an explicit tile. A tile
      with another family, or a tile other than 2, 4 or 6, raises ValueError.
    bias: None or an array of shape (out_features,), added per output feature.
    residual: None or an array of the output's shape (in the output's layout), added before the
      activation (a ResNet skip connection).
    activation: None or a name from jaxdnn/_src/activations.py: identity, relu, leaky_relu,
      clipped_relu (relu6), elu, sigmoid, tanh, gelu (exact), gelu_tanh, silu (swish), ...
    activation_param: the activation's parameter (leaky_relu's negative slope, clipped_relu's
      ceiling, elu's alpha); None for its default.
    bias and residual are cast to the output dtype (the operands' dtype, or
    preferred_element_type). With all of bias, residual and activation None (or an identity
    activation alone), this is the plain convolution.

  Returns:
    The convolution, with lax's output shape and dtype.
  """
  algo = algorithms.parse_algo(algo)
  lhs, rhs = conv_operands(lhs, rhs)
  in_dtype = _check_dtype("lhs", lhs.dtype)
  rhs_dtype = _check_dtype("rhs", rhs.dtype)
  if in_dtype != rhs_dtype:
    raise TypeError(f"lhs and rhs must have the same dtype, got {in_dtype} and {rhs_dtype}")
  out_dtype = in_dtype if preferred_element_type is None else _canonical_result_dtype(
      _check_dtype("preferred_element_type", preferred_element_type))
  if out_dtype.itemsize < in_dtype.itemsize:
    raise TypeError(f"preferred_element_type must not be narrower than the operands' dtype (as "
                    f"in lax), got {out_dtype} for {in_dtype} operands")
  nsd = lhs.ndim - 2
  dnums = conv_dimension_numbers(lhs, rhs, dimension_numbers)
  window_strides = _int_tuple("window_strides", window_strides, nsd, positive=True)
  lhs_dilation = (1,) * nsd if lhs_dilation is None else _int_tuple(
      "lhs_dilation", lhs_dilation, nsd, positive=True)
  rhs_dilation = (1,) * nsd if rhs_dilation is None else _int_tuple(
      "rhs_dilation", rhs_dilation, nsd, positive=True)
  feature_group_count = _positive_int("feature_group_count", feature_group_count)
  batch_group_count = _positive_int("batch_group_count", batch_group_count)
  math_precision = _math_precision(precision)

  lhs_shape = tuple(lhs.shape[i] for i in dnums.lhs_spec)  # (N, C, spatial...)
  rhs_shape = tuple(rhs.shape[i] for i in dnums.rhs_spec)  # (O, I, spatial...)
  batch, channels, in_spatial = lhs_shape[0], lhs_shape[1], lhs_shape[2:]
  out_channels, rhs_in, filter_spatial = rhs_shape[0], rhs_shape[1], rhs_shape[2:]

  if feature_group_count > 1 and batch_group_count > 1:
    raise ValueError("at most one of feature_group_count and batch_group_count may be > 1, got "
                     f"{feature_group_count} and {batch_group_count}")
  if channels % feature_group_count:
    raise ValueError(f"feature_group_count={feature_group_count} must divide the lhs feature "
                     f"dimension ({channels})")
  if channels // feature_group_count != rhs_in:
    raise ValueError(f"lhs features ({channels}) / feature_group_count ({feature_group_count}) "
                     f"must equal the rhs input-feature dimension ({rhs_in})")
  if out_channels % feature_group_count:
    raise ValueError(f"feature_group_count={feature_group_count} must divide the rhs output "
                     f"feature dimension ({out_channels})")
  if batch % batch_group_count:
    raise ValueError(f"batch_group_count={batch_group_count} must divide the lhs batch "
                     f"dimension ({batch})")
  if out_channels % batch_group_count:
    raise ValueError(f"batch_group_count={batch_group_count} must divide the rhs output "
                     f"feature dimension ({out_channels})")

  if isinstance(padding, str):
    if padding.upper() not in _PADDING_STRINGS:
      raise ValueError(f"padding must be one of {_PADDING_STRINGS} or a sequence of (low, high) "
                       f"pairs, got {padding!r}")
    if any(d != 1 for d in lhs_dilation):
      raise ValueError("padding: string padding is not supported with lhs_dilation (as in lax);"
                       " give explicit (low, high) pairs")
    effective_filter = [(k - 1) * d + 1 for k, d in zip(filter_spatial, rhs_dilation)]
    pads = lax.padtype_to_pads(in_spatial, effective_filter, window_strides, padding.upper())
  else:
    pads = explicit_padding(padding, nsd)
  pad_lo = tuple(int(p[0]) for p in pads)
  pad_hi = tuple(int(p[1]) for p in pads)

  layout = _native_layout(dnums, lhs.ndim)
  x = _to_native(lhs, dnums.lhs_spec, layout)
  w = _filter_to_native(rhs, dnums.rhs_spec, layout)
  groups = feature_group_count
  if batch_group_count > 1:
    x = _batch_groups_into_channels(x, layout, batch_group_count)
    groups = batch_group_count
  geometry = ConvGeometry(layout=layout, in_spatial=tuple(in_spatial),
                          filter_spatial=tuple(filter_spatial), stride=window_strides,
                          rhs_dilation=rhs_dilation, lhs_dilation=lhs_dilation, pad_lo=pad_lo,
                          pad_hi=pad_hi, groups=groups)
  if activation is None:
    if activation_param is not None:
      raise ValueError(f"activation_param={activation_param!r} needs an activation")
    kind, act_param = activations.KINDS["identity"], 0.0
  else:
    kind, act_param = activations.resolve(activation, activation_param)
  if bias is None and residual is None and kind.name == "identity":
    y = conv_forward(x, w, geometry, algo, math_precision, out_dtype)
    return _from_native(y, dnums.out_spec, layout)

  if bias is not None:
    bias = _epilogue_operand("bias", bias, (out_channels,), out_dtype, "the output feature count")
  if residual is not None:
    canonical = (batch // batch_group_count, out_channels, *geometry.out_spatial)
    out_shape = [0] * lhs.ndim
    for i, axis in enumerate(dnums.out_spec):
      out_shape[axis] = canonical[i]
    residual = _epilogue_operand("residual", residual, tuple(out_shape), out_dtype,
                                 "the convolution's output shape")
    residual = _to_native(residual, dnums.out_spec, layout)
  y = conv_fused_forward(x, w, bias, residual, geometry, algo, math_precision, out_dtype,
                         kind.name, act_param)
  return _from_native(y, dnums.out_spec, layout)
