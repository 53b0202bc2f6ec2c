#!/bin/bash
# Runs on the GPU machine from anywhere: bash tests/cuda/winograd/run.sh [OUTDIR]
# Builds the standalone Winograd check (conv_winograd.cu alone), checks WINOGRAD_NONFUSED and
# WINOGRAD against an fp64 reference (every dtype, fwd/dgrad/wgrad, many geometries), once more
# with forced small chunks (the multi-chunk paths), the float32 error of the NONFUSED tiles
# against the reduction length (sweep), memcheck/racecheck on the quick subset, and prints the
# BENCH table (median of 20 launches; F(6x6) rows beside F(4x4), each with its measured error).
# Logs go to OUTDIR. About 3-4 minutes.
cd "$(dirname "$0")/../../.."
O=${1:-${OUT:-/tmp/out}}; mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$O/info.txt"
t0=$SECONDS
B=$O/wino_check
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -DJAXDNN_SM90A=1 --expt-relaxed-constexpr -lineinfo \
  -Xptxas -v -I ffi/include -I ffi/cuda tests/cuda/winograd/check.cu ffi/cuda/conv_winograd.cu \
  -o "$B" > "$O/build.txt" 2>&1 || { grep -v "ptxas info" "$O/build.txt" | head -50; exit 1; }
echo "build $((SECONDS-t0)) s"
grep -A2 "Compiling entry.*\(gemm\|fused\)_kernel" "$O/build.txt" | grep -E "Used|spill" |
  sort | uniq -c
echo "kernels spilling (all, F(6x6) transforms included; the fused kernels' spills predate F(6x6)):"
awk -F"'" '/Compiling entry/ {f=$2} /bytes spill stores/ && ($0 !~ / 0 bytes spill stores, 0 bytes spill loads/) {
  sub(/.*frame, /, ""); print f " " $0}' "$O/build.txt" | c++filt |
  sed 's/(anonymous namespace):://; s/^void jaxdnn::cuda:://; s/(.*)//' | sort | uniq -c | head -20
t1=$SECONDS
BENCH_CSV=$O/bench.csv timeout 300 "$B" full bench > "$O/check.txt" 2>&1; check_rc=$?
echo "check rc=$check_rc $((SECONDS-t1)) s"
grep -v "^ok" "$O/check.txt" | grep -v "^BENCH" | head -60
t1=$SECONDS
JAXDNN_WINO_CHUNK_TILES=7 timeout 60 "$B" quick > "$O/check_chunks.txt" 2>&1; chunk_rc=$?
echo "check (7-tile chunks) rc=$chunk_rc $((SECONDS-t1)) s"
grep -v "^ok" "$O/check_chunks.txt" | head -20
t1=$SECONDS
# the forward-shaped GEMM on wgmma everywhere (by default only K >= 256, N > 64, large grids)
JAXDNN_WINO_GEMM=wgmma timeout 120 "$B" full > "$O/check_wgmma.txt" 2>&1; wgmma_rc=$?
echo "check (GEMM on wgmma) rc=$wgmma_rc $((SECONDS-t1)) s"
grep -v "^ok" "$O/check_wgmma.txt" | head -20
t1=$SECONDS
timeout 120 "$B" sweep > "$O/sweep_errors.txt" 2>&1; sweep_rc=$?
echo "error sweep rc=$sweep_rc $((SECONDS-t1)) s (fp32 rel vs C/G or K/G; fwd dgrad wgrad):"
awk '/^(ok|FAIL)/ {k=$2" "$3; v[k]=v[k]" "$8} END {for (k in v) print k v[k]}' \
  "$O/sweep_errors.txt" | sed 's/rel=//g' | sort -V
echo "---- timings (fp32 NCHW cuDNN WINOGRAD_NONFUSED vgg_c3_2 0.93 ms, r50_c3_3x3 0.131 ms;"
echo "     lax HIGHEST vgg_c3_2 2.78 ms)"
grep "^BENCH" "$O/check.txt"
t1=$SECONDS
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$B" quick > "$O/memcheck.txt" 2>&1
mem_rc=$?; echo "memcheck rc=$mem_rc $((SECONDS-t1)) s"; tail -2 "$O/memcheck.txt"
t1=$SECONDS
WINO_DTYPES=f32 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$B" quick \
  > "$O/racecheck.txt" 2>&1
race_rc=$?; echo "racecheck rc=$race_rc $((SECONDS-t1)) s"; tail -2 "$O/racecheck.txt"
echo "total $((SECONDS-t0)) s"
[ "$check_rc" = 0 ] && [ "$chunk_rc" = 0 ] && [ "$wgmma_rc" = 0 ] && [ "$sweep_rc" = 0 ] && [ "$mem_rc" = 0 ] && [ "$race_rc" = 0 ]
