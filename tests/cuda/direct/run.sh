#!/bin/bash
# Runs on the GPU machine from the repo root: bash tests/cuda/direct/run.sh [OUTDIR]
# Builds the standalone DIRECT check, checks every DIRECT path against an fp64 reference
# (including the dws depthwise kernels), memcheck/racecheck on a quick subset, timing table.
cd "$(dirname "$0")/../../.."
O=${1:-${OUT:-/tmp/out}}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $O/info.txt
t0=$SECONDS
nvcc -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 --expt-relaxed-constexpr -lineinfo -Xptxas -v -I ffi/include -I ffi/cuda \
  tests/cuda/direct/check.cu ffi/cuda/conv_direct.cu ffi/cuda/conv_cuda.cu tests/cuda/family_stubs.cu -o /tmp/check > $O/build.txt 2>&1 || { grep -v "ptxas info" $O/build.txt | head -50; exit 1; }
echo "build $((SECONDS-t0)) s"
grep -A3 "Compiling entry.*dws_" $O/build.txt | grep -E "spill|Used" | sort | uniq -c | head -20
t1=$SECONDS
BENCH_CSV=$O/bench.csv timeout 100 /tmp/check full bench > $O/check.txt 2>&1; check_rc=$?; echo "check rc=$check_rc $((SECONDS-t1)) s"
grep -v "^ok" $O/check.txt | grep -v "^BENCH" | head -60
# the row-at-a-time dws wgrad kernels, which the tiled one replaces on unit-stride problems
JAXDNN_DWS_WGRAD_ROWS=1 timeout 60 /tmp/check quick > $O/check_rows.txt 2>&1; rows_rc=$?
echo "check (JAXDNN_DWS_WGRAD_ROWS=1) rc=$rows_rc"; grep -v "^ok" $O/check_rows.txt | head -20
echo "---- timings (median ms; lax bf16 mnv2: 0.070/0.070/0.112, cuDNN 0.032/0.048/0.037)"
grep "^BENCH" $O/check.txt
t1=$SECONDS
timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/check quick > $O/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1)) s"; tail -3 $O/memcheck.txt
t1=$SECONDS
timeout 30 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/check quick > $O/racecheck.txt 2>&1; echo "racecheck rc=$? $((SECONDS-t1)) s"; tail -3 $O/racecheck.txt
echo "total $((SECONDS-t0)) s"
[ "${check_rc:-1}" = 0 ] && [ "${rows_rc:-1}" = 0 ]
