"""Op-table rows: index_select, embedding, index.Tensor, index_put, slice/select_scatter, gather."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .harness import randint, randn, row, values

#: the no-grad form of aten._embedding_bag (the table exports under no_grad): not core ATen
BAG = torch.ops.aten._embedding_bag_forward_only.default


def i64(data):
    return values(data, torch.int64)


def _put_middle(x, i, v):
    y = x.clone()
    y[:, i] = v
    return y


def _perm_rows(rows, n, k):
    """int64 [rows, k]: distinct positions in [0, n) per row (scatter without duplicates)."""
    return lambda: torch.stack([torch.randperm(n)[:k] for _ in range(rows)])


def _perm_cols(n, k, cols):
    """int64 [k, cols]: distinct positions in [0, n) per column."""
    return lambda: torch.stack([torch.randperm(n)[:k] for _ in range(cols)], 1)


def _perm_last(a, b, n, k):
    return lambda: torch.stack([torch.randperm(n)[:k] for _ in range(a * b)]).reshape(a, b, k)


class ConstantIndex(torch.nn.Module):
    """index.Tensor whose index is a buffer (a blob constant: no negative-index fix-up needed)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("idx", torch.tensor([3, 0, 2]))

    def forward(self, x):
        return x[:, :, self.idx]


ROWS = [
    # ---- index_select ---------------------------------------------------------------------------
    row(
        "aten.index_select.default",
        "index-select-negdim",
        lambda x, i: x.index_select(-1, i),
        randn(2, 3, 4),
        i64([3, 0, 3]),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.index_select.default",
        "index-select-int32-index",
        lambda x, i: x.index_select(1, i),
        randn(2, 3, 4),
        values([2, 1], torch.int32),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.index_select.default",
        "index-select-0d-index",
        lambda x, i: x.index_select(1, i),
        randn(2, 3, 4),
        i64(2),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.index_select.default",
        "index-select-int-data",
        lambda x, i: x.index_select(0, i),
        randint(-9, 9, (4, 3)),
        i64([3, 3, 0]),
        kinds="MPSIndexSelect",
    ),
    # ---- embedding: padding_idx must be written as -1 (the device zeroes padding rows) --------
    row(
        "aten.embedding.default",
        "index-embedding-padding-idx",
        lambda w, i: F.embedding(i, w, padding_idx=0),
        randn(6, 5),
        i64([[0, 1], [4, 0]]),
        kinds="MPSEmbedding",
    ),
    row(
        "aten.embedding.default",
        "index-embedding-int32",
        lambda w, i: F.embedding(i, w),
        randn(6, 5),
        values([5, 2, 2], torch.int32),
        kinds="MPSEmbedding",
    ),
    row(
        "aten.embedding.default", "index-embedding-0d", lambda w, i: F.embedding(i, w), randn(6, 5), i64(3), kinds="MPSEmbedding"
    ),
    # ---- embedding_bag: bags from runtime offsets, one matmul with a membership mask -------------
    row(
        "aten._embedding_bag_forward_only.default",
        "index-embedding-bag-mean",
        lambda i, o: F.embedding_bag(i, torch.linspace(-2, 2, 50).reshape(10, 5), o),
        i64([1, 2, 4, 5, 4, 3, 2, 9]),
        i64([0, 4]),
        kinds={"MPSEmbedding", "MPSMatMul"},
        non_core=[BAG],
    ),
    row(
        "aten._embedding_bag_forward_only.default",
        "index-embedding-bag-sum-empty-bags",
        lambda i, o: F.embedding_bag(i, torch.linspace(-2, 2, 50).reshape(10, 5), o, mode="sum"),
        i64([1, 2, 4, 5, 4, 3, 2, 9]),
        i64([0, 0, 3, 8]),
        kinds={"MPSEmbedding", "MPSMatMul"},
        non_core=[BAG],
    ),
    row(
        "aten._embedding_bag_forward_only.default",
        "index-embedding-bag-mean-empty-last",
        lambda i, o: F.embedding_bag(i, torch.linspace(-2, 2, 50).reshape(10, 5), o, mode="mean"),
        i64([1, 2, 4]),
        i64([0, 1, 3]),
        kinds={"MPSEmbedding", "MPSMatMul"},
        non_core=[BAG],
    ),
    row(
        "aten._embedding_bag_forward_only.default",
        "index-embedding-bag-include-last-offset",
        lambda i, o: F.embedding_bag(i, torch.linspace(-2, 2, 50).reshape(10, 5), o, mode="sum", include_last_offset=True),
        i64([1, 2, 4, 5, 4, 3]),
        i64([0, 2, 2, 6]),
        kinds={"MPSEmbedding", "MPSMatMul"},
        non_core=[BAG],
    ),
    row(
        "aten._embedding_bag_forward_only.default",
        "index-embedding-bag-mean-include-last-offset-short",
        lambda i, o: F.embedding_bag(  # torch's divisor quirk
            i, torch.linspace(-2, 2, 50).reshape(10, 5), o, mode="mean", include_last_offset=True
        ),
        i64([1, 2, 4, 5, 4, 3, 2, 9]),
        i64([0, 2, 4]),
        kinds={"MPSEmbedding", "MPSMatMul"},
        non_core=[BAG],
    ),
    row(
        "aten._embedding_bag_forward_only.default",
        "index-embedding-bag-padding-idx",
        lambda i, o: F.embedding_bag(i, torch.linspace(-2, 2, 50).reshape(10, 5), o, mode="mean", padding_idx=2),
        i64([1, 2, 4, 2, 4, 3]),
        i64([0, 3]),
        kinds={"MPSEmbedding", "MPSMatMul"},
        non_core=[BAG],
    ),
    row(
        "aten._embedding_bag_forward_only.default",
        "index-embedding-bag-per-sample-weights",
        lambda i, o, sw: F.embedding_bag(i, torch.linspace(-2, 2, 50).reshape(10, 5), o, mode="sum", per_sample_weights=sw),
        i64([1, 2, 4, 5, 4]),
        i64([0, 2]),
        randn(5),
        kinds={"MPSEmbedding", "MPSMatMul"},
        non_core=[BAG],
    ),
    row(
        "aten._embedding_bag_forward_only.default",
        "index-embedding-bag-int32",
        lambda i, o: F.embedding_bag(i, torch.linspace(-2, 2, 50).reshape(10, 5), o),
        values([9, 0, 3], torch.int32),
        values([0, 1], torch.int32),
        kinds={"MPSEmbedding", "MPSMatMul"},
        non_core=[BAG],
    ),
    row(
        "aten._embedding_bag_forward_only.default",
        "index-embedding-bag-max",
        lambda i, o: F.embedding_bag(i, torch.linspace(-2, 2, 50).reshape(10, 5), o, mode="max"),
        i64([1, 2, 4, 5, 9, 0, 3]),
        i64([0, 2, 2, 5]),
        kinds={"MPSEmbedding", "MPSMaxPool2DWithIndices"},
        non_core=[BAG],
    ),
    row(
        "aten._embedding_bag.default",
        "index-embedding-bag-max-indices-read",
        lambda i, o: torch.ops.aten._embedding_bag(torch.linspace(-2, 2, 50).reshape(10, 5), i, o, False, 2)[3],
        i64([1, 2, 4, 5]),
        i64([0, 2]),
        cpu_reason="max_indices outputs are read",
        non_core=[BAG],
    ),
    # ---- index.Tensor: exactly one index -------------------------------------------------------
    row(
        "aten.index.Tensor",
        "index-tensor-one-negative",
        lambda x, i: x[:, i],
        randn(2, 3, 4),
        i64([0, 2, -1, -3]),
        kinds="MPSIndexTensor",
    ),
    row(
        "aten.index.Tensor",
        "index-tensor-2d-index",
        lambda x, i: x[..., i],
        randn(2, 3, 4),
        i64([[0, -2], [3, 1]]),
        kinds="MPSIndexTensor",
    ),
    row(
        "aten.index.Tensor",
        "index-tensor-first",
        lambda x, i: x[i],
        randn(5, 3),
        values([4, 0, 4], torch.int32),
        kinds="MPSIndexTensor",
    ),
    row("aten.index.Tensor", "index-tensor-constant-index", ConstantIndex, randn(2, 3, 4), kinds="MPSIndexTensor"),
    # several indices that are not an outer product: one linearized index, one MPSIndexSelect;
    # on non-adjacent axes (torch puts the index axes first) the data is permuted first
    row(
        "aten.index.Tensor",
        "index-tensor-two",
        lambda x, i: x[i, :, i],
        randn(2, 3, 4),
        i64([0, -1]),
        kinds={"MPSPermute", "MPSIndexSelect"},
    ),
    # several indices: an outer product on adjacent axes is one index_select per axis ...
    row(
        "aten.index.Tensor",
        "index-tensor-outer",
        lambda x, r, c: x[:, r[:, None], c],
        randn(2, 5, 4),
        i64([4, -1, 0]),
        i64([3, -4]),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.index.Tensor",
        "index-tensor-outer-three",
        lambda x, a, r, c: x[a[:, None, None], r[:, None], c],
        randn(3, 5, 4),
        i64([2, 0]),
        i64([4, -1, 0]),
        i64([3, -4]),
        kinds="MPSIndexSelect",
    ),
    # ... clamped at >= 0 (interpolation decompositions): no negative-index fix-up
    row(
        "aten.index.Tensor",
        "index-tensor-outer-clamped",
        lambda x, r, c: x[:, :, r.clamp(0, 4)[:, None], c.clamp(min=0)],
        randn(1, 2, 5, 4),
        i64([4, 7, 0, 2]),
        i64([3, -4, 1]),
        kinds="MPSIndexSelect",
    ),
    # ... pairs of indices (a zip, not an outer product): rows * 4 + cols into the [20] view
    row(
        "aten.index.Tensor",
        "index-tensor-zip",
        lambda x, r, c: x[r, c],
        randn(5, 4),
        i64([4, 0, -1]),
        i64([3, 1, -4]),
        kinds={"MPSMul", "MPSAdd", "MPSIndexSelect"},
    ),
    row(
        "aten.index.Tensor",
        "index-tensor-zip-middle-broadcast",
        lambda x, r, c: x[:, r, c],
        randn(2, 5, 4, 3),
        randint(0, 5, (2, 3), torch.int64),
        values([3, 0, 2], torch.int32),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.index.Tensor",
        "index-tensor-zip-three-int-data",
        lambda x, a, r, c: x[a, r, c],
        randint(-9, 9, (3, 5, 4), torch.int64),
        i64([2, 0, 1, 2]),
        i64([4, -1, 0, 3]),
        i64([0]),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.index.Tensor",
        "index-tensor-zip-non-adjacent",
        lambda x, r, c: x[r, :, c],
        randn(5, 2, 4, 3),
        i64([[4, 0], [1, 1]]),
        i64([3, -1]),
        kinds={"MPSPermute", "MPSIndexSelect"},
    ),
    # ---- index_put: one index, accumulate=False, values_shape = full indexed shape --------------
    row(
        "aten.index_put.default",
        "index-put-first",
        lambda x, i, v: x.index_put((i,), v),
        randn(4, 3, 2),
        i64([1, -4]),
        randn(2, 3, 2),
        kinds="MPSIndexPut",
    ),
    row(
        "aten.index_put.default",
        "index-put-broadcast-values",
        lambda x, i, v: x.index_put((i,), v),
        randn(4, 3, 2),
        i64([3, 0]),
        randn(2),
        kinds="MPSIndexPut",
    ),
    row(
        "aten.index_put.default",
        "index-put-middle-axis",
        _put_middle,
        randn(2, 5, 3),
        i64([4, -1]),
        randn(2, 2, 3),
        kinds="MPSIndexPut",
    ),
    # several indices: linearized, one MPSIndexPut on the view with the indexed axes as one
    row(
        "aten.index_put.default",
        "index-put-two",
        lambda x, r, c, v: x.index_put((r, c), v),
        randn(5, 2),
        i64([0, 2]),
        i64([1, -1]),
        randn(2),
        kinds={"MPSIndexPut", "MPSView"},
    ),
    row(
        "aten.index_put.default",
        "index-put-three-broadcast-values",
        lambda x, a, r, c, v: x.index_put((a, r, c), v),
        randn(5, 3, 2),
        i64([0, 2]),
        i64([1, 1]),
        i64([0, 1]),
        randn(1),
        kinds="MPSIndexPut",
    ),
    row(
        "aten.index_put.default",
        "index-put-four",
        lambda x, a, r, c, d, v: x.index_put((a, r, c, d), v),
        randn(5, 3, 2, 4),
        i64([0, 2]),
        i64([1, 1]),
        i64([0, 1]),
        i64([2, 3]),
        values([10.0]),
        kinds="MPSIndexPut",
    ),
    row(
        "aten.index_put.default",
        "index-put-middle-zip",
        lambda x, r, c, v: torch.ops.aten.index_put(x, [None, r, c], v),
        randn(2, 5, 4, 3),
        i64([[4, 0], [1, -2]]),
        i64([3, 1]),
        randn(2, 2, 2, 3),
        kinds="MPSIndexPut",
    ),
    row(
        "aten.index_put.default",
        "index-put-non-adjacent",
        lambda x, r, c, v: torch.ops.aten.index_put(x, [r, None, c], v),
        randn(5, 3, 4),
        i64([4, 0]),
        i64([-1, 2]),
        randn(3),
        kinds={"MPSPermute", "MPSIndexPut"},
    ),
    row(
        "aten.index_put.default",
        "index-put-int-data",
        lambda x, r, c, v: x.index_put((r, c), v),
        randint(-9, 9, (4, 3)),
        i64([0, 3]),
        i64([2, 2]),
        randint(-9, 9, (2,)),
        kinds="MPSIndexPut",
    ),
    # accumulate=True (the device scatter overwrites, §6 #10): gather, add, scatter per entry in
    # index order, like torch's serial kernel: duplicates sum in torch's order
    row(
        "aten.index_put.default",
        "index-put-accumulate",
        lambda x, i, v: x.index_put((i,), v, accumulate=True),
        randn(4, 3),
        i64([1, 1, -4, 3]),
        randn(4, 3),
        kinds={"MPSIndexSelect", "MPSAdd", "MPSIndexPut"},
    ),
    row(
        "aten.index_put.default",
        "index-put-accumulate-middle-broadcast",
        lambda x, i, v: torch.ops.aten.index_put(x, [None, i], v, True),
        randn(2, 5, 3),
        i64([[4, 0], [4, 4]]),
        randn(3),
        kinds="MPSIndexPut",
    ),
    row(
        "aten.index_put.default",
        "index-put-accumulate-two",
        lambda x, r, c, v: x.index_put((r, c), v, accumulate=True),
        randn(5, 2),
        i64([0, 2, 0]),
        i64([1, 1, 1]),
        randn(3),
        kinds="MPSIndexPut",
    ),
    row(
        "aten.index_put.default",
        "index-put-accumulate-int-wraps",
        lambda x, i, v: x.index_put((i,), v, accumulate=True),
        values([120, -5, 7], torch.int8),
        i64([0, 0, 2]),
        values([5, 10, -3], torch.int8),
        kinds="MPSIndexPut",
    ),
    row(
        "aten.index_put.default",
        "index-put-accumulate-many",
        lambda x, i, v: x.index_put((i,), v, accumulate=True),
        randn(8),
        randint(0, 8, (40,), torch.int64),
        randn(40),
        cpu_reason="accumulate=True of 40 index entries",
    ),
    # ---- slice_scatter / select_scatter -------------------------------------------------------
    row(
        "aten.slice_scatter.default",
        "index-slice-scatter",
        lambda x, s: torch.slice_scatter(x, s, 1, 1, 3),
        randn(2, 5, 3),
        randn(2, 2, 3),
        kinds={"MPSSlice", "MPSCat"},
    ),
    # upstream defect: negative / oversized start and end were not normalised
    row(
        "aten.slice_scatter.default",
        "index-slice-scatter-neg-clamped",
        lambda x, s: torch.slice_scatter(x, s, -1, -3, 100),
        randn(2, 3, 5),
        randn(2, 3, 3),
        kinds="MPSCat",
    ),
    row(
        "aten.slice_scatter.default",
        "index-slice-scatter-step",
        lambda x, s: torch.slice_scatter(x, s, 2, 1, None, 2),
        randn(2, 3, 6),
        randn(2, 3, 3),
        kinds="MPSScatter",
    ),
    row(
        "aten.slice_scatter.default",
        "index-slice-scatter-start-only",
        lambda x, s: torch.slice_scatter(x, s, 0, 2),
        randn(5, 3),
        randn(3, 3),
        kinds="MPSCat",
    ),
    row(
        "aten.select_scatter.default",
        "index-select-scatter",
        lambda x, s: torch.select_scatter(x, s, 1, -1),
        randn(2, 3, 4),
        randn(2, 4),
    ),
    row(
        "aten.select_scatter.default",
        "index-select-scatter-preserved",
        lambda x, s: torch.select_scatter(x, s, 0, 1),
        randn(3, 4),
        randn(4),
        kinds="MPSCat",
    ),
    # ---- scatter (set mode) -> MPSScatter ---------------------------------------------------------
    row(
        "aten.scatter.src",
        "index-scatter-src",
        lambda x, i, s: x.scatter(1, i, s),
        randn(3, 5),
        _perm_rows(3, 5, 2),
        randn(3, 2),
        kinds="MPSScatter",
    ),
    row(
        "aten.scatter.src",
        "index-scatter-src-larger",
        lambda x, i, s: torch.scatter(x, 0, i, s),
        randn(4, 3),
        _perm_cols(4, 2, 3),
        randn(3, 5),
        kinds={"MPSSlice", "MPSScatter"},
    ),  # src sliced to the index's shape
    # an index smaller than the data on another axis: scatter into the corner, cat the rest back
    row(
        "aten.scatter.src",
        "index-scatter-corner",
        lambda x, i, s: x.scatter(2, i, s),
        randn(3, 4, 5),
        _perm_last(2, 3, 5, 2),
        randn(2, 3, 2),
        kinds={"MPSScatter", "MPSCat"},
    ),
    row(
        "aten.scatter.value",
        "index-scatter-value",
        lambda x, i: x.scatter(1, i, -2.5),
        randn(3, 5),
        _perm_rows(3, 5, 3),
        kinds={"MPSExpand", "MPSScatter"},
    ),
    row(
        "aten.scatter.value",
        "index-scatter-value-int",
        lambda x, i: x.scatter(0, i, 7),
        randint(-9, 9, (4, 3), torch.int64),
        _perm_cols(4, 2, 3),
        kinds="MPSScatter",
    ),
    row(
        "aten.scatter_add.default",
        "index-scatter-add",
        lambda x, i, s: x.scatter_add(1, i, s),
        randn(3, 5),
        _perm_rows(3, 5, 2),
        randn(3, 2),
        cpu_reason="no MPS lowering for aten.scatter_add",
    ),
    # ---- gather --------------------------------------------------------------------------------
    row(
        "aten.gather.default",
        "index-gather",
        lambda x, i: torch.gather(x, 1, i),
        randn(2, 3, 4),
        randint(0, 3, (2, 5, 4), torch.int64),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.gather.default",
        "index-gather-last-smaller-index",
        lambda x, i: torch.gather(x, -1, i),
        randn(2, 3, 4),
        randint(0, 4, (1, 2, 3), torch.int64),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.gather.default",
        "index-gather-int32-index",
        lambda x, i: torch.gather(x, 0, i),
        randn(4, 3),
        randint(0, 4, (6, 3), torch.int32),
        kinds="MPSIndexSelect",
    ),
]
