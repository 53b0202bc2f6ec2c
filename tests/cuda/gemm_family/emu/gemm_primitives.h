// Host emulation of ffi/cuda/gemm_primitives.cuh (../emulate.sh puts it in place of that header):
// the same functions, computed by the lanes of the emulated warp (cuda_runtime.h).
// - cp.async: an immediate 16-byte copy, or 16 zero bytes when not valid (commit / wait have
//   nothing left to do). The copy happens earlier than on the device, never later, so a kernel
//   that reads a stage before its wait still sees the wrong data only if it overwrote it.
// - ldmatrix (.x4, .trans): each lane publishes its row address; lane L = 4 g + t then reads, of
//   matrix i (rows from lanes 8 i .. 8 i + 7), row g's 32-bit word t, or transposed the 16-bit
//   elements (2 t, g) and (2 t + 1, g).
// - mma.sync m16n8k16 (bf16/f16) and m16n8k8 (tf32): each lane publishes its A and B fragments;
//   lane 4 g + t then computes D (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) with fp32 sums
//   in k order (exact 16-bit products; tf32 operands with their low 13 bits ignored, as the
//   tensor cores read them). This checks fragment layouts and index math, not the hardware's
//   rounding of the sums.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "../../pool/host_fp.h"  // tests/cuda/pool

namespace jaxdnn::cuda::gemm {

inline uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p));
}

inline void cp_async16(void* smem, const void* gmem, bool valid) {
  if (valid)
    std::memcpy(smem, gmem, 16);
  else
    std::memset(smem, 0, 16);
}
inline void cp_async16_ign(void* smem, const void* gmem, unsigned valid) {
  cp_async16(smem, gmem, valid != 0);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

namespace emu_detail {
// Publishes `bytes` of this lane's data, waits for the warp; read() sees every lane's; done()
// waits again so that no lane overwrites its slot before all have read.
inline emu::Warp& publish(const void* data, size_t bytes) {
  emu::Warp& w = emu::my_warp();
  std::memcpy(w.slot[emu::lane_id], data, bytes);
  emu::fibers::arrive_and_wait(w.bar);
  return w;
}
inline void done(emu::Warp& w) { emu::fibers::arrive_and_wait(w.bar); }
inline const unsigned char* row_address(const emu::Warp& w, int lane) {
  const unsigned char* p;
  std::memcpy(&p, w.slot[lane], sizeof(p));
  return p;
}
inline uint16_t half_at(const unsigned char* row, int element) {
  uint16_t v;
  std::memcpy(&v, row + 2 * element, 2);
  return v;
}
inline uint32_t word(const emu::Warp& w, int lane, int index) {
  uint32_t v;
  std::memcpy(&v, reinterpret_cast<const unsigned char*>(w.slot[lane]) + 4 * index, 4);
  return v;
}
inline float f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <bool F16>
inline float half16(uint32_t packed, int which) {
  const uint16_t h = static_cast<uint16_t>(which ? packed >> 16 : packed & 0xffffu);
  return F16 ? hostfp::f16_to_float(h) : hostfp::bf16_to_float(h);
}
}  // namespace emu_detail

template <bool TRANS>
inline void ldsm_x4_any(uint32_t (&r)[4], const void* p) {
  using namespace emu_detail;
  emu::Warp& w = publish(&p, sizeof(p));
  const int g = emu::lane_id / 4, t = emu::lane_id % 4;
  uint32_t out[4];
  for (int i = 0; i < 4; ++i) {
    if (TRANS) {
      const uint16_t lo = half_at(row_address(w, 8 * i + 2 * t), g);
      const uint16_t hi = half_at(row_address(w, 8 * i + 2 * t + 1), g);
      out[i] = lo | static_cast<uint32_t>(hi) << 16;
    } else {
      std::memcpy(&out[i], row_address(w, 8 * i + g) + 4 * t, 4);
    }
  }
  done(w);
  for (int i = 0; i < 4; ++i) r[i] = out[i];
}
inline void ldsm_x4(uint32_t (&r)[4], const void* p) { ldsm_x4_any<false>(r, p); }
inline void ldsm_x4_t(uint32_t (&r)[4], const void* p) { ldsm_x4_any<true>(r, p); }

// D = A*B + D for one m16n8kK tile: every lane publishes its four A and two B registers, then
// lane 4 g + t sums D (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) over k in order.
// a_at(w, row, k) and b_at(w, k, col) read an operand element from the published registers.
template <int K, typename AAt, typename BAt>
inline void mma_emulated(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                         AAt a_at, BAt b_at) {
  using namespace emu_detail;
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  emu::Warp& w = publish(mine, sizeof(mine));
  const int g = emu::lane_id / 4, t = emu::lane_id % 4;
  float out[4];
  for (int r = 0; r < 4; ++r) {
    const int row = g + (r / 2) * 8, col = 2 * t + r % 2;
    float sum = d[r];
    for (int k = 0; k < K; ++k) sum += a_at(w, row, k) * b_at(w, k, col);
    out[r] = sum;
  }
  done(w);
  for (int r = 0; r < 4; ++r) d[r] = out[r];
}

// m16n8k16, bf16 / f16 pairs (low half: the lower k): lane 4 g + t holds A (g, 2t..2t+1),
// (g + 8, ..), (g, 2t + 8..), (g + 8, 2t + 8..) and B (k = 2t..2t+1, n = g), (2t + 8.., g).
template <bool F16>
inline void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  using namespace emu_detail;
  mma_emulated<16>(
      d, a, b0, b1,
      [](const emu::Warp& w, int row, int k) {
        return half16<F16>(word(w, row % 8 * 4 + k % 8 / 2, row / 8 + 2 * (k / 8)), k % 2);
      },
      [](const emu::Warp& w, int k, int col) {
        return half16<F16>(word(w, col * 4 + k % 8 / 2, 4 + k / 8), k % 2);
      });
}

// cvt.rna.tf32.f32: to nearest, ties away from zero, in the top 19 bits.
inline uint32_t to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;  // inf, NaN
  return (u + 0x1000u) & 0xffffe000u;
}

// m16n8k8 tf32 (each operand's low 13 bits ignored): lane 4 g + t holds A (g, t), (g + 8, t),
// (g, t + 4), (g + 8, t + 4) and B (k = t, n = g), (t + 4, g).
inline void mma1688_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  using namespace emu_detail;
  mma_emulated<8>(
      d, a, b0, b1,
      [](const emu::Warp& w, int row, int k) {
        return f32(word(w, row % 8 * 4 + k % 4, row / 8 + 2 * (k / 4)) & 0xffffe000u);
      },
      [](const emu::Warp& w, int k, int col) {
        return f32(word(w, col * 4 + k % 4, 4 + k / 4) & 0xffffe000u);
      });
}

}  // namespace jaxdnn::cuda::gemm
