#!/usr/bin/env bash
# Build the checker: bash tests/cuda/gemm_family/build.sh  (from the repo root)
# The GEMM-family kernels compile as one unit per operation (conv_gemm_kernel.cuh), in parallel.
set -e
cd "$(dirname "$0")/../../.."
OUTD=/tmp/jaxdnn-gemmcheck; mkdir -p $OUTD
F="-std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -DJAXDNN_SM90A=1 --expt-relaxed-constexpr -lineinfo -I ffi/include -I ffi/cuda"
objs=()
for f in conv_gemm_family conv_gemm_fwd conv_gemm_dgrad conv_gemm_wgrad conv_wgmma; do
  nvcc $F -c ffi/cuda/$f.cu -o $OUTD/$f.o &
  objs+=($OUTD/$f.o)
done
nvcc $F -c tests/cuda/gemm_family/check.cu -o $OUTD/check.o &
for job in $(jobs -p); do wait $job; done
nvcc -gencode arch=compute_90a,code=sm_90a "${objs[@]}" $OUTD/check.o -o $OUTD/check
