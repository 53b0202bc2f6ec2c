"""jaxdnn.conv_transpose and the Flax layers (jaxdnn.nn, jaxdnn.nn.nnx) against flax and lax.

The oracles: flax.linen / flax.nnx Conv and ConvTranspose (same init rng -> the same parameter
tree; outputs and gradients at float64), lax.conv_transpose, per-group lax.conv_transpose
concatenations, and a NumPy loop of PyTorch's conv_transpose2d.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

flax = pytest.importorskip("flax")
import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jaxdnn  # noqa: E402
import jaxdnn.nn as dnn  # noqa: E402
from helpers import ALGOS, algo_id, rand, unsupported  # noqa: E402
from jaxdnn.nn import nnx as dnnx  # noqa: E402
from tolerances import BF16, F16, F32, F64, assert_close  # noqa: E402

RTOL64 = 1e-10
BIAS_INIT = nn.initializers.normal(1.0)  # non-zero biases, so that bias handling is checked


def _tree_equal(a, b, what="params"):
  """Same structure, shapes and values."""
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), what
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    assert x.shape == y.shape and x.dtype == y.dtype, what
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=what)


def _tree_same_shapes(a, b, what="params"):
  """Same structure, shapes and dtypes (a may hold ShapeDtypeStructs)."""
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), what
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    assert x.shape == y.shape and x.dtype == y.dtype, what


def _tree_close(a, b, tol, what):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), what
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    assert_close(x, y, tol, what)


def _hlo(fn, *args):
  return jax.jit(fn).lower(*args).as_text()


def _assert_jaxdnn_hlo(text, n_fwd=None):
  # Forward convolutions lower to jaxdnn_conv_fwd, or to jaxdnn_conv_fwd_fused when the layer's
  # bias and named activation are fused into the kernel pass; a transposed convolution's forward
  # may lower to jaxdnn_conv_bwd_data (the strided convolution's backward-data:
  # algorithms.lhs_dilation_mapping).
  count = sum(text.count(f"@{t}(") for t in
              ("jaxdnn_conv_fwd", "jaxdnn_conv_fwd_fused", "jaxdnn_conv_bwd_data"))
  assert count > 0, "no jaxdnn custom call"
  assert "convolution" not in text, "XLA convolution in the HLO"
  if n_fwd is not None:
    assert count == n_fwd


def _loss(y):
  return jnp.sum(jnp.sin(y))


# ---------------------------------------------------------------------------------------------
# Cases shared by the Linen and NNX parity tests: (id, input shape, module kwargs). `features`
# is Linen's name; the NNX tests map it to out_features and take in_features from the input.

MASK = np.tril(np.ones((3, 3, 2, 3)), k=1).reshape(3, 3, 2, 3)

CONV_CASES = [
    ("2d-same", (2, 6, 5, 3), dict(features=4, kernel_size=(3, 3))),
    ("2d-valid-stride2", (2, 7, 6, 3), dict(features=4, kernel_size=(3, 2), strides=2,
                                            padding="VALID")),
    ("2d-circular", (1, 5, 6, 2), dict(features=3, kernel_size=(3, 4), padding="CIRCULAR")),
    ("2d-reflect-stride", (1, 6, 6, 2), dict(features=3, kernel_size=(3, 3), strides=(2, 1),
                                             padding="REFLECT")),
    ("1d-causal-dilated", (2, 9, 3), dict(features=2, kernel_size=(3,), kernel_dilation=2,
                                          padding="CAUSAL")),
    ("1d-int-kernel", (2, 8, 3), dict(features=2, kernel_size=4, strides=3)),
    ("2d-int-pad-stride2", (1, 5, 5, 3), dict(features=2, kernel_size=(3, 3), padding=1,
                                              strides=2)),
    ("2d-pairs", (1, 6, 5, 2), dict(features=3, kernel_size=(2, 3), padding=((1, 0), (2, 1)))),
    ("2d-mixed-pad", (1, 5, 6, 2), dict(features=3, kernel_size=(3, 3), padding=[1, (0, 2)])),
    ("2d-input-kernel-dilation", (1, 4, 5, 2), dict(features=3, kernel_size=(3, 3),
                                                    input_dilation=2, kernel_dilation=(1, 2),
                                                    padding=((1, 1), (0, 2)))),
    ("2d-groups-nobias", (2, 5, 5, 4), dict(features=6, kernel_size=(3, 3), feature_group_count=2,
                                            use_bias=False)),
    ("2d-depthwise", (1, 5, 5, 3), dict(features=3, kernel_size=3, feature_group_count=3)),
    ("3d-stride", (1, 4, 5, 4, 2), dict(features=3, kernel_size=(2, 3, 2), strides=(2, 1, 2))),
    ("3d-circular", (1, 3, 4, 3, 2), dict(features=2, kernel_size=(2, 3, 2),
                                          padding="CIRCULAR")),
    ("extra-batch-dims", (2, 3, 5, 5, 2), dict(features=3, kernel_size=(3, 3))),
    ("unbatched", (5, 5, 2), dict(features=3, kernel_size=(3, 3), padding="VALID")),
    ("mask", (2, 5, 5, 2), dict(features=3, kernel_size=(3, 3), mask=MASK)),
]

CONV_T_CASES = [
    ("2d-same-s2", (2, 4, 5, 3), dict(features=4, kernel_size=(3, 3), strides=(2, 2))),
    ("2d-same-s3-k2", (1, 3, 4, 2), dict(features=3, kernel_size=(2, 2), strides=3)),
    ("2d-same-default-stride", (1, 4, 4, 2), dict(features=3, kernel_size=(4, 3))),
    ("2d-valid", (2, 4, 3, 3), dict(features=2, kernel_size=(3, 2), strides=(2, 1),
                                    padding="VALID")),
    ("2d-valid-s-gt-k", (1, 3, 3, 2), dict(features=2, kernel_size=(2, 2), strides=3,
                                           padding="VALID")),
    ("2d-circular-s2", (1, 4, 5, 2), dict(features=3, kernel_size=(3, 4), strides=2,
                                          padding="CIRCULAR")),
    ("2d-circular-s2-tk", (1, 4, 5, 2), dict(features=3, kernel_size=(3, 4), strides=2,
                                             padding="CIRCULAR", transpose_kernel=True)),
    ("1d-circular-wide-kernel", (2, 2, 3), dict(features=2, kernel_size=(5,),
                                                padding="CIRCULAR")),
    ("1d-circular-s3-tk", (1, 3, 2), dict(features=2, kernel_size=(4,), strides=3,
                                          padding="CIRCULAR", transpose_kernel=True)),
    ("2d-circular-dilated", (1, 3, 4, 2), dict(features=2, kernel_size=(2, 3), strides=(1, 2),
                                               kernel_dilation=(2, 1), padding="CIRCULAR")),
    ("2d-int-pad", (1, 4, 4, 2), dict(features=3, kernel_size=(3, 3), strides=2, padding=1)),
    ("2d-pairs-dilated", (1, 4, 3, 2), dict(features=3, kernel_size=(3, 2), strides=(1, 2),
                                            kernel_dilation=(2, 1),
                                            padding=((2, 1), (0, 3)))),
    ("2d-mixed-pad", (1, 4, 4, 2), dict(features=2, kernel_size=(3, 3), strides=2,
                                        padding=[2, (1, 0)])),
    ("2d-tk-dilated", (2, 3, 4, 3), dict(features=2, kernel_size=(3, 2), strides=2,
                                         kernel_dilation=2, transpose_kernel=True)),
    ("1d-valid", (2, 5, 2), dict(features=3, kernel_size=3, strides=2, padding="VALID")),
    ("3d", (1, 3, 2, 3, 2), dict(features=2, kernel_size=(2, 3, 2), strides=(2, 1, 2))),
    ("3d-circular-tk", (1, 2, 3, 2, 2), dict(features=2, kernel_size=(3, 2, 2), strides=(1, 2, 1),
                                             padding="CIRCULAR", transpose_kernel=True)),
    ("extra-batch-dims", (2, 2, 4, 4, 3), dict(features=2, kernel_size=(3, 3), strides=2)),
    ("unbatched", (4, 4, 3), dict(features=2, kernel_size=(3, 3), strides=2, padding="VALID")),
    ("nobias", (1, 4, 4, 2), dict(features=3, kernel_size=(3, 3), strides=2, use_bias=False)),
    ("mask", (1, 4, 4, 2), dict(features=3, kernel_size=(3, 3), strides=2, mask=MASK)),
]


def _params(cases):
  return [pytest.param(shape, kwargs, id=cid) for cid, shape, kwargs in cases]


def _random_like(shapes, seed=0):
  """Random values for a tree of ShapeDtypeStructs (NumPy: no compiles)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype), shapes)


