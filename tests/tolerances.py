"""Relative-error bounds, ||out - ref|| / ||ref||, used by every numerical comparison.

The reference is lax.conv_general_dilated at Precision.HIGHEST on the float64 casts of the very
same (already rounded) inputs, so the bound only covers jaxdnn's arithmetic and output rounding.
"""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

F64 = np.dtype(np.float64)
F32 = np.dtype(np.float32)
BF16 = np.dtype(jax.numpy.bfloat16)
F16 = np.dtype(np.float16)

RTOL = {
    F64: 1e-12,
    F32: 1e-5,   # float32 at HIGHEST precision, or on the CPU
    BF16: 2e-2,
    F16: 5e-3,
}
TF32_RTOL = 5e-3  # float32 at DEFAULT/HIGH precision on the GPU (TF32 tensor cores allowed)

# Stated bounds of the transform families, by result dtype. They equal RTOL (so `auto` may pick
# them under precision=HIGHEST), with the measured float32 errors against float64 for the record:
#   FFT, FFT_TILING: <= 4.4e-7 on the 3x3 / 5x5 layers of the benchmark sets and a 255-tap 1-D
#     filter, fwd / dgrad / wgrad (benchmarks/results/cpu-2core-fft-2026-11-30.md); the error
#     grows like log2 of the transform length, not with the filter size.
#   WINOGRAD_NONFUSED F(4x4,3x3): <= 4.2e-6 (CPU and H200 checkers); WINOGRAD F(2x2,3x3): <= 5e-7;
#   WINOGRAD's CUDA tensor-core F(4x4,3x3) (channels-last, channels per group % 8 == 0): <= 1.4e-6
#   on the checker's cases (emulated and on the H200), not yet swept against C/G.
ALGO_RTOL = {
    "fft": {F64: 1e-12, F32: 1e-5, BF16: 2e-2, F16: 5e-3},
    "fft_tiling": {F64: 1e-12, F32: 1e-5, BF16: 2e-2, F16: 5e-3},
    "winograd_nonfused": {F64: 1e-12, F32: 1e-5, BF16: 2e-2, F16: 5e-3},
    "winograd": {F64: 1e-12, F32: 1e-5, BF16: 2e-2, F16: 5e-3},
}
# WINOGRAD_NONFUSED with an explicit output tile (algo="winograd_nonfused_f{m}x{m}", a
# jaxdnn.TiledAlgo; its .value is the key). Float32 errors against float64, fwd / dgrad / wgrad
# (benchmarks/winograd_tile_errors.py on the CPU; the GPU checker tests/cuda/winograd/check.cu):
#   F(2x2): <= 5.1e-7 for C/G = 16 .. 2048 and on the 3x3 benchmark layers;
#   F(4x4): <= 3.4e-6 (as the default tile);
#   F(6x6): <= 6.6e-6 on the CPU (its blocked GEMM sums at most 256 channels at a time, so the
#     error stops growing past C/G = 256); the CUDA kernels on the H200 (check.cu's sweep,
#     3xTF32 tensor-core products summed per 32-deep slice) 3.2e-6 at C/G or K/G = 512, 4.3e-6
#     at 2048 (F(4x4) there: 1.7e-6 and 2.2e-6; F(2x2): <= 3.9e-7; the former FFMA kernel's
#     sequential sums gave F(6x6) 1.71e-5 at 2048). Its bound stays 5e-5: looser than 1e-5, so
#     `auto` never picks it (auto never picks an explicit tile at all). Float64: <= 1.2e-14,
#     bound 1e-12 as every family.
# bfloat16 / float16 results: the output rounding dominates (the kernels compute in float32).
TILE_RTOL = {
    2: {F64: 1e-12, F32: 1e-5, BF16: 2e-2, F16: 5e-3},
    4: {F64: 1e-12, F32: 1e-5, BF16: 2e-2, F16: 5e-3},
    6: {F64: 1e-12, F32: 5e-5, BF16: 2e-2, F16: 5e-3},
}
ALGO_RTOL.update({f"winograd_nonfused_f{m}x{m}": table for m, table in TILE_RTOL.items()})


def _is_highest(precision) -> bool:
  if precision is None:
    default = jax.config.jax_default_matmul_precision
    if default is None:
      return False
    precision = default
  pair = precision if isinstance(precision, (tuple, list)) else (precision, precision)
  return all(p is not None and lax.Precision(p) == lax.Precision.HIGHEST for p in pair)


def tolerance(in_dtype, out_dtype=None, precision=None, platform: str | None = None,
              algo=None) -> float:
  """Bound for a convolution of `in_dtype` operands producing `out_dtype` (by family `algo`, a
  jaxdnn.ConvAlgo or jaxdnn.TiledAlgo or its value, when given).

  A wider result type is computed in that type (the operands are cast up exactly); float32
  operands computed in float32 on the GPU may use TF32 unless the precision is HIGHEST.
  """
  if platform is None:
    platform = jax.default_backend()
  in_dtype = np.dtype(in_dtype)
  out_dtype = in_dtype if out_dtype is None else np.dtype(out_dtype)
  table = ALGO_RTOL.get(getattr(algo, "value", algo), RTOL)
  tol = table[out_dtype]
  compute = out_dtype if out_dtype.itemsize > in_dtype.itemsize else in_dtype
  if compute == F32 and in_dtype == F32 and platform != "cpu" and not _is_highest(precision):
    tol = max(tol, TF32_RTOL)
  return tol


def relative_error(out, ref) -> float:
  out = np.asarray(out, dtype=np.float64)
  ref = np.asarray(ref, dtype=np.float64)
  ref_norm = np.linalg.norm(ref.ravel())
  err = np.linalg.norm((out - ref).ravel())
  if ref_norm == 0:
    return float(err)
  return float(err / ref_norm)


def assert_close(out, ref, tol: float, what: str = "result") -> None:
  out_shape, ref_shape = np.shape(out), np.shape(ref)
  assert out_shape == ref_shape, f"{what}: shape {out_shape} != reference shape {ref_shape}"
  out64 = np.asarray(out, dtype=np.float64)
  assert np.all(np.isfinite(out64)), f"{what}: non-finite values"
  if out64.size == 0:
    return
  err = relative_error(out64, ref)
  assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"
