"""Fused convolution y = act(conv(x, w) + bias + residual): the two primitives and their rules.

  conv_fused_forward   (x, w, [bias], [residual]) -> y, [z]
      z = F(x, w) + bias[k] + residual,  y = act(z),  in one kernel pass (FFI target
      jaxdnn_conv_fwd_fused): each CPU family applies the epilogue where it stores its output.
      `with_preact` also returns z (stored by the same kernel pass).
  bias_act_backward    (t, [tb], s) -> dz, [db]
      t' = t + tb[k],  dz = t' * D(s),  db[k] = sum of dz over every axis but the channel axis,
      in one pass (FFI target jaxdnn_bias_act_bwd). D = f' computed from the saved s: the
      activation's output y when the kind's derivative is a function of it (relu, sigmoid, tanh,
      elu, ...: ActivationKind.grad_from_output), else its input z (gelu, gelu_tanh, silu).
      `order` k > 1 uses D's (k-1)-th derivative in s instead (second and higher derivatives).

Derivatives. With s the saved value and F the bilinear forward convolution (conv.py):

  y_dot = D(s) * (F(x_dot, w) + F(x, w_dot) + bias_dot[k] + residual_dot)
        = bias_act_backward(t = F(x_dot, w) + F(x, w_dot) + residual_dot, tb = bias_dot, s).dz

bias_act_backward is linear in (t, tb) and its transpose is itself with the roles of tb and db
swapped: <D (t + tb), c> = <t, D c> + <tb, sum(D c)>, so the cotangent of (t, tb) is
bias_act_backward(c, s) with the bias reduction on, and the transpose of that one adds the db
cotangent back as tb. So jax.grad of the fused convolution runs

  dz, dbias = bias_act_backward(dy, s)      (one pass: activation mask and bias reduction)
  dx = D(dz, w)   dw = W(x, dz)   dresidual = dz

on jaxdnn kernels, and every higher derivative composes out of the same primitives: the JVP of
bias_act_backward in s is bias_act_backward(t' * s_dot, s, order + 1).

Under differentiation (the JVP rule) the forward also stores z when the kind needs the input
(gelu, silu); a plain forward does not.

A family that runs the problem but carries no epilogue on the backend (the CUDA Winograd and FFT
families), asked for explicitly, lowers to its own plain forward kernel followed by the epilogue
as XLA elementwise operations.

Kernels: the first-order bias_act_backward runs on jaxdnn's kernel. Orders >= 2, and platforms
whose extension has no jaxdnn_bias_act_bwd target, use the jnp expression of D (the kink
conventions of jax.nn, as activation.h) differentiated by jax: those are the derivatives of a
derivative and are not on any training step's forward or first backward pass.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

from jaxdnn._src import activations, algorithms, reference
from jaxdnn._src import ffi as jffi
from jaxdnn._src.algorithms import AUTO, MathPrecision
from jaxdnn._src.geometry import ConvGeometry, ConvOp
from jaxdnn._src.primitives import conv as conv_prims
from jaxdnn._src.primitives.conv import _fold_in, _fold_out

conv_fused_forward_p = jex_core.Primitive("jaxdnn_conv_fused_forward")
conv_fused_forward_p.multiple_results = True
bias_act_backward_p = jex_core.Primitive("jaxdnn_bias_act_backward")
bias_act_backward_p.multiple_results = True

FUSED_TARGET = "jaxdnn_conv_fwd_fused"
BIAS_ACT_TARGET = "jaxdnn_bias_act_bwd"


# ---------------------------------------------------------------------------------------------
# Activation math in jnp (the reference path and the higher-order derivatives). The conventions
# at the kinks are jax.nn's, as in ffi/include/jaxdnn/activation.h.

def activate(name: str, x, param: float):
  """f(x) for the canonical activation `name` (activations.KINDS)."""
  if name == "identity":
    return x
  if name == "relu":
    return jax.nn.relu(x)
  if name == "leaky_relu":
    return jnp.where(x >= 0, x, param * x)
  if name == "clipped_relu":
    return jnp.clip(x, 0, param)
  if name == "elu":
    return jnp.where(x > 0, x, param * jnp.expm1(jnp.minimum(x, 0)))
  if name == "sigmoid":
    return jax.nn.sigmoid(x)
  if name == "tanh":
    return jnp.tanh(x)
  if name == "gelu":
    return jax.nn.gelu(x, approximate=False)
  if name == "gelu_tanh":
    return jax.nn.gelu(x, approximate=True)
  if name == "silu":
    return jax.nn.silu(x)
  raise ValueError(f"unknown activation {name!r}")


def _first_derivative(name: str, s, param: float):
  """f' as a function of the saved s (the output, or the input for gelu / gelu_tanh / silu)."""
  one = jnp.ones_like(s)
  zero = jnp.zeros_like(s)
  if name == "identity":
    return one
  if name == "relu":
    return jnp.where(s > 0, one, zero)
  if name == "leaky_relu":
    return jnp.where(s >= 0, one, jnp.full_like(s, param))
  if name == "clipped_relu":
    return jnp.where((s > 0) & (s < param), one, zero)
  if name == "elu":
    return jnp.where(s > 0, one, s + param)
  if name == "sigmoid":
    return s * (1 - s)
  if name == "tanh":
    return 1 - s * s
  if name == "gelu":
    return (0.5 * (1 + jax.lax.erf(s * np.sqrt(0.5))) +
            s * np.sqrt(0.5 / np.pi) * jnp.exp(-0.5 * s * s))
  if name == "gelu_tanh":
    c = np.sqrt(2 / np.pi)
    t = jnp.tanh(c * (s + 0.044715 * s * s * s))
    return 0.5 * (1 + t) + 0.5 * s * (1 - t * t) * c * (1 + 3 * 0.044715 * s * s)
  if name == "silu":
    sg = jax.nn.sigmoid(s)
    return sg * (1 + s * (1 - sg))
  raise ValueError(f"unknown activation {name!r}")


