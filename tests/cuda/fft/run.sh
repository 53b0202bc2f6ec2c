#!/bin/bash
# Runs on the GPU machine from the repo root: bash tests/cuda/fft/run.sh [OUTDIR]
# Builds the standalone FFT / FFT_TILING check (conv_fft.cu and the dispatch only), checks every
# case of both families, all three operations and every dtype against an fp64 reference, runs
# the quick set again with tiny row chunks (the chunk loop and wgrad's accumulation over
# chunks), memcheck / racecheck on a small subset, then the timing table (BENCH lines: median
# ms over 25 launches, cudaEvent timing, and the fp32 error at sampled elements).
cd "$(dirname "$0")/../../.."
O=${1:-${OUT:-/tmp/out}}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $O/info.txt
t0=$SECONDS
nvcc -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -lineinfo -Xptxas -v \
  -I ffi/include -I ffi/cuda -I tests/cuda/pool \
  tests/cuda/fft/check.cu ffi/cuda/conv_fft.cu ffi/cuda/conv_cuda.cu tests/cuda/family_stubs.cu \
  -o /tmp/fftcheck > $O/build.txt 2>&1 || { grep -v "ptxas info" $O/build.txt | head -50; exit 1; }
echo "build $((SECONDS-t0)) s"; grep -E "spill" $O/build.txt | sort | uniq -c | head
t1=$SECONDS
BENCH_CSV=$O/bench.csv timeout 150 /tmp/fftcheck full bench > $O/check.txt 2>&1; check_rc=$?
echo "check rc=$check_rc $((SECONDS-t1)) s"
grep -c "^ok" $O/check.txt | sed 's/^/ok lines: /'
grep -v "^ok" $O/check.txt | grep -v "^BENCH" | head -60
t1=$SECONDS
JAXDNN_FFT_CHUNK_BYTES=20000 timeout 40 /tmp/fftcheck quick > $O/check_chunks.txt 2>&1
chunk_rc=$?; echo "check (tiny chunks) rc=$chunk_rc $((SECONDS-t1)) s"
grep -v "^ok" $O/check_chunks.txt | head -20
echo "---- timings (lax HIGHEST inc_5x5 fwd 0.077 ms, cuDNN FFT 0.073 ms)"
grep "^BENCH" $O/check.txt
export FFT_CHECK_ONLY=odd_7x9_c3k4,negpad_asym,1d_groups2,3d_nhwc FFT_CHECK_DTYPES=f32
t1=$SECONDS
timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/fftcheck full \
  > $O/memcheck.txt 2>&1; mem_rc=$?; echo "memcheck rc=$mem_rc $((SECONDS-t1)) s"
tail -3 $O/memcheck.txt
t1=$SECONDS
export FFT_CHECK_ONLY=odd_7x9_c3k4,1d_groups2
timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/fftcheck full \
  > $O/racecheck.txt 2>&1; race_rc=$?; echo "racecheck rc=$race_rc $((SECONDS-t1)) s"
tail -3 $O/racecheck.txt
echo "total $((SECONDS-t0)) s"
[ "$check_rc" = 0 ] && [ "$chunk_rc" = 0 ] && [ "$mem_rc" = 0 ] && [ "$race_rc" = 0 ]
