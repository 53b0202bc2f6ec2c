// The GEMM-family convolution kernel and its launch (conv_gemm_family.cu describes the
// algorithms). A header so that the kernel's instantiations compile in parallel translation units,
// one per operation (conv_gemm_fwd.cu, conv_gemm_dgrad.cu, conv_gemm_wgrad.cu): one unit holding
// all 17 took about 300 s of nvcc time for sm_90a alone, the critical path of the package build.
#ifndef JAXDNN_CUDA_CONV_GEMM_KERNEL_CUH_
#define JAXDNN_CUDA_CONV_GEMM_KERNEL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "conv_cuda.h"
#include "epilogue.cuh"
#include "gemm_primitives.cuh"

namespace jaxdnn::cuda::gemm_conv {

using namespace jaxdnn::cuda::gemm;

constexpr int OP_FWD = 0, OP_DGRAD = 1, OP_WGRAD = 2;
constexpr int kNT = 128;            // threads per CTA (4 warps)
constexpr int kMaxTableTaps = 4096;  // precomp table capacity (16 B per tap of shared memory)

// dtype codes = DType values
constexpr int DT_F32 = 0, DT_F64 = 1, DT_BF16 = 2;  // 3 = f16

struct Params {
  const void* a;
  const void* b;
  void* out;
  void* partial;
  int N, G, Cg, Kg;
  int D, H, W, T, R, S, Z, P, Q;
  int str[3], dil[3], pad[3];
  long long xsN, xsC, xsPix, ysN, ysC, ysPix, wsK, wsC, wsT, wsR, wsS;
  int Mmax, Ng, nphase, splits, ktps, tilesN;
  int analytic, vecA, vecB, out_dtype, use_table;
  EpiDev epi;  // fused epilogue of a forward call (off otherwise), applied where y is written
};

// ---------------------------------------------------------------- geometry of one (op, phase)
struct Geo {
  int cnt[3], first[3], step[3], num0[3], div[3], pdim[3], phi[3];
  int sgn, ntap, Mph, Kred;
};

__host__ __device__ inline int gcd_i(int a, int b) {
  while (b) {
    int t = a % b;
    a = b;
    b = t;
  }
  return a;
}
__host__ __device__ inline int pmod(int a, int m) {
  int r = a % m;
  return r < 0 ? r + m : r;
}

template <int OP>
__host__ __device__ inline Geo make_geo(const Params& p, int phase) {
  Geo g;
  const int filt[3] = {p.T, p.R, p.S};
  if (OP != OP_DGRAD) {
    for (int a = 0; a < 3; ++a) {
      g.cnt[a] = filt[a];
      g.first[a] = 0;
      g.step[a] = 1;
      g.num0[a] = 0;
      g.div[a] = 1;
      g.phi[a] = 0;
      g.pdim[a] = 0;
    }
    g.sgn = 1;
    g.ntap = p.T * p.R * p.S;
    if (OP == OP_FWD) {
      g.Mph = p.N * p.Z * p.P * p.Q;
      g.Kred = g.ntap * p.Cg;
    } else {
      g.Mph = g.ntap * p.Cg;
      g.Kred = p.N * p.Z * p.P * p.Q;
    }
  } else {
    const int dims[3] = {p.D, p.H, p.W};
    int ph = phase;
    g.phi[2] = ph % p.str[2];
    ph /= p.str[2];
    g.phi[1] = ph % p.str[1];
    g.phi[0] = ph / p.str[1];
    for (int a = 0; a < 3; ++a) {
      const int s = p.str[a], dl = p.dil[a];
      g.num0[a] = g.phi[a] + p.pad[a];
      int r0 = -1;
      for (int r = 0; r < filt[a] && r < s; ++r)
        if (pmod(g.num0[a] - r * dl, s) == 0) {
          r0 = r;
          break;
        }
      g.step[a] = s / gcd_i(s, dl);
      g.cnt[a] = r0 < 0 ? 0 : (filt[a] - 1 - r0) / g.step[a] + 1;
      g.first[a] = r0 < 0 ? 0 : r0;
      g.div[a] = s;
      g.pdim[a] = (dims[a] - g.phi[a] + s - 1) / s;
      if (g.pdim[a] < 0) g.pdim[a] = 0;
    }
    g.sgn = -1;
    g.ntap = g.cnt[0] * g.cnt[1] * g.cnt[2];
    g.Mph = p.N * g.pdim[0] * g.pdim[1] * g.pdim[2];
    g.Kred = g.ntap * p.Kg;
  }
  return g;
}

// Offsets of the j-th (valid) tap: .x/.y/.z spatial offsets added to a row's base coordinate,
// .w the weight offset of the tap.
__device__ __forceinline__ int4 tap_entry(const Params& p, const Geo& g, int j) {
  const int c12 = g.cnt[1] * g.cnt[2];
  const int jt = j / c12;
  const int rem = j - jt * c12;
  const int jr = rem / g.cnt[2];
  const int js = rem - jr * g.cnt[2];
  const int t = g.first[0] + jt * g.step[0];
  const int r = g.first[1] + jr * g.step[1];
  const int s = g.first[2] + js * g.step[2];
  int4 e;
  e.x = (g.num0[0] + g.sgn * t * p.dil[0]) / g.div[0];
  e.y = (g.num0[1] + g.sgn * r * p.dil[1]) / g.div[1];
  e.z = (g.num0[2] + g.sgn * s * p.dil[2]) / g.div[2];
  e.w = static_cast<int>(t * p.wsT + r * p.wsR + s * p.wsS);
  return e;
}

// ---------------------------------------------------------------- per-path configuration
struct PathBF16 {
  using T = __nv_bfloat16;
  using Acc = float;
  static constexpr int BM = 128, BN = 64, BK = 32, ST = 4, VEC = 8, PADK = 8, PADM = 8, KIND = 0;
  static constexpr int WN = 32;  // warp tile 64 x WN, warps 2 x 2
};
struct PathBF16L {  // 128x128 CTA tile (64x64 warp tiles), forward only
  using T = __nv_bfloat16;
  using Acc = float;
  static constexpr int BM = 128, BN = 128, BK = 32, ST = 4, VEC = 8, PADK = 8, PADM = 8, KIND = 0;
  static constexpr int WN = 64;
};
struct PathF16L {
  using T = __half;
  using Acc = float;
  static constexpr int BM = 128, BN = 128, BK = 32, ST = 4, VEC = 8, PADK = 8, PADM = 8, KIND = 1;
  static constexpr int WN = 64;
};
struct PathF16 {
  using T = __half;
  using Acc = float;
  static constexpr int BM = 128, BN = 64, BK = 32, ST = 4, VEC = 8, PADK = 8, PADM = 8, KIND = 1;
  static constexpr int WN = 32;
};
struct PathTF32 {
  using T = float;
  using Acc = float;
  static constexpr int BM = 128, BN = 64, BK = 16, ST = 4, VEC = 4, PADK = 4, PADM = 8, KIND = 2;
  static constexpr int WN = 32;
};
struct PathF32 {  // true fp32 FFMA
  using T = float;
  using Acc = float;
  static constexpr int BM = 128, BN = 64, BK = 16, ST = 4, VEC = 4, PADK = 4, PADM = 8, KIND = 3;
  static constexpr int TM = 8, TN = 8, WN = 32;
};
struct PathF64 {  // DFMA
  using T = double;
  using Acc = double;
  static constexpr int BM = 64, BN = 64, BK = 16, ST = 3, VEC = 2, PADK = 2, PADM = 2, KIND = 4;
  static constexpr int TM = 8, TN = 4, WN = 32;
};

template <int BYTES>
struct Bits;
template <>
struct Bits<2> {
  using U = unsigned short;
};
template <>
struct Bits<4> {
  using U = unsigned int;
};
template <>
struct Bits<8> {
  using U = unsigned long long;
};

template <class PT, int OP>
struct Cfg {
  using T = typename PT::T;
  using U = typename Bits<sizeof(T)>::U;
  static constexpr int BM = PT::BM, BN = PT::BN, BK = PT::BK, VEC = PT::VEC, ST = PT::ST;
  static constexpr bool AK = (OP != OP_WGRAD);  // A smem [BM][LDA] (k contiguous) else [BK][LDA]
  static constexpr bool BKM = (OP == OP_DGRAD);  // B smem [BN][LDB] (k contiguous) else [BK][LDB]
  static constexpr int LDA = AK ? BK + PT::PADK : BM + PT::PADM;
  static constexpr int LDB = BKM ? BK + PT::PADK : BN + PT::PADM;
  static constexpr int A_ELEMS = AK ? BM * LDA : BK * LDA;
  static constexpr int B_ELEMS = BKM ? BN * LDB : BK * LDB;
  static constexpr int STAGE = A_ELEMS + B_ELEMS;
  static constexpr int CPR_A = AK ? BK / VEC : BM / VEC;
  static constexpr int CH_A = BM * BK / VEC / kNT;
  static constexpr int RS_A = kNT / CPR_A;
  static constexpr int CPR_B = BKM ? BK / VEC : BN / VEC;
  static constexpr int CH_B = BN * BK / VEC / kNT;
  static constexpr int RS_B = kNT / CPR_B;
  static constexpr size_t SMEM_PIPE = size_t(ST) * STAGE * sizeof(T);
  static_assert(SMEM_PIPE % 16 == 0, "pipeline smem must keep the table 16-byte aligned");
  static_assert(CH_A * kNT * VEC == BM * BK && CH_B * kNT * VEC == BN * BK, "tile/thread mismatch");
};

template <class PT>
struct SimtDims {
  static constexpr int TM = 1, TN = 1;
};
template <>
struct SimtDims<PathF32> {
  static constexpr int TM = PathF32::TM, TN = PathF32::TN;
};
template <>
struct SimtDims<PathF64> {
  static constexpr int TM = PathF64::TM, TN = PathF64::TN;
};

// ---------------------------------------------------------------- output stores
template <class Acc>
__device__ __forceinline__ void st1(void* out, long long off, int dt, Acc v) {
  switch (dt) {
    case DT_F32: static_cast<float*>(out)[off] = static_cast<float>(v); break;
    case DT_F64: static_cast<double*>(out)[off] = static_cast<double>(v); break;
    case DT_BF16: static_cast<__nv_bfloat16*>(out)[off] = __float2bfloat16_rn(static_cast<float>(v)); break;
    default: static_cast<__half*>(out)[off] = __float2half_rn(static_cast<float>(v)); break;
  }
}
template <class Acc>
__device__ __forceinline__ void st2(void* out, long long off, int dt, Acc v0, Acc v1) {
  switch (dt) {
    case DT_F32:
      *reinterpret_cast<float2*>(static_cast<float*>(out) + off) =
          make_float2(static_cast<float>(v0), static_cast<float>(v1));
      break;
    case DT_F64:
      *reinterpret_cast<double2*>(static_cast<double*>(out) + off) =
          make_double2(static_cast<double>(v0), static_cast<double>(v1));
      break;
    case DT_BF16:
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + off) =
          __floats2bfloat162_rn(static_cast<float>(v0), static_cast<float>(v1));
      break;
    default:
      *reinterpret_cast<__half2*>(static_cast<__half*>(out) + off) =
          __floats2half2_rn(static_cast<float>(v0), static_cast<float>(v1));
      break;
  }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // a -> low half (lower address)
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ uint32_t pack_f16x2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// Output element offset = row_off(m) + col * col_stride (final results).
template <int OP>
__device__ __forceinline__ long long out_row_off(const Params& p, const Geo& g, int m) {
  if constexpr (OP == OP_FWD) {
    const int zpq = p.Z * p.P * p.Q;
    const int n = m / zpq;
    return n * p.ysN + static_cast<long long>(m - n * zpq) * p.ysPix;
  } else if constexpr (OP == OP_DGRAD) {
    int r = m;
    const int iw = r % g.pdim[2];
    r /= g.pdim[2];
    const int ih = r % g.pdim[1];
    r /= g.pdim[1];
    const int id = r % g.pdim[0];
    const int n = r / g.pdim[0];
    const int d = g.phi[0] + id * p.str[0], h = g.phi[1] + ih * p.str[1],
              w = g.phi[2] + iw * p.str[2];
    return n * p.xsN + ((static_cast<long long>(d) * p.H + h) * p.W + w) * p.xsPix;
  } else {
    const int j = m / p.Cg;
    const int c = m - j * p.Cg;
    const int rs = p.R * p.S;
    const int t = j / rs, r = (j - t * rs) / p.S, s = j - t * rs - r * p.S;
    return c * p.wsC + t * p.wsT + r * p.wsR + s * p.wsS;
  }
}
template <int OP>
__device__ __forceinline__ long long out_col_base(const Params& p, int g) {
  if constexpr (OP == OP_FWD) return static_cast<long long>(g) * p.Kg * p.ysC;
  else if constexpr (OP == OP_DGRAD) return static_cast<long long>(g) * p.Cg * p.xsC;
  else return static_cast<long long>(g) * p.Kg * p.wsK;
}
template <int OP>
__device__ __forceinline__ long long out_col_stride(const Params& p) {
  if constexpr (OP == OP_FWD) return p.ysC;
  else if constexpr (OP == OP_DGRAD) return p.xsC;
  else return p.wsK;
}

// ---------------------------------------------------------------- reduction-index iterators
struct KTap {  // kk = j*Cred + ch
  int j, ch;
};
__device__ __forceinline__ KTap ktap_at(int kk, int cred) {
  KTap s;
  s.j = kk / cred;
  s.ch = kk - s.j * cred;
  return s;
}
__device__ __forceinline__ void ktap_adv(KTap& s, int dj, int dch, int cred) {
  s.ch += dch;
  s.j += dj;
  if (s.ch >= cred) {
    s.ch -= cred;
    ++s.j;
  }
}
struct KPix {  // kk = ((n*Z + z)*P + y)*Q + x
  int n, z, y, x;
};
__device__ __forceinline__ KPix kpix_at(int kk, int Z, int P, int Q) {
  KPix s;
  int t = kk / Q;
  s.x = kk - t * Q;
  int t2 = t / P;
  s.y = t - t2 * P;
  s.n = t2 / Z;
  s.z = t2 - s.n * Z;
  return s;
}
__device__ __forceinline__ void kpix_adv(KPix& s, const int (&d)[4], int Z, int P, int Q) {
  s.x += d[3];
  s.y += d[2];
  s.z += d[1];
  s.n += d[0];
  if (s.x >= Q) { s.x -= Q; ++s.y; }
  if (s.y >= P) { s.y -= P; ++s.z; }
  if (s.z >= Z) { s.z -= Z; ++s.n; }
}

__device__ __forceinline__ bool in3(int a, int b, int c, int A, int B, int C) {
  return static_cast<unsigned>(a) < static_cast<unsigned>(A) &&
         static_cast<unsigned>(b) < static_cast<unsigned>(B) &&
         static_cast<unsigned>(c) < static_cast<unsigned>(C);
}

// Resident CTAs per SM that the launch bounds ask the compiler for (registers <= 65536/(128*n)).
// resident_ctas() on the host mirrors this (plus the 128x128 tile's 2).
template <class PT, int OP>
constexpr int min_blocks() {
  return (PT::KIND <= 2 && OP != OP_WGRAD && PT::BN == 64) ? 3 : 2;
}

// ---------------------------------------------------------------- the kernel
template <class PT, int OP>
__global__ void __launch_bounds__(kNT, min_blocks<PT, OP>()) conv_gemm_kernel(const Params p) {
  using C = Cfg<PT, OP>;
  using T = typename PT::T;
  using Acc = typename PT::Acc;
  using U = typename C::U;
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, VEC = C::VEC, ST = C::ST;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sm = reinterpret_cast<T*>(smem_raw);
  int4* tbl = reinterpret_cast<int4*>(smem_raw + C::SMEM_PIPE);

  const int tid = threadIdx.x;
  int z = blockIdx.z;
  const int split = z % p.splits;
  z /= p.splits;
  const int phase = z % p.nphase;
  const int g = z / p.nphase;
  const int n_tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.tilesN));
  const int m_base = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.tilesN)) * BM;
  const int n_base = n_tile * BN;
  const Geo geo = make_geo<OP>(p, phase);
  if (m_base >= geo.Mph) return;  // whole CTA: rows beyond this phase (never read back)

  if (p.use_table) {
    for (int j = tid; j < geo.ntap; j += kNT) tbl[j] = tap_entry(p, geo, j);
    __syncthreads();
  }
  auto entry = [&](int j) -> int4 { return p.use_table ? tbl[j] : tap_entry(p, geo, j); };

  const T* __restrict__ ga = static_cast<const T*>(p.a);
  const T* __restrict__ gb = static_cast<const T*>(p.b);
  const U* __restrict__ ua = static_cast<const U*>(p.a);
  const U* __restrict__ ub = static_cast<const U*>(p.b);

  const int KT = (geo.Kred + BK - 1) / BK;
  const int kt0 = split * p.ktps;
  const int kt1 = min(KT, kt0 + p.ktps);
  const int nk = max(0, kt1 - kt0);

  const int ccA = tid % C::CPR_A, r0A = tid / C::CPR_A;
  const int ccB = tid % C::CPR_B, r0B = tid / C::CPR_B;
  const bool vecA = p.vecA, vecB = p.vecB;

  // ---- operand A source description
  // fwd: x (dims D,H,W; strides xs; channels g*Cg + [0,Cg)); dgrad: dy (Z,P,Q; ys; g*Kg + [0,Kg))
  const int sD = OP == OP_DGRAD ? p.Z : p.D, sH = OP == OP_DGRAD ? p.P : p.H,
            sW = OP == OP_DGRAD ? p.Q : p.W;
  const long long sN = OP == OP_DGRAD ? p.ysN : p.xsN, sC = OP == OP_DGRAD ? p.ysC : p.xsC,
                  sPix = OP == OP_DGRAD ? p.ysPix : p.xsPix;
  const int credA = OP == OP_DGRAD ? p.Kg : p.Cg;  // channels per tap in the A reduction
  const long long chA = static_cast<long long>(g) * credA;

  // increments of BK in the reduction index
  int dTapJ = 0, dTapC = 0;  // KTap radix Cred (fwd: Cg; dgrad: Kg)
  int dPix[4] = {0, 0, 0, 0};
  if (OP != OP_WGRAD) {
    dTapJ = BK / credA;
    dTapC = BK - dTapJ * credA;
  } else {
    int t = BK;
    dPix[3] = t % p.Q; t /= p.Q;
    dPix[2] = t % p.P; t /= p.P;
    dPix[1] = t % p.Z; t /= p.Z;
    dPix[0] = t;
  }

  // ---- per-thread loader state
  // fwd/dgrad A: rows m (fixed), column kk state. The source offset of (row, tap, channel) is
  // linear: aRow[i] (row base: image + base pixel, hoisted out of the k-loop) + tap offset (per
  // issue, shared by all rows) + channel offset; aB only serves the bounds checks.
  long long aRow[C::CH_A];
  int aB[C::CH_A][3];
  KTap aK;  // fwd/dgrad A column
  // wgrad A: column m chunk fixed; rows kk
  int wj = 0, wc = 0;
  int4 we = make_int4(0, 0, 0, 0);
  bool wmv = false;
  KPix aP[C::CH_A];
  // B states
  KTap bK[C::CH_B];  // fwd: rows kk
  KTap bKc;          // dgrad: column kk
  KPix bP[C::CH_B];  // wgrad: rows kk

  if constexpr (OP != OP_WGRAD) {
#pragma unroll
    for (int i = 0; i < C::CH_A; ++i) {
      const int m = m_base + r0A + i * C::RS_A;
      if (m < geo.Mph) {
        if constexpr (OP == OP_FWD) {
          int r = m;
          const int q = r % p.Q; r /= p.Q;
          const int pp = r % p.P; r /= p.P;
          const int zz = r % p.Z;
          const int n = r / p.Z;
          aB[i][0] = zz * p.str[0] - p.pad[0];
          aB[i][1] = pp * p.str[1] - p.pad[1];
          aB[i][2] = q * p.str[2] - p.pad[2];
          aRow[i] = n * sN +
                    ((static_cast<long long>(aB[i][0]) * sH + aB[i][1]) * sW + aB[i][2]) * sPix;
        } else {
          int r = m;
          const int iw = r % geo.pdim[2]; r /= geo.pdim[2];
          const int ih = r % geo.pdim[1]; r /= geo.pdim[1];
          const int id = r % geo.pdim[0];
          const int n = r / geo.pdim[0];
          aB[i][0] = id;
          aB[i][1] = ih;
          aB[i][2] = iw;
          aRow[i] = n * sN + ((static_cast<long long>(id) * sH + ih) * sW + iw) * sPix;
        }
      } else {
        aRow[i] = 0;
        aB[i][0] = INT_MIN / 2;  // fails every bounds check
        aB[i][1] = 0;
        aB[i][2] = 0;
      }
    }
    aK = ktap_at(kt0 * BK + ccA * VEC, credA);
  } else {
    const int m0 = m_base + ccA * VEC;
    wmv = m0 < geo.Mph;
    if (wmv) {
      wj = m0 / p.Cg;
      wc = m0 - wj * p.Cg;
      we = entry(wj);
    }
#pragma unroll
    for (int i = 0; i < C::CH_A; ++i) aP[i] = kpix_at(kt0 * BK + r0A + i * C::RS_A, p.Z, p.P, p.Q);
  }
  if constexpr (OP == OP_FWD) {
#pragma unroll
    for (int i = 0; i < C::CH_B; ++i) bK[i] = ktap_at(kt0 * BK + r0B + i * C::RS_B, p.Cg);
  } else if constexpr (OP == OP_DGRAD) {
    bKc = ktap_at(kt0 * BK + ccB * VEC, p.Kg);
  } else {
#pragma unroll
    for (int i = 0; i < C::CH_B; ++i) bP[i] = kpix_at(kt0 * BK + r0B + i * C::RS_B, p.Z, p.P, p.Q);
  }

  uint4 stgA[C::CH_A], stgB[C::CH_B];  // register staging for the scalar path

  // Issue the loads of k-tile `kt` into stage `s`: cp.async for vector operands, register gathers
  // for scalar operands (stored later by store_staged). Then advance the incremental states.
  auto issue = [&](int kt, int s) {
    T* As = sm + s * C::STAGE;
    T* Bs = As + C::A_ELEMS;
    const int kbase = kt * BK;
    if (p.analytic) {  // IMPLICIT_GEMM: decompose the reduction indices from scratch (divisions)
      if constexpr (OP != OP_WGRAD) {
        aK = ktap_at(kbase + ccA * VEC, credA);
      } else {
#pragma unroll
        for (int i = 0; i < C::CH_A; ++i) aP[i] = kpix_at(kbase + r0A + i * C::RS_A, p.Z, p.P, p.Q);
      }
      if constexpr (OP == OP_FWD) {
#pragma unroll
        for (int i = 0; i < C::CH_B; ++i) bK[i] = ktap_at(kbase + r0B + i * C::RS_B, p.Cg);
      } else if constexpr (OP == OP_DGRAD) {
        bKc = ktap_at(kbase + ccB * VEC, p.Kg);
      } else {
#pragma unroll
        for (int i = 0; i < C::CH_B; ++i) bP[i] = kpix_at(kbase + r0B + i * C::RS_B, p.Z, p.P, p.Q);
      }
    }
    // ------------------------------------------------ A
    if constexpr (OP != OP_WGRAD) {
      const bool tv = aK.j < geo.ntap;
      const int4 e = tv ? entry(aK.j) : make_int4(0, 0, 0, 0);
      if (vecA) {
        // offset shared by all rows of this issue: tap displacement + channel
        const long long toff =
            ((static_cast<long long>(e.x) * sH + e.y) * sW + e.z) * sPix + (chA + aK.ch) * sC;
#pragma unroll
        for (int i = 0; i < C::CH_A; ++i) {
          const int c0 = aB[i][0] + e.x, c1 = aB[i][1] + e.y, c2 = aB[i][2] + e.z;
          const bool v = tv && in3(c0, c1, c2, sD, sH, sW);
          cp_async16(As + (r0A + i * C::RS_A) * C::LDA + ccA * VEC, ga + (v ? aRow[i] + toff : 0),
                     v);
        }
      } else {
        U vals[C::CH_A][VEC];
        int j = aK.j, ch = aK.ch;
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
          const bool tq = j < geo.ntap;
          const int4 ee = tq ? entry(j) : make_int4(0, 0, 0, 0);
          const long long coff =
              (chA + ch) * sC + ((static_cast<long long>(ee.x) * sH + ee.y) * sW + ee.z) * sPix;
#pragma unroll
          for (int i = 0; i < C::CH_A; ++i) {
            const int c0 = aB[i][0] + ee.x, c1 = aB[i][1] + ee.y, c2 = aB[i][2] + ee.z;
            U v = 0;
            if (tq && in3(c0, c1, c2, sD, sH, sW)) v = ua[aRow[i] + coff];
            vals[i][q] = v;
          }
          if (++ch == credA) { ch = 0; ++j; }
        }
#pragma unroll
        for (int i = 0; i < C::CH_A; ++i) memcpy(&stgA[i], vals[i], 16);
      }
      if (!p.analytic) ktap_adv(aK, dTapJ, dTapC, credA);
    } else {
      // wgrad A: [BK][BM] rows kk (n,z,y,x), column chunk m = (tap wj, channel wc..)
      if (vecA) {
#pragma unroll
        for (int i = 0; i < C::CH_A; ++i) {
          const KPix& k = aP[i];
          const int c0 = k.z * p.str[0] - p.pad[0] + we.x, c1 = k.y * p.str[1] - p.pad[1] + we.y,
                    c2 = k.x * p.str[2] - p.pad[2] + we.z;
          const bool v = wmv && k.n < p.N && in3(c0, c1, c2, p.D, p.H, p.W);
          const long long off =
              v ? k.n * p.xsN + (static_cast<long long>(g) * p.Cg + wc) * p.xsC +
                      ((static_cast<long long>(c0) * p.H + c1) * p.W + c2) * p.xsPix
                : 0;
          cp_async16(As + (r0A + i * C::RS_A) * C::LDA + ccA * VEC, ga + off, v);
        }
      } else {
#pragma unroll
        for (int i = 0; i < C::CH_A; ++i) {
          const KPix& k = aP[i];
          U vals[VEC];
          int j = wj, c = wc, m = m_base + ccA * VEC;
#pragma unroll
          for (int q = 0; q < VEC; ++q) {
            U v = 0;
            if (m < geo.Mph && k.n < p.N) {
              const int4 ee = entry(j);
              const int c0 = k.z * p.str[0] - p.pad[0] + ee.x,
                        c1 = k.y * p.str[1] - p.pad[1] + ee.y,
                        c2 = k.x * p.str[2] - p.pad[2] + ee.z;
              if (in3(c0, c1, c2, p.D, p.H, p.W))
                v = ua[k.n * p.xsN + (static_cast<long long>(g) * p.Cg + c) * p.xsC +
                       ((static_cast<long long>(c0) * p.H + c1) * p.W + c2) * p.xsPix];
            }
            vals[q] = v;
            ++m;
            if (++c == p.Cg) { c = 0; ++j; }
          }
          memcpy(&stgA[i], vals, 16);
        }
      }
      if (!p.analytic) {
#pragma unroll
        for (int i = 0; i < C::CH_A; ++i) kpix_adv(aP[i], dPix, p.Z, p.P, p.Q);
      }
    }
    // ------------------------------------------------ B
    if constexpr (OP == OP_FWD) {
      // w as [BK][BN]: rows kk = (tap j, channel c), column chunk k = n0..
      const int n0 = n_base + ccB * VEC;
      const long long kb = static_cast<long long>(g) * p.Kg;
      const long long bcol = (kb + n0) * p.wsK;
#pragma unroll
      for (int i = 0; i < C::CH_B; ++i) {
        const KTap& k = bK[i];
        const bool tv = k.j < geo.ntap;
        const long long rowoff = tv ? k.ch * p.wsC + entry(k.j).w : 0;
        if (vecB) {
          const bool v = tv && n0 < p.Kg;
          cp_async16(Bs + (r0B + i * C::RS_B) * C::LDB + ccB * VEC, gb + (v ? rowoff + bcol : 0), v);
        } else {
          U vals[VEC];
#pragma unroll
          for (int q = 0; q < VEC; ++q)
            vals[q] = (tv && n0 + q < p.Kg) ? ub[rowoff + (kb + n0 + q) * p.wsK] : U(0);
          memcpy(&stgB[i], vals, 16);
        }
      }
      if (!p.analytic) {
#pragma unroll
        for (int i = 0; i < C::CH_B; ++i) ktap_adv(bK[i], dTapJ, dTapC, p.Cg);
      }
    } else if constexpr (OP == OP_DGRAD) {
      // w as [BN][BK]: rows c, column chunk kk = (tap j, k)
      const long long kb = static_cast<long long>(g) * p.Kg;
      const bool tv = bKc.j < geo.ntap;
      const int woff = tv ? entry(bKc.j).w : 0;
#pragma unroll
      for (int i = 0; i < C::CH_B; ++i) {
        const int c = n_base + r0B + i * C::RS_B;
        if (vecB) {
          const bool v = tv && c < p.Cg;
          cp_async16(Bs + (r0B + i * C::RS_B) * C::LDB + ccB * VEC,
                     gb + (v ? woff + c * p.wsC + (kb + bKc.ch) * p.wsK : 0), v);
        } else {
          U vals[VEC];
          int j = bKc.j, k = bKc.ch;
#pragma unroll
          for (int q = 0; q < VEC; ++q) {
            U v = 0;
            if (j < geo.ntap && c < p.Cg) v = ub[entry(j).w + c * p.wsC + (kb + k) * p.wsK];
            vals[q] = v;
            if (++k == p.Kg) { k = 0; ++j; }
          }
          memcpy(&stgB[i], vals, 16);
        }
      }
      if (!p.analytic) ktap_adv(bKc, BK / p.Kg, BK % p.Kg, p.Kg);
    } else {
      // wgrad B = dy as [BK][BN]: rows kk (n, pix), column chunk k
      const int n0 = n_base + ccB * VEC;
      const long long kb = static_cast<long long>(g) * p.Kg;
#pragma unroll
      for (int i = 0; i < C::CH_B; ++i) {
        const KPix& k = bP[i];
        const bool rv = k.n < p.N;
        const long long rowoff =
            rv ? k.n * p.ysN + ((static_cast<long long>(k.z) * p.P + k.y) * p.Q + k.x) * p.ysPix : 0;
        if (vecB) {
          const bool v = rv && n0 < p.Kg;
          cp_async16(Bs + (r0B + i * C::RS_B) * C::LDB + ccB * VEC,
                     gb + (v ? rowoff + (kb + n0) * p.ysC : 0), v);
        } else {
          U vals[VEC];
#pragma unroll
          for (int q = 0; q < VEC; ++q)
            vals[q] = (rv && n0 + q < p.Kg) ? ub[rowoff + (kb + n0 + q) * p.ysC] : U(0);
          memcpy(&stgB[i], vals, 16);
        }
      }
      if (!p.analytic) {
#pragma unroll
        for (int i = 0; i < C::CH_B; ++i) kpix_adv(bP[i], dPix, p.Z, p.P, p.Q);
      }
    }
  };
  auto store_staged = [&](int s) {
    T* As = sm + s * C::STAGE;
    T* Bs = As + C::A_ELEMS;
    if (!vecA) {
#pragma unroll
      for (int i = 0; i < C::CH_A; ++i)
        *reinterpret_cast<uint4*>(As + (r0A + i * C::RS_A) * C::LDA + ccA * VEC) = stgA[i];
    }
    if (!vecB) {
#pragma unroll
      for (int i = 0; i < C::CH_B; ++i)
        *reinterpret_cast<uint4*>(Bs + (r0B + i * C::RS_B) * C::LDB + ccB * VEC) = stgB[i];
    }
  };

  // ---- accumulators and compute
  const int lane = tid & 31, warp = tid >> 5;
  constexpr bool MMA = PT::KIND <= 2;
  constexpr int WN = PT::WN;
  constexpr int AM = MMA ? 4 : 1, AN = MMA ? WN / 8 : 1;
  static_assert(!MMA || BN == 2 * WN, "MMA paths use 2x2 warps");
  constexpr int TM = SimtDims<PT>::TM;
  constexpr int TN = SimtDims<PT>::TN;
  // MMA paths: warp tile 64x32 (warps 2x2), acc[i][j][4]; SIMT: acc[TM][TN]
  float accf[AM][AN][4];
  Acc accs[TM][TN];
  if constexpr (MMA) {
#pragma unroll
    for (int i = 0; i < AM; ++i)
#pragma unroll
      for (int j = 0; j < AN; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) accf[i][j][c] = 0.f;
  } else {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) accs[i][j] = Acc(0);
  }
  const int warp_m = warp & 1, warp_n = warp >> 1;
  constexpr int SN = BN / TN;  // SIMT threads along n
  const int ty = tid / SN, tx = tid % SN;

  auto compute = [&](int s) {
    const T* As = sm + s * C::STAGE;
    const T* Bs = As + C::A_ELEMS;
    if constexpr (PT::KIND <= 1) {
#pragma unroll
      for (int ks = 0; ks < BK / 16; ++ks) {
        const int k0 = ks * 16;
        uint32_t af[4][4], bf[AN][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int m0 = warp_m * 64 + i * 16;
          if constexpr (C::AK)
            ldsm_x4(af[i], As + (m0 + (lane & 7) + ((lane >> 3) & 1) * 8) * C::LDA + k0 + (lane >> 4) * 8);
          else
            ldsm_x4_t(af[i], As + (k0 + (lane & 7) + (lane >> 4) * 8) * C::LDA + m0 + ((lane >> 3) & 1) * 8);
        }
#pragma unroll
        for (int jp = 0; jp < AN / 2; ++jp) {
          const int n0 = warp_n * WN + jp * 16;
          uint32_t r[4];
          if constexpr (C::BKM)
            ldsm_x4(r, Bs + (n0 + (lane & 7) + (lane >> 4) * 8) * C::LDB + k0 + ((lane >> 3) & 1) * 8);
          else
            ldsm_x4_t(r, Bs + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * C::LDB + n0 + (lane >> 4) * 8);
          bf[2 * jp][0] = r[0];
          bf[2 * jp][1] = r[1];
          bf[2 * jp + 1][0] = r[2];
          bf[2 * jp + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < AN; ++j) mma16816<PT::KIND == 1>(accf[i][j], af[i], bf[j][0], bf[j][1]);
      }
    } else if constexpr (PT::KIND == 2) {
      const int gq = lane >> 2, tq = lane & 3;
      auto Aat = [&](int m, int k) -> float {
        return C::AK ? As[m * C::LDA + k] : As[k * C::LDA + m];
      };
      auto Bat = [&](int n, int k) -> float {
        return C::BKM ? Bs[n * C::LDB + k] : Bs[k * C::LDB + n];
      };
#pragma unroll
      for (int ks = 0; ks < BK / 8; ++ks) {
        const int k0 = ks * 8;
        uint32_t af[4][4], bf[AN][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int m = warp_m * 64 + i * 16 + gq;
          af[i][0] = to_tf32(Aat(m, k0 + tq));
          af[i][1] = to_tf32(Aat(m + 8, k0 + tq));
          af[i][2] = to_tf32(Aat(m, k0 + tq + 4));
          af[i][3] = to_tf32(Aat(m + 8, k0 + tq + 4));
        }
#pragma unroll
        for (int j = 0; j < AN; ++j) {
          const int n = warp_n * WN + j * 8 + gq;
          bf[j][0] = to_tf32(Bat(n, k0 + tq));
          bf[j][1] = to_tf32(Bat(n, k0 + tq + 4));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < AN; ++j) mma1688_tf32(accf[i][j], af[i], bf[j][0], bf[j][1]);
      }
    } else {
      constexpr int SM_ = BM / TM;
#pragma unroll 4
      for (int k = 0; k < BK; ++k) {
        Acc av[TM], bv[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          const int m = ty + i * SM_;
          av[i] = C::AK ? As[m * C::LDA + k] : As[k * C::LDA + m];
        }
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const int n = tx + j * SN;
          bv[j] = C::BKM ? Bs[n * C::LDB + k] : Bs[k * C::LDB + n];
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) accs[i][j] = fma(av[i], bv[j], accs[i][j]);
      }
    }
  };

  // ---- pipeline
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < nk) {
      issue(kt0 + s, s);
      store_staged(s);
    }
    cp_async_commit();
  }
  for (int it = 0; it < nk; ++it) {
    cp_async_wait<ST - 2>();
    __syncthreads();
    const int nx = it + ST - 1;
    const int sn = nx % ST;
    const bool more = nx < nk;
    if (more) issue(kt0 + nx, sn);
    cp_async_commit();
    compute(it % ST);
    if (more) store_staged(sn);
  }
  cp_async_wait<0>();

  // ---- epilogue
  const bool part = p.splits > 1;
  const int zidx = g * p.nphase + phase;
  const long long pbase = (static_cast<long long>(zidx) * p.splits + split) * p.Mmax;
  const int ncols = OP == OP_DGRAD ? p.Cg : p.Kg;
  const long long cbase = part ? 0 : out_col_base<OP>(p, g);
  const long long cstr = part ? 1 : out_col_stride<OP>(p);
  const int odt = part ? (sizeof(Acc) == 8 ? DT_F64 : DT_F32) : p.out_dtype;
  void* outp = part ? p.partial : p.out;
  const bool epi = !part && p.epi.on;  // split-K applies it in splitk_reduce_kernel
  // output channel of column n: n + kch (the epilogue runs on forward results only, ncols = Kg)
  const long long kch = static_cast<long long>(g) * ncols;
  auto rowoff = [&](int m) -> long long {
    return part ? (pbase + m) * p.Ng : out_row_off<OP>(p, geo, m);
  };
  if constexpr (MMA) {
    if (cstr == 1) {
      // Shared-memory-staged epilogue (dense output columns: NHWC y/dx, DHWIO dw, split-K
      // partials). The fp32 fragments go to a padded [BM][LDC] fp32 tile that overlays the
      // (drained) pipeline buffers; then each thread converts 8 consecutive columns of one row and
      // writes them with 16-byte stores, a warp covering whole rows of the tile (coalesced).
      // Values and rounding are those of the direct path (results bit-identical).
      constexpr int LDC = BN + 8;  // LDC % 32 == 8: conflict-free float2 fragment stores
      static_assert(size_t(BM) * LDC * sizeof(float) <= C::SMEM_PIPE, "C tile must fit the pipeline");
      static_assert(BN % 8 == 0 && kNT % (BN / 8) == 0 && BM % (kNT / (BN / 8)) == 0, "C tile map");
      float* Cs = reinterpret_cast<float*>(smem_raw);
      __syncthreads();  // every warp is done with the pipeline buffers (all cp.async drained above)
      {
        const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float* row = Cs + (warp_m * 64 + i * 16 + gq + h * 8) * LDC + warp_n * WN + tq * 2;
#pragma unroll
            for (int j = 0; j < AN; ++j)
              *reinterpret_cast<float2*>(row + j * 8) =
                  make_float2(accf[i][j][h * 2], accf[i][j][h * 2 + 1]);
          }
      }
      __syncthreads();
      constexpr int CPR = BN / 8;     // 8-column chunks per row
      constexpr int RPP = kNT / CPR;  // rows per pass
      const int cc = tid % CPR, rr = tid / CPR;
      const int sw = (cc >> 2) & 1;  // read the two halves in swapped order: no bank conflicts
      const int n0 = n_base + cc * 8;
      // 16-byte stores need an aligned base, 8 columns in range and an aligned element offset
      // (checked per chunk: row pitches need not be multiples of 8).
      const bool vec_ok = (reinterpret_cast<uintptr_t>(outp) & 15) == 0 && n0 + 8 <= ncols &&
                          odt != DT_F64;
      const long long amask = odt == DT_F32 ? 3 : 7;
      const int cnt = ncols - n0 < 8 ? ncols - n0 : 8;
      // this thread's 8 columns are the same on every row it stores: their biases load once
      float bias[8];
      if (epi && n0 < ncols) epi_bias_run<8>(p.epi, kch + n0, cnt, bias);
      if (n0 < ncols) {
#pragma unroll 2
        for (int ps = 0; ps < BM / RPP; ++ps) {
          const int r = rr + ps * RPP;
          const int m = m_base + r;
          if (m >= geo.Mph) break;  // rows increase with ps
          const float* src = Cs + r * LDC + cc * 8;
          const float4 u0 = *reinterpret_cast<const float4*>(src + sw * 4);
          const float4 u1 = *reinterpret_cast<const float4*>(src + (sw ^ 1) * 4);
          float4 lo = sw ? u1 : u0, hi = sw ? u0 : u1;
          float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
          const long long off = rowoff(m) + cbase + n0;
          if (epi) {
            epi_apply_run<8>(p.epi, off, bias, v, cnt);
            lo = make_float4(v[0], v[1], v[2], v[3]);
            hi = make_float4(v[4], v[5], v[6], v[7]);
          }
          if (vec_ok && (off & amask) == 0) {
            if (odt == DT_F32) {
              float4* d = reinterpret_cast<float4*>(static_cast<float*>(outp) + off);
              d[0] = lo;
              d[1] = hi;
            } else {
              uint4 pk;
              if (odt == DT_BF16) {
                pk.x = pack_bf16x2(v[0], v[1]);
                pk.y = pack_bf16x2(v[2], v[3]);
                pk.z = pack_bf16x2(v[4], v[5]);
                pk.w = pack_bf16x2(v[6], v[7]);
              } else {
                pk.x = pack_f16x2(v[0], v[1]);
                pk.y = pack_f16x2(v[2], v[3]);
                pk.z = pack_f16x2(v[4], v[5]);
                pk.w = pack_f16x2(v[6], v[7]);
              }
              *reinterpret_cast<uint4*>(static_cast<unsigned short*>(outp) + off) = pk;
            }
          } else {
#pragma unroll
            for (int q = 0; q < 8; ++q)
              if (n0 + q < ncols) st1<float>(outp, off + q, odt, v[q]);
          }
        }
      }
      return;
    }
    const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m_base + warp_m * 64 + i * 16 + gq + h * 8;
        if (m >= geo.Mph) continue;
        const long long ro = rowoff(m) + cbase;
