"""The pure-JAX reference path: lax.conv_general_dilated at HIGHEST precision.

It is the test oracle and the lowering used when JAXDNN_REFERENCE=1, or on a platform for which
jaxdnn has no kernels (with algo="auto" only). It is not one of jaxdnn's algorithm families.
"""

from __future__ import annotations

import os

import jax
from jax import lax

from jaxdnn._src.geometry import ConvGeometry, Layout


def reference_enabled() -> bool:
  return os.environ.get("JAXDNN_REFERENCE", "").strip().lower() in ("1", "true", "yes", "on")


def _dimension_numbers(geometry: ConvGeometry):
  spatial = "DHW"[3 - geometry.spatial_dims:]
  if geometry.layout == Layout.NHWC:
    return (f"N{spatial}C", f"{spatial}IO", f"N{spatial}C")
  return (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}")


def forward(x, w, geometry: ConvGeometry, out_dtype):
  return lax.conv_general_dilated(
      x, w, geometry.stride, tuple(zip(geometry.pad_lo, geometry.pad_hi)),
      lhs_dilation=geometry.lhs_dilation, rhs_dilation=geometry.rhs_dilation,
      dimension_numbers=_dimension_numbers(geometry), feature_group_count=geometry.groups,
      precision=lax.Precision.HIGHEST, preferred_element_type=out_dtype)


def backward_data(dy, w, geometry: ConvGeometry, out_dtype):
  batch = dy.shape[0]
  cg, _, _ = geometry.split_filter(w.shape)
  x_aval = jax.ShapeDtypeStruct(geometry.x_shape(batch, cg * geometry.groups), dy.dtype)
  (dx,) = jax.linear_transpose(lambda x: forward(x, w, geometry, dy.dtype), x_aval)(dy)
  return dx.astype(out_dtype)


def backward_filter(x, dy, geometry: ConvGeometry, out_dtype):
  _, channels, _ = geometry.split_activation(x.shape)
  _, out_channels, _ = geometry.split_activation(dy.shape)
  w_aval = jax.ShapeDtypeStruct(geometry.w_shape(channels // geometry.groups, out_channels),
                                x.dtype)
  (dw,) = jax.linear_transpose(lambda w: forward(x, w, geometry, dy.dtype), w_aval)(dy)
  return dw.astype(out_dtype)
