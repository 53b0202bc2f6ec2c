"""Algorithm families, their support matrix, and the `auto` heuristic.

Support is asked of the compiled backend (its `can_implement`), so Python and C++ cannot disagree
about which geometries a family handles. `auto` is a cheap rule over that table: no measurement at
trace time.
"""

from __future__ import annotations

import dataclasses
import enum
import re

import numpy as np

from jaxdnn._src import ffi
from jaxdnn._src.geometry import ConvGeometry, ConvOp


class ConvAlgo(enum.Enum):
  """cuDNN's convolution algorithm families. `ConvAlgo("gemm")` parses the lowercase name."""

  IMPLICIT_GEMM = "implicit_gemm"
  IMPLICIT_PRECOMP_GEMM = "implicit_precomp_gemm"
  GEMM = "gemm"
  DIRECT = "direct"
  FFT = "fft"
  FFT_TILING = "fft_tiling"
  WINOGRAD = "winograd"
  WINOGRAD_NONFUSED = "winograd_nonfused"

  @property
  def id(self) -> int:
    """The value of jaxdnn::ConvAlgo in C++ (cuDNN's enum order)."""
    return _ALGO_IDS[self]


_ALGO_IDS = {algo: i for i, algo in enumerate(ConvAlgo)}
AUTO = "auto"


class MathPrecision(enum.IntEnum):
  """float32 arithmetic allowed (jaxdnn::MathPrecision): HIGHEST forbids TF32."""

  DEFAULT = 0
  HIGH = 1
  HIGHEST = 2


# Values of jaxdnn::DType in C++.
_DTYPE_IDS = {
    np.dtype(np.float32): 0,
    np.dtype(np.float64): 1,
    np.dtype("bfloat16"): 2,
    np.dtype(np.float16): 3,
}
SUPPORTED_DTYPES = tuple(_DTYPE_IDS)


def dtype_id(dtype) -> int:
  return _DTYPE_IDS[np.dtype(dtype)]


# The output tiles F(m x m, 3 x 3) that WINOGRAD_NONFUSED can be asked for explicitly.
WINOGRAD_TILES = (2, 4, 6)


@dataclasses.dataclass(frozen=True)
class TiledAlgo:
  """An algorithm family with an explicit output tile: WINOGRAD_NONFUSED F(m x m, 3 x 3).

  `jaxdnn.conv(..., algo="winograd_nonfused_f6x6")` (or TiledAlgo(ConvAlgo.WINOGRAD_NONFUSED, 6))
  runs F(6x6, 3x3) for the forward and, under differentiation, for the Winograd backward
  operations too; plain ConvAlgo.WINOGRAD_NONFUSED lets the backend pick (F(4x4), F(2x2) when an
  output side is < 4). An explicit tile is never swapped for another, and `auto` never picks one.
  Hashable (a primitive parameter); `name`, `value` and `id` read as ConvAlgo's do.
  """

  family: ConvAlgo
  tile: int

  def __post_init__(self):
    if self.family is not ConvAlgo.WINOGRAD_NONFUSED:
      raise ValueError(f"algo: only WINOGRAD_NONFUSED takes an explicit tile, got "
                       f"{getattr(self.family, 'name', self.family)!r} with tile {self.tile!r}")
    if self.tile not in WINOGRAD_TILES:
      raise ValueError(f"algo: the WINOGRAD_NONFUSED tile must be one of {WINOGRAD_TILES} "
                       f"(F(2x2,3x3), F(4x4,3x3), F(6x6,3x3)), got {self.tile!r}")

  @property
  def name(self) -> str:
    return f"{self.family.name}_F{self.tile}X{self.tile}"

  @property
  def value(self) -> str:
    return f"{self.family.value}_f{self.tile}x{self.tile}"

  @property
  def id(self) -> int:
    return self.family.id

  def __repr__(self) -> str:
    return f"TiledAlgo({self.family.name}, {self.tile})"


_TILED_RE = re.compile(r"^(?P<family>[a-z_]+?)_f(?P<m>\d+)x(?P=m)$")


