"""Loading the compiled extensions and registering their FFI targets with XLA.

`_jaxdnn_cpu` always exists; `_jaxdnn_cuda` exists when the package was built with a CUDA
compiler. Both expose the same trace-time queries (can_implement, workspace_bytes) and FFI
targets (jaxdnn_conv_fwd, jaxdnn_conv_bwd_data, jaxdnn_conv_bwd_filter).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from types import ModuleType

import jax
import jax.ffi
import jaxlib

# Platform names as the lowering sees them -> (extension module, XLA platform name).
_EXTENSIONS = {"cpu": ("jaxdnn._jaxdnn_cpu", "cpu"), "cuda": ("jaxdnn._jaxdnn_cuda", "CUDA")}


def _running_ffi_api_version() -> tuple[int, int] | None:
  """The XLA FFI API version of the running jaxlib, read from the headers it ships."""
  header = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
  try:
    with open(header) as f:
      text = f.read()
  except OSError:
    return None
  major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
  minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
  if not (major and minor):
    return None
  return int(major.group(1)), int(minor.group(1))


def _check_ffi_api(module: ModuleType) -> None:
  """Raises ImportError when the extension was built for a newer XLA FFI API than jaxlib's."""
  built = tuple(module.ffi_api_version())
  running = _running_ffi_api_version()
  built_jaxlib = module.built_jaxlib_version
  if running is not None and (built[0] != running[0] or built[1] > running[1]):
    raise ImportError(
        f"{module.__name__} was built against jaxlib {built_jaxlib} (XLA FFI API "
        f"{built[0]}.{built[1]}), but the running jaxlib {jaxlib.__version__} supports XLA FFI "
        f"API {running[0]}.{running[1]}. Rebuild jaxdnn against the installed jax "
        f"(pip install --no-build-isolation --force-reinstall .) or upgrade jaxlib.")


@functools.cache
def extension(platform: str) -> ModuleType | None:
  """The extension module for a lowering platform ("cpu", "cuda"), or None when not built."""
  if platform not in _EXTENSIONS:
    return None
  name, xla_platform = _EXTENSIONS[platform]
  try:
    module = importlib.import_module(name)
  except ImportError as e:
    if platform == "cpu":
      package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
      raise ImportError(
          f"jaxdnn's compiled CPU extension is missing from {package_dir} ({e}). Build and "
          f"install the package (pip install --no-build-isolation .) and import it from outside "
          f"the source tree, whose jaxdnn/ folder has no compiled extension.") from e
    return None
  _check_ffi_api(module)
  for target, capsule in module.registrations().items():
    jax.ffi.register_ffi_target(target, capsule, platform=xla_platform)
  return module


@functools.cache
def has_target(platform: str, target: str) -> bool:
  """Whether the extension for `platform` is built and registers the FFI target `target`."""
  module = extension(platform)
  return module is not None and target in module.registrations()


def load_cpu_extension() -> ModuleType:
  module = extension("cpu")
  assert module is not None
  return module
