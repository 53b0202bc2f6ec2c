"""The CUDA Winograd kernels (ffi/cuda/conv_winograd.cu) on the host, without a GPU.

tests/cuda/winograd/emulate.sh rewrites the kernel launches into calls of an emulated CUDA runtime
(tests/cuda/winograd/emu: blocks and warps as threads, shared memory, barriers, cp.async,
mma.sync and ldmatrix by a lane exchange, mma operands read as tf32), compiles the kernels and their checker with g++ under
AddressSanitizer and UBSan, and checks every WINOGRAD / WINOGRAD_NONFUSED variant, dtype and
op of the quick geometry set against a float64 reference (the tensor-core NONFUSED GEMM is not
emulated: its fp32 path runs the SIMT kernel here). This is the only CPU-side check of the
CUDA kernels' index math and schedules; it does not see nvcc's compile errors, device rounding or
speed (the GPU runs tests/cuda/winograd/run.sh). About 4-6 minutes on two idle cores (15 minutes
measured beside another build; the whole clean-clone CI with it: 22 minutes).
"""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "cuda" / "winograd" / "emulate.sh"


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("bash") is None,
                    reason="needs g++ and bash")
def test_cuda_winograd_kernels_emulated_on_the_host(tmp_path):
  env = dict(os.environ, WINO_EMU_DIR=str(tmp_path))
  run = subprocess.run(["bash", str(SCRIPT), "quick"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=1500)
  tail = (run.stdout + run.stderr)[-4000:]
  assert run.returncode == 0, tail
  m = re.search(r"CORRECTNESS: (\d+) runs, (\d+) failures", run.stdout)
  assert m is not None, tail
  runs, failures = int(m.group(1)), int(m.group(2))
  assert failures == 0, tail
  assert runs >= 400, f"only {runs} runs: the quick set shrank?\n{tail}"
