#!/usr/bin/env bash
# Host emulation of the CUDA FFT kernels, for machines without a GPU:
#   bash tests/cuda/fft/emulate.sh [quick|full]
# Rewrites ffi/cuda/conv_fft.cu's launches into emu::launch calls, compiles it, conv_cuda.cu and
# check.cu with g++ against the emulated runtime (tests/cuda/pool/emu plus emu/ here) under
# AddressSanitizer and UBSan, and runs the checker with every block's threads as std::threads
# (real barriers; the transform kernels with EMU_FFT_THREADS threads per block). Float32 and
# 16-bit dtypes only by default (FFT_CHECK_DTYPES overrides): the emulator caps dynamic shared
# memory at 48 KiB, which float64 transforms of 2048+ points exceed (they report a launch
# error). What it cannot see: nvcc errors, warp-level behaviour, device rounding intrinsics, speed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${TMPDIR:-/tmp}/jaxdnn-fftemu
mkdir -p "$D"
python3 - ffi/cuda/conv_fft.cu "$D/conv_fft_emu.cc" <<'PY'
import os, re, sys
src = open(sys.argv[1]).read()
src, launches = re.subn(r"(\w+<[^<>]*>)<<<(.*?)>>>\(",
                        lambda m: f"emu::launch({m.group(1)}, {m.group(2)}, ", src, flags=re.S)
src, shared = re.subn(r"extern __shared__ __align__\(16\) unsigned char (\w+)\[\];",
                      r"unsigned char* \1 = emu::shared_mem();", src)
# Fewer threads per transform CTA (the kernels loop over blockDim): std::thread creation
# dominates. EMU_FFT_THREADS=1 (the default) runs each transform block as one thread, 64 checks
# the barriers too (slow).
src, threads = re.subn(r"constexpr int kThreads = 256;",
                       f"constexpr int kThreads = {os.environ.get('EMU_FFT_THREADS', '1')};", src)
assert launches == 4 and shared == 3 and threads == 1, (launches, shared, threads)
open(sys.argv[2], "w").write(src)
PY
F="-std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined
   -DJAXDNN_FFT_EMULATION -I tests/cuda/fft/emu -I tests/cuda/pool/emu -I tests/cuda/pool
   -I ffi/include -I ffi/cuda"
g++ $F -c "$D/conv_fft_emu.cc" -o "$D/fft.o" &
g++ $F -x c++ -c tests/cuda/fft/check.cu -o "$D/check.o" &
wait %1 && wait %2
g++ $F -x c++ -c ffi/cuda/conv_cuda.cu -o "$D/cuda.o"
g++ $F -x c++ -c tests/cuda/family_stubs.cu -o "$D/stubs.o"
g++ $F "$D/fft.o" "$D/check.o" "$D/cuda.o" "$D/stubs.o" -o "$D/check" -pthread
JAXDNN_EMU_THREADS=1 FFT_CHECK_DTYPES=${FFT_CHECK_DTYPES:-f32,bf16,f16,bf16->f32} \
  "$D/check" "${1:-quick}"
