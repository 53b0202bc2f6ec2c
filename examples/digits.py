"""LeNet-style digit classifier (Flax Linen + optax) on jaxdnn convolutions.

By default it trains on scikit-learn's bundled 8x8 digits (no download), upsampled to 16x16;
`--mnist DIR` reads the real MNIST IDX files instead (train-images-idx3-ubyte,
train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each optionally .gz).

    python examples/digits.py                    # ~15 s on a 2-core CPU, about 98% test accuracy
    python examples/digits.py --mnist ~/data/mnist --epochs 3
    python examples/digits.py --algo direct      # force one jaxdnn algorithm family

Writes OUT/digits_curves.png (loss and accuracy curves; OUT defaults to examples/out).
"""

from __future__ import annotations

import argparse
import gzip
import os
import time
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxdnn.nn as dnn

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------------------------
# Data.

# IDX element type codes -> big-endian numpy dtypes.
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str) -> np.ndarray:
  """Reads an IDX file (plain or gzip-compressed) into a numpy array in native byte order.

  Layout: two zero bytes, a type code (IDX_DTYPES), the number of dimensions, one big-endian
  uint32 per dimension, then the elements in C order, big-endian.
  """
  with open(path, "rb") as f:
    data = f.read()
  if data[:2] == b"\x1f\x8b":  # gzip, whatever the file is called
    try:
      data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
      raise ValueError(f"{path}: corrupt gzip data ({e})") from None
  if len(data) < 4:
    raise ValueError(f"{path}: too short for an IDX header ({len(data)} bytes)")
  if data[0] != 0 or data[1] != 0:
    raise ValueError(f"{path}: not an IDX file (magic number starts {data[:2].hex()}, "
                     "expected 0000)")
  code, ndim = data[2], data[3]
  if code not in IDX_DTYPES:
    raise ValueError(f"{path}: unknown IDX type code 0x{code:02X} (known: "
                     + ", ".join(f"0x{c:02X}" for c in IDX_DTYPES) + ")")
  if ndim == 0:
    raise ValueError(f"{path}: IDX header declares 0 dimensions")
  header = 4 + 4 * ndim
  if len(data) < header:
    raise ValueError(f"{path}: truncated IDX header ({ndim} dimensions need {header} bytes, "
                     f"file has {len(data)})")
  shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
  dtype = IDX_DTYPES[code]
  expected = int(np.prod(shape)) * dtype.itemsize
  if len(data) - header != expected:
    raise ValueError(f"{path}: shape {shape} of {dtype.name} needs {expected} data bytes, file "
                     f"has {len(data) - header}")
  return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find_idx(directory: str, stem: str) -> str:
  """DIR/stem, DIR/stem.gz, or the 'train-images.idx3-ubyte' spelling of either."""
  names = [stem, stem + ".gz"]
  dotted = stem.replace("-idx", ".idx")
  names += [dotted, dotted + ".gz"]
  for name in names:
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(f"MNIST file {stem}[.gz] not found in {directory}")


def load_mnist(directory: str):
  """(x_train, y_train, x_test, y_test): images float32 in [0, 1], shape (n, 28, 28, 1)."""
  out = []
  for split in ("train", "t10k"):
    images = read_idx(_find_idx(directory, f"{split}-images-idx3-ubyte"))
    labels = read_idx(_find_idx(directory, f"{split}-labels-idx1-ubyte"))
    if images.ndim != 3 or images.dtype != np.uint8:
      raise ValueError(f"{split} images: expected a 3-D uint8 array, got {images.ndim}-D "
                       f"{images.dtype}")
    if labels.ndim != 1 or len(labels) != len(images):
      raise ValueError(f"{split} labels: expected {len(images)} labels, got shape "
                       f"{labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
      raise ValueError(f"{split} labels: values outside 0..9")
    out += [images[..., None].astype(np.float32) / 255.0, labels.astype(np.int32)]
  return tuple(out)


def load_digits(seed: int, test_fraction: float = 0.2):
  """scikit-learn's 8x8 digits, bilinearly upsampled to 16x16, in [0, 1]; stratified split."""
  from sklearn.datasets import load_digits as sk_digits
  from sklearn.model_selection import train_test_split

  digits = sk_digits()
  x = digits.images.astype(np.float32)[..., None] / 16.0
  x = np.asarray(jax.image.resize(x, (len(x), 16, 16, 1), "bilinear"))
  y = digits.target.astype(np.int32)
  x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed,
                                            stratify=y)
  return x_tr, y_tr, x_te, y_te


