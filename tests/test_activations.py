"""jaxdnn activations against jax.nn: values (float64 at 1e-12, per-dtype bounds for 16/32-bit),
kinks, NaN/inf, first derivatives (forward and reverse, from the output and from the input),
second derivatives (check_grads order 2; zero for the piecewise-linear kinds), vmap over every
operand combination, jit and the HLO custom call, size 0, errors, CUDA lowering, and (marked gpu)
the CUDA kernels against jax.nn for every dtype with tails and offset slices.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxdnn
from helpers import PLATFORM
from jaxdnn._src import ffi
from jaxdnn._src.primitives import activations as act_prims
from jaxdnn._src.primitives.activations import ActivationSpec
from tolerances import BF16, F16, F32, F64, RTOL, assert_close

CUDA = ffi.extension("cuda")
DTYPES = (F64, F32, BF16, F16)


def _clip(ceiling):
  return lambda x: jnp.minimum(jnp.maximum(x, 0), ceiling)


def _clip_grad_convention(ceiling):
  """clipped_relu with relu6's derivative convention (0 at both kinks), for any ceiling."""
  @jax.custom_jvp
  def f(x):
    return jnp.minimum(jnp.maximum(x, 0), ceiling)
  f.defjvps(lambda t, y, x: jnp.where((x > 0) & (x < ceiling), t, 0))
  return f


