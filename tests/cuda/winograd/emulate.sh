#!/usr/bin/env bash
# Host emulation of the CUDA Winograd kernels, for machines without a GPU:
#   bash tests/cuda/winograd/emulate.sh [quick|full|build]   (build: only compile $D/check)
# Rewrites ffi/cuda/conv_winograd.cu's launches into emu::launch calls, compiles it and check.cu
# with g++ against the emulated runtime in emu/ (AddressSanitizer, UBSan), and runs the checker.
# What it cannot see: nvcc compile errors, real concurrency between warps, device rounding (FMA
# contraction), speed.
# WINO_DTYPES (e.g. f64,f32) and WINO_CASE narrow the run; JAXDNN_WINO_CHUNK_TILES forces chunks.
# WINO_DEFS adds compile flags, e.g. WINO_DEFS="-DWINO_GEMM_BK=32" (a GEMM variant of sweep.sh).
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${WINO_EMU_DIR:-${TMPDIR:-/tmp}/jaxdnn-winoemu}
mkdir -p "$D"
python3 - ffi/cuda/conv_winograd.cu "$D/wino_emu.cc" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
src, n = re.subn(r"((\w+_kernel)<[^<>]*>)<<<(.*?)>>>\(",
                 lambda m: f'emu::launch("{m.group(2)}", {m.group(1)}, {m.group(3)}, ', src,
                 flags=re.S)
assert n >= 8, n
open(sys.argv[2], "w").write(src)
PY
F="-std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined
   -ffp-contract=off -DJAXDNN_WINO_EMULATION -I tests/cuda/winograd/emu -I ffi/include -I ffi/cuda
   ${WINO_DEFS:-}"
g++ $F -c "$D/wino_emu.cc" -o "$D/wino.o" &
g++ $F -x c++ -c tests/cuda/winograd/check.cu -o "$D/check.o" &
wait %1
wait %2
g++ $F "$D/wino.o" "$D/check.o" -o "$D/check" -pthread -ldl  # -ldl: dlopen (emu_fibers.h) before glibc 2.34
[ "${1:-}" = build ] && exit 0  # build only: $D/check
"$D/check" "${1:-quick}"
