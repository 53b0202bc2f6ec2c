#!/usr/bin/env bash
# Runs on the GPU machine from anywhere: bash tests/cuda/pool/run.sh [OUTDIR]   (about 2 min)
# Builds the standalone pooling check with nvcc, checks every pooling kernel against the host
# reference (full set) with the forward's heuristic, plain (JAXDNN_POOL_SPLIT=0) and split
# (=1) kernels, tiny channel tiles (JAXDNN_POOL_CHAN=2,3,1) and none (=0) with the quads off
# (JAXDNN_POOL_QUAD=0, so that 3x3 stride-2 specs reach the other kernels), runs memcheck and
# racecheck on the quick set, then the ResNet-50 timing table (bf16 NHWC N=32, target >= 3000
# GB/s; a cudaMemcpy row gives the device's copy bandwidth), and again with the channel tiles
# off.
# JAXDNN_POOL_BASELINE=FILE also times another pool_cuda.cu (e.g. an older commit's) for A/B.
# POOL_AB_ENVS: space-separated timing variants of the default build (settings joined by ','),
# POOL_AB_BUILDS: of builds with -D settings (joined by ','), both on the cases matching
# POOL_AB_ONLY (default "maxpool3x3s2p1 32x"), into ab.txt. POOL_BIN / POOL_AB_BINS: prebuilt
# checkers (below).
# Exit status: non-zero when a build or a check failed.
set -u
cd "$(dirname "$0")/../../.."
O=${1:-${OUT:-/tmp/poolcheck}}
mkdir -p "$O"
BIN=/tmp/jaxdnn-poolcheck
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$O/info.txt"
t0=$SECONDS
# POOL_BIN=path: a checker built on the host (run.sh's nvcc line; carried) instead of this build.
if [ -n "${POOL_BIN:-}" ]; then
  BIN=$POOL_BIN
  echo "prebuilt checker $BIN"
else
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo \
  -Xptxas -v -Xcompiler -ffp-contract=off -I ffi/include -I ffi/cuda -I tests/cuda/pool \
  tests/cuda/pool/check.cu ffi/cuda/pool_cuda.cu -o $BIN > "$O/build.txt" 2>&1 \
  || { grep -v "ptxas info" "$O/build.txt" | head -50; echo "BUILD FAILED"; exit 2; }
echo "build $((SECONDS - t0)) s; registers/spills of the pooling kernels:"
grep -E "spill|Used" "$O/build.txt" | sed -E 's/ptxas info *: //' | sort | uniq -c | sort -rn | head -8
fi
rc=0
# POOL_CHECKS: a subset of these configurations (short calls); POOL_LEAN=1 also skips the
# racechecks and the timings with the quads and channel tiles off.
for split in ${POOL_CHECKS:-heuristic 0 1 chan2,3,1 chan0}; do
  t1=$SECONDS
  if [ "$split" = heuristic ]; then
    env -u JAXDNN_POOL_SPLIT -u JAXDNN_POOL_CHAN timeout 300 $BIN full > "$O/check_$split.txt" 2>&1 || rc=1
  elif [ "${split#chan}" != "$split" ]; then  # channel tiles forced tiny / off
    JAXDNN_POOL_QUAD=0 JAXDNN_POOL_CHAN=${split#chan} env -u JAXDNN_POOL_SPLIT timeout 300 $BIN full \
      > "$O/check_$split.txt" 2>&1 || rc=1
  else
    JAXDNN_POOL_SPLIT=$split env -u JAXDNN_POOL_CHAN timeout 300 $BIN full > "$O/check_$split.txt" 2>&1 || rc=1
  fi
  grep -E "^(FAIL|CUDA|pool check)" "$O/check_$split.txt" | head -12
  echo "  ($((SECONDS - t1)) s)"
done
t1=$SECONDS
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN quick > "$O/memcheck.txt" 2>&1 \
  || rc=1
echo "memcheck: $(grep -E 'ERROR SUMMARY' "$O/memcheck.txt" | tail -1) ($((SECONDS - t1)) s)"
if [ -z "${POOL_LEAN:-}" ]; then
t1=$SECONDS
JAXDNN_POOL_SPLIT=1 timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 $BIN quick \
  > "$O/racecheck.txt" 2>&1 || rc=1
echo "racecheck (split kernels): $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$O/racecheck.txt" | tail -1) ($((SECONDS - t1)) s)"
t1=$SECONDS
env -u JAXDNN_POOL_SPLIT timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 $BIN quick \
  --only c1-tiles > "$O/racecheck_tiles.txt" 2>&1 || rc=1