# name -> (jaxdnn function, jax.nn reference, canonical kind, param, smooth)
CASES = {
    "identity": (jaxdnn.identity, lambda x: x, "identity", None, True),
    "relu": (jaxdnn.relu, jax.nn.relu, "relu", None, False),
    "leaky_relu": (jaxdnn.leaky_relu, jax.nn.leaky_relu, "leaky_relu", 0.01, False),
    "leaky_relu_0.2": (functools.partial(jaxdnn.leaky_relu, negative_slope=0.2),
                       functools.partial(jax.nn.leaky_relu, negative_slope=0.2), "leaky_relu",
                       0.2, False),
    "clipped_relu_2.5": (functools.partial(jaxdnn.clipped_relu, ceiling=2.5),
                         _clip_grad_convention(2.5), "clipped_relu", 2.5, False),
    "relu6": (jaxdnn.relu6, jax.nn.relu6, "clipped_relu", 6.0, False),
    "elu": (jaxdnn.elu, jax.nn.elu, "elu", 1.0, False),
    "elu_0.5": (functools.partial(jaxdnn.elu, alpha=0.5), functools.partial(jax.nn.elu, alpha=0.5),
                "elu", 0.5, False),
    "sigmoid": (jaxdnn.sigmoid, jax.nn.sigmoid, "sigmoid", None, True),
    "tanh": (jaxdnn.tanh, jnp.tanh, "tanh", None, True),
    "gelu_tanh": (jaxdnn.gelu, jax.nn.gelu, "gelu_tanh", None, True),
    "gelu_exact": (functools.partial(jaxdnn.gelu, approximate=False),
                   functools.partial(jax.nn.gelu, approximate=False), "gelu", None, True),
    "silu": (jaxdnn.silu, jax.nn.silu, "silu", None, True),
    "swish": (jaxdnn.swish, jax.nn.swish, "silu", None, True),
}
# Every name `jaxdnn.activation` accepts -> reference.
KIND_REFS = {
    "identity": lambda x: x, "linear": lambda x: x, "none": lambda x: x,
    "relu": jax.nn.relu, "leaky_relu": jax.nn.leaky_relu, "clipped_relu": jax.nn.relu6,
    "relu6": jax.nn.relu6, "elu": jax.nn.elu, "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": jax.nn.gelu, "gelu_approximate": jax.nn.gelu, "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def _inputs(dtype, shape=(5, 37), seed=0, kinks=(0.0, 6.0, 2.5, -0.0)):
  """Normal values (scale 3) with the kinks planted exactly; rounded to dtype."""
  rng = np.random.default_rng(seed)
  x = 3 * rng.standard_normal(shape)
  flat = x.reshape(-1)
  flat[:len(kinks)] = kinks
  return jnp.asarray(x).astype(dtype)


def _f64(a):
  return jnp.asarray(np.asarray(a, np.float64))


def _spec(case, from_output=None):
  _, _, kind, param, _ = CASES[case]
  return ActivationSpec.make(kind, param, from_output)


# ---------------------------------------------------------------------------------------------
# Values.

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_matches_jax_nn(dtype):
  x = _inputs(dtype)
  ours = jax.jit(lambda a: {c: CASES[c][0](a) for c in CASES})(x)
  refs = jax.jit(lambda a: {c: CASES[c][1](a) for c in CASES})(_f64(x))
  for case in CASES:
    assert ours[case].dtype == x.dtype and ours[case].shape == x.shape
    assert_close(ours[case], refs[case], RTOL[dtype], f"{case} {dtype}")


def test_every_kind_and_alias():
  x = _inputs(F64, (4, 9))
  for dtype in (F64, F32):
    ours = jax.jit(lambda a: {k: jaxdnn.activation(a, k) for k in KIND_REFS})(x.astype(dtype))
    for kind, ref in KIND_REFS.items():
      assert_close(ours[kind], ref(x), RTOL[dtype], f"{kind} {dtype}")
  assert set(KIND_REFS) == set(jaxdnn.activations.KINDS)


def test_kinks_exact():
  x = jnp.array([-1.0, -0.0, 0.0, 1e-300, 6.0, 6.5, 2.5], F64)
  np.testing.assert_array_equal(jaxdnn.relu(x), jax.nn.relu(x))
  np.testing.assert_array_equal(jaxdnn.relu6(x), jax.nn.relu6(x))
  np.testing.assert_array_equal(jaxdnn.clipped_relu(x, 2.5), jnp.clip(x, 0, 2.5))
  g = lambda f: jax.grad(lambda a: jnp.sum(f(a)))(x)
  np.testing.assert_array_equal(g(jaxdnn.relu), g(jax.nn.relu))        # relu'(0) = 0
  np.testing.assert_array_equal(g(jaxdnn.relu6), g(jax.nn.relu6))      # 0 at 0 and 6
  np.testing.assert_array_equal(g(jaxdnn.leaky_relu), g(jax.nn.leaky_relu))  # 1 at 0
  np.testing.assert_array_equal(g(jaxdnn.elu), g(jax.nn.elu))          # alpha at 0


def _values_and_grads(fns):
  """jit of x -> {case: (f(x), grad of sum f at x)}."""
  grad = lambda f: jax.grad(lambda b: jnp.sum(f(b)))
  return jax.jit(lambda a: {c: (f(a), grad(f)(a)) for c, f in fns.items()})


@pytest.mark.parametrize("dtype", (BF16, F16), ids=str)
def test_16bit_selections_are_exact(dtype):
  """relu-likes return inputs, 0 or the ceiling: bit-exact, and a ceiling the type cannot
  represent is rounded to nearest (the bfloat16 kernels skip rounding only when it is exact)."""
  x = jnp.concatenate([_inputs(dtype).reshape(-1), jnp.array([np.nan, np.inf, -np.inf], dtype)])
  same = lambda a, b: np.testing.assert_array_equal(np.asarray(a, F32), np.asarray(b, F32))
  same(jaxdnn.relu(x), jnp.maximum(x, 0))
  for ceiling in (2.5, 2.4):  # 2.4f rounds up to bfloat16 (its low half-word is >= 0x8000)
    same(jaxdnn.clipped_relu(x, ceiling), jnp.clip(x.astype(F32), 0, ceiling).astype(dtype))
  ct = _inputs(dtype, (x.size,), seed=3)
  same(jax.vjp(jaxdnn.relu, x)[1](ct)[0], jnp.where(x > 0, ct, jnp.zeros_like(ct)))


@pytest.mark.skipif(PLATFORM != "cpu", reason="XLA:CPU's flush-to-zero convention")
def test_bfloat16_rounding_bitwise_like_xla_cpu():
  """bfloat16 results round to nearest even from float32 exactly as XLA:CPU's (the CPU kernels
  may use AVX512-BF16's conversion, whose blocks holding a subnormal take the scalar rounding):
  leaky_relu(x, 0.3125) (a slope that bfloat16 holds, as jax.nn rounds it) over 200 values (every
  block position), bitwise against jax.nn, with NaNs and products in the subnormal range (which
  both flush to -0: float32 runs flush-to-zero)."""
  rng = np.random.RandomState(5)
  x32 = (rng.randn(200) * 4).astype(np.float32)
  x32[[40, 41, 107, 199]] = [-2e-38, -1.5e-38, -3e-38, -1.2e-38]
  x32[[70, 150]] = np.nan
  x = jnp.asarray(x32, BF16)
  got = np.asarray(jaxdnn.leaky_relu(x, 0.3125))
  want = np.asarray(jax.jit(lambda v: jax.nn.leaky_relu(v, 0.3125))(x))
  finite = ~np.isnan(x32)
  np.testing.assert_array_equal(got.view(np.uint16)[finite], want.view(np.uint16)[finite])
  assert np.isnan(got.astype(np.float32)[~finite]).all()
  # Positive subnormal inputs: leaky_relu selects them unchanged (no arithmetic to flush), so they
  # reach the rounding as float32 subnormals, which vcvtneps2bf16 would flush: their blocks must
  # take the scalar rounding, at every position of a block of 32 and in the tail.
  words = np.arange(1, 0x80, dtype=np.uint16)  # bfloat16's positive subnormals
  xs = jnp.asarray(words.view(BF16))
  for ys in (jaxdnn.leaky_relu(xs, 0.3125), jax.vjp(lambda v: jaxdnn.leaky_relu(v, 0.3125), xs)[0]):
    np.testing.assert_array_equal(np.asarray(ys).view(np.uint16), words)


@pytest.mark.parametrize("dtype", (BF16, F16), ids=str)
def test_16bit_relu_and_clipped_relu_over_every_word(dtype):
  """Every 16-bit word but the subnormals (NaNs, infinities, +-0, normals) through relu and
  clipped_relu (a ceiling the type holds, 6, and one it does not, 2.4), forward and mask
  derivative, bitwise against activation.h's formulas evaluated in float32 (the CPU kernels
  select on the 16-bit words themselves where they can). Subnormal inputs are left out: the
  float32 paths see them as zeros where the thread runs denormals-are-zero, as XLA:CPU's do."""
  words = np.arange(1 << 16, dtype=np.uint16)
  mag = words.view(dtype).astype(np.float32)
  words = words[~((mag != 0) & (np.abs(mag) < jnp.finfo(dtype).smallest_normal))]
  x = jnp.asarray(words.view(dtype))
  x32 = words.view(dtype).astype(np.float32)
  nan = np.isnan(x32)
  cases = [("relu", jaxdnn.relu, np.where(x32 > 0, x32, np.where(nan, x32, 0)), x32 > 0)]
  for c in (6.0, 2.4):
    c32 = np.float32(c)
    y = np.where(nan, x32, np.where(x32 < 0, 0, np.where(x32 > c32, c32, x32)))
    cases.append((f"clipped_relu({c})", functools.partial(jaxdnn.clipped_relu, ceiling=c), y,
                  (x32 > 0) & (x32 < c32)))
  for name, fn, want, slope in cases:
    y_masked, vjp = jax.vjp(fn, x)  # the mask-keeping forward (differentiation)
    with np.errstate(invalid="ignore"):  # NaN words: compared apart
      want16 = want.astype(np.float32).astype(dtype)
    for what, y in (("plain", jax.jit(fn)(x)), ("mask", y_masked)):
      y = np.asarray(y)
      np.testing.assert_array_equal(np.isnan(y.astype(np.float32)), nan, err_msg=f"{name} {what}")
      np.testing.assert_array_equal(y.view(np.uint16)[~nan], want16.view(np.uint16)[~nan],
                                    err_msg=f"{name} {what}")
    g = np.asarray(vjp(jnp.ones_like(x))[0], np.float32)
    np.testing.assert_array_equal(g, slope.astype(np.float32), err_msg=f"{name} derivative")


@pytest.mark.parametrize("dtype", (F64, F32), ids=str)
def test_nan_and_inf_like_jax_nn(dtype):
  x = jnp.array([np.nan, np.inf, -np.inf, 0.0, 1.0, -1.0, 1e30, -1e30], dtype)
  ours = _values_and_grads({c: v[0] for c, v in CASES.items()})(x)
  refs = _values_and_grads({c: v[1] for c, v in CASES.items()})(x)
  for case in CASES:
    for what, out, ref in zip(("forward", "gradient"), ours[case], refs[case]):
      out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
      np.testing.assert_array_equal(np.isnan(out), np.isnan(ref), err_msg=f"{case} {what} NaNs")
      np.testing.assert_allclose(out, ref, rtol=RTOL[dtype], atol=1e-30, equal_nan=True,
                                 err_msg=f"{case} {what}")


def test_relu_gradient_selects_the_cotangent():
  """A NaN or inf cotangent outside relu's linear piece gives 0, as jax.nn.relu's select."""
  x = jnp.array([-1.0, 2.0, -3.0, 7.0], F64)
  ct = jnp.array([np.nan, 1.0, np.inf, np.inf], F64)
  for ours, ref in ((jaxdnn.relu, jax.nn.relu), (jaxdnn.relu6, jax.nn.relu6)):
    np.testing.assert_array_equal(jax.vjp(ours, x)[1](ct)[0], jax.vjp(ref, x)[1](ct)[0])


# ---------------------------------------------------------------------------------------------
# Derivatives.

def _specs(from_output):
  """case -> spec reading the output (from_output, where the kind allows it) or the input."""
  out = {}
  for case in CASES:
    if from_output and not _spec(case).from_output:
      continue
    out[case] = _spec(case, from_output)
  return out


@pytest.mark.parametrize("from_output", (True, False), ids=("from_output", "from_input"))
def test_first_derivatives_match_jax(from_output):
  specs = _specs(from_output)
  x = _inputs(F64)
  ct = _inputs(F64, seed=1)

  def derivatives(fns):
    def run(a, c):
      return {k: (jax.vjp(f, a)[1](c)[0], jax.jvp(f, (a,), (c,))[1]) for k, f in fns.items()}
    return jax.jit(run)(x, ct)

  ours = derivatives({k: functools.partial(act_prims.activation, spec=s) for k, s in specs.items()})
  refs = derivatives({k: CASES[k][1] for k in specs})
  for case in specs:
    # Norm-relative (terms like gelu_tanh's 1 + tanh(u) cancel differently in jax's expression).
    assert_close(ours[case][0], refs[case][0], 1e-12, f"{case} vjp")
    assert_close(ours[case][1], refs[case][1], 1e-12, f"{case} jvp")
    # The first derivative is jaxdnn's backward kernel, not jnp: on the CPU the mask kernels
    # for the kinds with a mask form.
    f = functools.partial(act_prims.activation, spec=specs[case])
    hlo = jax.jit(jax.grad(lambda a: jnp.vdot(f(a), ct))).lower(x).as_text()
    masked = specs[case].kind in act_prims.MASKED_KINDS and MASK_KERNELS
    assert ("jaxdnn_activation_mask_bwd" if masked else "jaxdnn_activation_bwd") in hlo


@pytest.mark.parametrize("from_output", (True, False), ids=("from_output", "from_input"))
@pytest.mark.parametrize("case", ["sigmoid", "tanh", "gelu_tanh", "gelu_exact", "silu", "elu"])
def test_check_grads_order2_smooth(case, from_output):
  spec = _spec(case)
  if from_output and not spec.from_output:
    pytest.skip("derivative needs the input")
  spec = _spec(case, from_output)
  f = lambda a: act_prims.activation(a, spec)
  x = _inputs(F64, (2, 3), seed=3, kinks=())
  if spec.kind == "elu":  # C^1 only at 0: stay away from the kink
    x = jnp.where(jnp.abs(x) < 0.1, 0.5, x)
  check_grads(jax.jit(f), (x,), order=2, modes=("fwd", "rev"), eps=1e-4)


def test_second_derivatives_match_jax():
  """Reverse-over-reverse and forward-over-reverse against jax, both saved operands."""
  x = _inputs(F64, (7,), seed=4, kinks=())
  smooth = [c for c in CASES if CASES[c][4] and c != "identity"]
  fns = {}
  for case in smooth:
    fns[(case, "ref")] = CASES[case][1]
    for spec in {_spec(case), _spec(case, False)}:
      variant = "out" if spec.from_output else "in"
      fns[(case, variant)] = functools.partial(act_prims.activation, spec=spec)

  def second(a):
    return {k: (jax.vmap(jax.grad(jax.grad(f)))(a),
                jax.jvp(jax.grad(lambda b: jnp.sum(f(b))), (a,), (jnp.ones_like(a),))[1])
            for k, f in fns.items()}

  out = jax.jit(second)(x)
  for (case, variant), (rr, fr) in out.items():
    ref = out[(case, "ref")][0]
    assert_close(rr, ref, 1e-11, f"{case} {variant} rev-over-rev")
    assert_close(fr, ref, 1e-11, f"{case} {variant} fwd-over-rev")


@pytest.mark.parametrize("case", [c for c in CASES if not CASES[c][4]] + ["identity"])
def test_piecewise_linear_kinds(case):
  """Order 1 away from the kinks; the second derivative is exactly zero (elu: alpha e^x left)."""
  spec = _spec(case)
  f = lambda a: act_prims.activation(a, spec)
  x = _inputs(F64, (2, 3), seed=5, kinks=())
  x = jnp.where(jnp.abs(x) < 0.1, 0.7, x)
  x = jnp.where(jnp.abs(x - 2.5) < 0.1, 1.2, x)
  x = jnp.where(jnp.abs(x - 6) < 0.1, 5.0, x)
  check_grads(jax.jit(f), (x,), order=1, modes=("fwd", "rev"))
  d2 = jax.jit(jax.vmap(jax.grad(jax.grad(f))))(x.reshape(-1))
  if spec.kind == "elu":
    np.testing.assert_allclose(d2, jnp.where(x.reshape(-1) > 0, 0, spec.param *
                                             jnp.exp(x.reshape(-1))), rtol=1e-12)
  else:
    np.testing.assert_array_equal(d2, 0)


def test_third_order():
  """Derivatives past the second (jnp terms on top of the kernels) still agree with jax."""
  x = _inputs(F64, (5,), seed=6, kinks=())
  d3 = lambda f: jax.vmap(jax.grad(jax.grad(jax.grad(f))))
  for name in ("sigmoid", "gelu_exact"):
    ours, ref = CASES[name][:2]
    assert_close(jax.jit(d3(ours))(x), jax.jit(d3(ref))(x), 1e-10, name)


# ---------------------------------------------------------------------------------------------
# Transformations.

@pytest.mark.parametrize("in_axis", (0, 1, -1))
def test_vmap_forward(in_axis):
  x = _inputs(F64, (3, 4, 5))
  out = jax.jit(jax.vmap(jaxdnn.gelu, in_axes=in_axis))(x)
  ref = jax.vmap(jax.nn.gelu, in_axes=in_axis)(x)
  assert_close(out, ref, 1e-12)


def _operand(rng, example_shape, size, axis):
  """A random operand with the mapped axis of length `size` at `axis` (None: unbatched)."""
  if axis is None:
    return jnp.asarray(rng.standard_normal(example_shape))
  return jnp.moveaxis(jnp.asarray(rng.standard_normal((size, *example_shape))), 0, axis)


@pytest.mark.parametrize("in_axes", [(0, 0), (0, None), (None, 0), (1, 0), (None, 1), (2, 1),
                                     (1, 1), (-1, 0)], ids=str)
def test_vmap_backward_every_operand_combination(in_axes):
  rng = np.random.default_rng(7)
  s, v = (_operand(rng, (4, 5), 3, ax) for ax in in_axes)
  specs = (ActivationSpec.make("sigmoid"), ActivationSpec.make("silu"),
           ActivationSpec.make("elu", from_output=False))

  def run(grad_fn):
    return jax.jit(lambda a, b: [jax.vmap(functools.partial(grad_fn, spec=spec, derivative=d),
                                          in_axes=in_axes)(a, b)
                                 for spec in specs for d in (1, 2)])(s, v)

  ours = run(lambda a, b, spec, derivative: act_prims.activation_grad(a, b, spec, derivative))
  refs = run(act_prims._reference_activation_grad)
  for out, ref in zip(ours, refs):
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)


