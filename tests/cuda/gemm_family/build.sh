#!/usr/bin/env bash
# Build the checker: bash tests/cuda/gemm_family/build.sh  (from the repo root)
set -e
cd "$(dirname "$0")/../../.."
OUTD=/tmp/jaxdnn-gemmcheck; mkdir -p $OUTD
F="-std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -I ffi/include -I ffi/cuda"
nvcc $F -c ffi/cuda/conv_gemm_family.cu -o $OUTD/cgf.o &
nvcc $F -c ffi/cuda/conv_wgmma.cu -o $OUTD/wg.o &
nvcc $F -c tests/cuda/gemm_family/check.cu -o $OUTD/check.o &
wait
nvcc -gencode arch=compute_90a,code=sm_90a $OUTD/cgf.o $OUTD/wg.o $OUTD/check.o -o $OUTD/check
