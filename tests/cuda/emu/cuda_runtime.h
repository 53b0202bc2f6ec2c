// Emulated CUDA runtime for running kernels and their checkers on the host: the GEMM family
// (tests/cuda/gemm_family/emulate.sh) and the bias/activation backward (tests/cuda/bab/emulate.sh).
// The scripts rewrite each `kernel<<<grid, block, smem, stream>>>(args)` into
// emu::launch("name", kernel, grid, block, smem, stream, args). A launch runs the threads of a
// block as cooperative fibers (../emu_fibers.h) on the calling OS thread; they run the grid's
// blocks one after another, in the order emu::block_order picks (forward, reverse or shuffled; the
// environment's EMU_BLOCK_ORDER sets the default: a kernel must not depend on which block
// finishes last), meeting at a barrier for __syncthreads and at the end of each block.
// Warp-collective operations (a shuffle; ldmatrix and mma.sync: gemm_family/emu/
// gemm_primitives.h) exchange values through the warp's slots between two barriers of its 32
// threads. __shared__ arrays are function statics, shared by the threads of the running block;
// dynamic shared memory (the scripts turn `extern __shared__ T name[]` into a pointer to
// emu::dynamic_smem) is a heap buffer of exactly the launch's size, filled with 0xFF (NaN in every
// float format) at each launch, so AddressSanitizer sees any access past it and a read before a
// write shows up as NaN. "Device" memory is host memory of the exact size asked for
// (../emu_host_api.h).
// Not a CUDA: only what those sources and checkers use.
#pragma once

#include "../emu_fibers.h"
#include "../emu_host_api.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __shared__ static

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {
enum class Order { kForward, kReverse, kShuffled };

// Warp-collective exchange: each lane publishes up to 32 bytes between two warp barriers.
struct Warp {
  fibers::Barrier bar;
  uint64_t slot[32][4];
  explicit Warp(int threads) : bar{threads} {}
};

// The running fiber's view (thread_idx, warp_id and lane_id set at each switch).
inline dim3 thread_idx, block_idx, block_dim, grid_dim;
inline int warp_id = 0, lane_id = 0;
inline fibers::Barrier* block_barrier = nullptr;
inline std::vector<std::unique_ptr<Warp>>* warps = nullptr;
inline unsigned char* dynamic_smem = nullptr;  // this launch's dynamic shared memory
inline unsigned long launches = 0;
inline std::map<std::string, long> launch_counts;  // per kernel (the checker prints them)

inline Order order_from_environment() {
  const char* o = std::getenv("EMU_BLOCK_ORDER");
  if (o && o[0] == 'r') return Order::kReverse;
  if (o && o[0] == 's') return Order::kShuffled;
  return Order::kForward;
}
inline Order block_order = order_from_environment();

template <typename... P, typename... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
            cudaStream_t, A... args) {
  const unsigned long threads = static_cast<unsigned long>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535 || threads == 0 || threads > 1024 || block.z > 64 || smem > 227 * 1024) {
    std::fprintf(stderr, "emu: invalid launch of %s: grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n",
                 name, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  ++launches;
  ++launch_counts[name];
  std::vector<dim3> order;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) order.emplace_back(x, y, z);
  const Order how = block_order;
  if (how == Order::kReverse) std::reverse(order.begin(), order.end());
  if (how == Order::kShuffled) std::shuffle(order.begin(), order.end(), std::mt19937(launches));
  // exactly `smem` bytes (AddressSanitizer bounds), 128-byte aligned as the device's
  void* buf = nullptr;
  if (smem > 0) {
    if (posix_memalign(&buf, 128, smem) != 0) std::abort();
    std::memset(buf, 0xFF, smem);
  }
  dynamic_smem = static_cast<unsigned char*>(buf);
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
      name);
  block_barrier = nullptr;
  warps = nullptr;
  dynamic_smem = nullptr;
  std::free(buf);
}

inline Warp& my_warp() { return *(*warps)[warp_id]; }
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::fibers::arrive_and_wait(*emu::block_barrier); }

// Every thread of the warp takes part (full warps only, as the kernels launch them).
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(emu::Warp::slot[0]), "one slot per lane");
  emu::Warp& w = emu::my_warp();
  const int src = emu::lane_id ^ lane_mask;
  if (src >= 32) std::abort();
  std::memcpy(w.slot[emu::lane_id], &v, sizeof(T));
  emu::fibers::arrive_and_wait(w.bar);
  T r;
  std::memcpy(&r, w.slot[src], sizeof(T));
  emu::fibers::arrive_and_wait(w.bar);  // nobody overwrites a slot before all have read
  return r;
}

inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T>
inline T __ldg(const T* p) { return *p; }
template <typename T>
inline T __ldcs(const T* p) { return *p; }
template <typename T>
inline T __ldcg(const T* p) { return *p; }
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __fdividef(float a, float b) { return a / b; }
// CUDA's min/max overloads for the integer and float mixes the kernels use.
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
  return a < b ? a : b;
}
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
template <typename K>
cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int bytes) {
  return bytes >= 0 && bytes <= 227 * 1024 ? cudaSuccess : cudaErrorInvalidConfiguration;
}
inline cudaError_t cudaGetDevice(int* dev) {
  *dev = 0;
  return cudaSuccess;
}
// Events: the checker's timing code compiles; emulated runs never time (--no-time).
using cudaEvent_t = int*;
inline cudaError_t cudaEventCreate(cudaEvent_t*) { return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 1.f;
  return cudaSuccess;
}
template <typename T>
inline cudaError_t cudaMalloc(T** p, size_t n) {
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}
// Streams and graphs: one emulated stream (launches run when issued); capture is not emulated
// (the checkers skip their graph checks under emulation).
using cudaGraph_t = int*;
using cudaGraphExec_t = int*;
enum cudaStreamCaptureMode { cudaStreamCaptureModeThreadLocal };
constexpr unsigned cudaStreamNonBlocking = 1;
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  return cudaErrorInvalidConfiguration;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t*) { return cudaErrorInvalidConfiguration; }
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t*, cudaGraph_t, int) {
  return cudaErrorInvalidConfiguration;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaErrorInvalidConfiguration; }
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
inline cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
