#!/usr/bin/env bash
# Host emulation of the CUDA DIRECT kernels (ffi/cuda/conv_direct.cu: the general, depthwise
# (dw, dws) and grouped paths, forward, backward-data and backward-filter with its column sums),
# for machines without a GPU:
#   bash tests/cuda/direct/emulate.sh [build | quick | full]   (from anywhere; default quick)
# Rewrites the kernel launches and dynamic shared memory of conv_direct.cu and the checker
# (tests/cuda/emu/rewrite.py), compiles them with conv_cuda.cu's dispatch against the emulated
# runtime (tests/cuda/emu/cuda_runtime.h; cp.async from tests/cuda/gemm_family/emu) with g++
# (AddressSanitizer, UBSan) and runs the checker (build: only compile $D/check). What it cannot
# see: nvcc errors, real concurrency between warps and blocks (EMU_BLOCK_ORDER=reverse|shuffled
# changes the blocks' order), the device's rounding and math library, CUDA graphs (the checker's
# graph replay runs only on the GPU), speed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${DIRECT_EMU_DIR:-${TMPDIR:-/tmp}/jaxdnn-directemu}
mkdir -p "$D"
python3 tests/cuda/emu/rewrite.py "$D" ffi/cuda/conv_direct.cu::10 ffi/cuda/epilogue.cuh::1 \
  ffi/cuda/conv_cuda.cu tests/cuda/direct/check.cu tests/cuda/family_stubs.cu
F="-std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined
   -fno-strict-aliasing -ffp-contract=off -DJAXDNN_DIRECT_EMULATION -DJAXDNN_CUDA_EMULATION
   -I tests/cuda/emu -I tests/cuda/gemm_family/emu -I ffi/include -I ffi/cuda"
source tests/cuda/emu/build.sh
emu_build conv_direct conv_cuda check family_stubs
[ "${1:-}" = build ] && exit 0  # build only: $D/check
"$D/check" "${1:-quick}"
