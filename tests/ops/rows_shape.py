"""Op-table rows: view, permute, expand, cat, split, squeeze, unsqueeze, select, slice, pixel_shuffle,
repeat, flip, alias; pinned regressions of the upstream shape defects."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .harness import randint, randn, row

aten = torch.ops.aten


class BufferViews(torch.nn.Module):
    """Buffers that are views into larger storages (storage offset != 0): the blob must hold exactly
    the view's bytes (upstream copied the whole untyped storage; the device model checks the size)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.arange(40.0).reshape(10, 4)[3:6])  # offset 12 of 40
        self.register_buffer("scale", torch.linspace(-2.0, 2.0, 30)[7:11])  # offset 7 of 30

    def forward(self, x):
        return x * self.scale + self.shift


class ConstantView(torch.nn.Module):
    """The same for a lifted tensor constant (a plain tensor attribute)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.linspace(-2.0, 2.0, 30)[7:11]

    def forward(self, x):
        return x * self.scale


ROWS = [
    row("aten.view_copy.default", "shape-view", lambda x: x.reshape(4, -1), randn(2, 3, 4), kinds="MPSView"),
    row("aten.permute_copy.default", "shape-permute-negative", lambda x: x.permute(-1, 0, 1), randn(2, 3, 4), kinds="MPSPermute"),
    row("aten.permute_copy.default", "shape-transpose", lambda x: x.transpose(0, 2), randn(2, 3, 4), kinds="MPSPermute"),
    row("aten.permute_copy.default", "shape-t", lambda x: x.t(), randn(3, 4), kinds="MPSPermute"),
    row("aten.expand_copy.default", "shape-expand", lambda x: x.expand(3, -1, 4), randn(1, 2, 1), kinds="MPSExpand"),
    # upstream defect: the device's expand reads only rank(x) entries -> rank-increasing expands broke
    row(
        "aten.expand_copy.default",
        "shape-expand-rank-up",
        lambda x: x.expand(2, 3, 4),
        randn(3, 1),
        kinds={"MPSView", "MPSExpand"},
    ),
    row(
        "aten.cat.default", "shape-cat-negative-dim", lambda a, b: torch.cat([a, b], -1), randn(2, 3), randn(2, 5), kinds="MPSCat"
    ),
    row(
        "aten.cat.default",
        "shape-cat-int",
        lambda a, b: torch.cat([a, b]),
        randint(0, 9, (2, 3)),
        randint(0, 9, (1, 3)),
        kinds="MPSCat",
    ),
    row(
        "aten.split_with_sizes_copy.default",
        "shape-split-with-sizes",
        lambda x: torch.split(x, [1, 3], dim=-1),
        randn(2, 4),
        kinds="MPSSplitWithSizes",
    ),
    row("aten.slice_copy.Tensor", "shape-unbind", lambda x: x.unbind(1), randn(2, 3, 4)),
    # squeeze: upstream defect: nothing to squeeze -> empty dims -> the device squeezes axis 1
    row("aten.squeeze_copy.dims", "shape-squeeze-nothing", lambda x: x.squeeze(1), randn(2, 3, 4), kinds="MPSView"),
    row("aten.squeeze_copy.dims", "shape-squeeze-negative", lambda x: x.squeeze(-2), randn(2, 1, 4), kinds="MPSSqueeze"),
    row("aten.squeeze_copy.dims", "shape-squeeze-all", lambda x: x.squeeze(), randn(1, 3, 1, 2), kinds="MPSSqueeze"),
    row("aten.unsqueeze_copy.default", "shape-unsqueeze-negative", lambda x: x.unsqueeze(-1), randn(2, 3), kinds="MPSUnsqueeze"),
    # select / slice: upstream defect: negative dim crashes the runtime, start-only slices lost start
    row("aten.select_copy.int", "shape-select-negative", lambda x: x.select(-1, -2), randn(2, 3, 4), kinds="MPSSelect"),
    row("aten.mul.Tensor", "shape-select-rank1", lambda x: x[2] * 1.0, randn(5)),
    row(
        "aten.slice_copy.Tensor",
        "shape-slice-negdim-start-only",
        lambda x: aten.slice(x, -1, 1),
        randn(2, 3, 4),
        kinds="MPSSlice",
    ),
    row("aten.slice_copy.Tensor", "shape-slice-start-only", lambda x: x[:, 1:], randn(2, 3, 4), kinds="MPSSlice"),
    row("aten.slice_copy.Tensor", "shape-slice-step-clamped", lambda x: x[:, -100:100:2], randn(2, 7), kinds="MPSSlice"),
    row("aten.slice_copy.Tensor", "shape-slice-negative-end", lambda x: x[1:-1], randn(5, 2), kinds="MPSSlice"),
    # pixel_shuffle: decomposed (view/permute) until preserve works, then MPSPixelShuffle
    row("aten.pixel_shuffle.default", "shape-pixel-shuffle", lambda x: F.pixel_shuffle(x, 2), randn(2, 8, 3, 5)),
    row(
        "aten.pixel_shuffle.default",
        "shape-pixel-shuffle-preserved",
        lambda x: F.pixel_shuffle(x, 3),
        randn(1, 9, 2, 2),
        kinds="MPSPixelShuffle",
    ),
    row("aten.view_copy.default", "shape-pixel-unshuffle", lambda x: F.pixel_unshuffle(x, 2), randn(2, 3, 4, 6)),
    row("aten.repeat.default", "shape-repeat", lambda x: x.repeat(2, 1, 3), randn(2, 3, 4), kinds={"MPSView", "MPSExpand"}),
    row("aten.repeat.default", "shape-repeat-rank-up", lambda x: x.repeat(2, 1, 1, 2), randn(3, 1, 2), kinds="MPSExpand"),
    row("aten.repeat.default", "shape-repeat-int", lambda x: x.repeat(3), randint(0, 9, (4,)), kinds="MPSExpand"),
    row("aten.flip.default", "shape-flip", lambda x: x.flip(0, -1), randn(2, 3, 4), kinds="MPSIndexSelect"),
    row("aten.flip.default", "shape-flip-size1-only", lambda x: x.flip(1) + 1.0, randn(3, 1)),
    # roll (preserved): two slices and a cat per rolled axis
    row("aten.roll.default", "shape-roll", lambda x: torch.roll(x, 1, 0), randn(3, 4), kinds={"MPSSlice", "MPSCat"}),
    row(
        "aten.roll.default",
        "shape-roll-two-dims-negative",
        lambda x: torch.roll(x, (-1, 5), (-1, 1)),
        randn(2, 3, 4),
        kinds="MPSCat",
    ),
    row("aten.roll.default", "shape-roll-flat", lambda x: torch.roll(x, 5), randn(3, 4), kinds={"MPSView", "MPSCat"}),
    row(
        "aten.roll.default",
        "shape-roll-int-zero-shift",
        lambda x: torch.roll(x, (4, 2), (0, 1)),
        randint(0, 9, (4, 3)),
        kinds="MPSCat",
    ),
    # unfold: a gather with the constant window offsets, a view and a permute; step == size: a slice.
    # (Tensor.unfold reaches the partitioner as unfold_copy through to_edge_transform_and_lower; the
    # harness's plain to_edge keeps aten.unfold, which edge verification rejects unless excepted: both
    # targets share the lowering, tests/test_arg_forms.py lowers unfold_copy)
    row(
        "aten.unfold_copy.default",
        "shape-unfold",
        lambda x: x.unfold(1, 3, 2),
        randn(2, 8, 3),
        kinds={"MPSIndexSelect", "MPSPermute"},
        non_core=[aten.unfold.default],
    ),
    row(
        "aten.unfold_copy.default",
        "shape-unfold-last",
        lambda x: x.unfold(-1, 2, 1),
        randn(3, 5),
        kinds="MPSIndexSelect",
        non_core=[aten.unfold.default],
    ),
    row(
        "aten.unfold_copy.default",
        "shape-unfold-non-overlapping",
        lambda x: x.unfold(0, 2, 2),
        randint(0, 9, (5, 3)),
        kinds={"MPSSlice", "MPSPermute"},
        non_core=[aten.unfold.default],
    ),
    # as_strided: a reshape of a block, a permutation, or a gather of constant positions
    row(
        "aten.as_strided_copy.default",
        "shape-as-strided-view",
        lambda x: torch.as_strided(x, (2, 3), (3, 1), 2),
        randn(3, 4),
        kinds="MPSSlice",
    ),
    row(
        "aten.as_strided_copy.default",
        "shape-as-strided-permute",
        lambda x: torch.as_strided(x, (4, 3), (1, 4)),
        randn(3, 4),
        kinds="MPSPermute",
    ),
    row(
        "aten.as_strided_copy.default",
        "shape-as-strided-windows",
        lambda x: torch.as_strided(x, (3, 4), (2, 1), 1),
        randn(12),
        kinds="MPSIndexSelect",
    ),
    row(
        "aten.as_strided_copy.default",
        "shape-as-strided-out-of-bounds",
        lambda x: torch.ops.aten.as_strided_copy(x, (4, 4), (4, 1)),
        randn(3, 4),
        cpu_reason="reading element 15",
    ),
    row("aten.alias_copy.default", "shape-alias", lambda x: torch.ops.aten.alias(x) * 2.0, randn(3, 4)),
    row("aten.mul.Tensor", "shape-detach", lambda x: x.detach() * 2.0, randn(3, 4)),
    row("aten.mul.Tensor", "shape-buffer-views-of-larger-storage", BufferViews, randn(3, 4)),
    # fp32 only: the harness reuses one edge program for both precisions, and executorch's first
    # to_backend removes lifted constants from it ("Constant tensor scale is not in the constants
    # dictionary" in the second lowering) -- a harness limitation, reported
    row("aten.mul.Tensor", "shape-constant-view-of-larger-storage", ConstantView, randn(3, 4), precisions=("fp32",)),
]