def algo_family(algo) -> ConvAlgo:
  """The ConvAlgo of a ConvAlgo or TiledAlgo."""
  return algo.family if isinstance(algo, TiledAlgo) else algo


def algo_tile(algo) -> int:
  """The explicit output tile of `algo` (0: the family's own choice)."""
  return algo.tile if isinstance(algo, TiledAlgo) else 0


def parse_algo(algo) -> ConvAlgo | TiledAlgo | str:
  """ConvAlgo member, its name or lowercase value, "auto", a TiledAlgo, or an explicit-tile string
  "winograd_nonfused_f{2,4,6}x{same}" (any case) -> ConvAlgo, TiledAlgo or AUTO."""
  if isinstance(algo, (ConvAlgo, TiledAlgo)):
    return algo
  if isinstance(algo, str):
    key = algo.strip().lower()
    if key == AUTO:
      return AUTO
    for member in ConvAlgo:
      if key == member.value:
        return member
    match = _TILED_RE.match(key)
    if match:
      family = next((m for m in ConvAlgo if m.value == match["family"]), None)
      if family is not None:
        try:
          return TiledAlgo(family, int(match["m"]))
        except ValueError as e:
          raise ValueError(f"{e} (algo={algo!r})") from None
  names = ", ".join(repr(a.value) for a in ConvAlgo)
  tiles = ", ".join(repr(f"winograd_nonfused_f{m}x{m}") for m in WINOGRAD_TILES)
  raise ValueError(f"algo must be 'auto', a jaxdnn.ConvAlgo, one of {names}, or an explicit "
                   f"Winograd tile {tiles}; got {algo!r}")


