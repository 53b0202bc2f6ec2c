"""The activation primitives and their rules.

  activation        A(x)      = f(x)
  activation_grad   B1(s, v)  = v * g(s)      g(s) = f'(x)                 linear in v
                    B2(s, v)  = v * g'(s)     g'(s) = d g / d s            linear in v

(one primitive, `activation_grad_p`, whose parameter `derivative` is 1 or 2). The saved operand
s is the forward's output y = f(x) when `spec.from_output` (kinds whose f' is a function of y:
relu, leaky_relu, clipped_relu, elu, sigmoid, tanh, identity; then the input need not be kept),
else the input x. So g(y) = f'(f^-1(y)) and g'(y) = f''(x) / f'(x) from the output, and g = f',
g' = f'' from the input (ffi/include/jaxdnn/activation.h has both, for host and device).

How every derivative is formed:
  - JVP of A at x along t: B1(s, t) with s = A(x) or x. Forward and reverse first derivatives
    therefore run on the backward kernel: reverse mode transposes B1 in v, which is B1 itself
    (B1(s, .) is a diagonal linear map: <B1(s, t), u> = <t, B1(s, u)>).
  - JVP of B1(s, v) along (ds, dv): B1(s, dv) + B2(s, v * ds). Since d/dx g(s(x)) = g'(s) s'(x)
    this is exact, whichever operand s is; the product v * ds is a jnp multiply.
  - JVP of B2(s, v) along (ds, dv): B2(s, dv) + v * ds * g''(s), where g'' is jax.jvp of a
    pure-jnp expression of g' (`_reference_grad(spec, s, 2)`), itself differentiable to any
    order. So grad-of-grad runs on the forward kernel, B1 and B2; third and higher derivatives
    add jnp terms.
  - Kinds whose g' is identically zero (identity, relu, leaky_relu, clipped_relu: piecewise
    linear) contribute a symbolic zero instead of a B2 call, as jax differentiates jax.nn.relu.
  - B1 and B2 are transposed in v only; s is never a linear operand.
Kinks follow jax.nn: relu'(0) = 0, leaky_relu'(0) = 1, relu6'(0) = relu6'(6) = 0, elu'(0) = alpha.

Batching: A is elementwise (the batch dimension passes through); the two operands of B are
aligned on one batch dimension (an unbatched one is broadcast), also elementwise.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

from jaxdnn._src import activations as names
from jaxdnn._src import algorithms
from jaxdnn._src import ffi as jffi
from jaxdnn._src import reference


@dataclasses.dataclass(frozen=True)
class ActivationSpec:
  """A resolved activation: canonical kind, its id (jaxdnn::Activation), the parameter value and
  whether backward passes read the forward's output (else its input)."""
  kind: str
  id: int
  param: float
  from_output: bool

  @classmethod
  def make(cls, name: str, param=None, from_output: bool | None = None) -> "ActivationSpec":
    kind, value = names.resolve(name, param)
    if from_output is None:
      from_output = kind.grad_from_output
    if from_output and not kind.grad_from_output:
      raise ValueError(f"{kind.name}'s derivative cannot be computed from its output")
    return cls(kind.name, kind.id, float(value), bool(from_output))


# Kinds whose g' is identically zero (their second derivative is a symbolic zero).
PIECEWISE_LINEAR = ("identity", "relu", "leaky_relu", "clipped_relu")

activation_p = jex_core.Primitive("jaxdnn_activation")
activation_grad_p = jex_core.Primitive("jaxdnn_activation_grad")

FFI_TARGETS = ("jaxdnn_activation_fwd", "jaxdnn_activation_bwd")
PRIMITIVE_NAMES = (activation_p.name, activation_grad_p.name)


def _check_dtype(name, *avals):
  for a in avals:
    if np.dtype(a.dtype) not in algorithms.SUPPORTED_DTYPES:
      raise TypeError(f"{name}: unsupported dtype {a.dtype} (float32, float64, bfloat16 or "
                      f"float16 only)")
    if a.dtype != avals[0].dtype:
      raise TypeError(f"{name}: operands must share a dtype, got {[str(v.dtype) for v in avals]}")


def _activation_abstract_eval(x, *, spec):
  _check_dtype(activation_p.name, x)
  return jax.core.ShapedArray(x.shape, x.dtype)


def _grad_abstract_eval(s, v, *, spec, derivative):
  _check_dtype(activation_grad_p.name, s, v)
  if s.shape != v.shape:
    raise ValueError(f"{activation_grad_p.name}: operands must have one shape, got {s.shape} and "
                     f"{v.shape}")
  if derivative not in (1, 2):
    raise ValueError(f"{activation_grad_p.name}: derivative must be 1 or 2, got {derivative}")
  return jax.core.ShapedArray(s.shape, s.dtype)


# ---------------------------------------------------------------------------------------------
# Binding helpers.

def activation(x, spec: ActivationSpec):
  """f(x)."""
  return activation_p.bind(x, spec=spec)