def test_vmap_of_grad_and_grad_of_vmap():
  x = _inputs(F64, (4, 6))
  f = lambda a: jnp.sum(jaxdnn.tanh(a) ** 2)
  r = lambda a: jnp.sum(jnp.tanh(a) ** 2)
  assert_close(jax.vmap(jax.grad(f))(x), jax.vmap(jax.grad(r))(x), 1e-12)
  assert_close(jax.grad(lambda a: jnp.sum(jax.vmap(jaxdnn.silu)(a)))(x),
               jax.grad(lambda a: jnp.sum(jax.vmap(jax.nn.silu)(a)))(x), 1e-12)


def test_jit_eager_and_hlo():
  x = _inputs(F32)
  y_eager = jaxdnn.elu(x)
  y_jit = jax.jit(jaxdnn.elu)(x)
  np.testing.assert_array_equal(y_eager, y_jit)
  hlo = jax.jit(jaxdnn.elu).lower(x).as_text()
  assert "jaxdnn_activation_fwd" in hlo
  hlo = jax.jit(jax.grad(lambda a: jnp.sum(jaxdnn.elu(a)))).lower(x).as_text()
  assert "jaxdnn_activation_bwd" in hlo


@pytest.mark.parametrize("shape", [(0,), (3, 0, 4), (0, 5)])
def test_size_zero(shape):
  x = jnp.zeros(shape, F32)
  for ours, _, _, _, _ in CASES.values():
    assert ours(x).shape == shape
  g = jax.grad(lambda a: jnp.sum(jaxdnn.gelu(a)))(x)
  assert g.shape == shape
  assert jax.vmap(jaxdnn.relu)(jnp.zeros((0, 3))).shape == (0, 3)


