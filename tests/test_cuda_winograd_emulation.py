"""The CUDA Winograd kernels (ffi/cuda/conv_winograd.cu) on the host, without a GPU.

tests/cuda/winograd/emulate.sh rewrites the kernel launches into calls of an emulated CUDA runtime
(tests/cuda/winograd/emu: a block's threads as cooperative fibers, shared memory, barriers, cp.async,
mma.sync and ldmatrix by a lane exchange, mma operands read as tf32), compiles the kernels and their checker with g++ under
AddressSanitizer and UBSan, and checks every WINOGRAD / WINOGRAD_NONFUSED variant, dtype and
op of the quick geometry set against a float64 reference (there the fp32 NONFUSED GEMM runs the
SIMT kernel; the tensor-core GEMM, slow to emulate, is checked on one case with JAXDNN_WINO_GEMM=mma). This is the only CPU-side check of the
CUDA kernels' index math and schedules; it does not see nvcc's compile errors, device rounding or
speed (the GPU runs tests/cuda/winograd/run.sh). On a 2-core host: the build about 25-35 s, the quick
set about 57 s, the tensor-core case about 24 s (228 s and 135 s with one OS thread per emulated
thread, 99 s and 74 s with ucontext fibers: tests/cuda/emu_fibers.h).
"""

import pytest

from emulation import build, needs_gcc, run_checker

pytestmark = needs_gcc


@pytest.fixture(scope="module")
def emulated_checker(tmp_path_factory):
  """The checker and the kernels compiled once for the host (emulate.sh build)."""
  return build("tests/cuda/winograd/emulate.sh", "WINO_EMU_DIR", tmp_path_factory.mktemp("winoemu"))


def _run(checker, mode, min_runs, **env):
  """Runs the checker; returns its kernel launch counts ({name: launches})."""
  return run_checker(checker, [mode], min_runs=min_runs, **env)


def test_cuda_winograd_kernels_emulated_on_the_host(emulated_checker):
  launches = _run(emulated_checker, "quick", 400)
  # Every family's kernels ran; the float GEMMs on the SIMT kernel (the host's default).
  for kernel in ("fused_kernel", "gemm_kernel", "input_transform_kernel", "output_transform_kernel"):
    assert launches.get(kernel, 0) > 0, launches
  assert "gemm_tc_kernel" not in launches, launches


def test_tensor_core_gemm_emulated_on_the_host(emulated_checker):
  """The 3xTF32 mma.sync GEMM (gemm_tc_kernel: operand split, fragment mapping, the m-major and
  k-major A tiles, zero fill) on one case, slow to emulate: partial row, column and K blocks, in
  every float32 variant and op."""
  launches = _run(emulated_checker, "full", 14, WINO_CASE="nhwc_c40_k136", WINO_DTYPES="f32",
                  JAXDNN_WINO_GEMM="mma")
  # Every float32 GEMM on the tensor-core kernel, none on the SIMT one.
  assert launches.get("gemm_tc_kernel", 0) > 0 and "gemm_kernel" not in launches, launches
