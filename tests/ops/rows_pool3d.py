"""Op-table rows: 3-d pooling (max, avg, adaptive), ceil_mode pooling (1-d to 3-d), and adaptive
pooling with uneven bins (1-d to 3-d). The plain 2-d pooling rows are in rows_pad_pool_norm.py.

Average pooling decomposed into stages rounds once per stage in fp16 (a mean of means): such rows
name their roundings next to a looser fp16 tolerance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .harness import randn, row

aten = torch.ops.aten

#: adaptive_max_pool2d / 3d are outside core ATen; export keeps them whole
AMAX2 = (aten.adaptive_max_pool2d.default,)
AMAX3 = (aten.adaptive_max_pool3d.default,)

MAX = "MPSMaxPool2DWithIndices"
AVG = "MPSAvgPool2D"
#: max-pool indices through two stages: the first stage's indices gathered at the second's
COMPOSED = {MAX, "MPSIndexSelect", "MPSCast"}


def ties(*shape: int):
    """Values in {0, 1, 2}: most windows hold their maximum several times (torch keeps the first)."""
    return lambda: torch.randint(0, 3, shape).float()


class MaxPool3dIndices(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.args, self.kwargs = args, kwargs

    def forward(self, x):
        return F.max_pool3d(x, *self.args, **self.kwargs, return_indices=True)


ROWS = [
    # ---- max_pool3d: H, W pooled per depth slice, then depth as a (kd, 1) pooling ------------------
    row("aten.max_pool3d_with_indices.default", "pool3d-max", lambda x: F.max_pool3d(x, 2), randn(1, 2, 6, 6, 6), kinds=MAX),
    row(
        "aten.max_pool3d_with_indices.default",
        "pool3d-max-padded-strided-dilated",
        lambda x: F.max_pool3d(x, (2, 3, 3), (1, 2, 2), 1, (2, 1, 1)),
        randn(2, 3, 7, 8, 9),
        kinds=MAX,
    ),
    row(
        "aten.max_pool3d_with_indices.default",
        "pool3d-max-unbatched",
        lambda x: F.max_pool3d(x, 3, 2, 1),
        randn(3, 5, 6, 7),
        kinds=MAX,
    ),
    row(
        "aten.max_pool3d_with_indices.default",
        "pool3d-max-depth-only",
        lambda x: F.max_pool3d(x, (3, 1, 1), (2, 1, 1)),
        randn(1, 2, 7, 3, 4),
        kinds=MAX,
    ),
    row(
        "aten.max_pool3d_with_indices.default",
        "pool3d-max-indices",
        None,
        randn(1, 2, 7, 8, 9),
        kinds=COMPOSED,
        module=lambda: MaxPool3dIndices(3, 2, 1),
    ),
    # torch keeps the first maximum in (d, h, w) order: so does the H, W stage then the depth stage
    row(
        "aten.max_pool3d_with_indices.default",
        "pool3d-max-indices-ties",
        None,
        ties(2, 2, 6, 7, 8),
        kinds=COMPOSED,
        module=lambda: MaxPool3dIndices((2, 3, 2), (1, 2, 2), (1, 1, 0)),
    ),
    row(
        "aten.max_pool3d_with_indices.default",
        "pool3d-max-indices-depth-only",
        None,
        randn(1, 2, 7, 3, 4),
        kinds={MAX, "MPSCast"},
        module=lambda: MaxPool3dIndices((3, 1, 1), (2, 1, 1)),
    ),
    row(
        "aten.max_pool3d_with_indices.default",
        "pool3d-max-ceil",
        lambda x: F.max_pool3d(x, 3, 2, 1, ceil_mode=True),
        randn(1, 2, 10, 10, 10),
        kinds=MAX,
    ),
    row(
        "aten.max_pool3d_with_indices.default",
        "pool3d-max-ceil-indices",
        None,
        randn(1, 2, 8, 9, 10),
        kinds=COMPOSED,
        module=lambda: MaxPool3dIndices(2, 2, 1, ceil_mode=True),
    ),
    # ---- avg_pool3d: per-axis counts, so a 3-d window mean is a depth mean of H, W means ----------
    # fp16: two stages -> 2 roundings (3 with a divisor_override multiply)
    row(
        "aten.avg_pool3d.default", "pool3d-avg", lambda x: F.avg_pool3d(x, 2), randn(1, 2, 6, 6, 6), kinds=AVG, tol={"fp16": 2e-3}
    ),
    row(
        "aten.avg_pool3d.default",
        "pool3d-avg-padded-strided",
        lambda x: F.avg_pool3d(x, (2, 3, 3), (1, 2, 2), 1),
        randn(2, 3, 5, 8, 9),
        kinds=AVG,
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.avg_pool3d.default",
        "pool3d-avg-count-include-pad-false",
        lambda x: F.avg_pool3d(x, 3, 2, 1, count_include_pad=False),
        randn(1, 2, 7, 8, 9),
        kinds=AVG,
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.avg_pool3d.default",
        "pool3d-avg-divisor-override",
        lambda x: F.avg_pool3d(x, 3, 2, 1, divisor_override=10),
        randn(1, 2, 7, 8, 9),
        kinds={AVG, "MPSMul"},
        tol={"fp16": 3e-3},
    ),
    row(
        "aten.avg_pool3d.default",
        "pool3d-avg-unbatched-depth-only",
        lambda x: F.avg_pool3d(x, (3, 1, 1), (2, 1, 1), (1, 0, 0)),
        randn(3, 7, 4, 5),
        kinds=AVG,
    ),
    # ceil mode: torch counts the padding but not the tail -> zeros padded first (MPSConstantPadND)
    row(
        "aten.avg_pool3d.default",
        "pool3d-avg-ceil",
        lambda x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True),
        randn(1, 2, 10, 10, 10),
        kinds={AVG, "MPSConstantPadND"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.avg_pool3d.default",
        "pool3d-avg-ceil-count-include-pad-false",
        lambda x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        randn(1, 2, 8, 9, 10),
        kinds=AVG,
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.avg_pool3d.default",
        "pool3d-avg-ceil-divisor-override",
        lambda x: F.avg_pool3d(x, 2, 2, 1, ceil_mode=True, divisor_override=3),
        randn(1, 2, 6, 7, 8),
        kinds={AVG, "MPSMul"},
        tol={"fp16": 3e-3},
    ),
    # ---- ceil_mode 1-d / 2-d: the tail padded explicitly, the device pools in floor mode -------------
    row(
        "aten.max_pool2d_with_indices.default",
        "pool-max-ceil",
        lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
        randn(1, 2, 10, 9),
        kinds=MAX,
    ),
    row(
        "aten.max_pool2d_with_indices.default",
        "pool-max-ceil-dilated-indices",
        lambda x: F.max_pool2d(x, 3, 2, 1, 2, ceil_mode=True, return_indices=True),
        randn(1, 2, 10, 11),
        kinds={MAX, "MPSCast"},
    ),
    row(
        "aten.max_pool2d_with_indices.default",
        "pool-max1d-ceil",
        lambda x: F.max_pool1d(x, 2, 2, ceil_mode=True),
        randn(2, 3, 9),
        kinds=MAX,
    ),
    row(
        "aten.avg_pool2d.default",
        "pool-avg-ceil",
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
        randn(1, 2, 10, 9),
        kinds={AVG, "MPSConstantPadND"},
    ),
    row(
        "aten.avg_pool2d.default",
        "pool-avg-ceil-no-padding",
        lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True),
        randn(1, 2, 8, 10),
        kinds=AVG,
    ),
    row(
        "aten.avg_pool2d.default",
        "pool-avg-ceil-count-include-pad-false",
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        randn(1, 2, 10, 9),
        kinds=AVG,
    ),
    # fp16: the window mean and the scale are rounded separately -> 2 roundings
    row(
        "aten.avg_pool2d.default",
        "pool-avg-ceil-divisor-override",
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, divisor_override=4),
        randn(1, 2, 10, 9),
        kinds={AVG, "MPSMul"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.avg_pool2d.default",
        "pool-avg1d-ceil",
        lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True),
        randn(2, 3, 10),
        kinds={AVG, "MPSConstantPadND"},
    ),
    # ---- adaptive average pooling with uneven bins: stride-t poolings of each bin length + gather ---
    # one bin length per axis: one pooling for the plane, then the bins picked (1 rounding)
    row(
        "aten._adaptive_avg_pool2d.default",
        "pool-adaptive-avg-uneven",
        lambda x: F.adaptive_avg_pool2d(x, (4, 4)),
        randn(1, 2, 6, 6),
        kinds={AVG, "MPSIndexSelect"},
    ),
    row(
        "aten._adaptive_avg_pool2d.default",
        "pool-adaptive-avg-strided-bins",
        lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
        randn(2, 3, 5, 7),
        kinds=AVG,
    ),
    row(
        "aten._adaptive_avg_pool2d.default",
        "pool-adaptive-avg-larger-output",
        lambda x: F.adaptive_avg_pool2d(x, (5, 7)),
        randn(1, 2, 3, 4),
        kinds={AVG, "MPSIndexSelect"},
    ),
    # two bin lengths on an axis: one pooling per length, concatenated; one stage per axis -> 2e-3
    row(
        "aten._adaptive_avg_pool2d.default",
        "pool-adaptive-avg-two-lengths",
        lambda x: F.adaptive_avg_pool2d(x, (3, 5)),
        randn(2, 3, 7, 8),
        kinds={AVG, "MPSCat", "MPSIndexSelect"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten._adaptive_avg_pool2d.default",
        "pool-adaptive-avg1d-uneven",
        lambda x: F.adaptive_avg_pool1d(x, 5),
        randn(2, 3, 7),
        kinds={AVG, "MPSCat", "MPSIndexSelect"},
    ),
    # ---- adaptive max pooling (1-d, 2-d): values and indices --------------------------------------
    row(
        "aten.adaptive_max_pool2d.default",
        "pool-adaptive-max",
        lambda x: F.adaptive_max_pool2d(x, (3, 2)),
        randn(2, 3, 6, 6),
        kinds=MAX,
        non_core=AMAX2,
    ),
    row(
        "aten.adaptive_max_pool2d.default",
        "pool-adaptive-max-uneven-indices",
        lambda x: F.adaptive_max_pool2d(x, (4, 5), return_indices=True),
        randn(1, 2, 7, 8),
        kinds={MAX, "MPSCat", "MPSIndexSelect", "MPSCast"},
        non_core=AMAX2,
    ),
    # W stage first, then H: the first maximum in (h, w) order, as torch
    row(
        "aten.adaptive_max_pool2d.default",
        "pool-adaptive-max-indices-ties",
        lambda x: F.adaptive_max_pool2d(x, (5, 3), return_indices=True),
        ties(2, 2, 7, 8),
        kinds={MAX, "MPSIndexSelect", "MPSCast"},
        non_core=AMAX2,
    ),
    row(
        "aten.adaptive_max_pool2d.default",
        "pool-adaptive-max-unbatched",
        lambda x: F.adaptive_max_pool2d(x, (2, 4)),
        randn(3, 5, 9),
        kinds=MAX,
        non_core=AMAX2,
    ),
    row(
        "aten.adaptive_max_pool2d.default",
        "pool-adaptive-max1d-indices",
        lambda x: F.adaptive_max_pool1d(x, 5, return_indices=True),
        randn(2, 3, 7),
        kinds={MAX, "MPSCat", "MPSIndexSelect", "MPSCast"},
        non_core=AMAX2,
    ),
    # ---- adaptive 3-d pooling: the H, W plane as above, then depth ---------------------------------
    # fp16: plane then depth -> 2 roundings (3 when the plane needs one stage per axis)
    row(
        "aten._adaptive_avg_pool3d.default",
        "pool3d-adaptive-avg",
        lambda x: F.adaptive_avg_pool3d(x, 2),
        randn(1, 2, 4, 6, 8),
        kinds=AVG,
        tol={"fp16": 2e-3},
    ),
    row(
        "aten._adaptive_avg_pool3d.default",
        "pool3d-adaptive-avg-uneven",
        lambda x: F.adaptive_avg_pool3d(x, (2, 4, 6)),
        randn(1, 2, 8, 8, 8),
        kinds={AVG, "MPSIndexSelect"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten._adaptive_avg_pool3d.default",
        "pool3d-adaptive-avg-two-lengths",
        lambda x: F.adaptive_avg_pool3d(x, 4),
        randn(2, 3, 7, 9, 11),
        kinds={AVG, "MPSCat", "MPSIndexSelect"},
        tol={"fp16": 3e-3},
    ),
    row(
        "aten.mean.dim", "pool3d-adaptive-avg-1x1x1", lambda x: F.adaptive_avg_pool3d(x, 1), randn(1, 2, 4, 5, 6), kinds="MPSMean"
    ),
    row(
        "aten._adaptive_avg_pool3d.default",
        "pool3d-adaptive-avg-unbatched",
        lambda x: F.adaptive_avg_pool3d(x, (4, 2, 3)),
        randn(3, 6, 5, 4),
        kinds={AVG, "MPSIndexSelect"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.adaptive_max_pool3d.default",
        "pool3d-adaptive-max",
        lambda x: F.adaptive_max_pool3d(x, 2),
        randn(1, 2, 4, 6, 8),
        kinds=MAX,
        non_core=AMAX3,
    ),
    row(
        "aten.adaptive_max_pool3d.default",
        "pool3d-adaptive-max-uneven-indices",
        lambda x: F.adaptive_max_pool3d(x, 4, return_indices=True),
        randn(1, 2, 7, 9, 11),
        kinds=COMPOSED | {"MPSCat"},
        non_core=AMAX3,
    ),
    row(
        "aten.adaptive_max_pool3d.default",
        "pool3d-adaptive-max-indices-ties",
        lambda x: F.adaptive_max_pool3d(x, (5, 3, 6), return_indices=True),
        ties(2, 2, 7, 8, 9),
        kinds=COMPOSED,
        non_core=AMAX3,
    ),
]