def _linen_pair(ours_cls, flax_cls, kwargs, x, param_dtype=F64, **extra):
  """(ours, flax's, our init's shapes, random parameters shaped as flax's init)."""
  kw = dict(kwargs, param_dtype=param_dtype, **extra)
  ours, ref = ours_cls(**kw), flax_cls(**kw)
  key = jax.random.key(7)
  # Shapes only: running the inits costs compiles; test_linen_init_values checks the values.
  v_ref = jax.eval_shape(ref.init, key, x)
  return ours, ref, jax.eval_shape(ours.init, key, x), _random_like(v_ref)


# ---------------------------------------------------------------------------------------------
# jaxdnn.conv_transpose against lax.conv_transpose.

CT_LAX = [
    # (id, lhs, rhs, strides, padding, rhs_dilation, dnums, transpose_kernel)
    ("nhwc-same-s2", (2, 4, 5, 3), (3, 3, 3, 4), (2, 2), "SAME", None, None, False),
    ("nhwc-same-s3-k2", (1, 3, 4, 2), (2, 2, 2, 3), (3, 3), "SAME", None, None, False),
    ("nhwc-valid-s21", (2, 4, 3, 3), (3, 2, 3, 2), (2, 1), "VALID", None, None, False),
    ("nhwc-valid-s-gt-k", (1, 3, 3, 2), (2, 2, 2, 2), (3, 3), "VALID", None, None, True),
    ("nhwc-explicit", (1, 4, 3, 2), (3, 2, 2, 3), (1, 2), ((2, 1), (0, 3)), None, None, False),
    ("nhwc-negative-pad", (1, 5, 5, 2), (3, 3, 2, 2), (2, 2), ((-1, 0), (1, -1)), None, None,
     False),
    ("nhwc-dilated-tk", (2, 3, 4, 3), (3, 2, 2, 3), (2, 2), "SAME", (2, 1), None, True),
    ("nchw-oihw-tk", (2, 3, 4, 5), (3, 2, 3, 3), (2, 1), "SAME", None,
     ("NCHW", "OIHW", "NCHW"), True),
    ("odd-layout-tk", (2, 4, 5, 3), (3, 2, 3, 2), (1, 2), "VALID", (1, 2),
     ("NWHC", "WHOI", "NCWH"), True),
    ("1d-default", (2, 5, 2), (3, 2, 3), (2,), "VALID", None, None, False),
    ("1d-tk-explicit", (2, 5, 2), (4, 3, 2), (3,), ((1, 2),), (2,), None, True),
    ("3d-default", (1, 3, 2, 3, 2), (2, 3, 2, 2, 2), (2, 1, 2), "SAME", None, None, False),
    ("3d-ncdhw-tk", (1, 2, 3, 2, 3), (2, 2, 2, 3, 2), (1, 2, 2), "VALID", (1, 1, 2),
     ("NCDHW", "OIDHW", "NCDHW"), True),
]


def _ct_kwargs(strides, padding, dil, dnums, tk):
  return dict(strides=strides, padding=padding, rhs_dilation=dil, dimension_numbers=dnums,
              transpose_kernel=tk)


# Cases whose float32 result and gradients are checked too (each costs compiles).
CT_LAX_FULL = ("nhwc-same-s2", "nhwc-explicit", "nhwc-dilated-tk", "odd-layout-tk",
               "1d-tk-explicit", "3d-ncdhw-tk")


@pytest.mark.parametrize("cid,lhs,rhs,strides,padding,dil,dnums,tk",
                         [pytest.param(*c, id=c[0]) for c in CT_LAX])
def test_conv_transpose_matches_lax(cid, lhs, rhs, strides, padding, dil, dnums, tk):
  x, w = rand(lhs, F64, seed=1), rand(rhs, F64, seed=2)
  kw = _ct_kwargs(strides, padding, dil, dnums, tk)
  want = lax.conv_transpose(x, w, precision=lax.Precision.HIGHEST, **kw)
  got = jaxdnn.conv_transpose(x, w, **kw)
  assert got.dtype == F64
  assert_close(got, want, RTOL64, "float64")
  if cid not in CT_LAX_FULL:
    return
  got32 = jaxdnn.conv_transpose(x.astype(F32), w.astype(F32), **kw)
  assert got32.dtype == F32
  assert_close(got32, want, 1e-5, "float32")
  # Gradients with respect to both operands.
  grad = lambda f: jax.grad(lambda x, w: _loss(f(x, w, **kw)), argnums=(0, 1))(x, w)
  _tree_close(grad(jaxdnn.conv_transpose),
              grad(functools.partial(lax.conv_transpose, precision=lax.Precision.HIGHEST)),
              RTOL64, "grad")


