"""The softmax primitives and their rules.

Over one axis of x (the public functions merge several reduced axes into one first):

  softmax           S(x)        = y = exp(x - m) / sum(exp(x - m))          m = max(x)
  log_softmax       L(x)        = y = (x - m) - log(sum(exp(x - m)))
  softmax_bwd       "softmax":  Bs(y, v) = y * (v - sum(v * y))             linear in v
                    "log_vjp":  Bv(y, v) = v - exp(y) * sum(v)              linear in v
                    "log_jvp":  Bj(y, v) = v - sum(v * exp(y))              linear in v

(sums over the axis, broadcast back). All three backward operations read only the forward's
output y; each has a kernel on both backends.

How every derivative is formed:
  - JVP of S along t: Bs(y, t); of L: Bj(y, t) (dL = t - <softmax, t>, softmax = exp(y)).
  - Transposes in v: Bs is self-adjoint (the softmax Jacobian diag(p) - p p^T is symmetric);
    Bv and Bj are each other's transpose (L's Jacobian is I - 1 p^T: Bj applies it, Bv its
    transpose). So reverse mode runs S or L forward and Bs or Bv backward, all kernels.
  - JVP of B(y, v) along (dy, dv): B(y, dv) plus the derivative in y, written in jnp (exact):
      Bs: dy * (v - sum(v y)) - y * sum(v dy)
      Bv: -exp(y) * dy * sum(v)
      Bj: -sum(v * exp(y) * dy)
    which is what second and higher derivatives (grad-of-grad, jvp-of-grad) add to the kernels.
  - y is never a linear operand of B.
NaN and inf follow jax.nn: a row holding NaN or +inf, or only -inf, is all NaN.

Batching: the batch dimension is just another non-reduced axis, so the axis parameter shifts past
it; the two operands of B are first aligned on one batch dimension.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

from jaxdnn._src import algorithms
from jaxdnn._src.primitives.activations import eager_impl, lowering

softmax_p = jex_core.Primitive("jaxdnn_softmax")
softmax_bwd_p = jex_core.Primitive("jaxdnn_softmax_bwd")

FFI_TARGETS = ("jaxdnn_softmax_fwd", "jaxdnn_softmax_bwd")
PRIMITIVE_NAMES = (softmax_p.name, softmax_bwd_p.name)

# jaxdnn::SoftmaxOp (pointwise_problem.h)
_FWD_OP = {False: 0, True: 1}  # log -> op
_BWD_OP = {"softmax": 0, "log_vjp": 1, "log_jvp": 2}
_TRANSPOSED = {"softmax": "softmax", "log_vjp": "log_jvp", "log_jvp": "log_vjp"}


def _check(name, avals, axis):
  for a in avals:
    if np.dtype(a.dtype) not in algorithms.SUPPORTED_DTYPES:
      raise TypeError(f"{name}: unsupported dtype {a.dtype} (float32, float64, bfloat16 or "
                      f"float16 only)")
    if a.dtype != avals[0].dtype or a.shape != avals[0].shape:
      raise ValueError(f"{name}: operands must share a shape and dtype, got "
                       f"{[(tuple(v.shape), str(v.dtype)) for v in avals]}")
  if not 0 <= axis < avals[0].ndim:
    raise ValueError(f"{name}: axis {axis} out of range for rank {avals[0].ndim}")


def _softmax_abstract_eval(x, *, axis, log):
  _check(softmax_p.name, (x,), axis)
  return jax.core.ShapedArray(x.shape, x.dtype)


def _bwd_abstract_eval(y, v, *, axis, op):
  _check(softmax_bwd_p.name, (y, v), axis)
  if op not in _BWD_OP:
    raise ValueError(f"{softmax_bwd_p.name}: unknown op {op!r}")
  return jax.core.ShapedArray(y.shape, y.dtype)


def softmax(x, axis: int, log: bool = False):
  return softmax_p.bind(x, axis=axis, log=log)


def softmax_bwd(y, v, axis: int, op: str):
  return softmax_bwd_p.bind(y, v.astype(y.dtype), axis=axis, op=op)


# ---------------------------------------------------------------------------------------------
# Reference (pure jnp; JAXDNN_REFERENCE=1 and platforms without jaxdnn kernels). 16-bit types
# compute in float32.

def _compute_dtype(dtype):
  return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _reference_softmax(x, *, axis, log):
  c = x.astype(_compute_dtype(x.dtype))
  shifted = c - jnp.max(c, axis, keepdims=True)
  if log:
    out = shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis, keepdims=True))
  else:
    e = jnp.exp(shifted)
    out = e / jnp.sum(e, axis, keepdims=True)
  return out.astype(x.dtype)


def _reference_bwd(y, v, *, axis, op):
  c = _compute_dtype(y.dtype)
  yc, vc = y.astype(c), v.astype(c)
  if op == "softmax":
    out = yc * (vc - jnp.sum(vc * yc, axis, keepdims=True))
  elif op == "log_vjp":
    out = vc - jnp.exp(yc) * jnp.sum(vc, axis, keepdims=True)
  else:
    out = vc - jnp.sum(vc * jnp.exp(yc), axis, keepdims=True)
  return out.astype(y.dtype)


# ---------------------------------------------------------------------------------------------
# Differentiation.

def _zero_tangent(primal_out):
  return ad.Zero(jax.typeof(primal_out).to_tangent_aval())


def _softmax_jvp(primals, tangents, *, axis, log):
  (x,), (t,) = primals, tangents
  y = softmax(x, axis, log)
  if type(t) is ad.Zero:
    return y, _zero_tangent(y)
  return y, softmax_bwd(y, t, axis, "log_jvp" if log else "softmax")


def _bwd_derivative_in_y(y, v, dy, axis, op):
  """d/dy B(y, v) applied to dy (jnp; exact)."""
  sum_ = functools.partial(jnp.sum, axis=axis, keepdims=True)
  if op == "softmax":
    return dy * (v - sum_(v * y)) - y * sum_(v * dy)
  if op == "log_vjp":
    return -jnp.exp(y) * dy * sum_(v)
  return -jnp.broadcast_to(sum_(v * jnp.exp(y) * dy), y.shape)


def _bwd_jvp(primals, tangents, *, axis, op):
  y, v = primals
  dy, dv = tangents
  out = softmax_bwd_p.bind(y, v, axis=axis, op=op)
  terms = []
  if type(dv) is not ad.Zero:
    terms.append(softmax_bwd(y, dv, axis, op))
  if type(dy) is not ad.Zero:
    c = _compute_dtype(y.dtype)
    term = _bwd_derivative_in_y(y.astype(c), v.astype(c), dy.astype(c), axis, op)
    terms.append(term.astype(y.dtype))
  if not terms:
    return out, _zero_tangent(out)
  return out, functools.reduce(jnp.add, terms)


def _bwd_transpose(ct, y, v, *, axis, op):
  if ad.is_undefined_primal(y):
    raise ValueError("jaxdnn softmax backward: the saved output is not a linear operand")
  if type(ct) is ad.Zero:
    return [None, ad.Zero(v.aval)]
  return [None, softmax_bwd(y, ct, axis, _TRANSPOSED[op]).astype(v.aval.dtype)]


ad.primitive_jvps[softmax_p] = _softmax_jvp
ad.primitive_jvps[softmax_bwd_p] = _bwd_jvp
ad.primitive_transposes[softmax_bwd_p] = _bwd_transpose


# ---------------------------------------------------------------------------------------------
# Batching.

def _softmax_batch(args, dims, *, axis, log):
  (x,), (d,) = args, dims
  return softmax(x, axis + (d <= axis), log), d


def _bwd_batch(args, dims, *, axis, op):
  (y, v), (dy, dv) = args, dims
  if dy == dv:
    return softmax_bwd_p.bind(y, v, axis=axis + (dy <= axis), op=op), dy
  size = y.shape[dy] if dy is not None else v.shape[dv]
  y, v = (jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
          for a, d in ((y, dy), (v, dv)))
  return softmax_bwd_p.bind(y, v, axis=axis + 1, op=op), 0


batching.primitive_batchers[softmax_p] = _softmax_batch
batching.primitive_batchers[softmax_bwd_p] = _bwd_batch


# ---------------------------------------------------------------------------------------------
# Lowering: the kernels see flat buffers viewed as [outer, n, inner] (attributes). A reshape to
# [outer, n, 1] would not be free: XLA gives the trailing unit dimension its own layout and copies
# around the custom call.

def _view3(shape, axis):
  return dict(outer=np.int64(math.prod(shape[:axis])), n=np.int64(shape[axis]),
              inner=np.int64(math.prod(shape[axis + 1:])))


def _ffi_softmax(x, *, axis, log):
  if x.size == 0:
    return jnp.zeros(x.shape, x.dtype)
  call = jax.ffi.ffi_call("jaxdnn_softmax_fwd", jax.ShapeDtypeStruct((x.size,), x.dtype))
  out = call(x.reshape(-1), op=np.int32(_FWD_OP[log]), **_view3(x.shape, axis))
  return out.reshape(x.shape)


def _ffi_bwd(y, v, *, axis, op):
  if y.size == 0:
    return jnp.zeros(y.shape, y.dtype)
  call = jax.ffi.ffi_call("jaxdnn_softmax_bwd", jax.ShapeDtypeStruct((y.size,), y.dtype))
  out = call(y.reshape(-1), v.reshape(-1), op=np.int32(_BWD_OP[op]), **_view3(y.shape, axis))
  return out.reshape(y.shape)


_RULES = {
    softmax_p: (_softmax_abstract_eval, _ffi_softmax, _reference_softmax),
    softmax_bwd_p: (_bwd_abstract_eval, _ffi_bwd, _reference_bwd),
}
for _prim, (_abstract, _ffi_fn, _ref_fn) in _RULES.items():
  _prim.def_impl(functools.partial(eager_impl, _prim))
  _prim.def_abstract_eval(_abstract)
  for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_prim, lowering(_ffi_fn, _ref_fn, _platform), platform=_platform)
  mlir.register_lowering(_prim, lowering(_ffi_fn, _ref_fn, None))
