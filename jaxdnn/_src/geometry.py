"""Convolution geometry: the hashable description every jaxdnn conv primitive carries.

A geometry fixes everything but the batch size and the channel counts, which come from the
operands. That makes one geometry serve all three operations of a convolution (forward,
backward-data, backward-filter) and survive batching rules, which fold vmapped axes into the batch
or channel dimensions.

Native layouts (the only ones the kernels see):
  NHWC: x (N, *spatial, C)   w (*spatial, C/G, K)   [HWIO]   y (N, *spatial, K)
  NCHW: x (N, C, *spatial)   w (K, C/G, *spatial)   [OIHW]   y (N, K, *spatial)
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np


class Layout(enum.IntEnum):
  """Native data layouts; values match jaxdnn::Layout in C++."""

  NHWC = 0
  NCHW = 1


class ConvOp(enum.IntEnum):
  """The three operations; values match jaxdnn::ConvOp in C++."""

  FORWARD = 0
  BACKWARD_DATA = 1
  BACKWARD_FILTER = 2


def conv_output_size(in_size, filt, stride, dilation, lhs_dilation, pad_lo, pad_hi):
  """Output extent along one axis, as lax computes it (clamped at 0). An empty input still has
  outputs where its padding spans a whole window (lax: an empty axis dilates to 0 elements):
  they are sums over no taps."""
  if filt <= 0:
    return 0
  virtual_in = (lhs_dilation * (in_size - 1) + 1 if in_size > 0 else 0) + pad_lo + pad_hi
  window = dilation * (filt - 1) + 1
  if virtual_in < window:
    return 0
  return (virtual_in - window) // stride + 1


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
  """Spatial geometry, grouping and layout of one convolution.

  Per spatial axis (virtual input = lhs-dilated, then padded input; padding may be negative):
    y[o] = sum_f w[f] * x_virtual[o * stride + f * rhs_dilation - pad_lo]
  """

  layout: Layout
  in_spatial: tuple[int, ...]
  filter_spatial: tuple[int, ...]
  stride: tuple[int, ...]
  rhs_dilation: tuple[int, ...]
  lhs_dilation: tuple[int, ...]
  pad_lo: tuple[int, ...]
  pad_hi: tuple[int, ...]
  groups: int = 1

  @property
  def spatial_dims(self) -> int:
    return len(self.in_spatial)

  @property
  def out_spatial(self) -> tuple[int, ...]:
    return tuple(
        conv_output_size(*args)
        for args in zip(self.in_spatial, self.filter_spatial, self.stride, self.rhs_dilation,
                        self.lhs_dilation, self.pad_lo, self.pad_hi))

  # ---- shapes in the native layout ----
  def activation_shape(self, batch: int, channels: int, spatial) -> tuple[int, ...]:
    if self.layout == Layout.NHWC:
      return (batch, *spatial, channels)
    return (batch, channels, *spatial)

  def x_shape(self, batch: int, channels: int) -> tuple[int, ...]:
    return self.activation_shape(batch, channels, self.in_spatial)

  def y_shape(self, batch: int, out_channels: int) -> tuple[int, ...]:
    return self.activation_shape(batch, out_channels, self.out_spatial)

  def w_shape(self, in_channels_per_group: int, out_channels: int) -> tuple[int, ...]:
    if self.layout == Layout.NHWC:
      return (*self.filter_spatial, in_channels_per_group, out_channels)
    return (out_channels, in_channels_per_group, *self.filter_spatial)

  # ---- axis positions in the native layout ----
  @property
  def channel_axis(self) -> int:
    """Channel axis of an activation (x, y, dx, dy)."""
    return self.spatial_dims + 1 if self.layout == Layout.NHWC else 1

  @property
  def filter_in_axis(self) -> int:
    return self.spatial_dims if self.layout == Layout.NHWC else 1

  @property
  def filter_out_axis(self) -> int:
    return self.spatial_dims + 1 if self.layout == Layout.NHWC else 0

  def split_activation(self, shape) -> tuple[int, int, tuple[int, ...]]:
    """(batch, channels, spatial) of an activation shape."""
    if self.layout == Layout.NHWC:
      return shape[0], shape[-1], tuple(shape[1:-1])
    return shape[0], shape[1], tuple(shape[2:])

  def split_filter(self, shape) -> tuple[int, int, tuple[int, ...]]:
    """(in channels per group, out channels, spatial) of a filter shape."""
    if self.layout == Layout.NHWC:
      return shape[-2], shape[-1], tuple(shape[:-2])
    return shape[1], shape[0], tuple(shape[2:])

  def replace(self, **changes) -> ConvGeometry:
    return dataclasses.replace(self, **changes)

  # ---- what the C++ side reads ----
  def problem_dict(self, batch: int, channels: int, out_channels: int) -> dict:
    """The problem descriptor for the extensions' trace-time queries (nb_problem.h)."""
    pad3 = lambda t, fill: (fill,) * (3 - len(t)) + tuple(int(v) for v in t)
    return dict(
        layout=int(self.layout), spatial_dims=self.spatial_dims, N=int(batch),
        C=int(channels), K=int(out_channels), G=int(self.groups),
        **{"in": pad3(self.in_spatial, 1)},
        filt=pad3(self.filter_spatial, 1), stride=pad3(self.stride, 1),
        dilation=pad3(self.rhs_dilation, 1), lhs_dilation=pad3(self.lhs_dilation, 1),
        pad_lo=pad3(self.pad_lo, 0), pad_hi=pad3(self.pad_hi, 0))

  def ffi_attributes(self) -> dict:
    """Geometry attributes of the FFI call (ffi_conv.h)."""
    arr = lambda t: np.asarray(t, dtype=np.int64)
    return dict(
        layout=np.int32(self.layout), groups=np.int64(self.groups),
        in_spatial=arr(self.in_spatial), filter_spatial=arr(self.filter_spatial),
        stride=arr(self.stride), rhs_dilation=arr(self.rhs_dilation),
        lhs_dilation=arr(self.lhs_dilation), pad_lo=arr(self.pad_lo), pad_hi=arr(self.pad_hi))

  # ---- a transposed convolution as the backward-data of a strided one ----
  def lhs_dilation_as_stride(self) -> ConvGeometry | None:
    """The strided geometry Q whose backward-data is this lhs-dilated forward, or None.

    With window strides 1 and lhs_dilation s (a transposed convolution), per axis
      y[i] = sum_f w[f] x[o]  over  o*s = i + f*d - pad_lo,
    and with the taps flipped (f' = F-1-f) that is i = o*s + f'*d - ((F-1)*d - pad_lo): the
    backward-data of a convolution of stride s, rhs dilation d and padding (F-1)*d - pad on each
    side (negative where pad exceeds the dilated filter), applied to x with the flipped,
    channel-swapped filter (flip_swap_filter). Its output extent is exactly this input's. So
    F_P(x, w) = D_Q(x, w'), D_P(dy, w) = F_Q(dy, w') and W_P(x, dy) = flip_swap(W_Q(dy, x)) (the
    trilinear form, design.md section 2). None where the identity does not apply: unit
    lhs_dilation, a window stride > 1, or an empty axis.
    """
    if all(v == 1 for v in self.lhs_dilation) or any(v != 1 for v in self.stride):
      return None
    out = self.out_spatial
    if min(self.in_spatial) <= 0 or min(out) <= 0:
      return None
    reach = tuple((f - 1) * d for f, d in zip(self.filter_spatial, self.rhs_dilation))
    q = self.replace(in_spatial=out, stride=self.lhs_dilation,
                     lhs_dilation=(1,) * self.spatial_dims,
                     pad_lo=tuple(r - p for r, p in zip(reach, self.pad_lo)),
                     pad_hi=tuple(r - p for r, p in zip(reach, self.pad_hi)))
    assert q.out_spatial == tuple(self.in_spatial), (self, q)
    return q

  def flops(self, batch: int, channels: int, out_channels: int) -> int:
    """2 * multiply-adds of the forward convolution (the same for all three operations)."""
    return (2 * batch * int(np.prod(self.out_spatial)) * out_channels *
            (channels // self.groups) * int(np.prod(self.filter_spatial)))
