// Emulated CUDA runtime for running bias_act.cu's kernels (and check.cu's copy of the older ones)
// on the host (../emulate.sh). A launch runs the threads of a block as cooperative fibers
// (../../emu_fibers.h) on the calling OS thread; they run the grid's blocks one after another, in
// the order emu::block_order picks (forward, reverse or shuffled: a kernel must not depend on
// which block finishes last), meeting at a barrier for __syncthreads and at the end of each
// block. A warp shuffle exchanges values through the warp's slots between two barriers of its 32
// threads. __shared__ arrays are function statics,
// shared by the threads of the running block. "Device" memory is host memory of the exact size
// asked for, so AddressSanitizer checks every kernel access and UBSan the vector alignments.
// Not a CUDA: only what bias_act.cu and check.cu use.
#pragma once

#include "../../emu_fibers.h"
#include "../../emu_host_api.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static

struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};


namespace emu {
enum class Order { kForward, kReverse, kShuffled };
inline Order block_order = Order::kForward;

struct Warp {
  fibers::Barrier bar;
  uint64_t slot[32];
  explicit Warp(int threads) : bar{threads} {}
};

// The running fiber's view (thread_idx, warp_id and lane_id set at each switch).
inline dim3 thread_idx, block_idx, block_dim, grid_dim;
inline int warp_id = 0, lane_id = 0;
inline fibers::Barrier* block_barrier = nullptr;
inline std::vector<std::unique_ptr<Warp>>* warps = nullptr;
inline unsigned long launches = 0;

template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
            A... args) {
  const unsigned long threads = static_cast<unsigned long>(block.x) * block.y * block.z;
  // Static shared memory only (function statics), at most CUDA's 48 KB.
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535 || threads == 0 || threads > 1024 || block.z > 64 || smem != 0) {
    std::fprintf(stderr, "emu: invalid launch grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", grid.x,
                 grid.y, grid.z, block.x, block.y, block.z, smem);
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  ++launches;
  std::vector<dim3> order;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) order.emplace_back(x, y, z);
  if (block_order == Order::kReverse) std::reverse(order.begin(), order.end());
  if (block_order == Order::kShuffled) std::shuffle(order.begin(), order.end(), std::mt19937(launches));
  fibers::Barrier bar{static_cast<int>(threads)};
  std::vector<std::unique_ptr<Warp>> warp_list;
  for (unsigned long w = 0; w < (threads + 31) / 32; ++w)
    warp_list.push_back(std::make_unique<Warp>(static_cast<int>(std::min(32UL, threads - 32 * w))));
  block_barrier = &bar;
  warps = &warp_list;
  block_dim = block;
  grid_dim = grid;
  fibers::run(
      static_cast<int>(threads),
      [&](int) {
        for (const dim3& b : order) {
          block_idx = b;
          kernel(args...);
          fibers::arrive_and_wait(bar);  // the block is done before the next one starts
        }
      },
      [&](int t) {
        thread_idx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
        warp_id = t / 32, lane_id = t % 32;
      },
      "launch");
  block_barrier = nullptr;
  warps = nullptr;
}
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::fibers::arrive_and_wait(*emu::block_barrier); }

// Every thread of the warp takes part (full warps only, as the kernels launch them).
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "one slot per lane");
  emu::Warp& w = *(*emu::warps)[emu::warp_id];
  const int src = emu::lane_id ^ lane_mask;
  if (src >= 32) std::abort();
  std::memcpy(&w.slot[emu::lane_id], &v, sizeof(T));
  emu::fibers::arrive_and_wait(w.bar);
  T r;
  std::memcpy(&r, &w.slot[src], sizeof(T));
  emu::fibers::arrive_and_wait(w.bar);  // nobody overwrites a slot before all have read
  return r;
}

inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
inline float __fdividef(float a, float b) { return a / b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }

