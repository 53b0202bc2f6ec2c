// IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM and GEMM convolution families (see conv_cuda.h).
//
// One tiled GEMM kernel, conv_gemm_kernel<Path, OP>, serves all three families and all three
// operations. Its operands are gathered from the convolution tensors through per-tensor strides,
// so both layouts (and the mixed layouts that the GEMM family's 1x1 re-use needs) go through the
// same code; a 16-byte cp.async path is taken per operand when its smem-contiguous dimension is a
// dense channel dimension (NHWC, channel counts divisible by 16 bytes), else a register-staged
// scalar gather.
//
// GEMM views (per group g, blockIdx.z = (g, phase, split)):
//   forward:        M = N*Z*P*Q, N = K/G, Kred = (tap, c)  c fastest, A = x (im2col), B = w
//   backward-data:  strided dgrad: input pixels split by stride phase (d%sd, h%sh, w%sw); per phase
//                   M = N*ceil(D/sd)*..., N = C/G, Kred = (valid tap of this phase, k); no zero
//                   multiplies. A = dy (gathered), B = w.
//   backward-filter M = (tap, c), N = K/G, Kred = N*Z*P*Q, A = x (gathered), B = dy.
// Shared-memory orientation per op: A is [BM][BK] (K-major) for fwd/dgrad and [BK][BM] for wgrad;
// B is [BK][BN] for fwd/wgrad and [BN][BK] for dgrad; 16-bit fragments via ldmatrix(.trans).
//
// Families:
//   IMPLICIT_GEMM:          filter-tap decomposition (kk -> tap -> t,r,s -> offsets) with integer
//                           division in the main loop.
//   IMPLICIT_PRECOMP_GEMM:  a per-CTA shared-memory table of per-tap offsets (spatial offsets and
//                           weight offset) built at kernel start; the main loop advances its
//                           reduction indices incrementally (add + one carry), no divisions.
//   GEMM:                   explicit im2col into the workspace (fwd, wgrad) then the same kernel on
//                           the equivalent 1x1 problem; dgrad = 1x1 dgrad into a column buffer
//                           (fp32/f64) followed by a deterministic col2im gather.
// Epilogue (tensor-core paths): when the output's column dimension is dense (NHWC y/dx, DHWIO dw,
// split-K partials) the fp32 tile is staged through shared memory (over the drained pipeline
// buffers) and written with coalesced 16-byte stores; otherwise (NCHW/OIDHW outputs) and for the
// SIMT paths, fragments are stored directly.
// Split-K (any op, chosen from the problem shape only): fp32/f64 partials in the workspace, then a
// fixed-order reduction kernel: every result is deterministic (no atomics).
//
// Tiles (4 warps, 2x2, 128 threads; cp.async multi-stage pipeline, padded smem rows, no conflicts):
//   bf16/f16: 128x64x32, 4 stages, warp tile 64x32, ldmatrix(.trans) + mma.sync m16n8k16 (fp32 acc);
//             forward also 128x128x32 (warp tile 64x64), picked when it fixes wave quantization.
//   tf32:     128x64x16, 4 stages, mma.sync m16n8k8 tf32 (cvt.rna), fp32 acc (sm_90 NHWC forward
//             with Cg % 32 == 0: the wgmma kernel, conv_wgmma.cu).
//   f32 (kHighest): 128x64x16, 4 stages, SIMT FFMA 8x8 per thread. f64: 64x64x16, 3 stages, DFMA.
// Workspace = [GEMM family: column buffer, N*Z*P*Q*G*T*R*S*Cg elements of the input type (fwd,
//   wgrad) or of the accumulation type (dgrad)] + [split-K > 1: splits*G*phases*Mmax*Ngemm
//   accumulation-type partials], each rounded up to 256 bytes.
// Testing override: JAXDNN_GEMM_TILE=S|L forces the 16-bit forward tile (default: automatic).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <string>

#include "conv_cuda.h"
#include "conv_gemm_kernel.cuh"
#include "epilogue.cuh"

