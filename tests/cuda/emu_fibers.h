// Cooperative threads for the emulated CUDA runtimes (tests/cuda/{winograd,bab}/emu/
// cuda_runtime.h): a launch runs each CUDA thread of a block as a fiber (ucontext) on the calling
// OS thread, and a barrier arrival switches back to a round-robin scheduler until every thread
// of the barrier has arrived. One OS thread per CUDA thread, meeting at std::barrier, paid a
// futex wait and wake per thread and barrier. On a 2-core host (pytest, checker runs): the
// Winograd quick set 228 -> 99 s, its tensor-core case (a barrier per emulated mma) 135 -> 74 s,
// the bias/activation backward smoke set 92 -> 30 s with fibers.
// Under AddressSanitizer each switch is announced (__sanitizer_start_switch_fiber /
// __sanitizer_finish_switch_fiber), and libc's swapcontext is called past the sanitizer's
// interceptor, which would clear the shadow of the whole target stack at every switch (40 % of
// the suite's time). Every fiber returns from its body, so the sanitizer unpoisons its frames and
// its stack goes back clean for the next launch. A barrier that not every thread reaches aborts
// with a message instead of hanging.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace emu::fibers {

struct Barrier {
  int n = 0, arrived = 0;
  unsigned long gen = 0;
};

constexpr size_t kStackBytes = size_t{1} << 18;  // per fiber (mmap'd; pages touched on use)

struct Run {
  const std::function<void(int)>* body = nullptr;  // fiber t runs (*body)(t)
  std::vector<ucontext_t> ctx;
  std::vector<char> done;
  ucontext_t sched;
  int cur = -1;
  unsigned long events = 0;  // arrivals and finishes: progress, for the deadlock check
  const void* sched_bottom = nullptr;  // the scheduler's stack (the sanitizer's switches)
  size_t sched_size = 0;
};
inline Run* running = nullptr;
inline std::vector<void*> stacks;  // kept for later launches

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

// From the running fiber to the scheduler, to be resumed later.
inline void yield() {
  Run& r = *running;
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, r.sched_bottom, r.sched_size);
  switch_context(&r.ctx[r.cur], &r.sched);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  switch_context(&r.ctx[r.cur], &r.sched);
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
  while (b.gen == gen) yield();
}

inline void fiber_main() {
  Run& r = *running;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, &r.sched_bottom, &r.sched_size);
#endif
  (*r.body)(r.cur);
  r.done[r.cur] = 1;
  ++r.events;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(nullptr, r.sched_bottom, r.sched_size);  // this fiber ends
#endif
}  // returns to the scheduler (uc_link)

// Runs body(0) .. body(threads - 1) as fibers to the end; resume(t) runs in the scheduler before
// each switch into fiber t (it sets that thread's thread-local view: threadIdx and the like).
// name: for the deadlock message.
inline void run(int threads, const std::function<void(int)>& body, const std::function<void(int)>& resume,
                const char* name) {
  Run r;
  r.body = &body;
  r.ctx.resize(threads);
  r.done.assign(threads, 0);
  while (stacks.size() < static_cast<size_t>(threads)) {
    void* st = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (st == MAP_FAILED) {
      std::fprintf(stderr, "emu: no memory for %d fiber stacks\n", threads);
      std::abort();
    }
    stacks.push_back(st);
  }
  for (int t = 0; t < threads; ++t) {
    getcontext(&r.ctx[t]);
    r.ctx[t].uc_stack.ss_sp = stacks[t];
    r.ctx[t].uc_stack.ss_size = kStackBytes;
    r.ctx[t].uc_link = &r.sched;
    makecontext(&r.ctx[t], fiber_main, 0);
  }
  Run* outer = running;
  running = &r;
  for (int live = threads; live > 0;) {
    const unsigned long before = r.events;
    for (int t = 0; t < threads; ++t) {
      if (r.done[t]) continue;
      r.cur = t;
      resume(t);
#if defined(__SANITIZE_ADDRESS__)
      void* fake = nullptr;
      __sanitizer_start_switch_fiber(&fake, stacks[t], kStackBytes);
      switch_context(&r.sched, &r.ctx[t]);
      __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
      switch_context(&r.sched, &r.ctx[t]);
#endif
      if (r.done[t]) --live;
    }
    if (live > 0 && r.events == before) {
      std::fprintf(stderr, "emu: %s: a barrier that not every thread reaches (deadlock)\n", name);
      std::abort();
    }
  }
  running = outer;
}

}  // namespace emu::fibers
