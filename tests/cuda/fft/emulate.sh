#!/usr/bin/env bash
# Host emulation of the CUDA FFT kernels (ffi/cuda/conv_fft.cu: the shared-memory transforms, the
# complex channel GEMM, FFT and FFT_TILING, forward, backward-data, backward-filter), for machines
# without a GPU:
#   bash tests/cuda/fft/emulate.sh [build | quick | full]   (from anywhere; default quick)
# Rewrites conv_fft.cu's launches and dynamic shared memory (tests/cuda/emu/rewrite.py), compiles
# it, conv_cuda.cu's dispatch and check.cu with g++ against the emulated runtime
# (tests/cuda/emu/cuda_runtime.h: each block's threads as fibers meeting at real barriers; emu/
# here adds __brev and sincospi) under AddressSanitizer and UBSan, and runs the checker. Every
# dtype, float64 included (FFT_CHECK_DTYPES narrows them). Before the shared fiber runtime this
# ran each transform block as a single std::thread and capped shared memory at 48 KiB (no
# float64); a barrier removed from the forward transform now fails the quick set. What it cannot see: nvcc errors, real
# concurrency, device rounding intrinsics, CUDA graph replay, speed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${FFT_EMU_DIR:-${TMPDIR:-/tmp}/jaxdnn-fftemu}
mkdir -p "$D"
python3 tests/cuda/emu/rewrite.py "$D" ffi/cuda/conv_fft.cu::4 ffi/cuda/conv_cuda.cu \
  tests/cuda/fft/check.cu tests/cuda/family_stubs.cu
F="-std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined
   -ffp-contract=off -DJAXDNN_FFT_EMULATION -DJAXDNN_CUDA_EMULATION -I tests/cuda/fft/emu
   -I tests/cuda/emu -I tests/cuda/pool -I ffi/include -I ffi/cuda"
source tests/cuda/emu/build.sh
emu_build conv_fft conv_cuda check family_stubs
[ "${1:-}" = build ] && exit 0  # build only: $D/check
"$D/check" "${1:-quick}"