namespace jaxdnn::cuda {
namespace {

using namespace jaxdnn::cuda::gemm_conv;

// im2col for the GEMM family: col[(n,z,y,x)][g][c'] with c' = (tap, c) for DHWIO weights and
// (c, tap) for OIDHW weights (so that the weights are the 1x1 problem's weights unchanged).
template <class U>
__global__ void im2col_kernel(const Params p, const U* __restrict__ x, U* __restrict__ col,
                              long long total, int cpg, int hwio) {
  const int ntap = p.T * p.R * p.S;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int cp = static_cast<int>(idx % cpg);
    long long r = idx / cpg;
    const int g = static_cast<int>(r % p.G);
    long long m = r / p.G;
    int j, c;
    if (hwio) { j = cp / p.Cg; c = cp - j * p.Cg; }
    else { c = cp / ntap; j = cp - c * ntap; }
    const int t = j / (p.R * p.S), rr = (j / p.S) % p.R, s = j % p.S;
    const int q = static_cast<int>(m % p.Q); m /= p.Q;
    const int pp = static_cast<int>(m % p.P); m /= p.P;
    const int z = static_cast<int>(m % p.Z);
    const long long n = m / p.Z;
    const int d = z * p.str[0] + t * p.dil[0] - p.pad[0];
    const int h = pp * p.str[1] + rr * p.dil[1] - p.pad[1];
    const int w = q * p.str[2] + s * p.dil[2] - p.pad[2];
    U v = 0;
    if (in3(d, h, w, p.D, p.H, p.W))
      v = x[n * p.xsN + (static_cast<long long>(g) * p.Cg + c) * p.xsC +
            ((static_cast<long long>(d) * p.H + h) * p.W + w) * p.xsPix];
    col[idx] = v;
  }
}

// col2im gather for the GEMM family's dgrad: dx = sum over the taps that reach each input pixel.
template <class Acc>
__global__ void col2im_kernel(const Params p, const Acc* __restrict__ dcol, long long total,
                              int cpg, int hwio) {
  const int ntap = p.T * p.R * p.S;
  const int C = p.G * p.Cg;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int ca = static_cast<int>(idx % C);
    long long r = idx / C;
    const int w = static_cast<int>(r % p.W); r /= p.W;
    const int h = static_cast<int>(r % p.H); r /= p.H;
    const int d = static_cast<int>(r % p.D);
    const long long n = r / p.D;
    const int g = ca / p.Cg, c = ca - g * p.Cg;
    Acc s = 0;
    for (int t = 0; t < p.T; ++t) {
      const int nz = d + p.pad[0] - t * p.dil[0];
      if (nz % p.str[0] != 0) continue;
      const int z = nz / p.str[0];
      if (z < 0 || z >= p.Z) continue;
      for (int rr = 0; rr < p.R; ++rr) {
        const int ny = h + p.pad[1] - rr * p.dil[1];
        if (ny % p.str[1] != 0) continue;
        const int y = ny / p.str[1];
        if (y < 0 || y >= p.P) continue;
        for (int ss = 0; ss < p.S; ++ss) {
          const int nx = w + p.pad[2] - ss * p.dil[2];
          if (nx % p.str[2] != 0) continue;
          const int xq = nx / p.str[2];
          if (xq < 0 || xq >= p.Q) continue;
          const int j = (t * p.R + rr) * p.S + ss;
          const int cp = hwio ? j * p.Cg + c : c * ntap + j;
          s += dcol[(((n * p.Z + z) * p.P + y) * static_cast<long long>(p.Q) + xq) * p.G * cpg +
                    static_cast<long long>(g) * cpg + cp];
        }
      }
    }
    st1<Acc>(p.out, n * p.xsN + ca * p.xsC + ((static_cast<long long>(d) * p.H + h) * p.W + w) * p.xsPix,
             p.out_dtype, s);
  }
}

__global__ void zero_bytes_kernel(unsigned char* p, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = 0;
}

