"""Activations and softmax on jaxdnn kernels: `jaxdnn.activation(x, kind, param)`, the named
functions (relu, leaky_relu, clipped_relu, relu6, elu, sigmoid, tanh, gelu, silu/swish, identity),
`jaxdnn.softmax` and `jaxdnn.log_softmax`.

They compute what jax.nn's functions of the same names compute (same kink conventions for the
derivatives: relu'(0) = 0, leaky_relu'(0) = 1, relu6'(0) = relu6'(6) = 0, elu'(0) = alpha), on C++
(CPU) and CUDA kernels, forward and backward; they compose with jit, vmap and grad of any order.
The backward reads the forward's output where the derivative allows it (relu-likes, elu,
sigmoid, tanh), so the input need not be kept; gelu and silu read the input.

Inputs are float32, float64, bfloat16 or float16 arrays (16-bit types compute in float32).
Parameters (negative_slope, ceiling, alpha, param) are static Python numbers. Invalid arguments
raise ValueError or TypeError naming the argument.
"""

from __future__ import annotations

import math
import operator

import jax.numpy as jnp
import numpy as np

from jaxdnn._src import activations as names
from jaxdnn._src import algorithms
from jaxdnn._src.primitives import activations as act_prims
from jaxdnn._src.primitives import softmax as softmax_prims
from jaxdnn._src.primitives.activations import ActivationSpec

KINDS = names.NAMES  # every accepted `kind`: canonical names and aliases


def _as_array(x, fn: str):
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    x = jnp.asarray(x)
  dtype = np.dtype(x.dtype)
  if dtype not in algorithms.SUPPORTED_DTYPES:
    supported = ", ".join(str(d) for d in algorithms.SUPPORTED_DTYPES)
    raise TypeError(f"x has dtype {dtype}; jaxdnn.{fn} supports {supported}")
  return x


def _apply(x, fn: str, kind: str, param=None, *, param_arg: str = "param"):
  x = _as_array(x, fn)
  k, value = names.resolve(kind, param, name_arg="kind", param_arg=param_arg)
  spec = ActivationSpec(k.name, k.id, float(value), k.grad_from_output)
  return act_prims.activation(x, spec)


def activation(x, kind: str, param: float | None = None):
  """f(x) for the activation `kind` (one of KINDS; aliases: linear/none = identity, relu6 =
  clipped_relu with ceiling 6, swish = silu, gelu_exact = gelu, gelu_approximate = gelu_tanh).

  `param` is the kind's parameter: leaky_relu's negative slope (default 0.01), clipped_relu's
  ceiling (default 6), elu's alpha (default 1); the other kinds take none.
  """
  return _apply(x, "activation", kind, param)


def identity(x):
  return _apply(x, "identity", "identity")


def relu(x):
  """max(x, 0); relu'(0) = 0 as in jax.nn.relu."""
  return _apply(x, "relu", "relu")


def leaky_relu(x, negative_slope: float = 0.01):
  """x for x >= 0, negative_slope * x otherwise (negative_slope >= 0)."""
  return _apply(x, "leaky_relu", "leaky_relu", negative_slope, param_arg="negative_slope")


def clipped_relu(x, ceiling: float):
  """min(max(x, 0), ceiling) (ceiling > 0); the derivative is 0 at both kinks."""
  return _apply(x, "clipped_relu", "clipped_relu", ceiling, param_arg="ceiling")


def relu6(x):
  """min(max(x, 0), 6), as jax.nn.relu6."""
  return _apply(x, "relu6", "clipped_relu", 6.0)


def elu(x, alpha: float = 1.0):
  """x for x > 0, alpha * expm1(x) otherwise (alpha >= 0)."""
  return _apply(x, "elu", "elu", alpha, param_arg="alpha")


def sigmoid(x):
  return _apply(x, "sigmoid", "sigmoid")


def tanh(x):
  return _apply(x, "tanh", "tanh")


def gelu(x, approximate: bool = True):
  """jax.nn.gelu: the tanh approximation when approximate (the default), else x * Phi(x)."""
  if not isinstance(approximate, (bool, np.bool_)):
    raise TypeError(f"approximate must be a bool, got {approximate!r}")
  return _apply(x, "gelu", "gelu_tanh" if approximate else "gelu")


def silu(x):
  """x * sigmoid(x)."""
  return _apply(x, "silu", "silu")


swish = silu


# ---------------------------------------------------------------------------------------------
# Softmax.

def _reduced_axes(axis, ndim: int) -> tuple[int, ...]:
  if axis is None:
    return tuple(range(ndim))
  axes = axis if isinstance(axis, (tuple, list)) else (axis,)
  out = []
  for a in axes:
    try:
      a = operator.index(a)
    except TypeError:
      raise TypeError(f"axis must be an int, a tuple of ints or None, got {axis!r}") from None
    if not -ndim <= a < ndim:
      raise ValueError(f"axis {a} is out of bounds for an array of rank {ndim} (axis={axis!r})")
    out.append(a % ndim)
  if len(set(out)) != len(out):
    raise ValueError(f"axis has repeated entries: {axis!r}")
  return tuple(sorted(out))


def _softmax(x, axis, log: bool, fn: str):
  x = _as_array(x, fn)
  axes = _reduced_axes(axis, x.ndim)
  shape = x.shape
  if not axes:  # a reduction over no axes: every element is its own (length-1) row
    return softmax_prims.softmax(x[..., None], x.ndim, log)[..., 0]
  first, k = axes[0], len(axes)
  if axes == tuple(range(first, first + k)):
    # Contiguous axes (the common cases: one axis, or trailing axes) need no transpose: they
    # merge into one axis by a free reshape.
    merged = (*shape[:first], math.prod(shape[first:first + k]), *shape[first + k:])
    y = softmax_prims.softmax(x.reshape(merged), first, log)
    return y.reshape(shape)
  # Scattered axes: move them to the end (in order), merge, and move back.
  kept = tuple(a for a in range(x.ndim) if a not in axes)
  perm = kept + axes
  xt = jnp.transpose(x, perm)
  lead = xt.shape[:len(kept)]
  merged = math.prod(shape[a] for a in axes)
  y = softmax_prims.softmax(xt.reshape(*lead, merged), len(kept), log)
  return jnp.transpose(y.reshape(xt.shape), np.argsort(perm))


def softmax(x, axis=-1):
  """exp(x - max) / sum(exp(x - max)) over `axis` (an int, a tuple of ints, or None for all
  axes), as jax.nn.softmax (a row holding NaN or +inf, or only -inf, comes out all NaN)."""
  return _softmax(x, axis, False, "softmax")


def log_softmax(x, axis=-1):
  """(x - max) - log(sum(exp(x - max))) over `axis`, as jax.nn.log_softmax."""
  return _softmax(x, axis, True, "log_softmax")
