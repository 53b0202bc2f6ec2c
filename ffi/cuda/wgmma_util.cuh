// Pieces shared by the kernels on Hopper's warpgroup MMA (conv_wgmma.cu, the Winograd GEMM in
// conv_winograd.cu): the sm_90a guard, the K-major 128-byte-swizzle shared-memory descriptor,
// the register fence around wgmma accumulators, and the host's "is this an sm_90 device" query.
#ifndef JAXDNN_CUDA_WGMMA_UTIL_CUH_
#define JAXDNN_CUDA_WGMMA_UTIL_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "wgmma_ops.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define JAXDNN_HAS_WGMMA 1
#endif

namespace jaxdnn::cuda {

// Shared-memory matrix descriptor: K-major, 128-byte swizzle (16-byte chunk c of row r at chunk
// c ^ (r % 8); rows of 128 bytes, 1024-byte aligned 8-row groups), 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// Keeps the compiler from moving accumulator accesses across wgmma fences and waits.
template <int N>
__device__ __forceinline__ void fence_acc(float (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(a[i])::"memory");
}

// mbarriers in shared memory (the warp-specialized kernels' stage handshakes). wait() spins until
// the phase of the given parity has completed (acquire); arrive() releases this thread's prior
// writes to the threads that wait on the phase it completes.
__device__ __forceinline__ uint32_t mbar_addr(const void* bar) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(bar));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mbar_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(mbar_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nMBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra MBAR_WAIT;\n}\n" ::"r"(mbar_addr(bar)),
      "r"(parity)
      : "memory");
}

// Is the current device an sm_90 (Hopper) part, and does this build carry sm_90a code for it?
// The build defines JAXDNN_SM90A when its architectures include 90a (CMakeLists.txt, the
// checkers' nvcc lines): built for plain sm_90, the wgmma kernels compile empty and must never
// run. Cached per device ordinal.
inline bool device_is_sm90() {
#ifndef JAXDNN_SM90A
  return false;
#endif
  static std::atomic<unsigned long long> known{0}, yes{0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const unsigned long long bit = 1ULL << (dev & 63);
  if (known.load(std::memory_order_acquire) & bit) return yes.load(std::memory_order_acquire) & bit;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  if (major == 9 && minor == 0) yes.fetch_or(bit, std::memory_order_acq_rel);
  known.fetch_or(bit, std::memory_order_acq_rel);
  return major == 9 && minor == 0;
}

}  // namespace jaxdnn::cuda

#endif  // JAXDNN_CUDA_WGMMA_UTIL_CUH_
