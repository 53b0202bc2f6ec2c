#!/bin/bash
# Runs on the GPU machine from the repo root: bash tests/cuda/pointwise/run.sh [OUTDIR]
# Builds the standalone activation/softmax check, checks every kernel path against a float64
# host reference (sizes with tails, offset and mixed-offset buffers, guard elements), runs
# memcheck/racecheck on the quick subset, and prints bf16 bandwidth (bar: 3 TB/s).
cd "$(dirname "$0")/../../.."
O=${1:-${OUT:-/tmp/out}}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $O/info.txt
t0=$SECONDS
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -I ffi/include -I ffi/cuda \
  tests/cuda/pointwise/check.cu ffi/cuda/pointwise.cu -o /tmp/check_pointwise > $O/build.txt 2>&1 || { head -50 $O/build.txt; exit 1; }
echo "build $((SECONDS-t0)) s"
t1=$SECONDS
timeout 300 /tmp/check_pointwise full bench > $O/check.txt 2>&1; check_rc=$?; echo "check rc=$check_rc $((SECONDS-t1)) s"
grep -v "^BENCH" $O/check.txt | head -60
echo "---- bf16 bandwidth (bytes read + written; bar 3 TB/s)"
grep "^BENCH" $O/check.txt
t1=$SECONDS
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/check_pointwise quick > $O/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1)) s"; tail -3 $O/memcheck.txt
t1=$SECONDS
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/check_pointwise quick > $O/racecheck.txt 2>&1; echo "racecheck rc=$? $((SECONDS-t1)) s"; tail -3 $O/racecheck.txt
echo "total $((SECONDS-t0)) s"
[ "${check_rc:-1}" = 0 ]