def test_scalar_and_python_inputs():
  assert_close(jaxdnn.sigmoid(jnp.float32(0.5)), jax.nn.sigmoid(0.5), RTOL[F32])
  assert_close(jaxdnn.relu([-1.0, 2.0]), np.array([0.0, 2.0]), 0)


# ---------------------------------------------------------------------------------------------
# Errors.

@pytest.mark.parametrize("call,exc,match", [
    (lambda x: jaxdnn.activation(x, "relux"), ValueError, "unknown kind 'relux'"),
    (lambda x: jaxdnn.activation(x, 3), TypeError, "kind must be a string"),
    (lambda x: jaxdnn.activation(x, "relu", 1.0), ValueError, "takes no parameter; got param=1.0"),
    (lambda x: jaxdnn.activation(x, "relu6", 5.0), ValueError, "fixes its ceiling"),
    (lambda x: jaxdnn.leaky_relu(x, -0.1), ValueError, r"negative_slope\) must be non-negative"),
    (lambda x: jaxdnn.leaky_relu(x, float("nan")), ValueError, "must be finite"),
    (lambda x: jaxdnn.leaky_relu(x, "a"), TypeError, "negative_slope must be a concrete real"),
    (lambda x: jaxdnn.clipped_relu(x, 0.0), ValueError, r"ceiling \(ceiling\) must be positive"),
    (lambda x: jaxdnn.elu(x, -1.0), ValueError, r"alpha \(alpha\) must be non-negative"),
    (lambda x: jaxdnn.elu(x, True), TypeError, "alpha must be a real number"),
    (lambda x: jaxdnn.gelu(x, approximate="yes"), TypeError, "approximate must be a bool"),
    (lambda x: jaxdnn.relu(x.astype(jnp.int32)), TypeError, "x has dtype int32"),
    (lambda x: jaxdnn.activation(x.astype(jnp.complex64), "tanh"), TypeError, "x has dtype"),
])
def test_errors(call, exc, match):
  with pytest.raises(exc, match=match):
    call(jnp.ones((2, 3), F32))