# Properties of each family on each backend: (deterministic, note). Error bounds per dtype are the
# relative-error bounds the test-suite enforces (tests/tolerances.py).
FAMILY_NOTES = {
    ConvAlgo.DIRECT: "window loops; dedicated depthwise and grouped paths",
    ConvAlgo.GEMM: "explicit im2col/col2im into workspace, then a blocked matrix product",
    ConvAlgo.IMPLICIT_GEMM: "im2col gathered while packing GEMM panels; no im2col buffer",
    ConvAlgo.IMPLICIT_PRECOMP_GEMM: "as IMPLICIT_GEMM, gathering from a precomputed offset table",
    ConvAlgo.WINOGRAD_NONFUSED: (
        "CPU: F(4x4,3x3) (F(2x2,3x3) when an output side is < 4) transforms through workspace, "
        "36 (16) per-point channel products; 2-D 3x3 filters, stride 1, no dilation. Relative "
        "error bound 1e-5 in float32 (measured <= 4.2e-6 on the 3x3 benchmark layers), 1e-12 "
        "in float64. "
        "CUDA: the same tiles, geometry and bounds (2-D 3x3 filters, stride 1, no dilation, "
        "groups, NHWC/NCHW, any padding, 3-D with depth-1 filters), filter, input and output "
        "transforms as separate kernels through workspace and the per-point channel products as "
        "one batched GEMM launch (fp32 transforms; float32 and bfloat16/float16 operands "
        "multiplied on the tensor cores as 3xTF32 with fp32-grade error at every precision, "
        "16-bit operands widened to fp32 so their error is the output rounding; float64 in "
        "DFMA). Workspace: the backward-filter split partials (backward-filter only) "
        "plus chunks of transformed tiles, at most about 256 MiB of them. Backward-filter is "
        "deterministic (fixed-order split reduction, no atomics). "
        "Both backends: the filter transform U = G w G^T of the forward and backward-data (the "
        "flipped, channel-swapped filter) is its own custom call, jaxdnn_winograd_filter, whose "
        "result (float32, float64 for float64; the backend's GEMM layout: CPU packed panels, CUDA "
        "zero-padded [a*a][G][Cg8][Kg8]) the convolution call takes in place of w. It is cached "
        "the functional way: XLA's CSE shares one U between all convolutions of one filter with "
        "one tile size (weight tying, repeated layers, remat with prevent_cse=False), and "
        "on the CPU while-loop invariant code motion hoists it out of scan / fori_loop bodies "
        "whose filter is loop-invariant (XLA:GPU, jax 0.11.2, leaves it in the loop body: one "
        "transform per step). The workspace no longer holds U. "
        "Explicit tiles (TiledAlgo; algo='winograd_nonfused_f2x2' / '_f4x4' / '_f6x6'): "
        "F(m x m,3x3) for every operation of the call, whatever the output size (tiles are "
        "cropped), never switched; F(6x6,3x3) interpolates at 0, +-1, +-2, +-1/2 and inf (a = 8: "
        "64 per-point GEMMs, 1.78 multiplications per output against 2.25 for F(4x4)), with "
        "Lavin and Gray's matrices (per-point rescalings measured by emulation changed the error "
        "by < 2%, powers of two not at all). CUDA runs F(6x6) for float32 and float64 operands "
        "only. Relative error bounds in float32: F(2x2) 1e-5 (measured <= 5.2e-7 on the 3x3 "
        "benchmark layers and C/G = 16..2048; <= 5.1e-7 on the H200), F(4x4) 1e-5 (<= 3.4e-6 "
        "on the CPU; on the H200 1.7e-6 at C/G = 512 and 2.2e-6 at 2048), F(6x6) 5e-5 (<= 6.6e-6 "
        "on the CPU, whose blocked GEMM sums at most 256 channels at a time; on the H200, whose "
        "products run on the tensor cores as 3xTF32 summed per 32-deep slice, "
        "tests/cuda/winograd/check.cu's sweep measures 3.2e-6 at C/G = 512 and 4.3e-6 at 2048, "
        "2.0e-6 to 3.2e-6 on the GPU benchmark layers; the former FFMA kernel's sequential sums "
        "reached 1.71e-5 at 2048); "
        "1e-12 in float64 (measured <= 1.2e-14). F(6x6)'s bound exceeds 1e-5, so auto never "
        "picks it (auto picks no explicit tile at all); on the GPU auto also stops picking the "
        "default F(4x4) past C/G or K/G = 2048, the largest count measured. CUDA: the per-point "
        "products of float32, bf16 and fp16 operands run on the tensor cores as 3xTF32 (TF32 "
        "part and TF32 remainder of each operand, three mma.sync, each 32-deep slice summed "
        "apart and added in fp32); float64 uses DFMA"),
    ConvAlgo.WINOGRAD: (
        "CPU: fused F(2x2,3x3): per thread, blocks of 24 tiles through input transform, 16 "
        "products and output transform in cache-resident buffers; backward-filter: up to 8 "
        "slices of the tiles, each taking blocks of 24 tiles through both transforms and the "
        "per-point products into its own accumulator (workspace, at most 64 MB), added in "
        "slice order (deterministic). Same geometry and bounds as WINOGRAD_NONFUSED. "
        "CUDA: forward and backward-data in one kernel per block of 32 tiles x 32 output "
        "channels. Channels-last float32/bf16/fp16 operands with pass input channels per group "
        "a multiple of 8 and pass outputs of at least 4x4 run F(4x4,3x3) on the tensor cores "
        "(input windows and U slices staged by cp.async, input transform into shared memory, "
        "the 36 per-point products as 3xTF32 mma.sync summed in registers, each 8-channel "
        "chunk's partial added in fp32, output transform through shared memory; U is 36 x C x "
        "K/G); everything else runs F(2x2,3x3) in FFMA (DFMA for float64; input transform into "
        "shared memory, products in registers, output transform; U is 16 x C x K/G). U, as "
        "for WINOGRAD_NONFUSED, is its own custom call "
        "(jaxdnn_winograd_filter: shared by CSE, hoisted out of loops on the CPU; on the CPU "
        "too, so the forward and backward-data need no workspace); backward-filter too: per "
        "slice of the "
        "tiles, both transforms and the per-point products in one kernel, the slices' sums "
        "(workspace, at most 64 slices) added in order (deterministic); fp32 (float64 for "
        "float64) arithmetic"),
    ConvAlgo.FFT: (
        "CPU: whole-image real transforms (jaxdnn's own mixed-radix 2/3/4/5 FFT, vectorised over "
        "16 float32 / 8 float64 signals), per-frequency complex channel products, inverse "
        "transforms with cropping; stride 1, no dilation, any padding, groups, 1-3-D. Refuses "
        "images whose padded transform exceeds 2^17 points (use FFT_TILING) and workspaces over 2 "
        "GiB (both families: the filter spectrum is bins x C x K/G). Relative error "
        "bound 1e-5 in float32 (measured <= 4.4e-7 on the 3x3/5x5 benchmark layers), 1e-12 in "
        "float64. "
        "GPU: jaxdnn's own shared-memory radix-2 FFTs (power-of-two lengths; two real signals "
        "per complex transform), per-frequency complex channel products on the fp32 (fp64) "
        "units, never TF32, so every precision gets the float32 bound; 16-bit operands are "
        "transformed and multiplied in float32. Same geometry as the CPU (stride 1, no "
        "dilation, any padding, groups, 1-3-D, both layouts); refuses whole images whose "
        "padded transform exceeds 4096 points (one CTA's shared memory: e.g. 2-D images up to "
        "64x64 including the filter; use FFT_TILING) and filter spectra over 1 GiB. Workspace: "
        "8 (float64: 16) bytes x bins x (C x K/G + chunk x (C + K)), bins = L0 x L1 x "
        "(L2/2 + 1), chunks of images x tiles of at most 64 MiB of spectra. Deterministic "
        "(fixed-order reductions, no atomics). Bounds as on the CPU: 1e-5 in float32, 1e-12 "
        "in float64, the output rounding in bfloat16/float16"),
    ConvAlgo.FFT_TILING: (
        "CPU: overlap-save tiles (transform lengths chosen per problem by a cost model: about "
        "16-32 per axis in 2-D, 1000-2000 for long 1-D filters), otherwise as FFT; the "
        "workspace is bounded by chunks of tiles. Same geometry (no image size limit) and bounds. "
        "GPU: overlap-save tiles of power-of-two lengths picked by a cost model (up to 64 per "
        "axis in 2-D, 16 in 3-D, 4096 in 1-D; an axis whose filter is 1 is not transformed), "
        "otherwise as the GPU FFT; no image size limit, filters up to 4095 taps in 1-D (the "
        "tile must be longer than the filter within 4096 points)"),
}


