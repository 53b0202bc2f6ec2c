// IMPLICIT_PRECOMP_GEMM forward on Hopper's warpgroup MMA (wgmma, sm_90a), NHWC, 16-bit or
// float32 with TF32 math (precision DEFAULT/HIGH; HIGHEST never comes here).
//
// GEMM view: M = N*Z*P*Q output pixels, N = Kg output channels of a group, K = taps*Cg with
// k = tap*Cg + c. A (activations) is gathered from x through per-tap offsets precomputed once per
// CTA into shared memory; B is the filter. In 16-bit B is read straight from the HWIO filter, a
// [taps*Cg][K] matrix whose output channels are contiguous, as an MN-major operand (wgmma's
// transpose-B form); tf32 wgmma takes K-major operands only, so there the filter is transposed
// once per call into the workspace as [G*Kg][taps*Cg]. A pipeline stage holds A [BM][BK], one
// 128-byte row per tile row (BK = 64 16-bit or 32 fp32 values), and B: [BN][BK] likewise
// (K-major), or BN / 64 panels of BK K rows x 64 channels (MN-major, as backward-filter's
// operands), all in the 128-byte-swizzled layout that wgmma's shared-memory descriptors read
// (16-byte chunk c of row r sits at chunk c ^ (r % 8)); cp.async fills them (zeros outside the image) while
// one warpgroup (128 threads) runs four wgmmas per stage (m64nBNk16, or m64nBNk8 for tf32: 32
// bytes of K each) on the previous stage, accumulating in fp32 registers. The epilogue stages the
// fp32 tile through shared memory for 16-byte stores.
//
// TF32 rounding: the filter is rounded to TF32 (cvt.rna, as the mma.sync path) in the transpose;
// activations go global -> shared by cp.async untouched, and the tensor core truncates them (it
// ignores the low 13 mantissa bits), as cuBLAS/XLA do with raw fp32 operands.
//
// Persistent mode (short reductions, e.g. a 1x1 layer with 64 input channels: one K step per
// tile, so a CTA would load, multiply and store with nothing overlapping): a grid of at most the
// resident CTAs walks the tiles (tile = blockIdx.x, += gridDim.x) and the cp.async loader runs
// ST - 1 K steps ahead across tile boundaries, so the next tile's operands are in flight while this
// tile's values go out straight from the accumulator registers (the pipeline buffers are busy);
// only a CTA's last tile, with the pipeline drained, is staged. A fused epilogue without a
// residual takes the walk too: bias and a 16-bit relu alone keep the register stores (below);
// anything else stages every tile through a C tile of its own past the stages
// (WgParams::c_smem). One tile per CTA with a 16-bit residual copies the tile's residuals into
// shared memory during its K loop (WgParams::epi_smem).
//
// Bias in the accumulators (WgParams::bias_acc): the K loop accumulates onto the tile's biases
// (acc starts at bias[col] instead of 0), so the epilogue has no bias to add, and a relu goes into
// the 16-bit conversion of the stores (pack2_16): bias + relu then costs the epilogue nothing.
// The sum is bias + sum(products) instead of sum(products) + bias: the same fp32 arithmetic in
// another order. Not under split-K, whose partials must not each carry the bias, nor with a
// residual (slower there: see wgmma_try).
//
// Backward-data at stride 1 is this forward kernel on dy (dgrad_as_forward): dx = conv(dy, w')
// with w'[tap][k][c] = w[taps - 1 - tap][c][k] per group (flipped taps, input and output
// channels swapped; flip_swap_filter_kernel writes it into the workspace in the layout B is read
// in: HWIO in 16-bit, K-major in tf32) and low
// padding dil*(F-1) - pad_lo (negative where pad_lo exceeds the dilated filter extent: the
// loader's bounds tests see those rows as outside the image).
//
// Taken when (wgmma_reason() == ""): forward, or backward-data at stride 1, of
// IMPLICIT_PRECOMP_GEMM; bf16/f16 in with out = in or f32, or f32 in and out at precision !=
// HIGHEST; NHWC, unit lhs dilation, and in the forward view Cg % BK == 0 (a K step never straddles
// two taps: 64 channels in 16-bit, 32 in fp32), Kg % 8 == 0, at most 256 taps; or backward-filter
// in 16-bit, NHWC, Cg % 64 == 0, Kg % 8 == 0 (wgrad_reason; its own kernel, below); and the device
// is sm_90 with sm_90a code built (device_is_sm90). Otherwise conv_gemm_family.cu's mma.sync kernel runs the same algorithm (same family,
// same tap tables).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "conv_cuda.h"
#include "epilogue.cuh"
#include "gemm_primitives.cuh"
#include "wgmma_util.cuh"

namespace jaxdnn::cuda {
namespace {

using gemm::cp_async16;
using gemm::cp_async16_ign;
using gemm::cp_async_commit;
using gemm::cp_async_wait;
using gemm::smem_u32;

constexpr int kThreads = 128;  // one warpgroup
constexpr int kMaxTaps = 256;
constexpr int kPersistentMaxSteps = 4;  // K steps per tile up to which the grid is persistent
constexpr int kRowBytes = 128;  // K per stage (a K step): one 128-byte swizzle row per tile row

// Input kinds: the wgmma flavour and the element type of x and the filter.
enum WgIn { kInBF16, kInF16, kInTF32 };
template <int IN>
struct WgType {
  using E = std::conditional_t<IN == kInTF32, float, unsigned short>;
  static constexpr int BK = kRowBytes / sizeof(E);  // K values per stage (64 or 32)
  static constexpr bool kBmn = IN != kInTF32;  // B MN-major: read from the HWIO filter
};
bool b_from_hwio(DType in) { return in != DType::kF32; }  // host: WgType::kBmn

// 128-byte-swizzled MN-major panels (16-bit B in forward / backward-data, both operands in
// backward-filter): 64 rows of the reduction x 64 channels (128 bytes), a panel per 64 channels.
constexpr int kPanelBytes = 64 * 128;
int k_step(DType in) { return kRowBytes / static_cast<int>(dtype_bytes(in)); }  // host: BK

// Geometry of a convolution as the kernels index it (32-bit; the support checks bound it).
struct WgGeom {
  int D, H, W, Z, P, Q;
  int C, K, Cg, Kg;
  int R, S;
  int str[3], dil[3], pad[3];
};

void set_geometry(WgGeom& g, const ConvProblem& pb) {
  g.D = static_cast<int>(pb.in[0]); g.H = static_cast<int>(pb.in[1]); g.W = static_cast<int>(pb.in[2]);
  g.Z = static_cast<int>(pb.out[0]); g.P = static_cast<int>(pb.out[1]); g.Q = static_cast<int>(pb.out[2]);
  g.C = static_cast<int>(pb.C); g.K = static_cast<int>(pb.K);
  g.Cg = static_cast<int>(pb.Cg()); g.Kg = static_cast<int>(pb.Kg());
  g.R = static_cast<int>(pb.filt[1]); g.S = static_cast<int>(pb.filt[2]);
  for (int a = 0; a < 3; ++a) {
    g.str[a] = static_cast<int>(pb.stride[a]);
    g.dil[a] = static_cast<int>(pb.dilation[a]);
    g.pad[a] = static_cast<int>(pb.pad_lo[a]);
  }
}

struct WgParams : WgGeom {
  const void* x;
  const void* wt;  // the filter: HWIO [taps*Cg][K] in 16-bit, K-major [G*Kg][taps*Cg] in tf32
  void* y;
  int M, ntap, Kred, tilesM, tilesN;
  int out;  // 0: same 16-bit type as the input, 1: float32 (always for tf32)
  int pipe_bytes;  // shared memory of the pipeline stages (and C tile); the tap table follows
  // One tile per CTA with a 16-bit residual: byte offset (past the pipeline) of the tile's
  // residuals ([BM][BN] 16-bit values), which the CTA copies into shared memory while its K loop
  // runs; 0: none.
  int epi_smem;
  // Byte offset of the fp32 C tile ([BM][LDC]) that the epilogue stages through: 0, the drained
  // pipeline buffers (one tile per CTA, or the persistent walk's last tile); else a region of its
  // own past the pipeline, for the persistent walk with a fused epilogue, where every tile is
  // staged while the next tile's operands are in flight.
  int c_smem;
  EpiDev epi;  // fused epilogue (bias, residual, activation)
  int bias_acc;  // 1: the accumulators start at the biases; the epilogue leaves epi.bias out
  // Split-K (few tiles, long reductions): CTA blockIdx.y multiplies K steps [y * ksplit,
  // (y + 1) * ksplit) and stores its fp32 tile into part[y][g][M][Kg]; split_reduce_kernel adds
  // the splits in order and applies the epilogue. nullptr: no split.
  float* part;
  int ksplit;
  // The warp-specialized kernel: 1 = a consumer waits for each K step's wgmmas before the next
  // (wgmma.wait_group 0; JAXDNN_WGMMA_WS_WAIT0=1), else one step stays in flight.
  int ws_wait0;
};

template <int BM, int BN>
struct WgCfg {
  static constexpr int A_BYTES = BM * 128, B_BYTES = BN * 128;
  static constexpr int STAGE = A_BYTES + B_BYTES;
  static constexpr int ST = (BM == 128 && BN == 128) ? 3 : 4;  // <= ~100 KB: 2 CTAs per SM
  static constexpr int PIPE = ST * STAGE;
  static constexpr int LDC = BN + 8;  // fp32 C tile row pitch
  static constexpr int C_BYTES = BM * LDC * 4;
  static_assert(C_BYTES <= PIPE, "the C tile must fit in the drained pipeline buffers");
  static constexpr int res_bytes() { return BM * BN * 2; }  // a tile of 16-bit residuals (epi_smem)
};

// One 32-byte K slice of the stage: k16 for 16-bit types (B MN-major), k8 for tf32 (K-major).
template <int IN, int BN>
__device__ __forceinline__ void wg_mma(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (BN == 128) {
    if constexpr (IN == kInTF32) wg::mma_m64n128k8_tf32(d, da, db, 1);
    else if constexpr (IN == kInF16) wg::mma_m64n128k16_f16_bmn(d, da, db, 1);
    else wg::mma_m64n128k16_bf16_bmn(d, da, db, 1);
  } else {
    if constexpr (IN == kInTF32) wg::mma_m64n64k8_tf32(d, da, db, 1);
    else if constexpr (IN == kInF16) wg::mma_m64n64k16_f16_bmn(d, da, db, 1);
    else wg::mma_m64n64k16_bf16_bmn(d, da, db, 1);
  }
}

// MN-major, 128-byte swizzle: SBO = 1024 (8-row groups), LBO = the panel stride.
__device__ __forceinline__ uint64_t sw128_desc_mn(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) | (uint64_t(kPanelBytes >> 4) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// The wgmmas of one stage (A at shared address sa: MB blocks of 64 K-major rows; B at sb) into
// MB blocks of m64 x BN accumulators: four 32-byte K slices, the A slice 32 bytes into each row,
// the B slice 32 bytes into each row (K-major) or 16 K rows = 2048 bytes into each panel
// (MN-major).
template <int IN, int MB, int BN>
__device__ __forceinline__ void stage_mma(float (&acc)[MB][BN / 2], uint32_t sa, uint32_t sb) {
#pragma unroll
  for (int kk = 0; kk < kRowBytes / 32; ++kk) {
    const uint64_t db = WgType<IN>::kBmn ? sw128_desc_mn(sb + kk * 2048) : sw128_desc(sb + kk * 32);
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) wg_mma<IN, BN>(acc[mb], sw128_desc(sa + mb * 64 * 128 + kk * 32), db);
  }
}

// A warpgroup's fp32 accumulators, MB blocks of m64 x BN, into rows m_base.. and columns n_base..
// of a row-major fp32 matrix of `rows` x `cols` (pitch `cols`, even), straight from the
// registers: warp w holds rows 16w + lane/4 (+8) of each 64-row block, columns 8j + 2(lane%4)
// (+1) in acc[4j + {0,1}] (row + 8: acc[4j + {2,3}]).
template <int MB, int BN>
__device__ __forceinline__ void store_acc_f32(const float (&acc)[MB][BN / 2], float* out, int m_base,
                                              int n_base, int rows, int cols) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = m_base + mb * 64 + warp * 16 + (lane >> 2) + 8 * half;
      if (m >= rows) continue;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = n_base + j * 8 + (lane & 3) * 2;
        if (col >= cols) break;
        *reinterpret_cast<float2*>(out + static_cast<long long>(m) * cols + col) =
            make_float2(acc[mb][j * 4 + 2 * half], acc[mb][j * 4 + 2 * half + 1]);
      }
    }
  }
}