# ---------------------------------------------------------------------------------------------
# Model and training.

class LeNet(nn.Module):
  """Two 5x5 conv + 2x2 max-pool stages, then three dense layers (LeNet-5's shape, ReLU)."""

  algo: str = "auto"
  num_classes: int = 10

  @nn.compact
  def __call__(self, x):
    for features in (16, 32):
      x = dnn.Conv(features, (5, 5), padding="SAME", algo=self.algo, activation="relu")(x)
      x = dnn.MaxPool((2, 2), strides=(2, 2))(x)
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(120)(x))
    x = nn.relu(nn.Dense(84)(x))
    return nn.Dense(self.num_classes)(x)


def make_steps(model, tx):
  """Jitted (train step, logits function)."""

  def loss_fn(params, x, y):
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits

  @jax.jit
  def train_step(params, opt_state, x, y):
    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, jnp.mean(logits.argmax(-1) == y)

  @jax.jit
  def logits_fn(params, x):
    return model.apply({"params": params}, x)

  return train_step, logits_fn


def accuracy(logits_fn, params, x, y, batch: int = 1000) -> float:
  """Accuracy over (x, y) in fixed-size batches (the last one padded: one compiled shape)."""
  correct = 0
  for i in range(0, len(x), batch):
    xb = x[i:i + batch]
    n = len(xb)
    if n < batch and len(x) > batch:
      xb = np.concatenate([xb, np.zeros((batch - n,) + xb.shape[1:], xb.dtype)])
    pred = np.asarray(logits_fn(params, xb)).argmax(-1)[:n]
    correct += int((pred == y[i:i + n]).sum())
  return correct / len(x)


def _progress(total: int):
  try:
    from tqdm import tqdm
    return tqdm(total=total, unit="step", desc="training")
  except ImportError:  # no bar without tqdm
    return None


def train(data, *, epochs: int, batch_size: int, lr: float, seed: int, algo: str = "auto",
          max_steps: int | None = None):
  """Trains LeNet with Adam; returns (params, history). history: per-step loss, per-epoch mean
  loss, train (running) and test accuracy, and the seconds spent."""
  x_tr, y_tr, x_te, y_te = data
  batch_size = min(batch_size, len(x_tr))
  model = LeNet(algo=algo)
  params = model.init(jax.random.key(seed), jnp.zeros((1,) + x_tr.shape[1:], jnp.float32))
  params = params["params"]
  steps_per_epoch = len(x_tr) // batch_size
  schedule = optax.cosine_decay_schedule(lr, max(epochs * steps_per_epoch, 1), alpha=0.05)
  tx = optax.adam(schedule)
  opt_state = tx.init(params)
  train_step, logits_fn = make_steps(model, tx)
  total = epochs * steps_per_epoch if max_steps is None else min(max_steps,
                                                                 epochs * steps_per_epoch)
  history = dict(step_loss=[], epoch_loss=[], train_acc=[], test_acc=[], epoch_end_step=[])
  rng = np.random.default_rng(seed)
  bar = _progress(total)
  start = time.perf_counter()
  step = 0
  for _ in range(epochs):
    order = rng.permutation(len(x_tr))
    losses, accs = [], []
    for b in range(steps_per_epoch):
      if step == total:
        break
      idx = order[b * batch_size:(b + 1) * batch_size]
      params, opt_state, loss, acc = train_step(params, opt_state, x_tr[idx], y_tr[idx])
      losses.append(float(loss))
      accs.append(float(acc))
      step += 1
      if bar is not None:
        bar.update()
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    if not losses:
      break
    history["step_loss"] += losses
    history["epoch_loss"].append(float(np.mean(losses)))
    history["train_acc"].append(float(np.mean(accs)))
    history["test_acc"].append(accuracy(logits_fn, params, x_te, y_te))
    history["epoch_end_step"].append(step)
    if bar is not None:
      bar.set_postfix(loss=f"{losses[-1]:.3f}", test_acc=f"{history['test_acc'][-1]:.3f}")
  if bar is not None:
    bar.close()
  history["seconds"] = time.perf_counter() - start
  return params, history