def derivative(name: str, s, param: float, order: int = 1):
  """D^(order): order 1 is f' from the saved s; order k is the (k-1)-th derivative of that in s."""
  fn = functools.partial(_first_derivative, name, param=param)
  for _ in range(order - 1):
    fn = (lambda g: lambda u: jax.jvp(g, (u,), (jnp.ones_like(u),))[1])(fn)
  return fn(s)


def _compute_dtype(dtype):
  return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _channel_shape(ndim: int, channel_axis: int, k: int) -> tuple[int, ...]:
  shape = [1] * ndim
  shape[channel_axis] = k
  return tuple(shape)


def epilogue_reference(conv_out, bias, residual, name, param, channel_axis, out_dtype):
  """(y, z) of the epilogue in jnp, computed in float32 (float64 for float64 results)."""
  ct = _compute_dtype(out_dtype)
  z = conv_out.astype(ct)
  if bias is not None:
    z = z + bias.astype(ct).reshape(_channel_shape(z.ndim, channel_axis, bias.shape[0]))
  if residual is not None:
    z = z + residual.astype(ct)
  return activate(name, z, param).astype(out_dtype), z.astype(out_dtype)


# ---------------------------------------------------------------------------------------------
# conv_fused_forward: abstract evaluation and binding.

def _split_fused(args, has_bias, has_residual):
  x, w, rest = args[0], args[1], list(args[2:])
  bias = rest.pop(0) if has_bias else None
  residual = rest.pop(0) if has_residual else None
  return x, w, bias, residual


def _join_fused(x, w, bias, residual):
  return [x, w] + ([bias] if bias is not None else []) + ([residual] if residual is not None
                                                         else [])


def _fused_abstract_eval(*args, geometry, algo, precision, out_dtype, activation,
                         activation_param, has_bias, has_residual, with_preact):
  del activation_param
  x, w, bias, residual = _split_fused(args, has_bias, has_residual)
  y = conv_prims._abstract_eval(ConvOp.FORWARD, x, w, geometry=geometry, algo=algo,
                                precision=precision, out_dtype=out_dtype)
  if activation not in activations.KINDS:
    raise ValueError(f"jaxdnn fused convolution: unknown activation {activation!r}")
  k = geometry.split_activation(y.shape)[1]
  if bias is not None and (tuple(bias.shape) != (k,) or bias.dtype != y.dtype):
    raise ValueError(f"jaxdnn fused convolution: bias must be ({k},) {y.dtype}, got "
                     f"{bias.shape} {bias.dtype}")
  if residual is not None and (tuple(residual.shape) != y.shape or residual.dtype != y.dtype):
    raise ValueError(f"jaxdnn fused convolution: residual must be {y.shape} {y.dtype}, got "
                     f"{residual.shape} {residual.dtype}")
  return [y, y] if with_preact else [y]


