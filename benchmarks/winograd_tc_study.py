"""Would a tensor-core WINOGRAD_NONFUSED F(4x4,3x3) pay in bf16? A feasibility study, not a
jaxdnn kernel: per layer, the 36 per-point channel products timed as one batched 16-bit matrix
product on the tensor cores (torch.bmm, i.e. cuBLAS: a stand-in for a kernel of our own at best
equal speed), plus the memory floor of the input and output transform passes (bytes each must move at the
H200's ~4.3 TB/s copy bandwidth); and, on the CPU (numpy, float64 reference), the error of F(2x2),
F(4x4) and F(6x6) in fp32 arithmetic and when the transformed operands are rounded to bf16 or fp16
for the tensor cores (transforms from the points 0, +-1, +-2, +-1/2 and infinity).

    python benchmarks/winograd_tc_study.py [--errors-only]
"""

import argparse

import numpy as np

LAYERS = {  # name: N, C, K, H (=W), 3x3 stride 1 pad 1
    "r50_c2_3x3": (32, 64, 64, 56), "r50_c3_3x3": (32, 128, 128, 28),
    "r50_c4_3x3": (32, 256, 256, 14), "r50_c5_3x3": (32, 512, 512, 7),
    "vgg_c1_2": (32, 64, 64, 224), "vgg_c3_2": (32, 256, 256, 56)}
COPY_TBPS = 4.3  # measured device-to-device copy bandwidth of the H200 (device notes)



def cook_toom(m, points):
  """F(m, 3) transforms (B^T, G, A^T) from the interpolation points plus the point at infinity,
  in exact rational arithmetic: y = A^T [(G g) * (B^T d)]."""
  from fractions import Fraction
  pts = [Fraction(p) for p in points]
  n = m + 2
  assert len(pts) == n - 1

  def mul(a, b):  # polynomial product, coefficients lowest first
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, u in enumerate(a):
      for j, v in enumerate(b):
        out[i + j] += u * v
    return out

  at = [[p**j for p in pts] + [Fraction(int(j == m - 1))] for j in range(m)]
  g, bt, full = [], [], [Fraction(1)]
  for i, p in enumerate(pts):
    den, q = Fraction(1), [Fraction(1)]
    for l, o in enumerate(pts):
      if l != i:
        den, q = den * (p - o), mul(q, [-o, Fraction(1)])
    g.append([p**k / den for k in range(3)])
    bt.append(q + [Fraction(0)])
    full = mul(full, [-p, Fraction(1)])
  g.append([Fraction(0), Fraction(0), Fraction(1)])
  bt.append(full)
  as_float = lambda rows: np.array([[float(v) for v in r] for r in rows])
  return as_float(bt), as_float(g), as_float(at)


TILES = {2: cook_toom(2, [0, 1, -1]), 4: cook_toom(4, [0, 1, -1, 2, -2]),
         6: cook_toom(6, [0, 1, -1, 2, -2, 0.5, -0.5])}


def errors():
  import ml_dtypes
  bf16 = ml_dtypes.bfloat16
  rng = np.random.default_rng(0)
  rnd = lambda a, dt: a.astype(dt).astype(np.float64)

  def direct(x, w):
    h = x.shape[0] - 2
    return sum(x[r:r + h, s:s + h] @ w[r, s] for r in range(3) for s in range(3))

  def winograd(x, w, m, op_dtype, work=np.float64):
    # Transformed operands rounded to op_dtype; products summed over channels in `work`.
    bt, g, at = (t.astype(work) for t in TILES[m])
    a, h = m + 2, x.shape[0] - 2
    u = rnd(np.einsum("ar,rsck,bs->abck", g, w.astype(work), g), op_dtype).astype(work)
    y = np.zeros((h, h, w.shape[3]))
    for i in range(0, h, m):
      for j in range(0, h, m):
        v = rnd(np.einsum("ar,rsc,bs->abc", bt, x[i:i + a, j:j + a].astype(work), bt),
                op_dtype).astype(work)
        y[i:i + m, j:j + m] = np.einsum("ia,abk,jb->ijk", at, np.einsum("abc,abck->abk", v, u),
                                        at)
    return y

  print("Error against float64, ||out - ref|| / ||ref|| (the test suite's measure), 3x3 "
        "stride 1, one image.\n")
  print("| C x K, image | inputs | direct conv | F(2x2) | F(4x4) | F(6x6) | F(2x2) bf16 operands "
        "| F(2x2) fp16 operands | F(4x4) bf16 operands | F(4x4) fp16 operands |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for c, k, hw in ((64, 32, 24), (256, 16, 24), (512, 16, 12)):
    x = np.zeros((hw + 2, hw + 2, c))
    x[1:-1, 1:-1] = rnd(rng.standard_normal((hw, hw, c)), bf16)
    w = rnd(rng.standard_normal((3, 3, c, k)) / np.sqrt(9 * c), bf16)
    ref = direct(x, w)
    err = lambda y, out: np.linalg.norm(rnd(y, out) - ref) / np.linalg.norm(ref)
    f32 = [err(winograd(x, w, m, np.float32, np.float32), np.float32) for m in (2, 4, 6)]
    cells = [err(direct(x.astype(np.float32), w.astype(np.float32)), np.float32)] + f32
    print(f"| {c} x {k}, {hw}x{hw} | fp32, fp32 arithmetic | " +
          " | ".join(f"{e:.1e}" for e in cells) + " | | | | |")
    cells = [err(ref, bf16)] + [err(winograd(x, w, m, np.float32), bf16) for m in (2, 4, 6)]
    cells += [err(winograd(x, w, m, dt), bf16) for m in (2, 4) for dt in (bf16, np.float16)]
    print(f"| {c} x {k}, {hw}x{hw} | bf16, bf16 output | " +
          " | ".join(f"{e:.1e}" for e in cells) + " |")


def timings():
  import torch
  print("| layer | 36 bf16 products (cuBLAS bmm) ms | TFLOP/s | transform passes, memory floor "
        "ms | F(4x4) bf16 floor ms |")
  print("|---|---|---|---|---|")
  for name, (n, c, k, h) in LAYERS.items():
    tiles = n * ((h + 3) // 4) ** 2
    a = torch.randn(36, tiles, c, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(36, c, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
      torch.bmm(a, b)
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
      e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      e0.record()
      torch.bmm(a, b)
      e1.record()
      torch.cuda.synchronize()
      times.append(e0.elapsed_time(e1))
    ms = float(np.median(times))
    flops = 2 * 36 * tiles * c * k
    # input transform: x read, V written; output transform: M read, y written (2-byte values)
    moved = 2 * (n * h * h * c + 36 * tiles * c + 36 * tiles * k + n * h * h * k)
    floor_ms = moved / (COPY_TBPS * 1e12) * 1e3
    print(f"| {name} | {ms:.4f} | {flops / ms / 1e9:.0f} | {floor_ms:.4f} | {ms + floor_ms:.4f} |")


if __name__ == "__main__":
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--errors-only", action="store_true")
  args = ap.parse_args()
  errors()
  if not args.errors_only:
    timings()
