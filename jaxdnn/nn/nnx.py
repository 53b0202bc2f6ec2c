"""Flax NNX layers on jaxdnn kernels.

    from jaxdnn.nn import nnx as dnnx
    layer = dnnx.Conv(3, 32, (3, 3), algo="auto", activation="relu", rngs=nnx.Rngs(0))
    model = dnnx.use_jaxdnn(model)   # switch every plain flax.nnx.Conv of a model, in place

`Conv` is flax.nnx.Conv with its `conv_general_dilated` set to jaxdnn.conv. `ConvTranspose` has
flax.nnx.ConvTranspose's arguments, attributes and results, plus feature_group_count and
output_padding, computed by jaxdnn.conv_transpose. Both add `algo` and `activation` (see
jaxdnn.nn).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

try:
  from flax import nnx as _nnx
except ImportError as _e:  # pragma: no cover
  raise ImportError("jaxdnn.nn.nnx needs flax: pip install jaxdnn[examples] (or pip install flax)"
                    ) from _e

import jax.numpy as jnp
from jax import lax

from jaxdnn._src import algorithms as _algorithms
from jaxdnn._src.algorithms import ConvAlgo
from jaxdnn.nn import (JaxdnnConvFn, apply_conv_transpose, fused_conv_fn, kernel_size_tuple,
                       resolve_activation, split_activation, transpose_kernel_shape)

__all__ = ["Conv", "ConvTranspose", "use_jaxdnn"]


class Conv(_nnx.Conv):
  """flax.nnx.Conv computed by jaxdnn.conv.

  Takes flax.nnx.Conv's arguments (except conv_general_dilated, which the layer sets) plus:
    algo: the jaxdnn algorithm family (a jaxdnn.ConvAlgo, its name, or "auto").
    activation: None, a name in jaxdnn.nn.ACTIVATIONS, or a callable; applied after the bias.
  The bias and a named activation are computed inside the convolution's kernel pass
  (jaxdnn.conv's fused epilogue); a callable activation applies after the layer.
  """

  def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
               strides: int | Sequence[int] | None = 1, *, algo: ConvAlgo | str = "auto",
               activation: str | Callable | None = None, conv_general_dilated=None, **kwargs):
    if conv_general_dilated is not None:
      raise ValueError("conv_general_dilated: jaxdnn.nn.nnx.Conv always runs jaxdnn.conv; use "
                       "flax.nnx.Conv for a custom convolution function")
    resolve_activation(activation)
    super().__init__(in_features, out_features, kernel_size, strides,
                     conv_general_dilated=JaxdnnConvFn(algo), **kwargs)
    self.algo = algo
    self.activation = activation

  def __call__(self, inputs, out_sharding=None):
    name, after = split_activation(self.activation)
    if name is None and self.bias is None:
      y = super().__call__(inputs, out_sharding=out_sharding)
      return y if after is None else after(y)
    # flax.nnx.Conv.__call__ on a view of this layer whose bias addition is off and whose conv
    # function adds the bias flax promoted (captured from its promote_dtype) and the named
    # activation in the fused kernel pass. The layer itself is not modified.
    promoted = []

    def promote(args, **kwargs):
      out = self.promote_dtype(args, **kwargs)
      promoted.append(out[2])
      return out

    view = _Overlay(self, use_bias=False, promote_dtype=promote,
                    conv_general_dilated=fused_conv_fn(self.algo, name,
                                                       lambda lhs, rhs: promoted[-1]))
    y = _nnx.Conv.__call__(view, inputs, out_sharding=out_sharding)
    return y if after is None else after(y)


class _Overlay:
  """Attribute view of an object with some attributes replaced (read-only)."""

  def __init__(self, base, **overrides):
    self.__dict__.update(overrides)
    self.__dict__["_base"] = base

  def __getattr__(self, name):
    return getattr(self.__dict__["_base"], name)


class ConvTranspose(_nnx.Module):
  """flax.nnx.ConvTranspose computed by jaxdnn.conv_transpose.

  Arguments and attributes (kernel, bias as nnx.Param) are flax.nnx.ConvTranspose's, plus:
    feature_group_count: G groups. The kernel is kernel_size + (in_features // G, out_features),
      or kernel_size + (out_features // G, in_features) with transpose_kernel.
    output_padding: ints added to the high side of the output (PyTorch's output_padding); not
      with 'CIRCULAR' padding.
    algo: the jaxdnn algorithm family (a jaxdnn.ConvAlgo, its name, or "auto").
    activation: None, a name in jaxdnn.nn.ACTIVATIONS, or a callable; applied after the bias.
  The bias and a named activation are computed inside the convolution's kernel pass
  (jaxdnn.conv's fused epilogue); a callable activation applies after the layer.
  """

  def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
               strides: int | Sequence[int] | None = None, *, padding: Any = "SAME",
               kernel_dilation: int | Sequence[int] | None = None, use_bias: bool = True,
               mask: Any = None, dtype: Any = None, param_dtype: Any = jnp.float32,
               precision: Any = None,
               kernel_init: Callable = _nnx.initializers.lecun_normal(),
               bias_init: Callable = _nnx.initializers.zeros_init(),
               transpose_kernel: bool = False,
               promote_dtype: Callable = _nnx.nn.dtypes.promote_dtype,
               preferred_element_type: Any = None, feature_group_count: int = 1,
               output_padding: int | Sequence[int] | None = None,
               algo: ConvAlgo | str = "auto", activation: str | Callable | None = None,
               rngs: _nnx.Rngs,
               kernel_metadata: Mapping[str, Any] = MappingProxyType({}),
               bias_metadata: Mapping[str, Any] = MappingProxyType({})):
    _algorithms.parse_algo(algo)
    resolve_activation(activation)
    kernel_size = kernel_size_tuple(kernel_size)
    self.kernel_size = kernel_size
    self.in_features = in_features
    self.out_features = out_features
    self.strides = strides
    self.padding = padding
    self.kernel_dilation = kernel_dilation
    self.use_bias = use_bias
    self.mask = mask
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.precision = precision
    self.transpose_kernel = transpose_kernel
    self.promote_dtype = promote_dtype
    self.preferred_element_type = preferred_element_type
    self.feature_group_count = feature_group_count
    self.output_padding = output_padding
    self.algo = algo
    self.activation = activation

    self.kernel_shape = transpose_kernel_shape(kernel_size, in_features, out_features,
                                               feature_group_count, transpose_kernel)
    # The kernel's key is drawn before the bias's, as flax does (same rngs -> same parameters).
    self.kernel = _nnx.Param(kernel_init(rngs.params(), self.kernel_shape, param_dtype),
                             **kernel_metadata)
    self.bias: _nnx.Param | None
    if use_bias:
      self.bias = _nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype),
                             **bias_metadata)
    else:
      self.bias = _nnx.data(None)

  def __call__(self, inputs):
    """inputs (*batch, spatial..., in_features) -> (*batch, spatial'..., out_features)."""
    nsd = len(self.kernel_size)
    if inputs.ndim < nsd + 1 or inputs.shape[-1] != self.in_features:
      raise ValueError(f"inputs must be (*batch, {nsd} spatial dims, {self.in_features}), got "
                       f"shape {inputs.shape}")
    if self.mask is not None and self.mask.shape != self.kernel_shape:
      raise ValueError(f"mask must have the kernel's shape {self.kernel_shape}, got "
                       f"{self.mask.shape}")
    kernel = self.kernel[...]
    if self.mask is not None:
      kernel = kernel * self.mask
    bias = self.bias[...] if self.bias is not None else None
    promote = lambda x, k, b: tuple(self.promote_dtype((x, k, b), dtype=self.dtype))
    return apply_conv_transpose(
        inputs, kernel, bias, promote=promote, nsd=nsd, strides=self.strides,
        padding=self.padding, kernel_dilation=self.kernel_dilation,
        transpose_kernel=self.transpose_kernel, feature_group_count=self.feature_group_count,
        output_padding=self.output_padding, precision=self.precision,
        preferred_element_type=self.preferred_element_type, algo=self.algo,
        activation=self.activation)


def use_jaxdnn(model, algo: ConvAlgo | str = "auto"):
  """Switches every plain flax.nnx.Conv of `model` (one still on lax.conv_general_dilated) to
  jaxdnn.conv with `algo`, in place, and returns the model. Parameters are untouched."""
  conv_fn = JaxdnnConvFn(algo)
  for _, node in _nnx.iter_graph(model):
    if isinstance(node, _nnx.Conv) and node.conv_general_dilated is lax.conv_general_dilated:
      node.conv_general_dilated = conv_fn
  return model
