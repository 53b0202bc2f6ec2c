// Emulated CUDA runtime for the FFT kernels (../emulate.sh): the shared one (tests/cuda/emu) plus
// the two intrinsics conv_fft.cu uses beyond it.
#pragma once

#include <cmath>

#include "../../emu/cuda_runtime.h"

inline unsigned int __brev(unsigned int x) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline void sincospi(double x, double* s, double* c) {
  *s = std::sin(M_PI * x);
  *c = std::cos(M_PI * x);
}
