"""Lowering-only checks of the CUDA path; they run on CPU-only CI machines.

jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)) lowers for CUDA without a GPU; the
CUDA extension's trace-time queries (can_implement, workspace_bytes) run on the host.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import jaxdnn
from grid import NCHW, NCW, NDHWC, NHWC
from helpers import GENERAL_FAMILIES, algo_id, lax_conv64, problems, rand
from jaxdnn._src.geometry import ConvOp
from jaxdnn._src import algorithms, ffi
from tolerances import BF16, F32, F64, assert_close, tolerance

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


WINOGRADS = [jaxdnn.ConvAlgo.WINOGRAD_NONFUSED, jaxdnn.ConvAlgo.WINOGRAD]


@needs_cuda_extension
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [*DTYPES, pytest.param(F64, id="float64")])
@pytest.mark.parametrize("algo", [jaxdnn.ConvAlgo.FFT, jaxdnn.ConvAlgo.FFT_TILING,
                                  *WINOGRADS], ids=algo_id)
def test_cuda_lowering_fast_families(algo, dtype, op):
  """The FFT and Winograd families take the 3x3 stride-1 problem on CUDA in all three
  operations, with a workspace operand sized at trace time, and lower to the CUDA targets. The
  Winograd forward and backward-data take the transformed filter from a jaxdnn_winograd_filter
  call (the fused family then needs no workspace at all)."""
  x, w, conv, c = _setup(SIMPLE, dtype, algo)
  fn = _op_fn(op, conv, c)
  uses_u = False
  for p_op, g, n, ch, k, kin, kout, prec in problems(fn, x, w):
    why = algorithms.unsupported_reason("cuda", p_op, algo, g, n, ch, k, kin, kout, prec)
    assert why == "", f"CUDA {algo.name} rejects the simple geometry ({p_op.name}): {why}"
    ws = algorithms.workspace_bytes("cuda", p_op, algo, g, n, ch, k, kin, kout, prec)
    takes_u = algo in WINOGRADS and p_op != ConvOp.BACKWARD_FILTER
    uses_u |= takes_u
    assert ws == 0 if (takes_u and algo == jaxdnn.ConvAlgo.WINOGRAD) else ws > 0
  text = _lower_cuda(fn, x, w)
  _check_lowering(text, op, algo)
  # grad-rhs: only backward-filter (x, dy) remains; jax drops the unused forward (and its
  # transform) before lowering.
  assert ("@jaxdnn_winograd_filter(" in text) == (uses_u and op != "grad-rhs")


def _filter_transform_shape(text):
  """The result type of the one jaxdnn_winograd_filter call in a lowering, e.g. "36x1x8x8xf32"."""
  shapes = re.findall(r"@jaxdnn_winograd_filter\(.*?-> tensor<([0-9x]+x\w+)>", text)
  assert len(shapes) == 1, shapes
  return shapes[0]


@needs_cuda_extension
@pytest.mark.parametrize("case,dtype,want", [
    ("nhwc", F32, "36x1x8x8xf32"), ("nhwc", BF16, "36x1x8x8xf32"),  # F(4x4) tensor-core kernel
    ("nhwc", F64, "16x1x8x8xf64"),      # float64: F(2x2) in DFMA
    ("nchw", F32, "16x1x8x8xf32"),      # channels-first: F(2x2)
    ("nhwc-c12", F32, "16x1x16x16xf32"),  # 12 channels, not a multiple of 8: F(2x2)
    ("nhwc-3x3", F32, "16x1x8x8xf32"),  # output smaller than one 4x4 tile: F(2x2)
])
def test_cuda_fused_winograd_tile(case, dtype, want):
  """CUDA WINOGRAD runs F(4x4,3x3) on the tensor cores where that kernel applies (channels-last,
  32/16-bit, channels per group a multiple of 8, outputs of at least 4x4) and F(2x2,3x3)
  otherwise; the transformed filter the forward takes has the tile's a*a points."""
  shapes = {"nhwc": ((2, 6, 6, 8), (3, 3, 8, 8), NHWC), "nchw": ((2, 8, 6, 6), (8, 8, 3, 3), NCHW),
            "nhwc-c12": ((2, 6, 6, 12), (3, 3, 12, 12), NHWC),
            "nhwc-3x3": ((2, 3, 3, 8), (3, 3, 8, 8), NHWC)}
  x_shape, w_shape, dn = shapes[case]
  x, w = rand(x_shape, dtype, seed=1), rand(w_shape, dtype, seed=2)
  conv = functools.partial(jaxdnn.conv, window_strides=(1, 1), padding="SAME",
                           dimension_numbers=dn, algo=jaxdnn.ConvAlgo.WINOGRAD)
  assert _filter_transform_shape(_lower_cuda(conv, x, w)) == want


@needs_cuda_extension
@pytest.mark.parametrize("algo", [jaxdnn.ConvAlgo.FFT, jaxdnn.ConvAlgo.FFT_TILING],
                         ids=algo_id)
