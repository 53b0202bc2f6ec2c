"""The forward-convolution grid: small geometries covering lax.conv_general_dilated's arguments."""

from __future__ import annotations

import dataclasses

import pytest


@dataclasses.dataclass(frozen=True)
class Case:
  id: str
  lhs: tuple
  rhs: tuple
  strides: tuple
  padding: object
  lhs_dilation: tuple | None = None
  rhs_dilation: tuple | None = None
  dnums: tuple | None = None
  fgc: int = 1
  bgc: int = 1

  def kwargs(self) -> dict:
    return dict(window_strides=self.strides, padding=self.padding,
                lhs_dilation=self.lhs_dilation, rhs_dilation=self.rhs_dilation,
                dimension_numbers=self.dnums, feature_group_count=self.fgc,
                batch_group_count=self.bgc)


NHWC = ("NHWC", "HWIO", "NHWC")
NCHW = ("NCHW", "OIHW", "NCHW")
NWC = ("NWC", "WIO", "NWC")
NCW = ("NCW", "OIW", "NCW")
NDHWC = ("NDHWC", "DHWIO", "NDHWC")
NCDHW = ("NCDHW", "OIDHW", "NCDHW")

GRID = [
    # ---- layouts ----
    Case("nchw-default-dnums", (2, 3, 5, 6), (4, 3, 3, 2), (1, 1), "SAME"),
    Case("nhwc-hwio", (2, 5, 6, 3), (3, 2, 3, 4), (1, 1), "SAME", dnums=NHWC),
    Case("nchw-oihw", (2, 3, 5, 6), (4, 3, 3, 2), (1, 1), "SAME", dnums=NCHW),
    Case("nwhc-whio-ncwh", (2, 6, 5, 3), (2, 3, 3, 4), (1, 2), "SAME",
         dnums=("NWHC", "WHIO", "NCWH")),
    Case("chwn-oihw-nhwc", (3, 5, 6, 2), (4, 3, 3, 2), (2, 1), "VALID",
         dnums=("CHWN", "OIHW", "NHWC")),
    Case("nhwc-oihw-nchw", (2, 5, 6, 3), (4, 3, 2, 3), (1, 1), ((1, 0), (0, 1)),
         dnums=("NHWC", "OIHW", "NCHW")),
    Case("nchw-hwio-nhwc", (2, 3, 5, 6), (3, 2, 3, 4), (1, 1), "SAME",
         dnums=("NCHW", "HWIO", "NHWC")),
    # ---- 1-D and 3-D ----
    Case("1d-nwc", (2, 9, 3), (3, 3, 4), (1,), "SAME", dnums=NWC),
    Case("1d-ncw-stride2", (2, 3, 9), (4, 3, 3), (2,), "VALID", dnums=NCW),
    Case("1d-default-dnums", (2, 3, 8), (2, 3, 4), (1,), ((2, 1),)),
    Case("3d-ndhwc", (1, 4, 5, 3, 2), (2, 3, 2, 2, 3), (1, 1, 1), "SAME", dnums=NDHWC),
    Case("3d-ncdhw-stride-2-1-3", (2, 2, 5, 4, 7), (3, 2, 2, 3, 3), (2, 1, 3), "SAME",
         dnums=NCDHW),
    Case("3d-dhwnc-odd-layout", (4, 3, 5, 2, 2), (2, 2, 3, 2, 3), (1, 2, 1), "VALID",
         dnums=("DHWNC", "DHWIO", "NCDHW")),
    # ---- strides ----
    Case("stride2-nhwc", (2, 7, 7, 3), (3, 3, 3, 4), (2, 2), "SAME", dnums=NHWC),
    Case("stride3-nchw", (1, 3, 8, 9), (2, 3, 3, 3), (3, 3), "VALID", dnums=NCHW),
    Case("stride-mixed-1x3-nhwc", (2, 6, 8, 2), (2, 3, 2, 3), (1, 3), "SAME", dnums=NHWC),
    Case("stride-larger-than-filter", (1, 3, 9, 9), (2, 3, 2, 2), (3, 4), "VALID",
         dnums=NCHW),
    # ---- rhs dilation ----
    Case("rhs-dilation2-nhwc", (2, 7, 7, 3), (3, 3, 3, 2), (1, 1), "SAME", rhs_dilation=(2, 2),
         dnums=NHWC),
    Case("rhs-dilation-2x1-stride2-nchw", (1, 2, 9, 8), (3, 2, 3, 3), (2, 2), "VALID",
         rhs_dilation=(2, 1), dnums=NCHW),
    Case("1d-rhs-dilation3", (2, 3, 11), (2, 3, 3), (1,), "SAME", rhs_dilation=(3,), dnums=NCW),
    # ---- lhs dilation (explicit padding) ----
    Case("lhs-dilation2-nhwc", (2, 4, 4, 3), (3, 3, 3, 2), (1, 1), ((1, 1), (2, 0)),
         lhs_dilation=(2, 2), dnums=NHWC),
    Case("lhs-dilation2-stride2-nchw", (1, 2, 4, 5), (3, 2, 3, 2), (2, 1), ((2, 2), (1, 0)),
         lhs_dilation=(2, 3), dnums=NCHW),
    Case("lhs-and-rhs-dilation", (1, 5, 4, 2), (2, 2, 2, 3), (1, 2), ((1, 2), (0, 1)),
         lhs_dilation=(2, 1), rhs_dilation=(1, 2), dnums=NHWC),
    Case("1d-lhs-dilation3", (2, 3, 4), (2, 3, 3), (1,), ((2, 2),), lhs_dilation=(3,),
         dnums=NCW),
    # ---- padding ----
    Case("valid-nhwc", (2, 6, 5, 3), (3, 2, 3, 2), (1, 1), "VALID", dnums=NHWC),
    Case("same-even-filter-nchw", (2, 3, 6, 5), (2, 3, 2, 4), (1, 1), "SAME", dnums=NCHW),
    Case("same-lower-even-filter-nhwc", (2, 6, 5, 3), (2, 4, 3, 2), (1, 1), "SAME_LOWER",
         dnums=NHWC),
    Case("same-lower-stride2-nchw", (1, 3, 7, 6), (2, 3, 4, 3), (2, 2), "SAME_LOWER",
         dnums=NCHW),
    Case("explicit-asymmetric", (2, 5, 6, 3), (3, 3, 3, 2), (1, 1), ((0, 2), (3, 1)),
         dnums=NHWC),
    Case("padding-beyond-filter", (1, 3, 4, 4), (2, 3, 2, 2), (1, 1), ((3, 0), (0, 4)),
         dnums=NCHW),
    Case("negative-padding", (2, 7, 8, 3), (3, 2, 3, 2), (1, 1), ((-1, 1), (2, -2)),
         dnums=NHWC),
    Case("negative-padding-stride2-nchw", (1, 2, 9, 8), (2, 2, 3, 3), (2, 2), ((-2, -1), (-1, 0)),
         dnums=NCHW),
    Case("empty-output", (1, 2, 2, 2), (3, 3, 2, 3), (1, 1), "VALID", dnums=NHWC),
    # ---- feature groups ----
    Case("groups2-nhwc", (2, 5, 5, 4), (3, 3, 2, 6), (1, 1), "SAME", dnums=NHWC, fgc=2),
    Case("groups3-nchw-stride2", (2, 6, 7, 5), (6, 2, 3, 3), (2, 2), "SAME", dnums=NCHW, fgc=3),
    Case("depthwise-nhwc", (2, 6, 5, 4), (3, 3, 1, 4), (1, 1), "SAME", dnums=NHWC, fgc=4),
    Case("depthwise-nchw-stride2", (2, 4, 7, 6), (4, 1, 3, 3), (2, 2), "SAME", dnums=NCHW,
         fgc=4),
    Case("depthwise-multiplier2-nhwc", (2, 5, 6, 3), (3, 3, 1, 6), (1, 1), "SAME", dnums=NHWC,
         fgc=3),
    Case("depthwise-multiplier2-nchw-dilated", (1, 3, 7, 7), (6, 1, 3, 3), (1, 1), "SAME",
         rhs_dilation=(2, 2), dnums=NCHW, fgc=3),
    Case("1d-depthwise", (2, 9, 4), (3, 1, 4), (1,), "SAME", dnums=NWC, fgc=4),
    Case("3d-groups2", (1, 2, 4, 3, 4), (2, 2, 2, 2, 4), (1, 1, 1), "SAME", dnums=NDHWC, fgc=2),
    Case("groups-odd-layout", (5, 4, 2, 6), (2, 2, 3, 4), (1, 1), "SAME",
         dnums=("HWNC", "HWIO", "NCHW"), fgc=2),
    # ---- batch groups ----
    Case("batch-groups2-nhwc", (4, 5, 5, 3), (3, 3, 3, 4), (1, 1), "SAME", dnums=NHWC, bgc=2),
    Case("batch-groups3-nchw-stride2", (6, 2, 6, 5), (3, 2, 2, 3), (2, 1), "VALID",
         dnums=NCHW, bgc=3),
    Case("batch-groups-1d", (4, 3, 7), (4, 3, 3), (1,), "SAME", dnums=NCW, bgc=4),
    # ---- batch sizes and tiny channel counts ----
    Case("batch0-nhwc", (0, 5, 5, 3), (3, 3, 3, 4), (1, 1), "SAME", dnums=NHWC),
    Case("batch0-nchw", (0, 3, 5, 5), (4, 3, 3, 3), (2, 2), "VALID", dnums=NCHW),
    Case("batch1-nhwc", (1, 5, 5, 3), (3, 3, 3, 4), (1, 1), "SAME", dnums=NHWC),
    Case("batch1-nchw", (1, 3, 6, 5), (4, 3, 3, 3), (1, 2), "SAME", dnums=NCHW),
    Case("zero-height-input", (2, 0, 5, 3), (3, 3, 3, 4), (1, 1), "SAME", dnums=NHWC),
    # lax: an empty axis whose padding spans windows has outputs (sums over no taps: zeros)
    Case("zero-height-input-padded", (2, 0, 5, 3), (3, 3, 3, 4), (1, 1), ((2, 2), (1, 1)),
         dnums=NHWC),
    Case("zero-width-input-padded-nchw", (2, 3, 4, 0), (4, 3, 2, 2), (1, 2), ((0, 1), (3, 2)),
         dnums=NCHW),
    Case("one-channel", (2, 1, 5, 5), (1, 1, 3, 3), (1, 1), "SAME", dnums=NCHW),
    Case("1x1-filter-nhwc", (2, 4, 3, 5), (1, 1, 5, 3), (1, 1), "VALID", dnums=NHWC),
]

GRID_PARAMS = [pytest.param(c, id=c.id) for c in GRID]
