#!/usr/bin/env bash
# Host emulation of the CUDA pooling kernels, for machines without a GPU:
#   bash tests/cuda/pool/emulate.sh [quick|full]      (from anywhere; about a minute for quick)
# Rewrites ffi/cuda/pool_cuda.cu's launches into emu::launch calls, compiles it and check.cu with
# g++ against the emulated runtime in emu/ (AddressSanitizer, UBSan alignment checks) and runs
# the checker with the forward's heuristic, plain and split kernels; first it checks the
# checker's reference against the CPU kernels. What it cannot see: nvcc compile errors, real
# concurrency (the tiled one-channel forward stages its whole tile in every emulated thread;
# run.sh racechecks the real split of that load on the GPU), the device's own rounding and
# packed 16-bit max intrinsics, speed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${TMPDIR:-/tmp}/jaxdnn-poolemu
mkdir -p "$D"
python3 - ffi/cuda/pool_cuda.cu "$D/pool_cuda_emu.cc" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
src, launches = re.subn(r"(\w+_kernel<[^<>]*>)<<<(.*?)>>>\(",
                        lambda m: f"emu::launch({m.group(1)}, {m.group(2)}, ", src, flags=re.S)
src, shared = re.subn(r"extern __shared__ unsigned char (\w+)\[\];",
                      r"unsigned char* \1 = emu::shared_mem();", src)
assert launches >= 5 and shared >= 1, (launches, shared)
open(sys.argv[2], "w").write(src)
PY
F="-std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined
   -ffp-contract=off -mf16c -DJAXDNN_POOL_EMULATION -I tests/cuda/pool/emu -I tests/cuda/pool
   -I ffi/include -I ffi/cuda"
# One compiler at a time (small shared machines).
g++ $F -c "$D/pool_cuda_emu.cc" -o "$D/pool.o"
g++ $F -x c++ -c tests/cuda/pool/check.cu -o "$D/check.o"
g++ $F "$D/pool.o" "$D/check.o" -o "$D/check" -pthread
# The reference against the CPU kernels (pool_cpu.cc, built with the CPU extension's flags):
# max, gather and scatter must agree bitwise, avg within the bound.
g++ -std=c++20 -O3 -ffp-contract=fast -fno-math-errno -march=native -DJAXDNN_POOL_EMULATION \
  -DJAXDNN_POOL_CHECK_CPU -I tests/cuda/pool/emu -I tests/cuda/pool -I ffi/include -I ffi/cuda \
  -I ffi/cpu -x c++ tests/cuda/pool/check.cu ffi/cpu/pool_cpu.cc ffi/cpu/parallel.cc \
  -o "$D/check_cpu" -pthread
rc=0
"$D/check_cpu" full || rc=1
for split in heuristic 0 1; do
  if [ "$split" = heuristic ]; then
    env -u JAXDNN_POOL_SPLIT -u JAXDNN_POOL_CHAN "$D/check" "${1:-quick}" || rc=1
  else
    JAXDNN_POOL_SPLIT=$split env -u JAXDNN_POOL_CHAN "$D/check" "${1:-quick}" || rc=1
  fi
done
# Channel tiles of 2 x 3 outputs x 1 vector (every spec crosses tile borders), and off (the
# older two-pass scatter and plain forward on the same specs).
for chan in 2,3,1 0; do
  JAXDNN_POOL_QUAD=0 JAXDNN_POOL_CHAN=$chan env -u JAXDNN_POOL_SPLIT "$D/check" "${1:-quick}" || rc=1
done
exit $rc