// ---------------------------------------------------------------- host side
struct TileDims {
  int BM, BN, BK;
};
TileDims tile_dims(int path, int tile) {
  switch (path) {
    case P_BF16:
    case P_F16: return tile ? TileDims{128, 128, 32} : TileDims{128, 64, 32};
    case P_TF32:
    case P_F32: return {128, 64, 16};
    default: return {64, 64, 16};
  }
}
// CTAs resident per SM (from the kernels' register/shared-memory use on sm_90; a constant so that
// the plan, and with it the workspace size, depends on the problem only).
int resident_ctas(int path, int op, int tile) {
  if (path <= P_TF32) return op == OP_WGRAD ? 2 : (tile ? 2 : 3);
  return 2;
}
size_t pipe_smem(int path, int op, int tile) {
  if (tile == 1) return path == P_F16 ? Cfg<PathF16L, 0>::SMEM_PIPE : Cfg<PathBF16L, 0>::SMEM_PIPE;
  switch (path) {
    case P_BF16:
      return op == OP_FWD ? Cfg<PathBF16, 0>::SMEM_PIPE : op == OP_DGRAD ? Cfg<PathBF16, 1>::SMEM_PIPE : Cfg<PathBF16, 2>::SMEM_PIPE;
    case P_F16:
      return op == OP_FWD ? Cfg<PathF16, 0>::SMEM_PIPE : op == OP_DGRAD ? Cfg<PathF16, 1>::SMEM_PIPE : Cfg<PathF16, 2>::SMEM_PIPE;
    case P_TF32:
      return op == OP_FWD ? Cfg<PathTF32, 0>::SMEM_PIPE : op == OP_DGRAD ? Cfg<PathTF32, 1>::SMEM_PIPE : Cfg<PathTF32, 2>::SMEM_PIPE;
    case P_F32:
      return op == OP_FWD ? Cfg<PathF32, 0>::SMEM_PIPE : op == OP_DGRAD ? Cfg<PathF32, 1>::SMEM_PIPE : Cfg<PathF32, 2>::SMEM_PIPE;
    default:
      return op == OP_FWD ? Cfg<PathF64, 0>::SMEM_PIPE : op == OP_DGRAD ? Cfg<PathF64, 1>::SMEM_PIPE : Cfg<PathF64, 2>::SMEM_PIPE;
  }
}

int select_path(const CudaConvCall& c) {
  switch (c.in) {
    case DType::kBF16: return P_BF16;
    case DType::kF16: return P_F16;
    case DType::kF64: return P_F64;
    default: return c.precision == MathPrecision::kHighest ? P_F32 : P_TF32;
  }
}

constexpr long long kI32 = 2147483647LL;

void fill_strides(const ConvProblem& pb, Params& p) {
  const long long C = pb.C, K = pb.K, Cg = pb.Cg();
  const long long dhw = pb.in_pixels(), zpq = pb.out_pixels();
  const long long T = pb.filt[0], R = pb.filt[1], S = pb.filt[2];
  if (pb.layout == Layout::kNHWC) {
    p.xsC = 1; p.xsPix = C; p.xsN = dhw * C;
    p.ysC = 1; p.ysPix = K; p.ysN = zpq * K;
    p.wsK = 1; p.wsC = K; p.wsS = Cg * K; p.wsR = S * Cg * K; p.wsT = R * S * Cg * K;
  } else {
    p.xsPix = 1; p.xsC = dhw; p.xsN = C * dhw;
    p.ysPix = 1; p.ysC = zpq; p.ysN = K * zpq;
    p.wsS = 1; p.wsR = S; p.wsT = R * S; p.wsC = T * R * S; p.wsK = Cg * T * R * S;
  }
}

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

