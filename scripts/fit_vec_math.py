"""Regenerates the polynomial coefficients of ffi/cpu/vec_math.h and of the erfcx fit that it
shares with the CUDA kernels, ffi/include/jaxdnn/erfcx_fit.h (needs numpy and mpmath).

  tanh(x) ~ x P(x^2) / Q(x^2), P and Q of degree 4, Q(0) = 1, on [0, 9.2]: a linearized
      least-squares fit of relative error (P - f Q) / (f Q_prev), reweighted toward the worst
      points (Lawson-style) over 30 iterations.
  erfcx(x) = e^(x^2) erfc(x) ~ R(t), t = 1 / (1 + x/2), R of degree 10 on x in [0, 10]: a
      Chebyshev least-squares fit in t.
  erfcx(x) ~ R6(t), t = 1 / (1 + 0.61 x), R6 of degree 6 on [0, 10], for results rounded to
      16-bit types: a least-squares fit of relative error, reweighted toward the worst points
      (Lawson-style); printed halved (erfcx_poly6_half).
  erfcx(x) ~ R8(t), t = 1 / (1 + 0.55 x), R8 of degree 8 on [0, 9.3], the same kind of fit, for
      VecMathF::gelu_grad; printed halved.
  e^r ~ P6(r) on |r| <= ln2/2 (exp's reduced argument) with P6(0) = P6'(0) = 1 fixed: a
      least-squares fit of relative error, Lawson-reweighted (VecMathF::exp_reduced).
  e^(-u/2) ~ P5(u) on |u| <= ln2 (u = -2r): the same fit of degree 5, written in u, for
      VecMathF::normal_tail.

    python scripts/fit_vec_math.py
"""

from __future__ import annotations

import mpmath as mp
import numpy as np

mp.mp.dps = 40


def fit_tanh(dp=4, dq=4, hi=9.2, iters=30):
  x = np.concatenate([np.linspace(0, 1, 3000), np.linspace(1, hi, 6000)])[1:]
  u = x * x
  f = np.tanh(x) / x
  w = np.ones_like(x)
  q = np.ones_like(x)
  for _ in range(iters):
    a = np.concatenate([np.vander(u, dp + 1, increasing=True),
                        -(f[:, None] * np.vander(u, dq + 1, increasing=True)[:, 1:])], axis=1)
    scale = w / (f * q)
    sol, *_ = np.linalg.lstsq(a * scale[:, None], f * scale, rcond=None)
    p, qc = sol[:dp + 1], np.concatenate([[1.0], sol[dp + 1:]])
    q = np.polyval(qc[::-1], u)
    err = np.abs(np.polyval(p[::-1], u) / q / f - 1)
    w = w * (1 + err / err.max()) ** 2
  return p, qc, err.max()


def fit_erfcx(deg=10, hi=10.0, scale=0.5):
  z = np.concatenate([np.linspace(0, 1, 4000), np.linspace(1, hi, 8000)])
  t = 1 / (1 + scale * z)
  h = np.array([float(mp.exp(mp.mpf(v) ** 2) * mp.erfc(mp.mpf(v))) for v in z])
  c = np.polynomial.chebyshev.cheb2poly(np.polynomial.chebyshev.chebfit(t, h, deg))
  return c, np.max(np.abs(np.polyval(c[::-1], t) / h - 1))


def fit_erfcx_relative(deg=6, hi=10.0, scale=0.61, iters=60):
  z = np.concatenate([np.linspace(0, 1, 4000), np.linspace(1, hi, 8000)])
  t = 1 / (1 + scale * z)
  h = np.array([float(mp.exp(mp.mpf(v) ** 2) * mp.erfc(mp.mpf(v))) for v in z])
  a = np.vander(t, deg + 1, increasing=True)
  w = np.ones_like(t)
  for _ in range(iters):
    c, *_ = np.linalg.lstsq(a * (w / h)[:, None], w, rcond=None)
    err = np.abs(a @ c / h - 1)
    w = w * (1 + err / err.max()) ** 2
  return c, err.max()


def fit_exp(deg, iters=60):
  # e^r = 1 + r + sum_k c_k r^k on [-ln2/2, ln2/2]; coefficients constant first.
  r = np.linspace(-np.log(2) / 2, np.log(2) / 2, 20001)
  f = np.exp(r)
  a = np.vander(r, deg + 1, increasing=True)[:, 2:]
  w = np.ones_like(r)
  for _ in range(iters):
    c, *_ = np.linalg.lstsq(a * (w / f)[:, None], (f - 1 - r) * w / f, rcond=None)
    err = np.abs((1 + r + a @ c) / f - 1)
    w = w * (1 + err / err.max()) ** 2
  return np.concatenate([[1.0, 1.0], c]), err.max()


def main():
  p, q, err = fit_tanh()
  print(f"tanh: max relative fit error {err:.2e}")
  print("  P (constant first):", ", ".join(f"{v:.17g}" for v in p))
  print("  Q (constant first):", ", ".join(f"{v:.17g}" for v in q))
  c, err = fit_erfcx()
  print(f"erfcx: max relative fit error {err:.2e}")
  print("  R (constant first):", ", ".join(f"{v:.17g}" for v in c))
  c, err = fit_erfcx_relative()
  print(f"erfcx, degree 6: max relative fit error {err:.2e}")
  print("  R6 / 2 (constant first):", ", ".join(f"{v / 2:.10g}" for v in c))
  c, err = fit_erfcx_relative(deg=8, hi=9.3, scale=0.55)
  print(f"erfcx, degree 8: max relative fit error {err:.2e}")
  print("  R8 / 2 (constant first):", ", ".join(f"{v / 2:.11g}" for v in c))
  c, err = fit_exp(6)
  print(f"e^r, degree 6: max relative fit error {err:.2e}")
  print("  P6 (constant first):", ", ".join(f"{v:.17g}" for v in c))
  c, err = fit_exp(5)
  c = c * (-0.5) ** np.arange(len(c))  # in u = -2r
  print(f"e^(-u/2), degree 5: max relative fit error {err:.2e}")
  print("  P5 in u (constant first):", ", ".join(f"{v:.11g}" for v in c))


if __name__ == "__main__":
  main()
