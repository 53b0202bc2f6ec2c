"""The examples (examples/digits.py, examples/segmentation.py): IDX reading, data generation,
and a few training steps of each on tiny data."""

from __future__ import annotations

import gzip
import importlib.util
import os
import sys

import numpy as np
import pytest

for _name in ("flax", "optax", "sklearn", "matplotlib"):
  pytest.importorskip(_name)

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
if not os.path.isdir(EXAMPLES):
  pytest.skip("no examples/ folder (not a repository checkout)", allow_module_level=True)


def _load(name):
  spec = importlib.util.spec_from_file_location(f"jaxdnn_example_{name}",
                                                os.path.join(EXAMPLES, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses (flax modules) look their module up there
  spec.loader.exec_module(module)
  return module


digits = _load("digits")
segmentation = _load("segmentation")

IDX_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D,
             np.float64: 0x0E}


def write_idx(path, array, *, code=None, compress=False, header_dims=None, extra=b""):
  """Writes `array` as an IDX file (big-endian), optionally gzip-compressed or malformed."""
  array = np.asarray(array)
  code = IDX_CODES[array.dtype.type] if code is None else code
  dims = array.shape if header_dims is None else header_dims
  data = bytes([0, 0, code, len(dims)]) + np.asarray(dims, ">u4").tobytes()
  data += array.astype(array.dtype.newbyteorder(">")).tobytes() + extra
  with open(path, "wb") as f:
    f.write(gzip.compress(data) if compress else data)
  return path


# ---------------------------------------------------------------------------------------------
# IDX reader.

def test_read_idx_ubyte_images_and_labels(tmp_path):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
  labels = rng.integers(0, 10, 5, dtype=np.uint8)
  got = digits.read_idx(write_idx(tmp_path / "img-idx3-ubyte", images))
  assert got.dtype == np.uint8 and got.shape == (5, 4, 3)
  np.testing.assert_array_equal(got, images)
  np.testing.assert_array_equal(digits.read_idx(write_idx(tmp_path / "lab", labels)), labels)


@pytest.mark.parametrize("name", ["img-idx3-ubyte.gz", "compressed-without-suffix"])
def test_read_idx_gzip(tmp_path, name):
  images = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
  got = digits.read_idx(write_idx(tmp_path / name, images, compress=True))
  np.testing.assert_array_equal(got, images)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.float64])
def test_read_idx_other_types(tmp_path, dtype):
  values = (np.arange(-6, 6).reshape(3, 4) * 37).astype(dtype)
  got = digits.read_idx(write_idx(tmp_path / "x.idx", values))
  assert got.dtype == np.dtype(dtype) and got.dtype.isnative
  np.testing.assert_array_equal(got, values)


@pytest.mark.parametrize("kind, match", [
    ("magic", "not an IDX file"),
    ("code", "unknown IDX type code 0x07"),
    ("short_data", "needs 12 data bytes, file has 11"),
    ("long_data", "needs 12 data bytes, file has 13"),
    ("short_header", "truncated IDX header"),
    ("tiny", "too short"),
    ("zero_dims", "0 dimensions"),
    ("bad_gzip", "corrupt gzip"),
])
def test_read_idx_errors(tmp_path, kind, match):
  path = tmp_path / "bad"
  a = np.arange(12, dtype=np.uint8).reshape(3, 4)
  if kind == "magic":
    path.write_bytes(b"\x08\x03\x08\x02" + bytes(20))
  elif kind == "code":
    write_idx(path, a, code=0x07)
  elif kind == "short_data":
    write_idx(path, a)
    path.write_bytes(path.read_bytes()[:-1])
  elif kind == "long_data":
    write_idx(path, a, extra=b"\x00")
  elif kind == "short_header":
    path.write_bytes(b"\x00\x00\x08\x03" + bytes(6))
  elif kind == "tiny":
    path.write_bytes(b"\x00\x00")
  elif kind == "zero_dims":
    path.write_bytes(b"\x00\x00\x08\x00")
  else:
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x01\x05")[:12])
  with pytest.raises(ValueError, match=match):
    digits.read_idx(path)