def plot_curves(history, path: str, title: str):
  """Loss per step (and per-epoch mean) beside train/test accuracy per epoch."""
  from matplotlib.figure import Figure

  fig = Figure(figsize=(10, 4), layout="constrained")
  ax_loss, ax_acc = fig.subplots(1, 2)
  steps = np.arange(1, len(history["step_loss"]) + 1)
  ax_loss.plot(steps, history["step_loss"], color="C0", alpha=0.35, lw=0.8, label="batch")
  ax_loss.plot(history["epoch_end_step"], history["epoch_loss"], "o-", color="C0",
               label="epoch mean")
  ax_loss.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="training loss")
  ax_loss.legend()
  epochs = np.arange(1, len(history["test_acc"]) + 1)
  ax_acc.plot(epochs, history["train_acc"], "o-", label="train (running)")
  ax_acc.plot(epochs, history["test_acc"], "s-", label="test")
  ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
  ax_acc.grid(alpha=0.3)
  ax_acc.legend()
  fig.suptitle(title)
  fig.savefig(path, dpi=100)


def main(argv=None):
  """Trains and evaluates; returns a dict with test_accuracy, history and the plot's path."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--mnist", metavar="DIR", help="train on the MNIST IDX files in DIR")
  ap.add_argument("--epochs", type=int, default=None, help="default: 30 (digits), 3 (MNIST)")
  ap.add_argument("--batch-size", type=int, default=64)
  ap.add_argument("--lr", type=float, default=2e-3, help="Adam's peak learning rate")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--algo", default="auto", help="jaxdnn algorithm family for every conv")
  ap.add_argument("--train-size", type=int, default=None, help="use only this many training "
                  "images (quick runs)")
  ap.add_argument("--steps", type=int, default=None, help="stop after this many steps")
  ap.add_argument("--out", default=os.path.join(HERE, "out"), help="output directory")
  args = ap.parse_args(argv)

  if args.mnist:
    data = load_mnist(args.mnist)
    name = "MNIST"
  else:
    data = load_digits(args.seed)
    name = "digits (8x8 -> 16x16)"
  epochs = args.epochs or (3 if args.mnist else 30)
  if args.train_size:
    rng = np.random.default_rng(args.seed)
    keep = rng.permutation(len(data[0]))[:args.train_size]
    data = (data[0][keep], data[1][keep], *data[2:])
  print(f"{name}: {len(data[0])} training, {len(data[2])} test images of "
        f"{data[0].shape[1]}x{data[0].shape[2]}; jax {jax.__version__} on "
        f"{jax.devices()[0].device_kind}")
  params, history = train(data, epochs=epochs, batch_size=args.batch_size, lr=args.lr,
                          seed=args.seed, algo=args.algo, max_steps=args.steps)
  test_acc = history["test_acc"][-1] if history["test_acc"] else float("nan")
  print(f"test accuracy {test_acc:.4f} after {len(history['step_loss'])} steps "
        f"({len(history['test_acc'])} epochs, {history['seconds']:.1f} s)")
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "digits_curves.png")
  plot_curves(history, path, f"LeNet on {name} (jaxdnn convs, algo={args.algo}): "
              f"test accuracy {test_acc:.4f}")
  print(f"wrote {path}")
  return dict(test_accuracy=test_acc, history=history, params=params, plot=path)


if __name__ == "__main__":
  main()