// acc = the biases of this thread's accumulator columns (same layout as store_acc_f32: columns
// 8j + 2(lane%4) (+1), on both of its rows of every 64-row block). bias is in the output's dtype
// (float32, or 16-bit: f16 when f16); col0 = the tile's first channel, ncols = channels left from
// it (columns past them start at 0 and are never stored). col0 + column is even and the bias
// 16-byte aligned (wgmma_try), so each pair is one 8- or 4-byte load.
template <int MB, int BN, typename Raw, typename Unpack>
__device__ __forceinline__ void acc_from_bias_as(float (&acc)[MB][BN / 2], const Raw* pairs, long long col0,
                                                 int ncols, Unpack unpack) {
  const int lane = threadIdx.x & 31;
  constexpr int kPairs = BN / 8;
  // Every load first, each from an in-range address (the tile's first pair stands in for the
  // pairs past ncols), then the unpacking: with a branch around each load and its unpack the
  // SASS waited for each load before it issued the next (16 L2 round trips at BN = 128).
  Raw raw[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int col = j * 8 + (lane & 3) * 2;
    raw[j] = __ldg(pairs + (col0 + (col < ncols ? col : 0)) / 2);
  }
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    float2 b = unpack(raw[j]);
    if (j * 8 + (lane & 3) * 2 >= ncols) b = make_float2(0.f, 0.f);
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      acc[mb][4 * j] = acc[mb][4 * j + 2] = b.x;
      acc[mb][4 * j + 1] = acc[mb][4 * j + 3] = b.y;
    }
  }
}

template <int MB, int BN>
__device__ __forceinline__ void acc_from_bias(float (&acc)[MB][BN / 2], const void* bias, long long col0,
                                              int ncols, bool out32, bool f16) {
  if (out32) {
    acc_from_bias_as<MB, BN>(acc, static_cast<const float2*>(bias), col0, ncols,
                             [](float2 v) { return v; });
  } else if (f16) {
    acc_from_bias_as<MB, BN>(acc, static_cast<const unsigned*>(bias), col0, ncols, [](unsigned w) {
      return __half22float2(*reinterpret_cast<const __half2*>(&w));
    });
  } else {
    acc_from_bias_as<MB, BN>(acc, static_cast<const unsigned*>(bias), col0, ncols, [](unsigned w) {
      return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    });
  }
}

// The epilogue left for the C tile once the biases are in the accumulators (bias_acc) and a relu
// in the 16-bit stores (relu16; out32: fp32 output); .on: anything left at all. The kernel applies
// it; the launch stages the persistent walk's every tile through a C tile of its own exactly when
// it is on.
__host__ __device__ inline EpiDev epi_left(EpiDev e, bool bias_acc, bool out32) {
  if (bias_acc) e.bias = nullptr;
  epi_take_relu_to_store(e, !out32);
  e.on = e.on && (e.bias || e.residual || e.preact || e.act != static_cast<int>(Activation::kIdentity));
  return e;
}

// Builds the tap table in shared memory: tap j -> (d, h, w) displacement and its element offset
// in an image. t, nt: this thread's index and the threads taking part.
__device__ __forceinline__ void fill_tap_table(const WgParams& p, int4* tbl, int t, int nt) {
  for (int j = t; j < p.ntap; j += nt) {
    const int tz = j / (p.R * p.S), rs = j - tz * (p.R * p.S);
    const int r = rs / p.S, s = rs - r * p.S;
    const int dz = tz * p.dil[0], dh = r * p.dil[1], dw = s * p.dil[2];
    tbl[j] = make_int4(dz, dh, dw, ((dz * p.H + dh) * p.W + dw) * p.C);
  }
}

// The operand loader of one warpgroup (128 threads): thread t = 16-byte chunk column cc of tile
// rows r0, r0 + 16, ...; every row it touches has the same r % 8, so its swizzled chunk offset is
// one constant. setup() takes a tile's rows (the A rows' image positions, the B rows' filter
// offsets) and its first K step; each load() fills one stage (A [BM][128 B], then B: [BN][128 B]
// K-major, or in 16-bit BN / 64 MN-major panels of [BK][128 B], rows r0, r0 + 16, .. of each taken
// from the HWIO filter's rows kb + r) with the next K step's cp.asyncs, zeros outside the image,
// and moves the K cursor on.
// A load is on the K loop's critical path (the single-warpgroup kernel issues it between its
// wgmmas and their wait; the warp-specialized kernel's producer does nothing else), so a chunk
// costs only one 32-bit offset added to a row pointer, the bounds test and the copy:
// - the row pointers hold all but the tap's and the channel's offset;
// - a copy outside the image is not clamped (cp_async16_ign reads nothing);
// - the K cursor (tap j, channel c0) steps by BK, with no division per step.
// SASS (sm_90a): the 64 x 128 tile's K step went from 243 instructions to 172, the 128 x 128
// tile's from 329 to 233 (session 24). Per-row tap masks built once per tile (one bit test per
// chunk instead of three bounds tests; at most 32 taps) cut it to 136 but measured slower on the
// H100 (session 26: tf32 forward 7-15 %, 16-bit backward-data 5-14 % on the ResNet-50 3x3 and
// 1x1 layers), so the tests stay.
template <int IN, int BM, int BN>
struct TileLoader {
  using E = typename WgType<IN>::E;
  static constexpr int BK = WgType<IN>::BK, VEC = 16 / sizeof(E);
  static constexpr bool kBmn = WgType<IN>::kBmn;
  static constexpr int RA = BM / 16;  // A tile rows per thread (16 rows per pass)
  // B rows per thread: of the K step (MN-major: BK / 16, each in every 64-channel panel), or of
  // the tile
  static constexpr int RB = kBmn ? BK / 16 : BN / 16;
  int cc, r0, swz;
  const E* a_ptr[RA];  // row i, channel g * Cg + cc * VEC, at the tap offset 0 (maybe outside x)
  int a_z[RA], a_h[RA], a_w[RA];  // row i's first input position (a_z = INT_MIN / 2: past M)
  // B row i at K index 0, this thread's chunk: MN-major, filter row r0 + 16 i, channel
  // g * Kg + n_base + cc * VEC of panel 0; K-major, the transposed filter's row n_base + r0 + 16 i
  const E* b_ptr[RB];
  unsigned b_ok;  // bit i: filter row i (K-major) or panel i (MN-major) has this chunk (n < Kg)
  int j, c0;  // the next load's tap and channel: K index kb = j * Cg + c0
  int b_off;  // the next load's B offset (elements): kb * K (MN-major) or kb

  __device__ __forceinline__ explicit TileLoader(int t) : cc(t & 7), r0(t >> 3), swz(((t & 7) ^ ((t >> 3) & 7)) * 16) {}

  // tile: the tile index; ks0: its first K step (a split's start, else 0)
  __device__ __forceinline__ void setup(const WgParams& p, int g, int tile, int ks0) {
    const E* x = static_cast<const E*>(p.x);
    const E* wt = static_cast<const E*>(p.wt);
    const int m_base = (tile / p.tilesN) * BM, n_base = (tile % p.tilesN) * BN;
    const long long img = static_cast<long long>(p.D) * p.H * p.W * p.C;
#pragma unroll
    for (int i = 0; i < RA; ++i) {
      const int m = m_base + r0 + 16 * i;
      if (m < p.M) {
        int t = m;
        const int q = t % p.Q; t /= p.Q;
        const int pp = t % p.P; t /= p.P;
        const int z = t % p.Z;
        const int n = t / p.Z;
        a_z[i] = z * p.str[0] - p.pad[0];
        a_h[i] = pp * p.str[1] - p.pad[1];
        a_w[i] = q * p.str[2] - p.pad[2];
        a_ptr[i] = x + (n * img + ((static_cast<long long>(a_z[i]) * p.H + a_h[i]) * p.W + a_w[i]) * p.C +
                        static_cast<long long>(g) * p.Cg + cc * VEC);
      } else {
        a_z[i] = INT_MIN / 2;  // fails every bounds test
        a_h[i] = a_w[i] = 0;
        a_ptr[i] = x;
      }
    }
    b_ok = 0;
    const int kb = ks0 * BK;
    if constexpr (kBmn) {
      const int n = n_base + cc * VEC;
#pragma unroll
      for (int b = 0; b < BN / 64; ++b)
        if (n + 64 * b < p.Kg) b_ok |= 1u << b;
#pragma unroll
      for (int i = 0; i < RB; ++i)
        b_ptr[i] = wt + (static_cast<long long>(r0 + 16 * i) * p.K + static_cast<long long>(g) * p.Kg + n);
      b_off = kb * p.K;  // <= Kred * K, the filter's size (< 2^31: forward_reason)
    } else {
#pragma unroll
      for (int i = 0; i < RB; ++i) {
        const int n = n_base + r0 + 16 * i;
        if (n < p.Kg) b_ok |= 1u << i;
        b_ptr[i] = wt + ((static_cast<long long>(g) * p.Kg + n) * p.Kred + cc * VEC);
      }
      b_off = kb;
    }
    j = kb / p.Cg;
    c0 = kb - j * p.Cg;
  }

