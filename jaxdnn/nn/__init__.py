"""Flax Linen layers on jaxdnn kernels (Flax NNX layers are in `jaxdnn.nn.nnx`).

    import jaxdnn.nn as dnn
    layer = dnn.Conv(features=32, kernel_size=(3, 3), algo="auto", activation="relu")
    up = dnn.ConvTranspose(features=16, kernel_size=(4, 4), strides=(2, 2))

`Conv` is flax.linen.Conv with its convolution routed to `jaxdnn.conv`: padding modes, batch
flattening, mask, dtype promotion and the parameter tree are flax's own. `ConvTranspose` has
flax.linen.ConvTranspose's fields, parameters and results (CIRCULAR padding included), plus
`feature_group_count` and `output_padding`, computed by `jaxdnn.conv_transpose`. Both add `algo`
(as in jaxdnn.conv) and `activation` (a name in ACTIVATIONS or a callable, applied after the bias).

An existing Linen model switches to jaxdnn without being rewritten:

    with jaxdnn.nn.intercept_convs(algo="auto"):
      y = model.apply(params, x)     # every plain flax.linen.Conv runs jaxdnn.conv

`intercept_convs` uses flax.linen.intercept_methods, so it applies while the model is traced:
call (or first jit-trace) the apply inside the `with`. It switches flax.linen.Conv only;
flax.linen.ConvTranspose calls lax.conv_transpose with no hook, so use jaxdnn.nn.ConvTranspose.

flax is an optional dependency of jaxdnn: `import jaxdnn` never imports it; this module needs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

try:
  import flax.linen as _linen
  from flax.linen import dtypes as _linen_dtypes
except ImportError as _e:  # pragma: no cover
  raise ImportError("jaxdnn.nn needs flax: pip install jaxdnn[examples] (or pip install flax)"
                    ) from _e

import jax
import jax.numpy as jnp

from jaxdnn._src import algorithms as _algorithms
from jaxdnn._src.algorithms import ConvAlgo
from jaxdnn.conv import conv as _conv
from jaxdnn.conv_transpose import conv_transpose as _conv_transpose
from jaxdnn.pooling import avg_pool as _avg_pool
from jaxdnn.pooling import max_pool as _max_pool

__all__ = [
    "ACTIVATIONS",
    "AvgPool",
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "intercept_convs",
]


# ---------------------------------------------------------------------------------------------
# Activations and the conv function handed to flax.

def _identity(x):
  return x


_gelu_exact = functools.partial(jax.nn.gelu, approximate=False)
_gelu_tanh = functools.partial(jax.nn.gelu, approximate=True)

_ACTIVATION_FNS: dict[str, Callable] = {
    "relu": jax.nn.relu,
    "leaky_relu": jax.nn.leaky_relu,
    "relu6": jax.nn.relu6,
    "clipped_relu": jax.nn.relu6,
    "elu": jax.nn.elu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "gelu": _gelu_exact,
    "gelu_tanh": _gelu_tanh,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "identity": _identity,
}
ACTIVATIONS = tuple(_ACTIVATION_FNS)


def resolve_activation(activation) -> Callable | None:
  """None, a name in ACTIVATIONS (case-insensitive) or a callable -> the callable (or None)."""
  if activation is None or callable(activation):
    return activation
  if isinstance(activation, str):
    fn = _ACTIVATION_FNS.get(activation.strip().lower())
    if fn is not None:
      return fn
  raise ValueError(f"activation must be None, a callable or one of {', '.join(ACTIVATIONS)}; "
                   f"got {activation!r}")


def _activate(activation, y):
  fn = resolve_activation(activation)
  return y if fn is None else fn(y)


def fusable_activation(activation) -> str | None:
  """The jaxdnn.conv activation name of a named activation (fused into the convolution's kernel
  pass), or None for no activation, "identity" and callables (which apply after the layer)."""
  if not isinstance(activation, str):
    return None
  name = activation.strip().lower()
  return None if name == "identity" else name


def split_activation(activation) -> tuple[str | None, Callable | None]:
  """(name fused into the convolution, callable applied after it) of a layer's `activation`."""
  name = fusable_activation(activation)
  if name is not None:
    return name, None
  fn = resolve_activation(activation)
  return None, None if fn is _identity else fn


