"""The CUDA FFT and FFT_TILING kernels (ffi/cuda/conv_fft.cu) on the host, without a GPU.

tests/cuda/fft/emulate.sh rewrites the kernel launches and dynamic shared memory into calls of an
emulated CUDA runtime (tests/cuda/emu: each block's 64 to 256 threads as cooperative fibers that
meet at real barriers), compiles the kernels, the dispatch (conv_cuda.cu) and their checker
(tests/cuda/fft/check.cu) with g++ under AddressSanitizer and UBSan, and checks its full geometry
set (odd sizes, padding beyond the filter, 1-3-D, groups, long 1-D filters, chunked spectra, empty
batches and outputs) in every dtype combination, float64 included, for both families and all
three operations, against a float64 host reference. It does not see nvcc's compile errors, the
device's rounding, CUDA graph replay or speed (the GPU runs tests/cuda/fft/run.sh). On a 2-core
host: the build about 15 s, the checks about 25 s.
"""

import pytest

from emulation import build, needs_gcc, run_checker

pytestmark = needs_gcc


@pytest.fixture(scope="module")
def emulated_checker(tmp_path_factory):
  """The checker and the kernels compiled once for the host (emulate.sh build)."""
  return build("tests/cuda/fft/emulate.sh", "FFT_EMU_DIR", tmp_path_factory.mktemp("fftemu"))


def test_fft_kernels_emulated_on_the_host(emulated_checker):
  launches = run_checker(emulated_checker, ["full"], min_runs=880, EMU_BLOCK_ORDER="shuffled")
  for kernel in ("fft_forward_kernel", "cgemm_kernel", "fft_inverse_kernel"):
    assert launches.get(kernel, 0) > 0, launches
