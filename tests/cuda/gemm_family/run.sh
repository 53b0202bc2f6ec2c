#!/usr/bin/env bash
# One-shot GPU check + timing of the GEMM-family kernels (target: < 2.5 min on one H200).
#   bash tests/cuda/gemm_family/run.sh [OUTDIR]      (from the repo root; OUTDIR defaults to /tmp/gemmcheck)
# 1. builds bin/check against the GEMM-family and wgmma sources (build.sh; compiles run in parallel)
# 2. correctness: all 3 algorithms x 3 ops x 7 dtype combos x NHWC/NCHW on check.cu's geometry set
#    (automatic tile; every forward again with a fused epilogue), then the forced 128x128 forward
#    tile (JAXDNN_GEMM_TILE=L, quick set), each forced wgmma tile (quick set: bf16, tf32, f64),
#    each forced wgmma tile with the persistent walk forced on (forward, bf16 and tf32), the
#    mma.sync kernel instead of wgmma, forced split-K
# 3. timing: IMPLICIT_PRECOMP_GEMM bf16 forward on the ResNet-50 layers (ms, TFLOP/s); tf32
#    forward (float32, DEFAULT precision) on the ResNet-50, vgg_c3_2 and inc_5x5 layers, wgmma
#    and mma.sync (JAXDNN_NO_WGMMA=1)
# Exit status: non-zero when a build or a check failed.
set -u
cd "$(dirname "$0")/../../.."
OUT=${1:-/tmp/gemmcheck}
mkdir -p "$OUT"
T0=$(date +%s)
echo "== build"
if ! bash tests/cuda/gemm_family/build.sh > "$OUT/build.log" 2>&1; then
  cat "$OUT/build.log"; echo "BUILD FAILED"; exit 2
fi
echo "   built in $(( $(date +%s) - T0 )) s"
BIN=/tmp/jaxdnn-gemmcheck/check
rc=0
echo "== correctness (automatic tile)"
timeout 90 $BIN --no-time > "$OUT/check_auto.log" 2>&1 || rc=1
grep -E "^(FAIL|CHECK|BAD|WS|  worst)" "$OUT/check_auto.log" | head -40
echo "== correctness (forced 128x128 forward tile, quick set)"
JAXDNN_GEMM_TILE=L timeout 25 $BIN --no-time --quick > "$OUT/check_L.log" 2>&1 || rc=1
grep -E "^(FAIL|CHECK|BAD|WS)" "$OUT/check_L.log" | head -20
for t in 128x128 64x128 64x64; do
  echo "== correctness (wgmma tile forced to $t, quick set)"
  JAXDNN_WGMMA_TILE=$t timeout 40 $BIN --no-time --quick > "$OUT/check_wg_$t.log" 2>&1 || rc=1
  grep -E "^(FAIL|CHECK|BAD|WS|  worst)" "$OUT/check_wg_$t.log" | head -20
done
for t in 128x128 64x128 64x64; do
  echo "== correctness (wgmma tile $t, persistent walk forced on, forward, bf16 + tf32)"
  JAXDNN_WGMMA_PERSISTENT=1 JAXDNN_WGMMA_TILE=$t timeout 40 $BIN --no-time --quick --fwd-only \
    --only bf16,tf32 > "$OUT/check_wgp_$t.log" 2>&1 || rc=1
  grep -E "^(FAIL|CHECK|BAD|WS)" "$OUT/check_wgp_$t.log" | head -20
done
echo "== correctness (mma.sync kernel instead of wgmma, quick set)"
JAXDNN_NO_WGMMA=1 timeout 40 $BIN --no-time --quick > "$OUT/check_nowg.log" 2>&1 || rc=1
grep -E "^(FAIL|CHECK|BAD|WS|  worst)" "$OUT/check_nowg.log" | head -20
echo "== correctness (forced split-K, 3 splits, quick set)"
JAXDNN_GEMM_SPLITS=3 timeout 40 $BIN --no-time --quick > "$OUT/check_split3.log" 2>&1 || rc=1
grep -E "^(FAIL|CHECK|BAD|WS)" "$OUT/check_split3.log" | head -20
echo "== IMPLICIT_PRECOMP_GEMM bf16 forward, ResNet-50 layers (NHWC, N=32)"
grep -E "^r50" benchmarks/layers-gpu.txt > "$OUT/layers_r50.txt"
timeout 30 $BIN --no-check --fwd-only --layers "$OUT/layers_r50.txt" --csv "$OUT/timing_r50.csv" \
  > "$OUT/timing_r50.log" 2>&1 || rc=1
cat "$OUT/timing_r50.log"
echo "== IMPLICIT_PRECOMP_GEMM tf32 forward (float32, DEFAULT precision): wgmma, then mma.sync"
grep -E "^(r50|vgg_c3_2|inc_5x5)" benchmarks/layers-gpu.txt > "$OUT/layers_tf32.txt"
timeout 40 $BIN --no-check --fwd-only --only tf32 --layers "$OUT/layers_tf32.txt" \
  --csv "$OUT/timing_tf32.csv" > "$OUT/timing_tf32.log" 2>&1 || rc=1
cat "$OUT/timing_tf32.log"
JAXDNN_NO_WGMMA=1 timeout 40 $BIN --no-check --fwd-only --only tf32 --layers "$OUT/layers_tf32.txt" \
  --csv "$OUT/timing_tf32_mmasync.csv" > "$OUT/timing_tf32_mmasync.log" 2>&1 || rc=1
cat "$OUT/timing_tf32_mmasync.log"
echo "== done in $(( $(date +%s) - T0 )) s, rc=$rc"
exit $rc
