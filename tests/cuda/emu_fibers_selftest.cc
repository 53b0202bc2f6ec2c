// Self-test of the emulated runtimes' fiber core (emu_fibers.h, through the Winograd runtime),
// built and run by tests/test_cuda_emulator_fibers.py under AddressSanitizer and UBSan:
//   selftest barrier   a block exchanges values through shared memory across __syncthreads and
//                      __syncwarp; prints "ok" when every value is right
//   selftest deadlock  a __syncthreads that one thread skips: must abort with the deadlock message
//   selftest overflow  a kernel reads one element past an allocation: ASan must report it
#include "cuda_runtime.h"

#include <cstdio>
#include <cstring>

__global__ void exchange_kernel(const float* a, float* out, int n, int oob) {
  static float sm[64];
  sm[threadIdx.x] = a[blockIdx.x * 64 + threadIdx.x];
  __syncthreads();
  __syncwarp();
  out[blockIdx.x * 64 + threadIdx.x] = sm[63 - threadIdx.x] + (oob ? a[n] : 0.f);
}

__global__ void divergent_kernel(int* out) {
  if (threadIdx.x != 3) __syncthreads();
  out[threadIdx.x] = 1;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "barrier";
  if (!std::strcmp(mode, "deadlock")) {
    int* out = static_cast<int*>(std::malloc(64 * sizeof(int)));
    emu::launch("divergent_kernel", divergent_kernel, 1, 64, 0, nullptr, out);
    std::free(out);
    return 0;
  }
  const int n = 4096;
  float* a = static_cast<float*>(std::malloc(n * sizeof(float)));
  float* out = static_cast<float*>(std::malloc(n * sizeof(float)));
  for (int i = 0; i < n; ++i) a[i] = static_cast<float>(i);
  emu::launch("exchange_kernel", exchange_kernel, n / 64, 64, 0, nullptr, static_cast<const float*>(a), out, n,
              std::strcmp(mode, "overflow") == 0 ? 1 : 0);
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += out[i] != static_cast<float>((i / 64) * 64 + 63 - i % 64);
  std::printf(bad ? "FAIL %d wrong\n" : "ok\n", bad);
  std::free(a);
  std::free(out);
  return bad ? 1 : 0;
}