def conv_fused_forward(x, w, bias, residual, geometry: ConvGeometry, algo=AUTO,
                       precision=MathPrecision.DEFAULT, out_dtype=None, activation="identity",
                       activation_param: float = 0.0, with_preact: bool = False):
  """act(F(x, w) + bias + residual) (and z when with_preact); bias / residual may be None.

  Operands in the native layout; bias (K,) and residual (output-shaped) have dtype out_dtype.
  Returns y, or (y, z) with with_preact.
  """
  out_dtype = np.dtype(x.dtype if out_dtype is None else out_dtype)
  outs = conv_fused_forward_p.bind(
      *_join_fused(x, w, bias, residual), geometry=geometry, algo=algo,
      precision=MathPrecision(precision), out_dtype=out_dtype, activation=activation,
      activation_param=float(activation_param), has_bias=bias is not None,
      has_residual=residual is not None, with_preact=bool(with_preact))
  return tuple(outs) if with_preact else outs[0]


# ---------------------------------------------------------------------------------------------
# bias_act_backward: abstract evaluation and binding.

def _split_bab(args, has_tb):
  return (args[0], args[1], args[2]) if has_tb else (args[0], None, args[1])


def _bab_abstract_eval(*args, activation, activation_param, channel_axis, has_tb, reduce, order):
  del activation_param
  t, tb, s = _split_bab(args, has_tb)
  if tuple(t.shape) != tuple(s.shape):
    raise ValueError(f"jaxdnn bias_act_backward: t {t.shape} and s {s.shape} must have one "
                     f"shape")
  if not 0 <= channel_axis < t.ndim:
    raise ValueError(f"jaxdnn bias_act_backward: channel_axis {channel_axis} out of range")
  if activation not in activations.KINDS or order < 1:
    raise ValueError(f"jaxdnn bias_act_backward: bad activation {activation!r} / order {order}")
  k = t.shape[channel_axis]
  if tb is not None and tuple(tb.shape) != (k,):
    raise ValueError(f"jaxdnn bias_act_backward: tb must have shape ({k},), got {tb.shape}")
  dz = jax.core.ShapedArray(t.shape, t.dtype)
  return [dz, jax.core.ShapedArray((k,), t.dtype)] if reduce else [dz]


def bias_act_backward(t, tb, s, *, activation: str, activation_param: float = 0.0,
                      channel_axis: int, reduce: bool = True, order: int = 1):
  """dz = (t + tb[k]) * D(s), and db = sum of dz over all axes but channel_axis when `reduce`.

  tb may be None. Returns (dz, db) with reduce, else dz.
  """
  outs = bias_act_backward_p.bind(
      *([t, tb, s] if tb is not None else [t, s]), activation=activation,
      activation_param=float(activation_param), channel_axis=int(channel_axis),
      has_tb=tb is not None, reduce=bool(reduce), order=int(order))
  return tuple(outs) if reduce else outs[0]


# ---------------------------------------------------------------------------------------------
# JVP and transpose rules.

def _is_zero(t):
  return type(t) is ad.Zero


def _fused_jvp(primals, tangents, *, geometry, algo, precision, out_dtype, activation,
               activation_param, has_bias, has_residual, with_preact):
  x, w, bias, residual = _split_fused(primals, has_bias, has_residual)
  xd, wd, bd, rd = _split_fused(tangents, has_bias, has_residual)
  kind = activations.KINDS[activation]
  needs_input = not kind.grad_from_output
  outs = conv_fused_forward_p.bind(
      *primals, geometry=geometry, algo=algo, precision=precision, out_dtype=out_dtype,
      activation=activation, activation_param=activation_param, has_bias=has_bias,
      has_residual=has_residual, with_preact=with_preact or needs_input)
  y = outs[0]
  z = outs[1] if len(outs) > 1 else None
  s = z if needs_input else y
  primal_out = [y, z] if with_preact else [y]

  # t = the linear part of z's tangent without the bias: F(x_dot, w) + F(x, w_dot) + r_dot.
  terms = []
  if not _is_zero(xd):
    terms.append(conv_prims.conv_forward(xd, w, geometry, algo, precision, out_dtype))
  if not _is_zero(wd):
    terms.append(conv_prims.conv_forward(x, wd, geometry, algo, precision, out_dtype))
  if has_residual and not _is_zero(rd):
    terms.append(rd.astype(out_dtype))
  tb = bd if has_bias and not _is_zero(bd) else None
  if not terms and tb is None:
    zeros = [ad.Zero(jax.typeof(v).to_tangent_aval()) for v in primal_out]
    return primal_out, zeros
  t = functools.reduce(jnp.add, terms) if terms else jnp.zeros(y.shape, y.dtype)
  y_dot = bias_act_backward(t, tb, s, activation=activation, activation_param=activation_param,
                            channel_axis=geometry.channel_axis, reduce=False)
  if not with_preact:
    return primal_out, [y_dot]
  z_dot = t if tb is None else t + tb.reshape(
      _channel_shape(t.ndim, geometry.channel_axis, tb.shape[0]))
  return primal_out, [y_dot, z_dot]


