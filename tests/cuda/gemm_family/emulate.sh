#!/usr/bin/env bash
# Host emulation of the CUDA GEMM-family kernels (IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM:
# the mma.sync, TF32, FFMA and DFMA paths, split-K, im2col / col2im, the fused epilogue), for
# machines without a GPU:
#   bash tests/cuda/gemm_family/emulate.sh [build | CHECK ARGS...]   (from anywhere)
# e.g. emulate.sh --no-time --quick --only bf16 --case negpad_s2x3_d2
# Rewrites the kernel launches and the dynamic shared memory of ffi/cuda/conv_gemm_kernel.cuh,
# conv_gemm_family.cu, epilogue.cuh and the checker (tests/cuda/emu/rewrite.py) into calls of the
# emulated runtime (tests/cuda/emu/cuda_runtime.h; emu/gemm_primitives.h stands in for the PTX
# wrappers), compiles them with g++ (AddressSanitizer, UBSan) and runs the checker with the
# arguments given (build: only compile $D/check). The emulated device has no wgmma (emu/no_wgmma.cc): every call runs the mma.sync
# kernel, as on a pre-Hopper GPU. What it cannot see: nvcc errors, the wgmma kernels, real
# concurrency between warps and blocks (blocks run one at a time, EMU_BLOCK_ORDER=reverse|shuffled
# changes their order), the tensor cores' rounding, speed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${GEMM_EMU_DIR:-${TMPDIR:-/tmp}/jaxdnn-gemmemu}
mkdir -p "$D"
python3 tests/cuda/emu/rewrite.py "$D" ffi/cuda/conv_gemm_kernel.cuh::2 ffi/cuda/conv_gemm_family.cu::5 \
  ffi/cuda/conv_gemm_fwd.cu ffi/cuda/conv_gemm_dgrad.cu ffi/cuda/conv_gemm_wgrad.cu \
  ffi/cuda/epilogue.cuh::1 tests/cuda/gemm_family/check.cu::3
# GEMM_EMU_SANITIZE=0: -O2 without the sanitizers (several times faster, for larger sets)
if [ "${GEMM_EMU_SANITIZE:-1}" = 0 ]; then
  S="-O2"
else
  S="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined"
fi
F="-std=c++20 $S -fno-strict-aliasing -ffp-contract=off -DJAXDNN_GEMM_EMULATION -DJAXDNN_CUDA_EMULATION
   -I tests/cuda/emu -I tests/cuda/gemm_family/emu -I ffi/include -I ffi/cuda"
source tests/cuda/emu/build.sh
emu_build conv_gemm_family conv_gemm_fwd conv_gemm_dgrad conv_gemm_wgrad check \
  tests/cuda/gemm_family/emu/no_wgmma.cc
[ "${1:-}" = build ] && exit 0  # build only: $D/check
"$D/check" "$@"
