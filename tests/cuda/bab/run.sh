#!/usr/bin/env bash
# Runs on the GPU machine from anywhere: bash tests/cuda/bab/run.sh [OUTDIR]   (about a minute)
# Builds the standalone bias/activation-backward check (ffi/cuda/bias_act.cu with check.cu and its
# copy of the older kernels), checks every kernel path against the float64 host reference (full
# set; a grid of 2 blocks per channel group on the quick set; the older kernels on the quick set),
# runs memcheck (both grids) and racecheck on the smoke set, then times bf16 relu + db on
# ResNet-50 shapes for the new and the older kernels (bench.txt; TB/s counts bytes read +
# written; a cudaMemcpy row gives the copy ceiling). Logs go to OUTDIR.
# Exit status: non-zero when the build or a check failed.
set -u
cd "$(dirname "$0")/../../.."
O=${1:-${OUT:-/tmp/babcheck}}
mkdir -p "$O"
BIN=/tmp/jaxdnn-babcheck
NVCC="nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo
      -I ffi/include -I ffi/cuda -I tests/cuda/pool"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$O/info.txt"
t0=$SECONDS
$NVCC -Xptxas -v -c ffi/cuda/bias_act.cu -o $BIN-kernels.o > "$O/build_kernels.txt" 2>&1 &
$NVCC -c tests/cuda/bab/check.cu -o $BIN-check.o > "$O/build_check.txt" 2>&1 &
build_rc=0
wait %1 || build_rc=1
wait %2 || build_rc=1
[ $build_rc = 0 ] && $NVCC $BIN-kernels.o $BIN-check.o -o $BIN >> "$O/build_check.txt" 2>&1 || build_rc=1
if [ $build_rc != 0 ]; then
  grep -v "ptxas info" "$O/build_kernels.txt" "$O/build_check.txt" | head -40
  echo "BUILD FAILED"
  exit 2
fi
echo "build $((SECONDS - t0)) s; bias_act.cu's kernels (ptxas):"
awk '/Compiling entry function/ {split($0, q, "\047"); name = q[2]}
     /bytes stack frame/ {sub(/^ +/, ""); stack = $0}
     /Used [0-9]+ registers/ {sub(/.*Used/, "Used"); print name ": " $0 "; " stack}' \
  "$O/build_kernels.txt" | (c++filt 2>/dev/null || cat) |
  sed -E 's/jaxdnn::cuda::\(anonymous namespace\):://g; s/\(BabParams<[^>]*>\)//; s/used 1 barriers, //' |
  sort | tee "$O/registers.txt"
rc=0
step() {  # step NAME TIMEOUT COMMAND...: runs COMMAND into $O/NAME.txt, prints its summary
  local name=$1 limit=$2
  shift 2
  local t1=$SECONDS
  timeout "$limit" "$@" > "$O/$name.txt" 2>&1 || rc=1
  echo "$name: $(grep -E '^(bab check|CUDA error)|ERROR SUMMARY|RACECHECK SUMMARY' "$O/$name.txt" | tail -1) ($((SECONDS - t1)) s)"
  grep -m 8 "^FAIL" "$O/$name.txt"
}
step check_full 120 env -u JAXDNN_BAB_BLOCKS $BIN full
step check_blocks2 60 env JAXDNN_BAB_BLOCKS=2 $BIN quick
step check_old 60 env -u JAXDNN_BAB_BLOCKS $BIN quick --old
step memcheck 120 env -u JAXDNN_BAB_BLOCKS compute-sanitizer --tool memcheck --error-exitcode 9 $BIN smoke
step memcheck_blocks2 120 env JAXDNN_BAB_BLOCKS=2 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN smoke
step racecheck 120 env -u JAXDNN_BAB_BLOCKS compute-sanitizer --tool racecheck --error-exitcode 9 $BIN smoke
echo "---- timings: median of 9 x 20 launches, inputs rotated through >= 200 MB (TB/s: bytes read + written)"
timeout 120 $BIN --no-check bench | grep "^BENCH" | tee "$O/bench.txt" || rc=1
echo "total $((SECONDS - t0)) s, rc=$rc"
exit $rc