def _query_args(op: ConvOp, algo, geometry: ConvGeometry, batch: int, channels: int,
                out_channels: int, in_dtype, out_dtype, precision: MathPrecision):
  problem = geometry.problem_dict(batch, channels, out_channels)
  if algo_tile(algo):
    problem["tile"] = algo_tile(algo)  # nb_problem.h: ConvProblem::tile
  return (int(op), algo.id, problem, dtype_id(in_dtype), dtype_id(out_dtype), int(precision))


# Fused forward convolutions (conv + bias + residual + activation, target jaxdnn_conv_fwd_fused)
# ask the extension's can_implement_fused / workspace_bytes_fused (can_implement's and
# workspace_bytes's arguments without the operation). An extension built before it had those
# queries is assumed to carry the epilogue in these families only, with the plain forward's
# support and workspace.
DEFAULT_EPILOGUE_FAMILIES = (ConvAlgo.IMPLICIT_GEMM, ConvAlgo.IMPLICIT_PRECOMP_GEMM,
                             ConvAlgo.GEMM, ConvAlgo.DIRECT)


def _native_reason(platform: str, op: ConvOp, algo: ConvAlgo, geometry: ConvGeometry,
                   batch: int, channels: int, out_channels: int, in_dtype, out_dtype,
                   precision: MathPrecision, *, fused: bool = False) -> str:
  """"" when the backend's kernels of `algo` take this problem as it is, else the reason."""
  module = ffi.extension(platform)
  if module is None:
    return f"jaxdnn has no {platform} kernels in this build"
  args = _query_args(op, algo, geometry, batch, channels, out_channels, in_dtype, out_dtype,
                     precision)
  if fused:
    query = getattr(module, "can_implement_fused", None)
    if query is not None:
      return query(*args[1:])
    if algo_family(algo) not in DEFAULT_EPILOGUE_FAMILIES:
      return f"{algo.name} carries no fused epilogue on {platform}"
  return module.can_implement(*args)


