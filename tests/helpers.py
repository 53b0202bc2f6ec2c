"""Helpers shared by the tests: inputs, the lax oracle, and per-backend algorithm support."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jex_core

import jaxdnn
from jaxdnn._src import algorithms
from jaxdnn._src.geometry import ConvOp
from jaxdnn._src.primitives import conv as prims

PLATFORM = jax.default_backend()  # "cpu" or "gpu"
LOWERING_PLATFORM = {"gpu": "cuda"}.get(PLATFORM, PLATFORM)

# Families with kernels for every geometry, on both backends.
GENERAL_FAMILIES = (
    jaxdnn.ConvAlgo.DIRECT,
    jaxdnn.ConvAlgo.GEMM,
    jaxdnn.ConvAlgo.IMPLICIT_GEMM,
    jaxdnn.ConvAlgo.IMPLICIT_PRECOMP_GEMM,
)
# The families with CPU kernels (all eight): the general ones, WINOGRAD_NONFUSED (2-D 3x3 filters,
# stride 1, no dilation), WINOGRAD (the same geometry), FFT and
# FFT_TILING (stride 1, no dilation, any filter). Tests skip the problems a family refuses through
# require_supported.
FAMILIES = (*GENERAL_FAMILIES, jaxdnn.ConvAlgo.WINOGRAD_NONFUSED, jaxdnn.ConvAlgo.WINOGRAD,
            jaxdnn.ConvAlgo.FFT, jaxdnn.ConvAlgo.FFT_TILING)
# The families that refuse some geometries (strided, dilated, ...) on the CPU; a 3x3 convolution
# with stride 2 is refused by all of them.
RESTRICTED = tuple(a for a in FAMILIES if a not in GENERAL_FAMILIES)
FFT_FAMILIES = (jaxdnn.ConvAlgo.FFT, jaxdnn.ConvAlgo.FFT_TILING)
# The per-family suites (grid, grads, vmap, jit, nn) loop over these. FFT and FFT_TILING share
# every kernel but the tile plan (on the suites' small images FFT_TILING mostly plans one tile,
# as FFT does), so the suites run FFT_TILING and tests/test_fft.py runs both on its own cases.
ALGOS = (*(a for a in FAMILIES if a is not jaxdnn.ConvAlgo.FFT), "auto")


def algo_id(algo) -> str:
  return algo if isinstance(algo, str) else algo.value


algo_params = pytest.mark.parametrize("algo", ALGOS, ids=algo_id)

_PRIM_OPS = {
    "jaxdnn_conv_forward": ConvOp.FORWARD,
    "jaxdnn_conv_backward_data": ConvOp.BACKWARD_DATA,
    "jaxdnn_conv_backward_filter": ConvOp.BACKWARD_FILTER,
}


# ---------------------------------------------------------------------------------------------
# Inputs and the oracle.

def rand(shape, dtype=np.float64, seed=0):
  """Standard-normal values rounded to `dtype`."""
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.standard_normal(shape)).astype(dtype)


def f64(a):
  return jnp.asarray(np.asarray(a, dtype=np.float64))


def lax_conv64(lhs, rhs, *args, **kwargs):
  """The oracle: lax.conv_general_dilated at HIGHEST on the float64 casts of the inputs."""
  kwargs = dict(kwargs)
  kwargs.pop("preferred_element_type", None)
  kwargs["precision"] = lax.Precision.HIGHEST
  return lax.conv_general_dilated(f64(lhs), f64(rhs), *args, **kwargs)


def lax_conv_hi(lhs, rhs, *args, **kwargs):
  """lax.conv_general_dilated at HIGHEST precision (for use inside transformed functions)."""
  kwargs = dict(kwargs)
  kwargs["precision"] = lax.Precision.HIGHEST
  return lax.conv_general_dilated(lhs, rhs, *args, **kwargs)


# ---------------------------------------------------------------------------------------------
# What jaxdnn binds, and whether the backend can run it.

def _walk(jaxpr):
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jex_core.jaxprs_in_params(eqn.params):
      yield from _walk(sub)


def jaxdnn_eqns(fn, *args):
  """The jaxdnn primitive equations (recursively) of fn's jaxpr."""
  closed = jax.make_jaxpr(fn)(*args)
  return [e for e in _walk(closed.jaxpr) if e.primitive.name in _PRIM_OPS]


def count_primitives(fn, *args) -> dict[str, int]:
  counts = {name: 0 for name in _PRIM_OPS}
  for e in jaxdnn_eqns(fn, *args):
    counts[e.primitive.name] += 1
  return counts


def problems(fn, *args):
  """(op, geometry, N, C, K, kernel in dtype, kernel out dtype, precision) the kernels will see."""
  out = []
  for e in jaxdnn_eqns(fn, *args):
    op = _PRIM_OPS[e.primitive.name]
    a, b = (v.aval for v in e.invars)
    g = e.params["geometry"]
    n, c, k = prims.problem_sizes(op, a.shape, b.shape, g)
    if c == 0 or k == 0:
      continue  # never reaches a kernel
    kin, kout = prims._kernel_dtypes(a.dtype, e.params["out_dtype"])
    out.append((op, g, n, c, k, kin, kout, e.params["precision"]))
  return out


def unsupported(algo, fn, *args, platform: str = LOWERING_PLATFORM) -> str:
  """"" when `algo` can run every jaxdnn operation of fn(*args) on `platform`, else why not."""
  if algo == "auto":
    return ""
  for op, g, n, c, k, kin, kout, prec in problems(fn, *args):
    why = algorithms.unsupported_reason(platform, op, algo, g, n, c, k, kin, kout, prec)
    if why:
      return f"{algo.name} {op.name}: {why}"
  return ""


def require_supported(algo, fn, *args):
  """Skips the test when the current backend rejects `algo` for a problem fn(*args) binds."""
  why = unsupported(algo, fn, *args)
  if why:
    pytest.skip(f"{PLATFORM} backend: {why}")


def listed_families(msg: str) -> set[str]:
  """The family names after "Families that can:" in a refusal."""
  tail = msg.split("Families that can:")[1].split("(or")[0]
  return {name.strip(" .") for name in tail.split(",")}


def general_families_for(lhs_dilation=None, window_strides=None) -> tuple:
  """The general families that take a problem with this lhs_dilation on the current backend:
  all four, except that the CUDA GEMM families take lhs_dilation > 1 only with unit window
  strides (as the backward-data of a strided convolution; DIRECT takes every case)."""
  if (LOWERING_PLATFORM == "cuda" and lhs_dilation is not None and max(lhs_dilation) > 1 and
      window_strides is not None and max(window_strides) > 1):
    return (jaxdnn.ConvAlgo.DIRECT,)
  return GENERAL_FAMILIES