def _bab_jvp(primals, tangents, *, activation, activation_param, channel_axis, has_tb, reduce,
             order):
  t, tb, s = _split_bab(primals, has_tb)
  td, tbd, sd = _split_bab(tangents, has_tb)
  params = dict(activation=activation, activation_param=activation_param,
                channel_axis=channel_axis, reduce=reduce)
  primal_out = bias_act_backward_p.bind(*primals, has_tb=has_tb, order=order, **params)
  pieces = []
  # Linear in (t, tb).
  lin_tb = tbd if has_tb and not _is_zero(tbd) else None
  if not _is_zero(td) or lin_tb is not None:
    lin_t = ad.instantiate_zeros(td) if not _is_zero(td) else jnp.zeros(t.shape, t.dtype)
    pieces.append(bias_act_backward_p.bind(
        *([lin_t, lin_tb, s] if lin_tb is not None else [lin_t, s]), has_tb=lin_tb is not None,
        order=order, **params))
  # Through s: d/ds [t' D_k(s)] s_dot = (t' s_dot) D_(k+1)(s).
  if not _is_zero(sd):
    tp = t if tb is None else t + tb.reshape(_channel_shape(t.ndim, channel_axis, tb.shape[0]))
    pieces.append(bias_act_backward_p.bind(tp * sd.astype(tp.dtype), s, has_tb=False,
                                           order=order + 1, **params))
  if not pieces:
    return primal_out, [ad.Zero(jax.typeof(v).to_tangent_aval()) for v in primal_out]
  tangent_out = [functools.reduce(jnp.add, parts) for parts in zip(*pieces)]
  return primal_out, tangent_out


def _bab_transpose(cts, *args, activation, activation_param, channel_axis, has_tb, reduce,
                   order):
  t, tb, s = _split_bab(args, has_tb)
  if ad.is_undefined_primal(s):
    raise ValueError("jaxdnn bias_act_backward is not linear in its saved operand s")
  ct_dz = ad.instantiate_zeros(cts[0])
  ct_db = cts[1] if reduce and not _is_zero(cts[1]) else None
  want_tb = has_tb and ad.is_undefined_primal(tb)
  outs = bias_act_backward_p.bind(
      *([ct_dz, ct_db, s] if ct_db is not None else [ct_dz, s]), activation=activation,
      activation_param=activation_param, channel_axis=channel_axis, has_tb=ct_db is not None,
      reduce=want_tb, order=order)
  ct_t = outs[0] if ad.is_undefined_primal(t) else None
  ct_tb = outs[1] if want_tb else None
  return [ct_t, ct_tb, None] if has_tb else [ct_t, None]


ad.primitive_jvps[conv_fused_forward_p] = _fused_jvp
ad.primitive_jvps[bias_act_backward_p] = _bab_jvp
ad.primitive_transposes[bias_act_backward_p] = _bab_transpose


# ---------------------------------------------------------------------------------------------
# Batching. conv_fused_forward folds the mapped axis as conv_forward does (conv.py), with bias
# and residual following the output's fold:
#   only x and/or residual mapped -> into the batch N (x broadcast when only residual is mapped);
#   w or bias mapped, x not       -> into the output channels of each group (G, B, K/G);
#   w or bias mapped, and x       -> into the groups: B*G groups, channels (B, C) and (B, K).
# Unmapped operands that must carry the axis are broadcast first.

