"""Op-table rows: mean, sum, max/min/argmax/argmin (max pooling), any, cumsum, var."""
from __future__ import annotations

import torch

from .harness import randbool, randint, randn, row, values

NAN = float("nan")


def _one_hot_rows(rows: int, n: int):
    """Bool [rows, n]: row 0 all false, the others one true element (first / last position)."""
    def make():
        x = torch.zeros(rows, n, dtype=torch.bool)
        x[1:, 0] = True
        x[-1, 0], x[-1, -1] = False, True
        return x
    return make

ROWS = [
    # ---- mean: reduce-all must be written as every axis (empty dims = identity on the device) ---
    row("reduce-mean-all", lambda x: x.mean(), randn(2, 3, 4), kinds="MPSMean"),
    row("reduce-mean-empty-dims", lambda x: torch.mean(x, dim=[]), randn(2, 3, 4), kinds="MPSMean"),
    row("reduce-mean-negdims-keepdim", lambda x: x.mean((-1, 0), keepdim=True), randn(2, 3, 4), kinds="MPSMean"),
    row("reduce-mean-int", lambda x: x.float().mean(), randint(0, 9, (3, 4)), kinds="MPSMean"),

    # ---- sum = mean * count ----------------------------------------------------------------------
    # fp16: the mean and the product are each rounded to f16 -> 2 roundings
    row("reduce-sum-all", lambda x: x.sum(), randn(2, 3, 4), kinds={"MPSMean", "MPSMul"}, tol={"fp16": 2e-3}),
    row("reduce-sum-dim-keepdim", lambda x: x.sum(1, keepdim=True), randn(2, 3, 4), kinds={"MPSMean", "MPSMul"},
        tol={"fp16": 2e-3}),
    row("reduce-sum-empty-dims", lambda x: x.sum([]), randn(3, 4), kinds={"MPSMean", "MPSMul"},
        tol={"fp16": 2e-3}),
    # 4099 is prime and not a float16 integer: the count itself is rounded (2^-12) -> 3 roundings
    row("reduce-sum-count-not-f16", lambda x: x.sum(-1), randn(2, 4099, offset=1.0),
        kinds={"MPSMean", "MPSMul"}, tol={"fp16": 2e-3}),
    row("reduce-sum-int", lambda x: x.sum(0), randint(0, 9, (3, 4)), cpu_reason="sum of a torch.int32 tensor"),

    # ---- max / min / argmax / argmin through MPSMaxPool2DWithIndices ---------------------------
    row("reduce-amax-two-dims", lambda x: x.amax((0, 2)), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row("reduce-amin-keepdim", lambda x: x.amin(-1, keepdim=True), randn(2, 3, 4),
        kinds={"MPSMaxPool2DWithIndices", "MPSNeg"}),
    row("reduce-max-dim", lambda x: x.max(1), randn(2, 3, 4), kinds={"MPSMaxPool2DWithIndices", "MPSCast"}),
    row("reduce-min-dim-keepdim", lambda x: x.min(0, keepdim=True), randn(2, 3, 4),
        kinds={"MPSMaxPool2DWithIndices", "MPSNeg"}),
    row("reduce-max-dim-values-only", lambda x: x.max(-1).values * 2, randn(3, 5), kinds="MPSMaxPool2DWithIndices"),
    row("reduce-max-all", lambda x: x.max(), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row("reduce-min-all", lambda x: x.min(), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row("reduce-argmax-all", lambda x: x.argmax(), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row("reduce-argmax-dim", lambda x: x.argmax(1), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row("reduce-argmin-keepdim", lambda x: x.argmin(-1, keepdim=True), randn(2, 3, 4),
        kinds="MPSMaxPool2DWithIndices"),
    row("reduce-argmax-all-keepdim", lambda x: torch.argmax(x, keepdim=True), randn(3, 4),
        kinds="MPSMaxPool2DWithIndices"),
    # ties: torch returns the first index (the device's tie rule is unverified; the model pools like torch)
    row("reduce-argmax-ties", lambda x: x.argmax(-1), values([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]]),
        kinds="MPSMaxPool2DWithIndices"),
    row("reduce-max-nan", lambda x: x.amax(-1), values([[1.0, NAN, 3.0], [0.5, 2.0, -1.0]]),
        kinds="MPSMaxPool2DWithIndices"),
    row("reduce-argmax-int", lambda x: x.argmax(), randint(0, 9, (3, 4)), cpu_reason="max/min of a torch.int32"),

    # ---- any: mean of 0/1 flags > 0 (max pooling past 2^24 / 2^14 elements); all = not(any(not x))
    row("reduce-any-all", lambda x: x.any(), randbool(3, 4), kinds={"MPSCast", "MPSMean", "MPSGt"}),
    row("reduce-any-dim", lambda x: x.any(1), randbool(2, 3, 4), kinds={"MPSMean", "MPSGt"}),
    row("reduce-any-float", lambda x: torch.any(x, -1, keepdim=True),
        values([[0.0, 0.0, -0.0], [0.0, -1.0, 0.0], [NAN, 0.0, 0.0]]), kinds={"MPSNe", "MPSMean"}),
    row("reduce-any-int-none", lambda x: torch.any(x, 0), values([[0, 0], [0, 5]], torch.int32), kinds="MPSMean"),
    row("reduce-all", lambda x: x.all(1), randbool(3, 5), kinds="MPSMean"),
    row("reduce-any-dims", lambda x: torch.ops.aten.any.dims(x, [0, 2]), randbool(2, 3, 4), kinds="MPSMean"),
    # a single set flag among 2^14 (fp16: 1/n is float16's smallest normal number, still > 0) ...
    row("reduce-any-one-in-16384", lambda x: x.any(-1), _one_hot_rows(3, 2 ** 14), kinds="MPSMean"),
    # ... and among more: the mean would be subnormal in float16, so fp16 max-pools (fp32 still averages)
    row("reduce-any-one-in-20000", lambda x: x.any(-1), _one_hot_rows(3, 20000), kinds="MPSGt"),
    # any.dims with [] is the identity (x != 0), not a reduce-all
    row("reduce-any-dims-empty", lambda x: torch.ops.aten.any.dims(x, []), values([[0.0, 2.0], [-0.0, NAN]]),
        kinds="MPSNe"),

    # ---- cumsum: lower-triangular matmul ------------------------------------------------------
    row("reduce-cumsum", lambda x: x.cumsum(1), randn(2, 5, 3), kinds="MPSMatMul"),
    row("reduce-cumsum-last", lambda x: x.cumsum(-1), randn(3, 7), kinds="MPSMatMul"),
    row("reduce-cumsum-too-long", lambda x: x.cumsum(0), randn(600), cpu_reason="cumsum over an axis of size 600"),
    row("reduce-cumsum-int", lambda x: x.cumsum(0), randint(0, 5, (4,)), cpu_reason="cumsum of a torch.int32"),

    # ---- var / std ----------------------------------------------------------------------------
    # fp16: mean, deviation, square, mean, scale: five f16 roundings (measured <= 6e-4)
    row("reduce-var-dim", lambda x: x.var(1), randn(2, 5, 3), kinds={"MPSMean", "MPSSub"}, tol={"fp16": 2e-3}),
    row("reduce-var-all", lambda x: x.var(), randn(3, 4), kinds="MPSMean", tol={"fp16": 2e-3}),
    row("reduce-var-correction0-keepdim", lambda x: x.var((0, 2), correction=0, keepdim=True), randn(2, 3, 4),
        kinds="MPSMean", tol={"fp16": 2e-3}),
    row("reduce-std", lambda x: x.std(-1), randn(3, 6), kinds="MPSMean", tol={"fp16": 2e-3}),
    row("reduce-var-one-element", lambda x: x.var(0), randn(1, 3), cpu_reason="divides by zero"),
]
