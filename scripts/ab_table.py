"""Kernel-only A/B table from scripts/gpu-ab's gemm_times.txt: the IPG time of each variant (median over
repeated AB_TIMES runs of the same dtype and op) and its ratio to "base", with geometric means.

  python3 scripts/ab_table.py gemm_times.txt [variant ...]   (default: default base extra)
"""
import collections
import re
import statistics
import sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))
cur = None
for line in open(sys.argv[1]):
    m = re.match(r"== (\S+ \S+), (\S+)", line)
    if m: cur = m.groups(); continue
    f = line.split()
    if cur and f and f[0] not in ("layer",) and len(f) > 5:
        runs[cur[0]][(f[0], cur[1])].append(float(f[4]))
names = sys.argv[2:] if len(sys.argv) > 2 else ["default", "base", "extra"]
for k, d in runs.items():
    layers = list(dict.fromkeys(l for l, _ in d))
    print(f"\n{k}, IPG ms (median of runs)\n")
    print("| layer | " + " | ".join(names) + " | " + " | ".join(f"{n}/base" for n in names if n != "base") + " |")
    print("|---" * (1 + 2 * len(names) - 1) + "|")
    ratios = collections.defaultdict(list)
    for l in layers:
        v = {n: statistics.median(d[(l, n)]) for n in names if (l, n) in d}
        row = [f"{v.get(n, float('nan')):.4f}" for n in names]
        rr = []
        for n in names:
            if n == "base": continue
            r = v[n] / v["base"]; ratios[n].append(r); rr.append(f"{r:.3f}")
        print(f"| {l} | " + " | ".join(row) + " | " + " | ".join(rr) + " |")
    gm = {n: statistics.geometric_mean(r) for n, r in ratios.items()}
    print("geomean vs base: " + ", ".join(f"{n} {g:.3f}" for n, g in gm.items()))