  // The next K step into the stage at As (B at As + BM * 128).
  __device__ __forceinline__ void load(const WgParams& p, const int4* tbl, unsigned char* As) {
    unsigned char* Bs = As + BM * 128;
    const int4 e = tbl[j];
    const int off = e.w + c0;  // < 2^31: the image is (forward_reason)
#pragma unroll
    for (int i = 0; i < RA; ++i) {
      const bool v = static_cast<unsigned>(a_z[i] + e.x) < static_cast<unsigned>(p.D) &&
                     static_cast<unsigned>(a_h[i] + e.y) < static_cast<unsigned>(p.H) &&
                     static_cast<unsigned>(a_w[i] + e.z) < static_cast<unsigned>(p.W);
      cp_async16_ign(As + (r0 + 16 * i) * 128 + swz, a_ptr[i] + off, v);
    }
    if constexpr (kBmn) {
#pragma unroll
      for (int i = 0; i < RB; ++i) {
        const E* src = b_ptr[i] + b_off;
#pragma unroll
        for (int b = 0; b < BN / 64; ++b)
          cp_async16_ign(Bs + b * kPanelBytes + (r0 + 16 * i) * 128 + swz, src + 64 * b, b_ok & (1u << b));
      }
      b_off += BK * p.K;
    } else {
#pragma unroll
      for (int i = 0; i < RB; ++i) cp_async16_ign(Bs + (r0 + 16 * i) * 128 + swz, b_ptr[i] + b_off, b_ok & (1u << i));
      b_off += BK;
    }
    c0 += BK;
    if (c0 == p.Cg) {  // Cg % BK == 0 (forward_reason)
      c0 = 0;
      ++j;
    }
  }
};

// A warpgroup's MB blocks of m64 x BN accumulators into rows 0.. of an fp32 C tile of pitch LDC
// (accumulator layout: see store_acc_f32).
template <int MB, int BN, int LDC>
__device__ __forceinline__ void acc_to_smem(const float (&acc)[MB][BN / 2], float* Cs) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) {
    const int row = mb * 64 + warp * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = j * 8 + (lane & 3) * 2;
      *reinterpret_cast<float2*>(Cs + row * LDC + col) = make_float2(acc[mb][j * 4], acc[mb][j * 4 + 1]);
      *reinterpret_cast<float2*>(Cs + (row + 8) * LDC + col) =
          make_float2(acc[mb][j * 4 + 2], acc[mb][j * 4 + 3]);
    }
  }
}

// The staged epilogue of one warpgroup (t: its thread index, 0..127): rows 0..ROWS-1 of the fp32
// C tile Cs (pitch BN + 8) are output rows m_base.., columns n_base.. of group g; p.epi's part
// left after bias_acc and relu16 (epi_left) applied, then 16-byte stores. es: the tile's 16-bit
// residuals in shared memory ([ROWS][BN], one tile per CTA: WgParams::epi_smem), or nullptr.
template <int IN, int ROWS, int BN>
__device__ __forceinline__ void store_staged(const WgParams& p, const float* Cs, const unsigned char* es,
                                             int m_base, int n_base, int g, int t) {
  constexpr bool kF16 = IN == kInF16;
  const bool out32 = IN == kInTF32 || p.out;
  const bool relu16 = p.epi.on && !out32 && p.epi.act == static_cast<int>(Activation::kRelu);
  constexpr int LDC = BN + 8;
  constexpr int CPR = BN / 8, RPP = kThreads / CPR;  // 8-column chunks per row, rows per pass
  const int ec = t % CPR, er = t / CPR;
  const int col = n_base + ec * 8;
  if (col >= p.Kg) return;  // Kg % 8 == 0: a chunk lies inside the row or past its end
  const long long off0 = static_cast<long long>(g) * p.Kg + col;  // + m * K: row m's offset
  // Built here, not before the tile loop, so that its fields stay in the parameter space
  // instead of registers across the K loop.
  const EpiDev epi = epi_left(p.epi, p.bias_acc != 0, out32);
  // this thread's 8 columns are the same on every row it stores: their biases (none unless
  // bias_acc is off: JAXDNN_WGMMA_BIAS_ACC=0) load once
  float bias[8];
  if (epi.on) epi_bias_run<8>(epi, off0, 8, bias);
  // 16-bit residuals, 16 bytes per row: from the tile in shared memory (es), else kR rows'
  // loads go out before the first of their stores (one row at a time, each load waited a DRAM
  // latency behind the previous row's store). The compiler schedules these read-only loads
  // early, next to the live accumulators: all 16 rows, or 4 in the 128 x 128 kernel, made it
  // spill (ptxas, sm_90a).
  constexpr int kRows = (ROWS + RPP - 1) / RPP, kR = ROWS * BN >= 128 * 128 ? 2 : 4;
  const bool res16 = epi.on && epi.residual && !out32;
#pragma unroll 1
  for (int i0 = 0; i0 < kRows; i0 += kR) {
    uint4 res_raw[kR];
    if (res16) {
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        // Clamped rows (rows past the tile or M load a row that is there and go unused), so
        // that no branch separates the loads.
        const int r = min(er + (i0 + i) * RPP, ROWS - 1), m = min(m_base + r, p.M - 1);
        res_raw[i] = es ? reinterpret_cast<const uint4*>(es + r * BN * 2)[ec]
                        : epi_raw16_load<8>(epi.residual, static_cast<long long>(m) * p.K + off0);
      }
    }
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int r = er + (i0 + i) * RPP, m = m_base + r;
      if (r >= ROWS || m >= p.M) break;
      const float* src = Cs + r * LDC + ec * 8;
      float4 lo = *reinterpret_cast<const float4*>(src);
      float4 hi = *reinterpret_cast<const float4*>(src + 4);
      const long long off = static_cast<long long>(m) * p.K + off0;
      if (epi.on) {
        float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        if (res16) {
          float res[8];
          epi_raw16_unpack<8>(epi, res_raw[i], res);
          epi_apply_run_loaded<8>(epi, off, bias, res, v);
        } else {
          epi_apply_run<8>(epi, off, bias, v);
        }
        lo = make_float4(v[0], v[1], v[2], v[3]);
        hi = make_float4(v[4], v[5], v[6], v[7]);
      }
      if (out32) {
        float4* d = reinterpret_cast<float4*>(static_cast<float*>(p.y) + off);
        d[0] = lo;
        d[1] = hi;
      } else {
        uint4 pk;
        pk.x = pack2_16(lo.x, lo.y, kF16, relu16);
        pk.y = pack2_16(lo.z, lo.w, kF16, relu16);
        pk.z = pack2_16(hi.x, hi.y, kF16, relu16);
        pk.w = pack2_16(hi.z, hi.w, kF16, relu16);
        *reinterpret_cast<uint4*>(static_cast<unsigned short*>(p.y) + off) = pk;
      }
    }
  }
}

template <int IN, int BM, int BN>
__global__ void __launch_bounds__(kThreads, 1) wgmma_conv_fwd_kernel(const WgParams p) {
#ifdef JAXDNN_HAS_WGMMA
  using Cf = WgCfg<BM, BN>;
  constexpr int BK = WgType<IN>::BK;
  constexpr bool kF16 = IN == kInF16;
  const bool out32 = IN == kInTF32 || p.out;
  constexpr int ST = Cf::ST;
  extern __shared__ __align__(1024) unsigned char smem[];
  int4* tbl = reinterpret_cast<int4*>(smem + p.pipe_bytes);

  const int tid = threadIdx.x;
  const int g = blockIdx.z;
  const int tiles = p.tilesM * p.tilesN;
  const int kt0 = p.part ? blockIdx.y * p.ksplit : 0;  // this split's first K step
  const int nk = p.part ? min(p.ksplit, p.Kred / BK - kt0) : p.Kred / BK;  // >= 1 (host)

  fill_tap_table(p, tbl, tid, kThreads);
  // The loader's state follows the tile it is loading (ld_tile, K step ld_kt), which runs ahead
  // of the tile being multiplied.
  TileLoader<IN, BM, BN> ld(tid);
  int ld_tile = blockIdx.x, ld_kt = 0;
  if (ld_tile < tiles) ld.setup(p, g, ld_tile, kt0);
  __syncthreads();  // tap table

  // The loader's next K step into stage s (an empty group once every tile is loaded).
  auto load_next = [&](int s) {
    if (ld_tile < tiles) {
      ld.load(p, tbl, smem + s * Cf::STAGE);
      if (++ld_kt == nk) {
        ld_kt = 0;
        ld_tile += gridDim.x;
        if (ld_tile < tiles) ld.setup(p, g, ld_tile, kt0);
      }
    }
    cp_async_commit();
  };

  float acc[BM / 64][BN / 2];
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) load_next(s);
  // One tile per CTA with a 16-bit residual (epi_smem): the tile's residuals go to shared
  // memory in one more cp.async group, in flight during the K loop, so that the epilogue finds
  // them there. Loaded at the epilogue instead, each row's residuals waited a DRAM latency
  // (two rows in flight per thread: 2 CTAs x 128 threads x 32 bytes per SM; H200, bf16
  // r50_c2_1x1_up, 1 K step: bias + relu + residual took 1.69x the plain convolution). The
  // group goes after the prologue's, so the first K steps wait one stage further ahead.
  const bool epi_smem = p.epi_smem != 0;
  if (epi_smem) {
    const int m_base = (blockIdx.x / p.tilesN) * BM, n_base = (blockIdx.x % p.tilesN) * BN;
    const long long col0 = static_cast<long long>(g) * p.Kg + n_base;
    const unsigned short* res = static_cast<const unsigned short*>(p.epi.residual);
    for (int c = tid; c < BM * BN / 8; c += kThreads) {
      const int r = c / (BN / 8), cc = c % (BN / 8), m = m_base + r;
      const bool v = m < p.M && n_base + cc * 8 < p.Kg;
      cp_async16(smem + p.epi_smem + c * 16, res + (v ? static_cast<long long>(m) * p.K + col0 + cc * 8 : 0), v);
    }
    cp_async_commit();
  }
  // a relu goes into the 16-bit conversion of the stores (pack2_16)
  const bool relu16 = p.epi.on && !out32 && p.epi.act == static_cast<int>(Activation::kRelu);
  int step = 0;  // K steps multiplied so far by this CTA: the stage ring position
  const int warp = tid >> 5, lane = tid & 31;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int m_base = (tile / p.tilesN) * BM, n_base = (tile % p.tilesN) * BN;
    if (p.bias_acc) {
      acc_from_bias<BM / 64, BN>(acc, p.epi.bias, static_cast<long long>(g) * p.Kg + n_base,
                                 p.Kg - n_base, out32, kF16);
    } else {
#pragma unroll
      for (int mb = 0; mb < BM / 64; ++mb)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[mb][i] = 0.f;
    }
    for (int kt = 0; kt < nk; ++kt, ++step) {
      cp_async_wait<ST - 2>();
      // cp.async wrote through the generic proxy; wgmma reads through the async proxy
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();  // this stage is complete; every thread is past the previous MMA
      const uint32_t sa = smem_u32(smem + (step % ST) * Cf::STAGE);
      const uint32_t sb = sa + Cf::A_BYTES;
#pragma unroll
      for (int mb = 0; mb < BM / 64; ++mb) fence_acc(acc[mb]);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      stage_mma<IN, BM / 64, BN>(acc, sa, sb);
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      // refill the stage the previous MMA read while this one runs
      load_next((step + ST - 1) % ST);
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
      for (int mb = 0; mb < BM / 64; ++mb) fence_acc(acc[mb]);
    }

    // Accumulator layout (per 64-row block): warp w holds rows 16w.., lane l row l/4 (+8) and
    // columns 8j + 2(l%4) (+1) in acc[j*4 + {0,1}] (row) and acc[j*4 + {2,3}] (row + 8).
    const bool c_own = p.c_smem != 0;  // the C tile has its own shared memory (persistent walk)
    if (!c_own && tile + static_cast<int>(gridDim.x) < tiles) {
      // Persistent walk without an epilogue beyond bias_acc and relu16 (launch), not this CTA's
      // last tile: the next tile's loads are in flight in the pipeline buffers, so the values go
      // out from the registers, two channels (4 or 8 bytes) per store. Kg % 8 == 0 and even
      // columns keep every pair inside one row and aligned.
#pragma unroll
      for (int mb = 0; mb < BM / 64; ++mb) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int m = m_base + mb * 64 + warp * 16 + (lane >> 2) + 8 * half;
          if (m >= p.M) continue;
          const long long row = static_cast<long long>(m) * p.K + static_cast<long long>(g) * p.Kg;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const int col = n_base + j * 8 + (lane & 3) * 2;
            if (col >= p.Kg) break;
            const float v0 = acc[mb][j * 4 + 2 * half], v1 = acc[mb][j * 4 + 2 * half + 1];
            if (out32)
              *reinterpret_cast<float2*>(static_cast<float*>(p.y) + row + col) = make_float2(v0, v1);
            else
              *reinterpret_cast<uint32_t*>(static_cast<unsigned short*>(p.y) + row + col) =
                  pack2_16(v0, v1, kF16, relu16);
          }
        }
      }
      continue;
    }
    if (p.part) {  // split-K: this split's fp32 tile, straight from the registers
      store_acc_f32<BM / 64, BN>(acc, p.part + (static_cast<long long>(blockIdx.y) * gridDim.z + g) * p.M * p.Kg,
                                 m_base, n_base, p.M, p.Kg);
      continue;
    }
    // The C tile: the drained pipeline buffers, or (c_own) its own region, free once every
    // thread is past the K loop's barriers, that is past its reads of the previous tile's C.
    if (!c_own) {
      cp_async_wait<0>();
      __syncthreads();  // the pipeline buffers become the C tile
    }
    float* Cs = reinterpret_cast<float*>(smem + p.c_smem);
    acc_to_smem<BM / 64, BN, Cf::LDC>(acc, Cs);
    __syncthreads();
    store_staged<IN, BM, BN>(p, Cs, epi_smem ? smem + p.epi_smem : nullptr, m_base, n_base, g, tid);
  }