# A transposed convolution (lhs_dilation > 1, window strides 1) runs as the other face of a
# strided convolution (ConvGeometry.lhs_dilation_as_stride): forward -> backward-data,
# backward-data -> forward, backward-filter -> backward-filter with the operands swapped. Taken
# where the family's kernels do not take lhs dilation themselves (the CUDA GEMM families), and
# where it measured faster than the family's own handling of it (MAPPING_PAYS).
MAPPED_OP = {ConvOp.FORWARD: ConvOp.BACKWARD_DATA, ConvOp.BACKWARD_DATA: ConvOp.FORWARD,
             ConvOp.BACKWARD_FILTER: ConvOp.BACKWARD_FILTER}
# (platform, family, op). CPU, float32, 2 cores, the six layers of
# benchmarks/layers-cpu-transposed.txt, interleaved A/B (benchmarks/transposed_mapping_ab.py;
# benchmarks/results/cpu-2core-2026-12-08-transposed.md): the GEMM families' forward 2.5-6.4x
# faster mapped on five layers (0.86-1.45x on the 4x4-image dcgan_up_8), their backward-filter
# 1.1-8.0x on all six, GEMM's backward-data 1.4-6.1x. IMPLICIT_GEMM's and IMPLICIT_PRECOMP_GEMM's
# own backward-data (mapped 0.39-1.06x) and DIRECT (0.64-1.69x) keep their kernels.
_CPU_GEMM_FAMILIES = (ConvAlgo.IMPLICIT_GEMM, ConvAlgo.IMPLICIT_PRECOMP_GEMM, ConvAlgo.GEMM)
MAPPING_PAYS = frozenset(
    {("cpu", a, op) for a in _CPU_GEMM_FAMILIES
     for op in (ConvOp.FORWARD, ConvOp.BACKWARD_FILTER)} |
    {("cpu", ConvAlgo.GEMM, ConvOp.BACKWARD_DATA)})
# Tests set this to take the mapping wherever it applies.
map_lhs_dilation_always = False


def lhs_dilation_mapping(platform: str, op: ConvOp, algo: ConvAlgo, geometry: ConvGeometry,
                         batch: int, channels: int, out_channels: int, in_dtype, out_dtype,
                         precision: MathPrecision) -> ConvGeometry | None:
  """The strided geometry Q that `algo` runs this problem through (MAPPED_OP[op] on Q, with
  channels and out_channels exchanged), or None: where it runs the problem as it is, or where
  Q is not supported either."""
  q = geometry.lhs_dilation_as_stride()
  if q is None:
    return None
  args = (batch, channels, out_channels, in_dtype, out_dtype, precision)
  if (not map_lhs_dilation_always and (platform, algo_family(algo), op) not in MAPPING_PAYS and
      not _native_reason(platform, op, algo, geometry, *args)):
    return None
  q_args = (batch, out_channels, channels, in_dtype, out_dtype, precision)
  return None if _native_reason(platform, MAPPED_OP[op], algo, q, *q_args) else q


def unsupported_reason(platform: str, op: ConvOp, algo: ConvAlgo, geometry: ConvGeometry,
                       batch: int, channels: int, out_channels: int, in_dtype, out_dtype,
                       precision: MathPrecision, *, fused: bool = False) -> str:
  """"" when `algo` can run on `platform` for this problem, else the reason.

  fused: the forward convolution with an epilogue (op must be FORWARD).
  """
  args = (geometry, batch, channels, out_channels, in_dtype, out_dtype, precision)
  why = _native_reason(platform, op, algo, *args, fused=fused)
  if why and not fused and lhs_dilation_mapping(platform, op, algo, *args) is not None:
    return ""
  return why