#pragma unroll
        for (int j = 0; j < AN; ++j) {
          const int n = n_base + warp_n * WN + j * 8 + tq * 2;
          float v0 = accf[i][j][h * 2], v1 = accf[i][j][h * 2 + 1];
          if (n >= ncols) continue;
          const long long off = ro + n * cstr;
          if (epi) {
            v0 = epi_apply<float>(p.epi, off, kch + n, v0);
            if (n + 1 < ncols) v1 = epi_apply<float>(p.epi, off + cstr, kch + n + 1, v1);
          }
          if (cstr == 1 && n + 1 < ncols && (off & 1) == 0) {
            st2<float>(outp, off, odt, v0, v1);
          } else {
            st1<float>(outp, off, odt, v0);
            if (n + 1 < ncols) st1<float>(outp, off + cstr, odt, v1);
          }
        }
      }
  } else {
    constexpr int SM_ = BM / TM;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int m = m_base + ty + i * SM_;
      if (m >= geo.Mph) continue;
      const long long ro = rowoff(m) + cbase;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int n = n_base + tx + j * SN;
        if (n < ncols) {
          const long long off = ro + n * cstr;
          st1<Acc>(outp, off, odt, epi ? epi_apply<Acc>(p.epi, off, kch + n, accs[i][j]) : accs[i][j]);
        }
      }
    }
  }
}

