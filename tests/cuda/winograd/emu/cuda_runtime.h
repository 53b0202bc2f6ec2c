// Emulated CUDA runtime for running conv_winograd.cu's kernels on the host (../emulate.sh).
// A launch runs its blockDim threads as cooperative fibers (ucontext) on the calling OS thread:
// each fiber runs the blocks one after another, and a barrier (__syncthreads, the end of each
// block, and one per warp of 32 threads for __syncwarp, which the tensor-core emulation in
// conv_winograd.cu uses) switches back to a round-robin scheduler until every thread has arrived.
// (OS threads meeting at std::barrier cost a futex wait and wake per thread and barrier: with a
// barrier per emulated mma, the emulated suite took 400 s, much of it in the kernel.) Shared
// arrays are function-static (WINO_SMEM), so the threads of the running block share them.
// "Device" memory is malloc'd host memory, so AddressSanitizer checks every kernel access (told
// of each stack switch) and UBSan the vector alignments. A barrier that not every thread reaches
// aborts with a message instead of hanging.
// Not a CUDA: only what conv_winograd.cu and check.cu use.
#pragma once

#include "../../emu_host_api.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
#include <sanitizer/common_interface_defs.h>
#endif

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
inline dim3 thread_idx, block_idx;  // the running fiber's (set by the scheduler)

// Launches per kernel name (the checker prints them: tests assert which GEMM kernel ran).
inline std::map<std::string, long> launch_counts;

struct Barrier {
  int n = 0, arrived = 0;
  unsigned long gen = 0;
};

struct Fiber {
  ucontext_t ctx;
  bool done = false;
};

constexpr size_t kStackBytes = size_t{1} << 18;  // per fiber (mmap'd; pages touched on use)

// The fibers' stacks, kept for every later launch. Every fiber returns from fiber_main (to the
// scheduler through uc_link) instead of switching away for good, so that AddressSanitizer
// unpoisons each of its frames on the way out and a stack goes back clean.
inline std::vector<void*> fiber_stacks;

struct Launch {
  std::function<void()> body;  // one block of the kernel, for the running fiber
  unsigned long long grid = 0;
  std::vector<Fiber> fibers;
  ucontext_t sched;
  int cur = -1;
  unsigned long events = 0;  // arrivals and finishes: progress, for the deadlock check
  Barrier block_bar;
  std::vector<Barrier> warp_bars;
  const void* sched_bottom = nullptr;  // the scheduler's stack (AddressSanitizer's fiber switches)
  size_t sched_size = 0;
};
inline Launch* running = nullptr;

// swapcontext. Under AddressSanitizer libc's own, past the sanitizer's interceptor, which clears
// the shadow of the whole target stack at every switch (a 32 KB memset per switch, 40 % of the
// emulated suite's time); the switches are announced to the sanitizer instead
// (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber).
inline int switch_context(ucontext_t* from, ucontext_t* to) {
#if defined(__SANITIZE_ADDRESS__)
  using Swap = int (*)(ucontext_t*, const ucontext_t*);
  static const Swap libc_swap = [] {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void* f = libc ? dlsym(libc, "swapcontext") : nullptr;
    return f ? reinterpret_cast<Swap>(f) : &swapcontext;
  }();
  return libc_swap(from, to);
#else
  return swapcontext(from, to);
#endif
}

// Switches from the running fiber to the scheduler, to be resumed later.
inline void to_scheduler() {
  Launch& L = *running;
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, L.sched_bottom, L.sched_size);
  switch_context(&L.fibers[L.cur].ctx, &L.sched);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  switch_context(&L.fibers[L.cur].ctx, &L.sched);
#endif
}

inline void arrive_and_wait(Barrier& b) {
  ++running->events;
  const unsigned long gen = b.gen;
  if (++b.arrived == b.n) {  // the last arrival releases the others and runs on
    b.arrived = 0;
    ++b.gen;
    return;
  }
  while (b.gen == gen) to_scheduler();
}

inline void fiber_main() {
  Launch& L = *running;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, &L.sched_bottom, &L.sched_size);
#endif
  for (unsigned long long b = 0; b < L.grid; ++b) {
    block_idx = dim3(b);
    L.body();
    arrive_and_wait(L.block_bar);  // the block is done before the next one starts
  }
  L.fibers[L.cur].done = true;
  ++L.events;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(nullptr, L.sched_bottom, L.sched_size);  // this fiber ends
#endif
}  // returns to the scheduler (uc_link)

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
  Launch L;
  L.body = [&] { kernel(args...); };
  L.grid = grid;
  L.block_bar.n = block;
  for (int w = 0; w < (block + 31) / 32; ++w) L.warp_bars.push_back(Barrier{std::min(32, block - 32 * w)});
  L.fibers.resize(block);
  std::vector<void*>& stacks = fiber_stacks;
  while (stacks.size() < static_cast<size_t>(block)) {
    void* st = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (st == MAP_FAILED) {
      std::fprintf(stderr, "emu: no memory for %d fiber stacks\n", block);
      std::abort();
    }
    stacks.push_back(st);
  }
  for (int t = 0; t < block; ++t) {
    getcontext(&L.fibers[t].ctx);
    L.fibers[t].ctx.uc_stack.ss_sp = stacks[t];
    L.fibers[t].ctx.uc_stack.ss_size = kStackBytes;
    L.fibers[t].ctx.uc_link = &L.sched;
    makecontext(&L.fibers[t].ctx, fiber_main, 0);
  }
  running = &L;
  for (int live = block; live > 0;) {
    const unsigned long before = L.events;
    for (int t = 0; t < block; ++t) {
      if (L.fibers[t].done) continue;
      L.cur = t;
      thread_idx = dim3(t);
#if defined(__SANITIZE_ADDRESS__)
      void* fake = nullptr;
      __sanitizer_start_switch_fiber(&fake, stacks[t], kStackBytes);
      switch_context(&L.sched, &L.fibers[t].ctx);
      __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
      switch_context(&L.sched, &L.fibers[t].ctx);
#endif
      if (L.fibers[t].done) --live;
    }
    if (live > 0 && L.events == before) {
      std::fprintf(stderr, "emu: %s: a barrier that not every thread reaches (deadlock)\n", name);
      std::abort();
    }
  }
  running = nullptr;
}
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)

inline void __syncthreads() { emu::arrive_and_wait(emu::running->block_bar); }
inline void __syncwarp() { emu::arrive_and_wait(emu::running->warp_bars[emu::thread_idx.x / 32]); }

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize,
  cudaFuncAttributePreferredSharedMemoryCarveout
};
template <typename K>
cudaError_t cudaFuncSetAttribute(K*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
