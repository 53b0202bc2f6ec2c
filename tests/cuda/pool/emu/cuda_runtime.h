// Emulated CUDA runtime for running the pooling kernels on the host (emulate.sh). A launch runs
// its blocks in turn and the threads of a block one after another, in decreasing thread index,
// with __syncthreads a no-op: exact for kernels whose threads, after a barrier, read only shared
// memory that threads of higher index (or they themselves) wrote before it, as split_fwd_kernel
// does; a slot not yet written holds 0x7f bytes (a huge float), so a wrong read shows.
// JAXDNN_EMU_THREADS=1 instead runs the blocks of launches with dynamic shared memory as
// concurrent std::threads meeting at a real barrier (slow). "Device" memory is host memory from
// malloc, so AddressSanitizer checks every kernel access and UBSan the alignment of the vector
// accesses.
// Not a CUDA: only what the pooling code uses.
#pragma once

#include "../../emu_host_api.h"

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__

struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};


namespace emu {
inline thread_local dim3 thread_idx, block_idx, block_dim, grid_dim;
inline thread_local std::barrier<>* block_barrier = nullptr;
inline std::vector<unsigned char> shared_buffer;
inline long launches = 0;

inline unsigned char* shared_mem() { return shared_buffer.data(); }

template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t, A... args) {
  ++launches;
  const unsigned long threads = static_cast<unsigned long>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535 || threads == 0 || threads > 1024 || block.z > 64 || smem > 48 * 1024) {
    std::fprintf(stderr, "emu: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u) "
                 "smem %zu\n", grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        const dim3 b(bx, by, bz);
        auto run_thread = [&](unsigned tx, unsigned ty, unsigned tz, std::barrier<>* bar) {
          thread_idx = dim3(tx, ty, tz);
          block_idx = b;
          block_dim = block;
          grid_dim = grid;
          block_barrier = bar;
          kernel(args...);
        };
        static const bool threaded = [] {
          const char* v = std::getenv("JAXDNN_EMU_THREADS");
          return v != nullptr && *v == '1';
        }();
        if (smem == 0 || !threaded) {
          shared_buffer.assign(smem, 0x7f);
          for (unsigned tz = block.z; tz-- > 0;)
            for (unsigned ty = block.y; ty-- > 0;)
              for (unsigned tx = block.x; tx-- > 0;) run_thread(tx, ty, tz, nullptr);
          continue;
        }
        shared_buffer.assign(smem, 0x7f);
        std::barrier<> bar(static_cast<std::ptrdiff_t>(threads));
        std::vector<std::thread> pool;
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx)
              pool.emplace_back(run_thread, tx, ty, tz, &bar);
        for (auto& t : pool) t.join();
      }
}
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() {
  if (emu::block_barrier != nullptr) emu::block_barrier->arrive_and_wait();
}

// A thread that returned early never reaches the barrier; CUDA allows that only when no
// remaining thread waits, which the pooling kernels respect (they return after their barrier).

template <typename T> inline T __ldg(const T* p) { return *p; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

