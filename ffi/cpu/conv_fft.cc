// FFT and FFT_TILING families: convolution through discrete Fourier transforms, for stride 1,
// no dilation, any padding (negative and asymmetric too), groups, 1-D/2-D/3-D, both layouts.
//
// The algebra (per spatial axis; a cyclic length L and an output range handled per tile):
//   forward   y[o]  = sum_f w[f] x[o + f - pad_lo]           a correlation:  Y = X . conj(W)
//   bwd-data  dx[i] = sum_f w[f] dy[i + pad_lo - f]           a convolution:  DX = DY . W
//   bwd-filt  dw[f] = sum_{n,o} x[o + f - pad_lo] dy[o]       a correlation:  DW = sum_n X . conj(DY)
// where capital letters are the DFTs of L-periodic signals. A tile of To outputs starting at t0
// needs To + R - 1 input samples, so with L >= To + R - 1 no product wraps around the period:
//   forward:  xt[j] = x[j + t0 - pad_lo],  j < To + R - 1;  y[t0 + j] = ifft(XT . conj(W))[j]
//   bwd-data: dyt[j] = dy[j + t0 - (R - 1 - pad_lo)];       dx[t0 + j] = ifft(DYT . W)[j + R - 1]
//   bwd-filt: xt as forward, dyt[j] = dy[t0 + j] (j < To); dw[f] = ifft(sum XT . conj(DYT))[f]
// (zero wherever the shifted index leaves the tensor: that is the padding). Backward-data is thus
// the forward pass on dy with the flipped, channel-swapped filter, the flip done by the spectrum
// (no conjugate) and the shift R - 1 of the output window. FFT transforms the whole image: one
// tile per image, L the smallest 5-smooth size >= extent + R - 1 per axis. FFT_TILING cuts the
// output into tiles (overlap-save) whose cyclic lengths a fitted cost model picks per problem
// (pass_cost: ~16-20 per axis for 3x3/5x5 filters in 2-D, ~1600-2048 for a 255-tap 1-D filter;
// an axis whose filter is 1 gets L = 1) and treats tiles like extra images, so the workspace is
// bounded by a chunk of tiles whatever the image size.
//
// Layers of the implementation, bottom up:
//   * Transforms work on "lane blocks": V = 64 / sizeof(T) independent real signals (16 floats or
//     8 doubles) stored lane-innermost, so every butterfly is one vector operation over V signals
//     and nothing is transposed. Two blocks travel together as the real and imaginary parts of
//     one complex signal (the classic two-real-FFTs-for-one trick), and their half spectra are
//     separated afterwards; the inverse packs two half spectra into one complex signal likewise.
//   * 1-D complex FFTs: mixed-radix (4, 2, 3, 5) Stockham autosort between two line buffers,
//     twiddles precomputed in double. 2-D/3-D: one axis after the other, the first pass of a
//     forward transform only on lines that hold data, the last pass of an inverse only on lines
//     that are stored (zero padding and cropping are pruned, not computed).
//   * Spectra live in the workspace as [bin tile][block][bin] of CV (V complex numbers, planar;
//     tiles of 16 bins), bins L0 x L1 x (L2/2 + 1) (Hermitian half). The per-bin channel
//     contraction is a small complex matrix product: Out[r][j] (+)= sum_i A(r, i) . op(B[i][j]),
//     op = conj or identity, vector over j (a lane block), 4 rows x 2 blocks per register block,
//     A broadcast from a packed copy.
//   * Loop structure: rows (image x tile) in chunks of ~8 MB of spectra; the filter-side
//     spectrum (bins x C x K / G, the largest) in chunks of ~4 MB of output (input, for dgrad)
//     channels, each transformed, contracted and dropped in turn (cache-resident).
// Signals are mapped to lanes by per-lane gather offsets, so any layout, group count and channel
// count works; when the lanes are V consecutive channels of one pixel (NHWC, channel counts that
// fill a block) loads and stores are plain vector copies. The activation operand is packed
// "flat" (signal = row * channels + channel), so small channel counts (C = 1, 3) still fill the
// lanes; matrices indexed by output channel are padded per row to whole blocks.
//
// Per-thread scratch (the transform's work buffer and line buffers, the product's packed A) is
// carved out of the workspace per pool thread, so the workspace depends on JAXDNN_NUM_THREADS.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "conv_cpu.h"
#include "gemm.h"
#include "parallel.h"

