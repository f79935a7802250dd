"""Op-table rows: mean, sum, max/min/argmax/argmin (max pooling; integers: pairwise ranks), topk, median,
sort (CPU), prod, any, cumsum, var."""

from __future__ import annotations

import torch

from .harness import randbool, randint, randn, row, uniform, values

NAN = float("nan")
MEDIAN, MEDIAN_DIM = torch.ops.aten.median.default, torch.ops.aten.median.dim


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
    row("aten.mean.default", "reduce-mean-all", lambda x: x.mean(), randn(2, 3, 4), kinds="MPSMean"),
    row("aten.mean.dim", "reduce-mean-empty-dims", lambda x: torch.mean(x, dim=[]), randn(2, 3, 4), kinds="MPSMean"),
    row("aten.mean.dim", "reduce-mean-negdims-keepdim", lambda x: x.mean((-1, 0), keepdim=True), randn(2, 3, 4), kinds="MPSMean"),
    row("aten.mean.default", "reduce-mean-int", lambda x: x.float().mean(), randint(0, 9, (3, 4)), kinds="MPSMean"),
    # dtype=: torch casts the input first (integers included), so does the lowering (fp16 graphs cast
    # to float16: exact for these small integers)
    row(
        "aten.mean.default",
        "reduce-mean-int64-dtype",
        lambda x: torch.mean(x, dtype=torch.float32),
        randint(-9, 10, (5, 10), torch.int64),
        kinds={"MPSCast", "MPSMean"},
    ),
    row(
        "aten.mean.dim",
        "reduce-mean-int32-dtype-dim",
        lambda x: torch.mean(x, 1, keepdim=True, dtype=torch.float32),
        randint(0, 100, (3, 4, 2)),
        kinds={"MPSCast", "MPSMean"},
    ),
    row(
        "aten.mean.dim",
        "reduce-mean-bool-dtype",
        lambda x: torch.mean(x, 0, dtype=torch.float32),
        randbool(6, 3),
        kinds={"MPSCast", "MPSMean"},
    ),
    row(
        "aten.sum.dim_IntList",
        "reduce-sum-int-dtype",
        lambda x: torch.sum(x, 0, dtype=torch.float32),
        randint(0, 9, (3, 4)),
        kinds={"MPSCast", "MPSMean"},
        tol={"fp16": 2e-3},
    ),  # fp16: mean and product rounded (as sum)
    # ---- sum = mean * count ----------------------------------------------------------------------
    # fp16: the mean and the product are each rounded to f16 -> 2 roundings
    row(
        "aten.sum.dim_IntList",
        "reduce-sum-all",
        lambda x: x.sum(),
        randn(2, 3, 4),
        kinds={"MPSMean", "MPSMul"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.sum.dim_IntList",
        "reduce-sum-dim-keepdim",
        lambda x: x.sum(1, keepdim=True),
        randn(2, 3, 4),
        kinds={"MPSMean", "MPSMul"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.sum.dim_IntList",
        "reduce-sum-empty-dims",
        lambda x: x.sum([]),
        randn(3, 4),
        kinds={"MPSMean", "MPSMul"},
        tol={"fp16": 2e-3},
    ),
    # 4099 is prime and not a float16 integer: the count itself is rounded (2^-12) -> 3 roundings
    row(
        "aten.sum.dim_IntList",
        "reduce-sum-count-not-f16",
        lambda x: x.sum(-1),
        randn(2, 4099, offset=1.0),
        kinds={"MPSMean", "MPSMul"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.sum.dim_IntList",
        "reduce-sum-int",
        lambda x: x.sum(0),
        randint(0, 9, (3, 4)),
        cpu_reason="sum of a torch.int32 tensor",
    ),
    # ---- max / min / argmax / argmin through MPSMaxPool2DWithIndices ---------------------------
    row("aten.amax.default", "reduce-amax-two-dims", lambda x: x.amax((0, 2)), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row(
        "aten.amin.default",
        "reduce-amin-keepdim",
        lambda x: x.amin(-1, keepdim=True),
        randn(2, 3, 4),
        kinds={"MPSMaxPool2DWithIndices", "MPSNeg"},
    ),
    row("aten.max.dim", "reduce-max-dim", lambda x: x.max(1), randn(2, 3, 4), kinds={"MPSMaxPool2DWithIndices", "MPSCast"}),
    row(
        "aten.min.dim",
        "reduce-min-dim-keepdim",
        lambda x: x.min(0, keepdim=True),
        randn(2, 3, 4),
        kinds={"MPSMaxPool2DWithIndices", "MPSNeg"},
    ),
    row(
        "aten.max.dim", "reduce-max-dim-values-only", lambda x: x.max(-1).values * 2, randn(3, 5), kinds="MPSMaxPool2DWithIndices"
    ),
    row("aten.max.default", "reduce-max-all", lambda x: x.max(), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row("aten.min.default", "reduce-min-all", lambda x: x.min(), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row("aten.argmax.default", "reduce-argmax-all", lambda x: x.argmax(), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row("aten.argmax.default", "reduce-argmax-dim", lambda x: x.argmax(1), randn(2, 3, 4), kinds="MPSMaxPool2DWithIndices"),
    row(
        "aten.argmin.default",
        "reduce-argmin-keepdim",
        lambda x: x.argmin(-1, keepdim=True),
        randn(2, 3, 4),
        kinds="MPSMaxPool2DWithIndices",
    ),
    row(
        "aten.argmax.default",
        "reduce-argmax-all-keepdim",
        lambda x: torch.argmax(x, keepdim=True),
        randn(3, 4),
        kinds="MPSMaxPool2DWithIndices",
    ),
    # ties: torch returns the first index (the device's tie rule is unverified; the model pools like torch)
    row(
        "aten.argmax.default",
        "reduce-argmax-ties",
        lambda x: x.argmax(-1),
        values([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]]),
        kinds="MPSMaxPool2DWithIndices",
    ),
    row(
        "aten.amax.default",
        "reduce-max-nan",
        lambda x: x.amax(-1),
        values([[1.0, NAN, 3.0], [0.5, 2.0, -1.0]]),
        kinds="MPSMaxPool2DWithIndices",
    ),
    # integers: ranks from pairwise comparisons (exact; the first index among equal values, as torch)
    row("aten.argmax.default", "reduce-argmax-int", lambda x: x.argmax(), randint(0, 9, (3, 4)), kinds={"MPSGt", "MPSMean"}),
    row(
        "aten.max.dim",
        "reduce-max-dim-int64",
        lambda x: x.max(1),
        values([[2**53 + 1, 2**53, -5, 2**53 + 1], [-3, -2, -2, -9]], torch.int64),
        kinds={"MPSGt", "MPSMaxPool2DWithIndices"},
    ),
    row(
        "aten.min.dim",
        "reduce-min-dim-int-keepdim",
        lambda x: x.min(-1, keepdim=True),
        randint(-99, 99, (2, 3, 5)),
        kinds="MPSLt",
    ),
    row(
        "aten.amax.default",
        "reduce-amax-int-dims",
        lambda x: x.amax((0, 2)),
        randint(-(2**31), 2**31 - 1, (2, 3, 4)),
        kinds="MPSGt",
    ),
    row(
        "aten.argmin.default",
        "reduce-argmin-int8-all",
        lambda x: x.argmin(),
        randint(-128, 127, (3, 5), torch.int8),
        kinds="MPSLt",
    ),
    row(
        "aten.amax.default", "reduce-max-int-too-long", lambda x: x.amax(-1), randint(0, 9, (2, 600)), cpu_reason="over 600 > 512"
    ),
    # ---- topk: rank_i = #elements before i (better, or equal at a lower index), one max-pool finds
    # each rank's position, one gather the values: exact, best first; equal values lowest index first
    # (torch's order among equal values is an implementation detail -- topk([2, 2, 2, 2], 1) gives index
    # 2 -- so these rows have distinct values; max / argmax document the first index, pinned above)
    row(
        "aten.topk.default",
        "reduce-topk",
        lambda x: torch.topk(x, 3),
        lambda: torch.randperm(40).reshape(5, 8).float(),
        kinds={"MPSGt", "MPSMean", "MPSMaxPool2DWithIndices", "MPSIndexSelect"},
    ),
    row(
        "aten.topk.default",
        "reduce-topk-smallest-dim0",
        lambda x: torch.topk(x, 2, dim=0, largest=False),
        lambda: torch.randperm(24).reshape(4, 3, 2).float() - 10,
        kinds="MPSLt",
    ),
    row(
        "aten.topk.default",
        "reduce-topk-nan-inf",
        lambda x: torch.topk(x, 4),
        values([[1.0, NAN, -float("inf"), 3.0, float("inf"), -0.5]]),
        kinds="MPSIsnan",
    ),
    row(
        "aten.topk.default",
        "reduce-topk-smallest-nan",
        lambda x: torch.topk(x, 3, largest=False),
        values([[NAN, 2.0, -1.0, 0.5, NAN]]),
        kinds="MPSIsnan",
    ),
    row(
        "aten.topk.default",
        "reduce-topk-int64",
        lambda x: torch.topk(x, 2, dim=1),
        lambda: torch.randperm(30).reshape(3, 10) * 2**40,
        kinds="MPSGt",
    ),
    row("aten.topk.default", "reduce-topk-values-only", lambda x: torch.topk(x, 5).values * 2, randn(4, 50), kinds="MPSMul"),
    row(
        "aten.topk.default",
        "reduce-topk-unsorted",
        lambda x: torch.topk(x, 3, sorted=False),
        randn(3, 8),
        cpu_reason="sorted=False",
    ),
    row("aten.topk.default", "reduce-topk-too-long", lambda x: torch.topk(x, 3), randn(2, 1000), cpu_reason="over 1000 > 512"),
    # median of all elements: rank (n - 1) // 2 ascending (lower median), NaN if there is one. Not core
    # ATen: to_edge_transform_and_lower keeps it for the partitioner, plain to_edge needs the exception
    row(
        "aten.median.default",
        "reduce-median-all",
        lambda x: torch.median(x),
        randn(5, 7),
        kinds={"MPSLt", "MPSMaxPool2DWithIndices"},
        non_core=[MEDIAN],
    ),
    row(
        "aten.median.default",
        "reduce-median-even-3d",
        lambda x: torch.median(x),
        randn(2, 3, 4),
        kinds="MPSIndexSelect",
        non_core=[MEDIAN],
    ),
    row(
        "aten.median.default",
        "reduce-median-nan",
        lambda x: torch.median(x),
        values([1.0, 5.0, NAN, 3.0, 0.0]),
        kinds="MPSIsnan",
        non_core=[MEDIAN],
    ),
    row(
        "aten.median.default",
        "reduce-median-int",
        lambda x: torch.median(x),
        lambda: torch.randperm(24).reshape(6, 4) - 12,
        kinds="MPSLt",
        non_core=[MEDIAN],
    ),
    row(
        "aten.median.dim",
        "reduce-median-dim",
        lambda x: torch.median(x, 1).values,
        randn(3, 6),
        non_core=[MEDIAN_DIM],
        cpu_reason="no MPS lowering for aten.median.dim",
    ),
    row("aten.sort.default", "reduce-sort", lambda x: torch.sort(x), randn(3, 8), cpu_reason="no sort node kind"),
    row("aten.sort.default", "reduce-argsort", lambda x: torch.argsort(x, dim=0), randn(3, 8), cpu_reason="no sort node kind"),
    # ---- prod: halves multiplied pairwise (a column of ones pads odd counts); integers wrap as in
    # torch (int64 result); floats: log2(n) roundings per element instead of torch's order
    row(
        "aten.prod.default",
        "reduce-prod-all",
        lambda x: torch.prod(x),
        uniform(0.5, 1.5, 3, 5),
        kinds={"MPSMul", "MPSSlice", "MPSCat"},
        tol={"fp16": 4e-3},
    ),  # fp16: 4 levels of f16 products -> 4 roundings
    row("aten.prod.dim_int", "reduce-prod-dim", lambda x: torch.prod(x, 1), randn(3, 6, 2), kinds="MPSMul", tol={"fp16": 3e-3}),
    row(
        "aten.prod.dim_int",
        "reduce-prod-dim-keepdim-negative",
        lambda x: torch.prod(x, -1, keepdim=True),
        randn(3, 7),
        kinds="MPSMul",
        tol={"fp16": 3e-3},
    ),
    row(
        "aten.prod.dim_int", "reduce-prod-int-wraps", lambda x: torch.prod(x, 0), randint(-(2**20), 2**20, (5, 4)), kinds="MPSMul"
    ),
    row(
        "aten.prod.default",
        "reduce-prod-int64-dtype",
        lambda x: torch.prod(x, dtype=torch.int64),
        randint(-5, 6, (3, 3), torch.int8),
        kinds={"MPSCast", "MPSMul"},
    ),
    row("aten.prod.dim_int", "reduce-prod-bool", lambda x: torch.prod(x, 1), randbool(4, 3), kinds={"MPSCast", "MPSMul"}),
    row(
        "aten.prod.dim_int",
        "reduce-prod-special",
        lambda x: torch.prod(x, 1),
        values([[1.0, NAN, 2.0], [0.0, float("inf"), 1.0], [-0.0, 2.0, 3.0]]),
        kinds="MPSMul",
    ),
    row("aten.prod.dim_int", "reduce-prod-size1", lambda x: torch.prod(x, 1), randn(3, 1)),
    # ---- any: mean of 0/1 flags > 0 (max pooling past 2^24 / 2^14 elements); all = not(any(not x))
    row("aten.any.default", "reduce-any-all", lambda x: x.any(), randbool(3, 4), kinds={"MPSCast", "MPSMean", "MPSGt"}),
    row("aten.any.dim", "reduce-any-dim", lambda x: x.any(1), randbool(2, 3, 4), kinds={"MPSMean", "MPSGt"}),
    row(
        "aten.any.dim",
        "reduce-any-float",
        lambda x: torch.any(x, -1, keepdim=True),
        values([[0.0, 0.0, -0.0], [0.0, -1.0, 0.0], [NAN, 0.0, 0.0]]),
        kinds={"MPSNe", "MPSMean"},
    ),
    row("aten.any.dim", "reduce-any-int-none", lambda x: torch.any(x, 0), values([[0, 0], [0, 5]], torch.int32), kinds="MPSMean"),
    row("aten.any.dim", "reduce-all", lambda x: x.all(1), randbool(3, 5), kinds="MPSMean"),
    row("aten.any.dims", "reduce-any-dims", lambda x: torch.ops.aten.any.dims(x, [0, 2]), randbool(2, 3, 4), kinds="MPSMean"),
    # a single set flag among 2^14 (fp16: 1/n is float16's smallest normal number, still > 0) ...
    row("aten.any.dim", "reduce-any-one-in-16384", lambda x: x.any(-1), _one_hot_rows(3, 2**14), kinds="MPSMean"),
    # ... and among more: the mean would be subnormal in float16, so fp16 max-pools (fp32 still averages)
    row("aten.any.dim", "reduce-any-one-in-20000", lambda x: x.any(-1), _one_hot_rows(3, 20000), kinds="MPSGt"),
    # any.dims with [] is the identity (x != 0), not a reduce-all
    row(
        "aten.any.dims",
        "reduce-any-dims-empty",
        lambda x: torch.ops.aten.any.dims(x, []),
        values([[0.0, 2.0], [-0.0, NAN]]),
        kinds="MPSNe",
    ),
    # ---- cumsum: lower-triangular matmul ------------------------------------------------------
    row("aten.cumsum.default", "reduce-cumsum", lambda x: x.cumsum(1), randn(2, 5, 3), kinds="MPSMatMul"),
    row("aten.cumsum.default", "reduce-cumsum-last", lambda x: x.cumsum(-1), randn(3, 7), kinds="MPSMatMul"),
    row(
        "aten.cumsum.default",
        "reduce-cumsum-too-long",
        lambda x: x.cumsum(0),
        randn(600),
        cpu_reason="cumsum over an axis of size 600",
    ),
    row(
        "aten.cumsum.default",
        "reduce-cumsum-int",
        lambda x: x.cumsum(0),
        randint(0, 5, (4,)),
        cpu_reason="cumsum of a torch.int32",
    ),
    # ---- var / std ----------------------------------------------------------------------------
    # fp16: mean, deviation, square, mean, scale: five f16 roundings (measured <= 6e-4)
    row(
        "aten.var.correction",
        "reduce-var-dim",
        lambda x: x.var(1),
        randn(2, 5, 3),
        kinds={"MPSMean", "MPSSub"},
        tol={"fp16": 2e-3},
    ),
    row("aten.var.correction", "reduce-var-all", lambda x: x.var(), randn(3, 4), kinds="MPSMean", tol={"fp16": 2e-3}),
    row(
        "aten.var.correction",
        "reduce-var-correction0-keepdim",
        lambda x: x.var((0, 2), correction=0, keepdim=True),
        randn(2, 3, 4),
        kinds="MPSMean",
        tol={"fp16": 2e-3},
    ),
    row("aten.var.correction", "reduce-std", lambda x: x.std(-1), randn(3, 6), kinds="MPSMean", tol={"fp16": 2e-3}),
    row("aten.var.correction", "reduce-var-one-element", lambda x: x.var(0), randn(1, 3), cpu_reason="divides by zero"),
]
