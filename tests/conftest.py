"""Shared pytest setup for the jaxdnn test-suite.

* float64 is enabled (the oracle is lax.conv_general_dilated at HIGHEST precision on float64).
* The installed jaxdnn (with its compiled extensions) is imported, never the source tree, even
  when pytest runs from the repository root.
* `platform` is jax's default backend ("cpu" or "gpu"); `lowering_platform` is the name the
  lowering rules use ("cpu" or "cuda"). Tests marked `gpu` skip cleanly without a GPU.
* Hypothesis never writes a database (no files are written into the repository).
"""

from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _has_compiled_extension(package_dir: str) -> bool:
  try:
    return any(name.startswith("_jaxdnn_cpu") for name in os.listdir(package_dir))
  except OSError:
    return False


# `python -m pytest` from the repository root puts the root on sys.path, which would shadow the
# installed package with the source tree (which has no compiled extension).
if not _has_compiled_extension(os.path.join(_REPO, "jaxdnn")):
  sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _REPO]

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

try:  # hypothesis is optional for everything but test_properties.py
  from hypothesis import settings as _hyp_settings

  _hyp_settings.register_profile("jaxdnn", database=None, deadline=None)
  _hyp_settings.load_profile("jaxdnn")
except ImportError:  # pragma: no cover
  pass

import helpers  # noqa: E402


def pytest_configure(config):
  config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
  config.addinivalue_line("markers", "slow: long-running")


def pytest_collection_modifyitems(config, items):
  if helpers.PLATFORM == "gpu":
    return
  skip_gpu = pytest.mark.skip(reason=f"needs a GPU; jax's default backend is {helpers.PLATFORM}")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip_gpu)


@pytest.fixture
def platform() -> str:
  """jax.default_backend(): "cpu" or "gpu"."""
  return helpers.PLATFORM


@pytest.fixture
def lowering_platform() -> str:
  """The platform name jaxdnn's lowering rules and extensions use: "cpu" or "cuda"."""
  return helpers.LOWERING_PLATFORM