namespace jaxdnn::cpu {
namespace {

template <typename T>
constexpr int lanes() {
  return 64 / static_cast<int>(sizeof(T));
}

// V complex numbers, planar: the element of every transform and spectrum. 128 bytes for both T.
template <typename T>
struct alignas(64) CV {
  T re[lanes<T>()];
  T im[lanes<T>()];
};
constexpr size_t kCVBytes = 128;
static_assert(sizeof(CV<float>) == kCVBytes && sizeof(CV<double>) == kCVBytes);

// A vector of the V lanes of a CV component (GCC vector extension: one 512-bit register, or two
// 256-bit ones).
template <typename T>
struct VecOf {
  typedef T type __attribute__((vector_size(64)));
};

// ---------------------------------------------------------------------------------------------
// Sizes.

bool is_smooth(int64_t n) {
  for (int64_t f : {2, 3, 5})
    while (n % f == 0) n /= f;
  return n == 1;
}

// The smallest 5-smooth integer >= n (n >= 1).
int64_t next_smooth(int64_t n) {
  n = std::max<int64_t>(n, 1);
  while (!is_smooth(n)) ++n;
  return n;
}

// Whole-image transforms above this many points per lane block are refused (the two per-thread
// work buffers would pass 32 MiB): FFT_TILING handles such images.
constexpr int64_t kMaxFftPoints = int64_t{1} << 17;
// Problems whose workspace (mostly the filter-side spectrum: bins x C x K / G complex numbers)
// would pass this are refused by both families (the spectrum is not cut into channel blocks).
constexpr int64_t kMaxWorkspaceBytes = int64_t{2} << 30;
// Spectra of one chunk of tiles (activation operand and result), about this many bytes.
constexpr int64_t kChunkBytes = int64_t{8} << 20;
// The filter-side spectrum is cut into blocks of output (forward, backward-filter) or input
// (backward-data) channels of about this many bytes, each transformed, used and dropped in turn:
// it stays in cache and the workspace stays small.
constexpr int64_t kFilterChunkBytes = int64_t{4} << 20;
// Rows of the product's register block.
constexpr int kRB = 4;
// Spectra are stored in tiles of kBT consecutive bins: [bin / kBT][block][bin % kBT], so that a
// transform writes runs of kBT elements and a product over a tile of bins stays in cache.
constexpr int64_t kBT = 16;
inline int64_t bin_off(int64_t bin, int64_t nblk) { return (bin / kBT) * nblk * kBT + bin % kBT; }

// ---------------------------------------------------------------------------------------------
// 1-D mixed-radix Stockham FFT over lane blocks.

template <typename T>
struct LinePlan {
  int64_t L = 1;
  std::vector<int> radix;
  std::vector<int64_t> tw_off;  // per stage, into tw
  std::vector<T> tw;            // per stage: [p][k - 1] (re, im) of exp(-2 pi i p k / n), p < n / R
};

template <typename T>
LinePlan<T> make_line_plan(int64_t L) {
  LinePlan<T> pl;
  pl.L = L;
  int64_t n = L;
  auto take = [&](int r) {
    while (n % r == 0 && n > 1 && !(r == 2 && n % 4 == 0)) {
      pl.radix.push_back(r);
      n /= r;
    }
  };
  take(4);
  take(2);
  take(3);
  take(5);
  n = L;
  for (int r : pl.radix) {
    const int64_t m = n / r;
    pl.tw_off.push_back(static_cast<int64_t>(pl.tw.size()));
    for (int64_t p = 0; p < m; ++p)
      for (int k = 1; k < r; ++k) {
        const double a = -2.0 * M_PI * static_cast<double>(p * k) / static_cast<double>(n);
        pl.tw.push_back(static_cast<T>(std::cos(a)));
        pl.tw.push_back(static_cast<T>(std::sin(a)));
      }
    n = m;
  }
  return pl;
}

// The size-R DFT of (ar, ai) into (br, bi), sign exp(sigma * 2 pi i jk / R), sigma = Inv ? + : -.
template <typename T, int R, bool Inv>
__attribute__((always_inline)) inline void butterfly(const T* ar, const T* ai, T* br, T* bi) {
  constexpr T sg = Inv ? T(1) : T(-1);
  if constexpr (R == 2) {
    br[0] = ar[0] + ar[1], bi[0] = ai[0] + ai[1];
    br[1] = ar[0] - ar[1], bi[1] = ai[0] - ai[1];
  } else if constexpr (R == 4) {
    const T t0r = ar[0] + ar[2], t0i = ai[0] + ai[2], t1r = ar[0] - ar[2], t1i = ai[0] - ai[2];
    const T t2r = ar[1] + ar[3], t2i = ai[1] + ai[3], t3r = ar[1] - ar[3], t3i = ai[1] - ai[3];
    br[0] = t0r + t2r, bi[0] = t0i + t2i;
    br[2] = t0r - t2r, bi[2] = t0i - t2i;
    br[1] = t1r - sg * t3i, bi[1] = t1i + sg * t3r;  // t1 + sigma i t3
    br[3] = t1r + sg * t3i, bi[3] = t1i - sg * t3r;
  } else if constexpr (R == 3) {
    constexpr T h = T(0.86602540378443864676);  // sqrt(3) / 2
    const T tr = ar[1] + ar[2], ti = ai[1] + ai[2], dr = ar[1] - ar[2], di = ai[1] - ai[2];
    const T mr = ar[0] - T(0.5) * tr, mi = ai[0] - T(0.5) * ti;
    br[0] = ar[0] + tr, bi[0] = ai[0] + ti;
    br[1] = mr - sg * h * di, bi[1] = mi + sg * h * dr;
    br[2] = mr + sg * h * di, bi[2] = mi - sg * h * dr;
  } else {
    static_assert(R == 5);
    constexpr T c1 = T(0.30901699437494742410), c2 = T(-0.80901699437494742410);
    constexpr T s1 = T(0.95105651629515357212), s2 = T(0.58778525229247312917);
    const T t1r = ar[1] + ar[4], t1i = ai[1] + ai[4], d1r = ar[1] - ar[4], d1i = ai[1] - ai[4];
    const T t2r = ar[2] + ar[3], t2i = ai[2] + ai[3], d2r = ar[2] - ar[3], d2i = ai[2] - ai[3];
    const T m1r = ar[0] + c1 * t1r + c2 * t2r, m1i = ai[0] + c1 * t1i + c2 * t2i;
    const T m2r = ar[0] + c2 * t1r + c1 * t2r, m2i = ai[0] + c2 * t1i + c1 * t2i;
    const T e1r = s1 * d1r + s2 * d2r, e1i = s1 * d1i + s2 * d2i;
    const T e2r = s2 * d1r - s1 * d2r, e2i = s2 * d1i - s1 * d2i;
    br[0] = ar[0] + t1r + t2r, bi[0] = ai[0] + t1i + t2i;
    br[1] = m1r - sg * e1i, bi[1] = m1i + sg * e1r;
    br[4] = m1r + sg * e1i, bi[4] = m1i - sg * e1r;
    br[2] = m2r - sg * e2i, bi[2] = m2i + sg * e2r;
    br[3] = m2r + sg * e2i, bi[3] = m2i - sg * e2r;
  }
}

// One Stockham stage of length n = R * m at stride s, on elements of wv CVs each:
//   y[q + s (R p + k)] = w_n^(p k) * sum_j x[q + s (p + j m)] w_R^(j k).
// wv = 1 transforms one line; wv = a row (plane) length transforms all columns of a plane
// (volume) at once, the inner loop running over whole contiguous rows.
template <typename T, int R, bool Inv>
void stage(int64_t m, int64_t s, int64_t wv, const CV<T>* __restrict x, CV<T>* __restrict y,
           const T* tw) {
  constexpr int V = lanes<T>();
  for (int64_t p = 0; p < m; ++p) {
    T wr[R], wi[R];
    for (int k = 1; k < R; ++k) {
      wr[k] = tw[2 * (p * (R - 1) + k - 1)];
      wi[k] = Inv ? -tw[2 * (p * (R - 1) + k - 1) + 1] : tw[2 * (p * (R - 1) + k - 1) + 1];
    }
    for (int64_t q = 0; q < s; ++q) {
      const T* __restrict a[R];
      T* __restrict b[R];
      for (int j = 0; j < R; ++j) a[j] = x[(q + s * (p + j * m)) * wv].re;
      for (int k = 0; k < R; ++k) b[k] = y[(q + s * (R * p + k)) * wv].re;
      for (int64_t e = 0; e < wv; ++e) {
        const int64_t o = e * 2 * V;
#pragma GCC ivdep
        for (int l = 0; l < V; ++l) {
          T ar[R], ai[R], br[R], bi[R];
          for (int j = 0; j < R; ++j) ar[j] = a[j][o + l], ai[j] = a[j][o + V + l];
          butterfly<T, R, Inv>(ar, ai, br, bi);
          b[0][o + l] = br[0], b[0][o + V + l] = bi[0];
          for (int k = 1; k < R; ++k) {
            b[k][o + l] = br[k] * wr[k] - bi[k] * wi[k];
            b[k][o + V + l] = br[k] * wi[k] + bi[k] * wr[k];
          }
        }
      }
    }
  }
}

// The DFT of the sequence x (length pl.L, elements of wv CVs) using y as the other buffer;
// returns the buffer holding the result (x or y). Inverse: exp(+2 pi i jk / L), unscaled.
template <typename T, bool Inv>
CV<T>* fft_line(const LinePlan<T>& pl, CV<T>* x, CV<T>* y, int64_t wv = 1) {
  int64_t n = pl.L, s = 1;
  for (size_t st = 0; st < pl.radix.size(); ++st) {
    const int r = pl.radix[st];
    const int64_t m = n / r;
    const T* tw = pl.tw.data() + pl.tw_off[st];
    switch (r) {
      case 4: stage<T, 4, Inv>(m, s, wv, x, y, tw); break;
      case 2: stage<T, 2, Inv>(m, s, wv, x, y, tw); break;
      case 3: stage<T, 3, Inv>(m, s, wv, x, y, tw); break;
      default: stage<T, 5, Inv>(m, s, wv, x, y, tw); break;
    }
    std::swap(x, y);
    n = m;
    s *= r;
  }
  return x;
}

// ---------------------------------------------------------------------------------------------
// Lane blocks: which real signal each lane carries and where it lies in its tensor.

struct Lane {
  int64_t base = -1;  // offset of the signal's element at spatial index (0, 0, 0); -1: no signal
  int64_t ch = 0;     // output channel (forward results: the fused epilogue's bias index)
  int64_t org[3] = {0, 0, 0};  // spatial index = org + j for cyclic position j
  int64_t lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};  // positions j in [lo, hi) are read / written
};

template <typename T>
struct Block {
  Lane lane[lanes<T>()];
  bool any = false;     // some lane has a signal with a nonempty window
  bool contig = false;  // all lanes present, bases consecutive, same origin and window
  int64_t lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};  // union of the lanes' windows
};

// A tensor: data, spatial extents and strides (elements).
template <typename T>
struct TensorView {
  T* p;
  int64_t ext[3], st[3];
};