def _leading(a, bdim, size):
  """`a` with the mapped axis first (broadcast to `size` when a is not mapped)."""
  if bdim is None:
    return jnp.broadcast_to(a[None], (size, *a.shape))
  return jnp.moveaxis(a, bdim, 0)


def _fused_batch(batched_args, batch_dims, *, geometry, has_bias, has_residual, with_preact,
                 **params):
  x, w, bias, residual = _split_fused(batched_args, has_bias, has_residual)
  xb, wb, bb, rb = _split_fused(batch_dims, has_bias, has_residual)
  size = next(a.shape[d] for a, d in zip(batched_args, batch_dims) if d is not None)
  g = geometry
  nout = 2 if with_preact else 1
  bind = functools.partial(conv_fused_forward_p.bind, has_bias=has_bias,
                           has_residual=has_residual, with_preact=with_preact, **params)
  if size == 0:
    unb = [conv_prims._unbatched_aval(a, d) for a, d in zip(batched_args, batch_dims)]
    avals = _fused_abstract_eval(*unb, geometry=g, has_bias=has_bias,
                                 has_residual=has_residual, with_preact=with_preact, **params)
    return [jnp.zeros((0, *a.shape), a.dtype) for a in avals], [0] * nout
  lead = lambda a, d: None if a is None else _leading(a, d, size)
  ch, f_out, groups = g.channel_axis, g.filter_out_axis, g.groups
  if wb is not None or bb is not None:
    wl, bl, rl = lead(w, wb), lead(bias, bb), lead(residual, rb)
    if xb is not None:  # into the groups
      outs = bind(*_join_fused(_fold_in(lead(x, xb), 0, ch, 1), _fold_in(wl, 0, f_out, 1),
                               None if bl is None else bl.reshape(-1),
                               None if rl is None else _fold_in(rl, 0, ch, 1)),
                  geometry=g.replace(groups=groups * size))
      return [_fold_out(o, ch, 1, size) for o in outs], [0] * nout
    # into the output channels of each group
    outs = bind(*_join_fused(x, _fold_in(wl, 0, f_out, groups),
                             None if bl is None else _fold_in(bl, 0, 0, groups),
                             None if rl is None else _fold_in(rl, 0, ch, groups)), geometry=g)
    return [_fold_out(o, ch, groups, size) for o in outs], [0] * nout
  # into the batch
  rl = None if residual is None else _fold_in(lead(residual, rb), 0, 0, 1)
  outs = bind(*_join_fused(_fold_in(lead(x, xb), 0, 0, 1), w, bias, rl), geometry=g)
  return [_fold_out(o, 0, 1, size) for o in outs], [0] * nout


# bias_act_backward is elementwise but for the channel axis: without a mapped bias (tb or db)
# the mapped axis folds into axis 0; otherwise into the channel axis, (B, K) -> B*K channels.
def _bab_batch(batched_args, batch_dims, *, activation, activation_param, channel_axis, has_tb,
               reduce, order):
  t, tb, s = _split_bab(batched_args, has_tb)
  tbd, tbb, sbd = _split_bab(batch_dims, has_tb)
  size = next(a.shape[d] for a, d in zip(batched_args, batch_dims) if d is not None)
  params = dict(activation=activation, activation_param=activation_param, order=order,
                reduce=reduce, has_tb=has_tb)
  shape = t.shape if tbd is None else tuple(n for i, n in enumerate(t.shape) if i != tbd)
  k = shape[channel_axis]
  nout = 2 if reduce else 1
  if size == 0:
    outs = [jnp.zeros((0, *shape), t.dtype)] + ([jnp.zeros((0, k), t.dtype)] if reduce else [])
    return outs, [0] * nout
  tl, sl = _leading(t, tbd, size), _leading(s, sbd, size)
  if not reduce and (tb is None or tbb is None) and channel_axis != 0:
    outs = bias_act_backward_p.bind(
        *([tl.reshape(-1, *shape[1:])] + ([tb] if has_tb else []) + [sl.reshape(-1, *shape[1:])]),
        channel_axis=channel_axis, **params)
    return [outs[0].reshape(size, *shape)], [0]

  def merge(a):  # (B, ...) -> channel axis (B, K) flattened
    a = jnp.moveaxis(a, 0, channel_axis)
    return a.reshape(*a.shape[:channel_axis], size * k, *a.shape[channel_axis + 2:])

  tbl = None if tb is None else _leading(tb, tbb, size).reshape(-1)
  outs = bias_act_backward_p.bind(*([merge(tl)] + ([tbl] if has_tb else []) + [merge(sl)]),
                                  channel_axis=channel_axis, **params)
  dz = outs[0].reshape(*shape[:channel_axis], size, k, *shape[channel_axis + 1:])
  result = [jnp.moveaxis(dz, channel_axis, 0)]
  if reduce:
    result.append(outs[1].reshape(size, k))
  return result, [0] * nout