def test_conv_transpose_is_one_jaxdnn_conv():
  x, w = rand((2, 4, 5, 6), F64), rand((3, 3, 4, 6), F64)  # transposed kernel: (.., F/G, C)
  fn = lambda x, w: jaxdnn.conv_transpose(x, w, (2, 2), "SAME", transpose_kernel=True,
                                          feature_group_count=2, output_padding=(1, 0))
  _assert_jaxdnn_hlo(_hlo(fn, x, w), n_fwd=1)
  assert "@jaxdnn_conv_bwd" not in _hlo(fn, x, w)


def test_conv_transpose_lowercase_padding_and_jit():
  x, w = rand((1, 3, 4, 2), F64), rand((3, 3, 2, 3), F64)
  want = lax.conv_transpose(x, w, (2, 2), "SAME", precision=lax.Precision.HIGHEST)
  assert_close(jax.jit(lambda x, w: jaxdnn.conv_transpose(x, w, (2, 2), "same"))(x, w), want,
               RTOL64)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
def test_conv_transpose_low_precision(dtype):
  x, w = rand((2, 4, 5, 3), dtype, seed=3), rand((3, 3, 3, 4), dtype, seed=4)
  want = lax.conv_transpose(x.astype(F64), w.astype(F64), (2, 2), "SAME")
  got = jaxdnn.conv_transpose(x, w, (2, 2), "SAME")
  assert got.dtype == dtype
  assert_close(got, want, 2e-2, str(dtype))
  got32 = jaxdnn.conv_transpose(x, w, (2, 2), "SAME", preferred_element_type=F32)
  assert got32.dtype == F32
  assert_close(got32, want, 1e-5, "preferred_element_type float32")


# ---------------------------------------------------------------------------------------------
# Groups, transpose_kernel and output_padding against PyTorch's conv_transpose semantics.

def torch_conv_transpose_ref(x, w, stride, padding, output_padding, dilation, groups):
  """PyTorch's conv_transpose{1,2,3}d as loops. x (N, C, *in), w (C, O/G, *k) -> (N, O, *out).

  y[n, g*Og + o, i*s - p + k*d] += x[n, g*Cg + c, i] * w[g*Cg + c, o, k], and each output size
  is (in - 1)*s - 2p + d(k - 1) + output_padding + 1.
  """
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  n, c = x.shape[:2]
  og, ks = w.shape[1], w.shape[2:]
  cg = c // groups
  in_sp = x.shape[2:]
  out_sp = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, s, p, d, k, op in
                 zip(in_sp, stride, padding, dilation, ks, output_padding))
  y = np.zeros((n, groups * og) + out_sp)
  for g in range(groups):
    xg = x[:, g * cg:(g + 1) * cg]
    wg = w[g * cg:(g + 1) * cg]
    for i in np.ndindex(*in_sp):
      for k in np.ndindex(*ks):
        o = tuple(ii * s - p + kk * d for ii, kk, s, p, d in zip(i, k, stride, padding, dilation))
        if all(0 <= oo < size for oo, size in zip(o, out_sp)):
          y[(slice(None), slice(g * og, (g + 1) * og)) + o] += (
              xg[(slice(None), slice(None)) + i] @ wg[(slice(None), slice(None)) + k])
  return y


