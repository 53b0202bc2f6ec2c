"""The import-time check of the extension's XLA FFI API version against the running jaxlib."""

import jaxlib
import pytest

from jaxdnn._src import ffi


def test_running_version_is_read_from_jaxlib_headers():
  running = ffi._running_ffi_api_version()
  assert running is not None and len(running) == 2
  # The extension was built against the installed jaxlib, so the check passes as imported.
  module = ffi.load_cpu_extension()
  assert tuple(module.ffi_api_version()) == running
  ffi._check_ffi_api(module)


@pytest.mark.parametrize("running", [(0, 0), (99, 0)], ids=["older-minor", "other-major"])
def test_newer_or_incompatible_extension_raises_import_error(monkeypatch, running):
  module = ffi.load_cpu_extension()
  built = tuple(module.ffi_api_version())
  if running[0] == built[0] and running[1] >= built[1]:
    pytest.skip("the extension's FFI API is not newer than the simulated one")
  monkeypatch.setattr(ffi, "_running_ffi_api_version", lambda: running)
  with pytest.raises(ImportError) as info:
    ffi._check_ffi_api(module)
  message = str(info.value)
  assert module.built_jaxlib_version in message and jaxlib.__version__ in message
  assert f"{built[0]}.{built[1]}" in message and f"{running[0]}.{running[1]}" in message