def _fake_mnist(directory, n_train=40, n_test=12, gz=True, label_count=None):
  rng = np.random.default_rng(1)
  sfx = ".gz" if gz else ""
  for split, n in (("train", n_train), ("t10k", n_test)):
    write_idx(directory / f"{split}-images-idx3-ubyte{sfx}",
              rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), compress=gz)
    write_idx(directory / f"{split}-labels-idx1-ubyte{sfx}",
              rng.integers(0, 10, label_count or n, dtype=np.uint8), compress=gz)


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "plain"])
def test_load_mnist(tmp_path, gz):
  _fake_mnist(tmp_path, gz=gz)
  x_tr, y_tr, x_te, y_te = digits.load_mnist(str(tmp_path))
  assert x_tr.shape == (40, 28, 28, 1) and x_te.shape == (12, 28, 28, 1)
  assert x_tr.dtype == np.float32 and 0 <= x_tr.min() and x_tr.max() <= 1
  assert y_tr.shape == (40,) and y_te.shape == (12,) and y_tr.max() <= 9


def test_load_mnist_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
    digits.load_mnist(str(tmp_path))
  _fake_mnist(tmp_path, label_count=7)
  with pytest.raises(ValueError, match="expected 40 labels"):
    digits.load_mnist(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# Training runs (tiny).

def _decreased(losses, k):
  return np.mean(losses[-k:]) < 0.8 * np.mean(losses[:k])


def test_digits_trains(tmp_path):
  result = digits.main(["--epochs", "3", "--train-size", "320", "--batch-size", "32", "--out",
                        str(tmp_path)])
  h = result["history"]
  assert len(h["step_loss"]) == 30 and len(h["test_acc"]) == 3
  assert _decreased(h["step_loss"], 5), h["step_loss"]
  assert result["test_accuracy"] > 0.5  # 10 classes: chance is 0.1
  assert (tmp_path / "digits_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_digits_on_mnist_files(tmp_path):
  _fake_mnist(tmp_path)
  out = tmp_path / "out"
  result = digits.main(["--mnist", str(tmp_path), "--steps", "3", "--batch-size", "8", "--out",
                        str(out), "--algo", "implicit_gemm"])
  assert len(result["history"]["step_loss"]) == 3
  assert 0 <= result["test_accuracy"] <= 1
  assert (out / "digits_curves.png").is_file()


def test_shapes_dataset():
  x, y = segmentation.make_shapes(48, 32, seed=3)
  assert x.shape == (48, 32, 32, 3) and x.dtype == np.float32 and y.shape == (48, 32, 32)
  assert 0 <= x.min() and x.max() <= 1
  counts = np.bincount(y.ravel(), minlength=4)
  assert len(counts) == 4 and (counts > 0).all() and counts[0] > counts[1:].max()
  assert all((y[i] > 0).any() for i in range(len(y)))  # every image has a shape
  x2, y2 = segmentation.make_shapes(48, 32, seed=3)
  np.testing.assert_array_equal(x, x2)
  np.testing.assert_array_equal(y, y2)
  assert not np.array_equal(y, segmentation.make_shapes(48, 32, seed=4)[1])


@pytest.mark.parametrize("sides, area", [(3, 3 * 3**0.5 / 4), (4, 2.0), (6, 3 * 3**0.5 / 2)])
def test_polygon_mask_area(sides, area):
  yy, xx = np.mgrid[0:200, 0:200] + 0.5
  mask = segmentation._polygon_mask(yy, xx, 100.0, 100.0, 60.0, sides, 0.3)
  assert mask.sum() == pytest.approx(area * 60.0**2, rel=0.02)
  assert mask[100, 100] and not mask[0, 0]


def test_iou():
  labels = np.array([[0, 0, 1, 1], [2, 2, 2, 0]])
  preds = np.array([[0, 1, 1, 1], [2, 2, 0, 0]])
  cm = segmentation.confusion(preds, labels)
  assert cm.sum() == 8 and cm[0, 1] == 1 and cm[2, 0] == 1
  iou = segmentation.iou_from_confusion(cm)
  np.testing.assert_allclose(iou[:3], [2 / 4, 2 / 3, 2 / 3])
  assert np.isnan(iou[3])  # absent from both


def test_segmentation_trains(tmp_path):
  result = segmentation.main(["--train-size", "64", "--test-size", "8", "--steps", "30",
                              "--batch-size", "16", "--out", str(tmp_path)])
  assert len(result["losses"]) == 30
  assert _decreased(result["losses"], 5), result["losses"]
  assert 0 <= result["miou"] <= 1 and set(result["iou"]) == set(segmentation.CLASSES)
  for name in ("segmentation.png", "segmentation_loss.png"):
    assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