TORCH_CASES = [
    # (id, x (N, C, *in), w (C, O/G, *k), stride, padding, output_padding, dilation, groups)
    ("2d-plain", (2, 3, 4, 4), (3, 2, 3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 1),
    ("2d-groups-mixed", (2, 4, 3, 4), (4, 3, 3, 2), (2, 3), (1, 0), (1, 2), (1, 2), 2),
    ("2d-depthwise", (1, 3, 4, 3), (3, 1, 2, 3), (1, 2), (0, 1), (0, 1), (2, 1), 3),
    ("1d-groups", (2, 6, 5), (6, 2, 4), (3,), (2,), (2,), (1,), 3),
    ("3d-groups", (1, 4, 2, 3, 2), (4, 1, 2, 2, 3), (2, 1, 2), (0, 1, 1), (1, 0, 1), (1, 2, 1),
     2),
]


def _channels_last(a):
  return np.moveaxis(np.asarray(a), 1, -1)


def _channels_first(nsd):
  sp = "DHW"[3 - nsd:]
  return ("NC" + sp, "OI" + sp, "NC" + sp)


@pytest.mark.parametrize("xs,ws,stride,pad,op,dil,groups",
                         [pytest.param(*c[1:], id=c[0]) for c in TORCH_CASES])
def test_conv_transpose_matches_torch_semantics(xs, ws, stride, pad, op, dil, groups):
  x, w = rand(xs, F64, seed=5), rand(ws, F64, seed=6)
  want = torch_conv_transpose_ref(x, w, stride, pad, op, dil, groups)
  ks = ws[2:]
  explicit = [(d * (k - 1) - p, d * (k - 1) - p) for d, k, p in zip(dil, ks, pad)]
  kw = dict(rhs_dilation=dil, transpose_kernel=True, feature_group_count=groups,
            output_padding=op)
  channels_first = _channels_first(len(ks))
  # Channels-first, the torch weight as the OIHW forward kernel.
  got = jaxdnn.conv_transpose(x, w, stride, explicit, dimension_numbers=channels_first, **kw)
  assert_close(got, want, RTOL64, "channels-first")
  # output_padding folded into the explicit pads is the same thing.
  pads_op = [(lo, hi + o) for (lo, hi), o in zip(explicit, op)]
  got = jaxdnn.conv_transpose(x, w, stride, pads_op, dimension_numbers=channels_first,
                              **dict(kw, output_padding=None))
  assert_close(got, want, RTOL64, "pads with output padding")
  # Channels-last (the default layout), kernel spatial + (O/G, C).
  w_last = np.moveaxis(np.asarray(w), (0, 1), (-1, -2))
  got = jaxdnn.conv_transpose(_channels_last(x), w_last, stride, explicit, **kw)
  assert_close(got, _channels_last(want), RTOL64, "channels-last")


@pytest.mark.parametrize("transpose_kernel", [False, True])
@pytest.mark.parametrize("padding", ["SAME", "VALID", ((1, 2), (0, 1))], ids=str)
def test_grouped_conv_transpose_is_per_group_lax(transpose_kernel, padding):
  groups, cin, feats = 3, 6, 9
  x = rand((2, 4, 3, cin), F64, seed=7)
  cg, fg = cin // groups, feats // groups
  shape = (3, 2, fg, cin) if transpose_kernel else (3, 2, cg, feats)
  w = rand(shape, F64, seed=8)
  kw = dict(strides=(2, 1), padding=padding, rhs_dilation=(1, 2),
            transpose_kernel=transpose_kernel)
  parts = []
  for g in range(groups):
    wg = w[..., g * cg:(g + 1) * cg] if transpose_kernel else w[..., g * fg:(g + 1) * fg]
    parts.append(lax.conv_transpose(x[..., g * cg:(g + 1) * cg], wg,
                                    precision=lax.Precision.HIGHEST, **kw))
  want = jnp.concatenate(parts, axis=-1)
  got = jaxdnn.conv_transpose(x, w, feature_group_count=groups, **kw)
  assert_close(got, want, RTOL64)


def test_output_padding_extends_the_high_side():
  x, w = rand((1, 3, 3, 2), F64), rand((3, 3, 2, 2), F64)
  base = jaxdnn.conv_transpose(x, w, (2, 2), "SAME")
  padded = jaxdnn.conv_transpose(x, w, (2, 2), "SAME", output_padding=(1, 2))
  assert padded.shape == (1, 7, 8, 2) and base.shape == (1, 6, 6, 2)
  assert_close(padded[:, :6, :6], base, RTOL64)
  assert_close(jaxdnn.conv_transpose(x, w, (2, 2), "SAME", output_padding=1),
               jaxdnn.conv_transpose(x, w, (2, 2), "SAME", output_padding=(1, 1)), 0.0)


# ---------------------------------------------------------------------------------------------
# Linen Conv and ConvTranspose against flax.linen.

@pytest.mark.parametrize("shape,kwargs", _params(CONV_CASES))
def test_linen_conv_matches_flax(shape, kwargs):
  x = rand(shape, F64, seed=11)
  ours, ref, v_ours, v_ref = _linen_pair(dnn.Conv, nn.Conv, kwargs, x)
  _tree_same_shapes(v_ours, v_ref)
  want = ref.apply(v_ref, x)
  got = ours.apply(v_ref, x)
  assert got.dtype == want.dtype
  assert_close(got, want, RTOL64)
  _assert_jaxdnn_hlo(_hlo(ours.apply, v_ref, x), n_fwd=1)


@pytest.mark.parametrize("shape,kwargs", _params(CONV_T_CASES))
def test_linen_conv_transpose_matches_flax(shape, kwargs):
  x = rand(shape, F64, seed=12)
  ours, ref, v_ours, v_ref = _linen_pair(dnn.ConvTranspose, nn.ConvTranspose, kwargs, x)
  _tree_same_shapes(v_ours, v_ref)
  want = ref.apply(v_ref, x)
  got = ours.apply(v_ref, x)
  assert got.dtype == want.dtype
  assert_close(got, want, RTOL64)
  _assert_jaxdnn_hlo(_hlo(ours.apply, v_ref, x), n_fwd=1)


def test_linen_init_values():
  """The same init rng gives the very same parameter values as flax."""
  x = rand((2, 3, 5, 4), F64)
  for ours, ref in (
      (dnn.Conv(3, (3, 2), strides=2, padding="CIRCULAR"), nn.Conv(3, (3, 2), strides=2,
                                                                   padding="CIRCULAR")),
      (dnn.ConvTranspose(3, (3, 2), transpose_kernel=True, use_bias=False),
       nn.ConvTranspose(3, (3, 2), transpose_kernel=True, use_bias=False)),
      (dnn.ConvTranspose(5, (2, 2), strides=2, bias_init=BIAS_INIT),
       nn.ConvTranspose(5, (2, 2), strides=2, bias_init=BIAS_INIT))):
    _tree_equal(ours.init(jax.random.key(4), x), ref.init(jax.random.key(4), x))


@pytest.mark.parametrize("transpose_kernel", [False, True])
def test_linen_conv_transpose_groups_and_output_padding(transpose_kernel):
  """Against the PyTorch loop, with the module's own kernel brought to torch's layout."""
  groups, cin, feats = 2, 4, 6
  x = rand((2, 3, 4, cin), F64, seed=13)
  mod = dnn.ConvTranspose(feats, (3, 2), strides=(2, 3), padding=((1, 2), (0, 1)),
                          kernel_dilation=(1, 2), feature_group_count=groups,
                          output_padding=(1, 2), transpose_kernel=transpose_kernel,
                          param_dtype=F64, bias_init=BIAS_INIT)
  v = mod.init(jax.random.key(0), x)
  kernel, bias = v["params"]["kernel"], v["params"]["bias"]
  cg, fg = cin // groups, feats // groups
  assert kernel.shape == ((3, 2, fg, cin) if transpose_kernel else (3, 2, cg, feats))
  if transpose_kernel:
    w = np.moveaxis(np.asarray(kernel), (-1, -2), (0, 1))  # (C, F/G, kh, kw)
  else:
    # Untransposed: one correlation of the dilated input, i.e. torch's weight flipped, with
    # w[g*Cg + c, f] = kernel[flip, c, g*Fg + f].
    k = np.flip(np.asarray(kernel), (0, 1)).reshape(3, 2, cg, groups, fg)
    w = np.transpose(k, (3, 2, 4, 0, 1)).reshape(cin, fg, 3, 2)
  # Explicit pads (lo, hi) are torch padding p = d(k-1) - lo with (hi - lo) extra output.
  dil, ks = (1, 2), (3, 2)
  lo = (1, 0)
  p = tuple(d * (k - 1) - l for d, k, l in zip(dil, ks, lo))
  op = (2 - 1 + 1, 1 - 0 + 2)  # (hi - lo) + output_padding
  want = torch_conv_transpose_ref(np.moveaxis(np.asarray(x), -1, 1), w, (2, 3), p, op, dil,
                                  groups)
  want = np.moveaxis(want, 1, -1) + np.asarray(bias)
  assert_close(mod.apply(v, x), want, RTOL64)


@pytest.mark.parametrize("features,ks,strides,padding", [
    (4, (3, 3), 2, "CIRCULAR"),
    (4, (2, 3), (1, 2), "SAME"),
    (2, (3,), 3, "VALID"),
])
def test_linen_conv_transpose_groups_match_per_group_flax(features, ks, strides, padding):
  """Groups with CIRCULAR/SAME/VALID: the grouped module equals per-group flax modules."""
  groups, cin = 2, 4
  shape = (2,) + (3, 4)[:len(ks)] + (cin,)
  x = rand(shape, F64, seed=14)
  for tk in (False, True):
    mod = dnn.ConvTranspose(features, ks, strides=strides, padding=padding, transpose_kernel=tk,
                            feature_group_count=groups, param_dtype=F64, bias_init=BIAS_INIT)
    v = mod.init(jax.random.key(1), x)
    kernel, bias = v["params"]["kernel"], v["params"]["bias"]
    cg, fg = cin // groups, features // groups
    parts = []
    for g in range(groups):
      ref = nn.ConvTranspose(fg, ks, strides=strides, padding=padding, transpose_kernel=tk,
                             param_dtype=F64)
      kg = kernel[..., g * cg:(g + 1) * cg] if tk else kernel[..., g * fg:(g + 1) * fg]
      vg = {"params": {"kernel": kg, "bias": bias[g * fg:(g + 1) * fg]}}
      parts.append(ref.apply(vg, x[..., g * cg:(g + 1) * cg]))
    assert_close(mod.apply(v, x), jnp.concatenate(parts, -1), RTOL64, f"transpose_kernel={tk}")


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
def test_linen_low_precision(dtype):
  x = rand((2, 5, 6, 3), F32, seed=15)
  for ours_cls, ref_cls, kw in (
      (dnn.Conv, nn.Conv, dict(features=4, kernel_size=(3, 3), strides=2)),
      (dnn.ConvTranspose, nn.ConvTranspose, dict(features=4, kernel_size=(3, 3), strides=2,
                                                 padding="CIRCULAR"))):
    ours, ref, _, v = _linen_pair(ours_cls, ref_cls, kw, x, param_dtype=F32, dtype=dtype)
    got, want = ours.apply(v, x), ref.apply(v, x)
    assert got.dtype == want.dtype == dtype
    # Both round to `dtype`; the float64 computation on the same rounded values is the oracle.
    ref64 = ref_cls(**dict(kw, param_dtype=F64))
    want64 = ref64.apply(jax.tree.map(lambda a: a.astype(dtype).astype(F64), v),
                         x.astype(dtype).astype(F64))
    assert_close(got, want64, 2e-2, ours_cls.__name__)
    assert_close(want, want64, 2e-2, "flax")


def test_linen_conv_transpose_preferred_element_type():
  x = rand((1, 4, 4, 3), F32, seed=16)
  kw = dict(features=2, kernel_size=(3, 3), strides=2, preferred_element_type=F64)
  ours, ref, _, v = _linen_pair(dnn.ConvTranspose, nn.ConvTranspose, kw, x, param_dtype=F32)
  got, want = ours.apply(v, x), ref.apply(v, x)
  assert got.dtype == want.dtype == F64
  assert_close(got, want, 1e-6)


@pytest.mark.parametrize("algo", ALGOS, ids=algo_id)
def test_linen_modules_run_each_algo(algo):
  x = rand((2, 5, 5, 4), F64, seed=17)
  for ours_cls, ref_cls, kw in (
      (dnn.Conv, nn.Conv, dict(features=4, kernel_size=(3, 3), feature_group_count=2)),
      (dnn.ConvTranspose, nn.ConvTranspose, dict(features=3, kernel_size=(3, 3), strides=2))):
    ours = ours_cls(**kw, param_dtype=F64, bias_init=BIAS_INIT, algo=algo)
    ref = ref_cls(**kw, param_dtype=F64, bias_init=BIAS_INIT)
    v = ref.init(jax.random.key(0), x)
    grad = jax.grad(lambda v, x: _loss(ours.apply(v, x)), argnums=(0, 1))
    if unsupported(algo, grad, v, x):
      continue
    text = _hlo(ours.apply, v, x)
    _assert_jaxdnn_hlo(text, n_fwd=1)
    if algo != "auto":
      assert f"algo = {algo.id} : i32" in text
    assert_close(ours.apply(v, x), ref.apply(v, x), RTOL64, ours_cls.__name__)


def test_linen_conv_clone_follows_algo():
  x = rand((1, 5, 5, 2), F64)
  mod = dnn.Conv(3, (3, 3), algo="direct", param_dtype=F64)
  v = mod.init(jax.random.key(0), x)
  assert mod.conv_general_dilated == dnn.JaxdnnConvFn(jaxdnn.ConvAlgo.DIRECT)
  clone = mod.clone(algo="gemm")
  assert clone.conv_general_dilated == dnn.JaxdnnConvFn(jaxdnn.ConvAlgo.GEMM)
  text = _hlo(clone.apply, v, x)
  assert f"algo = {jaxdnn.ConvAlgo.GEMM.id} : i32" in text


def test_linen_grads_match_flax():
  x = rand((2, 4, 5, 4), F64, seed=18)
  cases = [
      (dnn.Conv, nn.Conv, dict(features=4, kernel_size=(3, 3), strides=2, padding="CIRCULAR",
                               feature_group_count=2)),
      (dnn.Conv, nn.Conv, dict(features=2, kernel_size=(2, 3), input_dilation=(2, 1),
                               padding=((1, 0), (1, 1)), use_bias=False)),
      (dnn.ConvTranspose, nn.ConvTranspose, dict(features=3, kernel_size=(3, 2), strides=2,
                                                 padding="CIRCULAR", transpose_kernel=True)),
      (dnn.ConvTranspose, nn.ConvTranspose, dict(features=3, kernel_size=(3, 3), strides=(1, 2),
                                                 kernel_dilation=2, padding="VALID")),
  ]
  for ours_cls, ref_cls, kw in cases:
    ours, ref, _, v = _linen_pair(ours_cls, ref_cls, kw, x)
    grad = lambda m: jax.grad(lambda v, x: _loss(m.apply(v, x)), argnums=(0, 1))(v, x)
    _tree_close(grad(ours), grad(ref), RTOL64, f"{ours_cls.__name__} {kw}")


# ---------------------------------------------------------------------------------------------
# NNX Conv and ConvTranspose against flax.nnx.

def _nnx_kwargs(kwargs, shape):
  kw = dict(kwargs)
  kw["out_features"] = kw.pop("features")
  kw["in_features"] = shape[-1]
  kw["param_dtype"] = F64
  return kw


def _nnx_params(model):
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _nnx_pair(ours_cls, ref_cls, kwargs, shape, **extra):
  """(ours, flax's) with the same random parameters, after checking the shapes of both trees.

  The modules are built abstractly (running the inits costs compiles); test_nnx_init_values
  checks the values an init gives."""
  kw = _nnx_kwargs(kwargs, shape)
  ours = nnx.eval_shape(lambda: ours_cls(**kw, **extra, rngs=nnx.Rngs(3)))
  ref = nnx.eval_shape(lambda: ref_cls(**kw, rngs=nnx.Rngs(3)))
  _tree_same_shapes(_nnx_params(ours), _nnx_params(ref))
  values = _random_like(_nnx_params(ref))
  nnx.update(ours, values)
  nnx.update(ref, values)
  if kw.get("mask") is not None:  # eval_shape made the mask abstract too
    ours.mask = ref.mask = kw["mask"]
  return ours, ref


def test_nnx_init_values():
  """The same rngs give the very same parameter values as flax."""
  for ours, ref in (
      (dnnx.Conv(4, 3, (3, 2), feature_group_count=2, rngs=nnx.Rngs(5)),
       nnx.Conv(4, 3, (3, 2), feature_group_count=2, rngs=nnx.Rngs(5))),
      (dnnx.ConvTranspose(4, 3, (3, 2), transpose_kernel=True, rngs=nnx.Rngs(5)),
       nnx.ConvTranspose(4, 3, (3, 2), transpose_kernel=True, rngs=nnx.Rngs(5))),
      (dnnx.ConvTranspose(4, 3, (2, 2), use_bias=False, rngs=nnx.Rngs(5)),
       nnx.ConvTranspose(4, 3, (2, 2), use_bias=False, rngs=nnx.Rngs(5)))):
    _tree_equal(_nnx_params(ours), _nnx_params(ref))


@pytest.mark.parametrize("shape,kwargs", _params(CONV_CASES))
def test_nnx_conv_matches_flax(shape, kwargs):
  x = rand(shape, F64, seed=21)
  ours, ref = _nnx_pair(dnnx.Conv, nnx.Conv, kwargs, shape)
  assert isinstance(ours, nnx.Conv)
  want = ref(x)
  assert_close(ours(x), want, RTOL64)
  _assert_jaxdnn_hlo(_hlo(lambda x: ours(x), x), n_fwd=1)


@pytest.mark.parametrize("shape,kwargs", _params(CONV_T_CASES))
def test_nnx_conv_transpose_matches_flax(shape, kwargs):
  x = rand(shape, F64, seed=22)
  ours, ref = _nnx_pair(dnnx.ConvTranspose, nnx.ConvTranspose, kwargs, shape)
  for name in ("kernel_size", "in_features", "out_features", "strides", "padding",
               "kernel_dilation", "use_bias", "dtype", "param_dtype", "precision",
               "transpose_kernel", "preferred_element_type", "kernel_shape"):
    assert getattr(ours, name) == getattr(ref, name), name
  assert isinstance(ours.kernel, nnx.Param)
  assert isinstance(ours.bias, nnx.Param) == isinstance(ref.bias, nnx.Param)
  want = ref(x)
  got = ours(x)
  assert got.dtype == want.dtype
  assert_close(got, want, RTOL64)
  _assert_jaxdnn_hlo(_hlo(lambda x: ours(x), x), n_fwd=1)


def test_nnx_conv_transpose_groups_output_padding():
  """NNX and Linen ConvTranspose give the same parameters (shapes) and results with groups."""
  x = rand((2, 3, 4, 4), F64, seed=23)
  kw = dict(kernel_size=(3, 3), strides=2, padding="SAME", feature_group_count=2,
            output_padding=(1, 0), transpose_kernel=True, param_dtype=F64)
  ours = dnnx.ConvTranspose(4, 6, **kw, rngs=nnx.Rngs(0))
  assert ours.kernel.shape == (3, 3, 3, 4) and ours.feature_group_count == 2
  linen = dnn.ConvTranspose(6, **kw)
  v = {"params": _nnx_params(ours)}
  assert jax.tree.map(jnp.shape, linen.init(jax.random.key(0), x)) == jax.tree.map(jnp.shape, v)
  y = ours(x)
  assert y.shape == (2, 7, 8, 6)
  assert_close(y, linen.apply(v, x), RTOL64)


def test_nnx_grads_match_flax():
  x = rand((2, 4, 5, 4), F64, seed=24)
  cases = [
      (dnnx.Conv, nnx.Conv, dict(features=4, kernel_size=(3, 3), strides=2, padding="CIRCULAR",
                                 feature_group_count=2)),
      (dnnx.ConvTranspose, nnx.ConvTranspose, dict(features=3, kernel_size=(3, 2), strides=2,
                                                   padding="CIRCULAR", transpose_kernel=True)),
      (dnnx.ConvTranspose, nnx.ConvTranspose, dict(features=2, kernel_size=(2, 3),
                                                   padding=((1, 0), (2, 1)))),
  ]
  for ours_cls, ref_cls, kw in cases:
    ours, ref = _nnx_pair(ours_cls, ref_cls, kw, x.shape)
    grad = lambda m: nnx.to_pure_dict(nnx.grad(lambda m: _loss(m(x)))(m))
    _tree_close(grad(ours), grad(ref), RTOL64, f"{ours_cls.__name__} {kw}")
    gx = lambda m: jax.grad(lambda x: _loss(m(x)))(x)
    assert_close(gx(ours), gx(ref), RTOL64, "input grad")


def test_nnx_out_sharding():
  x = rand((1, 4, 4, 2), F64)
  layer = dnnx.Conv(2, 3, (3, 3), param_dtype=F64, rngs=nnx.Rngs(0))
  assert layer(x, out_sharding=None).shape == (1, 4, 4, 3)
  with pytest.raises(NotImplementedError, match="out_sharding"):
    layer(x, out_sharding=jax.sharding.PartitionSpec())


def test_nnx_jit_and_algo():
  x = rand((2, 5, 5, 2), F32)
  layer = dnnx.Conv(2, 3, (3, 3), algo="direct", activation="relu", rngs=nnx.Rngs(0))
  ref = nnx.Conv(2, 3, (3, 3), rngs=nnx.Rngs(0))
  got = nnx.jit(lambda m, x: m(x))(layer, x)
  assert_close(got, jax.nn.relu(ref(x)), 1e-5)
  text = _hlo(lambda x: layer(x), x)
  assert f"algo = {jaxdnn.ConvAlgo.DIRECT.id} : i32" in text


class _Net(nnx.Module):
  def __init__(self, rngs):
    self.c1 = nnx.Conv(3, 4, (3, 3), rngs=rngs, param_dtype=F64)
    self.blocks = nnx.List([nnx.Conv(4, 4, (3, 3), strides=2, rngs=rngs, param_dtype=F64),
                            nnx.Conv(4, 2, (1, 1), rngs=rngs, param_dtype=F64)])
    self.custom = nnx.Conv(2, 2, (3, 3), rngs=rngs, param_dtype=F64,
                           conv_general_dilated=functools.partial(lax.conv_general_dilated))
    self.up = nnx.ConvTranspose(2, 2, (2, 2), strides=2, rngs=rngs, param_dtype=F64)

  def __call__(self, x):
    x = jax.nn.relu(self.c1(x))
    for b in self.blocks:
      x = b(x)
    return self.up(self.custom(x))


def test_use_jaxdnn_switches_plain_nnx_convs():
  x = rand((2, 6, 6, 3), F64, seed=25)
  net = _Net(nnx.Rngs(0))
  before = net(x)
  params = _nnx_params(net)
  text = _hlo(lambda x: net(x), x)
  assert text.count("convolution") >= 3 and "jaxdnn" not in text
  assert dnnx.use_jaxdnn(net, algo="gemm") is net
  _tree_equal(_nnx_params(net), params)
  assert net.c1.conv_general_dilated == dnn.JaxdnnConvFn("gemm")
  assert all(b.conv_general_dilated == dnn.JaxdnnConvFn("gemm") for b in net.blocks)
  assert isinstance(net.custom.conv_general_dilated, functools.partial)  # left alone
  text = _hlo(lambda x: net(x), x)
  assert text.count("@jaxdnn_conv_fwd(") == 3
  # The remaining XLA convolutions are the custom conv's and flax ConvTranspose's.
  assert text.count("stablehlo.convolution") == 2
  assert_close(net(x), before, RTOL64)
  assert_close(nnx.jit(lambda m, x: m(x))(net, x), before, RTOL64)


# ---------------------------------------------------------------------------------------------
# intercept_convs.

class _LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(4, (3, 3), padding="CIRCULAR")(x))
    x = nn.Conv(4, (3, 3), strides=2, feature_group_count=2)(x)
    return nn.Conv(2, (1, 1), use_bias=False)(x)