// Fixed-order split-K reduction: out = sum_{split} partial[zidx][split][m][n].
template <class Acc, int OP>
__global__ void splitk_reduce_kernel(const Params p) {
  const Acc* part = static_cast<const Acc*>(p.partial);
  const long long per = static_cast<long long>(p.Mmax) * p.Ng;
  const long long total = static_cast<long long>(p.G) * p.nphase * per;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int zidx = static_cast<int>(idx / per);
    const long long r = idx - zidx * per;
    const int m = static_cast<int>(r / p.Ng);
    const int n = static_cast<int>(r - static_cast<long long>(m) * p.Ng);
    const int phase = zidx % p.nphase, g = zidx / p.nphase;
    const Geo geo = make_geo<OP>(p, phase);
    if (m >= geo.Mph) continue;
    Acc s = 0;
    const Acc* src = part + (static_cast<long long>(zidx) * p.splits) * per + r;
    for (int k = 0; k < p.splits; ++k) s += src[k * per];
    const long long off =
        out_row_off<OP>(p, geo, m) + out_col_base<OP>(p, g) + n * out_col_stride<OP>(p);
    st1<Acc>(p.out, off, p.out_dtype,
             p.epi.on ? epi_apply<Acc>(p.epi, off, static_cast<long long>(g) * p.Kg + n, s) : s);
  }
}