Plan make_plan(const CudaConvCall& c) {
  Plan pl;
  const ConvProblem& pb = c.problem;
  if (c.algo != ConvAlgo::kImplicitGemm && c.algo != ConvAlgo::kImplicitPrecompGemm &&
      c.algo != ConvAlgo::kGemm) {
    pl.err = "not a GEMM-family algorithm";
    return pl;
  }
  {
    std::string v = validate_problem(pb);
    if (!v.empty()) { pl.err = v; return pl; }
  }
  if (!pb.unit_lhs_dilation()) {
    pl.err = std::string(conv_algo_name(c.algo)) +
             ": lhs_dilation > 1 is not supported (no zero-inserting emulation)";
    return pl;
  }
  const bool in16 = c.in == DType::kBF16 || c.in == DType::kF16;
  if (!(c.out == c.in || (in16 && c.out == DType::kF32))) {
    pl.err = "unsupported dtype combination (out must equal in, or be float32 for 16-bit in)";
    return pl;
  }
  if (c.op != ConvOp::kForward && c.op != ConvOp::kBackwardData && c.op != ConvOp::kBackwardFilter) {
    pl.err = "unknown convolution op";
    return pl;
  }
  // 32-bit index limits (offsets into tensors are 64-bit)
  const long long Cg = pb.Cg(), Kg = pb.Kg();
  const long long ntap = pb.filt_taps();
  const long long M_fwd = pb.N * pb.out_pixels(), M_dx = pb.N * pb.in_pixels();
  if (M_fwd > kI32 || M_dx > kI32 || ntap * Cg > kI32 || ntap * Kg > kI32 || pb.w_elems() > kI32 ||
      pb.N > kI32 || pb.C > kI32 || pb.K > kI32) {
    pl.err = std::string(conv_algo_name(c.algo)) +
             ": N*spatial, taps*channels and the filter size must each be below 2^31";
    return pl;
  }
  for (int a = 0; a < 3; ++a)
    if (std::abs(pb.pad_lo[a]) > (1 << 28) || pb.stride[a] > (1 << 20) ||
        pb.dilation[a] > (1 << 20) || pb.in[a] > kI32 || pb.out[a] > kI32) {
      pl.err = "GEMM family: padding/stride/dilation/extent too large for 32-bit index math";
      return pl;
    }
  pl.path = select_path(c);
  pl.op = c.op == ConvOp::kForward ? OP_FWD : c.op == ConvOp::kBackwardData ? OP_DGRAD : OP_WGRAD;
  pl.gemm_algo = c.algo == ConvAlgo::kGemm;
  const int acc_bytes = pl.path == P_F64 ? 8 : 4;
  const size_t in_bytes = dtype_bytes(c.in);

  Params& o = pl.orig;
  o.N = static_cast<int>(pb.N); o.G = static_cast<int>(pb.G);
  o.Cg = static_cast<int>(Cg); o.Kg = static_cast<int>(Kg);
  o.D = static_cast<int>(pb.in[0]); o.H = static_cast<int>(pb.in[1]); o.W = static_cast<int>(pb.in[2]);
  o.T = static_cast<int>(pb.filt[0]); o.R = static_cast<int>(pb.filt[1]); o.S = static_cast<int>(pb.filt[2]);
  o.Z = static_cast<int>(pb.out[0]); o.P = static_cast<int>(pb.out[1]); o.Q = static_cast<int>(pb.out[2]);
  for (int a = 0; a < 3; ++a) {
    o.str[a] = static_cast<int>(pb.stride[a]);
    o.dil[a] = static_cast<int>(pb.dilation[a]);
    o.pad[a] = static_cast<int>(pb.pad_lo[a]);
  }
  fill_strides(pb, o);
  o.nphase = 1;
  o.splits = 1;
  o.out_dtype = static_cast<int>(c.out);
  o.use_table = 1;

  if (pb.x_elems() == 0 || pb.y_elems() == 0 || pb.w_elems() == 0) {
    pl.degenerate = true;  // some operand is empty: the result is zeros (or empty)
    return pl;
  }

  Params p = o;
  pl.hwio = pb.layout == Layout::kNHWC ? 1 : 0;
  pl.cpg = static_cast<int>(ntap * Cg);
  if (pl.gemm_algo) {
    if (ntap * pb.C > kI32) { pl.err = "GEMM: im2col row longer than 2^31"; return pl; }
    // the equivalent 1x1 problem on the column buffer (NHWC, C' = G*ntap*Cg channels)
    const long long cp = static_cast<long long>(pl.cpg) * pb.G;
    const long long zpq = pb.out_pixels();
    p.D = o.Z; p.H = o.P; p.W = o.Q;
    p.T = p.R = p.S = 1;
    for (int a = 0; a < 3; ++a) { p.str[a] = 1; p.dil[a] = 1; p.pad[a] = 0; }
    p.Cg = pl.cpg;
    p.xsC = 1; p.xsPix = cp; p.xsN = zpq * cp;
    if (pl.hwio) { p.wsK = 1; p.wsC = pb.K; }
    else { p.wsK = pl.cpg; p.wsC = 1; }
    p.wsT = p.wsR = p.wsS = 0;
    const size_t elems = static_cast<size_t>(pb.N) * zpq * cp;
    pl.col_bytes = align256(elems * (pl.op == OP_DGRAD ? acc_bytes : in_bytes));
    if (pl.col_bytes > (size_t(16) << 30)) {
      pl.err = "GEMM: the im2col/column buffer would exceed 16 GiB of workspace";
      return pl;
    }
    if (pl.op == OP_DGRAD) p.out_dtype = acc_bytes == 8 ? DT_F64 : DT_F32;
  }
  p.use_table = c.algo == ConvAlgo::kImplicitGemm ? 0 : 1;
  p.analytic = c.algo == ConvAlgo::kImplicitGemm ? 1 : 0;
  const long long ptaps = static_cast<long long>(p.T) * p.R * p.S;
  if (p.use_table && ptaps > kMaxTableTaps) {
    pl.err = std::string(conv_algo_name(c.algo)) + ": more than " + std::to_string(kMaxTableTaps) +
             " filter taps (the per-CTA offset table would not fit in shared memory)";
    return pl;
  }
  if (pl.op == OP_DGRAD) p.nphase = p.str[0] * p.str[1] * p.str[2];
  // max M and Kred over phases
  int Mmax = 0, Kmax = 0;
  for (int ph = 0; ph < p.nphase; ++ph) {
    Geo geo = pl.op == OP_FWD ? make_geo<OP_FWD>(p, ph)
              : pl.op == OP_DGRAD ? make_geo<OP_DGRAD>(p, ph) : make_geo<OP_WGRAD>(p, ph);
    Mmax = std::max(Mmax, geo.Mph);
    Kmax = std::max(Kmax, geo.Kred);
  }
  if (pl.op == OP_WGRAD && static_cast<long long>(p.N) * p.Z * p.P * p.Q > kI32) {
    pl.err = "backward-filter: N*output pixels must be below 2^31";
    return pl;
  }
  p.Mmax = Mmax;
  p.Ng = pl.op == OP_DGRAD ? p.Cg : p.Kg;
  const long long zbase = static_cast<long long>(p.G) * p.nphase;
  // Tile shape and split-K, from the shape only (deterministic workspace and result).
  struct Choice {
    long long tilesM, tilesN, splits;
    int ktps;
    double cost;
  };
  auto choose = [&](int tile) {
    const TileDims td = tile_dims(pl.path, tile);
    Choice ch;
    ch.tilesM = (Mmax + td.BM - 1) / td.BM;
    ch.tilesN = (p.Ng + td.BN - 1) / td.BN;
    const long long tiles = ch.tilesM * ch.tilesN * zbase;
    const int KT = (Kmax + td.BK - 1) / td.BK;
    const long long slots = 132LL * resident_ctas(pl.path, pl.op, tile);
    long long want = 1;
    if (pl.op == OP_WGRAD) want = (2 * slots + tiles - 1) / tiles;
    else if (tiles < slots) want = slots / tiles;
    // Split-K only while each split keeps >= 32 k-tiles: measured on the H200 (r50 layers, bf16),
    // the fp32 partials and the reduce pass cost more than they save below that.
    long long sp = std::min<long long>(want, std::max(1, KT / 32));
    // sm_90 runs the wgmma kernel (no split-K). Not conditional on wgmma_switched_off(): the
    // workspace is sized when JAX lowers the call, and JAXDNN_NO_WGMMA may be set after that.
    if (wgmma_reason(c).empty()) sp = 1;
    if (const char* f = std::getenv("JAXDNN_GEMM_SPLITS"))  // testing override (tuning sweeps)
      sp = std::max(1, std::min(KT, std::atoi(f)));
    sp = std::max<long long>(1, std::min<long long>(sp, 65535 / zbase));
    while (sp > 1 && static_cast<size_t>(sp) * zbase * Mmax * p.Ng * acc_bytes > (size_t(1) << 30))
      sp = (sp + 1) / 2;
    ch.ktps = KT > 0 ? static_cast<int>((KT + sp - 1) / sp) : 0;
    ch.splits = ch.ktps > 0 ? (KT + ch.ktps - 1) / ch.ktps : 1;
    const long long ctas = tiles * ch.splits;
    const double waves = static_cast<double>((ctas + slots - 1) / slots);
    // relative per-CTA time: MACs per CTA over the tile's relative efficiency
    const double eff = tile == 1 ? 1.35 : 1.0;
    ch.cost = waves * td.BM * td.BN * (static_cast<double>(ch.ktps) * td.BK + 64.0) / eff;
    return ch;
  };
  pl.tile = 0;
  if (pl.op == OP_FWD && (pl.path == P_BF16 || pl.path == P_F16)) {
    const char* force = std::getenv("JAXDNN_GEMM_TILE");  // testing override: "S" or "L"
    if (force && force[0] == 'L') pl.tile = 1;
    else if (force && force[0] == 'S') pl.tile = 0;
    else if (p.Ng >= 128) pl.tile = choose(1).cost < choose(0).cost ? 1 : 0;
  }
  const Choice ch = choose(pl.tile);
  const long long splits = ch.splits;
  auto pbytes = [&](long long s) {
    return s > 1 ? align256(static_cast<size_t>(s) * zbase * Mmax * p.Ng * acc_bytes) : 0;
  };
  p.splits = static_cast<int>(splits);
  p.ktps = ch.ktps;
  p.tilesN = static_cast<int>(ch.tilesN);
  if (ch.tilesM * ch.tilesN > kI32 || zbase * splits > 65535) {
    pl.err = std::string(conv_algo_name(c.algo)) + ": grid too large (channels or groups)";
    return pl;
  }
  pl.gridx = static_cast<int>(ch.tilesM * ch.tilesN);
  pl.gridy = 1;
  pl.gridz = static_cast<int>(zbase * splits);
  pl.part_bytes = pbytes(splits);
  pl.part_off = pl.col_bytes;
  pl.total = pl.col_bytes + pl.part_bytes;
  pl.smem = pipe_smem(pl.path, pl.op, pl.tile) + (p.use_table ? static_cast<size_t>(ptaps) * 16 : 0);
  pl.prm = p;
  return pl;
}

