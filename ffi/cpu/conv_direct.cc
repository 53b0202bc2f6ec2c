// DIRECT convolution family: loops over the filter window, no GEMM lowering.
//
// Design. Everything is computed by two row engines over the problem's output rows:
//
//   forward engine  y[n][z][p][:][:] = sum over valid (t, r) taps of one "virtual input row"
//                   (the input row (n, id, ih), lhs-dilated, padded and cut to the q-tile, with
//                   zeros where the virtual position is a hole or padding) times the filter row.
//   filter engine   dw[tap] += virtual input row (shifted by the W tap) x dy row, per output row.
//
// Backward-data is the forward engine on the transposed problem (gather formulation: dx is the
// convolution of dy, lhs-dilated by the stride, with the flipped, channel-transposed filter; the
// stride becomes the input dilation), so there is never a scatter.
//
// Virtual input rows are built once per input row in a small per-thread cache (the same row serves
// R consecutive output rows), in one of three layouts chosen by the vector lane efficiency:
//   BCAST  x[jv][Cg]       vectors over output channels k of one group, x broadcast (dense, large
//                          Kg: the general path);
//   EXP    x[jv][Cg][VL]   vectors over VL consecutive output channels (across groups); lane l
//                          holds the input channel of group(k0+l), so w and y are read/written as
//                          plain vectors (DEPTHWISE, channel multipliers and small GROUPED convs);
//   DOT    x[jv][Cgp]      vectors over input channels with a horizontal sum (tiny K, large Cg).
// Because the virtual row already contains the padding zeros, the interior loops have no bounds
// checks; they are register-blocked over several output pixels (forward) or several (tap, channel)
// pairs (backward-filter).
//
// Workspace (declared by direct_workspace_bytes): packed filter (forward / backward-data) or
// per-chunk partial filter sums (backward-filter), plus one scratch slot per thread. The filter
// gradient is reduced over a fixed, problem-determined set of row chunks in a fixed order, so the
// result does not depend on the number of threads or on scheduling.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "conv_cpu.h"
#include "parallel.h"

namespace jaxdnn::cpu {
namespace {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
constexpr int kRegs = 32;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
constexpr int kRegs = 16;
#elif defined(__aarch64__) || defined(__ARM_NEON)
constexpr int kVecBytes = 16;
constexpr int kRegs = 32;
#else
constexpr int kVecBytes = 16;
constexpr int kRegs = 16;
#endif

template <typename T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes)));
};

template <typename T>
constexpr int vlen() {
  return kVecBytes / static_cast<int>(sizeof(T));
}

