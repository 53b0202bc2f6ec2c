#!/bin/bash
# Sweep of the WINOGRAD_NONFUSED GEMM tunables (gemm_kernel's WINO_GEMM_* / WINO_CHUNK_MIB
# macros) on the GPU machine:  bash tests/cuda/winograd/sweep.sh OUTDIR [--dry-run]
# Builds every variant's checker in parallel (check.cu compiled once, conv_winograd.cu per
# variant, -Xptxas -v), then one variant at a time: the quick correctness check and the fp32
# NHWC NONFUSED timings (fwd, dgrad, wgrad) of the benchmark layers. Writes OUTDIR/sweep.csv
# (variant,layer,op,ms,min_ms,tflops,check,regs_spills) and OUTDIR/summary.md. Under 4 minutes.
# --dry-run (no GPU): builds one variant for the host emulation (emulate.sh) and runs its quick
# check, then prints the plan of the GPU run without running it.
# Switching the default to a winner: set the macro defaults at the top of the GEMM section of
# ffi/cuda/conv_winograd.cu (#define WINO_GEMM_* values) to the variant's flags.
set -u
cd "$(dirname "$0")/../../.."
O=${1:?usage: sweep.sh OUTDIR [--dry-run]}
DRY=${2:-}
mkdir -p "$O"
# name|flags. Defaults: BK 16, 3 stages, 2 CTAs/SM, AV 2, WARP 0, PIPE 0, 128 MiB chunks.
VARIANTS=(
  "base|"
  "s4|-DWINO_GEMM_STAGES=4"
  "chunk256|-DWINO_CHUNK_MIB=256"
  "s4_chunk256|-DWINO_GEMM_STAGES=4 -DWINO_CHUNK_MIB=256"
)
# SWEEP_SET=tc: the tensor-core (3xTF32) GEMM's knobs instead (stages, tile width, partial sums).
if [ "${SWEEP_SET:-}" = tc ]; then
  VARIANTS=(
    "tc|"
    "tc_st3|-DWINO_TC_STAGES_WIDE=3"
    "tc_st2|-DWINO_TC_STAGES_WIDE=2"
    "tc_narrow|-DWINO_GEMM_NARROW=1"
    "tc_noflush|-DWINO_TC_FLUSH=0"
  )
fi
BENCH_SEL="BENCH_MAIN_ONLY=1"
# SWEEP_EXTRA=1 adds settings whose fp32 m-major wide kernel spills 20-68 bytes at the
# 128-register cap of 2 CTAs/SM (measured locally with nvcc 13.0; informative only).
if [ "${SWEEP_EXTRA:-0}" = 1 ]; then
  VARIANTS+=(
    "s2|-DWINO_GEMM_STAGES=2"
    "bk32|-DWINO_GEMM_BK=32"
    "warp1|-DWINO_GEMM_WARP=1"
    "pipe|-DWINO_GEMM_PIPE=1 -DWINO_GEMM_AV=1 -DWINO_GEMM_WARP=1"
  )
fi
LAYERS=${SWEEP_LAYERS:-vgg_c3_2,r50_c2_3x3,r50_c3_3x3,r50_c4_3x3,r50_c5_3x3,vgg_c1_2}
ITERS=${SWEEP_ITERS:-10}
t0=$SECONDS

if [ "$DRY" = "--dry-run" ]; then
  v=${SWEEP_DRY_VARIANT:-1}
  IFS='|' read -r name flags <<< "${VARIANTS[$v]}"
  echo "dry run: host emulation of variant $name ($flags)"
  WINO_DEFS="$flags" WINO_EMU_DIR="$O/emu_$name" timeout 600 \
    bash tests/cuda/winograd/emulate.sh quick > "$O/emu_$name.txt" 2>&1
  echo "emulation rc=$? $(grep CORRECTNESS "$O/emu_$name.txt")"
  echo "GPU plan: ${#VARIANTS[@]} variants, layers $LAYERS, $ITERS iterations:"
  printf '  %s\n' "${VARIANTS[@]}"
  exit 0
fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$O/info.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$O/info.txt"
NV="nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -DJAXDNN_SM90A=1 --expt-relaxed-constexpr -lineinfo
    -I ffi/include -I ffi/cuda"
B=$O/build; mkdir -p "$B"
# check.cu does not depend on the macros: one object for all variants.
( $NV -c tests/cuda/winograd/check.cu -o "$B/check.o" > "$B/check_build.txt" 2>&1 ) &
for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name flags <<< "$v"
  ( timeout 200 $NV -Xptxas -v $flags -c ffi/cuda/conv_winograd.cu -o "$B/$name.o" \
      > "$B/$name.build.txt" 2>&1 || echo "build failed" >> "$B/$name.build.txt" ) &