def test_intercept_convs_runs_plain_linen_convs_on_jaxdnn():
  x = rand((2, 6, 6, 3), F64, seed=26)
  model = _LinenNet()
  v = model.init(jax.random.key(0), x)
  v = jax.tree.map(lambda a: a.astype(F64), v)
  want = model.apply(v, x)
  assert "convolution" in _hlo(model.apply, v, x)
  with dnn.intercept_convs():
    text = _hlo(model.apply, v, x)
    got = model.apply(v, x)
    grad_text = _hlo(jax.grad(lambda v, x: _loss(model.apply(v, x)), argnums=(0, 1)), v, x)
  _assert_jaxdnn_hlo(text, n_fwd=3)
  assert_close(got, want, RTOL64)
  assert "@jaxdnn_conv_bwd_filter(" in grad_text and "convolution" not in grad_text
  # Outside the context, flax's own convolution again (a fresh trace).
  assert "convolution" in _hlo(lambda v, x: model.apply(v, x), v, x)


def test_intercept_convs_algo_and_leaves_others_alone():
  x = rand((1, 5, 5, 2), F64, seed=27)

  class Mixed(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = dnn.Conv(2, (3, 3), algo="direct")(x)
      x = nn.Conv(2, (3, 3), conv_general_dilated=lax.conv_general_dilated)(x)
      return nn.Conv(2, (3, 3))(x)

  model = Mixed()
  v = model.init(jax.random.key(0), x)
  with dnn.intercept_convs(algo="gemm"):
    text = _hlo(model.apply, v, x)
  # dnn.Conv fuses its bias (jaxdnn_conv_fwd_fused); the intercepted flax Conv adds it after.
  assert text.count("@jaxdnn_conv_fwd(") == 1
  assert text.count("@jaxdnn_conv_fwd_fused(") == 1
  assert text.count(f"algo = {jaxdnn.ConvAlgo.DIRECT.id} : i32") == 1
  assert text.count(f"algo = {jaxdnn.ConvAlgo.GEMM.id} : i32") == 1
  assert "convolution" in text  # the conv with its own conv_general_dilated
  with pytest.raises(ValueError, match="algo"):
    with dnn.intercept_convs(algo="bogus"):
      pass


# ---------------------------------------------------------------------------------------------
# Activations, pooling, errors, optional flax.

@pytest.mark.parametrize("name,fn", [
    ("relu", jax.nn.relu),
    ("leaky_relu", jax.nn.leaky_relu),
    ("relu6", jax.nn.relu6),
    ("clipped_relu", jax.nn.relu6),
    ("elu", jax.nn.elu),
    ("sigmoid", jax.nn.sigmoid),
    ("tanh", jnp.tanh),
    ("gelu", functools.partial(jax.nn.gelu, approximate=False)),
    ("gelu_tanh", functools.partial(jax.nn.gelu, approximate=True)),
    ("silu", jax.nn.silu),
    ("swish", jax.nn.silu),
    ("identity", lambda y: y),
    ("RELU", jax.nn.relu),
    (lambda y: y * y, lambda y: y * y),
])
def test_activation(name, fn):
  x = 20.0 * rand((1, 4, 4, 2), F64, seed=28)  # outputs beyond relu6's clip and elu's knee
  kw = dict(features=3, kernel_size=(3, 3), param_dtype=F64, bias_init=BIAS_INIT)
  for ours_cls, ref_cls in ((dnn.Conv, nn.Conv), (dnn.ConvTranspose, nn.ConvTranspose)):
    ours = ours_cls(**kw, activation=name)
    v = ours.init(jax.random.key(0), x)
    plain = ref_cls(**kw).apply(v, x)
    assert_close(ours.apply(v, x), fn(plain), RTOL64, f"{ours_cls.__name__} {name}")
  nkw = dict(kernel_size=(3, 3), param_dtype=F64, bias_init=BIAS_INIT)
  for ours_cls, ref_cls in ((dnnx.Conv, nnx.Conv), (dnnx.ConvTranspose, nnx.ConvTranspose)):
    ours = ours_cls(2, 3, **nkw, activation=name, rngs=nnx.Rngs(0))
    ref = ref_cls(2, 3, **nkw, rngs=nnx.Rngs(0))
    assert_close(ours(x), fn(ref(x)), RTOL64, f"nnx {ours_cls.__name__} {name}")


def test_no_activation_by_default():
  x = rand((1, 4, 4, 2), F64, seed=29)
  mod = dnn.Conv(3, (3, 3), param_dtype=F64)
  v = mod.init(jax.random.key(0), x)
  y = mod.apply(v, x)
  assert float(jnp.min(y)) < 0  # no relu-like clipping
  assert_close(y, nn.Conv(3, (3, 3), param_dtype=F64).apply(v, x), RTOL64)


@pytest.mark.parametrize("padding", ["VALID", "SAME", ((1, 0), (0, 1))], ids=str)
def test_pooling_modules(padding):
  x = rand((2, 6, 5, 3), F64, seed=30)
  np.testing.assert_array_equal(
      dnn.MaxPool((3, 2), strides=(2, 1), padding=padding).apply({}, x),
      nn.max_pool(x, (3, 2), strides=(2, 1), padding=padding))
  for cip in (True, False):
    # Equal up to rounding: XLA turns flax's division by the (constant) count into a
    # multiplication by its reciprocal; jaxdnn divides.
    y = dnn.AvgPool((3, 2), strides=(2, 1), padding=padding, count_include_pad=cip).apply({}, x)
    y_ref = nn.avg_pool(x, (3, 2), strides=(2, 1), padding=padding, count_include_pad=cip)
    assert y.dtype == y_ref.dtype
    np.testing.assert_allclose(y, y_ref, rtol=4e-15, atol=4e-16)
  if padding == "SAME":  # count_include_pad matters here
    a = dnn.AvgPool((3, 3), padding="SAME").apply({}, x)
    b = dnn.AvgPool((3, 3), padding="SAME", count_include_pad=False).apply({}, x)
    assert not np.allclose(a, b)


X = np.ones((1, 4, 4, 2), np.float32)
W = np.ones((3, 3, 2, 2), np.float32)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(strides=(2,)), ValueError, "strides"),
    (dict(strides=(0, 1)), ValueError, "strides"),
    (dict(strides="ab"), TypeError, "strides"),
    (dict(padding="CIRCULAR"), ValueError, "padding"),
    (dict(padding=((1, 1),)), ValueError, "padding"),
    (dict(padding=((1, 1, 1), (0, 0))), ValueError, "padding"),
    (dict(padding=[("a", 1), (0, 0)]), TypeError, "padding"),
    (dict(rhs_dilation=(1, 0)), ValueError, "rhs_dilation"),
    (dict(output_padding=(1, -1)), ValueError, "output_padding"),
    (dict(output_padding=(1, 1, 1)), ValueError, "output_padding"),
    (dict(feature_group_count=0), ValueError, "feature_group_count"),
    (dict(feature_group_count=3, transpose_kernel=True), ValueError, "feature_group_count"),
    (dict(feature_group_count=2), ValueError, "feature_group_count"),
    (dict(dimension_numbers=("NCHW", "OIHW")), ValueError, "dimension_numbers"),
    (dict(algo="bogus"), ValueError, "algo"),
    (dict(preferred_element_type=np.int32), TypeError, "preferred_element_type"),
])
def test_conv_transpose_bad_arguments(kwargs, exc, match):
  kwargs = dict(dict(strides=(1, 1), padding="SAME"), **kwargs)
  with pytest.raises(exc, match=match):
    jaxdnn.conv_transpose(X, W, **kwargs)


