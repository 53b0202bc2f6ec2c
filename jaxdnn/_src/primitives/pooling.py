"""The pooling primitives and their rules.

  max_pool           M(x)      = y   max over each window (not linear)
  max_pool_gather    G(x, t)   = y'  t at each window's arg-max of x: linear in t
  max_pool_scatter   S(x, dy)  = dx  dy summed onto the arg-max positions of x: linear in dy
  avg_pool           A(x)      = y   linear
  avg_pool_backward  A^T(dy)   = dx  linear

For a fixed x, G(x, .) and S(x, .) are one selection matrix and its transpose,
<G(x, t), dy> = <t, S(x, dy)>, so each is the other's transpose in its linear operand. The JVP of M
is G(x, t); x enters G and S only through the arg-max selection, which is locally constant, so
their JVPs in x are zero and every derivative of max pooling, of any order and mode, is a chain
of G and S. Likewise A and A^T transpose into each other.

The arg-max is the one jax.grad of a max reduce_window (select_and_scatter with `ge`) routes to:
the first tap in window order, replaced by a later tap v unless the current one is >= v, where
padding taps take part as -inf and route nothing. So ties go to the first tap; a NaN selection is
always replaced. (lax's own JVP, select_and_gather_add, breaks 2-D ties differently on XLA:CPU;
jaxdnn's JVP uses the gradient's rule, so G and S stay exact transposes.)

Operands are channels-last (N, spatial..., C) or channels-first (N, C, spatial...) per the
geometry; the kernels (CPU and CUDA) see channels-first arrays as N*C single-channel images.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

from jaxdnn._src import algorithms
from jaxdnn._src import ffi as jffi

NO_CUDA_EXTENSION = "jaxdnn was built without its CUDA extension"


@dataclasses.dataclass(frozen=True)
class PoolGeometry:
  """Window geometry of one pooling problem (per spatial dimension, outermost first).

  Output o covers input positions o*stride - pad_lo + k*dilation, k in [0, window); the rest of
  the padded extent is padding. pad_hi includes any ceil-mode extension. The avg divisor counts
  the taps of a window inside [-count_lo, in + count_hi).
  """
  channels_last: bool
  in_spatial: tuple[int, ...]
  window: tuple[int, ...]
  stride: tuple[int, ...]
  dilation: tuple[int, ...]
  pad_lo: tuple[int, ...]
  pad_hi: tuple[int, ...]
  count_lo: tuple[int, ...]
  count_hi: tuple[int, ...]

  @property
  def spatial_dims(self) -> int:
    return len(self.in_spatial)

  @property
  def out_spatial(self) -> tuple[int, ...]:
    out = []
    for i, k, s, d, lo, hi in zip(self.in_spatial, self.window, self.stride, self.dilation,
                                  self.pad_lo, self.pad_hi):
      span = i + lo + hi - (k - 1) * d
      out.append(0 if span <= 0 else (span - 1) // s + 1)
    return tuple(out)

  def shape(self, n: int, c: int, spatial) -> tuple[int, ...]:
    return (n, *spatial, c) if self.channels_last else (n, c, *spatial)

  def x_shape(self, n, c):
    return self.shape(n, c, self.in_spatial)

  def y_shape(self, n, c):
    return self.shape(n, c, self.out_spatial)

  def batch_and_channels(self, shape) -> tuple[int, int]:
    return shape[0], shape[-1] if self.channels_last else shape[1]

  def ffi_attributes(self) -> dict:
    arr = lambda v: np.asarray(v, np.int64)
    return dict(window=arr(self.window), stride=arr(self.stride), dilation=arr(self.dilation),
                pad_lo=arr(self.pad_lo), pad_hi=arr(self.pad_hi), count_lo=arr(self.count_lo),
                count_hi=arr(self.count_hi))


max_pool_p = jex_core.Primitive("jaxdnn_max_pool")
max_pool_gather_p = jex_core.Primitive("jaxdnn_max_pool_gather")
max_pool_scatter_p = jex_core.Primitive("jaxdnn_max_pool_scatter")
avg_pool_p = jex_core.Primitive("jaxdnn_avg_pool")
avg_pool_backward_p = jex_core.Primitive("jaxdnn_avg_pool_backward")

# primitive -> (FFI target, shapes of the operands: "x" or "y", shape of the result)
_SIGNATURES = {
    max_pool_p: ("jaxdnn_max_pool_fwd", ("x",), "y"),
    max_pool_gather_p: ("jaxdnn_max_pool_gather", ("x", "x"), "y"),
    max_pool_scatter_p: ("jaxdnn_max_pool_scatter", ("x", "y"), "x"),
    avg_pool_p: ("jaxdnn_avg_pool_fwd", ("x",), "y"),
    avg_pool_backward_p: ("jaxdnn_avg_pool_bwd", ("y",), "x"),
}
PRIMITIVE_NAMES = tuple(p.name for p in _SIGNATURES)
FFI_TARGETS = tuple(sig[0] for sig in _SIGNATURES.values())


def _abstract_eval(prim, *args, geometry):
  g = geometry
  name = prim.name
  rank = g.spatial_dims + 2
  for a in args:
    if a.ndim != rank:
      raise ValueError(f"{name}: operands must have rank {rank}, got shapes "
                       f"{[tuple(v.shape) for v in args]}")
    if np.dtype(a.dtype) not in algorithms.SUPPORTED_DTYPES:
      raise TypeError(f"{name}: unsupported dtype {a.dtype}")
    if a.dtype != args[0].dtype:
      raise TypeError(f"{name}: operands must share a dtype, got {[str(v.dtype) for v in args]}")
  _, operand_kinds, result_kind = _SIGNATURES[prim]
  n, c = g.batch_and_channels(args[0].shape)
  shapes = {"x": g.x_shape(n, c), "y": g.y_shape(n, c)}
  expected = tuple(shapes[k] for k in operand_kinds)
  if tuple(tuple(a.shape) for a in args) != expected:
    raise ValueError(f"{name}: operand shapes {[tuple(a.shape) for a in args]} do not match the "
                     f"geometry (expected {list(expected)})")
  return jax.core.ShapedArray(shapes[result_kind], args[0].dtype)


# ---------------------------------------------------------------------------------------------
# Binding helpers.

def max_pool(x, geometry: PoolGeometry):
  return max_pool_p.bind(x, geometry=geometry)


def max_pool_gather(x, t, geometry: PoolGeometry):
  return max_pool_gather_p.bind(x, t.astype(x.dtype), geometry=geometry)


def max_pool_scatter(x, dy, geometry: PoolGeometry):
  return max_pool_scatter_p.bind(x, dy.astype(x.dtype), geometry=geometry)


def avg_pool(x, geometry: PoolGeometry):
  return avg_pool_p.bind(x, geometry=geometry)


def avg_pool_backward(dy, geometry: PoolGeometry):
  return avg_pool_backward_p.bind(dy, geometry=geometry)


# ---------------------------------------------------------------------------------------------
# Differentiation.

def _max_pool_jvp(primals, tangents, *, geometry):
  (x,), (t,) = primals, tangents
  y = max_pool(x, geometry)
  if type(t) is ad.Zero:
    return y, ad.Zero.from_primal_value(y)
  return y, max_pool_gather(x, t, geometry)


def _selection_jvp(prim, primals, tangents, *, geometry):
  """JVP of G or S: linear in the second operand, locally constant in x (the selector)."""
  x, v = primals
  _, dv = tangents
  out = prim.bind(x, v, geometry=geometry)
  if type(dv) is ad.Zero:
    return out, ad.Zero.from_primal_value(out)
  return out, prim.bind(x, dv.astype(x.dtype), geometry=geometry)


def _selection_transpose(transposed_fn, ct, x, v, *, geometry):
  if ad.is_undefined_primal(x):
    raise ValueError("jaxdnn max pooling: the selecting input is not a linear operand")
  if type(ct) is ad.Zero:
    return [None, ad.Zero(v.aval)]
  return [None, transposed_fn(x, ct, geometry).astype(v.aval.dtype)]


ad.primitive_jvps[max_pool_p] = _max_pool_jvp
ad.primitive_jvps[max_pool_gather_p] = functools.partial(_selection_jvp, max_pool_gather_p)
ad.primitive_jvps[max_pool_scatter_p] = functools.partial(_selection_jvp, max_pool_scatter_p)
ad.primitive_transposes[max_pool_gather_p] = functools.partial(_selection_transpose,
                                                               max_pool_scatter)
ad.primitive_transposes[max_pool_scatter_p] = functools.partial(_selection_transpose,
                                                                max_pool_gather)


def _avg_transpose(ct, x, *, geometry):
  return [avg_pool_backward(ct.astype(x.aval.dtype), geometry)]


def _avg_backward_transpose(ct, dy, *, geometry):
  return [avg_pool(ct.astype(dy.aval.dtype), geometry)]


ad.deflinear2(avg_pool_p, _avg_transpose)
ad.deflinear2(avg_pool_backward_p, _avg_backward_transpose)


# ---------------------------------------------------------------------------------------------
# Batching: every operand has the batch axis first, so a vmapped axis folds into it (an
# unbatched operand of a two-operand primitive is broadcast first).

def _batch_rule(prim, batched_args, batch_dims, *, geometry):
  size = next(a.shape[d] for a, d in zip(batched_args, batch_dims) if d is not None)
  folded = []
  n = None
  for a, d in zip(batched_args, batch_dims):
    a = jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
    n = a.shape[1]
    folded.append(a.reshape(size * n, *a.shape[2:]))
  out = prim.bind(*folded, geometry=geometry)
  return out.reshape(size, n, *out.shape[1:]), 0


# ---------------------------------------------------------------------------------------------
# Lowering.

def _kernel_shape(shape, g: PoolGeometry):
  """Channels-first (N, C, spatial...) is N*C single-channel channels-last images."""
  return tuple(shape) if g.channels_last else (shape[0] * shape[1], *shape[2:], 1)


def _scatter_workspace_bytes(platform: str, g: PoolGeometry, y_elems: int) -> int:
  """Bytes of the scatter's arg-max workspace: one tap per output element, int32 on the CPU;
  on CUDA uint8 when the window has at most 255 taps, else int32 (cuda::pool_workspace_bytes)."""
  if platform == "cuda" and math.prod(g.window) <= 255:
    return y_elems
  return 4 * y_elems


def _is_global(g: PoolGeometry) -> bool:
  """One window over the whole input (pool_cpu.cc's is_global)."""
  return (all(o == 1 for o in g.out_spatial)
          and all(w == i and lo == 0 and (d == 1 or w == 1)
                  for w, i, lo, d in zip(g.window, g.in_spatial, g.pad_lo, g.dilation)))


def _units_outermost(shape):
  """Major-to-minor layout of `shape` with its unit dimensions outermost (row-major bytes)."""
  units = [d for d, n in enumerate(shape) if n == 1]
  if not units:
    return None
  return (*units, *(d for d, n in enumerate(shape) if n != 1))


def _ffi_impl(platform, prim, *args, geometry):
  g = geometry
  out_aval = _abstract_eval(prim, *(jax.typeof(a) for a in args), geometry=g)
  if 0 in out_aval.shape:
    return jnp.zeros(out_aval.shape, out_aval.dtype)
  target, _, _ = _SIGNATURES[prim]
  if (platform == "cpu" and not g.channels_last and prim is max_pool_scatter_p
      and not _is_global(g)):
    # The CPU arg-max scatter vectorizes over channels only: channels-first operands are
    # transposed to channels-last (two copies; far cheaper than one-channel scatter loops). The
    # gather (the JVP) has a one-channel kernel that vectorizes along the output rows, global
    # pooling has a one-channel scatter (pool_cpu.cc's global kernels), and the CUDA kernels run
    # one-channel images directly (one thread per pixel).
    to_last = (0, *range(2, len(out_aval.shape)), 1)
    last = dataclasses.replace(g, channels_last=True)
    out = _ffi_impl(platform, prim, *(jnp.transpose(a, to_last) for a in args), geometry=last)
    return jnp.transpose(out, np.argsort(to_last))
  kernel_args = [a.reshape(_kernel_shape(a.shape, g)) for a in args]
  results = [jax.ShapeDtypeStruct(_kernel_shape(out_aval.shape, g), out_aval.dtype)]
  if prim is max_pool_scatter_p:  # the arg-max taps of the outputs
    y_elems = int(np.prod(kernel_args[1].shape))
    results.append(jax.ShapeDtypeStruct((_scatter_workspace_bytes(platform, g, y_elems),),
                                        np.uint8))
  input_layouts = None
  if platform == "cpu" and not g.channels_last and np.dtype(out_aval.dtype).itemsize == 2:
    # Channels-first operands reach the kernels as (N*C, spatial..., 1). Where that unit
    # dimension sits in a layout moves no data, but XLA:CPU gives the reshape of a 16-bit operand
    # a layout with it outermost and then copies the whole operand into the row-major layout
    # the call asks for by default (float32 reshapes stay bitcasts). Asking for the unit
    # dimensions outermost (the same bytes) removes that copy of x (and of dy). An operand that
    # comes row-major straight from another jaxdnn pooling call (two channels-first pools in a
    # row, a pool's output fed back as a cotangent) is now the one copied.
    input_layouts = [_units_outermost(a.shape) for a in kernel_args]
  outs = jax.ffi.ffi_call(target, results, input_layouts=input_layouts)(*kernel_args,
                                                                       **g.ffi_attributes())
  return outs[0].reshape(out_aval.shape)


def _cpu_impl(prim, *args, geometry):
  return _ffi_impl("cpu", prim, *args, geometry=geometry)


def _cuda_impl(prim, *args, geometry):
  if jffi.extension("cuda") is None:  # also registers the CUDA targets
    raise NotImplementedError(f"{NO_CUDA_EXTENSION} ({prim.name}); rebuild jaxdnn with a CUDA "
                              f"compiler (JAXDNN_CUDA=ON) or run pooling on the CPU")
  return _ffi_impl("cuda", prim, *args, geometry=geometry)


@functools.lru_cache(maxsize=None)
def _jitted(prim, geometry):
  return jax.jit(lambda *args: prim.bind(*args, geometry=geometry))


def _eager_impl(prim, *args, geometry):
  return _jitted(prim, geometry)(*args)


for _prim in _SIGNATURES:
  _prim.def_impl(functools.partial(_eager_impl, _prim))
  _prim.def_abstract_eval(functools.partial(_abstract_eval, _prim))
  batching.primitive_batchers[_prim] = functools.partial(_batch_rule, _prim)
  mlir.register_lowering(_prim, mlir.lower_fun(functools.partial(_cpu_impl, _prim),
                                               multiple_results=False), platform="cpu")
  mlir.register_lowering(_prim, mlir.lower_fun(functools.partial(_cuda_impl, _prim),
                                               multiple_results=False), platform="cuda")