template <typename V, typename T>
inline V vload(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V, typename T>
inline void vstore(T* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}
template <typename V, typename T>
inline void vstore_n(T* p, const V& v, int n) {
  if (n >= static_cast<int>(sizeof(V) / sizeof(T))) {
    std::memcpy(p, &v, sizeof(V));
  } else {
    T tmp[sizeof(V) / sizeof(T)];
    std::memcpy(tmp, &v, sizeof(V));
    for (int i = 0; i < n; ++i) p[i] = tmp[i];
  }
}
template <typename V, typename T>
inline T hsum(const V& v) {
  constexpr int n = sizeof(V) / sizeof(T);
  T tmp[n];
  std::memcpy(tmp, &v, sizeof(V));
  T s = 0;
  for (int i = 0; i < n; ++i) s += tmp[i];
  return s;
}

#define UNROLL _Pragma("GCC unroll 16")

constexpr int cmin(int a, int b) { return a < b ? a : b; }
constexpr int cmax(int a, int b) { return a > b ? a : b; }

// Calls f(std::integral_constant<int, N>) for N = n (1 <= n <= Max).
template <int Max, typename F>
inline void dispatch_n(int n, F&& f) {
  if constexpr (Max >= 1) {
    if (n >= Max) {
      f(std::integral_constant<int, Max>());
    } else {
      dispatch_n<Max - 1>(n, std::forward<F>(f));
    }
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
inline size_t align64(size_t b) { return (b + 63) & ~size_t(63); }

// ------------------------------------------------------------------------------------------------
// Geometry of the (effective) forward problem.

struct Geo {
  Layout layout;
  int64_t N, C, K, G, Cg, Kg;
  int64_t in[3], filt[3], out[3], str[3], dil[3], ld[3], pl[3];
  int64_t taps() const { return filt[0] * filt[1] * filt[2]; }
  int64_t in_pix() const { return in[0] * in[1] * in[2]; }
  int64_t out_pix() const { return out[0] * out[1] * out[2]; }
  // Input index read by output o through tap f along axis a, or -1.
  int64_t map(int a, int64_t o, int64_t f) const {
    const int64_t j = o * str[a] + f * dil[a] - pl[a];
    if (j < 0) return -1;
    if (ld[a] != 1 && j % ld[a] != 0) return -1;
    const int64_t i = j / ld[a];
    return i < in[a] ? i : -1;
  }
};

Geo forward_geo(const ConvProblem& p) {
  Geo g;
  g.layout = p.layout;
  g.N = p.N; g.C = p.C; g.K = p.K; g.G = p.G; g.Cg = p.Cg(); g.Kg = p.Kg();
  for (int a = 0; a < 3; ++a) {
    g.in[a] = p.in[a]; g.filt[a] = p.filt[a]; g.out[a] = p.out[a]; g.str[a] = p.stride[a];
    g.dil[a] = p.dilation[a]; g.ld[a] = p.lhs_dilation[a]; g.pl[a] = p.pad_lo[a];
  }
  return g;
}

// Backward-data as a forward convolution of dy (gather formulation).
Geo dgrad_geo(const ConvProblem& p) {
  Geo g;
  g.layout = p.layout;
  g.N = p.N; g.C = p.K; g.K = p.C; g.G = p.G; g.Cg = p.Kg(); g.Kg = p.Cg();
  for (int a = 0; a < 3; ++a) {
    g.in[a] = p.out[a]; g.out[a] = p.in[a]; g.filt[a] = p.filt[a];
    g.str[a] = p.lhs_dilation[a]; g.ld[a] = p.stride[a]; g.dil[a] = p.dilation[a];
    g.pl[a] = p.dilation[a] * (p.filt[a] - 1) - p.pad_lo[a];
  }
  return g;
}

enum class Mode { kBcast, kExp, kDot };

// Picks the layout with the best vector lane use (ties: BCAST, EXP, DOT).
template <typename T>
Mode choose_mode(const Geo& g) {
  const int VL = vlen<T>();
  auto eff = [&](int64_t n) { return static_cast<double>(n) / round_up(n, VL); };
  const double eb = eff(g.Kg), ee = eff(g.K), ed = eff(g.Cg);
  Mode m = Mode::kBcast;
  double best = eb;
  if (g.Kg < VL && ee > best + 1e-9) { m = Mode::kExp; best = ee; }
  if (ed > best + 1e-9 && (g.Kg < VL || ed > best * 2)) m = Mode::kDot;
  return m;
}

// Memory plan shared by direct_workspace_bytes and the kernels.
struct Plan {
  Mode mode;
  int64_t VL;
  int64_t Kgp, Cgp;       // padded group widths
  int64_t E;              // elements per virtual-row position
  int64_t RS;             // distinct input rows per output row (H axis)
  int64_t ncr;            // cached rows per slot
  int64_t QT;             // q-tile
  int64_t Wv;             // virtual row length of a full q-tile
  int64_t units;          // groups (BCAST / DOT) or lane blocks (EXP)
  int64_t packed;         // packed filter elements
  int64_t obuf;           // per-slot row buffer (y for NCHW, dy rows for backward-filter)
  int64_t nchunks;        // backward-filter: fixed number of row chunks
  int64_t slot_elems;     // per-slot elements (cache + obuf)
  int64_t slot_ptrs;      // per-slot pointer entries
  int64_t nslots;
};

template <typename T>
Plan make_plan(const Geo& g, Mode mode, bool wgrad) {
  Plan pl;
  pl.mode = mode;
  pl.VL = vlen<T>();
  const int64_t VL = pl.VL;
  pl.Kgp = round_up(g.Kg, VL);
  pl.Cgp = round_up(g.Cg, VL);
  pl.E = mode == Mode::kBcast ? g.Cg : mode == Mode::kDot ? pl.Cgp : g.Cg * VL;
  pl.RS = (g.filt[1] - 1) * g.dil[1] / g.ld[1] + 1;
  pl.ncr = g.filt[0] * pl.RS;
  pl.units = mode == Mode::kExp ? ceil_div(g.K, VL) : g.G;
  const int64_t Q = std::max<int64_t>(g.out[2], 1);
  const int64_t budget = (256 * 1024) / static_cast<int64_t>(sizeof(T));
  const int64_t rowe = pl.ncr * pl.units * pl.E;
  const int64_t per_q = rowe * g.str[2];
  int64_t qt = (budget - rowe * ((g.filt[2] - 1) * g.dil[2] + 1)) / per_q;
  qt = std::max<int64_t>(qt, 16);
  pl.QT = std::min(qt, Q);
  pl.Wv = (pl.QT - 1) * g.str[2] + (g.filt[2] - 1) * g.dil[2] + 1;
  const int64_t taps = g.taps();
  if (mode == Mode::kBcast) pl.packed = g.G * taps * g.Cg * pl.Kgp;
  else if (mode == Mode::kExp) pl.packed = pl.units * taps * g.Cg * VL;
  else pl.packed = g.G * taps * g.Kg * pl.Cgp;
  pl.obuf = pl.QT * std::max(pl.Kgp, VL);
  pl.slot_elems = pl.ncr * pl.units * pl.Wv * pl.E + pl.obuf + 2 * VL;
  pl.slot_ptrs = 3 * pl.ncr + 64;
  pl.nslots = num_threads();
  pl.nchunks = 1;
  if (wgrad) {
    const int64_t rows = g.N * g.out[0] * g.out[1];
    int64_t nc = 16;
    const int64_t cap = (48ll << 20) / (static_cast<int64_t>(sizeof(T)) * std::max<int64_t>(pl.packed, 1));
    nc = std::min(nc, std::max<int64_t>(cap, 1));
    pl.nchunks = std::max<int64_t>(1, std::min(nc, rows));
  }
  return pl;
}

size_t plan_bytes(const Plan& pl, size_t eb, bool wgrad) {
  size_t b = align64(static_cast<size_t>(pl.packed) * eb * (wgrad ? pl.nchunks : 1));
  b += static_cast<size_t>(pl.nslots) *
       (align64(static_cast<size_t>(pl.slot_elems) * eb) +
        align64(static_cast<size_t>(pl.slot_ptrs) * sizeof(void*)) + 2 * 64 * sizeof(int64_t));
  return b + 64;
}

// Runs body(item, slot) for item in [0, n) on all threads with dynamic scheduling.
template <typename F>
void run_items(int64_t n, int64_t nslots, F&& body) {
  std::atomic<int64_t> next{0};
  parallel_for(
      nslots,
      [&](int64_t b, int64_t e) {
        (void)e;
        for (int64_t i; (i = next.fetch_add(1)) < n;) body(i, b);
      },
      1, 1);
}

// Per-slot scratch.
template <typename T>
struct Slot {
  T* cache;
  T* obuf;
  const T** rowp;      // cached row pointers for the current output row
  int64_t* rowtap;     // tap index (t*R + r) per row
  int64_t* tags;       // cache tags (ncr)
  int64_t* offs;       // pair offsets (64)
};

template <typename T>
Slot<T> slot_at(void* ws_slots, const Plan& pl, int64_t s) {
  const size_t eb = sizeof(T);
  const size_t sb = align64(static_cast<size_t>(pl.slot_elems) * eb) +
                    align64(static_cast<size_t>(pl.slot_ptrs) * sizeof(void*)) +
                    2 * 64 * sizeof(int64_t);
  char* base = static_cast<char*>(ws_slots) + static_cast<size_t>(s) * sb;
  Slot<T> sl;
  sl.cache = reinterpret_cast<T*>(base);
  sl.obuf = sl.cache + pl.ncr * pl.units * pl.Wv * pl.E;
  char* pb = base + align64(static_cast<size_t>(pl.slot_elems) * eb);
  sl.rowp = reinterpret_cast<const T**>(pb);
  sl.rowtap = reinterpret_cast<int64_t*>(pb + pl.ncr * sizeof(void*));
  sl.tags = sl.rowtap + pl.ncr;
  sl.offs = reinterpret_cast<int64_t*>(pb + align64(static_cast<size_t>(pl.slot_ptrs) * sizeof(void*)));
  return sl;
}

// ------------------------------------------------------------------------------------------------
// Virtual input rows.

// Input element accessor.
template <typename T>
struct XView {
  const T* x;
  Layout layout;
  int64_t C, pix;  // channels, pixels per image
  const T* at(int64_t n, int64_t c, int64_t p) const {
    return layout == Layout::kNHWC ? x + (n * pix + p) * C + c : x + (n * C + c) * pix + p;
  }
};

// Fills dst[u][0 .. Wv)[E] for every unit u (group for BCAST / DOT, lane block for EXP) with the
// virtual row of input row (n, id, ih) starting at virtual position q0*str - pl.
template <typename T>
void fill_row(T* dst, const Geo& g, const Plan& pl, const XView<T>& xv, int64_t n, int64_t id,
              int64_t ih, int64_t q0) {
  typedef typename VecOf<T>::type V;
  const int64_t W = g.in[2], E = pl.E, VL = pl.VL, Wv = pl.Wv, U = pl.units;
  const int64_t ustride = Wv * E;
  const int64_t pix0 = (id * g.in[1] + ih) * W;
  const int64_t str = g.str[2], ld = g.ld[2], pad = g.pl[2];
  const bool nhwc = g.layout == Layout::kNHWC;
  const int64_t jbase = q0 * str - pad;
  auto iw_of = [&](int64_t jv) -> int64_t {
    const int64_t j = jbase + jv;
    if (j < 0) return -1;
    if (ld == 1) return j < W ? j : -1;
    if (j % ld != 0) return -1;
    return j / ld < W ? j / ld : -1;
  };
  auto zero = [&](T* d, int64_t cnt) {
    int64_t i = 0;
    for (; i + VL <= cnt; i += VL) vstore<V>(d + i, V{});
    for (; i < cnt; ++i) d[i] = T(0);
  };
  if (pl.mode != Mode::kExp) {
    // [g][jv][E] with E = Cg (BCAST) or Cgp (DOT).
    for (int64_t jv = 0; jv < Wv; ++jv) {
      const int64_t iw = iw_of(jv);
      if (iw < 0) {
        for (int64_t u = 0; u < U; ++u) zero(dst + u * ustride + jv * E, E);
        continue;
      }
      if (nhwc) {
        const T* s = xv.at(n, 0, pix0 + iw);
        for (int64_t u = 0; u < U; ++u) {
          T* d = dst + u * ustride + jv * E;
          if (g.Cg == 1) d[0] = s[u];
          else std::memcpy(d, s + u * g.Cg, sizeof(T) * g.Cg);
          for (int64_t c = g.Cg; c < E; ++c) d[c] = 0;
        }
      } else {
        const T* s = xv.at(n, 0, pix0 + iw);
        for (int64_t u = 0; u < U; ++u) {
          T* d = dst + u * ustride + jv * E;
          for (int64_t c = 0; c < g.Cg; ++c) d[c] = s[(u * g.Cg + c) * xv.pix];
          for (int64_t c = g.Cg; c < E; ++c) d[c] = 0;
        }
      }
    }
    return;
  }
  // EXP: [u][jv][c][VL]; lane l of channel slot c holds input channel group(u*VL + l)*Cg + c.
  const bool simple = nhwc && g.Cg == 1 && g.Kg == 1;
  if (simple) {
    const int64_t full = g.K / VL;  // units with all lanes valid
    for (int64_t jv = 0; jv < Wv; ++jv) {
      const int64_t iw = iw_of(jv);
      if (iw < 0) {
        for (int64_t u = 0; u < U; ++u) vstore<V>(dst + u * ustride + jv * VL, V{});
        continue;
      }
      const T* s = xv.at(n, 0, pix0 + iw);
      for (int64_t u = 0; u < full; ++u) vstore<V>(dst + u * ustride + jv * VL, vload<V>(s + u * VL));
      if (full < U) {
        T* d = dst + full * ustride + jv * VL;
        for (int64_t l = 0; l < VL; ++l) d[l] = full * VL + l < g.K ? s[full * VL + l] : T(0);
      }
    }
    return;
  }
#if defined(__GNUC__) && !defined(__clang__)
  typedef typename std::conditional<sizeof(T) == 4, int32_t, int64_t>::type IT;
  typedef IT VI __attribute__((vector_size(kVecBytes)));
  // Shuffle path: every full unit reads a window of <= VL channels starting at a group boundary,
  // with the same lane pattern (VL % Kg == 0).
  const int64_t span = (VL / std::max<int64_t>(g.Kg, 1)) * g.Cg;
  if (nhwc && g.Kg <= VL && VL % g.Kg == 0 && span <= VL && g.Cg <= 16) {
    VI masks[16];
    for (int64_t c = 0; c < g.Cg; ++c) {
      IT m[sizeof(VI) / sizeof(IT)];
      for (int64_t l = 0; l < VL; ++l) m[l] = static_cast<IT>((l / g.Kg) * g.Cg + c);
      std::memcpy(&masks[c], m, sizeof(VI));
    }
    const int64_t full = g.K / VL;
    for (int64_t jv = 0; jv < Wv; ++jv) {
      const int64_t iw = iw_of(jv);
      if (iw < 0) {
        for (int64_t u = 0; u < U; ++u) zero(dst + u * ustride + jv * E, E);
        continue;
      }
      const T* s = xv.at(n, 0, pix0 + iw);
      for (int64_t u = 0; u < U; ++u) {
        T* d = dst + u * ustride + jv * E;
        const int64_t cbase = u * span;
        V src;
        if (u < full && cbase + VL <= g.C) {
          src = vload<V>(s + cbase);
        } else {
          T tmp[sizeof(V) / sizeof(T)] = {};
          for (int64_t l = 0; l < VL && cbase + l < g.C; ++l) tmp[l] = s[cbase + l];
          std::memcpy(&src, tmp, sizeof(V));
        }
        for (int64_t c = 0; c < g.Cg; ++c) vstore<V>(d + c * VL, __builtin_shuffle(src, masks[c]));
      }
    }
    return;
  }
#endif
  // Generic: per (unit, slot, lane) channel, walk the row.
  for (int64_t u = 0; u < U; ++u) {
    for (int64_t c = 0; c < g.Cg; ++c) {
      for (int64_t l = 0; l < VL; ++l) {
        T* d = dst + u * ustride + c * VL + l;
        const int64_t k = u * VL + l;
        if (k >= g.K) {
          for (int64_t jv = 0; jv < Wv; ++jv) d[jv * E] = 0;
          continue;
        }
        const int64_t ch = (k / g.Kg) * g.Cg + c;
        const T* s = xv.at(n, ch, pix0);
        const int64_t es = nhwc ? g.C : 1;
        if (ld == 1) {
          const int64_t jlo = std::min(Wv, std::max<int64_t>(0, -jbase));
          const int64_t jhi = std::max(jlo, std::min(Wv, W - jbase));
          for (int64_t jv = 0; jv < jlo; ++jv) d[jv * E] = 0;
          for (int64_t jv = jlo; jv < jhi; ++jv) d[jv * E] = s[(jbase + jv) * es];
          for (int64_t jv = jhi; jv < Wv; ++jv) d[jv * E] = 0;
          continue;
        }
        for (int64_t jv = 0; jv < Wv; ++jv) {
          const int64_t iw = iw_of(jv);
          d[jv * E] = iw < 0 ? T(0) : s[iw * es];
        }
      }
    }
  }
}

// Collects the cached virtual rows feeding output row (n, z, p); returns their count.
template <typename T>
int64_t gather_rows(const Geo& g, const Plan& pl, const XView<T>& xv, Slot<T>& sl, int64_t n,
                    int64_t z, int64_t p, int64_t q0, int64_t tag_hi) {
  int64_t nr = 0;
  const int64_t rowlen = pl.units * pl.Wv * pl.E;
  for (int64_t t = 0; t < g.filt[0]; ++t) {
    const int64_t id = g.map(0, z, t);
    if (id < 0) continue;
    for (int64_t r = 0; r < g.filt[1]; ++r) {
      const int64_t ih = g.map(1, p, r);
      if (ih < 0) continue;
      const int64_t ci = t * pl.RS + ih % pl.RS;
      const int64_t tag = ((tag_hi * g.in[0] + id) * g.in[1] + ih);
      T* row = sl.cache + ci * rowlen;
      if (sl.tags[ci] != tag) {
        fill_row(row, g, pl, xv, n, id, ih, q0);
        sl.tags[ci] = tag;
      }
      sl.rowp[nr] = row;
      sl.rowtap[nr] = t * g.filt[1] + r;
      ++nr;
    }
  }
  return nr;
}

// ------------------------------------------------------------------------------------------------
// Forward micro-kernels. xr: row pointers already offset to the block's first output pixel.

template <typename T, int QB, int KB>
inline void fwd_bcast_block(const T* const* rowp, const int64_t* rowtap, int64_t nr, const T* wg,
                            int64_t S, int64_t Cg, int64_t Kgp, int64_t xq, int64_t xs,
                            int64_t xoff, T* out, int64_t out_q, int64_t kcount) {
  typedef typename VecOf<T>::type V;
  constexpr int VL = vlen<T>();
  V acc[QB][KB];
  UNROLL for (int j = 0; j < QB; ++j)
    UNROLL for (int v = 0; v < KB; ++v) acc[j][v] = V{};
  for (int64_t i = 0; i < nr; ++i) {
    const T* xr = rowp[i] + xoff;
    const T* wr = wg + rowtap[i] * S * Cg * Kgp;
    for (int64_t s = 0; s < S; ++s) {
      const T* xp = xr + s * xs;
      const T* wp = wr + s * Cg * Kgp;
      for (int64_t c = 0; c < Cg; ++c) {
        V w[KB];
        UNROLL for (int v = 0; v < KB; ++v) w[v] = vload<V>(wp + c * Kgp + v * VL);
        UNROLL for (int j = 0; j < QB; ++j) {
          const T xs1 = xp[j * xq + c];
          UNROLL for (int v = 0; v < KB; ++v) acc[j][v] += xs1 * w[v];
        }
      }
    }
  }
  UNROLL for (int j = 0; j < QB; ++j)
    UNROLL for (int v = 0; v < KB; ++v) vstore_n<V>(out + j * out_q + v * VL, acc[j][v], static_cast<int>(kcount - v * VL));
}

template <typename T, int QB>
inline void fwd_exp_block(const T* const* rowp, const int64_t* rowtap, int64_t nr, const T* wu,
                          int64_t S, int64_t Cg, int64_t xq, int64_t xs, int64_t xoff, T* out,
                          int64_t out_q, int64_t kcount) {
  typedef typename VecOf<T>::type V;
  constexpr int VL = vlen<T>();
  V acc[QB];
  UNROLL for (int j = 0; j < QB; ++j) acc[j] = V{};
  for (int64_t i = 0; i < nr; ++i) {
    const T* xr = rowp[i] + xoff;
    const T* wr = wu + rowtap[i] * S * Cg * VL;
    for (int64_t s = 0; s < S; ++s) {
      const T* xp = xr + s * xs;
      const T* wp = wr + s * Cg * VL;
      for (int64_t c = 0; c < Cg; ++c) {
        const V w = vload<V>(wp + c * VL);
        UNROLL for (int j = 0; j < QB; ++j) acc[j] += vload<V>(xp + j * xq + c * VL) * w;
      }
    }
  }
  UNROLL for (int j = 0; j < QB; ++j) vstore_n<V>(out + j * out_q, acc[j], static_cast<int>(kcount));
}

template <typename T, int QB, int KD>
inline void fwd_dot_block(const T* const* rowp, const int64_t* rowtap, int64_t nr, const T* wk,
                          int64_t S, int64_t Kg, int64_t Cgp, int64_t xq, int64_t xs, int64_t xoff,
                          T* out, int64_t out_q, int64_t out_k) {
  typedef typename VecOf<T>::type V;
  constexpr int VL = vlen<T>();
  V acc[QB][KD];
  UNROLL for (int j = 0; j < QB; ++j)
    UNROLL for (int k = 0; k < KD; ++k) acc[j][k] = V{};
  for (int64_t i = 0; i < nr; ++i) {
    const T* xr = rowp[i] + xoff;
    const T* wr = wk + rowtap[i] * S * Kg * Cgp;
    for (int64_t s = 0; s < S; ++s) {
      const T* xp = xr + s * xs;
      const T* wp = wr + s * Kg * Cgp;
      for (int64_t cv = 0; cv < Cgp; cv += VL) {
        V xv[QB];
        UNROLL for (int j = 0; j < QB; ++j) xv[j] = vload<V>(xp + j * xq + cv);
        UNROLL for (int k = 0; k < KD; ++k) {
          const V w = vload<V>(wp + k * Cgp + cv);
          UNROLL for (int j = 0; j < QB; ++j) acc[j][k] += xv[j] * w;
        }
      }
    }
  }
  UNROLL for (int j = 0; j < QB; ++j)
    UNROLL for (int k = 0; k < KD; ++k) out[j * out_q + k * out_k] = hsum<V, T>(acc[j][k]);
}

template <int KB>
constexpr int bcast_qb() { return cmax(1, cmin(12, (kRegs - KB - 2) / KB)); }
constexpr int kExpQB = cmin(12, kRegs - 4);
template <int KD>
constexpr int dot_qb() { return cmax(1, cmin(8, (kRegs - 2) / (KD + 1))); }

// ------------------------------------------------------------------------------------------------
// Forward engine on an effective problem with a packed filter.

// Packs the filter: wval(tap, c_local, k_global).
template <typename T, typename WV>
void pack_filter(const Geo& g, const Plan& pl, T* wp, WV&& wval) {
  const int64_t taps = g.taps(), VL = pl.VL;
  if (pl.mode == Mode::kBcast) {
    parallel_for(g.G * taps, [&](int64_t b, int64_t e) {
      for (int64_t gt = b; gt < e; ++gt) {
        const int64_t gi = gt / taps, tap = gt % taps;
        for (int64_t c = 0; c < g.Cg; ++c) {
          T* d = wp + (gt * g.Cg + c) * pl.Kgp;
          for (int64_t k = 0; k < pl.Kgp; ++k) d[k] = k < g.Kg ? wval(tap, c, gi * g.Kg + k) : T(0);
        }
      }
    });
  } else if (pl.mode == Mode::kExp) {
    parallel_for(pl.units * taps, [&](int64_t b, int64_t e) {
      for (int64_t ut = b; ut < e; ++ut) {
        const int64_t u = ut / taps, tap = ut % taps;
        for (int64_t c = 0; c < g.Cg; ++c) {
          T* d = wp + (ut * g.Cg + c) * VL;
          for (int64_t l = 0; l < VL; ++l) {
            const int64_t k = u * VL + l;
            d[l] = k < g.K ? wval(tap, c, k) : T(0);
          }
        }
      }
    });
  } else {
    parallel_for(g.G * taps, [&](int64_t b, int64_t e) {
      for (int64_t gt = b; gt < e; ++gt) {
        const int64_t gi = gt / taps, tap = gt % taps;
        for (int64_t k = 0; k < g.Kg; ++k) {
          T* d = wp + (gt * g.Kg + k) * pl.Cgp;
          for (int64_t c = 0; c < pl.Cgp; ++c) d[c] = c < g.Cg ? wval(tap, c, gi * g.Kg + k) : T(0);
        }
      }
    });
  }
}

// `epi` (forward only, else null): the fused epilogue, applied to each output row segment (one
// (n, z, p) row and q-tile: per unit and channel channels-first, all units at once
// channels-last) right after the micro-kernels have stored it.
template <typename T>
void forward_engine(const Geo& g, const Plan& pl, const T* x, const T* wp, T* y, void* ws_slots,
                    const CpuEpilogue<T>* epi) {
  const int64_t Z = g.out[0], P = g.out[1], Q = g.out[2];
  const int64_t nqt = ceil_div(Q, pl.QT);
  const int64_t outer = g.N * Z * nqt;
  // Split output rows into chunks so that there are enough items.
  const int64_t want = 8 * pl.nslots;
  const int64_t npc = std::min<int64_t>(P, std::max<int64_t>(1, ceil_div(want, outer)));
  const int64_t pch = ceil_div(P, npc);
  const int64_t npc2 = ceil_div(P, pch);
  const int64_t items = outer * npc2;
  const XView<T> xv{x, g.layout, g.C, g.in_pix()};
  const int64_t S = g.filt[2], taps = g.taps(), VL = pl.VL;
  const int64_t opix = g.out_pix();
  const bool nhwc = g.layout == Layout::kNHWC;

  run_items(items, pl.nslots, [&](int64_t it, int64_t slot) {
    Slot<T> sl = slot_at<T>(ws_slots, pl, slot);
    int64_t rem = it;
    const int64_t pc = rem % npc2; rem /= npc2;
    const int64_t qt = rem % nqt; rem /= nqt;
    const int64_t z = rem % Z; rem /= Z;
    const int64_t n = rem;
    const int64_t q0 = qt * pl.QT, nq = std::min(pl.QT, Q - q0);
    for (int64_t c = 0; c < pl.ncr; ++c) sl.tags[c] = -1;
    const int64_t pbeg = pc * pch, pend = std::min(P, pbeg + pch);
    for (int64_t p = pbeg; p < pend; ++p) {
      const int64_t nr = gather_rows(g, pl, xv, sl, n, z, p, q0, n);
      const int64_t rowpix = (z * P + p) * Q + q0;  // pixel index of (z, p, q0)
      for (int64_t u = 0; u < pl.units; ++u) {
      const int64_t uoff = u * pl.Wv * pl.E;
      if (pl.mode == Mode::kBcast) {
        const int64_t xq = g.str[2] * g.Cg, xs = g.dil[2] * g.Cg;
        const T* wg = wp + u * taps * g.Cg * pl.Kgp;
        T* ob;
        int64_t out_q;
        if (nhwc) {
          ob = y + (n * opix + rowpix) * g.K + u * g.Kg;
          out_q = g.K;
        } else {
          ob = sl.obuf;
          out_q = pl.Kgp;
        }
        const int64_t nkv = pl.Kgp / VL;
        for (int64_t kv = 0; kv < nkv;) {
          const int kb = static_cast<int>(std::min<int64_t>(4, nkv - kv));
          const int64_t kcount = nhwc ? std::min<int64_t>(kb * VL, g.Kg - kv * VL) : kb * VL;
          dispatch_n<4>(kb, [&](auto KBc) {
            constexpr int KB = decltype(KBc)::value;
            constexpr int QB = bcast_qb<KB>();
            int64_t q = 0;
            for (; q + QB <= nq; q += QB)
              fwd_bcast_block<T, QB, KB>(sl.rowp, sl.rowtap, nr, wg + kv * VL, S, g.Cg, pl.Kgp, xq,
                                         xs, uoff + q * xq, ob + q * out_q + kv * VL, out_q, kcount);
            if (q < nq)
              dispatch_n<QB>(static_cast<int>(nq - q), [&](auto QRc) {
                fwd_bcast_block<T, decltype(QRc)::value, KB>(sl.rowp, sl.rowtap, nr, wg + kv * VL,
                                                             S, g.Cg, pl.Kgp, xq, xs, uoff + q * xq,
                                                             ob + q * out_q + kv * VL, out_q, kcount);
              });
          });
          kv += kb;
        }
        if (!nhwc) {
          for (int64_t k = 0; k < g.Kg; ++k) {
            T* yd = y + (n * g.K + u * g.Kg + k) * opix + rowpix;
            for (int64_t q = 0; q < nq; ++q) yd[q] = ob[q * out_q + k];
            if (epi) epi->apply(yd, nq, 1, u * g.Kg + k, 0);
          }
        }
      } else if (pl.mode == Mode::kExp) {
        const int64_t xq = g.str[2] * g.Cg * VL, xs = g.dil[2] * g.Cg * VL;
        const T* wu = wp + u * taps * g.Cg * VL;
        const int64_t k0 = u * VL, nl = std::min<int64_t>(VL, g.K - k0);
        T* ob;
        int64_t out_q;
        if (nhwc) {
          ob = y + (n * opix + rowpix) * g.K + k0;
          out_q = g.K;
        } else {
          ob = sl.obuf;
          out_q = VL;
        }
        constexpr int QB = kExpQB;
        int64_t q = 0;
        for (; q + QB <= nq; q += QB)
          fwd_exp_block<T, QB>(sl.rowp, sl.rowtap, nr, wu, S, g.Cg, xq, xs, uoff + q * xq, ob + q * out_q,
                               out_q, nl);
        if (q < nq)
          dispatch_n<QB>(static_cast<int>(nq - q), [&](auto QRc) {
            fwd_exp_block<T, decltype(QRc)::value>(sl.rowp, sl.rowtap, nr, wu, S, g.Cg, xq, xs,
                                                   uoff + q * xq, ob + q * out_q, out_q, nl);
          });
        if (!nhwc) {
          for (int64_t l = 0; l < nl; ++l) {
            T* yd = y + (n * g.K + k0 + l) * opix + rowpix;
            for (int64_t qq = 0; qq < nq; ++qq) yd[qq] = ob[qq * VL + l];
            if (epi) epi->apply(yd, nq, 1, k0 + l, 0);
          }
        }
      } else {
        const int64_t xq = g.str[2] * pl.Cgp, xs = g.dil[2] * pl.Cgp;
        const T* wgp = wp + u * taps * g.Kg * pl.Cgp;
        T* ob;
        int64_t out_q, out_k;
        if (nhwc) {
          ob = y + (n * opix + rowpix) * g.K + u * g.Kg;
          out_q = g.K;
          out_k = 1;
        } else {
          ob = y + (n * g.K + u * g.Kg) * opix + rowpix;
          out_q = 1;
          out_k = opix;
        }
        for (int64_t k = 0; k < g.Kg;) {
          const int kd = static_cast<int>(std::min<int64_t>(4, g.Kg - k));
          dispatch_n<4>(kd, [&](auto KDc) {
            constexpr int KD = decltype(KDc)::value;
            constexpr int QB = dot_qb<KD>();
            int64_t q = 0;
            for (; q + QB <= nq; q += QB)
              fwd_dot_block<T, QB, KD>(sl.rowp, sl.rowtap, nr, wgp + k * pl.Cgp, S, g.Kg, pl.Cgp,
                                       xq, xs, uoff + q * xq, ob + q * out_q + k * out_k, out_q, out_k);
            if (q < nq)
              dispatch_n<QB>(static_cast<int>(nq - q), [&](auto QRc) {
                fwd_dot_block<T, decltype(QRc)::value, KD>(
                    sl.rowp, sl.rowtap, nr, wgp + k * pl.Cgp, S, g.Kg, pl.Cgp, xq, xs, uoff + q * xq,
                    ob + q * out_q + k * out_k, out_q, out_k);
              });
          });
          k += kd;
        }
        if (epi && !nhwc) {
          for (int64_t k = 0; k < g.Kg; ++k) epi->apply(ob + k * out_k, nq, 1, u * g.Kg + k, 0);
        }
      }
      }
      // Channels-last: the row segment (n, z, p, q0 .. q0 + nq) is now complete in every unit,
      // and contiguous.
      if (epi && nhwc) epi->apply_channels_last(y + (n * opix + rowpix) * g.K, nq * g.K, 0);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// Backward-filter micro-kernels: accumulate over the nq pixels of one output row into partial
// sums held in registers, for a block of NP (tap, channel) pairs.

// EXP: acc[i] (lane vector over k) += x[q*xq + off[i]] * dy[q].
template <typename T, int NP>
inline void wg_exp_block(const T* xr, const int64_t* off, int64_t xq, const T* dy, int64_t dyq,
                         int64_t nq, T* const* pw) {
  typedef typename VecOf<T>::type V;
  V acc[NP];
  UNROLL for (int i = 0; i < NP; ++i) acc[i] = vload<V>(pw[i]);
  int64_t o[NP];
  UNROLL for (int i = 0; i < NP; ++i) o[i] = off[i];
  for (int64_t q = 0; q < nq; ++q) {
    const V d = vload<V>(dy + q * dyq);
    const T* xp = xr + q * xq;
    UNROLL for (int i = 0; i < NP; ++i) acc[i] += vload<V>(xp + o[i]) * d;
  }
  UNROLL for (int i = 0; i < NP; ++i) vstore<V>(pw[i], acc[i]);
}

// BCAST-X: acc[i][v] (vectors over k) += x[q*xq + off[i]] (scalar) * dy[q][v].
template <typename T, int NP, int KB>
inline void wg_bx_block(const T* xr, const int64_t* off, int64_t xq, const T* dy, int64_t dyq,
                        int64_t nq, T* const* pw) {
  typedef typename VecOf<T>::type V;
  constexpr int VL = vlen<T>();
  V acc[NP][KB];
  UNROLL for (int i = 0; i < NP; ++i)
    UNROLL for (int v = 0; v < KB; ++v) acc[i][v] = vload<V>(pw[i] + v * VL);
  int64_t o[NP];
  UNROLL for (int i = 0; i < NP; ++i) o[i] = off[i];
  for (int64_t q = 0; q < nq; ++q) {
    V d[KB];
    UNROLL for (int v = 0; v < KB; ++v) d[v] = vload<V>(dy + q * dyq + v * VL);
    const T* xp = xr + q * xq;
    UNROLL for (int i = 0; i < NP; ++i) {
      const T xs = xp[o[i]];
      UNROLL for (int v = 0; v < KB; ++v) acc[i][v] += xs * d[v];
    }
  }
  UNROLL for (int i = 0; i < NP; ++i)
    UNROLL for (int v = 0; v < KB; ++v) vstore<V>(pw[i] + v * VL, acc[i][v]);
}

// BCAST-DY: acc[i][k] (vectors over c) += x[q*xq + off[i]] (vector) * dy[q*dyq + k*dyk] (scalar).
template <typename T, int NP, int KD>
inline void wg_bd_block(const T* xr, const int64_t* off, int64_t xq, const T* dy, int64_t dyq,
                        int64_t dyk, int64_t nq, T* const* pw, int64_t pwk) {
  typedef typename VecOf<T>::type V;
  V acc[NP][KD];
  UNROLL for (int i = 0; i < NP; ++i)
    UNROLL for (int k = 0; k < KD; ++k) acc[i][k] = vload<V>(pw[i] + k * pwk);
  int64_t o[NP];
  UNROLL for (int i = 0; i < NP; ++i) o[i] = off[i];
  for (int64_t q = 0; q < nq; ++q) {
    T d[KD];
    UNROLL for (int k = 0; k < KD; ++k) d[k] = dy[q * dyq + k * dyk];
    const T* xp = xr + q * xq;
    UNROLL for (int i = 0; i < NP; ++i) {
      const V xv = vload<V>(xp + o[i]);
      UNROLL for (int k = 0; k < KD; ++k) acc[i][k] += xv * d[k];
    }
  }
  UNROLL for (int i = 0; i < NP; ++i)
    UNROLL for (int k = 0; k < KD; ++k) vstore<V>(pw[i] + k * pwk, acc[i][k]);
}

constexpr int kWgExpNP = cmin(12, kRegs - 4);
template <int KB>
constexpr int wg_bx_np() { return cmax(1, cmin(8, (kRegs - 2 - KB) / KB)); }
template <int KD>
constexpr int wg_bd_np() { return cmax(1, cmin(8, (kRegs - 2) / (KD + 1))); }

template <typename T>
Mode choose_wgrad_mode(const Geo& g) {
  const int VL = vlen<T>();
  auto eff = [&](int64_t n) { return static_cast<double>(n) / round_up(n, VL); };
  const double eb = eff(g.Kg), ee = eff(g.K), ed = eff(g.Cg);
  Mode m = Mode::kBcast;
  double best = eb;
  if (g.Kg < VL && ee > best + 1e-9) { m = Mode::kExp; best = ee; }
  if (ed > best + 1e-9 && (g.Kg < VL || ed > best * 2)) m = Mode::kDot;
  return m;
}

template <typename T>
void wgrad_engine(const ConvProblem& p, const Geo& g, const Plan& pl, const T* x, const T* dy,
                  T* dw, void* ws) {
  const int64_t Z = g.out[0], P = g.out[1], Q = g.out[2];
  const int64_t rows = g.N * Z * P;
  const int64_t taps = g.taps(), S = g.filt[2], VL = pl.VL;
  if (rows == 0 || Q == 0) {
    std::memset(dw, 0, sizeof(T) * static_cast<size_t>(p.w_elems()));
    return;
  }
  T* partial = static_cast<T*>(ws);
  void* ws_slots = static_cast<char*>(ws) +
                   align64(static_cast<size_t>(pl.packed) * sizeof(T) * pl.nchunks);
  const int64_t NC = pl.nchunks;
  const int64_t nqt = ceil_div(Q, pl.QT);
  const XView<T> xv{x, g.layout, g.C, g.in_pix()};
  const int64_t opix = g.out_pix();
  const bool nhwc = g.layout == Layout::kNHWC;
  const int64_t unit_elems = pl.packed / pl.units;

  run_items(NC, pl.nslots, [&](int64_t chunk, int64_t slot) {
    Slot<T> sl = slot_at<T>(ws_slots, pl, slot);
    std::memset(partial + chunk * pl.packed, 0, sizeof(T) * pl.packed);
    for (int64_t c = 0; c < pl.ncr; ++c) sl.tags[c] = -1;
    const int64_t rb = chunk * rows / NC, re = (chunk + 1) * rows / NC;
    T* pws[64];
    for (int64_t row = rb; row < re; ++row) {
      const int64_t pp = row % P, z = (row / P) % Z, n = row / (P * Z);
      for (int64_t qt = 0; qt < nqt; ++qt) {
        const int64_t q0 = qt * pl.QT, nq = std::min(pl.QT, Q - q0);
        const int64_t nr = gather_rows(g, pl, xv, sl, n, z, pp, q0, n * nqt + qt);
        if (nr == 0) continue;
        const int64_t rowpix = (z * P + pp) * Q + q0;
        for (int64_t u = 0; u < pl.units; ++u) {
        T* pu = partial + chunk * pl.packed + u * unit_elems;
        const int64_t uoff = u * pl.Wv * pl.E;
        if (pl.mode == Mode::kExp) {
          const int64_t k0 = u * VL, nl = std::min<int64_t>(VL, g.K - k0);
          const T* dyp;
          int64_t dyq;
          if (nhwc && nl == VL) {
            dyp = dy + (n * opix + rowpix) * g.K + k0;
            dyq = g.K;
          } else {
            T* b = sl.obuf;
            for (int64_t q = 0; q < nq; ++q)
              for (int64_t l = 0; l < VL; ++l)
                b[q * VL + l] =
                    l < nl ? (nhwc ? dy[(n * opix + rowpix + q) * g.K + k0 + l]
                                   : dy[(n * g.K + k0 + l) * opix + rowpix + q])
                           : T(0);
            dyp = b;
            dyq = VL;
          }
          const int64_t xq = g.str[2] * g.Cg * VL;
          const int64_t npairs = S * g.Cg;
          for (int64_t i = 0; i < nr; ++i) {
            const T* xr = sl.rowp[i] + uoff;
            const int64_t tap0 = sl.rowtap[i] * S;
            for (int64_t pb = 0; pb < npairs;) {
              const int np = static_cast<int>(std::min<int64_t>(kWgExpNP, npairs - pb));
              for (int j = 0; j < np; ++j) {
                const int64_t s = (pb + j) / g.Cg, c = (pb + j) % g.Cg;
                sl.offs[j] = (s * g.dil[2] * g.Cg + c) * VL;
                pws[j] = pu + ((tap0 + s) * g.Cg + c) * VL;
              }
              dispatch_n<kWgExpNP>(np, [&](auto NPc) {
                wg_exp_block<T, decltype(NPc)::value>(xr, sl.offs, xq, dyp, dyq, nq, pws);
              });
              pb += np;
            }
          }
        } else if (pl.mode == Mode::kBcast) {
          const T* dyp;
          int64_t dyq;
          if (nhwc && g.Kg == pl.Kgp) {
            dyp = dy + (n * opix + rowpix) * g.K + u * g.Kg;
            dyq = g.K;
          } else {
            T* b = sl.obuf;
            for (int64_t q = 0; q < nq; ++q)
              for (int64_t k = 0; k < pl.Kgp; ++k)
                b[q * pl.Kgp + k] =
                    k < g.Kg ? (nhwc ? dy[(n * opix + rowpix + q) * g.K + u * g.Kg + k]
                                     : dy[(n * g.K + u * g.Kg + k) * opix + rowpix + q])
                             : T(0);
            dyp = b;
            dyq = pl.Kgp;
          }
          const int64_t xq = g.str[2] * g.Cg;
          const int64_t npairs = S * g.Cg;
          const int64_t nkv = pl.Kgp / VL;
          for (int64_t i = 0; i < nr; ++i) {
            const T* xr = sl.rowp[i] + uoff;
            const int64_t tap0 = sl.rowtap[i] * S;
            for (int64_t kv = 0; kv < nkv;) {
              const int kb = static_cast<int>(std::min<int64_t>(4, nkv - kv));
              dispatch_n<4>(kb, [&](auto KBc) {
                constexpr int KB = decltype(KBc)::value;
                constexpr int NPM = wg_bx_np<KB>();
                for (int64_t pb = 0; pb < npairs;) {
                  const int np = static_cast<int>(std::min<int64_t>(NPM, npairs - pb));
                  for (int j = 0; j < np; ++j) {
                    const int64_t s = (pb + j) / g.Cg, c = (pb + j) % g.Cg;
                    sl.offs[j] = s * g.dil[2] * g.Cg + c;
                    pws[j] = pu + ((tap0 + s) * g.Cg + c) * pl.Kgp + kv * VL;
                  }
                  dispatch_n<NPM>(np, [&](auto NPc) {
                    wg_bx_block<T, decltype(NPc)::value, KB>(xr, sl.offs, xq, dyp + kv * VL, dyq,
                                                             nq, pws);
                  });
                  pb += np;
                }
              });
              kv += kb;
            }
          }
        } else {
          // BCAST-DY: vectors over input channels.
          const T* dyp;
          int64_t dyq, dyk;
          if (nhwc) {
            dyp = dy + (n * opix + rowpix) * g.K + u * g.Kg;
            dyq = g.K;
            dyk = 1;
          } else {
            dyp = dy + (n * g.K + u * g.Kg) * opix + rowpix;
            dyq = 1;
            dyk = opix;
          }
          const int64_t xq = g.str[2] * pl.Cgp;
          const int64_t ncv = pl.Cgp / VL;
          const int64_t npairs = S * ncv;
          for (int64_t i = 0; i < nr; ++i) {
            const T* xr = sl.rowp[i] + uoff;
            const int64_t tap0 = sl.rowtap[i] * S;
            for (int64_t k = 0; k < g.Kg;) {
              const int kd = static_cast<int>(std::min<int64_t>(4, g.Kg - k));
              dispatch_n<4>(kd, [&](auto KDc) {
                constexpr int KD = decltype(KDc)::value;
                constexpr int NPM = wg_bd_np<KD>();
                for (int64_t pb = 0; pb < npairs;) {
                  const int np = static_cast<int>(std::min<int64_t>(NPM, npairs - pb));
                  for (int j = 0; j < np; ++j) {
                    const int64_t s = (pb + j) / ncv, cv = (pb + j) % ncv;
                    sl.offs[j] = s * g.dil[2] * pl.Cgp + cv * VL;
                    pws[j] = pu + ((tap0 + s) * g.Kg + k) * pl.Cgp + cv * VL;
                  }
                  dispatch_n<NPM>(np, [&](auto NPc) {
                    wg_bd_block<T, decltype(NPc)::value, KD>(xr, sl.offs, xq, dyp + k * dyk, dyq,
                                                             dyk, nq, pws, pl.Cgp);
                  });
                  pb += np;
                }
              });
              k += kd;
            }
          }
        }
        }
      }
    }
  });

  // Fixed-order reduction over chunks into the filter layout.
  const int64_t Cg = g.Cg, K = g.K, Kg = g.Kg;
  parallel_for(taps * Cg, [&](int64_t b, int64_t e) {
    for (int64_t tc = b; tc < e; ++tc) {
      const int64_t tap = tc / Cg, c = tc % Cg;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t gi = k / Kg, kl = k % Kg;
        int64_t idx;
        if (pl.mode == Mode::kBcast) idx = ((gi * taps + tap) * Cg + c) * pl.Kgp + kl;
        else if (pl.mode == Mode::kExp) idx = (((k / VL) * taps + tap) * Cg + c) * VL + k % VL;
        else idx = ((gi * taps + tap) * Kg + kl) * pl.Cgp + c;
        T s = partial[idx];
        for (int64_t ch = 1; ch < NC; ++ch) s += partial[ch * pl.packed + idx];
        if (nhwc) dw[(tap * Cg + c) * K + k] = s;
        else dw[(k * Cg + c) * taps + tap] = s;
      }
    }
  }, 4);
}

// ------------------------------------------------------------------------------------------------

Geo op_geo(ConvOp op, const ConvProblem& p) {
  return op == ConvOp::kBackwardData ? dgrad_geo(p) : forward_geo(p);
}

template <typename T>
Plan op_plan(ConvOp op, const ConvProblem& p) {
  const Geo g = op_geo(op, p);
  if (op == ConvOp::kBackwardFilter) return make_plan<T>(g, choose_wgrad_mode<T>(g), true);
  return make_plan<T>(g, choose_mode<T>(g), false);
}

}  // namespace

template <typename T>
void direct_conv(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io) {
  const Geo g = op_geo(op, p);
  const Plan pl = op_plan<T>(op, p);
  if (op == ConvOp::kBackwardFilter) {
    wgrad_engine<T>(p, g, pl, io.a, io.b, io.out, io.workspace);
    return;
  }
  const int64_t out_elems = g.N * g.K * g.out_pix();
  if (out_elems == 0) return;
  T* wp = static_cast<T*>(io.workspace);
  void* ws_slots = static_cast<char*>(io.workspace) + align64(static_cast<size_t>(pl.packed) * sizeof(T));
  const T* w = io.b;
  const int64_t taps = p.filt_taps(), Cg = p.Cg(), Kg = p.Kg(), K = p.K;
  const bool nhwc = p.layout == Layout::kNHWC;
  auto orig = [&](int64_t tap, int64_t c, int64_t k) -> T {
    return nhwc ? w[(tap * Cg + c) * K + k] : w[(k * Cg + c) * taps + tap];
  };
  if (op == ConvOp::kForward) {
    pack_filter<T>(g, pl, wp, orig);
  } else {
    const int64_t R = p.filt[1], S = p.filt[2];
    pack_filter<T>(g, pl, wp, [&](int64_t tap, int64_t c, int64_t k) -> T {
      // Effective (tap', c' = original k local, k' = original c global).
      const int64_t t = tap / (R * S), r = (tap / S) % R, s = tap % S;
      const int64_t ft = ((p.filt[0] - 1 - t) * R + (R - 1 - r)) * S + (S - 1 - s);
      const int64_t gi = k / Cg;
      return orig(ft, k % Cg, gi * Kg + c);
    });
  }
  forward_engine<T>(g, pl, io.a, wp, io.out, ws_slots,
                    op == ConvOp::kForward ? io.epi : nullptr);
}

size_t direct_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes) {
  if (elem_bytes == 8) return plan_bytes(op_plan<double>(op, p), 8, op == ConvOp::kBackwardFilter);
  return plan_bytes(op_plan<float>(op, p), 4, op == ConvOp::kBackwardFilter);
}

template void direct_conv<float>(ConvOp, const ConvProblem&, const ConvOperands<float>&);
template void direct_conv<double>(ConvOp, const ConvProblem&, const ConvOperands<double>&);

}  // namespace jaxdnn::cpu