// Sets a lane to a signal at `base` with origin org and cyclic window [wlo, whi) per axis,
// clipped to the tensor's extent.
inline void set_lane(Lane& ln, int64_t base, const int64_t org[3], const int64_t wlo[3],
                     const int64_t whi[3], const int64_t ext[3]) {
  ln.base = base;
  for (int a = 0; a < 3; ++a) {
    ln.org[a] = org[a];
    ln.lo[a] = std::max(wlo[a], -org[a]);
    ln.hi[a] = std::min(whi[a], ext[a] - org[a]);
    if (ln.lo[a] >= ln.hi[a]) ln.base = -1;
  }
}

template <typename T>
void finish_block(Block<T>& b) {
  constexpr int V = lanes<T>();
  b.any = false;
  b.contig = true;
  for (int a = 0; a < 3; ++a) b.lo[a] = INT64_MAX, b.hi[a] = INT64_MIN;
  for (int l = 0; l < V; ++l) {
    const Lane& ln = b.lane[l];
    if (ln.base < 0) {
      b.contig = false;
      continue;
    }
    b.any = true;
    for (int a = 0; a < 3; ++a) {
      b.lo[a] = std::min(b.lo[a], ln.lo[a]);
      b.hi[a] = std::max(b.hi[a], ln.hi[a]);
      if (ln.org[a] != b.lane[0].org[a] || ln.lo[a] != b.lane[0].lo[a] ||
          ln.hi[a] != b.lane[0].hi[a])
        b.contig = false;
    }
    if (ln.base != b.lane[0].base + l) b.contig = false;
  }
  if (!b.any)
    for (int a = 0; a < 3; ++a) b.lo[a] = b.hi[a] = 0;
}

// ---------------------------------------------------------------------------------------------
// Multi-dimensional real transforms of a pair of lane blocks.

template <typename T>
struct Transform3 {
  int64_t L[3];
  LinePlan<T> line[3];
  int64_t H2() const { return L[2] / 2 + 1; }
  int64_t points() const { return L[0] * L[1] * L[2]; }
  int64_t bins() const { return L[0] * L[1] * H2(); }
  // Per-thread scratch: two work buffers plus two line buffers, in CV elements.
  int64_t scratch_cv() const { return 2 * points() + 2 * L[2]; }
};

template <typename T>
Transform3<T> make_transform(const int64_t L[3]) {
  Transform3<T> t;
  for (int a = 0; a < 3; ++a) {
    t.L[a] = L[a];
    t.line[a] = make_line_plan<T>(L[a]);
  }
  return t;
}

// Loads the line (j0, j1) of the lanes of `b` into component `im` (false: re) of buf[0, L2).
template <typename T>
void load_line(const TensorView<T>& tv, const Block<T>& b, int64_t j0, int64_t j1, bool im,
               CV<T>* buf) {
  constexpr int V = lanes<T>();
  if (b.contig) {
    const Lane& ln = b.lane[0];
    if (j0 < ln.lo[0] || j0 >= ln.hi[0] || j1 < ln.lo[1] || j1 >= ln.hi[1]) return;
    const T* src = tv.p + ln.base + (ln.org[0] + j0) * tv.st[0] + (ln.org[1] + j1) * tv.st[1] +
                   ln.org[2] * tv.st[2];
    for (int64_t j2 = ln.lo[2]; j2 < ln.hi[2]; ++j2)
      std::memcpy(im ? buf[j2].im : buf[j2].re, src + j2 * tv.st[2], sizeof(T) * V);
    return;
  }
  for (int l = 0; l < V; ++l) {
    const Lane& ln = b.lane[l];
    if (ln.base < 0 || j0 < ln.lo[0] || j0 >= ln.hi[0] || j1 < ln.lo[1] || j1 >= ln.hi[1])
      continue;
    const T* src = tv.p + ln.base + (ln.org[0] + j0) * tv.st[0] + (ln.org[1] + j1) * tv.st[1] +
                   ln.org[2] * tv.st[2];
    if (im)
      for (int64_t j2 = ln.lo[2]; j2 < ln.hi[2]; ++j2) buf[j2].im[l] = src[j2 * tv.st[2]];
    else
      for (int64_t j2 = ln.lo[2]; j2 < ln.hi[2]; ++j2) buf[j2].re[l] = src[j2 * tv.st[2]];
  }
}

// Stores component `im` of buf[0, L2) (times scale) to the lanes of `b` on line (j0, j1), then
// applies the fused epilogue `epi` (forward results only; null otherwise) to what it stored.
template <typename T>
void store_line(const TensorView<T>& tv, const Block<T>& b, int64_t j0, int64_t j1, bool im,
                const CV<T>* buf, T scale, const CpuEpilogue<T>* epi) {
  constexpr int V = lanes<T>();
  if (b.contig) {
    const Lane& ln = b.lane[0];
    if (j0 < ln.lo[0] || j0 >= ln.hi[0] || j1 < ln.lo[1] || j1 >= ln.hi[1]) return;
    T* dst = tv.p + ln.base + (ln.org[0] + j0) * tv.st[0] + (ln.org[1] + j1) * tv.st[1] +
             ln.org[2] * tv.st[2];
    for (int64_t j2 = ln.lo[2]; j2 < ln.hi[2]; ++j2) {
      const T* s = im ? buf[j2].im : buf[j2].re;
      T* d = dst + j2 * tv.st[2];
      for (int l = 0; l < V; ++l) d[l] = s[l] * scale;
      if (epi) epi->apply(d, V, 1, ln.ch, 1);  // V consecutive channels of one pixel
    }
    return;
  }
  for (int l = 0; l < V; ++l) {
    const Lane& ln = b.lane[l];
    if (ln.base < 0 || j0 < ln.lo[0] || j0 >= ln.hi[0] || j1 < ln.lo[1] || j1 >= ln.hi[1])
      continue;
    T* dst = tv.p + ln.base + (ln.org[0] + j0) * tv.st[0] + (ln.org[1] + j1) * tv.st[1] +
             ln.org[2] * tv.st[2];
    if (im)
      for (int64_t j2 = ln.lo[2]; j2 < ln.hi[2]; ++j2) dst[j2 * tv.st[2]] = buf[j2].im[l] * scale;
    else
      for (int64_t j2 = ln.lo[2]; j2 < ln.hi[2]; ++j2) dst[j2 * tv.st[2]] = buf[j2].re[l] * scale;
    if (epi) epi->apply(dst + ln.lo[2] * tv.st[2], ln.hi[2] - ln.lo[2], tv.st[2], ln.ch, 0);
  }
}

// DFT of the volume *cur (L0 x L1 x L2) along axis 1 on the planes j0 with take(j0), then along
// axis 0, each as one wide-element Stockham pass between *cur and *other (swapped so that *cur
// holds the result). Planes left out are zero in the input and stay zero in the result.
template <typename T, bool Inv, class Take>
void pass_axis1(const Transform3<T>& t, CV<T>** cur, CV<T>** other, const Take& take) {
  const int64_t L0 = t.L[0], L1 = t.L[1], L2 = t.L[2];
  if (L1 == 1) return;
  const bool odd = t.line[1].radix.size() % 2 == 1;
  for (int64_t j0 = 0; j0 < L0; ++j0) {
    CV<T>* x = *cur + j0 * L1 * L2;
    CV<T>* y = *other + j0 * L1 * L2;
    if (take(j0))
      fft_line<T, Inv>(t.line[1], x, y, L2);
    else if (odd)
      std::memset(static_cast<void*>(y), 0, kCVBytes * L1 * L2);
  }
  if (odd) std::swap(*cur, *other);
}

template <typename T, bool Inv>
void pass_axis0(const Transform3<T>& t, CV<T>** cur, CV<T>** other) {
  if (t.L[0] == 1) return;
  if (fft_line<T, Inv>(t.line[0], *cur, *other, t.L[1] * t.L[2]) != *cur) std::swap(*cur, *other);
}