def test_traced_parameter_is_an_error():
  with pytest.raises(TypeError, match="negative_slope must be a concrete real number"):
    jax.jit(lambda x, s: jaxdnn.leaky_relu(x, s))(jnp.ones(3), 0.1)


def test_primitive_checks():
  spec = ActivationSpec.make("sigmoid")
  with pytest.raises(ValueError, match="one shape"):
    act_prims.activation_grad(jnp.ones((2, 3)), jnp.ones((3, 2)), spec)
  with pytest.raises(ValueError, match="cannot be computed from its output"):
    ActivationSpec.make("gelu", from_output=True)


# ---------------------------------------------------------------------------------------------
# Bit masks: relu, leaky_relu and clipped_relu keep one bit per element for their backward.

MASK_CASES = ("relu", "leaky_relu_0.2", "clipped_relu_2.5", "relu6")
# Row lengths around the byte (8) and the 16-lane vector: tails, partial bytes, one element.
MASK_SHAPES = [(1,), (7,), (3, 8), (2, 9), (5, 16), (4, 17), (2, 3, 33), (3, 100), (2, 2, 1),
               (1, 4099)]
# Whether differentiation takes the mask kernels here (the default backend's extension has them).
MASK_KERNELS = act_prims._mask_kernels_by_default(jax.default_backend())


def _mask_input(dtype, shape, seed):
  """Normal values (scale 4) with every kink, -0.0 and a NaN planted where there is room."""
  x = np.asarray(4 * np.random.default_rng(seed).standard_normal(shape))
  flat = x.reshape(-1)
  special = [0.0, -0.0, 6.0, 2.5, np.nan, 1e-30, -1e-30][:flat.size]
  flat[:len(special)] = special
  return jnp.asarray(x).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=str)
