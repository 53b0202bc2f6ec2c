// Cooperative threads for the emulated CUDA runtimes (tests/cuda/emu/cuda_runtime.h: the GEMM
// family and bias/activation backward; tests/cuda/winograd/emu/cuda_runtime.h): a launch runs
// each CUDA thread of a block as a fiber on the calling OS thread,
// and a barrier arrival switches back to a round-robin scheduler until every thread of the
// barrier has arrived. One OS thread per CUDA thread, meeting at std::barrier, paid a futex wait
// and wake per thread and barrier. On a 2-core host (pytest, checker runs): the Winograd quick
// set 228 -> 99 s, its tensor-core case (a barrier per emulated mma) 135 -> 74 s, the
// bias/activation backward smoke set 92 -> 30 s with ucontext fibers.
// The switch: on x86-64 a few instructions that save the callee-saved registers, MXCSR and the
// x87 control word on the old stack and load them from the new one (switch_stack). libc's
// swapcontext also saves and restores the signal mask, a system call per switch: 60 % of an
// emulated mma-heavy run. Elsewhere, swapcontext.
// Under AddressSanitizer each switch is announced (__sanitizer_start_switch_fiber /
// __sanitizer_finish_switch_fiber); libc's swapcontext is called past the sanitizer's
// interceptor, which would clear the shadow of the whole target stack at every switch (40 % of
// the suite's time). Every fiber returns from its body, so the sanitizer unpoisons its frames and
// its stack goes back clean for the next launch. A barrier that not every thread reaches aborts
// with a message instead of hanging.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace emu::fibers {

struct Barrier {
  int n = 0, arrived = 0;
  unsigned long gen = 0;
};

constexpr size_t kStackBytes = size_t{1} << 18;  // per fiber (mmap'd; pages touched on use)

#if defined(__x86_64__)
// A fiber's or the scheduler's saved stack pointer; the registers live on that stack.
struct Context {
  void* sp = nullptr;
};
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// its pointer in *save_sp, switches to load_sp and restores the same from there (System V ABI:
// everything else is caller-saved, so a call to this is a complete switch).
[[gnu::naked, gnu::noinline]] inline void switch_stack(void** /*save_sp: rdi*/, void* /*load_sp: rsi*/) {
  asm volatile(
      "pushq %rbp\n pushq %rbx\n pushq %r12\n pushq %r13\n pushq %r14\n pushq %r15\n"
      "subq $8, %rsp\n stmxcsr (%rsp)\n fnstcw 4(%rsp)\n"
      "movq %rsp, (%rdi)\n movq %rsi, %rsp\n"
      "ldmxcsr (%rsp)\n fldcw 4(%rsp)\n addq $8, %rsp\n"
      "popq %r15\n popq %r14\n popq %r13\n popq %r12\n popq %rbx\n popq %rbp\n"
      "ret\n");
}
inline void switch_context(Context* from, Context* to) { switch_stack(&from->sp, to->sp); }
#else
struct Context {
  ucontext_t uc;
};
inline void switch_context(Context* from, Context* to) {
#if defined(__SANITIZE_ADDRESS__)
  using Swap = int (*)(ucontext_t*, const ucontext_t*);
  static const Swap libc_swap = [] {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void* f = libc ? dlsym(libc, "swapcontext") : nullptr;
    return f ? reinterpret_cast<Swap>(f) : &swapcontext;
  }();
  libc_swap(&from->uc, &to->uc);
#else
  swapcontext(&from->uc, &to->uc);
#endif
}
#endif

struct Run {
  const std::function<void(int)>* body = nullptr;  // fiber t runs (*body)(t)
  std::vector<Context> ctx;
  std::vector<char> done;
  Context sched;
  int cur = -1;
  unsigned long events = 0;  // arrivals and finishes: progress, for the deadlock check
  const void* sched_bottom = nullptr;  // the scheduler's stack (the sanitizer's switches)
  size_t sched_size = 0;
};
inline Run* running = nullptr;
inline std::vector<void*> stacks;  // kept for later launches

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
}

#if defined(__x86_64__)
inline Context finished_fibers;  // where a finished fiber's last switch saves its (dead) stack
// A fiber's first frame: runs it, then back to the scheduler for good. Never returns, so it holds
// no locals (the sanitizer would leave their redzones poisoned on the reused stack).
[[noreturn]] inline void fiber_entry() {
  fiber_main();
  switch_context(&finished_fibers, &running->sched);
  __builtin_unreachable();
}
// The new fiber's stack as switch_stack leaves a suspended one: the control words, six registers
// and fiber_entry as the return address, with the stack 16-byte aligned at its entry as after a
// call (rsp % 16 == 8).
inline void make_context(Context& c, void* stack, size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(stack, bytes);  // whatever an earlier fiber left there
#endif
  auto* top = reinterpret_cast<unsigned long long*>(
      (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15});
  top[-1] = 0;  // fiber_entry's return address: it never returns
  top[-2] = reinterpret_cast<uintptr_t>(&fiber_entry);
  for (int i = 3; i <= 8; ++i) top[-i] = 0;  // rbp, rbx, r12-r15
  unsigned int mxcsr;
  unsigned short fpucw;
  asm volatile("stmxcsr %0\n fnstcw %1" : "=m"(mxcsr), "=m"(fpucw));
  top[-9] = mxcsr | static_cast<unsigned long long>(fpucw) << 32;
  c.sp = top - 9;
}
#else
inline void make_context(Context& c, void* stack, size_t bytes) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = &running->sched.uc;  // fiber_main returns to the scheduler
  makecontext(&c.uc, fiber_main, 0);
}
#endif

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
  Run* outer = running;
  running = &r;
  for (int t = 0; t < threads; ++t) make_context(r.ctx[t], stacks[t], kStackBytes);
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