#endif
}

// Warp-specialized forward (WS; the same GEMM view, loader, wgmmas and staged epilogue as
// wgmma_conv_fwd_kernel). The single-warpgroup kernel issues its cp.asyncs and waits for them
// between its own MMAs, and holds the loader's state beside 128 accumulators (246 registers at
// 128 x 128: 2 CTAs, 8 warps per SM). Here a CTA is three warpgroups: warpgroup 0 only loads
// (TileLoader, registers cut to kWsProducerRegs), warpgroups 1 and 2 only multiply and store
// (registers raised to kWsConsumerRegs). The CTA walks tiles blockIdx.x, += gridDim.x (grid: one
// CTA per SM and group); its i-th tile belongs to consumer i % 2, so one consumer's epilogue runs
// while the other's K loop does, and the producer runs up to ST K steps ahead of both, across
// tiles. Handshakes (mbarriers):
// - full[s]: each of the 128 producer threads arrives once its cp.asyncs into stage s have landed
//   (cp.async.mbarrier.arrive.noinc: the producer never waits on its own loads); the consumer
//   waits, then fences the proxies (cp.async writes through the generic proxy, wgmma reads
//   through the async one).
// - empty[s]: the consuming warpgroup's 4 warps arrive once their wgmmas on stage s are done (one
//   step late, wgmma.wait_group 1, or at once with WgParams::ws_wait0); the producer waits before
//   it refills the stage.
// - turn[c]: tile i's K loop starts once tile i - 1's (the other consumer's) has waited on all of
//   its stages. Without it a consumer could pass a full barrier one use early: the use before its
//   own is the other consumer's, so the barrier could still be a phase behind, of the other
//   parity (the H100 timing runs hung before this). It also hands the tensor cores from one
//   consumer to the other, tile by tile.
// A consumer's tile is 128 x BN (two m64 blocks); its epilogue stages 32 rows at a time through a
// C tile of its own (ws_epilogue). No split-K.
// Measured (H100, bf16, kernel-only, session 24): the producer's instruction stream was its limit
// (one warp per scheduler; vgg_c3_2 0.366 ms, as with the producer waiting on its own loads);
// with the row-pointer loader 0.238 ms. That is still 1.03-1.39x the default kernel's time on
// the ten benchmark layers (vgg_c3_2 1.14x), so it stays opt-in (wgmma_try: JAXDNN_WGMMA_WS=1).
// Registers: a CTA of 384 threads starts at 168 each (65536 / 384, rounded down to a multiple of
// 8); setmaxnreg moves them between warpgroups within that total. At a producer's 56 its loader
// state (up to 8 A rows and 8 B rows) spilled (ptxas); at 88 / 208 nothing spills.
constexpr int kWsThreads = 384, kWsProducerRegs = 88, kWsConsumerRegs = 208;
static_assert(kWsProducerRegs * 128 + 2 * kWsConsumerRegs * 128 <= 168 * kWsThreads, "setmaxnreg budget");

template <int BN>
struct WsCfg {
  static constexpr int BM = 128;  // a consumer tile's rows
  static constexpr int STAGE = BM * 128 + BN * 128;
  static constexpr int ST = BN == 128 ? 5 : 8;  // stages: 160 or 192 KB
  static constexpr int PIPE = ST * STAGE;
  static constexpr int LDC = BN + 8;
  static constexpr int EPI_ROWS = 32;  // rows per pass of the staged epilogue
  static constexpr int C_BYTES = EPI_ROWS * LDC * 4;  // a consumer's C tile
  static constexpr int BARS = PIPE + 2 * C_BYTES;  // full[ST], empty[ST], turn[2]
  static constexpr int TBL = BARS + (((2 * ST + 2) * 8 + 15) & ~15);  // the tap table
};

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A consumer's epilogue (consumer c, thread t of its warpgroup): its 128 x BN tile through its C
// tile Cs, EPI_ROWS = 32 rows a pass. Warp w holds rows 16w .. 16w + 15 of each 64-row block, so
// the 32 rows of a pass are written by two warps, then stored by all four (store_staged).
template <int IN, int BN>
__device__ __forceinline__ void ws_epilogue(const WgParams& p, const float (&acc)[2][BN / 2], float* Cs,
                                            int m_base, int n_base, int g, int t, int c) {
  constexpr int LDC = WsCfg<BN>::LDC;
  static_assert(WsCfg<BN>::EPI_ROWS == 32, "two warps' rows per pass");
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
#pragma unroll
  for (int mb = 0; mb < 2; ++mb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      named_sync(1 + c, 128);  // the previous pass's (or tile's) readers are done with Cs
      if ((warp >> 1) == h) {
        const int row = (warp & 1) * 16 + (lane >> 2);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int col = j * 8 + (lane & 3) * 2;
          *reinterpret_cast<float2*>(Cs + row * LDC + col) = make_float2(acc[mb][j * 4], acc[mb][j * 4 + 1]);
          *reinterpret_cast<float2*>(Cs + (row + 8) * LDC + col) =
              make_float2(acc[mb][j * 4 + 2], acc[mb][j * 4 + 3]);
        }
      }
      named_sync(1 + c, 128);
      store_staged<IN, 32, BN>(p, Cs, nullptr, m_base + mb * 64 + h * 32, n_base, g, t);
    }
  }
}

template <int IN, int BN>
__global__ void __launch_bounds__(kWsThreads, 1) wgmma_conv_fwd_ws_kernel(const WgParams p) {
#ifdef JAXDNN_HAS_WGMMA
  using Cf = WsCfg<BN>;
  constexpr int BK = WgType<IN>::BK, ST = Cf::ST, BM = Cf::BM;
  extern __shared__ __align__(1024) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cf::BARS);
  uint64_t* empty = full + ST;
  uint64_t* turn = empty + ST;
  int4* tbl = reinterpret_cast<int4*>(smem + Cf::TBL);
  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
  const int g = blockIdx.z;
  const int tiles = p.tilesM * p.tilesN;
  const int nk = p.Kred / BK;

  fill_tap_table(p, tbl, tid, kWsThreads);
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(&full[s], 128);
      mbar_init(&empty[s], 4);
    }
    mbar_init(&turn[0], 4);
    mbar_init(&turn[1], 4);
  }
  __syncthreads();  // tap table and barriers

  if (wg == 0) {  // the producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWsProducerRegs));
    TileLoader<IN, BM, BN> ld(t);
    int step = 0;  // K steps issued by this CTA: stage step % ST, its (step / ST)-th use
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      ld.setup(p, g, tile, 0);
      for (int kt = 0; kt < nk; ++kt, ++step) {
        const int s = step % ST;
        if (step >= ST) mbar_wait(&empty[s], (step / ST - 1) & 1);
        ld.load(p, tbl, smem + s * Cf::STAGE);
        // full[s] gets this thread's arrival once its cp.asyncs so far have landed
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(mbar_addr(&full[s]))
                     : "memory");
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // nothing of this thread's in flight at its exit
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWsConsumerRegs));
  const int c = wg - 1, lane = tid & 31;
  const bool wait0 = p.ws_wait0 != 0;
  float* Cs = reinterpret_cast<float*>(smem + Cf::PIPE + c * Cf::C_BYTES);
  float acc[2][BN / 2];
  int i = 0;  // the CTA's tile count: tile i is K steps i * nk ..
  int own = 0;  // tiles this consumer has multiplied
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++i) {
    if ((i & 1) != c) continue;
    // Tile i's K loop starts once tile i - 1's (the other consumer's) has waited on all of its
    // stages (turn[c]). Without this order a consumer could wait on a stage's full barrier one
    // use early: the use before its own belongs to the other consumer, so the barrier could still
    // be in that earlier phase, of the other parity, and the wait would pass at once. (The
    // order also hands the tensor cores from one consumer to the other, tile by tile.)
    if (i > 0) mbar_wait(&turn[c], (c == 0 ? own - 1 : own) & 1);
    ++own;
    const int m_base = (tile / p.tilesN) * BM, n_base = (tile % p.tilesN) * BN;
    // Zeros: biases in the accumulators (acc_from_bias) made ptxas serialize the wgmmas here (C7515:
    // "non wgmma instructions defining accumulator registers"), with one step's wgmmas in flight
    // across the K loop; the biases are added in the staged epilogue instead (launch_ws), which
    // runs beside the other consumer's K loop.
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
      for (int j = 0; j < BN / 2; ++j) acc[mb][j] = 0.f;
#pragma unroll
    for (int mb = 0; mb < 2; ++mb) fence_acc(acc[mb]);
    const int step0 = i * nk;
    for (int kt = 0; kt < nk; ++kt) {
      const int step = step0 + kt, s = step % ST;
      mbar_wait(&full[s], (step / ST) & 1);
      // the stage was written through the generic proxy (cp.async); wgmma reads it through the
      // async proxy
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      const uint32_t sa = smem_u32(smem + s * Cf::STAGE);
      const uint32_t sb = sa + BM * 128;
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      stage_mma<IN, 2, BN>(acc, sa, sb);
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      if (wait0) {  // this step's wgmmas done: its stage goes back at once
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (lane == 0) mbar_arrive(&empty[s]);
      } else {  // the previous step's wgmmas are done with their stage (kt = 0: none to wait for)
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (kt > 0 && lane == 0) mbar_arrive(&empty[(step - 1) % ST]);
      }
    }
    if (lane == 0) mbar_arrive(&turn[1 - c]);  // every stage of this tile has been waited on
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int mb = 0; mb < 2; ++mb) fence_acc(acc[mb]);
    if (!wait0 && lane == 0) mbar_arrive(&empty[(step0 + nk - 1) % ST]);

    // The epilogue, EPI_ROWS rows at a time: warp w's accumulator rows are 16w.. of each 64-row
    // block, so a pass of 32 rows takes warps 0-1 (block 0) or 2-3 ... written by their owners.
    ws_epilogue<IN, BN>(p, acc, Cs, m_base, n_base, g, t, c);
  }
