// A small persistent thread pool for the CPU kernels: parallel_for(n, fn) runs fn(begin, end) over
// disjoint chunks of [0, n) on all workers plus the calling thread, and returns when all are done.
// The pool size is the machine's hardware concurrency, or JAXDNN_NUM_THREADS when set.
#ifndef JAXDNN_CPU_PARALLEL_H_
#define JAXDNN_CPU_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace jaxdnn::cpu {

int num_threads();

// Splits [0, n) into about num_threads() * chunks_per_thread contiguous chunks (each at least
// min_chunk long) and runs fn(begin, end) on each. Nested calls from inside fn run serially.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                  int64_t min_chunk = 1, int chunks_per_thread = 4);

}  // namespace jaxdnn::cpu

#endif  // JAXDNN_CPU_PARALLEL_H_
