"""The CUDA DIRECT kernels (ffi/cuda/conv_direct.cu) on the host, without a GPU.

tests/cuda/direct/emulate.sh rewrites the kernel launches and dynamic shared memory into calls of
an emulated CUDA runtime (tests/cuda/emu: a block's threads as cooperative fibers), compiles the
kernels, the dispatch (conv_cuda.cu) and their checker (tests/cuda/direct/check.cu) with g++ under
AddressSanitizer and UBSan, and checks its full geometry set (general, depthwise and grouped
paths; strides, dilation, lhs dilation, padding, 1-3-D, NHWC/NCHW, empty batches and outputs) in
every dtype combination, forward, backward-data and backward-filter, against a float64 reference.
DIRECT is what `auto` takes on the GPU for depthwise, grouped and transposed convolutions. It
does not see nvcc's compile errors, the device's rounding, CUDA graph replay or speed (the GPU
runs tests/cuda/direct/run.sh). On a 2-core host: the build about 30 s, the checks about 12 s.
"""

import pytest

from emulation import build, needs_gcc, run_checker

pytestmark = needs_gcc


@pytest.fixture(scope="module")
def emulated_checker(tmp_path_factory):
  """The checker and the kernels compiled once for the host (emulate.sh build)."""
  return build("tests/cuda/direct/emulate.sh", "DIRECT_EMU_DIR", tmp_path_factory.mktemp("directemu"))


def test_direct_kernels_emulated_on_the_host(emulated_checker):
  launches = run_checker(emulated_checker, ["full"], min_runs=1300)
  for kernel in ("gen_fwd_kernel", "gen_bwd_data_kernel", "gen_wgrad_kernel", "colsum_kernel",
                 "dw_kernel", "dw_wgrad_kernel", "dws_kernel", "dws_wgrad_kernel", "grp_kernel",
                 "grp_wgrad_kernel"):
    assert launches.get(kernel, 0) > 0, launches


def test_direct_row_wgrad_and_block_order(emulated_checker):
  """The row-at-a-time depthwise backward-filter kernels (JAXDNN_DWS_WGRAD_ROWS=1), with the
  blocks in reverse and shuffled order."""
  for order in ("reverse", "shuffled"):
    launches = run_checker(emulated_checker, ["quick"], min_runs=160, JAXDNN_DWS_WGRAD_ROWS="1",
                           EMU_BLOCK_ORDER=order)
    assert launches.get("dws_wgrad_rows_kernel", 0) > 0, launches