batching.primitive_batchers[conv_fused_forward_p] = _fused_batch
batching.primitive_batchers[bias_act_backward_p] = _bab_batch


# ---------------------------------------------------------------------------------------------
# Lowering.

def _fused_reference(x, w, bias, residual, *, geometry, out_dtype, activation, activation_param,
                     with_preact, conv_out=None):
  if conv_out is None:
    conv_out = reference.forward(x, w, geometry, _compute_dtype(out_dtype))
  y, z = epilogue_reference(conv_out, bias, residual, activation, activation_param,
                            geometry.channel_axis, out_dtype)
  return [y, z] if with_preact else [y]


def _plain_kernel_only(platform, algo, *problem) -> bool:
  """Whether `algo` runs the plain forward of this problem on `platform` but not the fused one."""
  plain = algorithms.unsupported_reason(platform, ConvOp.FORWARD, algo, *problem)
  return not plain and bool(
      algorithms.unsupported_reason(platform, ConvOp.FORWARD, algo, *problem, fused=True))


def _fused_ffi_call(platform, x, w, bias, residual, *, geometry, algo, precision, out_dtype,
                    activation, activation_param, with_preact):
  g = geometry
  n, c, k = conv_prims.problem_sizes(ConvOp.FORWARD, x.shape, w.shape, g)
  y_shape = g.y_shape(n, k)
  if c == 0 or k == 0:  # no kernel call: the convolution is zero
    return _fused_reference(x, w, bias, residual, geometry=g, out_dtype=out_dtype,
                            activation=activation, activation_param=activation_param,
                            with_preact=with_preact, conv_out=jnp.zeros(y_shape, out_dtype))
  kin, kout = conv_prims._kernel_dtypes(x.dtype, out_dtype)
  if algo != AUTO and _plain_kernel_only(platform, algo, g, n, c, k, kin, kout, precision):
    # The requested family runs this convolution but has no kernel carrying the epilogue on this
    # backend (the CUDA Winograd and FFT families): its own plain forward kernel, then the
    # epilogue as one XLA elementwise pass. Never another family than the one asked for.
    conv_out = conv_prims._ffi_call(ConvOp.FORWARD, platform, x, w, geometry=g, algo=algo,
                                    precision=precision, out_dtype=_compute_dtype(out_dtype))
    return _fused_reference(x, w, bias, residual, geometry=g, out_dtype=out_dtype,
                            activation=activation, activation_param=activation_param,
                            with_preact=with_preact, conv_out=conv_out)
  chosen = algorithms.choose_algorithm(platform, ConvOp.FORWARD, algo, g, n, c, k, kin, kout,
                                       precision, fused=True)
  ws = algorithms.workspace_bytes(platform, ConvOp.FORWARD, chosen, g, n, c, k, kin, kout,
                                  precision, fused=True)
  absent = jnp.zeros((0,), kout)
  call = jax.ffi.ffi_call(
      FUSED_TARGET,
      (jax.ShapeDtypeStruct(y_shape, kout),
       jax.ShapeDtypeStruct(y_shape if with_preact else (0,), kout),
       jax.ShapeDtypeStruct((ws,), np.uint8)))
  w_operand = conv_prims.filter_operand(platform, ConvOp.FORWARD, chosen, w, g, n, c, k, kin,
                                        kout, precision)
  y, z, _ = call(x.astype(kin), w_operand,
                 absent if bias is None else bias.astype(kout),
                 absent if residual is None else residual.astype(kout),
                 algo=np.int32(chosen.id), precision=np.int32(precision),
                 **conv_prims.tile_attribute(chosen), activation=np.int32(activations.KINDS[activation].id),
                 activation_param=np.float64(activation_param), **g.ffi_attributes())
  return [y.astype(out_dtype), z.astype(out_dtype)] if with_preact else [y.astype(out_dtype)]


