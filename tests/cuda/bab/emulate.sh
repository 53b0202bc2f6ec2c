#!/usr/bin/env bash
# Host emulation of the CUDA bias/activation backward, for machines without a GPU:
#   bash tests/cuda/bab/emulate.sh [smoke|quick|full]   (from anywhere; the smoke set about 15 s on
#   two cores, compiles included (30 s with ucontext fibers); quick about 10 minutes before the
#   emulated threads were fibers, not re-measured since)
# Rewrites the kernel launches of ffi/cuda/bias_act.cu and of the checker's copy of the older
# kernels (baseline.cuh) into emu::launch calls, compiles them and check.cu with g++ against the
# emulated runtime in tests/cuda/emu/ (AddressSanitizer, UBSan with alignment checks), and runs the checker:
# the default grid, a grid of at most 2 blocks per channel group (several rounds of rows per
# thread, tails), and the older kernels under the same reference (smoke set). What it cannot
# see: nvcc errors, real concurrency between blocks (the emulator runs blocks one at a time, in
# forward and reverse order), the device's rounding and math library, speed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${TMPDIR:-/tmp}/jaxdnn-babemu
mkdir -p "$D"
python3 tests/cuda/emu/rewrite.py "$D" ffi/cuda/bias_act.cu:bias_act_emu.cc:4 \
  tests/cuda/bab/baseline.cuh::4 tests/cuda/bab/check.cu
F="-std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined
   -fno-strict-aliasing -ffp-contract=off -DJAXDNN_BAB_EMULATION -I tests/cuda/emu
   -I tests/cuda/pool -I ffi/include -I ffi/cuda"
# One compiler at a time (small shared machines).
g++ $F -c "$D/bias_act_emu.cc" -o "$D/bias_act.o"
g++ $F -c "$D/check.cc" -o "$D/check.o"
g++ $F "$D/bias_act.o" "$D/check.o" -o "$D/check" -pthread -ldl  # -ldl: dlopen (emu_fibers.h) before glibc 2.34
rc=0
env -u JAXDNN_BAB_BLOCKS "$D/check" "${1:-quick}" || rc=1
JAXDNN_BAB_BLOCKS=2 "$D/check" "${1:-quick}" || rc=1
env -u JAXDNN_BAB_BLOCKS "$D/check" smoke --old || rc=1
exit $rc
