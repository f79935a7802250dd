"""Shape ops: view, permute, expand, cat, split, squeeze, unsqueeze, select, slice, pixel_shuffle,
repeat, flip, alias.

Shapes are written as the static output shape from the graph (no -1 for the device to
infer), dims are normalised to non-negative values (the runtime crashes on negative dims in
slice/select, semantics §6 #19), and squeeze never writes an empty dims list (§6 #17).

- ``repeat`` is view (interleave size-1 axes) + same-rank expand + view: a pure broadcast copy.
- ``flip`` is one MPSIndexSelect per flipped axis with a constant reversed index (the device has
  no negative-step slice: MPSSlice needs step >= 1).
- ``pixel_shuffle`` is kept whole (``preserve``) and lowered to MPSPixelShuffle, which computes
  exactly ``torch.pixel_shuffle`` on the last three axes (semantics §5.11).
- ``roll`` is kept whole (``preserve``: the default decomposition builds an ``(arange + shift) fmod n``
  index in int64) and lowered as two slices and one MPSCat per rolled axis (``shifts`` taken modulo the
  axis size, a zero shift skipped); without ``dims`` the flattened tensor is rolled and viewed back.
- ``unfold_copy`` (``Tensor.unfold(dim, size, step)``): window ``w``, offset ``k`` is element ``w * step + k``
  of the axis: one MPSIndexSelect with that constant index (``[windows * size]``), a view splitting it
  into ``[windows, size]`` and a permute moving ``size`` last; for ``step == size`` (non-overlapping) a
  slice and the view and permute, no gather.
- ``as_strided_copy`` of a contiguous input (``out[i] = x.flat[offset + sum_j i_j * stride_j]``): a
  reshape of a contiguous block (``MPSSlice`` of the flat view + MPSView), a permutation of the input's
  axes (MPSPermute), or otherwise one MPSIndexSelect of the flat view with the constant element
  positions (overlapping windows too), at most ``AS_STRIDED_GATHER_MAX`` elements. Positions must lie
  inside the input (torch's storage bounds).

The small emit helpers below (``view``, ``permute``, ``binary``...) are shared by the other
families of this package that build multi-node decompositions.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.serialization.generated import nodes as N

from ._util import arg, clamp_index, norm_dim, rank, shape, val
from .emit import cat_values, expand, index_select, permute, slice_value, view
from .registry import Lowering

aten = torch.ops.aten


# ---- emit helpers (value-level: they work on value ids, not fx nodes) ---------------------------


def _view(node: Node, b: GraphBuilder) -> None:
    out_shape = shape(node)
    b.emit(N.MPSView(input1_id=b.id(node.args[0]), output_id=b.out(node), num_dims=len(out_shape), shape=out_shape))


def _permute(node: Node, b: GraphBuilder) -> None:
    r = rank(node.args[0])
    perm = [norm_dim(d, r) for d in node.args[1]]
    b.emit(N.MPSPermute(input1_id=b.id(node.args[0]), output_id=b.out(node), num_dims=len(perm), perm=perm))


def _expand(node: Node, b: GraphBuilder) -> None:
    expand(b, b.id(node.args[0]), shape(node.args[0]), shape(node), out=b.out(node))


def _cat_check(node: Node):
    dts = {val(t).dtype for t in node.args[0]}
    if len(dts) != 1:
        return f"cat of mixed dtypes {sorted(map(str, dts))} (the device does not promote)"
    return None


def _cat(node: Node, b: GraphBuilder) -> None:
    dim = norm_dim(arg(node, 1, "dim", 0), rank(node))
    b.emit(N.MPSCat(input_ids=[b.id(t) for t in node.args[0]], output_id=b.out(node), dim=dim))


def _split(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    dim = norm_dim(arg(node, 2, "dim", 0), rank(x))
    outs = b.outs(node)
    b.emit(N.MPSSplitWithSizes(input1_id=b.id(x), output_ids=list(outs), split_sizes=[int(s) for s in node.args[1]], dim=dim))


def _squeeze(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    in_shape, r = shape(x), rank(x)
    dims = arg(node, 1, "dim", None)
    if dims is None:
        dims = range(r)
    elif isinstance(dims, int):
        dims = [dims]
    axes = sorted({norm_dim(d, r) for d in dims if in_shape[norm_dim(d, r)] == 1})
    if not axes or len(axes) == r:  # nothing to squeeze, or everything (rank 0 is [1] on device)
        _view(node, b)
        return
    b.emit(N.MPSSqueeze(input1_id=b.id(x), output_id=b.out(node), dims=axes))


def _unsqueeze(node: Node, b: GraphBuilder) -> None:
    dim = norm_dim(node.args[1], rank(node.args[0]) + 1)
    b.emit(N.MPSUnsqueeze(input1_id=b.id(node.args[0]), output_id=b.out(node), dim=dim))


def _select(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    dim = norm_dim(node.args[1], rank(x))
    index = int(node.args[2])
    index = index + shape(x)[dim] if index < 0 else index
    if rank(x) == 1:  # result is rank 0 = [1] on the device: a one-element slice
        b.emit(N.MPSSlice(input1_id=b.id(x), output_id=b.out(node), dim=0, start=index, end=index + 1, step=1))
        return
    b.emit(N.MPSSelect(input1_id=b.id(x), output_id=b.out(node), dim=dim, index=index))


def _slice_check(node: Node):
    step = arg(node, 4, "step", 1)
    return None if int(step) >= 1 else f"slice step {step} (the device needs step >= 1)"


def _slice(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    dim = norm_dim(arg(node, 1, "dim", 0), rank(x))
    size = shape(x)[dim]
    start = clamp_index(arg(node, 2, "start", None), size, 0)
    end = clamp_index(arg(node, 3, "end", None), size, size)
    b.emit(
        N.MPSSlice(
            input1_id=b.id(x), output_id=b.out(node), dim=dim, start=start, end=max(end, start), step=int(arg(node, 4, "step", 1))
        )
    )


def _pixel_shuffle_check(node: Node):
    r = int(arg(node, 1, "upscale_factor"))
    x = node.args[0]
    if rank(x) < 3:
        return f"pixel_shuffle of a rank-{rank(x)} tensor"
    if r < 1 or shape(x)[-3] % (r * r):
        return f"pixel_shuffle: {shape(x)[-3]} channels not divisible by {r}^2"
    return None


def _pixel_shuffle(node: Node, b: GraphBuilder) -> None:
    b.emit(
        N.MPSPixelShuffle(input1_id=b.id(node.args[0]), output_id=b.out(node), upscale_factor=int(arg(node, 1, "upscale_factor")))
    )


def _repeat(node: Node, b: GraphBuilder) -> None:
    """x.repeat(R): view x to [1, s_i] pairs for repeated axes, expand the 1s to R_i (same rank,
    so the device's expand reads every entry), view to the result shape."""
    x, reps = node.args[0], [int(r) for r in node.args[1]]
    s = [1] * (len(reps) - rank(x)) + shape(x)
    paired, expanded = [], []
    for r, d in zip(reps, s):
        if r == 1:
            paired.append(d)
            expanded.append(d)
        else:
            paired += [1, d]
            expanded += [r, d]
    vid = b.id(x)
    if paired != shape(x):
        vid = view(b, vid, paired)
    if expanded != paired:
        out = b.new_value(b.dtype(x), expanded)
        b.emit(N.MPSExpand(input1_id=vid, output_id=out, num_dims=len(expanded), shape=expanded))
        vid = out
    view(b, vid, shape(node), out=b.out(node))


def _flip(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    s, r = shape(x), rank(x)
    dims = sorted({norm_dim(d, r) for d in node.args[1]})
    dims = [d for d in dims if d < len(s) and s[d] > 1]  # flipping a size-1 axis is the identity
    vid = b.id(x)
    if not dims:
        b.alias(node, vid)
        return
    for i, d in enumerate(dims):
        out = b.out(node) if i == len(dims) - 1 else None
        vid = index_select(b, vid, d, list(range(s[d] - 1, -1, -1)), out=out)


def _alias(node: Node, b: GraphBuilder) -> None:
    b.alias(node, b.id(node.args[0]))


def _roll(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    shifts = arg(node, 1, "shifts")
    shifts = [int(shifts)] if isinstance(shifts, int) else [int(v) for v in shifts]
    dims = arg(node, 2, "dims", [])
    dims = [int(dims)] if isinstance(dims, int) else [int(d) for d in dims]
    vid = b.id(x)
    if not dims:  # roll the flattened tensor
        n = val(x).numel()
        if shifts[0] % n == 0:
            b.alias(node, vid)
            return
        view(b, _roll_axis(b, view(b, vid, [n]), 0, shifts[0], n), shape(x) or [1], out=b.out(node))
        return
    s = shape(x) or [1]
    for shift, d in zip(shifts, dims):
        d = norm_dim(d, rank(x))
        vid = _roll_axis(b, vid, d, shift, s[d])
    b.alias(node, vid)


def _roll_axis(b: GraphBuilder, vid: int, dim: int, shift: int, size: int) -> int:
    """``vid`` rolled by ``shift`` along ``dim`` (size ``size``): ``cat(x[size - s:], x[:size - s])``."""
    s = shift % size
    if s == 0:
        return vid
    return cat_values(b, [slice_value(b, vid, dim, size - s, size), slice_value(b, vid, dim, 0, size - s)], dim)


def _roll_check(node: Node):
    shifts, dims = arg(node, 1, "shifts"), arg(node, 2, "dims", [])
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if (not dims and len(shifts) != 1) or (dims and len(dims) != len(shifts)):
        return f"roll with shifts {shifts} and dims {dims} (torch requires one shift per dim)"
    return None


def _unfold_args(node: Node):
    x = node.args[0]
    dim = norm_dim(int(arg(node, 1, "dimension")), rank(x))
    size, step = int(arg(node, 2, "size")), int(arg(node, 3, "step"))
    return x, dim, size, step


def _unfold_check(node: Node):
    x = node.args[0]
    if rank(x) == 0:
        return "unfold of a rank-0 tensor"
    return None


def _unfold(node: Node, b: GraphBuilder) -> None:
    x, dim, size, step = _unfold_args(node)
    s = shape(x)
    windows = (s[dim] - size) // step + 1
    vid = b.id(x)
    if step == size:
        picked = slice_value(b, vid, dim, 0, windows * size)
    else:
        offsets = (torch.arange(windows) * step).reshape(-1, 1) + torch.arange(size)
        picked = index_select(b, vid, dim, offsets.reshape(-1))
    split = view(b, picked, s[:dim] + [windows, size] + s[dim + 1 :])
    r = len(s) + 1
    perm = list(range(dim + 1)) + list(range(dim + 2, r)) + [dim + 1]  # the window offset axis last
    if perm == list(range(r)):
        b.alias(node, split)
    else:
        permute(b, split, perm, out=b.out(node))


#: most output elements as_strided_copy lowers as a gather with a constant index (4 bytes each)
AS_STRIDED_GATHER_MAX = 2**22


def _as_strided_args(node: Node):
    x = node.args[0]
    size = [int(d) for d in arg(node, 1, "size")]
    stride = [int(d) for d in arg(node, 2, "stride")]
    offset = arg(node, 3, "storage_offset", None)
    return x, size, stride, int(offset or 0)


def as_strided_overrun(node: Node) -> str | None:
    """What an ``as_strided_copy`` node of a contiguous input with non-negative strides reads past the
    input's last element (eager PyTorch refuses it: "out of bounds for storage"), else None."""
    x, size, stride, offset = _as_strided_args(node)
    v = val(x)
    if not v.is_contiguous() or v.storage_offset() != 0 or any(st < 0 for st in stride) or offset < 0:
        return None
    last = offset + sum((n - 1) * st for n, st in zip(size, stride))
    return f"as_strided_copy reading element {last} of a {v.numel()}-element input" if last >= v.numel() else None


def _as_strided_check(node: Node):
    x, size, stride, offset = _as_strided_args(node)
    v = val(x)
    if not v.is_contiguous() or v.storage_offset() != 0:
        return "as_strided_copy of a non-contiguous input (its storage layout is not the graph's)"
    if any(st < 0 for st in stride) or offset < 0:
        return f"as_strided_copy with negative strides {stride} / offset {offset}"
    overrun = as_strided_overrun(node)
    if overrun is not None:
        return overrun
    if _as_strided_form(x, size, stride, offset)[0] == "gather" and math.prod(size) > AS_STRIDED_GATHER_MAX:
        return (
            f"as_strided_copy of {math.prod(size)} elements that is neither a reshape nor a permutation "
            f"(a gather with a constant index, at most {AS_STRIDED_GATHER_MAX})"
        )
    return None


def _contiguous_strides(s: list[int]) -> list[int]:
    return [math.prod(s[i + 1 :]) for i in range(len(s))]


def _as_strided_form(x: Node, size: list[int], stride: list[int], offset: int):
    """("view", None): a contiguous block reshaped; ("permute", perm): x permuted; else ("gather", None).
    Size-1 axes have no meaningful stride and are ignored."""

    def same(a, b_):
        return all(n == 1 or st == st2 for n, st, st2 in zip(size, a, b_))

    if same(stride, _contiguous_strides(size)):
        return "view", None
    xs = shape(x)
    if offset == 0 and len(size) == len(xs) and sorted(size) == sorted(xs):
        xst = _contiguous_strides(xs)
        for perm in itertools.permutations(range(len(xs))) if len(xs) <= 6 else ():
            if [xs[p] for p in perm] == size and same(stride, [xst[p] for p in perm]):
                return "permute", list(perm)
    return "gather", None


def _as_strided(node: Node, b: GraphBuilder) -> None:
    x, size, stride, offset = _as_strided_args(node)
    n = val(x).numel()
    form, perm = _as_strided_form(x, size, stride, offset)
    out_shape = size or [1]
    if form == "permute":
        permute(b, b.id(x), perm, out=b.out(node))
        return
    flat = view(b, b.id(x), [n])
    count = math.prod(size)
    if form == "view":
        block = flat if (offset, count) == (0, n) else slice_value(b, flat, 0, offset, offset + count)
    else:
        positions = torch.full(size, offset, dtype=torch.int64)
        for d, (k, st) in enumerate(zip(size, stride)):
            positions = positions + (torch.arange(k) * st).reshape([-1 if e == d else 1 for e in range(len(size))])
        block = index_select(b, flat, 0, positions.reshape(-1))
    view(b, block, out_shape, out=b.out(node))


LOWERINGS = [
    Lowering((aten.view_copy.default, aten._unsafe_view.default), _view),
    Lowering((aten.permute_copy.default,), _permute),
    Lowering((aten.expand_copy.default,), _expand),
    Lowering((aten.cat.default,), _cat, _cat_check),
    Lowering((aten.split_with_sizes_copy.default,), _split),
    Lowering((aten.squeeze_copy.dims, aten.squeeze_copy.dim, aten.squeeze_copy.default), _squeeze),
    Lowering((aten.unsqueeze_copy.default,), _unsqueeze),
    Lowering((aten.select_copy.int,), _select),
    Lowering((aten.slice_copy.Tensor,), _slice, _slice_check),
    Lowering((aten.pixel_shuffle.default,), _pixel_shuffle, _pixel_shuffle_check, preserve=True),
    Lowering((aten.repeat.default,), _repeat),
    Lowering((aten.flip.default,), _flip),
    Lowering((aten.alias_copy.default, aten.detach_copy.default), _alias),
    Lowering((aten.roll.default,), _roll, _roll_check, preserve=True),
    # unfold: what to_edge keeps when aten.unfold is in _core_aten_ops_exception_list (same function)
    Lowering((aten.unfold_copy.default, aten.unfold.default), _unfold, _unfold_check),
    Lowering((aten.as_strided_copy.default,), _as_strided, _as_strided_check),
]
