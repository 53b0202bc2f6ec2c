// The host-side CUDA API shared by the emulated runtimes (tests/cuda/{winograd,pool,bab}/emu/
// cuda_runtime.h; fft's builds on pool's): error codes, the last launch error, and device memory
// as host memory from posix_memalign of the exact size asked for (256-byte aligned, as
// cudaMalloc), so that AddressSanitizer sees any access past an allocation. Each runtime keeps its
// own launch and thread model.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorInvalidConfiguration = 9;
constexpr cudaError_t cudaErrorMemoryAllocation = 2;
using cudaStream_t = void*;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };

namespace emu {
inline cudaError_t last_error = cudaSuccess;  // set by an invalid launch
}  // namespace emu

inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "emulated launch error";
}
inline cudaError_t cudaMalloc(void** p, size_t n) {
  return posix_memalign(p, 256, n == 0 ? 1 : n) == 0 ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* dst, int v, size_t n) {
  std::memset(dst, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* dst, int v, size_t n, cudaStream_t = nullptr) {
  return cudaMemset(dst, v, n);
}
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
