"""`jaxdnn.max_pool`, `avg_pool`, `global_max_pool`, `global_avg_pool` on jaxdnn kernels.

The windowed functions take flax.linen.max_pool / avg_pool's arguments (inputs, window_shape,
strides, padding, count_include_pad) and flax's semantics (lax.reduce_window with -inf or 0
padding; count_include_pad=False divides by the number of in-bounds elements), plus:

  layout           "NWC", "NHWC", "NDHWC" (channels-last, the default, as in flax) or "NCW",
                   "NCHW", "NCDHW"; its spatial rank must be len(window_shape).
  window_dilation  spacing of the window taps (lax.reduce_window's window_dilation).
  ceil_mode        PyTorch's rule: one more output per dimension when the last window would start
                   inside the input or its low padding. The extension is padding that the avg
                   divisor never counts.

As in flax, inputs may have no batch dimension or several (they are flattened).
Every invalid argument raises ValueError or TypeError here, naming the argument.
"""

from __future__ import annotations

import math
import operator

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdnn._src import algorithms
from jaxdnn._src.primitives import pooling as prims
from jaxdnn._src.primitives.pooling import PoolGeometry
from jaxdnn.conv import explicit_padding

# layout -> (spatial dimensions, channels last)
LAYOUTS = {
    "NWC": (1, True), "NCW": (1, False),
    "NHWC": (2, True), "NCHW": (2, False),
    "NDHWC": (3, True), "NCDHW": (3, False),
}
_PADDING_STRINGS = ("SAME", "VALID", "SAME_LOWER")


def _int_tuple(name: str, value, length: int | None) -> tuple[int, ...]:
  try:
    out = tuple(operator.index(v) for v in value)
  except TypeError:
    raise TypeError(f"{name} must be a sequence of integers, got {value!r}") from None
  if length is not None and len(out) != length:
    raise ValueError(f"{name} must have one entry per window dimension ({length}), got "
                     f"{value!r}")
  if any(v <= 0 for v in out):
    raise ValueError(f"{name} entries must be positive integers, got {value!r}")
  return out


def _as_array(inputs):
  if not hasattr(inputs, "shape") or not hasattr(inputs, "dtype"):
    inputs = jnp.asarray(inputs)
  dtype = np.dtype(inputs.dtype)
  if dtype not in algorithms.SUPPORTED_DTYPES:
    supported = ", ".join(str(d) for d in algorithms.SUPPORTED_DTYPES)
    raise TypeError(f"inputs has dtype {dtype}; jaxdnn pooling supports {supported}")
  return inputs


def _parse_layout(layout, nsd: int) -> bool:
  """Whether `layout` (None: channels-last) is channels-last, checked against the window rank."""
  if layout is None:
    return True
  if not isinstance(layout, str) or layout.upper() not in LAYOUTS:
    raise ValueError(f"layout must be one of {tuple(LAYOUTS)}, got {layout!r}")
  rank, channels_last = LAYOUTS[layout.upper()]
  if rank != nsd:
    raise ValueError(f"layout {layout!r} has {rank} spatial dimension(s) but window_shape has "
                     f"{nsd}")
  return channels_last


def _flatten_batch(x, nsd: int):
  """(batch..., rest) -> (prod(batch), rest), as flax pools unbatched and multi-batch inputs."""
  if x.ndim < nsd + 1:
    raise ValueError(f"inputs must have {nsd} spatial dimensions and a feature dimension (and "
                     f"batch dimensions before them), got shape {x.shape}")
  batch = x.shape[:x.ndim - nsd - 1]
  return x.reshape(math.prod(batch), *x.shape[len(batch):]), batch