@dataclasses.dataclass(frozen=True)
class JaxdnnConvFn:
  """lax.conv_general_dilated's signature on jaxdnn.conv with a fixed algo.

  Hashable and compared by value, so it can sit in a Linen field or an NNX static attribute.
  Accepts NNX's `out_sharding` keyword; only None is supported.
  """

  algo: ConvAlgo | str = "auto"

  def __post_init__(self):
    object.__setattr__(self, "algo", _algorithms.parse_algo(self.algo))

  def __call__(self, lhs, rhs, window_strides, padding, *args, out_sharding=None, **kwargs):
    if out_sharding is not None:
      raise NotImplementedError("out_sharding: jaxdnn convolutions do not take an output "
                                f"sharding yet, got {out_sharding!r}")
    return _conv(lhs, rhs, window_strides, padding, *args, algo=self.algo, **kwargs)


def fused_conv_fn(algo, activation: str | None, get_bias: Callable):
  """A conv function for flax's Conv.__call__ that also adds the bias (get_bias(lhs, rhs), or
  None) and applies the named activation in jaxdnn's fused kernel pass. Used for one call, with
  flax's own bias addition switched off."""
  conv_fn = JaxdnnConvFn(algo)

  def call(lhs, rhs, window_strides, padding, *args, **kwargs):
    return conv_fn(lhs, rhs, window_strides, padding, *args, bias=get_bias(lhs, rhs),
                   activation=activation, **kwargs)
  return call


# ---------------------------------------------------------------------------------------------
# Linen Conv.

class Conv(_linen.Conv):
  """flax.linen.Conv computed by jaxdnn.conv.

  All of flax.linen.Conv's fields and behaviour, plus:
    algo: the jaxdnn algorithm family (a jaxdnn.ConvAlgo, its name, or "auto").
    activation: None, a name in jaxdnn.nn.ACTIVATIONS, or a callable; applied after the bias.
  The bias and a named activation are computed inside the convolution's kernel pass
  (jaxdnn.conv's fused epilogue); a callable activation applies after the layer. Parameters
  (created in flax's order, so the same keys give the same values) and results are flax's.
  `conv_general_dilated` (and `conv_general_dilated_cls`) are set by the module, not the user.
  """

  algo: str | ConvAlgo = "auto"
  activation: str | Callable | None = None

  def __post_init__(self):
    fn = self.conv_general_dilated
    if self.conv_general_dilated_cls is not None or (
        fn is not None and not isinstance(fn, JaxdnnConvFn)):
      raise ValueError("conv_general_dilated: jaxdnn.nn.Conv always runs jaxdnn.conv; use "
                       "flax.linen.Conv for a custom convolution function")
    resolve_activation(self.activation)
    # A clone arrives with the previous JaxdnnConvFn: rebuild it, as `algo` may have changed.
    object.__setattr__(self, "conv_general_dilated", JaxdnnConvFn(self.algo))
    super().__post_init__()

  @_linen.compact
  def __call__(self, inputs):
    name, after = split_activation(self.activation)
    if name is None and not self.use_bias:
      y = super().__call__(inputs)
      return y if after is None else after(y)

    # flax.linen.Conv.__call__ runs with its bias addition off and a conv function that creates
    # the bias parameter (after the kernel, where flax creates it) and fuses it. Linen modules
    # are frozen dataclasses: the two fields are set for this call only (as intercept_convs).
    def get_bias(lhs, rhs):
      if not use_bias:
        return None
      bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
      return self.promote_dtype(lhs, rhs, bias, dtype=self.dtype)[2]

    use_bias, conv_fn = self.use_bias, self.conv_general_dilated
    object.__setattr__(self, "use_bias", False)
    object.__setattr__(self, "conv_general_dilated", fused_conv_fn(self.algo, name, get_bias))
    try:
      y = super().__call__(inputs)
    finally:
      object.__setattr__(self, "use_bias", use_bias)
      object.__setattr__(self, "conv_general_dilated", conv_fn)
    return y if after is None else after(y)


