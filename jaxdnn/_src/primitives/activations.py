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

Bit masks (relu, leaky_relu, clipped_relu: f' is 1 or a constant `lower`, 0 or the slope):
  activation_mask    M(x)       = (f(x), bits)      bits: uint8, x's shape with the last axis L
                                                     packed into ceil(L / 8) bytes (bit k of byte j
                                                     is element 8j + k), bit = [f'(x) = 1]
  activation_select  S(bits, v) = where(bit, v, lower * v)     linear in v
Where the default backend's extension has the mask kernels (both, CPU and CUDA), the JVP of A
for these kinds is (y, S(bits, t)) with (y, bits) = M(x), so reverse mode keeps 1/8 byte per
element instead of y, and the backward moves 1/8 + 2 elements per element instead of 3 (jax.nn's
relu keeps a bool mask: 1 + 2 elements). S(bits, .) is diagonal, so its transpose is itself; the
bits are integer data with no tangent, and S's derivative in v is S: the second derivative is the
same symbolic zero as B1's for these kinds. The bits follow jax.nn's kinks on the input (x > 0,
x >= 0, 0 < x < ceiling), which agree with B1's tests on y wherever y is exact.

Batching: A is elementwise (the batch dimension passes through); the two operands of B are
aligned on one batch dimension (an unbatched one is broadcast), also elementwise. M and S do the
same, except that a batch dimension on the last (packed) axis moves to the front first.
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

activation_mask_p = jex_core.Primitive("jaxdnn_activation_mask")
activation_mask_p.multiple_results = True
activation_select_p = jex_core.Primitive("jaxdnn_activation_select")

# Kinds with a mask form (activation.h: activation_has_mask).
MASKED_KINDS = ("relu", "leaky_relu", "clipped_relu")
MASK_TARGETS = ("jaxdnn_activation_mask_fwd", "jaxdnn_activation_mask_bwd")

FFI_TARGETS = ("jaxdnn_activation_fwd", "jaxdnn_activation_bwd") + MASK_TARGETS
PRIMITIVE_NAMES = (activation_p.name, activation_grad_p.name, activation_mask_p.name,
                   activation_select_p.name)


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


def mask_shape(shape) -> tuple[int, ...]:
  """The bits' shape for data of `shape` (rank >= 1): the last axis packed 8 to a byte."""
  return (*shape[:-1], -(-shape[-1] // 8))


def _check_masked(name, spec):
  if spec.kind not in MASKED_KINDS:
    raise ValueError(f"{name}: {spec.kind} has no mask form ({', '.join(MASKED_KINDS)} only)")


def _mask_abstract_eval(x, *, spec):
  _check_dtype(activation_mask_p.name, x)
  _check_masked(activation_mask_p.name, spec)
  if x.ndim == 0:
    raise ValueError(f"{activation_mask_p.name}: the operand must have rank >= 1")
  return (jax.core.ShapedArray(x.shape, x.dtype),
          jax.core.ShapedArray(mask_shape(x.shape), np.uint8))


def _select_abstract_eval(bits, v, *, spec):
  _check_dtype(activation_select_p.name, v)
  _check_masked(activation_select_p.name, spec)
  if v.ndim == 0 or bits.dtype != np.uint8 or bits.shape != mask_shape(v.shape):
    raise ValueError(f"{activation_select_p.name}: the bits must be uint8 of shape "
                     f"{mask_shape(v.shape) if v.ndim else '(rank >= 1 data)'}, got {bits.dtype} "
                     f"{bits.shape} for data of shape {v.shape}")
  return jax.core.ShapedArray(v.shape, v.dtype)


# ---------------------------------------------------------------------------------------------
# Binding helpers.

def activation(x, spec: ActivationSpec):
  """f(x)."""
  return activation_p.bind(x, spec=spec)


def activation_select(bits, v, spec: ActivationSpec):
  """where(bit, v, lower * v): the masked kinds' derivative applied to v."""
  return activation_select_p.bind(bits, v, spec=spec)


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


def _reference_mask_bit(spec: ActivationSpec, x):
  if spec.kind == "relu":
    return x > 0
  if spec.kind == "leaky_relu":
    return x >= 0
  return (x > 0) & (x < spec.param)  # clipped_relu


def _reference_activation_mask(x, *, spec):
  c = _compute_dtype(x.dtype)
  bits = jnp.packbits(_reference_mask_bit(spec, x.astype(c)), axis=-1, bitorder="little")
  return [_reference_activation(x, spec=spec), bits]


def _reference_activation_select(bits, v, *, spec):
  bit = jnp.unpackbits(bits, axis=-1, count=v.shape[-1], bitorder="little").astype(bool)
  if spec.kind == "leaky_relu":
    c = _compute_dtype(v.dtype)
    return jnp.where(bit, v, (spec.param * v.astype(c)).astype(v.dtype))
  return jnp.where(bit, v, jnp.zeros_like(v))


# ---------------------------------------------------------------------------------------------
# Differentiation.

def _zero_tangent(primal_out):
  return ad.Zero(jax.typeof(primal_out).to_tangent_aval())


def _mask_kernels_by_default(platform: str) -> bool:
  """Whether differentiation keeps bit masks: where the default backend's extension has the mask
  kernels (the residual is chosen when tracing, before the lowering platform is known; on
  another platform the mask primitives lower to their jnp form, correct but unfused)."""
  ext_platform = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}.get(platform)
  return ext_platform is not None and all(jffi.has_target(ext_platform, t) for t in MASK_TARGETS)


def _activation_jvp(primals, tangents, *, spec):
  (x,), (t,) = primals, tangents
  if type(t) is ad.Zero:
    y = activation(x, spec)
    return y, _zero_tangent(y)
  if (spec.kind in MASKED_KINDS and np.ndim(x) >= 1
      and _mask_kernels_by_default(jax.default_backend())):
    y, bits = activation_mask_p.bind(x, spec=spec)
    return y, activation_select(bits, t.astype(x.dtype), spec)
  y = activation(x, spec)
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


def _mask_jvp(primals, tangents, *, spec):
  # Reached only when M itself is differentiated (e.g. jvp of a jvp): y's tangent through A's
  # JVP, the bits' tangent none.
  (x,), (t,) = primals, tangents
  y, bits = activation_mask_p.bind(x, spec=spec)
  if type(t) is ad.Zero:
    dy = _zero_tangent(y)
  else:
    dy = activation_select(bits, t.astype(x.dtype), spec)
  return (y, bits), (dy, _zero_tangent(bits))


def _select_jvp(primals, tangents, *, spec):
  (bits, v), (_, dv) = primals, tangents
  out = activation_select(bits, v, spec)
  if type(dv) is ad.Zero:
    return out, _zero_tangent(out)
  return out, activation_select(bits, dv.astype(v.dtype), spec)


def _select_transpose(ct, bits, v, *, spec):
  if ad.is_undefined_primal(bits):
    raise ValueError("jaxdnn activation select: the bits are not a linear operand")
  if type(ct) is ad.Zero:
    return [None, ad.Zero(v.aval)]
  return [None, activation_select(bits, ct.astype(v.aval.dtype), spec)]


ad.primitive_jvps[activation_p] = _activation_jvp
ad.primitive_jvps[activation_mask_p] = _mask_jvp
ad.primitive_jvps[activation_select_p] = _select_jvp
ad.primitive_transposes[activation_select_p] = _select_transpose
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


def _mask_batch(args, dims, *, spec):
  (x,), (d,) = args, dims
  if d == x.ndim - 1:  # the batch axis would be packed: move it to the front
    x, d = jnp.moveaxis(x, d, 0), 0
  return activation_mask_p.bind(x, spec=spec), [d, d]


def _select_batch(args, dims, *, spec):
  (bits, v), (db, dv) = args, dims
  if db == dv and db != v.ndim - 1:
    return activation_select(bits, v, spec), dv
  size = bits.shape[db] if db is not None else v.shape[dv]
  bits, v = (jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
             for a, d in ((bits, db), (v, dv)))
  return activation_select(bits, v, spec), 0


batching.primitive_batchers[activation_p] = _activation_batch
batching.primitive_batchers[activation_mask_p] = _mask_batch
batching.primitive_batchers[activation_select_p] = _select_batch
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


def _ffi_activation_mask(x, *, spec):
  if x.size == 0:
    return [jnp.zeros(x.shape, x.dtype), jnp.zeros(mask_shape(x.shape), np.uint8)]
  call = jax.ffi.ffi_call(MASK_TARGETS[0], (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                            jax.ShapeDtypeStruct(mask_shape(x.shape), np.uint8)))
  return list(call(x, activation=np.int32(spec.id), activation_param=np.float64(spec.param)))


def _ffi_activation_select(bits, v, *, spec):
  if v.size == 0:
    return jnp.zeros(v.shape, v.dtype)
  call = jax.ffi.ffi_call(MASK_TARGETS[1], jax.ShapeDtypeStruct(v.shape, v.dtype))
  return call(bits, v, activation=np.int32(spec.id), activation_param=np.float64(spec.param))


def lowering(ffi_fn, reference_fn, platform, target=None, multiple_results=False):
  """Lowering rule for `platform` ("cpu", "cuda", or None: any other platform); with `target`,
  the FFI kernels only where the platform's extension registers that target."""
  def impl(*args, **params):
    if (reference.reference_enabled() or platform is None or jffi.extension(platform) is None
        or (target is not None and not jffi.has_target(platform, target))):
      return reference_fn(*args, **params)
    return ffi_fn(*args, **params)
  return mlir.lower_fun(impl, multiple_results=multiple_results)


@functools.lru_cache(maxsize=None)
def _jitted(prim, params_key):
  params = dict(params_key)
  return jax.jit(lambda *args: prim.bind(*args, **params))


def eager_impl(prim, *args, **params):
  return _jitted(prim, tuple(sorted(params.items())))(*args)


# primitive: (abstract eval, FFI lowering, reference lowering, FFI target that must be registered)
_RULES = {
    activation_p: (_activation_abstract_eval, _ffi_activation, _reference_activation, None),
    activation_grad_p: (_grad_abstract_eval, _ffi_activation_grad, _reference_activation_grad,
                        None),
    activation_mask_p: (_mask_abstract_eval, _ffi_activation_mask, _reference_activation_mask,
                        MASK_TARGETS[0]),
    activation_select_p: (_select_abstract_eval, _ffi_activation_select,
                          _reference_activation_select, MASK_TARGETS[1]),
}
for _prim, (_abstract, _ffi_fn, _ref_fn, _target) in _RULES.items():
  _prim.def_impl(functools.partial(eager_impl, _prim))
  _prim.def_abstract_eval(_abstract)
  _multi = _prim.multiple_results
  for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_prim, lowering(_ffi_fn, _ref_fn, _platform, _target, _multi),
                           platform=_platform)
  mlir.register_lowering(_prim, lowering(_ffi_fn, _ref_fn, None, None, _multi))
