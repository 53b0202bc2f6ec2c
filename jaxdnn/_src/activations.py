"""Activation names, their C++ ids (jaxdnn::Activation in ffi/include/jaxdnn/activation.h) and
their one scalar parameter.

`resolve(name, param)` is the single place that turns a user's activation name into the
(id, param) pair an FFI call carries, for the standalone activation kernels and for the epilogue
of fused convolutions alike.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class ActivationKind:
  name: str           # canonical name
  id: int             # jaxdnn::Activation
  default_param: float | None  # None: the kind takes no parameter
  param_name: str | None       # what the parameter means, for error messages
  grad_from_output: bool       # f'(x) computable from y = f(x) (for every valid param)


KINDS = {
    k.name: k for k in (
        ActivationKind("identity", 0, None, None, True),
        ActivationKind("relu", 1, None, None, True),
        ActivationKind("leaky_relu", 2, 0.01, "negative_slope", True),
        ActivationKind("clipped_relu", 3, 6.0, "ceiling", True),
        ActivationKind("elu", 4, 1.0, "alpha", True),
        ActivationKind("sigmoid", 5, None, None, True),
        ActivationKind("tanh", 6, None, None, True),
        ActivationKind("gelu", 7, None, None, False),        # exact (erf)
        ActivationKind("gelu_tanh", 8, None, None, False),   # tanh approximation
        ActivationKind("silu", 9, None, None, False),
    )
}

# Other spellings: name -> (canonical name, fixed param or None).
ALIASES = {
    "linear": ("identity", None),
    "none": ("identity", None),
    "relu6": ("clipped_relu", 6.0),
    "swish": ("silu", None),
    "gelu_exact": ("gelu", None),
    "gelu_approximate": ("gelu_tanh", None),
}

NAMES = tuple(KINDS) + tuple(ALIASES)


def resolve(name: str, param: float | None = None, *, name_arg: str = "activation",
            param_arg: str = "activation_param") -> tuple[ActivationKind, float]:
  """(kind, param) for a user's activation name; ValueError or TypeError on bad input, naming the
  caller's arguments (`name_arg`, `param_arg`: how the caller's API spells them)."""
  if not isinstance(name, str):
    raise TypeError(f"{name_arg} must be a string, one of {', '.join(NAMES)}; got {name!r}")
  key = name.strip().lower()
  fixed = None
  if key in ALIASES:
    key, fixed = ALIASES[key]
  if key not in KINDS:
    raise ValueError(f"unknown {name_arg} {name!r}; expected one of {', '.join(NAMES)}")
  kind = KINDS[key]
  if param is not None:
    param = _as_float(param, param_arg)
  if fixed is not None:
    if param is not None and param != fixed:
      raise ValueError(f"activation {name!r} fixes its {kind.param_name} at {fixed}; got "
                       f"{param_arg}={param!r}")
    param = fixed
  if kind.default_param is None:
    if param is not None:
      raise ValueError(f"activation {name!r} takes no parameter; got {param_arg}={param!r}")
    return kind, 0.0
  value = kind.default_param if param is None else param
  if not math.isfinite(value):
    raise ValueError(f"{kind.name}'s {kind.param_name} ({param_arg}) must be finite; got {value}")
  if kind.name == "clipped_relu" and not value > 0:
    raise ValueError(f"clipped_relu's ceiling ({param_arg}) must be positive; got {value}")
  if kind.name in ("leaky_relu", "elu") and value < 0:
    # A negative slope or alpha makes f non-monotone, and the output no longer determines the
    # sign of the input, which the backward reads from the output.
    raise ValueError(f"{kind.name}'s {kind.param_name} ({param_arg}) must be non-negative; got "
                     f"{value}")
  return kind, value


def _as_float(param, param_arg: str) -> float:
  """A concrete real number as a float (the parameter is static: part of the compiled call)."""
  if isinstance(param, (bool, np.bool_)) or isinstance(param, (complex, np.complexfloating)):
    raise TypeError(f"{param_arg} must be a real number, got {param!r}")
  try:
    return float(param)
  except (TypeError, ValueError) as e:
    raise TypeError(f"{param_arg} must be a concrete real number (a static parameter, not a "
                    f"traced or array value), got {param!r}") from e
