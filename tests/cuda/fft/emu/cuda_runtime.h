// Emulated CUDA runtime for the FFT kernels (emulate.sh): the pooling emulator
// (tests/cuda/pool/emu) plus what conv_fft.cu and check.cu use beyond it. Run with
// JAXDNN_EMU_THREADS=1: the FFT kernels need real barriers (each block's threads run as
// std::threads meeting at __syncthreads).
#pragma once

#include <cmath>
#include <cstdint>

#include "../../pool/emu/cuda_runtime.h"

#define __align__(n) alignas(n)

inline unsigned int __brev(unsigned int x) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline void sincospi(double x, double* s, double* c) {
  *s = std::sin(M_PI * x);
  *c = std::cos(M_PI * x);
}

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
template <typename K>
cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int) {
  return cudaSuccess;
}
