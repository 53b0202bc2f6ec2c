"""jit vs eager, what the lowered HLO holds, and the JAXDNN_REFERENCE=1 escape hatch."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import jaxdnn
from grid import NCDHW, NCHW, NHWC, NWC, Case
from helpers import (algo_params, lax_conv64, lax_conv_hi, rand, require_supported,
                     unsupported)
from jaxdnn._src.algorithms import parse_algo
from tolerances import F32, F64, assert_close, tolerance

TARGETS = ("jaxdnn_conv_fwd", "jaxdnn_conv_bwd_data", "jaxdnn_conv_bwd_filter")

JIT_CASES = [
    Case("nhwc-stride2", (2, 6, 6, 3), (3, 3, 3, 4), (2, 2), "SAME", dnums=NHWC),
    Case("nchw-groups2-dilated", (1, 4, 7, 6), (4, 2, 3, 3), (1, 1), "SAME", rhs_dilation=(2, 1),
         dnums=NCHW, fgc=2),
    Case("odd-layout-lhs-dilation", (2, 5, 4, 3), (2, 2, 3, 2), (1, 1), ((1, 0), (2, 1)),
         lhs_dilation=(2, 2), dnums=("NWHC", "WHIO", "NCWH")),
    Case("1d-nwc", (2, 7, 3), (3, 3, 2), (1,), "VALID", dnums=NWC),
    Case("3d-ncdhw", (1, 2, 3, 4, 3), (2, 2, 2, 2, 2), (1, 1, 1), "SAME", dnums=NCDHW),
]
JIT_PARAMS = [pytest.param(c, id=c.id) for c in JIT_CASES]


def _conv(case, algo):
  return functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo)


def _loss(conv):
  return lambda x, w: jnp.sum(jnp.sin(conv(x, w)))


def _grad(conv):
  return jax.grad(_loss(conv), argnums=(0, 1))


def _grad_of_grad(conv):
  g = _grad(conv)
  return jax.grad(lambda x, w: jnp.sum(g(x, w)[0] ** 2) + jnp.sum(g(x, w)[1] ** 2),
                  argnums=(0, 1))


def _inputs(case, dtype=F64):
  return rand(case.lhs, dtype, seed=31), rand(case.rhs, dtype, seed=32)


@pytest.mark.parametrize("case", JIT_PARAMS)
@pytest.mark.parametrize("dtype", [F64, F32], ids=str)
@algo_params
def test_jit_matches_eager(case, dtype, algo):
  x, w = _inputs(case, dtype)
  conv = _conv(case, algo)
  require_supported(algo, _grad(conv), x, w)
  tol = tolerance(dtype)
  eager = conv(x, w)
  jitted = jax.jit(conv)(x, w)
  assert jitted.dtype == eager.dtype == dtype
  assert_close(jitted, eager, tol, "jit vs eager")
  assert_close(jitted, lax_conv64(x, w, **case.kwargs()), tol, "jit vs lax")
  g_eager = _grad(conv)(x, w)
  g_jit = jax.jit(_grad(conv))(x, w)
  g_ref = _grad(functools.partial(lax_conv_hi, **case.kwargs()))(x.astype(F64), w.astype(F64))
  for a, b, r in zip(g_jit, g_eager, g_ref):
    assert_close(a, b, tol, "grad jit vs eager")
    assert_close(a, r, tol, "grad vs lax")


@pytest.mark.parametrize("case", JIT_PARAMS)
@algo_params
def test_grad_hlo_uses_only_jaxdnn_custom_calls(case, algo):
  x, w = _inputs(case)
  conv = _conv(case, algo)
  require_supported(algo, _grad_of_grad(conv), x, w)
  for name, fn in (("grad", _grad(conv)), ("grad-of-grad", _grad_of_grad(conv))):
    text = jax.jit(fn).lower(x, w).as_text()
    # (a transposed convolution may run as other operations' targets, fewer than all three:
    # algorithms.lhs_dilation_mapping)
    for target in TARGETS if case.lhs_dilation is None else ():
      assert f"@{target}(" in text, f"{name}: no {target} custom call"
    assert sum(text.count(f"@{t}(") for t in TARGETS) >= 3, f"{name}: jaxdnn calls"
    assert "convolution" not in text, f"{name}: XLA convolution in the HLO"
    if algo != "auto":
      # The requested family is the one every custom call runs.
      assert text.count(f"algo = {algo.id} : i32") == sum(text.count(f"@{t}(") for t in TARGETS)


def test_forward_hlo_single_custom_call():
  case = JIT_CASES[0]
  x, w = _inputs(case)
  text = jax.jit(_conv(case, "auto")).lower(x, w).as_text()
  assert text.count("@jaxdnn_conv_fwd(") == 1
  assert "@jaxdnn_conv_bwd" not in text
  assert "convolution" not in text


@pytest.mark.parametrize("case", JIT_PARAMS[:3])
@pytest.mark.parametrize("algo", ["auto", jaxdnn.ConvAlgo.DIRECT, jaxdnn.ConvAlgo.GEMM],
                         ids=lambda a: a if isinstance(a, str) else a.value)
def test_reference_env_var(case, algo, monkeypatch):
  x, w = _inputs(case)
  kwargs = case.kwargs()
  want_y = lax_conv64(x, w, **kwargs)
  want_g = _grad(functools.partial(lax_conv_hi, **kwargs))(x, w)

  monkeypatch.setenv("JAXDNN_REFERENCE", "1")
  # Fresh functions (new jit cache entries) traced and lowered under the variable.
  fwd = jax.jit(lambda x, w: jaxdnn.conv(x, w, **kwargs, algo=algo))
  grad = jax.jit(_grad(lambda x, w: jaxdnn.conv(x, w, **kwargs, algo=algo)))
  for fn in (fwd, grad):
    text = fn.lower(x, w).as_text()
    assert "convolution" in text
    assert "jaxdnn_conv" not in text
  assert_close(fwd(x, w), want_y, tolerance(F64), "reference forward")
  for a, b in zip(grad(x, w), want_g):
    assert_close(a, b, tolerance(F64), "reference grad")

  monkeypatch.delenv("JAXDNN_REFERENCE")
  conv = lambda x, w: jaxdnn.conv(x, w, **kwargs, algo=algo)
  require_supported(algo, conv, x, w)  # the kernels run again: the backend must take `algo`
  fresh = jax.jit(conv)
  text = fresh.lower(x, w).as_text()
  assert any(f"@{t}(" in text for t in TARGETS) and "convolution" not in text


@pytest.mark.parametrize("value", ["0", "", "no"])
def test_reference_env_var_off_values(value, monkeypatch):
  case = JIT_CASES[0]
  x, w = _inputs(case)
  kwargs = case.kwargs()
  monkeypatch.setenv("JAXDNN_REFERENCE", value)
  text = jax.jit(lambda x, w: jaxdnn.conv(x, w, **kwargs)).lower(x, w).as_text()
  assert "@jaxdnn_conv_fwd(" in text and "convolution" not in text


def test_jit_static_algo_and_retrace():
  """Different algos of one jitted function each give the lax result."""
  case = JIT_CASES[1]
  x, w = _inputs(case)
  f = jax.jit(lambda x, w, algo: jaxdnn.conv(x, w, **case.kwargs(), algo=algo),
              static_argnums=2)
  want = lax_conv64(x, w, **case.kwargs())
  for algo in ("auto", "direct", "gemm", "implicit_gemm", "implicit_precomp_gemm"):
    fn = functools.partial(jaxdnn.conv, **case.kwargs(), algo=algo)
    if unsupported(parse_algo(algo), fn, x, w):
      continue
    assert_close(f(x, w, algo), want, tolerance(F64), algo)
