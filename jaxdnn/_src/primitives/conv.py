"""The three convolution primitives and their rules.

  conv_forward         F(x, w)  = y
  conv_backward_data   D(dy, w) = dx
  conv_backward_filter W(x, dy) = dw

All three are bilinear faces of one trilinear form, <F(x,w), dy> = <x, D(dy,w)> = <w, W(x,dy)>,
so each one's transposes are the other two (design.md section 2):

  | primitive | transpose w.r.t. 1st operand | transpose w.r.t. 2nd operand |
  | F(x, w)   | D(ct, w)                     | W(x, ct)                     |
  | D(dy, w)  | F(ct, w)                     | W(ct, dy)                    |
  | W(x, dy)  | D(dy, ct)                    | F(x, ct)                     |

With ad.defbilinear this gives jvp, grad and every higher order on jaxdnn kernels only.

Parameters shared by the three: geometry (ConvGeometry, native layout), algo (ConvAlgo or
"auto"), precision (MathPrecision), out_dtype (numpy dtype of the result). Both operands have
one dtype; the result may differ (preferred_element_type).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

from jaxdnn._src import algorithms, reference
from jaxdnn._src import ffi as jffi
from jaxdnn._src.algorithms import AUTO, MathPrecision
from jaxdnn._src.geometry import ConvGeometry, ConvOp

conv_forward_p = jex_core.Primitive("jaxdnn_conv_forward")
conv_backward_data_p = jex_core.Primitive("jaxdnn_conv_backward_data")
conv_backward_filter_p = jex_core.Primitive("jaxdnn_conv_backward_filter")

_OP_OF = {
    conv_forward_p: ConvOp.FORWARD,
    conv_backward_data_p: ConvOp.BACKWARD_DATA,
    conv_backward_filter_p: ConvOp.BACKWARD_FILTER,
}
_FFI_TARGETS = {
    ConvOp.FORWARD: "jaxdnn_conv_fwd",
    ConvOp.BACKWARD_DATA: "jaxdnn_conv_bwd_data",
    ConvOp.BACKWARD_FILTER: "jaxdnn_conv_bwd_filter",
}


# ---------------------------------------------------------------------------------------------
# Shapes: (batch, channels, out_channels) of the forward problem, from either operation's operands.

def problem_sizes(op: ConvOp, a_shape, b_shape, geometry: ConvGeometry) -> tuple[int, int, int]:
  g = geometry
  if op == ConvOp.FORWARD:  # a = x, b = w
    n, c, _ = g.split_activation(a_shape)
    _, k, _ = g.split_filter(b_shape)
  elif op == ConvOp.BACKWARD_DATA:  # a = dy, b = w
    n, k, _ = g.split_activation(a_shape)
    cg, _, _ = g.split_filter(b_shape)
    c = cg * g.groups
  else:  # a = x, b = dy
    n, c, _ = g.split_activation(a_shape)
    _, k, _ = g.split_activation(b_shape)
  return n, c, k


def _expected_operand_shapes(op, n, c, k, g: ConvGeometry):
  x, w, y = g.x_shape(n, c), g.w_shape(c // g.groups, k), g.y_shape(n, k)
  return {ConvOp.FORWARD: (x, w, y), ConvOp.BACKWARD_DATA: (y, w, x),
          ConvOp.BACKWARD_FILTER: (x, y, w)}[op]


def _abstract_eval(op, a, b, *, geometry, algo, precision, out_dtype):
  del algo, precision
  g = geometry
  rank = g.spatial_dims + 2
  if a.ndim != rank or b.ndim != rank:
    raise ValueError(f"jaxdnn {op.name.lower()}: operands must have rank {rank}, got shapes "
                     f"{a.shape} and {b.shape}")
  if a.dtype != b.dtype:
    raise TypeError(f"jaxdnn {op.name.lower()}: operands must share a dtype, got {a.dtype} and "
                    f"{b.dtype}")
  if np.dtype(a.dtype) not in algorithms.SUPPORTED_DTYPES:
    raise TypeError(f"jaxdnn {op.name.lower()}: unsupported dtype {a.dtype}")
  n, c, k = problem_sizes(op, a.shape, b.shape, g)
  if c % g.groups or k % g.groups:
    raise ValueError(f"jaxdnn {op.name.lower()}: channels {c} and output channels {k} must be "
                     f"divisible by the group count {g.groups}")
  exp_a, exp_b, out_shape = _expected_operand_shapes(op, n, c, k, g)
  if tuple(a.shape) != exp_a or tuple(b.shape) != exp_b:
    raise ValueError(f"jaxdnn {op.name.lower()}: operand shapes {a.shape}, {b.shape} do not "
                     f"match the geometry (expected {exp_a}, {exp_b})")
  return jax.core.ShapedArray(out_shape, out_dtype)


# ---------------------------------------------------------------------------------------------
# Binding helpers (also the public entry points of the backward operations).

def _params(geometry, algo, precision, out_dtype):
  return dict(geometry=geometry, algo=algo, precision=MathPrecision(precision),
              out_dtype=np.dtype(out_dtype))


def conv_forward(x, w, geometry, algo=AUTO, precision=MathPrecision.DEFAULT, out_dtype=None):
  out_dtype = x.dtype if out_dtype is None else out_dtype
  return conv_forward_p.bind(x, w, **_params(geometry, algo, precision, out_dtype))


def conv_backward_data(dy, w, geometry, algo=AUTO, precision=MathPrecision.DEFAULT,
                       out_dtype=None):
  out_dtype = dy.dtype if out_dtype is None else out_dtype
  return conv_backward_data_p.bind(dy, w, **_params(geometry, algo, precision, out_dtype))


def conv_backward_filter(x, dy, geometry, algo=AUTO, precision=MathPrecision.DEFAULT,
                         out_dtype=None):
  out_dtype = x.dtype if out_dtype is None else out_dtype
  return conv_backward_filter_p.bind(x, dy, **_params(geometry, algo, precision, out_dtype))


def _common_dtype(a, b):
  """Casts two operands to one dtype (a cotangent can be wider than the primal's dtype)."""
  dtype = jnp.promote_types(a.dtype, b.dtype)
  return a.astype(dtype), b.astype(dtype)


def _aval(v):
  """Abstract value of an operand, including an undefined primal being transposed."""
  return v.aval if hasattr(v, "aval") else jax.typeof(v)


# ---------------------------------------------------------------------------------------------
# Transposes (the table in the module docstring). `out_dtype` of each transpose is the dtype of
# the primal operand it is the cotangent of.

def _forward_transpose_x(ct, x, w, *, geometry, algo, precision, out_dtype):
  del out_dtype
  ct, w = _common_dtype(ct, w)
  return conv_backward_data(ct, w, geometry, algo, precision, _aval(x).dtype)


def _forward_transpose_w(ct, x, w, *, geometry, algo, precision, out_dtype):
  del out_dtype
  x, ct = _common_dtype(x, ct)
  return conv_backward_filter(x, ct, geometry, algo, precision, _aval(w).dtype)


def _backward_data_transpose_dy(ct, dy, w, *, geometry, algo, precision, out_dtype):
  del out_dtype
  ct, w = _common_dtype(ct, w)
  return conv_forward(ct, w, geometry, algo, precision, _aval(dy).dtype)


def _backward_data_transpose_w(ct, dy, w, *, geometry, algo, precision, out_dtype):
  del out_dtype
  ct, dy = _common_dtype(ct, dy)
  return conv_backward_filter(ct, dy, geometry, algo, precision, _aval(w).dtype)


def _backward_filter_transpose_x(ct, x, dy, *, geometry, algo, precision, out_dtype):
  del out_dtype
  dy, ct = _common_dtype(dy, ct)
  return conv_backward_data(dy, ct, geometry, algo, precision, _aval(x).dtype)


def _backward_filter_transpose_dy(ct, x, dy, *, geometry, algo, precision, out_dtype):
  del out_dtype
  x, ct = _common_dtype(x, ct)
  return conv_forward(x, ct, geometry, algo, precision, _aval(dy).dtype)


ad.defbilinear(conv_forward_p, _forward_transpose_x, _forward_transpose_w)
ad.defbilinear(conv_backward_data_p, _backward_data_transpose_dy, _backward_data_transpose_w)
ad.defbilinear(conv_backward_filter_p, _backward_filter_transpose_x, _backward_filter_transpose_dy)


# ---------------------------------------------------------------------------------------------
# Batching. A vmapped axis of size B is folded into a dimension the kernel already loops over:
#   - the activation-shaped operand of F or D only: into the batch N;
#   - otherwise into channels *inside* each group, viewing a channel axis of size S as
#     (G, S/G) and making it (G, B, S/G), so group g of the folded problem is group g of every
#     batch member;
#   - both operands batched: into the groups, viewing channels as (B, G, S/G): B*G groups.

def _fold_in(arr, bdim, axis, groups):
  """Moves batch axis `bdim` into `axis` (indexed without bdim) as (groups, B, S/groups)."""
  b = arr.shape[bdim]
  arr = jnp.moveaxis(arr, bdim, 0)  # (B, ...)
  size = arr.shape[axis + 1]
  inner = size // groups
  arr = arr.reshape(b, *arr.shape[1:axis + 1], groups, inner, *arr.shape[axis + 2:])
  arr = jnp.moveaxis(arr, 0, axis + 1)  # (..., groups, B, inner, ...)
  return arr.reshape(*arr.shape[:axis], groups * b * inner, *arr.shape[axis + 3:])


def _fold_out(arr, axis, groups, b):
  """Inverse of _fold_in: splits `axis` (groups, B, inner) and moves B to the front."""
  size = arr.shape[axis]
  inner = size // (groups * b)
  arr = arr.reshape(*arr.shape[:axis], groups, b, inner, *arr.shape[axis + 1:])
  arr = jnp.moveaxis(arr, axis + 1, 0)
  return arr.reshape(b, *arr.shape[1:axis + 1], groups * inner, *arr.shape[axis + 3:])


def _batch_rule(prim, batched_args, batch_dims, *, geometry, **params):
  op = _OP_OF[prim]
  (a, b_), (a_bdim, b_bdim) = batched_args, batch_dims
  g = geometry
  size = a.shape[a_bdim] if a_bdim is not None else b_.shape[b_bdim]
  if size == 0:  # nothing to compute: the result is empty along the batch axis
    out = _abstract_eval(op, _unbatched_aval(a, a_bdim), _unbatched_aval(b_, b_bdim),
                         geometry=g, **params)
    return jnp.zeros((0, *out.shape), out.dtype), 0

  ch = g.channel_axis  # channel axis of activations
  f_in, f_out = g.filter_in_axis, g.filter_out_axis
  groups = g.groups
  a_mapped = a_bdim is not None
  b_mapped = b_bdim is not None

  if a_mapped and b_mapped:
    # Both operands batched: B*G groups, channels ordered (B, G, S/G).
    bg = g.replace(groups=groups * size)
    if op == ConvOp.FORWARD:  # x: (B,C)->C', w: out (B,K)->K'
      out = prim.bind(_fold_in(a, a_bdim, ch, 1), _fold_in(b_, b_bdim, f_out, 1),
                      geometry=bg, **params)
      return _fold_out(out, ch, 1, size), 0
    if op == ConvOp.BACKWARD_DATA:  # dy: (B,K)->K', w: out (B,K)->K'
      out = prim.bind(_fold_in(a, a_bdim, ch, 1), _fold_in(b_, b_bdim, f_out, 1),
                      geometry=bg, **params)
      return _fold_out(out, ch, 1, size), 0
    # BACKWARD_FILTER: x: (B,C)->C', dy: (B,K)->K'; dw out axis (B,K)
    out = prim.bind(_fold_in(a, a_bdim, ch, 1), _fold_in(b_, b_bdim, ch, 1), geometry=bg,
                    **params)
    return _fold_out(out, f_out, 1, size), 0

  if op == ConvOp.FORWARD:
    if a_mapped:  # x only: into the batch
      out = prim.bind(_fold_in(a, a_bdim, 0, 1), b_, geometry=g, **params)
      return _fold_out(out, 0, 1, size), 0
    # w only: into the output channels of each group
    out = prim.bind(a, _fold_in(b_, b_bdim, f_out, groups), geometry=g, **params)
    return _fold_out(out, ch, groups, size), 0

  if op == ConvOp.BACKWARD_DATA:
    if a_mapped:  # dy only: into the batch
      out = prim.bind(_fold_in(a, a_bdim, 0, 1), b_, geometry=g, **params)
      return _fold_out(out, 0, 1, size), 0
    # w only: into the filter's input channels; dx channels come out as (G, B, C/G)
    out = prim.bind(a, _fold_in(b_, b_bdim, f_in, 1), geometry=g, **params)
    return _fold_out(out, ch, groups, size), 0

  # BACKWARD_FILTER
  if a_mapped:  # x only: into the input channels of each group; dw in axis (B, C/G)
    out = prim.bind(_fold_in(a, a_bdim, ch, groups), b_, geometry=g, **params)
    return _fold_out(out, f_in, 1, size), 0
  # dy only: into the output channels of each group
  out = prim.bind(a, _fold_in(b_, b_bdim, ch, groups), geometry=g, **params)
  return _fold_out(out, f_out, groups, size), 0


def _unbatched_aval(v, bdim):
  shape = v.shape if bdim is None else tuple(
      s for i, s in enumerate(v.shape) if i != bdim)
  return jax.core.ShapedArray(shape, v.dtype)


# ---------------------------------------------------------------------------------------------
# Lowering: an FFI custom call per operation; the reference path on request.

def _kernel_dtypes(in_dtype, out_dtype):
  """(operand dtype, result dtype) handed to the kernels, and the final cast.

  Kernels take (T, T) and (16-bit, float32). A wider result type casts the operands up first
  (exact); a narrower one computes in the operand type and rounds once at the end.
  """
  in_dtype, out_dtype = np.dtype(in_dtype), np.dtype(out_dtype)
  if in_dtype == out_dtype:
    return in_dtype, out_dtype
  if in_dtype.itemsize == 2 and out_dtype == np.float32:
    return in_dtype, out_dtype
  if out_dtype.itemsize > in_dtype.itemsize:
    return out_dtype, out_dtype
  return in_dtype, in_dtype


WINOGRAD_FILTER_TARGET = "jaxdnn_winograd_filter"


def _winograd_u_dtype(kin, kout):
  """The type the Winograd kernels compute (and keep U) in: float64 or float32."""
  wide = np.dtype(np.float64) in (np.dtype(kin), np.dtype(kout))
  return np.dtype(np.float64) if wide else np.dtype(np.float32)


def filter_operand(platform, op, chosen, w, geometry, n, c, k, kin, kout, precision):
  """Operand b of the kernel call for a forward or backward-data with filter w.

  The Winograd families take the transformed filter U = G w G^T instead (the filter-transform
  cache): a separate custom call jaxdnn_winograd_filter, w -> U, whose attributes hold only what
  U depends on (layout, groups, tile, flip), so XLA's CSE gives one U to every convolution of the
  same w with the same tile (weight tying, remat's recompute, one layer applied several times),
  and loop-invariant code motion hoists it out of a while loop whose w is loop-invariant. The
  call has no side effect and no workspace. Every other family takes w itself.
  """
  spec = algorithms.winograd_filter_shape(platform, op, chosen, geometry, n, c, k, kin, kout,
                                          precision)
  if spec is None:
    return w.astype(kin)
  tile, dims = spec
  call = jax.ffi.ffi_call(WINOGRAD_FILTER_TARGET,
                          jax.ShapeDtypeStruct(dims, _winograd_u_dtype(kin, kout)))
  return call(w.astype(kin), layout=np.int32(geometry.layout), groups=np.int64(geometry.groups),
              tile=np.int32(tile), flip=np.int32(op == ConvOp.BACKWARD_DATA))


def tile_attribute(algo) -> dict:
  """The conv call's optional `tile` attribute (ffi_conv.h): only for an explicit tile."""
  tile = algorithms.algo_tile(algo)
  return {"tile": np.int32(tile)} if tile else {}


def flip_swap_filter(w, geometry: ConvGeometry):
  """w'[f'][k][g, c] = w[F-1-f'][c][g, k]: the taps reversed on every spatial axis and, within
  each group, input and output channels exchanged (native filter layout). Its own inverse."""
  i_ax, o_ax, groups = geometry.filter_in_axis, geometry.filter_out_axis, geometry.groups
  w = jnp.flip(w, tuple(a for a in range(w.ndim) if a not in (i_ax, o_ax)))
  w = jnp.moveaxis(w, (i_ax, o_ax), (-2, -1))
  *spatial, cg, k = w.shape
  kg = k // groups
  w = w.reshape(*spatial, cg, groups, kg)
  w = jnp.transpose(w, (*range(len(spatial)), w.ndim - 1, w.ndim - 2, w.ndim - 3))  # Kg, G, Cg
  w = w.reshape(*spatial, kg, groups * cg)
  return jnp.moveaxis(w, (-2, -1), (i_ax, o_ax))


def _lhs_dilated_call(op, platform, a, b, q, *, geometry, **params):
  """A transposed convolution through the other face of the strided geometry q
  (ConvGeometry.lhs_dilation_as_stride, algorithms.MAPPED_OP)."""
  if op == ConvOp.FORWARD:  # F_P(x, w) = D_Q(x, w')
    return _ffi_call(ConvOp.BACKWARD_DATA, platform, a, flip_swap_filter(b, geometry),
                     geometry=q, **params)
  if op == ConvOp.BACKWARD_DATA:  # D_P(dy, w) = F_Q(dy, w')
    return _ffi_call(ConvOp.FORWARD, platform, a, flip_swap_filter(b, geometry), geometry=q,
                     **params)
  # W_P(x, dy) = flip_swap(W_Q(dy, x))
  return flip_swap_filter(_ffi_call(ConvOp.BACKWARD_FILTER, platform, b, a, geometry=q, **params),
                          q)


def _ffi_call(op, platform, a, b, *, geometry, algo, precision, out_dtype):
  n, c, k = problem_sizes(op, a.shape, b.shape, geometry)
  out_shape = _expected_operand_shapes(op, n, c, k, geometry)[2]
  if c == 0 or k == 0:
    return jnp.zeros(out_shape, out_dtype)
  kin, kout = _kernel_dtypes(a.dtype, out_dtype)
  chosen = algorithms.choose_algorithm(platform, op, algo, geometry, n, c, k, kin, kout,
                                       precision)
  q = algorithms.lhs_dilation_mapping(platform, op, chosen, geometry, n, c, k, kin, kout,
                                      precision)
  if q is not None:
    return _lhs_dilated_call(op, platform, a, b, q, geometry=geometry, algo=chosen,
                             precision=precision, out_dtype=out_dtype)
  ws = algorithms.workspace_bytes(platform, op, chosen, geometry, n, c, k, kin, kout, precision)
  if op == ConvOp.BACKWARD_FILTER:
    b = b.astype(kin)
  else:  # b is the filter: the Winograd families take its transform
    b = filter_operand(platform, op, chosen, b, geometry, n, c, k, kin, kout, precision)
  call = jax.ffi.ffi_call(
      _FFI_TARGETS[op],
      (jax.ShapeDtypeStruct(out_shape, kout), jax.ShapeDtypeStruct((ws,), np.uint8)))
  out, _ = call(a.astype(kin), b, algo=np.int32(chosen.id),
                precision=np.int32(precision), **tile_attribute(chosen),
                **geometry.ffi_attributes())
  return out.astype(out_dtype)


_REFERENCE = {
    ConvOp.FORWARD: reference.forward,
    ConvOp.BACKWARD_DATA: reference.backward_data,
    ConvOp.BACKWARD_FILTER: reference.backward_filter,
}


def _reference_call(op, a, b, *, geometry, algo, precision, out_dtype):
  del algo, precision
  return _REFERENCE[op](a, b, geometry, out_dtype)


def _lowering(op, platform):
  """Lowering for `platform` ("cpu", "cuda", or None for any platform jaxdnn has no kernels for)."""
  def impl(a, b, **params):
    if reference.reference_enabled():
      return _reference_call(op, a, b, **params)
    if platform is None or jffi.extension(platform) is None:
      if params["algo"] != AUTO:
        raise ValueError(f"algo={params['algo'].name}: jaxdnn has no kernels for this platform "
                         f"in this build; only algo='auto' (the pure-JAX reference) runs here")
      return _reference_call(op, a, b, **params)
    return _ffi_call(op, platform, a, b, **params)
  return mlir.lower_fun(impl, multiple_results=False)


@functools.lru_cache(maxsize=None)
def _jitted(prim, params_key):
  params = dict(params_key)
  return jax.jit(lambda a, b: prim.bind(a, b, **params))


def _eager_impl(prim, a, b, **params):
  return _jitted(prim, tuple(sorted(params.items())))(a, b)


for _prim, _op in _OP_OF.items():
  _prim.def_impl(functools.partial(_eager_impl, _prim))
  _prim.def_abstract_eval(functools.partial(_abstract_eval, _op))
  batching.primitive_batchers[_prim] = functools.partial(_batch_rule, _prim)
  for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_prim, _lowering(_op, _platform), platform=_platform)
  mlir.register_lowering(_prim, _lowering(_op, None))  # any other platform
