"""The fiber core of the emulated CUDA runtimes (tests/cuda/emu_fibers.h): barriers order a
block's threads, a barrier that one thread skips aborts with a message instead of hanging, and
AddressSanitizer still sees a kernel's out-of-bounds read inside a fiber
(tests/cuda/emu_fibers_selftest.cc)."""

import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def selftest(tmp_path_factory):
  exe = tmp_path_factory.mktemp("fibers") / "selftest"
  cmd = ["g++", "-std=c++20", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
         "-I", str(REPO / "tests/cuda/winograd/emu"), str(REPO / "tests/cuda/emu_fibers_selftest.cc"),
         "-o", str(exe), "-ldl"]
  run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-4000:]
  return exe


def _run(exe, mode):
  return subprocess.run([str(exe), mode], capture_output=True, text=True, timeout=60)


def test_barriers_order_the_threads(selftest):
  run = _run(selftest, "barrier")
  assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


def test_a_skipped_barrier_aborts_with_a_message(selftest):
  run = _run(selftest, "deadlock")
  assert run.returncode != 0
  assert "a barrier that not every thread reaches (deadlock)" in run.stderr, run.stderr


def test_asan_sees_an_overflow_inside_a_fiber(selftest):
  run = _run(selftest, "overflow")
  assert run.returncode != 0
  assert "heap-buffer-overflow" in run.stderr and "exchange_kernel" in run.stderr, run.stderr[-4000:]