# ---------------------------------------------------------------------------------------------
# Transposed convolution, shared by the Linen and the NNX module.

def _as_tuple(name: str, value, n: int) -> tuple[int, ...]:
  """None -> ones; an int -> n copies; else a sequence of n ints (flax's broadcasting rule)."""
  if value is None:
    value = 1
  if isinstance(value, int):
    return (value,) * n
  out = tuple(value)
  if len(out) != n:
    raise ValueError(f"{name} must be an int or have one entry per spatial dimension ({n}), got "
                     f"{value!r}")
  return out


def kernel_size_tuple(kernel_size) -> tuple[int, ...]:
  ks = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
  if not 1 <= len(ks) <= 3:
    raise ValueError(f"kernel_size must have 1 to 3 entries, got {kernel_size!r}")
  try:
    ks = tuple(operator.index(k) for k in ks)
  except TypeError:
    raise TypeError(f"kernel_size must be an int or a sequence of ints, got {kernel_size!r}"
                    ) from None
  if any(k <= 0 for k in ks):
    raise ValueError(f"kernel_size entries must be positive, got {kernel_size!r}")
  return ks


def transpose_padding(padding, n: int):
  """'SAME' / 'VALID' / 'CIRCULAR' (upper-cased), or (low, high) pairs from ints or pairs."""
  if isinstance(padding, str):
    mode = padding.upper()
    if mode not in ("SAME", "VALID", "CIRCULAR"):
      raise ValueError(f"padding must be 'SAME', 'VALID', 'CIRCULAR', an int or a sequence of "
                       f"ints or (low, high) pairs; got {padding!r}")
    return mode
  if isinstance(padding, int):
    return [(padding, padding)] * n
  try:
    pairs = [(p, p) if isinstance(p, int) else tuple(p) for p in padding]
  except TypeError:
    raise TypeError(f"padding must be a string, an int or a sequence; got {padding!r}") from None
  if len(pairs) != n or any(len(p) != 2 for p in pairs):
    raise ValueError(f"padding must have one int or (low, high) pair per spatial dimension ({n}),"
                     f" got {padding!r}")
  return pairs