// Forward real transform of the signals of blocks `ba` (real part) and `bb` (imaginary part,
// may be null) into their half spectra: dst_a[bin_off(bin, nblk)], likewise dst_b (unused when
// bb is null). scratch: t.scratch_cv() elements.
template <typename T>
void forward_pair(const Transform3<T>& t, const TensorView<T>& tv, const Block<T>& ba,
                  const Block<T>* bb, CV<T>* dst_a, CV<T>* dst_b, int64_t nblk, CV<T>* scratch) {
  constexpr int V = lanes<T>();
  const int64_t L0 = t.L[0], L1 = t.L[1], L2 = t.L[2], H2 = t.H2();
  CV<T>* Z = scratch;
  CV<T>* Z2 = Z + t.points();
  CV<T>* b1 = Z2 + t.points();
  CV<T>* b2 = b1 + L2;
  int64_t lo[3], hi[3];
  for (int a = 0; a < 3; ++a) {
    lo[a] = ba.lo[a], hi[a] = ba.hi[a];
    if (bb && bb->any) {
      lo[a] = ba.any ? std::min(lo[a], bb->lo[a]) : bb->lo[a];
      hi[a] = ba.any ? std::max(hi[a], bb->hi[a]) : bb->hi[a];
    }
  }
  // Axis 2 on the lines that hold data; the other lines are zero.
  for (int64_t j0 = 0; j0 < L0; ++j0)
    for (int64_t j1 = 0; j1 < L1; ++j1) {
      CV<T>* zl = Z + (j0 * L1 + j1) * L2;
      if (j0 < lo[0] || j0 >= hi[0] || j1 < lo[1] || j1 >= hi[1]) {
        std::memset(static_cast<void*>(zl), 0, kCVBytes * L2);
        continue;
      }
      std::memset(static_cast<void*>(b1), 0, kCVBytes * L2);
      if (ba.any) load_line(tv, ba, j0, j1, false, b1);
      if (bb && bb->any) load_line(tv, *bb, j0, j1, true, b1);
      const CV<T>* r = fft_line<T, false>(t.line[2], b1, b2);
      std::memcpy(static_cast<void*>(zl), r, kCVBytes * L2);
    }
  pass_axis1<T, false>(t, &Z, &Z2, [&](int64_t j0) { return j0 >= lo[0] && j0 < hi[0]; });
  pass_axis0<T, false>(t, &Z, &Z2);
  // Separate: A = (Z(u) + conj Z(-u)) / 2, B = (Z(u) - conj Z(-u)) / 2i.
  for (int64_t u0 = 0; u0 < L0; ++u0)
    for (int64_t u1 = 0; u1 < L1; ++u1) {
      const CV<T>* zp = Z + (u0 * L1 + u1) * L2;
      const CV<T>* zm = Z + (((L0 - u0) % L0) * L1 + (L1 - u1) % L1) * L2;
      for (int64_t v = 0; v < H2; ++v) {
        const T* __restrict p = zp[v].re;
        const T* __restrict m = zm[(L2 - v) % L2].re;
        const int64_t bin = (u0 * L1 + u1) * H2 + v;
        alignas(64) T o[4 * V];
        for (int l = 0; l < V; ++l) {
          o[l] = T(0.5) * (p[l] + m[l]);
          o[V + l] = T(0.5) * (p[V + l] - m[V + l]);
          o[2 * V + l] = T(0.5) * (p[V + l] + m[V + l]);
          o[3 * V + l] = T(0.5) * (m[l] - p[l]);
        }
        std::memcpy(static_cast<void*>(&dst_a[bin_off(bin, nblk)]), o, kCVBytes);
        if (bb) std::memcpy(static_cast<void*>(&dst_b[bin_off(bin, nblk)]), o + 2 * V, kCVBytes);
      }
    }
}

// Inverse of forward_pair: the half spectra src_a / src_b (at bin_off(bin, nblk); src_b, bb may be
// null) to real signals stored (times scale) into the lanes of ba / bb.
template <typename T>
void inverse_pair(const Transform3<T>& t, const TensorView<T>& tv, const Block<T>& ba,
                  const Block<T>* bb, const CV<T>* src_a, const CV<T>* src_b, int64_t nblk,
                  T scale, CV<T>* scratch, const CpuEpilogue<T>* epi) {
  const int64_t L0 = t.L[0], L1 = t.L[1], L2 = t.L[2], H2 = t.H2();
  CV<T>* Z = scratch;
  CV<T>* Z2 = Z + t.points();
  CV<T>* b1 = Z2 + t.points();
  int64_t lo[3], hi[3];
  for (int a = 0; a < 3; ++a) {
    lo[a] = ba.lo[a], hi[a] = ba.hi[a];
    if (bb && bb->any) {
      lo[a] = ba.any ? std::min(lo[a], bb->lo[a]) : bb->lo[a];
      hi[a] = ba.any ? std::max(hi[a], bb->hi[a]) : bb->hi[a];
    }
  }
  // Z = A + i B over the full spectrum (Hermitian extension of the half spectra):
  //   v < H2: Z = (ar - bi, ai + br);  mirrored (A = conj A(-u), likewise B): Z = (ar + bi, br - ai).
  using vec = typename VecOf<T>::type;
  auto ld = [](const T* p) {
    vec v;
    std::memcpy(&v, p, sizeof(vec));
    return v;
  };
  auto st = [](T* p, vec v) { std::memcpy(p, &v, sizeof(vec)); };
  for (int64_t u0 = 0; u0 < L0; ++u0)
    for (int64_t u1 = 0; u1 < L1; ++u1) {
      CV<T>* zl = Z + (u0 * L1 + u1) * L2;
      const int64_t row = (u0 * L1 + u1) * H2;
      const int64_t mrow = (((L0 - u0) % L0) * L1 + (L1 - u1) % L1) * H2;
      for (int64_t v = 0; v < L2; ++v) {
        const bool direct = v < H2;
        const int64_t off = bin_off(direct ? row + v : mrow + (L2 - v), nblk);
        const vec ar = ld(src_a[off].re), ai = ld(src_a[off].im);
        const vec br = src_b ? ld(src_b[off].re) : vec{}, bi = src_b ? ld(src_b[off].im) : vec{};
        if (direct) {
          st(zl[v].re, ar - bi);
          st(zl[v].im, ai + br);
        } else {
          st(zl[v].re, ar + bi);
          st(zl[v].im, br - ai);
        }
      }
    }
  pass_axis0<T, true>(t, &Z, &Z2);
  pass_axis1<T, true>(t, &Z, &Z2, [&](int64_t j0) { return j0 >= lo[0] && j0 < hi[0]; });
  for (int64_t j0 = lo[0]; j0 < hi[0]; ++j0)
    for (int64_t j1 = lo[1]; j1 < hi[1]; ++j1) {
      const CV<T>* r = fft_line<T, true>(t.line[2], Z + (j0 * L1 + j1) * L2, b1);
      if (ba.any) store_line(tv, ba, j0, j1, false, r, scale, epi);
      if (bb && bb->any) store_line(tv, *bb, j0, j1, true, r, scale, epi);
    }
}

// ---------------------------------------------------------------------------------------------
// The per-bin channel contraction.

// Out[bin][orow(r, g)][jb] (+)= sum_i A(bin, r * ar + i * ai + g * ag) . op(B[bin][brow(i, g)][jb])
//   orow = r * o_r + g * o_g,  brow = i * b_i + g * b_g;  A scalar (flat, nblk_a blocks per bin),
//   B and Out in blocks (nblk_b, nblk_o per bin) of cb blocks per row.
struct Contraction {
  int64_t G, R, I;      // groups, rows, reduction (per group)
  int64_t ar, ai, ag;   // A flat index strides
  int64_t b_i, b_g, o_r, o_g;
  int64_t nblk_a, nblk_b, nblk_o;
  int64_t cb = 0;       // blocks per row of B and Out
  bool conj_b = false;
  bool accumulate = false;
};