def test_mask_forward_bits_and_values(shape, dtype):
  """y equals the plain forward bitwise; the bits are jax.nn's kink tests on x, packed along the
  last axis (least significant bit first), from the kernels and from the jnp form alike."""
  x = _mask_input(dtype, shape, 11)
  x64 = np.asarray(x, np.float64)
  for case in MASK_CASES:
    spec = _spec(case)
    y, bits = jax.jit(lambda a: act_prims.activation_mask_p.bind(a, spec=spec))(x)
    np.testing.assert_array_equal(np.asarray(y, np.float64),
                                  np.asarray(act_prims.activation(x, spec), np.float64))
    kink = {"relu": x64 > 0, "leaky_relu": x64 >= 0}.get(
        spec.kind, (x64 > 0) & (x64 < spec.param))
    np.testing.assert_array_equal(bits, np.packbits(kink, axis=-1, bitorder="little"), case)
    ref = act_prims._reference_activation_mask(x, spec=spec)
    np.testing.assert_array_equal(bits, ref[1], case)
    np.testing.assert_array_equal(np.asarray(y, np.float64), np.asarray(ref[0], np.float64))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=str)
def test_mask_backward_equals_the_output_backward(shape, dtype):
  """The VJP through the bits equals the backward from the output bitwise, and (float32 and
  float64) jax.nn's VJP; on the CPU the residual is the uint8 mask."""
  x = _mask_input(dtype, shape, 12)
  ct = _mask_input(dtype, shape, 13)
  ct = jnp.where(jnp.isnan(ct), jnp.inf, ct)  # a non-finite cotangent is selected away too
  for case in MASK_CASES:
    spec = _spec(case)
    y, vjp = jax.vjp(CASES[case][0], x)
    dx = jax.jit(vjp)(ct)[0]
    from_output = act_prims.activation_grad(y, ct, spec, 1)
    np.testing.assert_array_equal(np.asarray(dx, np.float64), np.asarray(from_output, np.float64),
                                  case)
    if dtype in (F32, F64):
      np.testing.assert_array_equal(dx, jax.vjp(CASES[case][1], x)[1](ct)[0], case)
    ref = act_prims._reference_activation_select(
        act_prims._reference_activation_mask(x, spec=spec)[1], ct, spec=spec)
    np.testing.assert_array_equal(np.asarray(dx, np.float64), np.asarray(ref, np.float64), case)
    if MASK_KERNELS:
      residuals = [a for a in jax.tree_util.tree_leaves(vjp) if hasattr(a, "dtype")]
      assert [r.dtype for r in residuals] == [np.uint8], case


@pytest.mark.parametrize("shape", [(600, 1000), (70001, 9)], ids=str)
@pytest.mark.parametrize("dtype", (F32, BF16), ids=str)
def test_mask_large_arrays_split_across_threads(shape, dtype):
  """Arrays past the threads' split size, in whole bytes (rows of 1000) and in rows (of 9)."""
  x = _mask_input(dtype, shape, 14)
  ct = _mask_input(dtype, shape, 15)
  for case in ("relu", "leaky_relu_0.2", "relu6"):
    spec = _spec(case)
    y, bits = jax.jit(lambda a: act_prims.activation_mask_p.bind(a, spec=spec))(x)
    ref_y, ref_bits = act_prims._reference_activation_mask(x, spec=spec)
    np.testing.assert_array_equal(bits, ref_bits, case)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(ref_y, np.float32))
    dx = jax.jit(lambda b, c: act_prims.activation_select(b, c, spec))(bits, ct)
    ref = act_prims._reference_activation_select(bits, ct, spec=spec)
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(ref, np.float32), case)


@pytest.mark.skipif(not MASK_KERNELS, reason="no mask kernels on this backend")
def test_mask_path_in_the_hlo_and_its_absence_for_rank_zero():
  x = _inputs(F32)
  text = jax.jit(jax.grad(lambda a: jnp.sum(jaxdnn.relu(a)))).lower(x).as_text()
  assert "jaxdnn_activation_mask_fwd" in text and "jaxdnn_activation_mask_bwd" in text
  assert "jaxdnn_activation_bwd" not in text
  # A scalar has no axis to pack: the output path.
  text = jax.jit(jax.grad(jaxdnn.relu)).lower(jnp.float32(2.0)).as_text()
  assert "jaxdnn_activation_bwd" in text
  assert jax.grad(jaxdnn.relu)(jnp.float32(2.0)) == 1.0


@pytest.mark.parametrize("in_axes", [(0, 0), (0, None), (None, 0), (1, 0), (None, 1), (2, 2),
                                     (2, 0), (-1, -1), (1, 1)], ids=str)
