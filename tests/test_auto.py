"""The `auto` rule: a cheap choice among the families that support the problem."""

import numpy as np
import pytest

from jaxdnn import ConvAlgo, MathPrecision
from jaxdnn._src.algorithms import AUTO, choose_algorithm
from jaxdnn._src.geometry import ConvGeometry, ConvOp, Layout


def _geometry(size, filt, stride=1, groups=1):
  return ConvGeometry(Layout.NHWC, (size, size), (filt, filt), (stride, stride), (1, 1), (1, 1),
                      (filt // 2,) * 2, (filt // 2,) * 2, groups)


# (op, geometry, N, C, K) -> the CPU pick (tuned on benchmarks/results/cpu-*.md)
CPU_CASES = [
    ("depthwise", ConvOp.FORWARD, _geometry(56, 3, groups=144), 4, 144, 144, ConvAlgo.DIRECT),
    ("depthwise-wgrad", ConvOp.BACKWARD_FILTER, _geometry(56, 3, groups=144), 4, 144, 144,
     ConvAlgo.DIRECT),
    ("resnext", ConvOp.BACKWARD_DATA, _geometry(56, 3, groups=32), 4, 128, 128, ConvAlgo.DIRECT),
    ("mnist-c1", ConvOp.FORWARD, _geometry(28, 5), 64, 1, 32, ConvAlgo.DIRECT),
    ("pointwise", ConvOp.FORWARD, _geometry(56, 1), 4, 64, 256, ConvAlgo.GEMM),
    ("pointwise-wgrad", ConvOp.BACKWARD_FILTER, _geometry(7, 1), 4, 512, 2048, ConvAlgo.GEMM),
    ("dense-3x3", ConvOp.FORWARD, _geometry(56, 3), 4, 64, 64, ConvAlgo.WINOGRAD_NONFUSED),
    ("narrow-3x3", ConvOp.FORWARD, _geometry(56, 3), 4, 32, 32, ConvAlgo.DIRECT),
    ("strided-dgrad", ConvOp.BACKWARD_DATA, _geometry(56, 3, stride=2), 4, 128, 128,
     ConvAlgo.IMPLICIT_GEMM),
    ("big-filter-wgrad", ConvOp.BACKWARD_FILTER, _geometry(14, 3), 4, 256, 256,
     ConvAlgo.WINOGRAD_NONFUSED),
    ("big-filter-wgrad-5x5", ConvOp.BACKWARD_FILTER, _geometry(14, 5), 4, 256, 256,
     ConvAlgo.IMPLICIT_PRECOMP_GEMM),
    ("many-pixels-wgrad", ConvOp.BACKWARD_FILTER, _geometry(56, 3), 4, 64, 64,
     ConvAlgo.WINOGRAD_NONFUSED),
    ("many-pixels-wgrad-5x5", ConvOp.BACKWARD_FILTER, _geometry(56, 5), 4, 64, 64,
     ConvAlgo.FFT_TILING),
    ("inception-5x5", ConvOp.FORWARD, _geometry(28, 5), 4, 32, 64, ConvAlgo.FFT_TILING),
    ("inception-5x5-dgrad", ConvOp.BACKWARD_DATA, _geometry(28, 5), 4, 32, 64,
     ConvAlgo.FFT_TILING),
    ("7x7-wgrad", ConvOp.BACKWARD_FILTER, _geometry(28, 7), 4, 64, 64, ConvAlgo.FFT_TILING),
    ("strided-5x5", ConvOp.FORWARD, _geometry(28, 5, stride=2), 4, 32, 64, ConvAlgo.DIRECT),
    ("audio-1d-255", ConvOp.FORWARD,
     ConvGeometry(Layout.NHWC, (16384,), (255,), (1,), (1,), (1,), (127,), (127,)), 8, 16, 16,
     ConvAlgo.FFT_TILING),
    ("1d-5-taps", ConvOp.FORWARD,
     ConvGeometry(Layout.NHWC, (4096,), (5,), (1,), (1,), (1,), (2,), (2,)), 8, 16, 16,
     ConvAlgo.DIRECT),
    ("strided-3x3-fwd", ConvOp.FORWARD, _geometry(56, 3, stride=2), 4, 128, 128, ConvAlgo.DIRECT),
]


@pytest.mark.parametrize("name, op, g, n, c, k, expected", CPU_CASES, ids=[c[0] for c in CPU_CASES])
def test_cpu_auto_rule(name, op, g, n, c, k, expected):
  got = choose_algorithm("cpu", op, AUTO, g, n, c, k, np.float32, np.float32,
                         MathPrecision.DEFAULT)
  assert got == expected, name


def test_explicit_choice_is_kept():
  g = _geometry(8, 3)
  for algo in (ConvAlgo.DIRECT, ConvAlgo.GEMM, ConvAlgo.IMPLICIT_GEMM,
               ConvAlgo.IMPLICIT_PRECOMP_GEMM):
    assert choose_algorithm("cpu", ConvOp.FORWARD, algo, g, 2, 8, 8, np.float32, np.float32,
                            MathPrecision.DEFAULT) is algo


# (op, geometry, C, K, dtype, precision) -> the first family of the GPU order: WINOGRAD_NONFUSED
# only where the CPU rule picks it (3x3, >= 64 channels per group in and out) and only for
# float32 at precision=HIGHEST (its 1e-5 bound qualifies; elsewhere tensor-core GEMMs win).
GPU_CASES = [
    ("3x3-highest", ConvOp.FORWARD, _geometry(56, 3), 256, 256, np.float32,
     MathPrecision.HIGHEST, ConvAlgo.WINOGRAD_NONFUSED),
    ("3x3-highest-wgrad", ConvOp.BACKWARD_FILTER, _geometry(28, 3), 128, 128, np.float32,
     MathPrecision.HIGHEST, ConvAlgo.WINOGRAD_NONFUSED),
    ("3x3-highest-dgrad", ConvOp.BACKWARD_DATA, _geometry(7, 3), 512, 512, np.float32,
     MathPrecision.HIGHEST, ConvAlgo.WINOGRAD_NONFUSED),
    ("3x3-default", ConvOp.FORWARD, _geometry(56, 3), 256, 256, np.float32,
     MathPrecision.DEFAULT, ConvAlgo.IMPLICIT_PRECOMP_GEMM),
    ("3x3-high", ConvOp.FORWARD, _geometry(56, 3), 256, 256, np.float32,
     MathPrecision.HIGH, ConvAlgo.IMPLICIT_PRECOMP_GEMM),
    ("3x3-bf16", ConvOp.FORWARD, _geometry(56, 3), 256, 256, "bfloat16",
     MathPrecision.HIGHEST, ConvAlgo.IMPLICIT_PRECOMP_GEMM),
    ("3x3-narrow", ConvOp.FORWARD, _geometry(56, 3), 32, 64, np.float32,
     MathPrecision.HIGHEST, ConvAlgo.IMPLICIT_PRECOMP_GEMM),
    # FFT_TILING 0.116 ms on inc_5x5 against IMPLICIT_PRECOMP_GEMM's 0.165 (H200, fp32 HIGHEST)
    ("5x5-highest", ConvOp.FORWARD, _geometry(28, 5), 64, 64, np.float32,
     MathPrecision.HIGHEST, ConvAlgo.FFT_TILING),
    ("5x5-default", ConvOp.FORWARD, _geometry(28, 5), 64, 64, np.float32,
     MathPrecision.DEFAULT, ConvAlgo.IMPLICIT_PRECOMP_GEMM),
]


@pytest.mark.parametrize("name, op, g, c, k, dtype, prec, expected", GPU_CASES,
                         ids=[c[0] for c in GPU_CASES])
def test_gpu_auto_order(name, op, g, c, k, dtype, prec, expected):
  import jax.numpy as jnp
  from jaxdnn._src.algorithms import _heuristic_order
  dtype = jnp.dtype(dtype)
  assert _heuristic_order("cuda", op, g, 32, c, k, dtype, prec)[0] == expected, name


def test_gpu_auto_skips_winograd_where_unsupported():
  """A strided 3x3 layer at HIGHEST: Winograd heads the order but refuses, a GEMM runs."""
  from jaxdnn._src import ffi
  if ffi.extension("cuda") is None:
    pytest.skip("the CUDA extension is not built")
  for stride, expected in ((2, None), (1, ConvAlgo.WINOGRAD_NONFUSED)):
    got = choose_algorithm("cuda", ConvOp.FORWARD, AUTO, _geometry(28, 3, stride=stride), 8,
                           128, 128, np.float32, np.float32, MathPrecision.HIGHEST)
    assert (got != ConvAlgo.WINOGRAD_NONFUSED) if expected is None else (got == expected)