#endif
}

// Split-K's second pass: y[m][g*Kg + n] = epilogue(sum over splits of part[split][g][m][n]), the
// splits added in order (deterministic); eight columns per thread (Kg % 8 == 0).
template <int IN>
__global__ void __launch_bounds__(256) split_reduce_kernel(const WgParams p, int splits) {
  constexpr bool kF16 = IN == kInF16;
  const bool out32 = IN == kInTF32 || p.out;
  const int G = gridDim.y;
  const int g = blockIdx.y;
  const long long per_split = static_cast<long long>(G) * p.M * p.Kg;
  const long long runs = static_cast<long long>(p.M) * (p.Kg / 8);  // of this group
  for (long long r = blockIdx.x * 256LL + threadIdx.x; r < runs; r += 256LL * gridDim.x) {
    const int m = static_cast<int>(r / (p.Kg / 8)), col = static_cast<int>(r % (p.Kg / 8)) * 8;
    const float* src = p.part + (static_cast<long long>(g) * p.M + m) * p.Kg + col;
    float v[8];
    {
      const float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
    for (int sp = 1; sp < splits; ++sp) {
      const float4* q = reinterpret_cast<const float4*>(src + sp * per_split);
      const float4 a = q[0], b = q[1];
      v[0] += a.x, v[1] += a.y, v[2] += a.z, v[3] += a.w;
      v[4] += b.x, v[5] += b.y, v[6] += b.z, v[7] += b.w;
    }
    const long long chan = static_cast<long long>(g) * p.Kg + col;
    const long long off = static_cast<long long>(m) * p.K + chan;
    if (p.epi.on) {
      float bias[8];
      epi_bias_run<8>(p.epi, chan, 8, bias);
      epi_apply_run<8>(p.epi, off, bias, v);
    }
    if (out32) {
      float4* d = reinterpret_cast<float4*>(static_cast<float*>(p.y) + off);
      d[0] = make_float4(v[0], v[1], v[2], v[3]);
      d[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint4 pk;
      pk.x = pack2_16(v[0], v[1], kF16, false);
      pk.y = pack2_16(v[2], v[3], kF16, false);
      pk.z = pack2_16(v[4], v[5], kF16, false);
      pk.w = pack2_16(v[6], v[7], kF16, false);
      *reinterpret_cast<uint4*>(static_cast<unsigned short*>(p.y) + off) = pk;
    }
  }
}

// ---- Backward-filter (16-bit operands; JAXDNN_WGMMA_WGRAD=0 switches it off: mma.sync with split-K).
// dw[tap][c][k] = sum over output pixels o = (n, z, p, q) of x[n, o*str - pad + d(tap)][c] * dy[o][k],
// d(tap) the tap's dilated displacement. GEMM: M = taps*Cg rows m = tap*Cg + c (dw's HWIO row
// order), N = Kg, the reduction over the N*Z*P*Q pixels. In both operands the channels are
// contiguous and the pixels strided, so the tiles are MN-major (the `_mn` wgmma forms, 16-bit
// only): a stage holds kPix = 64 pixels of each, as 64-channel panels of 64 pixel rows x 128 bytes,
// 128B-swizzled like the forward's rows (chunk c of row r at c ^ (r % 8)). MN-major descriptor:
// the 8-row groups of one panel 1024 bytes apart (SBO), panels 8192 bytes apart (LBO). Cg % 64 == 0,
// so an A panel is 64 channels of one tap. The pixels are split over blockIdx.y into fp32 partials
// [split][G][taps*Cg][Kg], which wgrad_reduce_kernel sums in split order (deterministic) into dw.
constexpr int kPix = 64;  // pixels (reduction) per stage: 64 rows of each operand's panels
static_assert(kPanelBytes == kPix * 128, "a panel is a stage's 64 pixel rows");

struct WgWgradParams : WgGeom {
  const void* x;
  const void* dy;
  float* part;  // [splits][G][Mrows][Kg]
  int npix;   // N*Z*P*Q: the reduction
  int Mrows;  // taps*Cg
  int tilesN;
  int steps;  // K steps (kPix pixels each) per split
};

template <int IN, int BN>
__device__ __forceinline__ void wg_mma_mn(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (BN == 128) {
    if constexpr (IN == kInF16) wg::mma_m64n128k16_f16_mn(d, da, db, 1);
    else wg::mma_m64n128k16_bf16_mn(d, da, db, 1);
  } else {
    if constexpr (IN == kInF16) wg::mma_m64n64k16_f16_mn(d, da, db, 1);
    else wg::mma_m64n64k16_bf16_mn(d, da, db, 1);
  }
}

template <int IN, int BM, int BN>
__global__ void __launch_bounds__(kThreads, 1) wgmma_conv_wgrad_kernel(const WgWgradParams p) {
#ifdef JAXDNN_HAS_WGMMA
  using Cf = WgCfg<BM, BN>;  // same stage bytes as the forward: BM and BN rows of 128 bytes
  constexpr int ST = Cf::ST;
  constexpr int PA = BM / 64, PB = BN / 64;  // 64-channel panels per stage
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned short* x = static_cast<const unsigned short*>(p.x);
  const unsigned short* dy = static_cast<const unsigned short*>(p.dy);
  const int tid = threadIdx.x, g = blockIdx.z, split = blockIdx.y;
  const int m_base = (blockIdx.x / p.tilesN) * BM, n_base = (blockIdx.x % p.tilesN) * BN;
  const int kt0 = split * p.steps;
  const int nk = min(p.steps, (p.npix + kPix - 1) / kPix - kt0);  // >= 1 (host)

  // Each A panel: one tap's displacement and its first channel (in x's channel dimension).
  int pa_dz[PA], pa_dh[PA], pa_dw[PA], pa_c[PA];
  bool pa_ok[PA];
#pragma unroll
  for (int a = 0; a < PA; ++a) {
    const int m = m_base + a * 64;
    pa_ok[a] = m < p.Mrows;
    const int tap = pa_ok[a] ? m / p.Cg : 0;
    const int t = tap / (p.R * p.S), rs = tap - t * (p.R * p.S);
    const int r = rs / p.S, sx = rs - r * p.S;
    pa_dz[a] = t * p.dil[0];
    pa_dh[a] = r * p.dil[1];
    pa_dw[a] = sx * p.dil[2];
    pa_c[a] = g * p.Cg + (m - tap * p.Cg);
  }
  // Loader: thread = 16-byte chunk cc of pixel rows r0 + 16 i; the swizzled chunk offset is one
  // constant (every row it touches has the same r % 8).
  const int cc = tid & 7, r0 = tid >> 3;
  const int swz = (cc ^ (r0 & 7)) * 16;
  bool pb_ok[PB];
#pragma unroll
  for (int b = 0; b < PB; ++b) pb_ok[b] = n_base + b * 64 + cc * 8 < p.Kg;

  auto load = [&](int kt, int st) {
    unsigned char* As = smem + st * Cf::STAGE;
    unsigned char* Bs = As + Cf::A_BYTES;
#pragma unroll
    for (int i = 0; i < kPix / 16; ++i) {
      const int row = r0 + 16 * i, pix = (kt0 + kt) * kPix + row;
      const bool in = pix < p.npix;
      int t = in ? pix : 0;
      const int q = t % p.Q; t /= p.Q;
      const int pp = t % p.P; t /= p.P;
      const int z = t % p.Z;
      const int n = t / p.Z;
      const int bz = z * p.str[0] - p.pad[0], bh = pp * p.str[1] - p.pad[1], bw = q * p.str[2] - p.pad[2];
#pragma unroll
      for (int a = 0; a < PA; ++a) {
        const int iz = bz + pa_dz[a], ih = bh + pa_dh[a], iw = bw + pa_dw[a];
        const bool v = in && pa_ok[a] && static_cast<unsigned>(iz) < static_cast<unsigned>(p.D) &&
                       static_cast<unsigned>(ih) < static_cast<unsigned>(p.H) &&
                       static_cast<unsigned>(iw) < static_cast<unsigned>(p.W);
        const long long off =
            (((static_cast<long long>(n) * p.D + iz) * p.H + ih) * p.W + iw) * p.C + pa_c[a] + cc * 8;
        cp_async16(As + a * kPanelBytes + row * 128 + swz, x + (v ? off : 0), v);
      }
#pragma unroll
      for (int b = 0; b < PB; ++b) {
        const bool v = in && pb_ok[b];
        const long long off = static_cast<long long>(pix) * p.K + static_cast<long long>(g) * p.Kg +
                              n_base + b * 64 + cc * 8;
        cp_async16(Bs + b * kPanelBytes + row * 128 + swz, dy + (v ? off : 0), v);
      }
    }
  };

  float acc[PA][BN / 2];
#pragma unroll
  for (int a = 0; a < PA; ++a)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[a][i] = 0.f;
#pragma unroll
  for (int st = 0; st < ST - 1; ++st) {
    if (st < nk) load(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<ST - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const uint32_t sa = smem_u32(smem + (kt % ST) * Cf::STAGE);
    const uint32_t sb = sa + Cf::A_BYTES;
#pragma unroll
    for (int a = 0; a < PA; ++a) fence_acc(acc[a]);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < kPix / 16; ++kk) {  // 16 pixel rows: two 8-row groups (SBO apart)
      const uint64_t db = sw128_desc_mn(sb + kk * 2048);
#pragma unroll
      for (int a = 0; a < PA; ++a)
        wg_mma_mn<IN, BN>(acc[a], sw128_desc_mn(sa + a * kPanelBytes + kk * 2048), db);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    if (kt + ST - 1 < nk) load(kt + ST - 1, (kt + ST - 1) % ST);
    cp_async_commit();
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int a = 0; a < PA; ++a) fence_acc(acc[a]);
  }
  cp_async_wait<0>();
  store_acc_f32<PA, BN>(acc, p.part + (static_cast<long long>(split) * gridDim.z + g) * p.Mrows * p.Kg,
                        m_base, n_base, p.Mrows, p.Kg);
#endif
}

// dw[m][g*Kg + n] = sum over splits of part[split][g][m][n], four columns per thread (Kg % 8 == 0),
// in split order; the output dtype is float32 or the operands' 16-bit type.
__global__ void __launch_bounds__(256) wgrad_reduce_kernel(const float* __restrict part, void* dw,
                                                           int splits, int G, int Mrows, int Kg,
                                                           int out32, int f16) {
  const long long per_split = static_cast<long long>(G) * Mrows * Kg;
  const long long quads = per_split / 4;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < quads; i += 256LL * gridDim.x) {
    const long long e = i * 4;
    float4 sum = reinterpret_cast<const float4*>(part + e)[0];
    for (int sp = 1; sp < splits; ++sp) {
      const float4 v = reinterpret_cast<const float4*>(part + sp * per_split + e)[0];
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    const int n = static_cast<int>(e % Kg);
    const long long gm = e / Kg;
    const int m = static_cast<int>(gm % Mrows), g = static_cast<int>(gm / Mrows);
    const long long o = static_cast<long long>(m) * G * Kg + static_cast<long long>(g) * Kg + n;
    if (out32) {
      *reinterpret_cast<float4*>(static_cast<float*>(dw) + o) = sum;
    } else {
      uint2 pk;
      pk.x = pack2_16(sum.x, sum.y, f16 != 0, false);
      pk.y = pack2_16(sum.z, sum.w, f16 != 0, false);
      *reinterpret_cast<uint2*>(static_cast<unsigned short*>(dw) + o) = pk;
    }
  }
}

// Batched transposes of the filter, 32 x 32 tiles through shared memory: for each batch
// z = tap * G + g (blockIdx.z), wt[dst(z) + c * ld_dst + r] = w[src(z) + r * ld_src + c] over
// r < rows, c < cols, with src(z) = (taps - 1 - tap) * src_tap + g * src_g (taps reversed) and
// dst(z) = tap * dst_tap + g * dst_g. fp32 values are rounded to TF32 on the way (free here; the
// activations cannot be: cp.async).
struct FilterTranspose {
  int rows, cols, ld_src, ld_dst, taps, G;
  long long src_tap, src_g, dst_tap, dst_g;
};

template <class E>
__global__ void __launch_bounds__(256) transpose_filter_kernel(const E* __restrict__ w,
                                                              E* __restrict__ wt, FilterTranspose t) {
  __shared__ E tile[32][33];
  const int bx = blockIdx.x * 32, by = blockIdx.y * 32;
  const int tap = blockIdx.z / t.G, g = blockIdx.z % t.G;
  w += (t.taps - 1 - tap) * t.src_tap + g * t.src_g;
  wt += tap * t.dst_tap + g * t.dst_g;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int r = by + i, c = bx + threadIdx.x;
    if (r < t.rows && c < t.cols) {
      E v = w[static_cast<long long>(r) * t.ld_src + c];
      if constexpr (std::is_same_v<E, float>) v = __uint_as_float(gemm::to_tf32(v));
      tile[i][threadIdx.x] = v;
    }
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int c = bx + i, r = by + threadIdx.x;
    if (r < t.rows && c < t.cols) wt[static_cast<long long>(c) * t.ld_dst + r] = tile[threadIdx.x][i];
  }
}

// Backward-data's filter in the forward view, K-major (tf32): wt[g*Cg + c][tap*Kg + k] =
// w[taps - 1 - tap][c][g*Kg + k] (HWIO w; the flat tap index reversed flips every spatial axis).
// Both sides are contiguous along k. fp32 values are rounded to TF32, as in the transpose. (In
// 16-bit the view's filter is HWIO: transpose_filter_kernel, one [Cg][Kg] block per tap and group.)
template <class E>
__global__ void __launch_bounds__(256) flip_swap_filter_kernel(const E* __restrict__ w,
                                                              E* __restrict__ wt, long long total,
                                                              int taps, int Cg, int Kg, int G) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < total; i += 256LL * gridDim.x) {
    const int k = static_cast<int>(i % Kg);
    long long r = i / Kg;
    const int tap = static_cast<int>(r % taps);
    r /= taps;
    const int c = static_cast<int>(r % Cg);
    const int g = static_cast<int>(r / Cg);
    E v = w[(static_cast<long long>(taps - 1 - tap) * Cg + c) * (static_cast<long long>(G) * Kg) +
            static_cast<long long>(g) * Kg + k];
    if constexpr (std::is_same_v<E, float>) v = __uint_as_float(gemm::to_tf32(v));
    wt[i] = v;
  }
}