def test_vmap_mask_select_every_operand_combination(in_axes):
  """vmap of the select over (bits, v), a batch axis on the packed axis included, and of the mask
  forward over each axis; against a loop over the examples."""
  rng = np.random.default_rng(17)
  spec = _spec("leaky_relu_0.2")
  example = (4, 11)
  size = 3
  xb = jnp.asarray(rng.standard_normal((size, *example)))
  bits_b = jax.vmap(lambda a: act_prims.activation_mask_p.bind(a, spec=spec)[1])(xb)
  db, dv = in_axes
  bits = bits_b[0] if db is None else jnp.moveaxis(bits_b, 0, db)
  v = _operand(rng, example, size, dv)
  out = jax.jit(jax.vmap(lambda b, a: act_prims.activation_select(b, a, spec),
                         in_axes=in_axes))(bits, v)
  for i in range(size):
    bi = bits_b[0] if db is None else bits_b[i]
    vi = v if dv is None else jnp.moveaxis(v, dv, 0)[i]
    np.testing.assert_array_equal(out[i], act_prims.activation_select(bi, vi, spec))
  for axis in (0, 1, 2, -1):
    xs = jnp.moveaxis(xb, 0, axis)
    y, b = jax.jit(jax.vmap(lambda a: act_prims.activation_mask_p.bind(a, spec=spec),
                            in_axes=axis))(xs)
    np.testing.assert_array_equal(b, bits_b)
    np.testing.assert_array_equal(y, act_prims.activation(xb, spec))


def test_mask_path_derivatives_of_every_order():
  """Through the bits: jvp, vjp, vmap of grad, grad of grad (zero), jvp of jvp, and check_grads
  away from the kinks, against jax.nn."""
  x = _inputs(F64, (3, 13), seed=21, kinks=())
  x = jnp.where(jnp.abs(x) < 0.1, 0.7, x)
  x = jnp.where(jnp.abs(x - 6) < 0.1, 5.0, x)
  x = jnp.where(jnp.abs(x - 2.5) < 0.1, 1.2, x)
  t = _inputs(F64, (3, 13), seed=22, kinks=())
  xn, tn = np.asarray(x), np.asarray(t)
  # the exact derivatives (one rounding: lower * t), from numpy
  exact = {"relu": np.where(xn > 0, tn, 0.0), "leaky_relu_0.2": np.where(xn >= 0, tn, 0.2 * tn),
           "clipped_relu_2.5": np.where((xn > 0) & (xn < 2.5), tn, 0.0),
           "relu6": np.where((xn > 0) & (xn < 6), tn, 0.0)}
  for case in MASK_CASES:
    ours, ref = CASES[case][:2]
    np.testing.assert_array_equal(jax.jvp(ours, (x,), (t,))[1], exact[case], err_msg=case)
    np.testing.assert_array_equal(jax.jvp(ref, (x,), (t,))[1], exact[case], err_msg=case)
    # per row: the cotangent of row i is t[i] (no sum over rows, whose order XLA may change)
    g = lambda f: jax.grad(lambda a, ct: jnp.sum(f(a) * ct))
    np.testing.assert_array_equal(jax.jit(jax.vmap(g(ours)))(x, t), exact[case], err_msg=case)
    np.testing.assert_array_equal(jax.vmap(g(ref))(x, t), exact[case], err_msg=case)
    np.testing.assert_array_equal(jax.jit(jax.grad(lambda a: jnp.sum(g(ours)(a, t) * t)))(x), 0)
    jj = lambda f: jax.jvp(lambda a: jax.jvp(f, (a,), (t,))[1], (x,), (t,))[1]
    np.testing.assert_array_equal(jj(ours), 0)
    check_grads(ours, (x,), order=2, modes=("fwd", "rev"))


def test_mask_primitive_checks():
  relu, sigmoid = _spec("relu"), ActivationSpec.make("sigmoid")
  with pytest.raises(ValueError, match="no mask form"):
    act_prims.activation_mask_p.bind(jnp.ones((2, 3)), spec=sigmoid)
  with pytest.raises(ValueError, match="rank >= 1"):
    act_prims.activation_mask_p.bind(jnp.float32(1), spec=relu)
  with pytest.raises(ValueError, match="uint8 of shape"):
    act_prims.activation_select(jnp.zeros((2, 1), np.uint8), jnp.ones((2, 9)), relu)
  with pytest.raises(ValueError, match="uint8 of shape"):
    act_prims.activation_select(jnp.zeros((2, 2), np.int32), jnp.ones((2, 9)), relu)


@pytest.mark.skipif(not MASK_KERNELS, reason="no mask kernels on this backend")
def test_mask_ffi_rejects_a_malformed_call():
  """The handler's own checks (the primitives never send these): an error, not a crash."""
  call = jax.ffi.ffi_call("jaxdnn_activation_mask_bwd", jax.ShapeDtypeStruct((2, 9), F32))
  # block: a GPU reports a handler's error when the computation is waited for
  with pytest.raises(Exception, match="last dimension L"):
    jax.jit(lambda b, v: call(b, v, activation=np.int32(1), activation_param=np.float64(0)))(
        jnp.zeros((2, 1), np.uint8), jnp.ones((2, 9), F32)).block_until_ready()
  with pytest.raises(Exception, match="no mask form"):
    jax.jit(lambda b, v: call(b, v, activation=np.int32(5), activation_param=np.float64(0)))(
        jnp.zeros((2, 2), np.uint8), jnp.ones((2, 9), F32)).block_until_ready()


# ---------------------------------------------------------------------------------------------
# CUDA lowering (runs without a GPU when the CUDA extension is built).

