"""The CUDA bias/activation backward (ffi/cuda/bias_act.cu, the jaxdnn_bias_act_bwd target) on
the host, without a GPU.

tests/cuda/bab/emulate.sh rewrites the kernel launches into calls of an emulated CUDA runtime
(tests/cuda/emu: a block's threads as cooperative fibers meeting at barriers, warp shuffles
through per-warp slots, blocks run in forward, reverse or shuffled order), compiles the kernels and their
checker with g++ under AddressSanitizer and UBSan, and checks dz and db against a float64 host
reference on the smoke set: with the default grid, with at most 2 blocks per channel group (many
slices: the arrival counters, the last block's fixed-order sums, several rounds of rows per
thread), and the session-9 kernels under the same reference. It does not see nvcc's compile
errors, the device's math or speed (the GPU runs tests/cuda/bab/run.sh). About 15 s on two
cores.
"""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "cuda" / "bab" / "emulate.sh"


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("bash") is None,
                    reason="needs g++ and bash")
def test_cuda_bias_act_backward_emulated_on_the_host(tmp_path):
  env = dict(os.environ, TMPDIR=str(tmp_path))
  env.pop("JAXDNN_BAB_BLOCKS", None)
  run = subprocess.run(["bash", str(SCRIPT), "smoke"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=900)
  tail = (run.stdout + run.stderr)[-4000:]
  assert run.returncode == 0, tail
  summaries = re.findall(r"bab check \(smoke, ([^)]*)\): (\d+) cases, (\d+) runs, (\d+) comparisons, "
                         r"(\d+) failures", run.stdout)
  assert len(summaries) == 3, tail  # default grid, 2 blocks per group, the older kernels
  for setting, cases, runs, comparisons, failures in summaries:
    assert int(failures) == 0, f"{setting}\n{tail}"
    assert int(runs) >= 100 and int(comparisons) >= 500_000, \
        f"{setting}: only {runs} runs / {comparisons} comparisons: the smoke set shrank?\n{tail}"
