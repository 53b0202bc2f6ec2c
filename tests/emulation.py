"""Building and running the host-emulated CUDA kernel checkers (tests/cuda/*/emulate.sh) from
pytest: the emulation tests share these."""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

needs_gcc = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("bash") is None,
                               reason="needs g++ and bash")


def build(script: str, dir_variable: str, directory) -> pathlib.Path:
  """Compiles a checker with its emulate.sh (`build`) into `directory`; returns its path."""
  run = subprocess.run(["bash", str(REPO / script), "build"], cwd=REPO,
                       env=dict(os.environ, **{dir_variable: str(directory)}), capture_output=True,
                       text=True, timeout=900)
  assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
  return pathlib.Path(directory) / "check"


def run_checker(checker, args, *, min_runs, summary=r"CORRECTNESS: (\d+) runs, (\d+) failures",
                **env) -> dict[str, int]:
  """Runs an emulated checker: it must exit 0 and report (summary: runs, failures) no failures
  over at least min_runs runs. Returns its kernel launch counts ({name: launches})."""
  run = subprocess.run([str(checker), *args], cwd=REPO, env=dict(os.environ, **env),
                       capture_output=True, text=True, timeout=1500)
  tail = (run.stdout + run.stderr)[-4000:]
  assert run.returncode == 0, tail
  m = re.search(summary, run.stdout)
  assert m is not None, tail
  runs, failures = int(m.group(1)), int(m.group(2))
  assert failures == 0, tail
  assert runs >= min_runs, f"only {runs} runs: the set shrank?\n{tail}"
  m = re.search(r"^LAUNCHES:(.*)$", run.stdout, re.M)
  assert m is not None, tail
  return {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