@pytest.mark.skipif(CUDA is None, reason="the jaxdnn CUDA extension is not built in this install")
def test_cuda_lowering():
  x = _inputs(BF16)
  f = lambda a: jnp.sum(jax.grad(lambda b: jnp.sum(jaxdnn.gelu(b).astype(F32)))(a))
  text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert "jaxdnn_activation_fwd" in text or "jaxdnn_activation_bwd" in text
  assert "jaxdnn_activation_bwd" in text


# ---------------------------------------------------------------------------------------------
# GPU: the CUDA kernels against jax.nn, every dtype, tails and offsets.

@pytest.mark.gpu
@pytest.mark.skipif(PLATFORM != "gpu", reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1023, 4099, 1 << 20 | 5])
@pytest.mark.parametrize("case", ["relu", "leaky_relu_0.2", "relu6", "elu", "sigmoid", "tanh",
                                  "gelu_tanh", "gelu_exact", "silu", "identity"])
def test_gpu_kernels_match_jax_nn(case, n, dtype):
  """Backward: a derivative read from the rounded output (sigmoid's y (1 - y), tanh's 1 - y^2
  with y rounded near +-1 in the tails, as jax.nn does too) is off by up to the dtype's epsilon
  times |dy|, which relative to a single tiny derivative is large (float32 tanh at x = 4.4: 1e-3);
  the bound adds eps * ||dy|| to the relative one."""
  ours, ref = CASES[case][:2]

  def assert_grad_close(g, g_ref, c, what):
    g64, ref64, c64 = (np.asarray(v, np.float64) for v in (g, g_ref, c))
    err = np.linalg.norm(g64 - ref64)
    bound = 2 * RTOL[dtype] * np.linalg.norm(ref64) + float(jnp.finfo(dtype).eps) * np.linalg.norm(c64)
    assert err <= bound, f"{what}: error {err:.3e} > {bound:.3e}"

  base = _inputs(dtype, (n + 3,), seed=n)
  ct = _inputs(dtype, (n + 3,), seed=n + 1)
  for start in (0, 1, 3):  # offset slices (the kernels align any common offset)
    x, c = base[start:start + n], ct[start:start + n]
    assert_close(jax.jit(ours)(x), ref(_f64(x)), RTOL[dtype], f"{case} fwd n={n} +{start}")
    g = jax.jit(lambda a, b: jax.vjp(ours, a)[1](b)[0])(x, c)
    g_ref = jax.vjp(ref, _f64(x))[1](_f64(c))[0]
    assert_grad_close(g, g_ref, c, f"{case} bwd n={n} +{start}")
  # Operands at different offsets (the scalar path).
  x, c = base[1:1 + n], ct[2:2 + n]
  g = jax.jit(lambda a, b: jax.vjp(ours, a)[1](b)[0])(x, c)
  assert_grad_close(g, jax.vjp(ref, _f64(x))[1](_f64(c))[0], c, f"{case} mixed")


@pytest.mark.gpu
@pytest.mark.skipif(PLATFORM != "gpu", reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ["sigmoid", "gelu_exact", "gelu_tanh", "silu", "tanh", "elu"])
def test_gpu_second_derivatives(case):
  ours, ref = CASES[case][:2]
  x = _inputs(F64, (1000,), seed=9, kinks=())
  d2 = jax.jit(jax.vmap(jax.grad(jax.grad(ours))))(x)
  np.testing.assert_allclose(d2, jax.vmap(jax.grad(jax.grad(ref)))(x), rtol=1e-10, atol=1e-13)


@pytest.mark.skipif(PLATFORM != "cpu", reason="the CPU's float32 math (ffi/cpu/vec_math.h)")
def test_exact_gelu_float32_accuracy_out_to_the_tails():
  """float32 gelu and gelu' against float64, out to |x| = 13 where Phi and phi are ~1e-37: the
  error stays below 1e-6 of |x Phi| (value) and of |Phi| + |x phi| (derivative). The shared
  normal tail computes e^(-x^2/2) from x^2 with its rounding error recovered; computing it from
  x / sqrt(2) (the previous code) put 1e-5 errors at |x| = 13."""
  x64 = np.concatenate([np.linspace(-13.0, 13.0, 20001), [-12.9, -7.5, -0.75, 0.0, 1e-30]])
  x = jnp.asarray(x64, F32)
  x64 = np.asarray(x, F64)  # the float32 inputs, exactly
  phi = np.exp(-0.5 * x64 * x64) / np.sqrt(2 * np.pi)
  cdf = np.asarray(jax.scipy.special.ndtr(jnp.asarray(x64, F64)))
  f = jax.jit(lambda a: jaxdnn.gelu(a, approximate=False))
  y, g = jax.jit(jax.vmap(jax.value_and_grad(f)))(x)
  y, g = np.asarray(y, F64), np.asarray(g, F64)
  value_err = np.abs(y - x64 * cdf) / np.maximum(np.abs(x64 * cdf), 1e-300)
  grad_err = np.abs(g - (cdf + x64 * phi)) / (cdf + np.abs(x64 * phi))
  assert value_err[np.abs(x64 * cdf) > 1e-30].max() < 1e-6, value_err.max()
  assert grad_err.max() < 1e-6, (x64[grad_err.argmax()], grad_err.max())