size_t align256(size_t v) { return (v + 255) & ~size_t(255); }

// Lets `kern` take `bytes` of dynamic shared memory on the current device (*dev), once per device
// (`done`: a bit per device ordinal).
template <class Kern>
std::string allow_smem(Kern kern, int bytes, std::atomic<unsigned long long>& done, int* dev) {
  cudaError_t e = cudaGetDevice(dev);
  if (e != cudaSuccess) return std::string("cudaGetDevice: ") + cudaGetErrorString(e);
  const unsigned long long bit = 1ULL << (*dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return "";
  e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e);
  done.fetch_or(bit, std::memory_order_acq_rel);
  return "";
}

template <int IN, int BM, int BN>
std::string launch(WgParams p, int groups, bool persistent, int splits, cudaStream_t st) {
  using Cf = WgCfg<BM, BN>;
  auto kern = wgmma_conv_fwd_kernel<IN, BM, BN>;
  static std::atomic<unsigned long long> attr_done{0};
  int dev = 0;
  const int smem_max = Cf::PIPE + std::max(Cf::res_bytes(), Cf::C_BYTES) + kMaxTaps * 16;
  if (std::string err = allow_smem(kern, smem_max, attr_done, &dev); !err.empty()) return err;
  cudaError_t e;
  // CTAs per SM at `smem` bytes, queried once per (device, size): a launch must not pay a driver
  // query (the sizes come from a handful of layer shapes).
  static std::mutex occ_mu;
  static std::map<std::pair<int, int>, int> occ;
  auto per_sm = [&](int smem, int* n) {
    std::lock_guard<std::mutex> lock(occ_mu);
    if (auto it = occ.find({dev, smem}); it != occ.end()) {
      *n = it->second;
      return cudaSuccess;
    }
    const cudaError_t q = cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, kern, kThreads, smem);
    if (q == cudaSuccess) occ[{dev, smem}] = *n;
    return q;
  };
  // One tile per CTA touches only the first min(K steps, ST) stages, then the C tile: a short
  // reduction (a 1x1 layer over 64 channels: one step) needs less shared memory, so more CTAs
  // fit on an SM. The persistent walk cycles through every stage.
  const int steps = p.Kred / WgType<IN>::BK;
  // The persistent walk with a fused epilogue stages every tile through a C tile of its own,
  // past the stages (register-direct stores with bias and residual loads had cost 1.95x the
  // plain walk on r50_c2_1x1_dn, session 16). Staging the plain walk's tiles too gained nothing
  // (r50_c2_1x1_dn 0.0315 / 0.0314 ms, H100, session 19), so those keep the register stores, and
  // so does an epilogue of biases in the accumulators and a relu in the 16-bit stores.
  const bool c_own = persistent && epi_left(p.epi, p.bias_acc != 0, p.out != 0 || IN == kInTF32).on;
  p.pipe_bytes = persistent ? Cf::PIPE + (c_own ? Cf::C_BYTES : 0)
                            : std::max(std::min(steps, Cf::ST) * Cf::STAGE, Cf::C_BYTES);
  p.pipe_bytes = (p.pipe_bytes + 1023) & ~1023;  // stages stay 1024-byte aligned (swizzle)
  p.c_smem = c_own ? Cf::PIPE : 0;
  int smem = p.pipe_bytes + p.ntap * 16;
  // The 16-bit residuals' shared-memory copy, where it leaves as many CTAs per SM.
  p.epi_smem = 0;
  if (!persistent && !p.part && p.epi.residual && p.out == 0 && IN != kInTF32) {
    const int with = smem + Cf::res_bytes();
    int n0 = 0, n1 = 0;
    e = per_sm(smem, &n0);
    if (e == cudaSuccess) e = per_sm(with, &n1);
    if (e != cudaSuccess) return std::string("occupancy query: ") + cudaGetErrorString(e);
    if (n1 == n0) {
      p.epi_smem = smem;  // past the tap table
      smem = with;
    }
  }
  long long ctas = static_cast<long long>(p.tilesM) * p.tilesN;
  if (persistent) {  // at most the CTAs that are resident at once (per group)
    int n = 0, sms = 0;
    e = per_sm(smem, &n);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return std::string("occupancy query: ") + cudaGetErrorString(e);
    const long long resident = std::max(1LL, static_cast<long long>(n) * sms / groups);
    ctas = std::min(ctas, resident);
  }
  dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(splits), static_cast<unsigned>(groups));
  kern<<<grid, kThreads, smem, st>>>(p);
  e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("wgmma conv kernel launch: ") + cudaGetErrorString(e);
}

// The warp-specialized forward: tiles of 128 x BN, a persistent grid of one CTA per SM (and group).
template <int IN, int BN>
std::string launch_ws(WgParams p, int groups, cudaStream_t st) {
  using Cf = WsCfg<BN>;
  auto kern = wgmma_conv_fwd_ws_kernel<IN, BN>;
  static std::atomic<unsigned long long> attr_done{0};
  int dev = 0, sms = 0;
  if (std::string err = allow_smem(kern, Cf::TBL + kMaxTaps * 16, attr_done, &dev); !err.empty()) return err;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return std::string("cudaDeviceGetAttribute: ") + cudaGetErrorString(e);
  p.tilesM = (p.M + Cf::BM - 1) / Cf::BM;
  p.tilesN = (p.Kg + BN - 1) / BN;
  p.part = nullptr;
  p.pipe_bytes = Cf::TBL;
  p.c_smem = p.epi_smem = 0;
  p.bias_acc = 0;  // see the kernel
  const char* w0 = std::getenv("JAXDNN_WGMMA_WS_WAIT0");
  p.ws_wait0 = w0 && w0[0] == '1';
  const long long tiles = static_cast<long long>(p.tilesM) * p.tilesN;
  const long long ctas = std::min(tiles, std::max(1LL, static_cast<long long>(sms) / groups));
  dim3 grid(static_cast<unsigned>(ctas), 1, static_cast<unsigned>(groups));
  kern<<<grid, kWsThreads, Cf::TBL + p.ntap * 16, st>>>(p);
  e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("wgmma warp-specialized conv kernel launch: ") + cudaGetErrorString(e);
}

// The forward problem that backward-data at stride 1 is: dy is its input, dx its output.
ConvProblem dgrad_as_forward(const ConvProblem& pb) {
  ConvProblem v = pb;
  v.C = pb.K;
  v.K = pb.C;
  for (int a = 0; a < 3; ++a) {
    v.in[a] = pb.out[a];
    v.out[a] = pb.in[a];
    const int64_t reach = pb.dilation[a] * (pb.filt[a] - 1);
    v.pad_lo[a] = reach - pb.pad_lo[a];
    v.pad_hi[a] = reach - pb.pad_hi[a];
  }
  return v;
}

