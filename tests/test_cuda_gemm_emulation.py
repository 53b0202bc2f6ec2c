"""The CUDA GEMM-family kernels (IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM: ffi/cuda/
conv_gemm_kernel.cuh, conv_gemm_family.cu) on the host, without a GPU.

tests/cuda/gemm_family/emulate.sh rewrites the kernel launches and the dynamic shared memory into
calls of an emulated CUDA runtime (tests/cuda/emu: a block's threads as cooperative fibers;
tests/cuda/gemm_family/emu: cp.async, ldmatrix and mma.sync by a lane exchange), compiles the kernels and their
checker (tests/cuda/gemm_family/check.cu) with g++ under AddressSanitizer and UBSan, and checks
every dtype combination, operation, family and layout against a float64 reference, with the fused
epilogue on every forward and a rerun for determinism. The emulated device has no wgmma, so this
covers the mma.sync / TF32 / FFMA / DFMA paths that pre-Hopper GPUs, backward-filter, strided
backward-data and float32 at HIGHEST precision run; the wgmma kernels run only on the GPU
(tests/cuda/gemm_family/run.sh). It does not see nvcc's compile errors, the tensor cores' rounding
or speed. On a 2-core host: the build about 45 s, the checks below about 60 s.
"""

import pytest

from emulation import build, needs_gcc, run_checker

pytestmark = needs_gcc

# Small cases of check.cu's set: stride 2 with asymmetric padding, 1-D, groups, 3-D, negative
# padding, a transposed convolution's strided view (stride (2, 3), dilation 2, negative padding:
# the problem jaxdnn runs an lhs-dilated convolution as), a 5x5 stride-3 dilated filter.
CASES = ("2d_c3k5_s2_asym,1d_c8k8_k5s2,2d_g2_c16k32,3d_c8k16,negpad,negpad_s2x3_d2,"
         "c5k7_5x5_s3_d2")
DTYPES = ("bf16", "f16", "tf32", "f32", "f64", "bf16>f32", "f16>f32")


@pytest.fixture(scope="module")
def emulated_checker(tmp_path_factory):
  """The checker and the kernels compiled once for the host (emulate.sh build)."""
  return build("tests/cuda/gemm_family/emulate.sh", "GEMM_EMU_DIR", tmp_path_factory.mktemp("gemmemu"))


def _run(checker, *args, min_runs, **env):
  """Runs the checker's correctness set; returns its kernel launch counts ({name: launches})."""
  return run_checker(checker, ["--no-time", *args], min_runs=min_runs,
                     summary=r"CHECK: (\d+) runs, (\d+) failed", **env)


def test_gemm_family_kernels_emulated_on_the_host(emulated_checker):
  """Every dtype combination x fwd/dgrad/wgrad x IG/IPG/GEMM x NHWC/NCHW on the small cases."""
  cases = CASES.count(",") + 1
  launches = _run(emulated_checker, "--case", CASES, min_runs=cases * 2 * len(DTYPES) * 9)
  # the implicit kernels, and GEMM's explicit column buffer both ways
  for kernel in ("conv_gemm_kernel", "im2col_kernel", "col2im_kernel"):
    assert launches.get(kernel, 0) > 0, launches


def test_split_k_and_the_wide_tile_emulated(emulated_checker):
  """Split-K (forced: 3 splits, fp32 / fp64 partials and the reduce pass) in every dtype, and the
  128 x 128 16-bit forward tile (forced)."""
  launches = _run(emulated_checker, "--case", "2d_c32k16_s2_d2,negpad_s2x3_d2", min_runs=2 * 2 * 7 * 9,
                  JAXDNN_GEMM_SPLITS="3", EMU_BLOCK_ORDER="shuffled")
  assert launches.get("splitk_reduce_kernel", 0) > 0, launches
  _run(emulated_checker, "--case", "2d_c16k24_3x3,negpad_s2x3_d2", "--only", "bf16,f16,bf16>f32",
       "--op", "fwd", min_runs=2 * 2 * 3 * 3, JAXDNN_GEMM_TILE="L", EMU_BLOCK_ORDER="reverse")
