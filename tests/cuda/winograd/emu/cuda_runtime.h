// Emulated CUDA runtime for running conv_winograd.cu's kernels on the host (../emulate.sh).
// A launch runs its blockDim threads as cooperative fibers (../../emu_fibers.h) on the calling
// OS thread; each runs the blocks one after another, meeting the others at barriers:
// __syncthreads, the end of each block, and one per warp of 32 threads for __syncwarp, which the
// tensor-core emulation in conv_winograd.cu uses. Shared arrays are function-static (WINO_SMEM),
// so the threads of the running block share them. "Device" memory is malloc'd host memory, so
// AddressSanitizer checks every kernel access and UBSan the vector alignments.
// Not a CUDA: only what conv_winograd.cu and check.cu use.
#pragma once

#include "../../emu_fibers.h"
#include "../../emu_host_api.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned long long x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
      : x(static_cast<unsigned int>(x_)), y(y_), z(z_) {}
};


namespace emu {
inline dim3 thread_idx, block_idx;  // the running fiber's (thread_idx set at each switch)
inline fibers::Barrier* block_barrier = nullptr;
inline std::vector<fibers::Barrier>* warp_barriers = nullptr;

// Launches per kernel name (the checker prints them: tests assert which GEMM kernel ran).
inline std::map<std::string, long> launch_counts;

template <typename... P, typename... A>
void launch(const char* name, void (*kernel)(P...), unsigned long long grid, int block, size_t smem,
            cudaStream_t, A... args) {
  ++launch_counts[name];
  // Dynamic shared memory: the kernels declare it as a static array under emulation.
  if (grid == 0 || grid > 0x7fffffffull || block <= 0 || block > 1024 || smem > 227 * 1024) {
    std::fprintf(stderr, "emu: invalid launch grid %llu block %d smem %zu\n", grid, block, smem);
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  fibers::Barrier bar{block};
  std::vector<fibers::Barrier> warps;
  for (int w = 0; w < (block + 31) / 32; ++w) warps.push_back(fibers::Barrier{std::min(32, block - 32 * w)});
  block_barrier = &bar;
  warp_barriers = &warps;
  fibers::run(
      block,
      [&](int) {
        for (unsigned long long b = 0; b < grid; ++b) {
          block_idx = dim3(b);
          kernel(args...);
          fibers::arrive_and_wait(bar);  // the block is done before the next one starts
        }
      },
      [](int t) { thread_idx = dim3(t); }, name);
  block_barrier = nullptr;
  warp_barriers = nullptr;
}
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)

inline void __syncthreads() { emu::fibers::arrive_and_wait(*emu::block_barrier); }
inline void __syncwarp() { emu::fibers::arrive_and_wait((*emu::warp_barriers)[threadIdx.x / 32]); }

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize,
  cudaFuncAttributePreferredSharedMemoryCarveout
};
template <typename K>
cudaError_t cudaFuncSetAttribute(K*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