// The call the kernel runs: the forward itself, or backward-data's forward view.
CudaConvCall as_forward(const CudaConvCall& c) {
  CudaConvCall f = c;
  if (c.op == ConvOp::kBackwardData) {
    f.op = ConvOp::kForward;
    f.problem = dgrad_as_forward(c.problem);
  }
  return f;
}

std::string forward_reason(const CudaConvCall& c) {
  const ConvProblem& pb = c.problem;
  const bool tf32 = c.in == DType::kF32 && c.precision != MathPrecision::kHighest;
  if (c.in != DType::kBF16 && c.in != DType::kF16 && !tf32)
    return "not 16-bit, nor float32 with TF32 allowed";
  if (c.out != c.in && c.out != DType::kF32) return "result dtype";
  if (pb.layout != Layout::kNHWC || !pb.unit_lhs_dilation()) return "layout or lhs dilation";
  if (pb.Cg() % k_step(c.in) != 0 || pb.Kg() % 8 != 0) return "channels per group";
  if (pb.filt_taps() > kMaxTaps) return "too many taps";
  if (pb.x_elems() == 0 || pb.y_elems() == 0 || pb.w_elems() == 0) return "empty operand";
  const long long img = pb.in[0] * pb.in[1] * pb.in[2] * pb.C;
  if (img > INT_MAX || pb.N * pb.out_pixels() > INT_MAX || pb.w_elems() > INT_MAX ||
      pb.filt_taps() * pb.Cg() > INT_MAX / 2 || (pb.K + 31) / 32 > INT_MAX)
    return "sizes beyond 32-bit index math";
  if (!b_from_hwio(c.in) && (pb.filt_taps() * pb.Cg() + 31) / 32 > 65535)
    return "filter too large for the transpose grid";
  if (b_from_hwio(c.in) && ((std::max(pb.Cg(), pb.Kg()) + 31) / 32 > 65535 || pb.filt_taps() * pb.G > 65535))
    return "filter too large for the transpose grid";  // backward-data's flip (transpose_filter_kernel)
  return "";
}

std::string wgrad_reason(const CudaConvCall& c) {
  // JAXDNN_WGMMA_WGRAD=0: the mma.sync kernel with its split-K plan instead (comparisons); read
  // when the call is lowered (workspace) and when it runs.
  if (const char* off = std::getenv("JAXDNN_WGMMA_WGRAD"); off && off[0] == '0')
    return "backward-filter on wgmma switched off (JAXDNN_WGMMA_WGRAD=0)";
  const ConvProblem& pb = c.problem;
  if (c.in != DType::kBF16 && c.in != DType::kF16) return "backward-filter: not 16-bit (MN-major wgmma)";
  if (c.out != c.in && c.out != DType::kF32) return "result dtype";
  if (pb.layout != Layout::kNHWC || !pb.unit_lhs_dilation()) return "layout or lhs dilation";
  if (pb.Cg() % 64 != 0 || pb.Kg() % 8 != 0) return "channels per group";
  if (pb.x_elems() == 0 || pb.y_elems() == 0 || pb.w_elems() == 0) return "empty operand";
  if (pb.N * pb.out_pixels() > INT_MAX - kPix || pb.filt_taps() * pb.Cg() > INT_MAX / 2 ||
      pb.y_elems() > INT_MAX || pb.w_elems() > INT_MAX)
    return "sizes beyond 32-bit index math";
  return "";
}

// Backward-filter's tiles and pixel split, from the shape only (the workspace is sized when JAX
// lowers the call). Splits: about one wave of CTAs (2 per SM, 132 SMs), each split at least 16
// K steps (1024 pixels), the fp32 partials at most 256 MiB.
struct WgradPlan {
  int BM, BN, tilesM, tilesN, steps, splits;
  size_t part_bytes;
};
WgradPlan wgrad_plan(const ConvProblem& pb) {
  WgradPlan w;
  const long long Mrows = pb.filt_taps() * pb.Cg(), Kg = pb.Kg();
  w.BM = Mrows <= 64 ? 64 : 128;
  w.BN = Kg <= 64 ? 64 : 128;
  w.tilesM = static_cast<int>((Mrows + w.BM - 1) / w.BM);
  w.tilesN = static_cast<int>((Kg + w.BN - 1) / w.BN);
  const long long tiles = static_cast<long long>(w.tilesM) * w.tilesN * pb.G;
  const long long total = (pb.N * pb.out_pixels() + kPix - 1) / kPix;
  const long long per_split = pb.G * Mrows * Kg * 4;
  long long want = std::max(1LL, (2 * 132 + tiles - 1) / tiles);
  want = std::min(want, std::max(1LL, total / 16));
  while (want > 1 && want * per_split > (256LL << 20)) want = (want + 1) / 2;
  w.steps = static_cast<int>((total + want - 1) / want);
  w.splits = static_cast<int>((total + w.steps - 1) / w.steps);
  w.part_bytes = align256(static_cast<size_t>(w.splits) * per_split);
  return w;
}

template <int IN, int BM, int BN>
std::string launch_wgrad(const WgWgradParams& p, const WgradPlan& w, int G, cudaStream_t st) {
  using Cf = WgCfg<BM, BN>;
  auto kern = wgmma_conv_wgrad_kernel<IN, BM, BN>;
  static std::atomic<unsigned long long> attr_done{0};
  int dev = 0;
  if (std::string err = allow_smem(kern, Cf::PIPE, attr_done, &dev); !err.empty()) return err;
  dim3 grid(static_cast<unsigned>(w.tilesM * w.tilesN), static_cast<unsigned>(w.splits),
            static_cast<unsigned>(G));
  kern<<<grid, kThreads, Cf::PIPE, st>>>(p);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("wgmma wgrad kernel launch: ") + cudaGetErrorString(e);
}

// Backward-filter on wgmma: the GEMM kernel into the partials, then their reduction into dw.
std::string run_wgrad(const CudaConvCall& c, const CudaConvBuffers& io) {
  const ConvProblem& pb = c.problem;
  const WgradPlan w = wgrad_plan(pb);
  WgWgradParams p{};
  p.x = io.a;
  p.dy = io.b;
  p.part = static_cast<float*>(io.workspace);
  set_geometry(p, pb);
  p.npix = static_cast<int>(pb.N * pb.out_pixels());
  p.Mrows = static_cast<int>(pb.filt_taps() * pb.Cg());
  p.tilesN = w.tilesN;
  p.steps = w.steps;
  const int G = static_cast<int>(pb.G);
  auto run = [&](auto in_tag) {
    constexpr int I = decltype(in_tag)::value;
    if (w.BM == 128 && w.BN == 128) return launch_wgrad<I, 128, 128>(p, w, G, io.stream);
    if (w.BM == 128) return launch_wgrad<I, 128, 64>(p, w, G, io.stream);
    if (w.BN == 128) return launch_wgrad<I, 64, 128>(p, w, G, io.stream);
    return launch_wgrad<I, 64, 64>(p, w, G, io.stream);
  };
  std::string err = c.in == DType::kF16 ? run(std::integral_constant<int, kInF16>{})
                                         : run(std::integral_constant<int, kInBF16>{});
  if (!err.empty()) return err;
  const long long quads = pb.G * static_cast<long long>(p.Mrows) * p.Kg / 4;
  const int blocks = static_cast<int>(std::max(1LL, std::min((quads + 255) / 256, 132LL * 16)));
  wgrad_reduce_kernel<<<blocks, 256, 0, io.stream>>>(p.part, io.out, w.splits, G, p.Mrows, p.Kg,
                                                      c.out == DType::kF32 ? 1 : 0,
                                                      c.in == DType::kF16 ? 1 : 0);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("wgmma wgrad reduce launch: ") + cudaGetErrorString(e);
}

// The forward kernel's tiles and split-K, from the forward view's shape only (the workspace is
// sized when JAX lowers the call). Tiles: the largest that still gives every SM a CTA (132 SMs),
// BN = 64 for Kg <= 64; a stage holds the same bytes in every dtype, so tf32 takes the same.
// Split-K only for long reductions (>= 64 K steps) whose 128 x 128 tiles fill less than one SM
// each: 128 x 128 tiles, as many splits as fill a wave of 2 CTAs per SM, each at least 16 K
// steps, the fp32 partials at most 256 MiB. H100, bf16, kernel-only (session 18): r50_c5_3x3 (72
// steps, 52 tiles) forward 0.0425 ms on 64 x 64 tiles -> 0.0361 with 4 splits (the fused
// epilogue in the reduce: 0.0362 with bias + relu, 0.0369 with a residual too), backward-data
// 0.0505 -> 0.0453; splits lost wherever the reduction was shorter (r50_c4_3x3, 36 steps: 0.029
// -> 0.032-0.043 ms; r50_c5_1x1, 32 steps: 0.018 -> 0.036 and more).
// JAXDNN_WGMMA_TILE=128x128|64x128|64x64 and JAXDNN_WGMMA_SPLITS=n force either (testing).
struct FwdPlan {
  int tile;  // 0: 128x128, 1: 64x128, 2: 64x64
  int tilesM, tilesN, splits, ksplit;
  size_t part_bytes;
};
FwdPlan fwd_plan(const CudaConvCall& f) {  // f: the forward view (as_forward)
  const ConvProblem& pb = f.problem;
  const long long M = pb.N * pb.out_pixels(), Kg = pb.Kg(), G = pb.G;
  const int steps = static_cast<int>(pb.filt_taps() * pb.Cg() / k_step(f.in));
  auto ctas = [&](int bm, int bn) { return ((M + bm - 1) / bm) * ((Kg + bn - 1) / bn) * G; };
  FwdPlan w;
  const bool split = Kg > 64 && ctas(128, 128) < 132 && steps >= 64;
  w.tile = split || (Kg > 64 && ctas(128, 128) >= 132) ? 0 : Kg > 64 && ctas(64, 128) >= 132 ? 1 : 2;
  if (const char* e = std::getenv("JAXDNN_WGMMA_TILE")) {
    const std::string t(e);
    w.tile = t == "128x128" ? 0 : t == "64x128" ? 1 : t == "64x64" ? 2 : w.tile;
  }
  const int bm = w.tile == 0 ? 128 : 64, bn = w.tile == 2 ? 64 : 128;
  w.tilesM = static_cast<int>((M + bm - 1) / bm);
  w.tilesN = static_cast<int>((Kg + bn - 1) / bn);
  const long long tiles = ctas(bm, bn), slots = 2 * 132, per_split = M * Kg * G * 4;
  long long sp = split ? std::min<long long>(slots / tiles, steps / 16) : 1;
  if (const char* e = std::getenv("JAXDNN_WGMMA_SPLITS")) sp = std::atoi(e);
  sp = std::clamp<long long>(sp, 1, std::max(1, steps));
  while (sp > 1 && sp * per_split > (256LL << 20)) sp = (sp + 1) / 2;
  w.ksplit = static_cast<int>((steps + sp - 1) / sp);
  w.splits = w.ksplit > 0 ? (steps + w.ksplit - 1) / w.ksplit : 1;
  w.part_bytes = w.splits > 1 ? align256(static_cast<size_t>(w.splits * per_split)) : 0;
  return w;
}