def activation_grad(s, v, spec: ActivationSpec, derivative: int = 1):
  """v * g(s) (derivative 1) or v * g'(s) (derivative 2); s is y or x per spec.from_output."""
  return activation_grad_p.bind(s, v.astype(s.dtype), spec=spec, derivative=derivative)


# ---------------------------------------------------------------------------------------------
# The pure-jnp reference (test oracle, JAXDNN_REFERENCE=1, platforms without jaxdnn kernels, and
# the third and higher derivatives). 16-bit inputs compute in float32, as the kernels do.

_SQRT_2_OVER_PI = 0.7978845608028654
_INV_SQRT_2PI = 0.3989422804014327
_SQRT_HALF = 0.7071067811865476
_GELU_CUBIC = 0.044715


def _compute_dtype(dtype):
  return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _reference_forward(spec: ActivationSpec, x):
  k, p = spec.kind, spec.param
  if k == "identity":
    return x
  if k == "relu":
    return jnp.maximum(x, 0)
  if k == "leaky_relu":
    return jnp.where(x >= 0, x, p * x)
  if k == "clipped_relu":
    return jnp.minimum(jnp.maximum(x, 0), p)
  if k == "elu":
    return jnp.where(x > 0, x, p * jnp.expm1(jnp.where(x > 0, 0, x)))
  if k == "sigmoid":
    return jax.nn.sigmoid(x)
  if k == "tanh":
    return jnp.tanh(x)
  if k == "gelu":
    return 0.5 * x * lax.erfc(-x * _SQRT_HALF)
  if k == "gelu_tanh":
    return 0.5 * x * (1 + jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * x ** 3)))
  if k == "silu":
    return x * jax.nn.sigmoid(x)
  raise ValueError(f"unknown activation {k!r}")


def _reference_grad(spec: ActivationSpec, s, derivative: int):
  """g(s) (derivative 1) or g'(s) (derivative 2), as activation.h computes them."""
  k, p = spec.kind, spec.param
  one, zero = jnp.ones_like(s), jnp.zeros_like(s)
  if derivative == 1:
    if k == "identity":
      return one
    if k == "relu":
      return jnp.where(s > 0, one, zero)
    if k == "leaky_relu":
      return jnp.where(s >= 0, one, p * one)
    if k == "clipped_relu":
      return jnp.where((s > 0) & (s < p), one, zero)
    if k == "elu":
      if spec.from_output:
        return jnp.where(s > 0, one, s + p)
      return jnp.where(s > 0, one, p * jnp.exp(jnp.where(s > 0, 0, s)))
    if k == "sigmoid":
      y = s if spec.from_output else jax.nn.sigmoid(s)
      return y * (1 - y)
    if k == "tanh":
      t = s if spec.from_output else jnp.tanh(s)
      return 1 - t * t
    if k == "gelu":
      return 0.5 * lax.erfc(-s * _SQRT_HALF) + s * _INV_SQRT_2PI * jnp.exp(-0.5 * s * s)
    if k == "gelu_tanh":
      t = jnp.tanh(_SQRT_2_OVER_PI * (s + _GELU_CUBIC * s ** 3))
      du = _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * s * s)
      return 0.5 * (1 + t) + 0.5 * s * (1 - t * t) * du
    if k == "silu":
      sg = jax.nn.sigmoid(s)
      return sg * (1 + s * (1 - sg))
  else:
    if k in PIECEWISE_LINEAR:
      return zero
    if k == "elu":
      if spec.from_output:
        return jnp.where(s > 0, zero, one)
      return jnp.where(s > 0, zero, p * jnp.exp(jnp.where(s > 0, 0, s)))
    if k == "sigmoid":
      if spec.from_output:
        return 1 - 2 * s
      y = jax.nn.sigmoid(s)
      return y * (1 - y) * (1 - 2 * y)
    if k == "tanh":
      if spec.from_output:
        return -2 * s
      t = jnp.tanh(s)
      return -2 * t * (1 - t * t)
    if k == "gelu":
      return _INV_SQRT_2PI * jnp.exp(-0.5 * s * s) * (2 - s * s)
    if k == "gelu_tanh":
      t = jnp.tanh(_SQRT_2_OVER_PI * (s + _GELU_CUBIC * s ** 3))
      du = _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * s * s)
      d2u = 6 * _SQRT_2_OVER_PI * _GELU_CUBIC * s
      return (1 - t * t) * (du - s * t * du * du + 0.5 * s * d2u)
    if k == "silu":
      sg = jax.nn.sigmoid(s)
      return sg * (1 - sg) * (2 + s * (1 - 2 * sg))
  raise ValueError(f"unknown activation {k!r} or derivative {derivative}")


def _reference_activation(x, *, spec):
  c = _compute_dtype(x.dtype)
  return _reference_forward(spec, x.astype(c)).astype(x.dtype)


def _reference_activation_grad(s, v, *, spec, derivative):
  c = _compute_dtype(s.dtype)
  g = _reference_grad(spec, s.astype(c), derivative)
  v = v.astype(c)
  if derivative == 1 and spec.kind in ("relu", "clipped_relu"):
    out = jnp.where(g != 0, v, jnp.zeros_like(v))  # jax.nn.relu/relu6 select the cotangent
  else:
    out = v * g
  return out.astype(s.dtype)


