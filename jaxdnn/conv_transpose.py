"""`jaxdnn.conv_transpose`: jax.lax.conv_transpose on jaxdnn kernels, with groups and output_padding.

A transposed convolution with strides s is one stride-1 convolution of the s-dilated input
(lhs_dilation = s), so this is a single `jaxdnn.conv` call; only the padding and, with
transpose_kernel, the kernel are rewritten first.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp

from jaxdnn._src.algorithms import ConvAlgo
from jaxdnn.conv import (_int_tuple, _positive_int, conv, conv_dimension_numbers,
                         conv_operands, explicit_padding)

# lax.conv_transpose's defaults (the TensorFlow convention), by rank.
_DEFAULT_DIMENSION_NUMBERS = {
    3: ("NHC", "HIO", "NHC"),
    4: ("NHWC", "HWIO", "NHWC"),
    5: ("NHWDC", "HWDIO", "NHWDC"),
}


def transpose_padding(k: int, s: int, padding: str) -> tuple[int, int]:
  """(low, high) padding of the s-dilated input for a 'SAME' or 'VALID' transposed convolution.

  k is the dilated kernel extent. The output has n*s ('SAME') or n*s + max(k - s, 0) ('VALID')
  elements for n inputs, as in lax.conv_transpose (and Keras' Conv2DTranspose).
  """
  if padding == "SAME":
    total = k + s - 2
    low = k - 1 if s > k - 1 else -(-total // 2)
  else:  # VALID
    total = k + s - 2 + max(k - s, 0)
    low = k - 1
  return low, total - low


def transpose_kernel_groups(rhs, rhs_spec: Sequence[int], groups: int):
  """The forward convolution's kernel -> the kernel of its transpose, for `groups` groups.

  rhs_spec = (out axis, in axis, spatial axes...). The forward kernel maps features/G -> C (its
  "out" axis has size C, the transposed convolution's input features); the result maps
  C/G -> features, with
      result[out = g*F/G + f, in = c, s] = rhs[out = g*C/G + c, in = f, flip(s)].
  With one group this is lax's flip-and-swap.
  """
  out_ax, in_ax, spatial = rhs_spec[0], rhs_spec[1], tuple(rhs_spec[2:])
  w = jnp.flip(rhs, axis=spatial)
  w = jnp.moveaxis(w, (out_ax, in_ax), (-2, -1))  # (spatial..., C, F/G)
  *rest, c, fg = w.shape
  w = w.reshape(*rest, groups, c // groups, fg)
  w = jnp.swapaxes(w, -3, -2).reshape(*rest, c // groups, groups * fg)  # (spatial..., C/G, F)
  return jnp.moveaxis(w, (-2, -1), (in_ax, out_ax))


def conv_transpose(lhs, rhs, strides: Sequence[int], padding, rhs_dilation=None,
                   dimension_numbers=None, transpose_kernel: bool = False, precision=None,
                   preferred_element_type=None, *, feature_group_count: int = 1,
                   output_padding=None, algo: ConvAlgo | str = "auto"):
  """Transposed (fractionally strided) N-D convolution, as jax.lax.conv_transpose.

  Args:
    lhs, rhs, strides, rhs_dilation, dimension_numbers, precision, preferred_element_type: as
      jax.lax.conv_transpose (dimension_numbers defaults to NHC/HIO, NHWC/HWIO or
      NHWDC/HWDIO by rank).
    padding: 'SAME' or 'VALID' (the forward convolution's padding: n inputs give n*s resp.
      n*s + max(k - s, 0) outputs, k the dilated kernel extent), or one (low, high) pair per
      spatial dimension, used as the padding of the s-dilated input.
    transpose_kernel: rhs is the forward convolution's kernel (its in/out axes hold
      features/G and lhs features): flip its spatial axes and swap its feature axes, per group.
    feature_group_count: G, the number of groups. Without transpose_kernel, rhs's input-feature
      axis has lhs_features/G entries.
    output_padding: non-negative ints, one per spatial dimension (or one for all), added to the
      high-side padding (PyTorch's output_padding).
    algo: as in jaxdnn.conv.

  Returns:
    The transposed convolution, computed as one jaxdnn.conv with window_strides 1 and
    lhs_dilation = strides.
  """
  lhs, rhs = conv_operands(lhs, rhs)
  nsd = lhs.ndim - 2
  if dimension_numbers is None:
    dimension_numbers = _DEFAULT_DIMENSION_NUMBERS[lhs.ndim]
  dnums = conv_dimension_numbers(lhs, rhs, dimension_numbers)

  strides = _int_tuple("strides", strides, nsd, positive=True)
  rhs_dilation = (1,) * nsd if rhs_dilation is None else _int_tuple(
      "rhs_dilation", rhs_dilation, nsd, positive=True)
  groups = _positive_int("feature_group_count", feature_group_count)
  if output_padding is None:
    output_padding = (0,) * nsd
  elif isinstance(output_padding, int):
    output_padding = (output_padding,) * nsd
  output_padding = _int_tuple("output_padding", output_padding, nsd, positive=False)
  if any(p < 0 for p in output_padding):
    raise ValueError(f"output_padding entries must be non-negative, got {output_padding!r}")

  kernel = tuple(rhs.shape[i] for i in dnums.rhs_spec[2:])
  dilated_kernel = tuple((k - 1) * d + 1 for k, d in zip(kernel, rhs_dilation))
  if isinstance(padding, str):
    mode = padding.upper()
    if mode not in ("SAME", "VALID"):
      raise ValueError(f"padding must be 'SAME', 'VALID' or a sequence of (low, high) pairs, got "
                       f"{padding!r}")
    pads = [transpose_padding(k, s, mode) for k, s in zip(dilated_kernel, strides)]
  else:
    pads = explicit_padding(padding, nsd)
  pads = [(lo, hi + extra) for (lo, hi), extra in zip(pads, output_padding)]

  if transpose_kernel:
    in_features = lhs.shape[dnums.lhs_spec[1]]
    rhs_out = rhs.shape[dnums.rhs_spec[0]]
    if rhs_out != in_features:
      raise ValueError(f"transpose_kernel: rhs is the forward convolution's kernel, so its output-"
                       f"feature dimension ({rhs_out}) must equal the lhs features "
                       f"({in_features})")
    if in_features % groups:
      raise ValueError(f"feature_group_count={groups} must divide the lhs feature dimension "
                       f"({in_features})")
    rhs = transpose_kernel_groups(rhs, dnums.rhs_spec, groups)

  return conv(lhs, rhs, (1,) * nsd, pads, lhs_dilation=strides, rhs_dilation=rhs_dilation,
              dimension_numbers=dnums, feature_group_count=groups, precision=precision,
              preferred_element_type=preferred_element_type, algo=algo)