// The workspace of the forward kernel: the rearranged filter, then split-K's fp32 partials.
// The workspace's copy of the filter (call: the user's op, not the forward view): none where B is
// the HWIO filter itself (16-bit forward); else the transposed (tf32) or flipped and
// channel-swapped (backward-data) filter.
size_t filter_bytes(const CudaConvCall& call) {
  if (call.op == ConvOp::kForward && b_from_hwio(call.in)) return 0;
  return align256(static_cast<size_t>(call.problem.w_elems()) * dtype_bytes(call.in));
}

}  // namespace

std::string wgmma_reason(const CudaConvCall& c) {
  if (c.algo != ConvAlgo::kImplicitPrecompGemm) return "not IMPLICIT_PRECOMP_GEMM";
  if (c.op == ConvOp::kBackwardFilter) return wgrad_reason(c);
  if (c.op == ConvOp::kBackwardData) {
    const ConvProblem& pb = c.problem;
    if (pb.stride[0] != 1 || pb.stride[1] != 1 || pb.stride[2] != 1) return "backward-data with stride > 1";
  }
  return forward_reason(as_forward(c));
}

size_t wgmma_workspace_bytes(const CudaConvCall& c) {
  if (!wgmma_reason(c).empty()) return 0;
  if (c.op == ConvOp::kBackwardFilter) return wgrad_plan(c.problem).part_bytes;
  return filter_bytes(c) + fwd_plan(as_forward(c)).part_bytes;
}

bool wgmma_switched_off() {
  const char* off = std::getenv("JAXDNN_NO_WGMMA");  // testing: the mma.sync kernel instead
  return off && off[0] == '1';
}

bool wgmma_try(const CudaConvCall& call, const CudaConvBuffers& io, std::string* err) {
  if (!wgmma_reason(call).empty() || !device_is_sm90() || wgmma_switched_off()) return false;
  const CudaConvCall c = as_forward(call);  // backward-data: dy in, dx out, w' (flip_swap)
  const ConvProblem& pb = c.problem;
  const size_t need = wgmma_workspace_bytes(call);
  if (need > 0 && (io.workspace == nullptr || io.workspace_size < need)) {  // 0: 16-bit forward, no split
    *err = "workspace too small for the wgmma kernel";
    return true;
  }
  // 16-byte cp.async and stores need aligned operands (XLA's buffers are); else mma.sync runs
  if ((reinterpret_cast<uintptr_t>(io.out) & 15) != 0 || (reinterpret_cast<uintptr_t>(io.a) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(io.b) & 15) != 0)
    return false;
  if (call.op == ConvOp::kBackwardFilter) {
    *err = run_wgrad(call, io);
    return true;
  }
  WgParams p{};
  p.x = io.a;
  p.wt = filter_bytes(call) ? io.workspace : io.b;
  p.y = io.out;
  set_geometry(p, pb);
  p.M = static_cast<int>(pb.N * pb.out_pixels());
  p.ntap = static_cast<int>(pb.filt_taps());
  p.Kred = p.ntap * p.Cg;
  p.out = c.out == DType::kF32 ? 1 : 0;
  p.epi = make_epi(io.epi, pb, c.out);
  for (const void* q : {io.epi.bias, io.epi.residual, static_cast<const void*>(io.epi.preact)})
    if ((reinterpret_cast<uintptr_t>(q) & 15) != 0) return false;  // the mma.sync kernel runs

  const int in = c.in == DType::kF32 ? kInTF32 : c.in == DType::kF16 ? kInF16 : kInBF16;
  // B: the 16-bit forward reads the HWIO filter as it is; else it goes into the workspace
  // (filter_bytes), in the forward view's layout for B: [taps*Cg][K] HWIO (16-bit) or [G*Kg][taps*Cg]
  // K-major (tf32). Backward-data's view: Cg, Kg = the call's Kg, Cg, taps flipped.
  auto transpose = [&](auto* w, auto* wt, const FilterTranspose& t) {
    const dim3 tb(32, 8), tg(static_cast<unsigned>((t.cols + 31) / 32), static_cast<unsigned>((t.rows + 31) / 32),
                             static_cast<unsigned>(t.taps * t.G));
    transpose_filter_kernel<<<tg, tb, 0, io.stream>>>(w, wt, t);
  };
  const int G = static_cast<int>(pb.G);
  if (in == kInTF32) {
    const float* w = static_cast<const float*>(io.b);
    float* wt = static_cast<float*>(io.workspace);
    if (call.op == ConvOp::kBackwardData) {
      const long long total = pb.w_elems();
      const int blocks = static_cast<int>(std::min<long long>((total + 255) / 256, 132LL * 16));
      flip_swap_filter_kernel<<<blocks, 256, 0, io.stream>>>(w, wt, total, p.ntap, p.Kg, p.Cg, G);
    } else {
      transpose(w, wt, FilterTranspose{p.Kred, p.K, p.K, p.Kred, 1, 1, 0, 0, 0, 0});
    }
  } else if (call.op == ConvOp::kBackwardData) {
    // view filter [tap][k][g*Cg + c] = w[taps - 1 - tap][c][g*Kg + k] (the call's Cg, Kg = p.Kg,
    // p.Cg): per tap and group, the [Cg][Kg] block (row pitch K = G*Kg) transposed
    const long long Kw = static_cast<long long>(G) * p.Cg;  // the call's K
    transpose(static_cast<const unsigned short*>(io.b), static_cast<unsigned short*>(io.workspace),
              FilterTranspose{p.Kg, p.Cg, static_cast<int>(Kw), p.K, p.ntap, G,
                              p.Kg * Kw, p.Cg, static_cast<long long>(p.Cg) * p.K, p.Kg});
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    *err = std::string("filter transpose launch: ") + cudaGetErrorString(e);
    return true;
  }
  const FwdPlan plan = fwd_plan(c);
  const int tile = plan.tile;
  p.tilesN = plan.tilesN;
  p.tilesM = plan.tilesM;
  p.part = plan.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(io.workspace) + filter_bytes(call))
                           : nullptr;
  p.ksplit = plan.ksplit;
  // Biases into the accumulators, except under split-K (its reduce adds them once) and with a
  // residual. H100, bf16, kernel-only, bias + relu against the plain kernel, epilogue ->
  // accumulators with every bias load issued first (session 22): r50_c2_1x1_up 1.22x -> 1.02x,
  // r50_c2_1x1_dn 1.18x -> 1.02x, r50_c5_1x1 1.08x -> 1.02x, r50_c2_3x3 1.07x -> 1.04x, vgg_c3_2
  // 1.19x -> 1.12x (session 21's loads, one at a time: 1.15x, 1.08x, 1.11x, 1.06x, 1.14x). With a
  // residual the accumulators gained nothing overall (JAXDNN_WGMMA_BIAS_ACC=2 against two runs of
  // the epilogue: r50_c2_1x1_up 1.59x / 1.54-1.55x, r50_c5_1x1 1.30x / 1.33x, inc_5x5 1.10x /
  // 1.04-1.05x, the other 7 layers inside the two runs' spread or 0.03x of it), so a residual
  // keeps the biases in the epilogue.
  // JAXDNN_WGMMA_BIAS_ACC=0: always the epilogue; =2: the accumulators with a residual too
  // (comparisons).
  const char* bias_acc_env = std::getenv("JAXDNN_WGMMA_BIAS_ACC");
  const char bias_acc_mode = bias_acc_env ? bias_acc_env[0] : '1';
  p.bias_acc = p.epi.bias && !p.part && (!p.epi.residual || bias_acc_mode == '2') && bias_acc_mode != '0' ? 1 : 0;
  // Persistent tile walk for short reductions (at most kPersistentMaxSteps K steps per tile)
  // into narrow output tiles (BN = 64), without an epilogue. H200 bf16, kernel-only:
  // r50_c2_1x1_dn (Kred 256, BN 64) 0.0328 -> 0.0294 ms in session 4; r50_c2_1x1_up (Kred 64,
  // BN 128) 0.054 -> 0.091 ms, where the register stores of the wide 128x128 tiles cost more
  // than the overlap gains, so it stays one tile per CTA. With an epilogue (bias + relu) the
  // walk's register-direct stores took r50_c2_1x1_dn to 1.95x the plain time, one tile per CTA
  // 1.09x (session 16). The walk now stages every tile of a fused epilogue through a C tile of
  // its own (launch: c_own), and takes epilogues without a residual: H100, kernel-only, bias +
  // relu 0.0395 -> 0.0367 ms there (1.25x -> 1.16x the plain walk); with a residual 0.0432 ->
  // 0.0446 (its loads wait at each tile, where one tile per CTA copies them into shared memory
  // during its K loop), so those keep one tile per CTA (session 19). A K step is 128 bytes of K
  // in every type (the same loads and MMA time), so the bound counts steps.
  // JAXDNN_WGMMA_PERSISTENT=0|1 forces either.
  bool persistent = p.Kred / k_step(c.in) <= kPersistentMaxSteps && tile == 2 && !p.epi.residual;
  if (const char* f = std::getenv("JAXDNN_WGMMA_PERSISTENT"); f && (f[0] == '0' || f[0] == '1'))
    persistent = f[0] == '1';
  persistent = persistent && plan.splits == 1;
  // The warp-specialized kernel (16-bit inputs, no split-K): JAXDNN_WGMMA_WS=1 (testing and
  // comparisons); JAXDNN_WGMMA_WS_BN=64|128 its tile width (default 64 for Kg <= 64, else 128).
  const char* ws_env = std::getenv("JAXDNN_WGMMA_WS");
  const bool ws = ws_env && ws_env[0] == '1' && plan.splits == 1 && in != kInTF32;
  int ws_bn = p.Kg <= 64 ? 64 : 128;
  if (const char* b = ws ? std::getenv("JAXDNN_WGMMA_WS_BN") : nullptr) ws_bn = std::atoi(b) == 64 ? 64 : 128;
  auto run = [&](auto in_tag) {
    constexpr int I = decltype(in_tag)::value;
    if constexpr (I != kInTF32) {
      if (ws) return ws_bn == 64 ? launch_ws<I, 64>(p, G, io.stream) : launch_ws<I, 128>(p, G, io.stream);
    }
    std::string e = tile == 0   ? launch<I, 128, 128>(p, G, persistent, plan.splits, io.stream)
                    : tile == 1 ? launch<I, 64, 128>(p, G, persistent, plan.splits, io.stream)
                                : launch<I, 64, 64>(p, G, persistent, plan.splits, io.stream);
    if (!e.empty() || plan.splits == 1) return e;
    const long long runs = static_cast<long long>(p.M) * (p.Kg / 8);
    const dim3 rg(static_cast<unsigned>(std::max(1LL, std::min((runs + 255) / 256, 132LL * 8 / G + 1))),
                  static_cast<unsigned>(G));
    split_reduce_kernel<I><<<rg, 256, 0, io.stream>>>(p, plan.splits);
    const cudaError_t q = cudaGetLastError();
    return q == cudaSuccess ? std::string() : std::string("split-K reduce launch: ") + cudaGetErrorString(q);
  };
  *err = in == kInTF32 ? run(std::integral_constant<int, kInTF32>{})
         : in == kInF16 ? run(std::integral_constant<int, kInF16>{})
                        : run(std::integral_constant<int, kInBF16>{});
  return true;
}

}  // namespace jaxdnn::cuda
