"""Lowering-only checks of the CUDA path; they run on CPU-only CI machines.

jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)) lowers for CUDA without a GPU; the
CUDA extension's trace-time queries (can_implement, workspace_bytes) run on the host.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import jaxdnn
from grid import NCHW, NCW, NDHWC, NHWC
from helpers import GENERAL_FAMILIES, algo_id, lax_conv64, problems, rand
from jaxdnn._src import algorithms, ffi
from tolerances import BF16, F32, assert_close, tolerance

CUDA = ffi.extension("cuda")
needs_cuda_extension = pytest.mark.skipif(
    CUDA is None, reason="the jaxdnn CUDA extension (_jaxdnn_cuda) is not built in this install")

TARGET_OF = {"forward": "jaxdnn_conv_fwd", "grad-lhs": "jaxdnn_conv_bwd_data",
             "grad-rhs": "jaxdnn_conv_bwd_filter"}


def _op_fn(op, conv, c):
  if op == "forward":
    return conv
  if op == "grad-lhs":
    return lambda x, w: jax.grad(lambda x: jnp.vdot(conv(x, w).astype(jnp.float32), c))(x)
  return lambda x, w: jax.grad(lambda w: jnp.vdot(conv(x, w).astype(jnp.float32), c))(w)


def _lower_cuda(fn, *args) -> str:
  return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _setup(shapes_kwargs, dtype, algo):
  x_shape, w_shape, kwargs = shapes_kwargs
  x, w = rand(x_shape, dtype, seed=1), rand(w_shape, dtype, seed=2)
  conv = functools.partial(jaxdnn.conv, **kwargs, algo=algo)
  y = jax.eval_shape(conv, x, w)
  c = jnp.ones(y.shape, jnp.float32)
  return x, w, conv, c


# NHWC 2-D 3x3, stride 1, pad 1, C = K = 8, N = 2: every CUDA family must take it.
SIMPLE = ((2, 6, 6, 8), (3, 3, 8, 8),
          dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC))
OTHERS = {
    "nchw-stride2": ((2, 8, 7, 7), (8, 8, 3, 3),
                     dict(window_strides=(2, 2), padding="SAME", dimension_numbers=NCHW)),
    "nhwc-groups2-dilated": ((2, 7, 7, 8), (3, 3, 4, 8),
                             dict(window_strides=(1, 1), padding="SAME", rhs_dilation=(2, 2),
                                  dimension_numbers=NHWC, feature_group_count=2)),
    "nhwc-depthwise": ((2, 6, 6, 8), (3, 3, 1, 8),
                       dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC,
                            feature_group_count=8)),
    "1d-ncw": ((2, 8, 9), (8, 8, 3), dict(window_strides=(1,), padding="SAME",
                                          dimension_numbers=NCW)),
    "3d-ndhwc": ((1, 4, 4, 4, 8), (2, 2, 2, 8, 8),
                 dict(window_strides=(1, 1, 1), padding="SAME", dimension_numbers=NDHWC)),
}

DTYPES = [pytest.param(F32, id="float32"), pytest.param(BF16, id="bfloat16")]
OPS = list(TARGET_OF)


def _check_lowering(text, op, algo):
  target = TARGET_OF[op]
  assert f"@{target}(" in text, f"no {target} custom call in the CUDA lowering"
  assert "convolution" not in text, "XLA convolution in the CUDA lowering"
  if op == "grad-lhs":
    assert "@jaxdnn_conv_bwd_filter(" not in text
  if op == "grad-rhs":
    assert "@jaxdnn_conv_bwd_data(" not in text
  if algo != "auto":
    assert f"algo = {algo.id} : i32" in text


@needs_cuda_extension
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", [*GENERAL_FAMILIES, "auto"], ids=algo_id)
def test_cuda_lowering_simple_geometry(algo, dtype, op):
  x, w, conv, c = _setup(SIMPLE, dtype, algo)
  fn = _op_fn(op, conv, c)
  if algo != "auto":
    for p_op, g, n, ch, k, kin, kout, prec in problems(fn, x, w):
      why = algorithms.unsupported_reason("cuda", p_op, algo, g, n, ch, k, kin, kout, prec)
      assert why == "", f"CUDA {algo.name} rejects the simple geometry ({p_op.name}): {why}"
  _check_lowering(_lower_cuda(fn, x, w), op, algo)


@needs_cuda_extension
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", list(OTHERS))
@pytest.mark.parametrize("algo", [*GENERAL_FAMILIES, "auto"], ids=algo_id)
def test_cuda_lowering_other_geometries(algo, case, op):
  x, w, conv, c = _setup(OTHERS[case], F32, algo)
  fn = _op_fn(op, conv, c)
  if algo != "auto":
    for p_op, g, n, ch, k, kin, kout, prec in problems(fn, x, w):
      why = algorithms.unsupported_reason("cuda", p_op, algo, g, n, ch, k, kin, kout, prec)
      if why:
        pytest.skip(f"CUDA {algo.name} {p_op.name}: {why}")
  _check_lowering(_lower_cuda(fn, x, w), op, algo)


@needs_cuda_extension
def test_cuda_kernel_less_family_refused_at_lowering():
  x, w, conv, _ = _setup(SIMPLE, F32, jaxdnn.ConvAlgo.FFT)
  with pytest.raises(ValueError, match="Families that can:"):
    _lower_cuda(conv, x, w)


@pytest.mark.skipif(CUDA is not None, reason="the CUDA extension is built")
def test_cuda_lowering_without_extension():
  """No CUDA kernels in this build: explicit families refuse, algo='auto' lowers to lax."""
  x, w, conv, _ = _setup(SIMPLE, F32, jaxdnn.ConvAlgo.GEMM)
  with pytest.raises(ValueError, match="no kernels for this platform"):
    _lower_cuda(conv, x, w)
  _, _, auto, _ = _setup(SIMPLE, F32, "auto")
  text = _lower_cuda(auto, x, w)
  assert "convolution" in text and "jaxdnn_conv" not in text


def test_lowering_platforms_api_available():
  """The public API these tests rely on exists in the installed jax."""
  x, w, _, _ = _setup(SIMPLE, F32, "auto")
  conv = lambda x, w: jaxdnn.conv(x, w, (1, 1), "SAME", dimension_numbers=NHWC)
  text = jax.jit(conv).trace(x, w).lower(lowering_platforms=("cpu",)).as_text()
  assert "@jaxdnn_conv_fwd(" in text


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", [*GENERAL_FAMILIES, "auto"], ids=algo_id)
def test_gpu_executes_jaxdnn_cuda_kernels(algo, dtype):
  """On a GPU machine: the CUDA extension is there, and the compiled program runs its kernels."""
  assert CUDA is not None, "GPU backend but no jaxdnn CUDA extension"
  x, w, conv, c = _setup(SIMPLE, dtype, algo)
  conv = functools.partial(conv, precision=lax.Precision.HIGHEST)
  fns = {op: _op_fn(op, conv, c) for op in OPS}
  for op, fn in fns.items():
    text = jax.jit(fn).lower(x, w).compile().as_text()
    assert f'custom_call_target="{TARGET_OF[op]}"' in text, op
  y = jax.jit(conv)(x, w)
  ref = lax_conv64(x, w, **SIMPLE[2])
  assert_close(y, ref, tolerance(dtype, precision=lax.Precision.HIGHEST), "forward")