def supported_algorithms(platform: str, op: ConvOp, geometry: ConvGeometry, batch: int,
                         channels: int, out_channels: int, in_dtype, out_dtype,
                         precision: MathPrecision, *, fused: bool = False) -> list[ConvAlgo]:
  return [
      algo for algo in ConvAlgo
      if not unsupported_reason(platform, op, algo, geometry, batch, channels, out_channels,
                                in_dtype, out_dtype, precision, fused=fused)
  ]


def workspace_bytes(platform: str, op: ConvOp, algo: ConvAlgo, geometry: ConvGeometry,
                    batch: int, channels: int, out_channels: int, in_dtype, out_dtype,
                    precision: MathPrecision, *, fused: bool = False) -> int:
  if not fused:
    q = lhs_dilation_mapping(platform, op, algo, geometry, batch, channels, out_channels,
                             in_dtype, out_dtype, precision)
    if q is not None:
      return workspace_bytes(platform, MAPPED_OP[op], algo, q, batch, out_channels, channels,
                             in_dtype, out_dtype, precision)
  module = ffi.extension(platform)
  args = _query_args(op, algo, geometry, batch, channels, out_channels, in_dtype, out_dtype,
                     precision)
  query = getattr(module, "workspace_bytes_fused", None) if fused else None
  if query is not None:
    return int(query(*args[1:]))
  return int(module.workspace_bytes(*args))


def winograd_filter_shape(platform: str, op: ConvOp, algo: ConvAlgo, geometry: ConvGeometry,
                          batch: int, channels: int, out_channels: int, in_dtype, out_dtype,
                          precision: MathPrecision):
  """(tile, dims of U) when `algo` runs `op` on a pre-transformed filter, else None.

  The Winograd families' forward and backward-data take U = G w G^T, the result of a separate
  jaxdnn_winograd_filter call, in place of w (ffi_conv.h), so that XLA shares one U between the
  convolutions of one filter and hoists it out of loops. Asked of the backend, which knows the
  layout its GEMMs read.
  """
  if (algo_family(algo) not in (ConvAlgo.WINOGRAD, ConvAlgo.WINOGRAD_NONFUSED) or
      op == ConvOp.BACKWARD_FILTER):
    return None
  module = ffi.extension(platform)
  args = _query_args(op, algo, geometry, batch, channels, out_channels, in_dtype, out_dtype,
                     precision)
  spec = module.winograd_filter_shape(*args)
  return None if spec is None else (int(spec[0]), tuple(int(d) for d in spec[1]))


def _fft_tiling_pays(geometry: ConvGeometry, cg: int, kg: int, taps: int) -> bool:
  """Filters of >= 15 taps, one side >= 5, 8 to 128 channels in and out per group: where
  FFT_TILING beat every other CPU family by 2-3x (5x5 and 7x7 layers, 1-D filters of 15 to 255
  taps; benchmarks/results/cpu-*.md). Stride 1 and no dilation: the support check enforces it."""
  return (taps >= 15 and max(geometry.filter_spatial) >= 5 and 8 <= cg <= 128 and
          8 <= kg <= 128)