done
wait
echo "compiled in $((SECONDS - t0)) s"
# Registers / spills of the fp32 kernels, m-major wide (forward / dgrad) and k-major wide
# (wgrad): "regs/spill-store-bytes".
regs() {
  python3 - "$1" <<'PY'
import re, sys
out, cur = [], None
for l in open(sys.argv[1]):
    m = re.search(r"Function properties for .*gemm_(?:tc_kernelI|kernelIf)Lb(\d)ELb1E", l)
    if m: cur = "kmajor" if m.group(1) == "1" else "mmajor"; sp = None; continue
    if re.search(r"Function properties for .*fused_tc_kernelIffE", l): cur = "ftc"; sp = None; continue
    if cur and "spill stores" in l: sp = re.search(r"(\d+) bytes spill stores", l).group(1)
    if cur and "Used" in l:
        out.append("%s:%s/%s" % (cur, re.search(r"Used (\d+)", l).group(1), sp)); cur = None
print(" ".join(sorted(out)))
PY
}
CSV=$O/sweep.csv
echo "variant,layer,op,ms,min_ms,tflops,check,regs_spills" > "$CSV"
for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name flags <<< "$v"
  left=$((225 - (SECONDS - t0)))
  if [ "$left" -lt 15 ]; then echo "out of time before $name"; break; fi
  if ! nvcc -o "$B/$name" "$B/check.o" "$B/$name.o" > "$B/$name.link.txt" 2>&1; then
    echo "$name: build/link failed"; grep -v "ptxas info" "$B/$name.build.txt" | head -5
    echo "$name,,,,,,build_failed," >> "$CSV"; continue
  fi
  rs=$(regs "$B/$name.build.txt")
  t1=$SECONDS
  WINO_DTYPES=f32 timeout 40 "$B/$name" quick > "$O/$name.check.txt" 2>&1
  rc=$?; st=$([ $rc = 0 ] && echo ok || echo "fail_rc$rc")
  env $BENCH_SEL BENCH_CSV=$O/$name.bench.csv BENCH_LAYERS=$LAYERS BENCH_ITERS=$ITERS \
    BENCH_NO_REF=1 timeout $((left > 60 ? 60 : left)) "$B/$name" none bench \
    > "$O/$name.bench.txt" 2>&1
  brc=$?
  [ $brc = 0 ] || st="$st;bench_rc$brc"
  echo "[$((SECONDS - t0)) s] $name check=$st ($((SECONDS - t1)) s) regs $rs"
  grep "^BENCH" "$O/$name.bench.txt" | sed 's/^/    /'
  # bench.csv: layer,family,layout,dtype,op,median,min,tflops
  awk -F, -v n="$name" -v s="$st" -v r="$rs" \
    'NF >= 8 {print n "," $1 "," ($4 == "f32" ? "" : $4 "_") $5 "," $6 "," $7 "," $8 "," s "," r}' \
    "$O/$name.bench.csv" >> "$CSV" 2>/dev/null
done
python3 - "$CSV" > "$O/summary.md" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
t = collections.defaultdict(dict)
vs, keys = [], []
for r in rows:
    if not r["layer"]: continue
    if r["variant"] not in vs: vs.append(r["variant"])
    k = (r["layer"], r["op"])
    if k not in keys: keys.append(k)
    t[r["variant"]][k] = float(r["ms"])
print("# Winograd sweep (NHWC, median ms; op prefixed by the dtype unless fp32; * = best)\n")
print("| layer | op | " + " | ".join(vs) + " |")
print("|---|---|" + "---|" * len(vs))
for k in keys:
    vals = [t[v].get(k) for v in vs]
    best = min(x for x in vals if x is not None)
    print("| %s | %s | " % k + " | ".join(
        "" if x is None else ("*%.4f" % x if x == best else "%.4f" % x) for x in vals) + " |")
tot = {v: sum(t[v].get(k, float("nan")) for k in keys) for v in vs}
print("\n| variant | sum ms (all rows) | vgg_c3_2 fwd ms | check | regs/spill-bytes (fp32 wide) |")
print("|---|---|---|---|---|")
info = {r["variant"]: (r["check"], r["regs_spills"]) for r in rows}
for v in vs:
    print("| %s | %.4f | %s | %s | %s |" % (v, tot[v], t[v].get(("vgg_c3_2", "fwd"), ""),
                                          *info.get(v, ("", ""))))
PY
cat "$O/summary.md"
echo "total $((SECONDS - t0)) s"