# ---------------------------------------------------------------------------------------------
# Differentiation.

def _zero_tangent(primal_out):
  return ad.Zero(jax.typeof(primal_out).to_tangent_aval())


def _activation_jvp(primals, tangents, *, spec):
  (x,), (t,) = primals, tangents
  y = activation(x, spec)
  if type(t) is ad.Zero:
    return y, _zero_tangent(y)
  return y, activation_grad(y if spec.from_output else x, t, spec, 1)


def _grad_jvp(primals, tangents, *, spec, derivative):
  s, v = primals
  ds, dv = tangents
  out = activation_grad_p.bind(s, v, spec=spec, derivative=derivative)
  terms = []
  if type(dv) is not ad.Zero:
    terms.append(activation_grad(s, dv, spec, derivative))
  if type(ds) is not ad.Zero and spec.kind not in PIECEWISE_LINEAR:
    ds = ds.astype(s.dtype)
    if derivative == 1:
      terms.append(activation_grad(s, v * ds, spec, 2))
    else:
      c = _compute_dtype(s.dtype)
      _, g3 = jax.jvp(lambda a: _reference_grad(spec, a, 2), (s.astype(c),), (ds.astype(c),))
      terms.append((v.astype(c) * g3).astype(s.dtype))
  if not terms:
    return out, _zero_tangent(out)
  return out, functools.reduce(jnp.add, terms)


def _grad_transpose(ct, s, v, *, spec, derivative):
  if ad.is_undefined_primal(s):
    raise ValueError("jaxdnn activation gradient: the saved operand is not a linear operand")
  if type(ct) is ad.Zero:
    return [None, ad.Zero(v.aval)]
  return [None, activation_grad(s, ct, spec, derivative).astype(v.aval.dtype)]


ad.primitive_jvps[activation_p] = _activation_jvp
ad.primitive_jvps[activation_grad_p] = _grad_jvp
ad.primitive_transposes[activation_grad_p] = _grad_transpose


# ---------------------------------------------------------------------------------------------
# Batching.

def _activation_batch(args, dims, *, spec):
  (x,), (d,) = args, dims
  return activation(x, spec), d


def _grad_batch(args, dims, *, spec, derivative):
  (s, v), (ds, dv) = args, dims
  if ds == dv:
    return activation_grad_p.bind(s, v, spec=spec, derivative=derivative), ds
  size = s.shape[ds] if ds is not None else v.shape[dv]
  s, v = (jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
          for a, d in ((s, ds), (v, dv)))
  return activation_grad_p.bind(s, v, spec=spec, derivative=derivative), 0


batching.primitive_batchers[activation_p] = _activation_batch
batching.primitive_batchers[activation_grad_p] = _grad_batch


# ---------------------------------------------------------------------------------------------
# Lowering: the FFI kernels on "cpu" and "cuda" when the extension is built; the pure-jnp
# reference under JAXDNN_REFERENCE=1 and on other platforms.

def _ffi_activation(x, *, spec):
  if x.size == 0:
    return jnp.zeros(x.shape, x.dtype)
  call = jax.ffi.ffi_call("jaxdnn_activation_fwd", jax.ShapeDtypeStruct(x.shape, x.dtype))
  return call(x, activation=np.int32(spec.id), activation_param=np.float64(spec.param))


def _ffi_activation_grad(s, v, *, spec, derivative):
  if s.size == 0:
    return jnp.zeros(s.shape, s.dtype)
  call = jax.ffi.ffi_call("jaxdnn_activation_bwd", jax.ShapeDtypeStruct(s.shape, s.dtype))
  return call(s, v, activation=np.int32(spec.id), activation_param=np.float64(spec.param),
              from_output=np.int32(spec.from_output), derivative=np.int32(derivative))


def lowering(ffi_fn, reference_fn, platform):
  """Lowering rule for `platform` ("cpu", "cuda", or None: any other platform)."""
  def impl(*args, **params):
    if reference.reference_enabled() or platform is None or jffi.extension(platform) is None:
      return reference_fn(*args, **params)
    return ffi_fn(*args, **params)
  return mlir.lower_fun(impl, multiple_results=False)


@functools.lru_cache(maxsize=None)
def _jitted(prim, params_key):
  params = dict(params_key)
  return jax.jit(lambda *args: prim.bind(*args, **params))


def eager_impl(prim, *args, **params):
  return _jitted(prim, tuple(sorted(params.items())))(*args)


_RULES = {
    activation_p: (_activation_abstract_eval, _ffi_activation, _reference_activation),
    activation_grad_p: (_grad_abstract_eval, _ffi_activation_grad, _reference_activation_grad),
}
for _prim, (_abstract, _ffi_fn, _ref_fn) in _RULES.items():
  _prim.def_impl(functools.partial(eager_impl, _prim))
  _prim.def_abstract_eval(_abstract)
  for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_prim, lowering(_ffi_fn, _ref_fn, _platform), platform=_platform)
  mlir.register_lowering(_prim, lowering(_ffi_fn, _ref_fn, None))