def transpose_kernel_shape(kernel_size, in_features: int, features: int, groups: int,
                           transpose_kernel: bool) -> tuple[int, ...]:
  """flax's kernel shape, with the first channel axis divided by the group count."""
  if not isinstance(groups, int) or groups <= 0:
    raise ValueError(f"feature_group_count must be a positive integer, got {groups!r}")
  if not isinstance(features, int) or features <= 0:
    raise ValueError(f"features must be a positive integer, got {features!r}")
  if in_features % groups or features % groups:
    raise ValueError(f"feature_group_count={groups} must divide the input features "
                     f"({in_features}) and the output features ({features})")
  if transpose_kernel:
    return kernel_size + (features // groups, in_features)
  return kernel_size + (in_features // groups, features)


def _wrap_periodic(y, axis: int, period: int, offset: int):
  """z[m] = sum of y[j] over the j with (j + offset) % period == m (length `period`)."""
  lo = offset % period
  hi = -(lo + y.shape[axis]) % period
  widths = [(0, 0)] * y.ndim
  widths[axis] = (lo, hi)
  y = jnp.pad(y, widths)
  return y.reshape(y.shape[:axis] + (-1, period) + y.shape[axis + 1:]).sum(axis)


def circular_wrap(y, in_spatial, strides, transpose_kernel: bool):
  """Folds a VALID transposed convolution y (N, spatial..., C) onto periods in_spatial * strides.

  The fold is centred: with d = (period - len) mod 2*period, a shift of ceil(d/2) (or floor(d/2)
  with transpose_kernel, which mirrors a forward Conv with CIRCULAR padding) puts the input's
  origin on a multiple of the period. This is flax.linen.ConvTranspose's convention.
  """
  for i, (n, s) in enumerate(zip(in_spatial, strides)):
    period = n * s
    diff = (period - y.shape[i + 1]) % (2 * period)
    shift = diff // 2 if transpose_kernel else (diff + 1) // 2
    y = _wrap_periodic(y, i + 1, period, shift)
  return y


def apply_conv_transpose(inputs, kernel, bias, *, promote, nsd, strides, padding,
                         kernel_dilation, transpose_kernel, feature_group_count, output_padding,
                         precision, preferred_element_type, algo, activation):
  """The body of ConvTranspose.__call__ after the parameters exist (Linen and NNX).

  inputs: (*batch, spatial..., C); kernel already masked; promote(inputs, kernel, bias) casts.
  """
  batch_shape = inputs.shape[:inputs.ndim - nsd - 1]
  inputs = inputs.reshape((-1,) + inputs.shape[len(batch_shape):])
  strides = _as_tuple("strides", strides, nsd)
  kernel_dilation = _as_tuple("kernel_dilation", kernel_dilation, nsd)
  pads = transpose_padding(padding, nsd)
  if pads == "CIRCULAR" and output_padding is not None and any(
      _as_tuple("output_padding", output_padding, nsd)):
    raise ValueError("output_padding is not supported with padding='CIRCULAR' (its output size "
                     "is input size * strides)")
  inputs, kernel, bias = promote(inputs, kernel, bias)
  y = _conv_transpose(inputs, kernel, strides, "VALID" if pads == "CIRCULAR" else pads,
                      rhs_dilation=kernel_dilation, transpose_kernel=transpose_kernel,
                      precision=precision, preferred_element_type=preferred_element_type,
                      feature_group_count=feature_group_count, output_padding=output_padding,
                      algo=algo)
  if pads == "CIRCULAR":
    y = circular_wrap(y, inputs.shape[1:-1], strides, transpose_kernel)
  if bias is not None:
    y = y + bias.reshape((1,) * (y.ndim - 1) + (-1,))
  y = _activate(activation, y)
  return y.reshape(batch_shape + y.shape[1:])


class ConvTranspose(_linen.Module):
  """flax.linen.ConvTranspose computed by jaxdnn.conv_transpose.

  Fields, parameters ('kernel', 'bias') and results are flax.linen.ConvTranspose's, plus:
    feature_group_count: G groups. The kernel is kernel_size + (in_features // G, features), or
      kernel_size + (features // G, in_features) with transpose_kernel (the kernel of the
      forward convolution this one transposes).
    output_padding: ints added to the high side of the output (PyTorch's output_padding); not
      with 'CIRCULAR' padding.
    algo: the jaxdnn algorithm family (a jaxdnn.ConvAlgo, its name, or "auto").
    activation: None, a name in jaxdnn.nn.ACTIVATIONS, or a callable; applied after the bias.
  """

  features: int
  kernel_size: int | Sequence[int]
  strides: int | Sequence[int] | None = None
  padding: Any = "SAME"
  kernel_dilation: int | Sequence[int] | None = None
  use_bias: bool = True
  mask: Any = None
  dtype: Any = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Callable = _linen.initializers.lecun_normal()
  bias_init: Callable = _linen.initializers.zeros_init()
  transpose_kernel: bool = False
  promote_dtype: Callable = _linen_dtypes.promote_dtype
  preferred_element_type: Any = None
  feature_group_count: int = 1
  output_padding: int | Sequence[int] | None = None
  algo: str | ConvAlgo = "auto"
  activation: str | Callable | None = None

  def __post_init__(self):
    _algorithms.parse_algo(self.algo)
    resolve_activation(self.activation)
    super().__post_init__()

  @_linen.compact
  def __call__(self, inputs):
    """inputs (*batch, spatial..., features) -> (*batch, spatial'..., self.features)."""
    kernel_size = kernel_size_tuple(self.kernel_size)
    nsd = len(kernel_size)
    if inputs.ndim < nsd + 1:
      raise ValueError(f"inputs must have rank >= {nsd + 1} for a {nsd}-D kernel, got shape "
                       f"{inputs.shape}")
    kernel_shape = transpose_kernel_shape(kernel_size, inputs.shape[-1], self.features,
                                          self.feature_group_count, self.transpose_kernel)
    if self.mask is not None and self.mask.shape != kernel_shape:
      raise ValueError(f"mask must have the kernel's shape {kernel_shape}, got "
                       f"{self.mask.shape}")
    kernel = self.param("kernel", self.kernel_init, kernel_shape, self.param_dtype)
    if self.mask is not None:
      kernel = kernel * self.mask
    bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            if self.use_bias else None)
    promote = lambda x, k, b: tuple(self.promote_dtype(x, k, b, dtype=self.dtype))
    return apply_conv_transpose(
        inputs, kernel, bias, promote=promote, nsd=nsd, strides=self.strides,
        padding=self.padding, kernel_dilation=self.kernel_dilation,
        transpose_kernel=self.transpose_kernel, feature_group_count=self.feature_group_count,
        output_padding=self.output_padding, precision=self.precision,
        preferred_element_type=self.preferred_element_type, algo=self.algo,
        activation=self.activation)


# ---------------------------------------------------------------------------------------------
# Pooling.

class MaxPool(_linen.Module):
  """flax.linen.max_pool as a module, computed by jaxdnn.max_pool (flax's arguments, results and
  dtypes)."""

  window_shape: Sequence[int]
  strides: Sequence[int] | None = None
  padding: str | Sequence[tuple[int, int]] = "VALID"

  def __call__(self, inputs):
    return _max_pool(inputs, tuple(self.window_shape), strides=self.strides,
                     padding=self.padding)


class AvgPool(_linen.Module):
  """flax.linen.avg_pool as a module, computed by jaxdnn.avg_pool (count_include_pad: divide by
  the full window size, else by the in-bounds taps).

  The results have flax's dtype: with count_include_pad=False flax divides by a count in the
  default float dtype, which promotes narrower inputs, and the result is cast the same way.
  Values are flax's up to rounding: XLA turns flax's division by a constant count into a
  multiplication by its reciprocal where jaxdnn divides, and jaxdnn sums 16-bit inputs in float32
  where flax adds in the input dtype.
  """

  window_shape: Sequence[int]
  strides: Sequence[int] | None = None
  padding: str | Sequence[tuple[int, int]] = "VALID"
  count_include_pad: bool = True

  def __call__(self, inputs):
    y = _avg_pool(inputs, tuple(self.window_shape), strides=self.strides, padding=self.padding,
                  count_include_pad=self.count_include_pad)
    if not self.count_include_pad:
      y = y.astype(jnp.promote_types(y.dtype, jnp.result_type(float)))
    return y


# ---------------------------------------------------------------------------------------------
# Switching an existing Linen model.

def _is_plain_linen_conv(module) -> bool:
  return (isinstance(module, _linen.Conv) and module.conv_general_dilated is None
          and module.conv_general_dilated_cls is None)


@contextlib.contextmanager
def intercept_convs(algo: ConvAlgo | str = "auto"):
  """Inside the context, every plain flax.linen.Conv (no conv_general_dilated of its own) runs
  jaxdnn.conv with `algo`. jaxdnn.nn.Conv and convs with a custom function are left alone."""
  conv_fn = JaxdnnConvFn(algo)

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    if context.method_name != "__call__" or not _is_plain_linen_conv(module):
      return next_fun(*args, **kwargs)
    # Linen modules are frozen dataclasses: set the hook for this call only.
    object.__setattr__(module, "conv_general_dilated", conv_fn)
    try:
      return next_fun(*args, **kwargs)
    finally:
      object.__setattr__(module, "conv_general_dilated", None)

  with _linen.intercept_methods(interceptor):
    yield