std::string launch_op(const Plan& pl, const Params& p, cudaStream_t st) {
  switch (pl.op) {
    case OP_FWD: return launch_fwd(pl, p, st);
    case OP_DGRAD: return launch_dgrad(pl, p, st);
    default: return launch_wgrad(pl, p, st);
  }
}

int grid_for(long long total) {
  return static_cast<int>(std::max<long long>(1, std::min<long long>((total + 255) / 256, 132 * 32)));
}

std::string launch_im2col(const Plan& pl, const void* x, void* col, size_t in_bytes,
                          cudaStream_t st) {
  const Params& o = pl.orig;
  const long long total = static_cast<long long>(o.N) * o.Z * o.P * o.Q * o.G * pl.cpg;
  const int blocks = grid_for(total);
  if (in_bytes == 2)
    im2col_kernel<unsigned short><<<blocks, 256, 0, st>>>(o, static_cast<const unsigned short*>(x),
                                                          static_cast<unsigned short*>(col), total, pl.cpg, pl.hwio);
  else if (in_bytes == 4)
    im2col_kernel<unsigned int><<<blocks, 256, 0, st>>>(o, static_cast<const unsigned int*>(x),
                                                        static_cast<unsigned int*>(col), total, pl.cpg, pl.hwio);
  else
    im2col_kernel<unsigned long long><<<blocks, 256, 0, st>>>(
        o, static_cast<const unsigned long long*>(x), static_cast<unsigned long long*>(col), total, pl.cpg, pl.hwio);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("im2col launch: ") + cudaGetErrorString(e);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

void set_vec_flags(Plan& pl, Params& p) {
  const int vec = pl.path <= P_F16 ? 8 : pl.path == P_F64 ? 2 : 4;
  const bool al = aligned16(p.a) && aligned16(p.b);
  bool va = false, vb = false;
  if (pl.op == OP_FWD) {
    va = p.xsC == 1 && p.Cg % vec == 0;
    vb = p.wsK == 1 && p.Kg % vec == 0;
  } else if (pl.op == OP_DGRAD) {
    va = p.ysC == 1 && p.Kg % vec == 0;
    vb = p.wsK == 1 && p.Kg % vec == 0;
  } else {
    va = p.xsC == 1 && p.Cg % vec == 0;
    vb = p.ysC == 1 && p.Kg % vec == 0;
  }
  p.vecA = (va && al) ? 1 : 0;
  p.vecB = (vb && al) ? 1 : 0;
}

}  // namespace