echo "racecheck (tiled one-channel forward): $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$O/racecheck_tiles.txt" | tail -1) ($((SECONDS - t1)) s)"
t1=$SECONDS
JAXDNN_POOL_QUAD=0 JAXDNN_POOL_CHAN=2,3,1 env -u JAXDNN_POOL_SPLIT timeout 240 compute-sanitizer --tool racecheck \
  --error-exitcode 9 $BIN quick --only ct- > "$O/racecheck_chan.txt" 2>&1 || rc=1
echo "racecheck (channel tiles): $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$O/racecheck_chan.txt" | tail -1) ($((SECONDS - t1)) s)"
fi
echo "---- timings (median of 7 x 20 launches; GB/s counts bytes read + written)"
timeout 120 $BIN --no-check bench --csv "$O/bench.csv" | grep "^BENCH" | tee "$O/bench.txt"
# The older kernels on the same cases (quads and channel tiles off), for A/B.
if [ -z "${POOL_LEAN:-}" ]; then
echo "---- timings with JAXDNN_POOL_QUAD=0 JAXDNN_POOL_CHAN=0"
JAXDNN_POOL_QUAD=0 JAXDNN_POOL_CHAN=0 timeout 120 $BIN --no-check bench --csv "$O/bench_chan0.csv" | grep "^BENCH" \
  | sed 's/^BENCH/CHAN0/' | tee "$O/bench_chan0.txt"
fi
if [ -n "${POOL_AB_ENVS:-}${POOL_AB_BUILDS:-}${POOL_AB_BINS:-}" ]; then
  POOL_AB_ONLY=${POOL_AB_ONLY:-maxpool3x3s2p1 32x}  # not := inside the pipe below: a subshell
  echo "---- A/B timings ($POOL_AB_ONLY)" | tee "$O/ab.txt"
  # the default and each POOL_AB_ENVS variant (the prebuilt rounds below time the default
  # themselves, so with POOL_AB_BINS alone this loop does not run)
  plain=; [ -n "${POOL_AB_ENVS:-}${POOL_AB_BUILDS:-}" ] && plain=default
  for v in $plain ${POOL_AB_ENVS:-}; do
    e=${v//,/ }; [ "$v" = default ] && e=
    env $e POOL_BENCH_ONLY="$POOL_AB_ONLY" timeout 60 $BIN --no-check bench | grep "^BENCH" \
      | sed "s/^BENCH/$v /" | tee -a "$O/ab.txt"
  done
  # POOL_AB_BINS: space-separated name=path of other prebuilt checkers, timed in turn with the
  # default build, ROUNDS times (POOL_AB_ROUNDS, default 2) so that clock drift shows.
  for round in $(seq "${POOL_AB_ROUNDS:-2}"); do
    for v in ${POOL_AB_BINS:+default=$BIN} ${POOL_AB_BINS:-}; do
      POOL_BENCH_ONLY="$POOL_AB_ONLY" timeout 60 "${v#*=}" --no-check bench | grep "^BENCH" \
        | sed "s/^BENCH/${v%%=*} r$round /" | tee -a "$O/ab.txt"
    done
  done
  for v in ${POOL_AB_BUILDS:-}; do
    d=$(echo "$v" | tr ',' '\n' | sed 's/^/-D/' | tr '\n' ' ')
    nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo \
      -Xptxas -v -Xcompiler -ffp-contract=off $d -I ffi/include -I ffi/cuda -I tests/cuda/pool \
      tests/cuda/pool/check.cu ffi/cuda/pool_cuda.cu -o $BIN-ab > "$O/build_ab.txt" 2>&1 \
      || { echo "$v: build failed" | tee -a "$O/ab.txt"; continue; }
    grep -A2 quad_ "$O/build_ab.txt" | grep -E "Used|spill" | sort | uniq -c | sed "s/^/$v ptxas /" >> "$O/ab.txt"
    POOL_BENCH_ONLY="$POOL_AB_ONLY" timeout 60 $BIN-ab --no-check bench | grep "^BENCH" \
      | sed "s/^BENCH/$v /" | tee -a "$O/ab.txt"
  done
fi
# A/B: JAXDNN_POOL_BASELINE=path/to/other/pool_cuda.cu times that kernel file with this checker.
if [ -n "${JAXDNN_POOL_BASELINE:-}" ]; then
  echo "---- baseline timings ($JAXDNN_POOL_BASELINE)"
  nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo \
    -Xcompiler -ffp-contract=off -I ffi/include -I ffi/cuda -I tests/cuda/pool \
    tests/cuda/pool/check.cu "$JAXDNN_POOL_BASELINE" -o $BIN-base > "$O/build_base.txt" 2>&1 \
    && timeout 120 $BIN-base --no-check bench --csv "$O/bench_base.csv" | grep "^BENCH" \
    | sed 's/^BENCH/BASE /' | tee "$O/bench_base.txt" || echo "baseline build or run failed"
fi
echo "total $((SECONDS - t0)) s, rc=$rc"
exit $rc