def _heuristic_order(platform: str, op: ConvOp, geometry: ConvGeometry, batch: int,
                     channels: int, out_channels: int, in_dtype=None,
                     precision: MathPrecision | None = None, fused: bool = False
                     ) -> list[ConvAlgo]:
  """Families in order of preference for `auto` (the first supported one wins).

  Tuned on the measured tables in benchmarks/results/ (CPU: the 2-core AVX-512 machine; GPU: H200).
  """
  cg = channels // geometry.groups
  kg = out_channels // geometry.groups
  taps = int(np.prod(geometry.filter_spatial))
  small_groups = geometry.groups > 1 and cg * kg <= 64  # depthwise, ResNeXt-style groups
  gemm_first = [ConvAlgo.GEMM, ConvAlgo.IMPLICIT_PRECOMP_GEMM, ConvAlgo.IMPLICIT_GEMM,
                ConvAlgo.DIRECT]
  direct_first = [ConvAlgo.DIRECT, ConvAlgo.IMPLICIT_PRECOMP_GEMM, ConvAlgo.GEMM,
                  ConvAlgo.IMPLICIT_GEMM]
  if platform == "cpu":
    if small_groups or cg * taps <= 8:  # memory-bound, or a tiny reduction (MNIST's C=1)
      return direct_first
    order = _cpu_order(op, geometry, batch, cg, kg, taps, gemm_first, direct_first, fused)
    # FFT_TILING beat every other family by 2-3x there (_fft_tiling_pays), in all three
    # operations; its float32 bound (1e-5) qualifies it under precision=HIGHEST. On 3x3 layers
    # it only ties DIRECT (Winograd wins); with one input channel the output transforms dominate
    # (DIRECT wins by 3x); at 256 x 256 channels its filter spectrum is memory-bound and the
    # lead shrinks to ~1.2x.
    if _fft_tiling_pays(geometry, cg, kg, taps):
      order = [ConvAlgo.FFT_TILING, *order]
    # WINOGRAD_NONFUSED (supported for 2-D 3x3 stride-1 undilated filters only, which the support
    # check enforces) beat every other family on the dense 3x3 layers with >= 64 channels, in all
    # three operations; its float32 bound (1e-5) also qualifies it under precision=HIGHEST.
    if tuple(geometry.filter_spatial) == (3, 3) and cg >= 64 and kg >= 64:
      order = [ConvAlgo.WINOGRAD_NONFUSED, *order]
    return order
  # GPU
  if small_groups:
    return direct_first
  if geometry.lhs_dilation_as_stride() is not None:
    # A transposed convolution: DIRECT takes it as it is and is checked on the GPU; the GEMM
    # families' mapped route (lhs_dilation_mapping) runs when asked for, but has neither run on
    # a GPU nor been timed against DIRECT there yet
    # (benchmarks/results/gpu-pending-2026-12-08-s26.md).
    return direct_first
  order = [ConvAlgo.IMPLICIT_PRECOMP_GEMM, ConvAlgo.IMPLICIT_GEMM, ConvAlgo.GEMM,
           ConvAlgo.DIRECT]
  # float32 at precision=HIGHEST: the GEMM families run on the fp32 units too (no TF32), and
  # FFT_TILING and WINOGRAD_NONFUSED do fewer multiply-adds within their 1e-5 bounds, where the
  # CPU rules pick them. H200 kernel-only (benchmarks/results/gpu-h200-2026-12-01-s4.md):
  # WINOGRAD_NONFUSED 0.100 ms on r50_c3_3x3 against IMPLICIT_PRECOMP_GEMM's 0.371 (1.14 against
  # 4.08 on vgg_c3_2); FFT_TILING 0.087 ms on inc_5x5 against 0.143. Not for 16-bit or TF32
  # problems, where the GEMM families' single-pass tensor-core products win (Winograd's are
  # 3xTF32: bf16 vgg_c3_2 forward 0.891 ms against IMPLICIT_PRECOMP_GEMM's 0.259, s7).
  highest_f32 = (in_dtype is not None and np.dtype(in_dtype) == np.float32 and
                 precision == MathPrecision.HIGHEST)
  if highest_f32 and _fft_tiling_pays(geometry, cg, kg, taps):
    order = [ConvAlgo.FFT_TILING, *order]
  # F(4x4)'s float32 error grows with the reduction length: on the H200 1.7e-6 at C/G = 512 and
  # 2.2e-6 at 2048 with the 3xTF32 products (8.9e-6 at 2048 with the former FFMA kernel's
  # sequential sums; benchmarks/results/gpu-h200-2026-12-01-s7.md). Past 2048 channels per
  # group, the largest count measured, auto does not rely on the 1e-5 bound: not picked there.
  if (highest_f32 and tuple(geometry.filter_spatial) == (3, 3) and cg >= 64 and kg >= 64 and
      max(cg, kg) <= 2048):
    order = [ConvAlgo.WINOGRAD_NONFUSED, *order]
  return order