std::string gemm_family_can_implement(const CudaConvCall& c) { return make_plan(c).err; }

size_t gemm_family_workspace_bytes(const CudaConvCall& c) {
  Plan pl = make_plan(c);
  // room for either kernel: which one runs depends on the device (sm_90: wgmma)
  return pl.err.empty() ? std::max(pl.total, wgmma_workspace_bytes(c)) : 0;
}

std::string gemm_family_run(const CudaConvCall& c, const CudaConvBuffers& io) {
  Plan pl = make_plan(c);
  if (!pl.err.empty()) return pl.err;
  if (std::string err; wgmma_try(c, io, &err)) return err;
  const ConvProblem& pb = c.problem;
  if (pl.degenerate && c.op == ConvOp::kForward && !io.epi.empty())
    return epi_fill(make_epi(io.epi, pb, c.out), io.out, pb.y_elems(), io.stream);
  if (pl.degenerate) {
    const long long n = c.op == ConvOp::kForward ? pb.y_elems()
                        : c.op == ConvOp::kBackwardData ? pb.x_elems() : pb.w_elems();
    const size_t bytes = static_cast<size_t>(n) * dtype_bytes(c.out);
    if (bytes == 0) return "";
    zero_bytes_kernel<<<grid_for(static_cast<long long>(bytes)), 256, 0, io.stream>>>(
        static_cast<unsigned char*>(io.out), bytes);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? "" : std::string("zero fill launch: ") + cudaGetErrorString(e);
  }
  if (pl.total > 0 && (io.workspace == nullptr || io.workspace_size < pl.total))
    return "GEMM family: workspace too small (" + std::to_string(io.workspace_size) + " < " +
           std::to_string(pl.total) + " bytes)";
  unsigned char* ws = static_cast<unsigned char*>(io.workspace);
  Params p = pl.prm;
  p.partial = pl.part_bytes ? ws + pl.part_off : nullptr;
  if (c.op == ConvOp::kForward) p.epi = make_epi(io.epi, pb, c.out);
  const size_t in_bytes = dtype_bytes(c.in);
  std::string err;
  if (!pl.gemm_algo) {
    p.a = io.a; p.b = io.b; p.out = io.out;
    set_vec_flags(pl, p);
    return launch_op(pl, p, io.stream);
  }
  void* col = ws;
  if (pl.op == OP_FWD || pl.op == OP_WGRAD) {
    err = launch_im2col(pl, io.a, col, in_bytes, io.stream);
    if (!err.empty()) return err;
    p.a = col; p.b = io.b; p.out = io.out;
    set_vec_flags(pl, p);
    return launch_op(pl, p, io.stream);
  }
  // dgrad: dcol = 1x1 dgrad(dy, w) in the accumulation type, then col2im gather
  p.a = io.a; p.b = io.b; p.out = col;
  set_vec_flags(pl, p);
  err = launch_op(pl, p, io.stream);
  if (!err.empty()) return err;
  Params o = pl.orig;
  o.out = io.out;
  const long long total = pb.x_elems();
  if (pl.path == P_F64)
    col2im_kernel<double><<<grid_for(total), 256, 0, io.stream>>>(o, static_cast<const double*>(col), total, pl.cpg, pl.hwio);
  else
    col2im_kernel<float><<<grid_for(total), 256, 0, io.stream>>>(o, static_cast<const float*>(col), total, pl.cpg, pl.hwio);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("col2im launch: ") + cudaGetErrorString(e);
}

}  // namespace jaxdnn::cuda