// ---------------------------------------------------------------- launch plan
enum PathId { P_BF16 = 0, P_F16 = 1, P_TF32 = 2, P_F32 = 3, P_F64 = 4 };

struct Plan {
  std::string err;
  int path = 0, op = 0;
  bool gemm_algo = false, degenerate = false;
  Params prm{};   // main GEMM launch (for the GEMM family: the 1x1 problem)
  Params orig{};  // original problem (im2col / col2im)
  int gridx = 0, gridy = 0, gridz = 0;
  size_t smem = 0;
  size_t col_bytes = 0, part_bytes = 0, part_off = 0, total = 0;
  int cpg = 0, hwio = 1;
  int tile = 0;  // 0: 128x64 CTA tile; 1: 128x128 (16-bit forward only)
};

template <class PT, int OP>
std::string launch_gemm(const Plan& pl, const Params& p, cudaStream_t st) {
  auto kern = conv_gemm_kernel<PT, OP>;
  // Raise the dynamic shared-memory limit once per device to the largest this kernel can ask for
  // (pipeline + the full tap table); the attribute does not change occupancy by itself.
  static std::atomic<unsigned long long> attr_done{0};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return std::string("cudaGetDevice: ") + cudaGetErrorString(e);
  const unsigned long long bit = 1ULL << (dev & 63);
  if (!(attr_done.load(std::memory_order_acquire) & bit)) {
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(Cfg<PT, OP>::SMEM_PIPE + kMaxTableTaps * 16));
    if (e != cudaSuccess) return std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e);
    attr_done.fetch_or(bit, std::memory_order_acq_rel);
  }
  kern<<<dim3(pl.gridx, pl.gridy, pl.gridz), kNT, pl.smem, st>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return std::string("conv_gemm_kernel launch: ") + cudaGetErrorString(e);
  if (p.splits > 1) {
    const long long total = static_cast<long long>(p.G) * p.nphase * p.Mmax * p.Ng;
    const int blocks = static_cast<int>(std::min<long long>((total + 255) / 256, 132 * 16));
    splitk_reduce_kernel<typename PT::Acc, OP><<<blocks, 256, 0, st>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) return std::string("split-K reduce launch: ") + cudaGetErrorString(e);
  }
  return "";
}

template <int OP>
std::string launch_path(const Plan& pl, const Params& p, cudaStream_t st) {
  if constexpr (OP == OP_FWD) {
    if (pl.tile == 1) {
      return pl.path == P_F16 ? launch_gemm<PathF16L, OP>(pl, p, st)
                              : launch_gemm<PathBF16L, OP>(pl, p, st);
    }
  }
  switch (pl.path) {
    case P_BF16: return launch_gemm<PathBF16, OP>(pl, p, st);
    case P_F16: return launch_gemm<PathF16, OP>(pl, p, st);
    case P_TF32: return launch_gemm<PathTF32, OP>(pl, p, st);
    case P_F32: return launch_gemm<PathF32, OP>(pl, p, st);
    default: return launch_gemm<PathF64, OP>(pl, p, st);
  }
}

// One per operation, each in its own translation unit.
std::string launch_fwd(const Plan& pl, const Params& p, cudaStream_t st);
std::string launch_dgrad(const Plan& pl, const Params& p, cudaStream_t st);
std::string launch_wgrad(const Plan& pl, const Params& p, cudaStream_t st);

}  // namespace jaxdnn::cuda::gemm_conv

#endif  // JAXDNN_CUDA_CONV_GEMM_KERNEL_CUH_
