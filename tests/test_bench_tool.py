"""The benchmark tool (jaxdnn.bench): layer sets, measurements, CSV / markdown / PNG outputs."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys

import pytest

import helpers
import jaxdnn
from jaxdnn import bench
from jaxdnn._src import algorithms

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAT = "gpu" if helpers.PLATFORM == "gpu" else "cpu"
FAST = ["--k", "1", "--repeats", "1", "--budget", "0.01", "--no-progress"]


def read_csv(path):
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    return reader.fieldnames, list(reader)


def table_rows(markdown: str) -> list[list[str]]:
  """The cells of each markdown table line (header and separator included)."""
  return [[c.strip() for c in line.strip().strip("|").split("|")]
          for line in markdown.splitlines() if line.startswith("|")]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """One run of main() over the tiny set with every output; (paths, rc)."""
  out = tmp_path_factory.mktemp("bench")
  paths = dict(csv=out / "t.csv", md=out / "t.md", plot=out / "t")
  rc = bench.main(["--tiny", *FAST, "--csv", str(paths["csv"]), "--markdown", str(paths["md"]),
                   "--plot", str(paths["plot"])])
  return paths, rc


def test_tiny_run_csv(tiny_run):
  paths, rc = tiny_run
  assert rc == 0
  fields, rows = read_csv(paths["csv"])
  assert tuple(fields) == bench.CSV_FIELDS
  layers = bench.parse_layers(bench.TINY_LAYERS)
  impls = ["lax"] + [a.name for a in jaxdnn.ConvAlgo] + ["auto"]
  if PLAT == "gpu" and bench.torch_available():
    impls.append("torch")
  assert len(rows) == len(layers) * 3 * len(impls)
  got = {(r["layer"], r["op"], r["impl"]) for r in rows}
  assert got == {(L["name"], op, i) for L in layers for op in bench.OPS for i in impls}

  by_name = {L["name"]: L for L in layers}
  lower = helpers.LOWERING_PLATFORM
  n_unsupported = 0
  for r in rows:
    L = by_name[r["layer"]]
    assert r["dtype"] == "fp32"
    assert all(int(r[f]) == L[f] for f in bench.LAYER_FIELDS)
    assert r["note"] != "error", r
    if r["impl"] in ("lax", "torch"):
      assert float(r["ms"]) > 0 and not r["note"]
      continue
    if r["impl"] == "auto":  # the family jaxdnn.conv picks, and that family's own measurement
      pick = algorithms.choose_algorithm(lower, bench.OPS[r["op"]], "auto", bench.layer_geometry(L),
                                         L["N"], L["C"], L["K"], "float32", "float32",
                                         algorithms.MathPrecision.HIGHEST)
      assert r["note"] == pick.name and not r["reason"], r
      family = next(f for f in rows if (f["layer"], f["op"], f["impl"]) == (r["layer"], r["op"], pick.name))
      assert (r["ms"], r["tflops"], r["workspace_mb"]) == (family["ms"], family["tflops"],
                                                           family["workspace_mb"])
      continue
    algo = jaxdnn.ConvAlgo[r["impl"]]
    why = algorithms.unsupported_reason(lower, bench.OPS[r["op"]], algo, bench.layer_geometry(L),
                                        L["N"], L["C"], L["K"], "float32", "float32",
                                        algorithms.MathPrecision.HIGHEST)
    if why:
      n_unsupported += 1
      assert (r["note"], r["reason"], r["ms"], r["tflops"]) == (bench.NOT_SUPPORTED, why, "", "")
    else:
      assert r["note"] == r["reason"] == ""
      ms, tflops = float(r["ms"]), float(r["tflops"])
      assert ms > 0 and float(r["workspace_mb"]) >= 0
      # TFLOP/s = GFLOP / ms (both rounded to 4 significant digits)
      assert math.isclose(tflops, float(r["gflop"]) / ms, rel_tol=2e-2)
  # Families that refuse a layer are listed as unsupported, with the reason: at least the
  # restricted families (Winograd, FFT) on the strided layer, in all three operations.
  assert n_unsupported >= len(helpers.RESTRICTED) * 3


def test_tiny_run_markdown(tiny_run):
  paths, _ = tiny_run
  _, rows = read_csv(paths["csv"])
  text = paths["md"].read_text()
  head, sep, *body = table_rows(text)
  assert head[:5] == ["dtype", "layer", "op", "GFLOP", "lax"]
  tail = ["fastest family", "vs lax"] + (["vs torch"] if "torch" in head else []) + ["auto vs lax"]
  assert head[-len(tail):] == tail
  assert len(sep) == len(head) and all(len(b) == len(head) for b in body)
  assert len(body) == len(bench.parse_layers(bench.TINY_LAYERS)) * 3
  col = {name: i for i, name in enumerate(head)}
  for cells in body:
    dtype, layer, op = cells[:3]
    mine = {r["impl"]: r for r in rows if (r["dtype"], r["layer"], r["op"]) == (dtype, layer, op)}
    timed = {i: float(r["ms"]) for i, r in mine.items()
             if r["ms"] and i not in ("lax", "torch", "auto")}
    best = min(timed, key=timed.get)
    assert cells[col["fastest family"]] == best
    assert cells[col[best]].startswith("**")
    assert cells[col["vs lax"]] == f"{float(mine['lax']['ms']) / timed[best]:.2f}x"
    auto = mine["auto"]
    assert cells[col["auto"]].endswith(f"({auto['note']})") and not cells[col["auto"]].startswith("**")
    assert cells[col["auto vs lax"]] == f"{float(mine['lax']['ms']) / float(auto['ms']):.2f}x"
    if layer == "tiny_5x5_s2":  # strided: the restricted families refuse it
      for algo in helpers.RESTRICTED:
        assert cells[col[algo.name]] == bench.NOT_SUPPORTED


def test_tiny_run_plots(tiny_run):
  paths, _ = tiny_run
  for kind in ("time", "speedup"):
    png = paths["plot"].parent / f"{paths['plot'].name}-{kind}.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_user_layer_file_only_algos(tmp_path):
  layer_file = tmp_path / "mine.txt"
  layer_file.write_text("# my layers\n"
                        "a 1 4 6 6 4 3 3 1 1 1   # trailing comment\n"
                        "\n"
                        "b 2 6 7 5 3 1 1 2 0 1\n")
  out = tmp_path / "o.csv"
  rc = bench.main(["--layers", str(layer_file), "--only", "b", "--ops", "fwd,wgrad", "--algos",
                   "direct,gemm", "--no-lax", *FAST, "--csv", str(out)])
  assert rc == 0
  _, rows = read_csv(out)
  rows = [r for r in rows if r["impl"] != "torch"]  # torch joins on a GPU machine that has it
  assert [(r["layer"], r["op"], r["impl"]) for r in rows] == [
      ("b", "fwd", "DIRECT"), ("b", "fwd", "GEMM"), ("b", "wgrad", "DIRECT"), ("b", "wgrad", "GEMM")]
  r = rows[0]
  assert [int(r[f]) for f in bench.LAYER_FIELDS] == [2, 6, 7, 5, 3, 1, 1, 2, 0, 1, 1]
  # 2 * N * P * Q * K * C * R * S with P = 4, Q = 3
  assert float(r["gflop"]) == pytest.approx(2 * 2 * 4 * 3 * 3 * 6 / 1e9, rel=1e-2)


def test_transposed_layer(tmp_path):
  """An 11th field, lhs, makes a transposed convolution (lhs_dilation): 4x4 filter, pad 2, lhs 2
  doubles a 5x6 image; every family that runs it is timed beside lax."""
  layer_file = tmp_path / "up.txt"
  layer_file.write_text("up 2 4 5 6 3 4 4 1 2 1 2\n")
  (L,) = bench.read_layers(str(layer_file))
  assert L["lhs"] == 2 and bench.layer_shapes(L)[2] == (2, 10, 12, 3)
  assert bench.layer_geometry(L).lhs_dilation == (2, 2)
  out = tmp_path / "o.csv"
  rc = bench.main(["--layers", str(layer_file), "--ops", "fwd,dgrad,wgrad", "--algos",
                   "direct,implicit_precomp_gemm", *FAST, "--csv", str(out)])
  assert rc == 0
  _, rows = read_csv(out)
  assert {(r["op"], r["impl"]) for r in rows if r["ms"]} >= {
      (op, impl) for op in ("fwd", "dgrad", "wgrad")
      for impl in ("lax", "DIRECT", "IMPLICIT_PRECOMP_GEMM")}
  assert all(r["lhs"] == "2" for r in rows)
  # 2 * N * H * W * K * C * R * S: the products of the 5 x 6 input pixels, not of inserted zeros
  assert float(rows[0]["gflop"]) == pytest.approx(2 * 2 * 5 * 6 * 3 * 4 * 16 / 1e9, rel=1e-2)


def test_explicit_winograd_tiles_as_algos(tmp_path):
  """--algos takes the explicit-tile forms: each is its own column (F(6x6) beside the default)."""
  layer_file = tmp_path / "w.txt"
  layer_file.write_text("w 1 8 9 9 8 3 3 1 1 1\n")
  out = tmp_path / "w.csv"
  rc = bench.main(["--layers", str(layer_file), "--ops", "fwd", "--algos",
                   "winograd_nonfused,WINOGRAD_NONFUSED_F6X6,winograd_nonfused_f2x2", "--no-lax",
                   *FAST, "--csv", str(out)])
  assert rc == 0
  _, rows = read_csv(out)
  rows = [r for r in rows if r["impl"] != "torch"]
  assert [r["impl"] for r in rows] == ["WINOGRAD_NONFUSED", "WINOGRAD_NONFUSED_F6X6",
                                       "WINOGRAD_NONFUSED_F2X2"]
  assert all(r["ms"] for r in rows), rows


@pytest.mark.parametrize("text, match", [
    ("a 1 2 3\n", "expected a name and 10 integers"),
    ("ok 1 4 6 6 4 3 3 1 1 1\nbad 1 4 6 6 4 3 x 1 1 1\n", ":2: non-integer"),
    ("g 1 6 6 6 4 3 3 1 1 4\n", "multiples of groups=4"),
    ("z 0 4 6 6 4 3 3 1 1 1\n", "must be positive"),
    ("big 1 4 2 2 4 5 5 1 1 1\n", "larger than the padded image"),
    ("lhs0 1 4 6 6 4 3 3 1 1 1 0\n", "must be positive"),
    ("twelve 1 4 6 6 4 3 3 1 1 1 2 2\n", "expected a name and 10 integers"),
])
def test_layer_file_errors(text, match):
  with pytest.raises(ValueError, match=match):
    bench.parse_layers(text, "f.txt")


def test_bad_flags():
  with pytest.raises(SystemExit, match="--dtypes"):
    bench.main(["--tiny", "--dtypes", "fp33"])
  with pytest.raises(SystemExit, match="--only"):
    bench.main(["--tiny", "--only", "nope"])
  with pytest.raises(SystemExit):
    bench.main(["--tiny", "--set", "sweep"])  # one layer source only
  with pytest.raises(SystemExit, match="algo"):
    bench.main(["--tiny", "--algos", "fastest"])


@pytest.mark.parametrize("plat", ["cpu", "gpu"], ids=["cpu_sizes", "gpu_sizes"])
def test_sweep_set(plat):
  layers = bench.sweep_layers(plat)
  base_n = 4 if plat == "cpu" else 32
  sweeps = {}
  for L in layers:
    kind, value = L["name"].split("_")[1][0], int(L["name"].split("_")[1][1:])
    sweeps.setdefault(kind, []).append(value)
    bench.check_layer(L, L["name"])
    varied = {"r": ("R", "S"), "c": ("C", "K"), "n": ("N",)}[kind]
    for f in varied:
      assert L[f] == value
    base = dict(N=base_n, C=64, K=64, H=28, W=28, R=3, S=3, stride=1, pad=1, groups=1)
    for f, v in base.items():
      if f not in varied and not (kind == "r" and f == "pad"):
        assert L[f] == v, (L, f)
    if kind == "r":  # 'same' padding keeps the 28x28 output
      assert L["pad"] == (value - 1) // 2 and bench.layer_shapes(L)[2][1:3] == (28, 28)
  assert sweeps["r"] == [1, 3, 5, 7, 9, 11]
  assert sweeps["c"] == [2**i for i in range(4, 10 if plat == "cpu" else 11)]
  assert sweeps["n"] == [2**i for i in range(0, 7 if plat == "cpu" else 8)]


def test_identical_geometry_measured_once(monkeypatch):
  calls = []
  real = bench.time_call
  monkeypatch.setattr(bench, "time_call", lambda *a, **k: calls.append(1) or real(*a, **k))
  a = dict(name="a", N=1, C=4, H=6, W=6, K=4, R=3, S=3, stride=1, pad=1, groups=1)
  rows = bench.run_benchmark([a, dict(a, name="a_again")], plat="cpu", dtypes=["fp32"],
                             ops=["fwd"], families=[jaxdnn.ConvAlgo.DIRECT], with_lax=True,
                             k_ops=1, repeats=1, budget=0.01, inner=1, progress=False)
  assert len(calls) == 2
  assert [(r["layer"], r["impl"]) for r in rows] == [
      ("a", "lax"), ("a", "DIRECT"), ("a_again", "lax"), ("a_again", "DIRECT")]
  assert rows[1]["ms"] == rows[3]["ms"] != ""


def test_auto_shares_its_picks_measurement(monkeypatch):
  """auto (what jaxdnn.conv runs by default) reports the family it picks; it reuses that family's
  measurement when the family is measured too, and is timed itself otherwise."""
  calls = []
  real = bench.time_call
  monkeypatch.setattr(bench, "time_call", lambda *a, **k: calls.append(1) or real(*a, **k))
  a = dict(name="a", N=1, C=4, H=6, W=6, K=4, R=3, S=3, stride=1, pad=1, groups=1)
  pick = algorithms.choose_algorithm("cpu", bench.OPS["fwd"], "auto", bench.layer_geometry(
      dict(a, lhs=1)), 1, 4, 4, "float32", "float32", algorithms.MathPrecision.HIGHEST)
  kw = dict(plat="cpu", dtypes=["fp32"], ops=["fwd"], with_lax=True, k_ops=1, repeats=1,
            budget=0.01, inner=1, progress=False)
  rows = bench.run_benchmark([a], families=[algorithms.AUTO, pick], **kw)  # auto listed first
  assert len(calls) == 2  # lax and the family
  assert [(r["impl"], r["note"]) for r in rows] == [("lax", ""), (pick.name, ""), ("auto", pick.name)]
  assert rows[2]["ms"] == rows[1]["ms"] != ""
  rows = bench.run_benchmark([a], families=[algorithms.AUTO], **kw)
  assert len(calls) == 4 and rows[1]["impl"] == "auto" and float(rows[1]["ms"]) > 0
  table = bench.markdown_table(rows, "h")
  assert "auto vs lax" in table and f"({pick.name})" in table


def test_auto_that_cannot_run_is_reported_not_timed(monkeypatch):
  """A problem no family supports: the auto row says so with choose_algorithm's reason, and
  nothing is timed for it."""
  def refuse(*args, **kwargs):
    raise ValueError("no jaxdnn algorithm supports this forward convolution on cpu")
  monkeypatch.setattr(algorithms, "choose_algorithm", refuse)
  a = dict(name="a", N=1, C=4, H=6, W=6, K=4, R=3, S=3, stride=1, pad=1, groups=1)
  rows = bench.run_benchmark([a], plat="cpu", dtypes=["fp32"], ops=["fwd"],
                             families=[algorithms.AUTO], with_lax=False, k_ops=1, repeats=1,
                             budget=0.01, inner=1, progress=False)
  assert [(r["impl"], r["note"], r["ms"]) for r in rows] == [("auto", bench.NOT_SUPPORTED, "")]
  assert "no jaxdnn algorithm supports" in rows[0]["reason"]


def test_markdown_with_torch_column():
  def row(impl, ms, note=""):
    return dict(dtype="bf16", layer="l", op="fwd", impl=impl, ms=ms, tflops="1" if ms else "",
                workspace_mb="0" if impl not in ("lax", "torch") and ms else "", note=note,
                reason="", gflop="1")
  rows = [row("lax", "2.0"), row("DIRECT", "0.5"), row("GEMM", "1.0"),
          row("FFT", "", bench.NOT_SUPPORTED), row("torch", "0.25")]
  head, _, body = table_rows(bench.markdown_table(rows, "h"))
  cells = dict(zip(head, body))
  assert head[4:6] == ["lax", "torch"]
  assert cells["fastest family"] == "DIRECT" and cells["DIRECT"].startswith("**")
  assert (cells["vs lax"], cells["vs torch"]) == ("4.00x", "0.50x")
  assert cells["FFT"] == bench.NOT_SUPPORTED


def test_packaged_layer_sets():
  for plat in ("cpu", "gpu"):
    f = bench.packaged_layer_file(plat)
    layers = bench.parse_layers(f.read_text(), str(f))
    assert len(layers) >= 10 and any(L["name"].startswith("r50_") for L in layers)
    # Shipped as package data in the installed package, identical to benchmarks/'s copy.
    assert os.path.isfile(str(f)) and not str(f).startswith(os.path.join(REPO, "jaxdnn"))
    repo_copy = os.path.join(REPO, "benchmarks", f"layers-{plat}.txt")
    if os.path.exists(repo_copy):
      with open(repo_copy) as g:
        assert g.read() == f.read_text()


def _run(args, cwd):
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", ""))
  return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_module_and_wrapper_entry_points(tmp_path):
  """`python -m jaxdnn.bench` and benchmarks/bench.py (kept for scripts) run the same tool."""
  help_ = _run([sys.executable, "-m", "jaxdnn.bench", "--help"], tmp_path)
  assert help_.returncode == 0 and "--set" in help_.stdout and "--plot" in help_.stdout
  out = tmp_path / "w.csv"
  wrapper = os.path.join(REPO, "benchmarks", "bench.py")
  if not os.path.exists(wrapper):
    pytest.skip("no repository checkout")
  proc = _run([sys.executable, wrapper, "--tiny", "--only", "tiny_5x5_s2", "--ops", "fwd",
               "--algos", "direct,fft", *FAST, "--csv", str(out)], tmp_path)  # FFT: stride 1 only
  assert proc.returncode == 0, proc.stderr[-2000:]
  _, rows = read_csv(out)
  assert [(r["impl"], r["note"]) for r in rows if r["impl"] != "torch"] == [
      ("lax", ""), ("DIRECT", ""), ("FFT", bench.NOT_SUPPORTED)]
  assert "fastest family" in proc.stdout


def test_time_limit_stops_measuring(capsys):
  """--time-limit: once spent, no further measurement starts and the rows so far come back."""
  a = dict(name="a", N=1, C=4, H=6, W=6, K=4, R=3, S=3, stride=1, pad=1, groups=1)
  kw = dict(plat="cpu", dtypes=["fp32"], ops=["fwd"], families=[jaxdnn.ConvAlgo.DIRECT],
            with_lax=True, k_ops=1, repeats=1, budget=0.01, inner=1, progress=False)
  assert bench.run_benchmark([a, dict(a, name="b")], time_limit=0.0, **kw) == []
  assert "time limit reached" in capsys.readouterr().out
  rows = bench.run_benchmark([a, dict(a, name="b")], time_limit=600.0, **kw)
  assert [r["layer"] for r in rows] == ["a", "a", "b", "b"]
