"""Shape ops: view, permute, expand, cat, split, squeeze, unsqueeze, select, slice.

Shapes are written as the static output shape from the graph (no -1 for the device to
infer), dims are normalised to non-negative values (the runtime crashes on negative dims in
slice/select, semantics §6 #19), and squeeze never writes an empty dims list (§6 #17).
"""
from __future__ import annotations

import torch
from torch.fx import Node

from ._util import arg, norm_dim, rank, shape, val
from .registry import Lowering

aten = torch.ops.aten


def _view(node: Node, b) -> None:
    out_shape = shape(node)
    b.emit("MPSView", input1_id=b.id(node.args[0]), output_id=b.out(node), num_dims=len(out_shape),
           shape=out_shape)


def _permute(node: Node, b) -> None:
    r = rank(node.args[0])
    perm = [norm_dim(d, r) for d in node.args[1]]
    b.emit("MPSPermute", input1_id=b.id(node.args[0]), output_id=b.out(node), num_dims=len(perm), perm=perm)


def _expand(node: Node, b) -> None:
    x, out_shape = node.args[0], shape(node)
    vid, in_shape = b.id(x), shape(x)
    if len(out_shape) > len(in_shape):  # the device only reads rank(x) entries: view up first (§6 #18)
        padded = [1] * (len(out_shape) - len(in_shape)) + in_shape
        up = b.new_value(b.dtype(x), padded)
        b.emit("MPSView", input1_id=vid, output_id=up, num_dims=len(padded), shape=padded)
        vid = up
    b.emit("MPSExpand", input1_id=vid, output_id=b.out(node), num_dims=len(out_shape), shape=out_shape)


def _cat_check(node: Node):
    dts = {val(t).dtype for t in node.args[0]}
    if len(dts) != 1:
        return f"cat of mixed dtypes {sorted(map(str, dts))} (the device does not promote)"
    return None


def _cat(node: Node, b) -> None:
    dim = norm_dim(arg(node, 1, "dim", 0), rank(node))
    b.emit("MPSCat", input_ids=[b.id(t) for t in node.args[0]], output_id=b.out(node), dim=dim)


def _split(node: Node, b) -> None:
    x = node.args[0]
    dim = norm_dim(arg(node, 2, "dim", 0), rank(x))
    outs = b.outs(node)
    b.emit("MPSSplitWithSizes", input1_id=b.id(x), output_ids=list(outs),
           split_sizes=[int(s) for s in node.args[1]], dim=dim)


def _squeeze(node: Node, b) -> None:
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
    b.emit("MPSSqueeze", input1_id=b.id(x), output_id=b.out(node), dims=axes)


def _unsqueeze(node: Node, b) -> None:
    dim = norm_dim(node.args[1], rank(node.args[0]) + 1)
    b.emit("MPSUnsqueeze", input1_id=b.id(node.args[0]), output_id=b.out(node), dim=dim)


def _select(node: Node, b) -> None:
    x = node.args[0]
    dim = norm_dim(node.args[1], rank(x))
    index = int(node.args[2])
    index = index + shape(x)[dim] if index < 0 else index
    if rank(x) == 1:  # result is rank 0 = [1] on the device: a one-element slice
        b.emit("MPSSlice", input1_id=b.id(x), output_id=b.out(node), dim=0, start=index, end=index + 1, step=1)
        return
    b.emit("MPSSelect", input1_id=b.id(x), output_id=b.out(node), dim=dim, index=index)


def _clamp_index(i, size: int, default: int) -> int:
    if i is None:
        return default
    i = int(i)
    if i < 0:
        i += size
    return min(max(i, 0), size)


def _slice_check(node: Node):
    step = arg(node, 4, "step", 1)
    return None if int(step) >= 1 else f"slice step {step} (the device needs step >= 1)"


def _slice(node: Node, b) -> None:
    x = node.args[0]
    dim = norm_dim(arg(node, 1, "dim", 0), rank(x))
    size = shape(x)[dim]
    start = _clamp_index(arg(node, 2, "start", None), size, 0)
    end = _clamp_index(arg(node, 3, "end", None), size, size)
    b.emit("MPSSlice", input1_id=b.id(x), output_id=b.out(node), dim=dim, start=start, end=max(end, start),
           step=int(arg(node, 4, "step", 1)))


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
]