// Out rows (up to kRB, JB lane blocks each; nrows of them stored) (+)= sum_i a(rr, i) . op(B row
// i), a from the packed apr / api [kRB][I], B row i at b0 + i * bstep (its blocks kBT apart).
template <typename T, bool Conj, int JB>
__attribute__((always_inline)) inline void micro(int64_t I, const T* apr, const T* api,
                                                 const CV<T>* b0, int64_t bstep, CV<T>* const* out,
                                                 int64_t nrows, bool accumulate) {
  using vec = typename VecOf<T>::type;
  vec accr[kRB][JB], acci[kRB][JB];
#pragma GCC unroll 4
  for (int rr = 0; rr < kRB; ++rr)
#pragma GCC unroll 2
    for (int jj = 0; jj < JB; ++jj) {
      if (accumulate && rr < nrows) {
        std::memcpy(&accr[rr][jj], out[rr][jj * kBT].re, sizeof(vec));
        std::memcpy(&acci[rr][jj], out[rr][jj * kBT].im, sizeof(vec));
      } else {
        accr[rr][jj] = vec{};
        acci[rr][jj] = vec{};
      }
    }
  for (int64_t i = 0; i < I; ++i) {
    const CV<T>* b = b0 + i * bstep;
    vec br[JB], bi[JB];
#pragma GCC unroll 2
    for (int jj = 0; jj < JB; ++jj) {
      std::memcpy(&br[jj], b[jj * kBT].re, sizeof(vec));
      std::memcpy(&bi[jj], b[jj * kBT].im, sizeof(vec));
    }
#pragma GCC unroll 4
    for (int rr = 0; rr < kRB; ++rr) {
      const T xr = apr[rr * I + i], xi = api[rr * I + i];
#pragma GCC unroll 2
      for (int jj = 0; jj < JB; ++jj) {
        // Two fused multiply-adds per component (written so that each contracts into one).
        accr[rr][jj] += xr * br[jj];
        acci[rr][jj] += xi * br[jj];
        if constexpr (Conj) {
          accr[rr][jj] += xi * bi[jj];
          acci[rr][jj] -= xr * bi[jj];
        } else {
          accr[rr][jj] -= xi * bi[jj];
          acci[rr][jj] += xr * bi[jj];
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int rr = 0; rr < kRB; ++rr)
#pragma GCC unroll 2
    for (int jj = 0; jj < JB; ++jj)
      if (rr < nrows) {
        std::memcpy(out[rr][jj * kBT].re, &accr[rr][jj], sizeof(vec));
        std::memcpy(out[rr][jj * kBT].im, &acci[rr][jj], sizeof(vec));
      }
}

// Runs the contraction for bins [b0, b1) with `pack` (2 * kRB * I elements of T) as scratch.
template <typename T, bool Conj>
void contract_bins(const Contraction& c, const CV<T>* A, const CV<T>* B, CV<T>* Out, int64_t bin0,
                   int64_t bin1, T* pack) {
  constexpr int V = lanes<T>();
  const int64_t cb = c.cb;
  T* apr = pack;
  T* api = pack + kRB * c.I;
  for (int64_t bin = bin0; bin < bin1; ++bin) {
    const CV<T>* Ab = A + bin_off(bin, c.nblk_a);
    const CV<T>* Bb = B + bin_off(bin, c.nblk_b);
    CV<T>* Ob = Out + bin_off(bin, c.nblk_o);
    for (int64_t g = 0; g < c.G; ++g)
      for (int64_t r0 = 0; r0 < c.R; r0 += kRB) {
        const int64_t nr = std::min<int64_t>(kRB, c.R - r0);
        // Pack the rows' A values as apr[rr * I + i] (whole lane blocks at a time when the
        // reduction index runs along the lanes).
        for (int rr = 0; rr < kRB; ++rr) {
          T* pr = apr + rr * c.I;
          T* pi = api + rr * c.I;
          if (rr >= nr) {
            std::fill(pr, pr + c.I, T(0));
            std::fill(pi, pi + c.I, T(0));
            continue;
          }
          uint64_t f = static_cast<uint64_t>((r0 + rr) * c.ar + g * c.ag);
          int64_t i = 0;
          if (c.ai == 1) {
            for (; i < c.I && f % V != 0; ++i, ++f) {
              pr[i] = Ab[f / V * kBT].re[f % V];
              pi[i] = Ab[f / V * kBT].im[f % V];
            }
            for (; i + V <= c.I; i += V, f += V) {
              std::memcpy(pr + i, Ab[f / V * kBT].re, sizeof(T) * V);
              std::memcpy(pi + i, Ab[f / V * kBT].im, sizeof(T) * V);
            }
          }
          for (; i < c.I; ++i, f += c.ai) {
            pr[i] = Ab[f / V * kBT].re[f % V];
            pi[i] = Ab[f / V * kBT].im[f % V];
          }
        }
        const CV<T>* brow = Bb + g * c.b_g * cb * kBT;
        const int64_t bstep = c.b_i * cb * kBT;
        for (int64_t jb = 0; jb < cb; jb += 2) {
          CV<T>* orow[kRB];
          for (int rr = 0; rr < kRB; ++rr)
            orow[rr] = Ob + (((r0 + std::min<int64_t>(rr, nr - 1)) * c.o_r + g * c.o_g) * cb + jb) * kBT;
          if (jb + 1 < cb)
            micro<T, Conj, 2>(c.I, apr, api, brow + jb * kBT, bstep, orow, nr, c.accumulate);
          else
            micro<T, Conj, 1>(c.I, apr, api, brow + jb * kBT, bstep, orow, nr, c.accumulate);
        }
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Work distribution: fn(slot, item) for items [0, n), each pool thread with its own slot.

template <class Fn>
void for_each_slot(int64_t n, int64_t slots, const Fn& fn) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t s = std::max<int64_t>(1, std::min(slots, n));
  parallel_for(s, [&](int64_t b, int64_t e) {
    for (int64_t slot = b; slot < e; ++slot)
      for (int64_t i; (i = next.fetch_add(1)) < n;) fn(slot, i);
  }, 1, 1);
}

// ---------------------------------------------------------------------------------------------
// The plan of one operation: tiles, cyclic lengths, chunking and workspace.

struct Plan {
  int64_t L[3] = {1, 1, 1}, To[3] = {1, 1, 1}, nt[3] = {1, 1, 1};
  int64_t E[3] = {0, 0, 0};  // pass output extent (forward/backward-filter: out; backward-data: in)
  int64_t tiles = 0, rows = 0, chunk = 0, bins = 0;
  int64_t Ci = 0;            // channels of the activation operand A (flat spectrum)
  int64_t p_rows = 0, p_cols = 0, q_cols = 0;  // P: rows x cols; Q: chunk * G rows x q_cols
  int64_t nblk_p = 0, nblk_a = 0, nblk_q = 0;  // blocks per bin
  int64_t cb = 0, jc = 0;    // lane blocks per row of P and Q (columns), per channel chunk
  int64_t slots = 1, slot_cv = 0;
  size_t bytes = 0;
};

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Channel-contraction shape of an operation (per group): rows of the filter-side matrix P and
// its columns, the activation operand's channels and the result's columns.
struct Shape {
  int64_t Ci, p_rows, p_cols, q_cols, I, J;
};

Shape shape_of(ConvOp op, const ConvProblem& p) {
  const int64_t G = p.G, Cg = p.Cg(), Kg = p.Kg();
  switch (op) {
    case ConvOp::kBackwardData: return {p.K, G * Kg, Cg, Cg, Kg, Cg};
    default: return {p.C, G * Cg, Kg, Kg, Cg, Kg};
  }
}

// Estimated time in ns of a pass with cyclic lengths L over the pass output extents E, fitted
// to single-core timings on the 2-core AVX-512 host (5x5 and 3x3 layers, a 255-tap 1-D filter):
// ~2 ns per lane block and butterfly-pass point (n log2 n per line, only the lines the pruned
// passes compute), ~0.1 ns per complex multiply-add of the channel products, and the memory
// traffic of a filter-side spectrum that does not fit in the caches.
double pass_cost(ConvOp op, const ConvProblem& p, const int64_t L[3], const int64_t E[3], int V) {
  const Shape sh = shape_of(op, p);
  auto nlogn = [](double n) { return n > 1 ? n * std::log2(n) : 0.0; };
  // Butterfly work of one block whose data (or stored result) spans n[a] positions per axis.
  auto passes = [&](const double n[3]) {
    const double l0 = L[0], l1 = L[1], l2 = L[2];
    return n[0] * n[1] * nlogn(l2) + n[0] * l2 * nlogn(l1) + l1 * l2 * nlogn(l0);
  };
  double tiles = 1, na[3], nq[3], nf[3];
  for (int a = 0; a < 3; ++a) {
    const int64_t to = L[a] - p.filt[a] + 1;
    tiles *= static_cast<double>(cdiv(E[a], to));
    na[a] = static_cast<double>(std::min(L[a], to + p.filt[a] - 1));
    nq[a] = static_cast<double>(to);
    nf[a] = static_cast<double>(p.filt[a]);
  }
  const double rows = static_cast<double>(p.N) * tiles;
  const double bins = static_cast<double>(L[0] * L[1] * (L[2] / 2 + 1));
  const double blocks_a = rows * static_cast<double>(sh.Ci) / V;
  const double blocks_q = rows * static_cast<double>(p.G * cdiv(sh.q_cols, V));
  const double blocks_p = static_cast<double>(sh.p_rows * cdiv(sh.p_cols, V));
  const double transform = blocks_a * passes(na) + blocks_q * passes(nq) + blocks_p * passes(nf);
  const double product = bins * rows * static_cast<double>(p.G * sh.I * sh.J);
  // The filter-side spectrum is written once and read once; past the caches that is memory
  // traffic (~0.05 ns per byte), which favours short tiles (few bins) for wide layers.
  const double p_bytes = bins * blocks_p * static_cast<double>(kCVBytes);
  const double memory = p_bytes > (8 << 20) ? 0.1 * p_bytes : 0.0;
  return 2.0 * transform + 0.1 * product + memory;
}

// FFT_TILING's cyclic lengths: the cheapest by pass_cost among 5-smooth lengths from R up to
// the whole extent (capped by the dimensionality: long 1-D signals take long tiles, 2-D and 3-D
// tiles stay cache-sized); an axis whose filter is 1 gets L = 1 (no transform along it).
void choose_tiles(ConvOp op, const ConvProblem& p, const int64_t E[3], int V, int64_t L[3]) {
  int active = 0;
  for (int a = 0; a < 3; ++a) active += p.filt[a] > 1 ? 1 : 0;
  const int64_t cap = active <= 1 ? 16384 : active == 2 ? 96 : 40;
  std::vector<int64_t> cand[3];
  for (int a = 0; a < 3; ++a) {
    const int64_t whole = next_smooth(std::max<int64_t>(E[a], 1) + p.filt[a] - 1);
    if (p.filt[a] == 1 || E[a] == 0) {
      cand[a] = {p.filt[a] == 1 ? 1 : whole};
      continue;
    }
    for (int64_t n = p.filt[a] + 1; n < std::min(whole, cap); ++n)
      if (is_smooth(n)) cand[a].push_back(n);
    cand[a].push_back(whole);
  }
  double best = -1;
  for (int64_t l0 : cand[0])
    for (int64_t l1 : cand[1])
      for (int64_t l2 : cand[2]) {
        const int64_t c[3] = {l0, l1, l2};
        const double cost = pass_cost(op, p, c, E, V);
        if (best < 0 || cost < best) {
          best = cost;
          std::copy(c, c + 3, L);
        }
      }
}

Plan make_plan(ConvOp op, const ConvProblem& p, bool tiled, int V) {
  Plan pl;
  const int64_t G = p.G, Cg = p.Cg(), Kg = p.Kg();
  for (int a = 0; a < 3; ++a) {
    pl.E[a] = op == ConvOp::kBackwardData ? p.in[a] : p.out[a];
    pl.L[a] = next_smooth(std::max<int64_t>(pl.E[a], 1) + p.filt[a] - 1);  // a tile >= 1
  }
  if (tiled) choose_tiles(op, p, pl.E, V, pl.L);
  for (int a = 0; a < 3; ++a) {
    pl.To[a] = pl.L[a] - p.filt[a] + 1;
    pl.nt[a] = cdiv(pl.E[a], pl.To[a]);
  }
  pl.tiles = pl.nt[0] * pl.nt[1] * pl.nt[2];
  pl.rows = p.N * pl.tiles;
  pl.bins = pl.L[0] * pl.L[1] * (pl.L[2] / 2 + 1);
  const Shape sh = shape_of(op, p);
  pl.Ci = sh.Ci, pl.p_rows = sh.p_rows, pl.p_cols = sh.p_cols, pl.q_cols = sh.q_cols;
  const int64_t bins_pad = cdiv(pl.bins, kBT) * kBT;
  // Column blocks per channel chunk (an even count where there is a choice: the products take
  // two blocks at a time).
  pl.cb = cdiv(pl.p_cols, V);
  pl.jc = std::clamp<int64_t>(kFilterChunkBytes / (bins_pad * pl.p_rows * kCVBytes), 1, pl.cb);
  if (pl.jc < pl.cb && pl.jc > 1) pl.jc &= ~int64_t{1};
  pl.nblk_p = pl.p_rows * pl.jc;
  // Rows per chunk: the activation and result spectra of a chunk take about kChunkBytes.
  const double per_row = static_cast<double>(pl.bins) * kCVBytes *
                         (static_cast<double>(pl.Ci) / V + static_cast<double>(G * pl.jc));
  pl.chunk = std::clamp<int64_t>(static_cast<int64_t>(kChunkBytes / std::max(per_row, 1.0)), 1,
                                 std::max<int64_t>(pl.rows, 1));
  pl.nblk_a = cdiv(pl.chunk * pl.Ci, V);
  pl.nblk_q = pl.chunk * G * pl.jc;
  // Per-thread scratch: a transform's work and line buffers, or the product's packed A rows.
  const int64_t pts = pl.L[0] * pl.L[1] * pl.L[2];
  const int64_t red = op == ConvOp::kForward ? Cg : op == ConvOp::kBackwardData ? Kg : pl.chunk;
  const int64_t pack_cv = cdiv(2 * kRB * red * 8, kCVBytes);
  pl.slot_cv = std::max(2 * pts + 2 * pl.L[2], pack_cv);
  pl.slots = num_threads();
  const int64_t cv = bins_pad * (pl.nblk_p + pl.nblk_a + pl.nblk_q) + pl.slots * pl.slot_cv;
  pl.bytes = static_cast<size_t>(cv) * kCVBytes;
  return pl;
}

// ---------------------------------------------------------------------------------------------
// The driver.

template <typename T>
void zero(T* p, int64_t n) {
  parallel_for(n, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, T(0)); }, int64_t{1} << 14);
}

template <typename T>
void run_fft(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io, bool tiled) {
  constexpr int V = lanes<T>();
  const Plan pl = make_plan(op, p, tiled, V);
  const bool nhwc = p.layout == Layout::kNHWC;
  const int64_t G = p.G, Cg = p.Cg(), Kg = p.Kg(), C = p.C, K = p.K;
  int64_t out_elems = op == ConvOp::kForward ? p.y_elems()
                      : op == ConvOp::kBackwardData ? p.x_elems() : p.w_elems();
  if (out_elems == 0) return;
  if (pl.rows == 0) {  // nothing to reduce over (no batch or an empty dy): zeros
    zero(io.out, out_elems);
    return;
  }
  const Transform3<T> tr = make_transform<T>(pl.L);
  const int64_t bins = pl.bins;
  CV<T>* P = static_cast<CV<T>*>(io.workspace);
  const int64_t bins_pad = cdiv(bins, kBT) * kBT;
  CV<T>* A = P + bins_pad * pl.nblk_p;
  CV<T>* Q = A + bins_pad * pl.nblk_a;
  CV<T>* scratch = Q + bins_pad * pl.nblk_q;
  auto slot_scratch = [&](int64_t slot) { return scratch + slot * pl.slot_cv; };
  const T scale = T(1) / static_cast<T>(tr.points());

  // Tensors. Filter: element (out channel k, in channel c) at base fbase(c, k), taps strides fst.
  const int64_t taps = p.filt_taps();
  TensorView<T> wv{const_cast<T*>(op == ConvOp::kBackwardFilter ? io.out : io.b),
                   {p.filt[0], p.filt[1], p.filt[2]}, {0, 0, 0}};
  if (nhwc) {
    wv.st[2] = Cg * K, wv.st[1] = p.filt[2] * Cg * K, wv.st[0] = p.filt[1] * p.filt[2] * Cg * K;
  } else {
    wv.st[2] = 1, wv.st[1] = p.filt[2], wv.st[0] = p.filt[1] * p.filt[2];
  }
  auto fbase = [&](int64_t c, int64_t k) { return nhwc ? c * K + k : (k * Cg + c) * taps; };
  const ActStrides xs = act_strides(nhwc, C, p.in), ys = act_strides(nhwc, K, p.out);
  TensorView<T> xv{const_cast<T*>(op == ConvOp::kBackwardData ? io.out : io.a),
                   {p.in[0], p.in[1], p.in[2]}, {xs.sp[0], xs.sp[1], xs.sp[2]}};
  const T* yptr = op == ConvOp::kForward ? io.out : op == ConvOp::kBackwardData ? io.a : io.b;
  TensorView<T> yv{const_cast<T*>(yptr), {p.out[0], p.out[1], p.out[2]},
                   {ys.sp[0], ys.sp[1], ys.sp[2]}};

  // Tile origin (pass output index of cyclic position 0 before shifts) of tile t of an image.
  auto tile_t0 = [&](int64_t t, int64_t t0[3]) {
    t0[2] = t % pl.nt[2] * pl.To[2];
    t0[1] = t / pl.nt[2] % pl.nt[1] * pl.To[1];
    t0[0] = t / (pl.nt[2] * pl.nt[1]) * pl.To[0];
  };
  const int64_t zero3[3] = {0, 0, 0};
  // Load windows: activation input of a tile (To + R - 1 samples), dy of a backward-filter tile.
  int64_t win_in[3], win_out[3], win_filt[3];
  for (int a = 0; a < 3; ++a) {
    win_in[a] = pl.To[a] + p.filt[a] - 1;
    win_out[a] = pl.To[a];
    win_filt[a] = p.filt[a];
  }
  // Shift of the activation input: forward / backward-filter read x[j + t0 - pad_lo];
  // backward-data reads dy[j + t0 - (R - 1 - pad_lo)].
  int64_t in_shift[3];
  for (int a = 0; a < 3; ++a)
    in_shift[a] = op == ConvOp::kBackwardData ? p.filt[a] - 1 - p.pad_lo[a] : p.pad_lo[a];
  const TensorView<T>& av = op == ConvOp::kBackwardData ? yv : xv;  // activation operand A
  const ActStrides& as = op == ConvOp::kBackwardData ? ys : xs;

  // Lane of flat activation signal s (chunk starting at row r0): row -> (n, tile), channel.
  auto a_block = [&](int64_t r0, int64_t r1, int64_t blk, Block<T>& b) {
    for (int l = 0; l < V; ++l) {
      Lane& ln = b.lane[l];
      ln = Lane{};
      const int64_t s = blk * V + l, row = r0 + s / pl.Ci, ch = s % pl.Ci;
      if (row >= r1) continue;
      const int64_t n = row / pl.tiles;
      int64_t t0[3], org[3];
      tile_t0(row % pl.tiles, t0);
      for (int a = 0; a < 3; ++a) org[a] = t0[a] - in_shift[a];
      set_lane(ln, n * as.n + ch * as.c, org, zero3, win_in, av.ext);
    }
    finish_block(b);
  };
  // Lane of row-padded result / dy signals: row (n, tile, g) of the row chunk, column j (<
  // cols) of the channel chunk of jcc blocks from block jb0.
  // Stores: forward y[t0 + j]; backward-data dx[t0 + j - (R - 1)] for j in [R - 1, R - 1 + To);
  // loads (backward-filter dy): dy[t0 + j], j < To.
  auto q_block = [&](int64_t r0, int64_t r1, int64_t jb0, int64_t jcc, int64_t blk, Block<T>& b) {
    const int64_t rr = blk / jcc, j0 = (jb0 + blk % jcc) * V, row = r0 + rr / G, g = rr % G;
    for (int l = 0; l < V; ++l) {
      Lane& ln = b.lane[l];
      ln = Lane{};
      const int64_t j = j0 + l;
      if (row >= r1 || j >= pl.q_cols) continue;
      const int64_t n = row / pl.tiles;
      int64_t t0[3], org[3], wlo[3], whi[3];
      tile_t0(row % pl.tiles, t0);
      if (op == ConvOp::kBackwardData) {
        for (int a = 0; a < 3; ++a) {
          org[a] = t0[a] - (p.filt[a] - 1);
          wlo[a] = p.filt[a] - 1;
          whi[a] = p.filt[a] - 1 + pl.To[a];
        }
        set_lane(ln, n * xs.n + (g * Cg + j) * xs.c, org, wlo, whi, xv.ext);
      } else {
        set_lane(ln, n * ys.n + (g * Kg + j) * ys.c, t0, zero3, win_out, yv.ext);
        ln.ch = g * Kg + j;
      }
    }
    finish_block(b);
  };
  // Lane of filter signals (P): row (g, i), column j (of the channel chunk of jcc blocks from
  // block jb0); forward / backward-filter: i = c, j = k; backward-data: i = k, j = c.
  auto p_block = [&](int64_t jb0, int64_t jcc, int64_t blk, Block<T>& b) {
    const int64_t row = blk / jcc, j0 = (jb0 + blk % jcc) * V;
    const int64_t per_g = pl.p_rows / G, g = row / per_g, i = row % per_g;
    for (int l = 0; l < V; ++l) {
      Lane& ln = b.lane[l];
      ln = Lane{};
      const int64_t j = j0 + l;
      if (j >= pl.p_cols) continue;
      const int64_t base = op == ConvOp::kBackwardData ? fbase(j, g * Kg + i) : fbase(i, g * Kg + j);
      set_lane(ln, base, zero3, zero3, win_filt, wv.ext);
    }
    finish_block(b);
  };

  // Transforms of all blocks of a spectrum, two per work item.
  auto forward_all = [&](int64_t nblk_total, int64_t nblk, CV<T>* spec, const TensorView<T>& tv,
                         const auto& fill) {
    for_each_slot(cdiv(nblk_total, 2), pl.slots, [&](int64_t slot, int64_t item) {
      Block<T> ba, bb;
      const int64_t k0 = 2 * item, k1 = k0 + 1;
      fill(k0, ba);
      const bool two = k1 < nblk_total;
      if (two) fill(k1, bb);
      forward_pair(tr, tv, ba, two ? &bb : nullptr, spec + k0 * kBT, spec + k1 * kBT, nblk,
                   slot_scratch(slot));
    });
  };
  auto inverse_all = [&](int64_t nblk_total, int64_t nblk, const CV<T>* spec,
                         const TensorView<T>& tv, const auto& fill,
                         const CpuEpilogue<T>* epi = nullptr) {
    for_each_slot(cdiv(nblk_total, 2), pl.slots, [&](int64_t slot, int64_t item) {
      Block<T> ba, bb;
      const int64_t k0 = 2 * item, k1 = k0 + 1;
      fill(k0, ba);
      const bool two = k1 < nblk_total;
      if (two) fill(k1, bb);
      inverse_pair(tr, tv, ba, two ? &bb : nullptr, spec + k0 * kBT,
                   two ? spec + k1 * kBT : nullptr, nblk,
                   scale, slot_scratch(slot), epi);
    });
  };
  auto contract = [&](const Contraction& c, const CV<T>* a, const CV<T>* b, CV<T>* o) {
    const int64_t per = kBT;  // one tile of bins per work item
    for_each_slot(cdiv(bins, per), pl.slots, [&](int64_t slot, int64_t item) {
      T* pack = reinterpret_cast<T*>(slot_scratch(slot));
      const int64_t b0 = item * per, b1 = std::min(bins, b0 + per);
      if (c.conj_b)
        contract_bins<T, true>(c, a, b, o, b0, b1, pack);
      else
        contract_bins<T, false>(c, a, b, o, b0, b1, pack);
    });
  };

  const int64_t nj = cdiv(pl.cb, pl.jc);
  if (op != ConvOp::kBackwardFilter) {
    // Per chunk of rows: the activation spectrum, then per channel chunk: the filter spectrum
    // (once when there is one channel chunk), products, inverse transforms.
    for (int64_t r0 = 0; r0 < pl.rows; r0 += pl.chunk) {
      const int64_t r1 = std::min(pl.rows, r0 + pl.chunk), nr = r1 - r0;
      forward_all(cdiv(nr * pl.Ci, V), pl.nblk_a, A, av,
                  [&](int64_t blk, Block<T>& b) { a_block(r0, r1, blk, b); });
      for (int64_t jb0 = 0; jb0 < pl.cb; jb0 += pl.jc) {
        const int64_t jcc = std::min(pl.jc, pl.cb - jb0);
        if (nj > 1 || r0 == 0)
          forward_all(pl.p_rows * jcc, pl.nblk_p, P, wv,
                      [&](int64_t blk, Block<T>& b) { p_block(jb0, jcc, blk, b); });
        Contraction c{};
        c.G = G, c.R = nr, c.cb = jcc;
        c.I = op == ConvOp::kForward ? Cg : Kg;
        c.ar = pl.Ci, c.ai = 1, c.ag = c.I;
        c.b_i = 1, c.b_g = c.I;
        c.o_r = G, c.o_g = 1;
        c.nblk_a = pl.nblk_a, c.nblk_b = pl.nblk_p, c.nblk_o = pl.nblk_q;
        c.conj_b = op == ConvOp::kForward;
        contract(c, A, P, Q);
        TensorView<T> ov = op == ConvOp::kForward ? yv : xv;
        inverse_all(nr * G * jcc, pl.nblk_q, Q, ov,
                    [&](int64_t blk, Block<T>& b) { q_block(r0, r1, jb0, jcc, blk, b); },
                    op == ConvOp::kForward ? io.epi : nullptr);
      }
    }
    return;
  }
  // Backward-filter, per channel chunk: accumulate the sum over rows of X . conj(DY) into P,
  // chunk of rows by chunk of rows (X's spectrum computed once when one chunk holds all rows),
  // then invert P.
  for (int64_t jb0 = 0; jb0 < pl.cb; jb0 += pl.jc) {
    const int64_t jcc = std::min(pl.jc, pl.cb - jb0);
    for (int64_t r0 = 0; r0 < pl.rows; r0 += pl.chunk) {
      const int64_t r1 = std::min(pl.rows, r0 + pl.chunk), nr = r1 - r0;
      if (jb0 == 0 || pl.chunk < pl.rows)
        forward_all(cdiv(nr * pl.Ci, V), pl.nblk_a, A, xv,
                    [&](int64_t blk, Block<T>& b) { a_block(r0, r1, blk, b); });
      forward_all(nr * G * jcc, pl.nblk_q, Q, yv,
                  [&](int64_t blk, Block<T>& b) { q_block(r0, r1, jb0, jcc, blk, b); });
      Contraction c{};
      c.G = G, c.R = Cg, c.I = nr, c.cb = jcc;
      c.ar = 1, c.ai = C, c.ag = Cg;
      c.b_i = G, c.b_g = 1;
      c.o_r = 1, c.o_g = Cg;
      c.nblk_a = pl.nblk_a, c.nblk_b = pl.nblk_q, c.nblk_o = pl.nblk_p;
      c.conj_b = true;
      c.accumulate = r0 > 0;
      contract(c, A, Q, P);
    }
    inverse_all(pl.p_rows * jcc, pl.nblk_p, P, wv,
                [&](int64_t blk, Block<T>& b) { p_block(jb0, jcc, blk, b); });
  }
}

}  // namespace

std::string fft_unsupported(ConvOp op, ConvAlgo algo, const ConvProblem& p) {
  const std::string name = conv_algo_name(algo);
  auto list = [&](const int64_t* v) {
    std::string s = "(";
    for (int a = 3 - p.spatial_dims; a < 3; ++a) {
      s += std::to_string(v[a]);
      if (a < 2) s += ", ";
    }
    return s + (p.spatial_dims == 1 ? ",)" : ")");
  };
  auto any_not_one = [](const int64_t* v) { return v[0] != 1 || v[1] != 1 || v[2] != 1; };
  if (any_not_one(p.stride)) return name + " needs window_strides 1, got " + list(p.stride);
  if (any_not_one(p.dilation)) return name + " needs rhs_dilation 1, got " + list(p.dilation);
  if (any_not_one(p.lhs_dilation))
    return name + " needs lhs_dilation 1, got " + list(p.lhs_dilation);
  if (algo == ConvAlgo::kFft) {
    // The largest pass (the forward / backward-filter pass covers out + R - 1, backward-data
    // in + R - 1 per axis; both are checked so that all three operations of a layer agree).
    int64_t pts = 1, pts_bwd = 1;
    for (int a = 0; a < 3; ++a) {
      pts *= next_smooth(p.out[a] + p.filt[a] - 1);
      pts_bwd *= next_smooth(p.in[a] + p.filt[a] - 1);
    }
    if (std::max(pts, pts_bwd) > kMaxFftPoints)
      return "FFT transforms the whole image and " + std::to_string(std::max(pts, pts_bwd)) +
             " transform points exceed its limit of " + std::to_string(kMaxFftPoints) +
             " (use FFT_TILING)";
  }
  // The float64 plan (the larger one: 8 signals per lane block).
  const Plan pl = make_plan(op, p, algo == ConvAlgo::kFftTiling, lanes<double>());
  if (pl.rows > 0 && static_cast<int64_t>(pl.bytes) > kMaxWorkspaceBytes)
    return name + " would need " + std::to_string(pl.bytes >> 20) + " MiB of workspace (its " +
           "filter spectrum holds " + std::to_string(pl.bins) + " frequencies x " +
           std::to_string(p.C / p.G) + " x " + std::to_string(p.K) + " channels), over its " +
           "limit of " + std::to_string(kMaxWorkspaceBytes >> 20) + " MiB";
  return "";
}

size_t fft_workspace_bytes(ConvOp op, const ConvProblem& p, size_t elem_bytes, bool tiled) {
  if (!fft_unsupported(op, tiled ? ConvAlgo::kFftTiling : ConvAlgo::kFft, p).empty()) return 0;
  const Plan pl = make_plan(op, p, tiled, static_cast<int>(64 / elem_bytes));
  return pl.rows == 0 ? 0 : pl.bytes;
}

void fft_tiles(ConvOp op, const ConvProblem& p, bool tiled, int64_t L[3], int64_t tiles[3]) {
  const Plan pl = make_plan(op, p, tiled, lanes<float>());
  for (int a = 0; a < 3; ++a) L[a] = pl.L[a], tiles[a] = pl.nt[a];
}

template <typename T>
void fft_conv(ConvOp op, const ConvProblem& p, const ConvOperands<T>& io, bool tiled) {
  run_fft<T>(op, p, io, tiled);
}

template void fft_conv<float>(ConvOp, const ConvProblem&, const ConvOperands<float>&, bool);
template void fft_conv<double>(ConvOp, const ConvProblem&, const ConvOperands<double>&, bool);

}  // namespace jaxdnn::cpu