def test_cuda_fft_families_refused_at_lowering_when_strided(algo):
  x, w, conv, _ = _setup(OTHERS["nchw-stride2"], F32, algo)
  with pytest.raises(ValueError, match=rf"{algo.name} needs window_strides 1.*Families that can:"):
    _lower_cuda(conv, x, w)


@needs_cuda_extension
@pytest.mark.parametrize("case,reason", [("nchw-stride2", "window_strides 1"),
                                         ("nhwc-groups2-dilated", "rhs_dilation 1"),
                                         ("1d-ncw", "3x3 filter"), ("3d-ndhwc", "3x3 filter")])
@pytest.mark.parametrize("algo", WINOGRADS, ids=algo_id)
def test_cuda_winograd_refusals(algo, case, reason):
  x, w, conv, _ = _setup(OTHERS[case], F32, algo)
  with pytest.raises(ValueError, match=reason):
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
@pytest.mark.parametrize("algo", [*GENERAL_FAMILIES, jaxdnn.ConvAlgo.WINOGRAD_NONFUSED, "auto"],
                         ids=algo_id)
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


# ---------------------------------------------------------------------------------------------
# Pooling: every pooling primitive lowers to its jaxdnn custom call for CUDA, channels-first
# arrays included (the CUDA kernels take them as one-channel images: no transposes).

def _pool_fns(layout):
  kw = dict(window_shape=(3, 3), strides=(2, 2), padding="SAME", layout=layout)
  max_pool = lambda x: jaxdnn.max_pool(x, **kw)
  avg_pool = lambda x: jaxdnn.avg_pool(x, count_include_pad=False, **kw)
  return {
      "max_fwd": (max_pool, ["jaxdnn_max_pool_fwd"]),
      "max_jvp": (lambda x: jax.jvp(max_pool, (x,), (x,)),
                  ["jaxdnn_max_pool_fwd", "jaxdnn_max_pool_gather"]),
      "max_grad": (jax.grad(lambda x: jnp.sum(max_pool(x))), ["jaxdnn_max_pool_scatter"]),
      "avg_fwd": (avg_pool, ["jaxdnn_avg_pool_fwd"]),
      "avg_grad": (jax.grad(lambda x: jnp.sum(avg_pool(x))), ["jaxdnn_avg_pool_bwd"]),
      "global_avg": (lambda x: jaxdnn.global_avg_pool(x, layout=layout),
                     ["jaxdnn_avg_pool_fwd"]),
      "global_max_grad": (jax.grad(lambda x: jnp.sum(jaxdnn.global_max_pool(x, layout=layout))),
                          ["jaxdnn_max_pool_scatter"]),
  }


def _pool_calls(text):
  return sorted(c for c in re.findall(r"stablehlo\.custom_call @(\w+)", text) if "pool" in c)


@needs_cuda_extension
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("name", list(_pool_fns("NHWC")))
def test_cuda_lowering_pooling(name, layout, dtype):
  fn, calls = _pool_fns(layout)[name]
  x = rand((2, 9, 8, 16) if layout == "NHWC" else (2, 16, 9, 8), dtype, seed=3)
  text = _lower_cuda(fn, x)
  assert _pool_calls(text) == sorted(calls)
  assert "reduce_window" not in text and "select_and_scatter" not in text
  assert "transpose" not in text


@needs_cuda_extension
@pytest.mark.parametrize("window,ws_bytes_per_output", [((3, 3), 1), ((16, 16), 4)])
def test_cuda_lowering_pool_scatter_workspace(window, ws_bytes_per_output):
  """The CUDA scatter's arg-max workspace: uint8 taps up to 255 window taps, else int32."""
  x = rand((2, 16, 16, 8), F32, seed=4)
  fn = jax.grad(lambda x: jnp.sum(jaxdnn.max_pool(x, window, (1, 1), "SAME")))
  text = _lower_cuda(fn, x)
  assert f"tensor<{ws_bytes_per_output * x.size}xui8>" in text


@pytest.mark.skipif(CUDA is not None, reason="the CUDA extension is built")
def test_cuda_lowering_pooling_without_extension():
  x = rand((2, 6, 6, 3), F32)
  with pytest.raises(NotImplementedError, match="built without its CUDA extension"):
    _lower_cuda(lambda x: jaxdnn.max_pool(x, (2, 2)), x)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_gpu_executes_jaxdnn_pool_kernels(layout):
  """On a GPU machine the compiled program runs the jaxdnn pooling kernels."""
  assert CUDA is not None, "GPU backend but no jaxdnn CUDA extension"
  x = rand((2, 9, 8, 16) if layout == "NHWC" else (2, 16, 9, 8), F32, seed=5)
  for name, (fn, calls) in _pool_fns(layout).items():
    text = jax.jit(fn).lower(x).compile().as_text()
    for call in calls:
      assert f'custom_call_target="{call}"' in text, (name, call)