def _fused_lowering(platform):
  def impl(*args, has_bias, has_residual, **params):
    x, w, bias, residual = _split_fused(args, has_bias, has_residual)
    if reference.reference_enabled() or platform is None or jffi.extension(platform) is None:
      if not reference.reference_enabled() and params["algo"] != AUTO:
        raise ValueError(f"algo={params['algo'].name}: jaxdnn has no kernels for this platform "
                         f"in this build; only algo='auto' (the pure-JAX reference) runs here")
      for name in ("algo", "precision"):
        params.pop(name)
      return _fused_reference(x, w, bias, residual, **params)
    return _fused_ffi_call(platform, x, w, bias, residual, **params)
  return mlir.lower_fun(impl, multiple_results=True)


def _bab_reference(t, tb, s, *, activation, activation_param, channel_axis, reduce, order):
  ct = _compute_dtype(t.dtype)
  tp = t.astype(ct)
  if tb is not None:
    tp = tp + tb.astype(ct).reshape(_channel_shape(t.ndim, channel_axis, tb.shape[0]))
  dz = tp * derivative(activation, s.astype(ct), activation_param, order)
  outs = [dz.astype(t.dtype)]
  if reduce:
    axes = tuple(i for i in range(t.ndim) if i != channel_axis)
    outs.append(jnp.sum(dz, axis=axes).astype(t.dtype))
  return outs


def _bab_ffi_call(platform, t, tb, s, *, activation, activation_param, channel_axis, reduce):
  shape = t.shape
  k = shape[channel_axis]
  outer = int(np.prod(shape[:channel_axis], dtype=np.int64))
  inner = int(np.prod(shape[channel_axis + 1:], dtype=np.int64))
  view = (outer, k, inner)
  absent = jnp.zeros((0,), t.dtype)
  ws = int(jffi.extension(platform).bias_act_workspace_bytes(
      outer, k, inner, algorithms.dtype_id(t.dtype), bool(reduce)))
  call = jax.ffi.ffi_call(
      BIAS_ACT_TARGET,
      (jax.ShapeDtypeStruct(view, t.dtype), jax.ShapeDtypeStruct((k,) if reduce else (0,),
                                                                 t.dtype),
       jax.ShapeDtypeStruct((ws,), np.uint8)))
  dz, db, _ = call(t.reshape(view), absent if tb is None else tb.astype(t.dtype),
                s.astype(t.dtype).reshape(view),
                activation=np.int32(activations.KINDS[activation].id),
                activation_param=np.float64(activation_param))
  return [dz.reshape(shape), db] if reduce else [dz.reshape(shape)]


def _bab_lowering(platform):
  def impl(*args, has_tb, order, **params):
    t, tb, s = _split_bab(args, has_tb)
    if (order == 1 and platform is not None and not reference.reference_enabled()
        and jffi.has_target(platform, BIAS_ACT_TARGET)):
      return _bab_ffi_call(platform, t, tb, s, **params)
    return _bab_reference(t, tb, s, order=order, **params)
  return mlir.lower_fun(impl, multiple_results=True)


@functools.lru_cache(maxsize=None)
def _jitted(prim, params_key):
  params = dict(params_key)
  return jax.jit(lambda *args: prim.bind(*args, **params))


def _eager_impl(prim, *args, **params):
  return _jitted(prim, tuple(sorted(params.items())))(*args)


conv_fused_forward_p.def_impl(functools.partial(_eager_impl, conv_fused_forward_p))
conv_fused_forward_p.def_abstract_eval(_fused_abstract_eval)
bias_act_backward_p.def_impl(functools.partial(_eager_impl, bias_act_backward_p))
bias_act_backward_p.def_abstract_eval(_bab_abstract_eval)
for _platform in ("cpu", "cuda"):
  mlir.register_lowering(conv_fused_forward_p, _fused_lowering(_platform), platform=_platform)
  mlir.register_lowering(bias_act_backward_p, _bab_lowering(_platform), platform=_platform)
mlir.register_lowering(conv_fused_forward_p, _fused_lowering(None))
mlir.register_lowering(bias_act_backward_p, _bab_lowering(None))