def _cpu_order(op, geometry, batch, cg, kg, taps, gemm_first, direct_first, fused):
  """The CPU order among the four general families (dense problems)."""
  if taps == 1:  # pointwise: a plain matrix product
    return gemm_first
  if not fused and op != ConvOp.BACKWARD_DATA and geometry.lhs_dilation_as_stride() is not None:
    # a transposed convolution's forward and backward-filter: IMPLICIT_PRECOMP_GEMM through the
    # strided convolution (MAPPING_PAYS) beat DIRECT on 5 of 6 layers forward (1.07-1.75x; 0.92x
    # on dcgan_up_8) and on all 6 backward-filter (1.2-6.0x); benchmarks/results/
    # cpu-2core-2026-12-08-transposed.md. Not with a fused epilogue: the mapped problem is a
    # backward-data, which carries none, so the fused kernel would take its own lhs dilation
    # (IMPLICIT_PRECOMP_GEMM's plain forward: 1.1-2.4x slower than DIRECT's on those layers).
    return [ConvAlgo.IMPLICIT_PRECOMP_GEMM, *(a for a in direct_first
                                              if a != ConvAlgo.IMPLICIT_PRECOMP_GEMM)]
  if op == ConvOp.BACKWARD_DATA and any(s > 1 for s in geometry.stride):
    # the implicit family splits dx by stride phase and skips the zero taps
    return [ConvAlgo.IMPLICIT_GEMM, ConvAlgo.IMPLICIT_PRECOMP_GEMM, ConvAlgo.DIRECT,
            ConvAlgo.GEMM]
  if op == ConvOp.BACKWARD_FILTER:
    # DIRECT's wgrad keeps per-chunk partial filters: it loses once the filter outgrows the
    # pixels it reduces over.
    out_pixels = batch * int(np.prod(geometry.out_spatial))
    if cg * kg * taps > 64 * out_pixels:
      return [ConvAlgo.IMPLICIT_PRECOMP_GEMM, ConvAlgo.GEMM, ConvAlgo.IMPLICIT_GEMM,
              ConvAlgo.DIRECT]
  return direct_first


def choose_algorithm(platform: str, op: ConvOp, requested: ConvAlgo | str,
                     geometry: ConvGeometry, batch: int, channels: int, out_channels: int,
                     in_dtype, out_dtype, precision: MathPrecision, *,
                     fused: bool = False) -> ConvAlgo:
  """The family to run: the requested one (checked), or the heuristic's pick for "auto".

  Never substitutes a family (or a tile) for an explicitly requested one: raises ValueError
  instead. `auto` picks only ConvAlgo families (never an explicit tile: TiledAlgo).
  fused: the forward convolution with an epilogue; `auto` picks only families that carry it.
  """
  args = (geometry, batch, channels, out_channels, in_dtype, out_dtype, precision)
  what = ("fused (conv + bias + residual + activation) forward" if fused
          else op.name.lower().replace('_', '-'))
  if requested != AUTO:
    why = unsupported_reason(platform, op, requested, *args, fused=fused)
    if why:
      able = supported_algorithms(platform, op, *args, fused=fused)
      raise ValueError(
          f"algo={requested.name} cannot run the {what} "
          f"convolution on {platform}: {why}. Families that can: "
          f"{', '.join(a.name for a in able) or 'none'} (or algo='auto').")
    return requested
  for algo in _heuristic_order(platform, op, geometry, batch, channels, out_channels, in_dtype,
                               precision, fused):
    if not unsupported_reason(platform, op, algo, *args, fused=fused):
      return algo
  able = supported_algorithms(platform, op, *args, fused=fused)
  if able:
    return able[0]
  raise ValueError(f"no jaxdnn algorithm supports this {what} convolution on {platform}")
