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