def test_conv_transpose_bad_operands():
  with pytest.raises(ValueError, match="transpose_kernel"):
    jaxdnn.conv_transpose(X, np.ones((3, 3, 2, 3), np.float32), (1, 1), "SAME",
                          transpose_kernel=True)
  with pytest.raises(ValueError, match="rank"):
    jaxdnn.conv_transpose(X, W[0], (1, 1), "SAME")
  with pytest.raises(ValueError, match="spatial"):
    jaxdnn.conv_transpose(X[0, 0], W[0, 0], (1,), "SAME")


def test_module_bad_arguments():
  x = jnp.ones((1, 4, 4, 4))
  with pytest.raises(ValueError, match="conv_general_dilated"):
    dnn.Conv(2, (3, 3), conv_general_dilated=lax.conv_general_dilated)
  with pytest.raises(ValueError, match="conv_general_dilated"):
    dnn.Conv(2, (3, 3), conv_general_dilated_cls=lambda: lax.conv_general_dilated)
  with pytest.raises(ValueError, match="activation"):
    dnn.Conv(2, (3, 3), activation="nope")
  with pytest.raises(ValueError, match="algo"):
    dnn.Conv(2, (3, 3), algo="bogus")
  with pytest.raises(ValueError, match="activation"):
    dnn.ConvTranspose(2, (3, 3), activation=3)
  with pytest.raises(ValueError, match="algo"):
    dnn.ConvTranspose(2, (3, 3), algo="bogus")
  bad_linen = [
      (dict(features=3, feature_group_count=2), "feature_group_count"),
      (dict(features=2, feature_group_count=3), "feature_group_count"),
      (dict(features=2, padding="CIRCULAR", output_padding=1), "output_padding"),
      (dict(features=2, padding="CAUSAL"), "padding"),
      (dict(features=2, padding=(1, 2, 3)), "padding"),
      (dict(features=2, strides=(1, 2, 3)), "strides"),
      (dict(features=2, kernel_dilation=(1, 2, 3)), "kernel_dilation"),
      (dict(features=2, mask=np.ones((3, 3, 4, 3))), "mask"),
      (dict(features=0), "features"),
  ]
  for kw, match in bad_linen:
    with pytest.raises(ValueError, match=match):
      dnn.ConvTranspose(kernel_size=(3, 3), **kw).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="kernel_size"):
    dnn.ConvTranspose(2, (1, 1, 1, 1)).init(jax.random.key(0), x)
  rngs = nnx.Rngs(0)
  with pytest.raises(ValueError, match="conv_general_dilated"):
    dnnx.Conv(4, 2, (3, 3), conv_general_dilated=lax.conv_general_dilated, rngs=rngs)
  with pytest.raises(ValueError, match="activation"):
    dnnx.Conv(4, 2, (3, 3), activation="nope", rngs=rngs)
  with pytest.raises(ValueError, match="algo"):
    dnnx.Conv(4, 2, (3, 3), algo="bogus", rngs=rngs)
  with pytest.raises(ValueError, match="feature_group_count"):
    dnnx.ConvTranspose(4, 3, (3, 3), feature_group_count=2, rngs=rngs)
  with pytest.raises(ValueError, match="algo"):
    dnnx.ConvTranspose(4, 2, (3, 3), algo="bogus", rngs=rngs)
  layer = dnnx.ConvTranspose(4, 2, (3, 3), rngs=rngs)
  with pytest.raises(ValueError, match="inputs"):
    layer(jnp.ones((1, 4, 4, 3)))


def test_flax_is_optional():
  """`import jaxdnn` does not import flax; without flax, jaxdnn.nn says how to get it."""
  code = (
      "import sys\n"
      "import jaxdnn\n"
      "assert 'flax' not in sys.modules, 'import jaxdnn imported flax'\n"
      "sys.modules['flax'] = None\n"
      "try:\n"
      "  import jaxdnn.nn\n"
      "except ImportError as e:\n"
      "  assert 'jaxdnn[examples]' in str(e), str(e)\n"
      "else:\n"
      "  raise AssertionError('jaxdnn.nn imported without flax')\n"
  )
  here = os.path.dirname(os.path.abspath(__file__))
  out = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