def _ceil_extension(size, window, stride, lo, hi):
  """Extra high padding giving PyTorch's ceil_mode output size: ceil(span / stride) + 1 windows
  (span = padded size - window, negative when the window is longer than the padded input), less
  one when the last would start in the high padding; never fewer than floor mode's."""
  span = size + lo + hi - window
  out = -(-span // stride) + 1
  if (out - 1) * stride >= size + lo:  # the last window would start in the high padding
    out -= 1
  out = max(out, span // stride + 1 if span >= 0 else 0)
  return (out - 1) * stride + window - (size + lo + hi) if out > 0 else 0


def _geometry(x, window_shape, strides, padding, layout, window_dilation, ceil_mode,
              count_include_pad):
  window = _int_tuple("window_shape", window_shape, None)
  nsd = len(window)
  if not 1 <= nsd <= 3:
    raise ValueError(f"window_shape must have 1 to 3 entries, got {window_shape!r}")
  channels_last = _parse_layout(layout, nsd)
  stride = (1,) * nsd if strides is None else _int_tuple("strides", strides, nsd)
  dilation = (1,) * nsd if window_dilation is None else _int_tuple("window_dilation",
                                                                   window_dilation, nsd)
  spatial = x.shape[1:1 + nsd] if channels_last else x.shape[2:2 + nsd]
  effective = tuple((k - 1) * d + 1 for k, d in zip(window, dilation))
  if isinstance(padding, str):
    if padding.upper() not in _PADDING_STRINGS:
      raise ValueError(f"padding must be one of {_PADDING_STRINGS} or a sequence of (low, high) "
                       f"pairs, got {padding!r}")
    pads = lax.padtype_to_pads(spatial, effective, stride, padding.upper())
  else:
    pads = explicit_padding(padding, nsd)
  pad_lo = tuple(int(p[0]) for p in pads)
  pad_hi = tuple(int(p[1]) for p in pads)
  if not isinstance(ceil_mode, (bool, np.bool_)):
    raise TypeError(f"ceil_mode must be a bool, got {ceil_mode!r}")
  extra = (0,) * nsd
  if ceil_mode:
    extra = tuple(_ceil_extension(*args) for args in zip(spatial, effective, stride, pad_lo,
                                                         pad_hi))
  counted = bool(count_include_pad)
  return PoolGeometry(
      channels_last=channels_last, in_spatial=tuple(int(s) for s in spatial), window=window,
      stride=stride, dilation=dilation, pad_lo=pad_lo,
      pad_hi=tuple(h + e for h, e in zip(pad_hi, extra)),
      count_lo=pad_lo if counted else (0,) * nsd, count_hi=pad_hi if counted else (0,) * nsd)


def _pool(prim_fn, inputs, window_shape, strides, padding, layout, window_dilation, ceil_mode,
          count_include_pad=True):
  x = _as_array(inputs)
  try:
    nsd = len(window_shape)
  except TypeError:
    raise TypeError(f"window_shape must be a sequence of integers, got {window_shape!r}") from None
  if not 1 <= nsd <= 3:
    raise ValueError(f"window_shape must have 1 to 3 entries, got {window_shape!r}")
  x, batch = _flatten_batch(x, nsd)
  g = _geometry(x, window_shape, strides, padding, layout, window_dilation, ceil_mode,
                count_include_pad)
  y = prim_fn(x, g)
  return y.reshape(*batch, *y.shape[1:])


def max_pool(inputs, window_shape, strides=None, padding="VALID", *, layout=None,
             window_dilation=None, ceil_mode=False):
  """Max pooling with flax.linen.max_pool's arguments (padding is -inf, as in lax).

  Args:
    inputs: (batch..., spatial..., features) or, with a channels-first layout,
      (batch..., features, spatial...); float16, bfloat16, float32 or float64.
    window_shape, strides, padding: as flax.linen.max_pool ("SAME", "VALID" or (low, high)
      pairs).
    layout, window_dilation, ceil_mode: see the module docstring.
  """
  return _pool(prims.max_pool, inputs, window_shape, strides, padding, layout, window_dilation,
               ceil_mode)


def avg_pool(inputs, window_shape, strides=None, padding="VALID", count_include_pad=True, *,
             layout=None, window_dilation=None, ceil_mode=False):
  """Average pooling with flax.linen.avg_pool's arguments.

  count_include_pad=True divides by the number of window taps inside the padded input (the full
  window size without ceil_mode), False by the number of in-bounds taps (NaN for a window with
  none, as flax's 0/0).
  """
  return _pool(prims.avg_pool, inputs, window_shape, strides, padding, layout, window_dilation,
               ceil_mode, count_include_pad)


def _global(prim_fn, inputs, layout, keepdims):
  x = _as_array(inputs)
  if layout is None:
    nsd = x.ndim - 2
    if not 1 <= nsd <= 3:
      raise ValueError(f"inputs must have rank 3 to 5 (batch, spatial..., features), got shape "
                       f"{x.shape}")
    channels_last = True
  else:
    if not isinstance(layout, str) or layout.upper() not in LAYOUTS:
      raise ValueError(f"layout must be one of {tuple(LAYOUTS)}, got {layout!r}")
    nsd, channels_last = LAYOUTS[layout.upper()]
    if x.ndim != nsd + 2:
      raise ValueError(f"inputs must have rank {nsd + 2} for layout {layout!r}, got shape "
                       f"{x.shape}")
  spatial = x.shape[1:1 + nsd] if channels_last else x.shape[2:]
  if 0 in spatial:
    raise ValueError(f"global pooling needs non-empty spatial dimensions, got shape {x.shape}")
  zeros = (0,) * nsd
  ones = (1,) * nsd
  g = PoolGeometry(channels_last=channels_last, in_spatial=tuple(spatial), window=tuple(spatial),
                   stride=ones, dilation=ones, pad_lo=zeros, pad_hi=zeros, count_lo=zeros,
                   count_hi=zeros)
  y = prim_fn(x, g)
  return y if keepdims else y.reshape(y.shape[0], y.shape[-1] if channels_last else y.shape[1])


def global_max_pool(inputs, *, layout=None, keepdims=False):
  """Max over all spatial positions: (N, C), or (N, 1.., C) / (N, C, 1..) with keepdims.

  layout defaults to channels-last with inputs.ndim - 2 spatial dimensions.
  """
  return _global(prims.max_pool, inputs, layout, keepdims)


def global_avg_pool(inputs, *, layout=None, keepdims=False):
  """Mean over all spatial positions: (N, C), or (N, 1.., C) / (N, C, 1..) with keepdims."""
  return _global(prims.avg_pool, inputs, layout, keepdims)
