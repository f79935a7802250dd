"""Op-table rows: constant / reflection / replication pads, pooling (max, avg, adaptive), nearest
upsampling, batch / layer / group norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .harness import randint, randn, row

PAD_KINDS = "MPSIndexSelect"


def _avg_pool_kwargs(**kw):
    return lambda x: F.avg_pool2d(x, **kw)


class MaxPoolIndices(torch.nn.Module):
    def forward(self, x):
        return F.max_pool2d(x, 2, 2, return_indices=True)


ROWS = [
    # ---- constant_pad_nd ------------------------------------------------------------------------
    row(
        "aten.constant_pad_nd.default", "pad-constant-last", lambda x: F.pad(x, (1, 2)), randn(2, 3, 4), kinds="MPSConstantPadND"
    ),
    # upstream defect: the value argument was read unconditionally; here it must be honoured
    row(
        "aten.constant_pad_nd.default",
        "pad-constant-value",
        lambda x: F.pad(x, (1, 2, 0, 1), value=1.5),
        randn(2, 3, 4),
        kinds="MPSConstantPadND",
    ),
    row(
        "aten.constant_pad_nd.default",
        "pad-constant-three-axes",
        lambda x: F.pad(x, (1, 0, 0, 2, 3, 1)),
        randn(2, 3, 4),
        kinds="MPSConstantPadND",
    ),
    row(
        "aten.constant_pad_nd.default",
        "pad-constant-negative-crops",
        lambda x: F.pad(x, (-1, 2, 1, -1)),
        randn(2, 3, 4),
        kinds={"MPSSlice", "MPSConstantPadND"},
    ),
    row("aten.constant_pad_nd.default", "pad-constant-only-negative", lambda x: F.pad(x, (0, -2)), randn(3, 5), kinds="MPSSlice"),
    row(
        "aten.constant_pad_nd.default",
        "pad-constant-8-zero-tail",
        lambda x: F.pad(x, (1, 1, 0, 0, 0, 0, 0, 0)),
        randn(2, 3, 2, 2),
        kinds="MPSConstantPadND",
    ),
    row(
        "aten.constant_pad_nd.default",
        "pad-constant-8",
        lambda x: F.pad(x, (1, 1, 1, 1, 1, 1, 1, 1)),
        randn(2, 3, 2, 2),
        cpu_reason="more than the last 3 axes",
    ),
    row(
        "aten.constant_pad_nd.default",
        "pad-constant-int",
        lambda x: F.pad(x, (1, 1), value=7),
        randint(0, 9, (2, 3)),
        kinds="MPSConstantPadND",
    ),
    row(
        "aten.constant_pad_nd.default",
        "pad-constant-int-large-value",
        lambda x: F.pad(x, (1, 1), value=2**25 + 1),
        randint(0, 9, (2, 3), torch.int64),
        cpu_reason="holds integers up to 2^24",
    ),
    # ---- reflection / replication: kept whole (preserve) -> one MPSIndexSelect per padded axis
    row(
        "aten.reflection_pad2d.default",
        "pad-reflect-2d",
        lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"),
        randn(2, 3, 4, 5),
        kinds=PAD_KINDS,
    ),
    row(
        "aten.reflection_pad1d.default",
        "pad-reflect-1d",
        lambda x: F.pad(x, (3, 1), mode="reflect"),
        randn(2, 3, 5),
        kinds=PAD_KINDS,
    ),
    row(
        "aten.replication_pad1d.default",
        "pad-replicate-1d",
        lambda x: F.pad(x, (2, 1), mode="replicate"),
        randn(2, 3, 4),
        kinds=PAD_KINDS,
    ),
    row(
        "aten.replication_pad2d.default",
        "pad-replicate-2d",
        lambda x: F.pad(x, (1, 0, 2, 2), mode="replicate"),
        randn(1, 2, 3, 3),
        kinds=PAD_KINDS,
    ),
    row(
        "aten.reflection_pad3d.default",
        "pad-reflect-3d",
        lambda x: F.pad(x, (1, 1, 0, 2, 1, 0), mode="reflect"),
        randn(1, 2, 3, 3, 4),
        kinds=PAD_KINDS,
    ),
    # ---- max / avg pooling --------------------------------------------------------------------
    row(
        "aten.max_pool2d_with_indices.default",
        "pool-max",
        lambda x: F.max_pool2d(x, 2),
        randn(2, 3, 6, 6),
        kinds="MPSMaxPool2DWithIndices",
    ),
    row(
        "aten.max_pool2d_with_indices.default",
        "pool-max-indices",
        MaxPoolIndices,
        randn(1, 2, 4, 6),
        kinds={"MPSMaxPool2DWithIndices", "MPSCast"},
    ),
    row(
        "aten.max_pool2d_with_indices.default",
        "pool-max-padded-strided",
        lambda x: F.max_pool2d(x, 3, 2, 1),
        randn(1, 2, 7, 6),
        kinds="MPSMaxPool2DWithIndices",
    ),
    row("aten.avg_pool2d.default", "pool-avg", lambda x: F.avg_pool2d(x, 2), randn(2, 3, 6, 6), kinds="MPSAvgPool2D"),
    # upstream defect: count_include_pad only read with exactly 6 args
    row(
        "aten.avg_pool2d.default",
        "pool-avg-count-include-pad-false",
        _avg_pool_kwargs(kernel_size=3, stride=1, padding=1, count_include_pad=False),
        randn(1, 2, 5, 5),
        kinds="MPSAvgPool2D",
    ),
    # upstream defect: divisor_override -> the device's own f32 multiplier (breaks f16 graphs)
    # fp16: the window mean and the scale are rounded separately -> 2 roundings
    row(
        "aten.avg_pool2d.default",
        "pool-avg-divisor-override",
        _avg_pool_kwargs(kernel_size=3, stride=2, padding=1, divisor_override=5),
        randn(1, 2, 6, 6),
        kinds={"MPSAvgPool2D", "MPSMul"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.avg_pool2d.default",
        "pool-avg-divisor-override-no-pad-count",
        _avg_pool_kwargs(kernel_size=2, stride=2, padding=1, count_include_pad=False, divisor_override=3),
        randn(1, 2, 5, 5),
        kinds={"MPSAvgPool2D", "MPSMul"},
        tol={"fp16": 2e-3},
    ),
    # ---- adaptive average pooling ---------------------------------------------------------------
    row(
        "aten._adaptive_avg_pool2d.default",
        "pool-adaptive-avg",
        lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
        randn(2, 3, 6, 6),
        kinds="MPSAvgPool2D",
    ),
    row(
        "aten._adaptive_avg_pool2d.default",
        "pool-adaptive-avg-rank3",
        lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
        randn(3, 4, 6),
        kinds="MPSAvgPool2D",
    ),
    row("aten.mean.dim", "pool-adaptive-avg-1x1", lambda x: F.adaptive_avg_pool2d(x, 1), randn(2, 3, 5, 7), kinds="MPSMean"),
    # uneven bins, 3-d and ceil_mode pooling: rows_pool3d.py
    # ---- nearest upsampling -------------------------------------------------------------------
    row(
        "aten.upsample_nearest2d.vec",
        "pool-upsample-nearest-2x",
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
        randn(1, 2, 3, 4),
        kinds="MPSExpand",
    ),
    row(
        "aten.upsample_nearest2d.vec",
        "pool-upsample-nearest-size",
        lambda x: F.interpolate(x, size=(7, 5), mode="nearest"),
        randn(1, 2, 3, 4),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.upsample_nearest2d.vec",
        "pool-upsample-nearest-scale-3-1.5",
        lambda x: F.interpolate(x, scale_factor=(3, 1.5), mode="nearest"),
        randn(1, 2, 3, 4),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten._upsample_nearest_exact2d.vec",
        "pool-upsample-nearest-exact-preserved",
        lambda x: F.interpolate(x, size=(5, 6), mode="nearest-exact"),
        randn(1, 2, 3, 4),
        kinds="MPSIndexSelect",
    ),
    # ---- bilinear upsampling: one matmul per resized axis with torch's own weights ---------------
    # fp16: weights and the two products rounded -> 2e-3
    row(
        "aten.upsample_bilinear2d.vec",
        "pool-upsample-bilinear-size",
        lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"),
        randn(2, 3, 4, 5),
        kinds="MPSMatMul",
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.upsample_bilinear2d.vec",
        "pool-upsample-bilinear-align-corners",
        lambda x: F.interpolate(x, size=(8, 3), mode="bilinear", align_corners=True),
        randn(1, 2, 5, 6),
        kinds="MPSMatMul",
        tol={"fp16": 2e-3},
    ),
    # a scale factor: torch derives the source positions from 1 / factor, not from the sizes
    row(
        "aten.upsample_bilinear2d.vec",
        "pool-upsample-bilinear-scale",
        lambda x: F.interpolate(x, scale_factor=(1.7, 2.5), mode="bilinear"),
        randn(1, 2, 5, 3),
        kinds="MPSMatMul",
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.upsample_bilinear2d.vec",
        "pool-upsample-bilinear-8x",
        lambda x: F.interpolate(x, scale_factor=8, mode="bilinear"),
        randn(1, 2, 3, 4),
        kinds="MPSMatMul",
        tol={"fp16": 2e-3},
    ),
    # a 1x1 input (deeplab's image pooling branch) is a broadcast; one unchanged axis is skipped
    row(
        "aten.upsample_bilinear2d.vec",
        "pool-upsample-bilinear-from-1x1",
        lambda x: F.interpolate(x, size=(5, 6), mode="bilinear"),
        randn(2, 3, 1, 1),
        kinds="MPSExpand",
    ),
    row(
        "aten.upsample_bilinear2d.vec",
        "pool-upsample-bilinear-width-only",
        lambda x: F.interpolate(x, size=(4, 9), mode="bilinear"),
        randn(1, 2, 4, 3),
        kinds="MPSMatMul",
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.upsample_bilinear2d.vec",
        "pool-upsample-bilinear-downscale",
        lambda x: F.interpolate(x, size=(3, 2), mode="bilinear"),
        randn(1, 2, 7, 5),
        kinds="MPSMatMul",
        tol={"fp16": 2e-3},
    ),
    row(
        "aten._upsample_bilinear2d_aa.default",
        "pool-upsample-bilinear-antialias",
        lambda x: F.interpolate(x, size=(3, 2), mode="bilinear", antialias=True),
        randn(1, 2, 7, 5),
        cpu_reason="_upsample_bilinear2d_aa",
    ),
    # ---- normalization --------------------------------------------------------------------------
    row(
        "aten._native_batch_norm_legit_no_training.default",
        "norm-batch-norm",
        None,
        randn(2, 3, 4, 4),
        kinds="MPSBatchNorm",
        module=lambda: torch.nn.BatchNorm2d(3).eval(),
    ),
    # upstream defect: affine=False produced weight/bias id -1
    row(
        "aten._native_batch_norm_legit_no_training.default",
        "norm-batch-norm-no-affine",
        None,
        randn(2, 3, 4, 4),
        kinds="MPSBatchNorm",
        module=lambda: torch.nn.BatchNorm2d(3, affine=False).eval(),
    ),
    row(
        "aten.native_layer_norm.default",
        "norm-layer-norm",
        None,
        randn(2, 3, 8),
        kinds="MPSLayerNorm",
        module=lambda: torch.nn.LayerNorm(8),
    ),
    row(
        "aten.native_layer_norm.default",
        "norm-layer-norm-no-affine",
        lambda x: F.layer_norm(x, (3, 4)),
        randn(2, 3, 4),
        kinds="MPSLayerNorm",
    ),
    row(
        "aten.native_group_norm.default", "norm-group-norm", lambda x: F.group_norm(x, 4), randn(2, 8, 3, 3), kinds="MPSLayerNorm"
    ),
    # fp16: normalisation, weight product and bias sum rounded -> 3 roundings
    row(
        "aten.native_group_norm.default",
        "norm-group-norm-affine",
        None,
        randn(2, 6, 5),
        kinds={"MPSLayerNorm", "MPSMul", "MPSAdd"},
        module=lambda: torch.nn.GroupNorm(3, 6),
        tol={"fp16": 3e-3},
    ),
    row(
        "aten.native_group_norm.default",
        "norm-group-norm-rank2",
        None,
        randn(3, 6),
        kinds="MPSLayerNorm",
        module=lambda: torch.nn.GroupNorm(2, 6),
        tol={"fp16": 3e-3},
    ),
]
