"""Pooling: max_pool2d_with_indices -> MPSMaxPool2DWithIndices, avg_pool2d -> MPSAvgPool2D,
adaptive_avg_pool2d, nearest and bilinear upsampling.

ceil_mode is lowered only where it does not change the output size: the device's ceil
handling with padding differs from torch (semantics §5.14). Max-pool indices are int32 on
the device; when read they are cast to int64. divisor_override becomes an explicit multiply
(the device's own f32 multiplier breaks f16 graphs).

``_adaptive_avg_pool2d`` is lowered when every window has the same size (input divisible by the
output): an MPSAvgPool2D with kernel = stride = input / output, or an MPSMean over H, W for a 1x1
output. Other sizes have overlapping windows of varying size and stay on CPU.

Nearest upsampling (``upsample_nearest2d``, ``_upsample_nearest_exact2d``) is separable: the source
row/column of every output row/column is obtained by running the same aten op on an index grid at
lowering time (shapes only, so torch's own float scale arithmetic is reproduced exactly). Integer
factors become view + expand + view (a broadcast copy); other mappings one MPSIndexSelect per axis
with that constant index.

Bilinear upsampling (``upsample_bilinear2d``; the union has no resize member) is separable and
linear: ``out = A_h @ x @ A_w^T`` with constant interpolation matrices ``A_h [H', H]``,
``A_w [W', W]`` whose rows hold torch's two lerp weights. They are obtained, like the nearest
indices, by running the aten op itself on one-hot float32 inputs at lowering time (one axis at a
time, the other of size 1), so the weights are torch's float32 weights bit for bit. Each resized
axis is one MPSMatMul (broadcast over N, C); an axis of input size 1 is a broadcast (MPSExpand), an
unchanged axis nothing. Deviation: a matmul reads every input row/column with weight 0 or more, so
an inf or NaN in the input makes its whole output column/row NaN, where torch confines it to the
output pixels whose two taps include it. Finite inputs match torch up to rounding.
"""
from __future__ import annotations

import math
import operator

import torch
from torch.fx import Node

from ._util import arg, is_float, rank, shape
from .registry import Lowering, op_key
from .shape import index_select, view

aten = torch.ops.aten


def _pair(v, default) -> list[int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return [v, v]
    v = [int(i) for i in v]
    return v * 2 if len(v) == 1 else v


def _params(node: Node, max_pool: bool):
    k = _pair(arg(node, 1, "kernel_size"), None)
    s = _pair(arg(node, 2, "stride", None), k)
    p = _pair(arg(node, 3, "padding", 0), 0)
    d = _pair(arg(node, 4, "dilation", 1), 1) if max_pool else [1, 1]
    ceil = bool(arg(node, 5 if max_pool else 4, "ceil_mode", False))
    return k, s, p, d, ceil


def _size(n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    span = n + 2 * p - d * (k - 1) - 1
    out = (math.ceil if ceil else math.floor)(span / s) + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    return out


def _check(max_pool: bool):
    def check(node: Node):
        x = node.args[0]
        if len(shape(x)) != 4:
            return f"rank-{len(shape(x))} input (the device pools NCHW tensors)"
        if not is_float(x):
            return "pooling of a non-float tensor"
        k, s, p, d, ceil = _params(node, max_pool)
        h, w = shape(x)[2:]
        if ceil and any(_size(n, *a, True) != _size(n, *a, False) for n, a in ((h, (k[0], s[0], p[0], d[0])),
                                                                          (w, (k[1], s[1], p[1], d[1])))):
            return "ceil_mode=True that changes the output size (device ceil handling differs from torch)"
        return None
    return check


def _fields(node: Node, b, max_pool: bool) -> dict:
    k, s, p, d, _ = _params(node, max_pool)
    return dict(input1_id=b.id(node.args[0]), kernel_height=k[0], kernel_width=k[1],
                stride_height=s[0], stride_width=s[1], padding_left=p[1], padding_right=p[1],
                padding_top=p[0], padding_bottom=p[0], dilation_height=d[0], dilation_width=d[1],
                ceil_mode=False)


def _indices_read(node: Node) -> bool:
    return any(u.target is operator.getitem and u.args[1] == 1 and u.users for u in node.users)


def _max_pool(node: Node, b) -> None:
    values = node.meta["val"]
    out = b.new_value(b.compute_dtype(values[0].dtype), values[0].shape)
    idx = b.new_value(torch.int32, values[1].shape)
    b.emit("MPSMaxPool2DWithIndices", **_fields(node, b, True), count_include_pad=False,
           divisor_override=0, output1_id=out, output2_id=idx)
    if _indices_read(node):
        idx = b.cast(idx, torch.int64)
    b.ids[node] = (out, idx)


def _avg_pool(node: Node, b) -> None:
    include_pad = bool(arg(node, 5, "count_include_pad", True))
    divisor = arg(node, 6, "divisor_override", None)
    k = _pair(arg(node, 1, "kernel_size"), None)
    fields = _fields(node, b, False)
    if divisor is None:
        b.emit("MPSAvgPool2D", **fields, count_include_pad=include_pad, divisor_override=0,
               output1_id=b.out(node), output2_id=-1)
        return
    dt = b.dtype(node)
    mean = b.new_value(dt, shape(node))
    b.emit("MPSAvgPool2D", **fields, count_include_pad=True, divisor_override=0, output1_id=mean, output2_id=-1)
    b.emit("MPSMul", input1_id=mean, input2_id=b.scalar(k[0] * k[1] / int(divisor), dt), output_id=b.out(node))


def _adaptive_check(node: Node):
    x = node.args[0]
    if rank(x) not in (3, 4):
        return f"adaptive pooling of a rank-{rank(x)} tensor"
    if not is_float(x):
        return "pooling of a non-float tensor"
    (h, w), (oh, ow) = shape(x)[-2:], [int(d) for d in node.args[1]]
    if h % oh or w % ow:
        return (f"adaptive_avg_pool2d {h}x{w} -> {oh}x{ow}: windows of unequal size (the input is not "
                "divisible by the output)")
    return None


def _adaptive(node: Node, b) -> None:
    x = node.args[0]
    r, (h, w) = rank(x), shape(x)[-2:]
    oh, ow = [int(d) for d in node.args[1]]
    if (oh, ow) == (1, 1):
        b.emit("MPSMean", input1_id=b.id(x), output_id=b.out(node), num_dims=2, dims=[r - 2, r - 1],
               keep_dims=True)
        return
    kh, kw = h // oh, w // ow
    vid = b.id(x) if r == 4 else view(b, b.id(x), [1] + shape(x))
    out = b.out(node) if r == 4 else b.new_value(b.dtype(node), [1] + shape(node))
    b.emit("MPSAvgPool2D", input1_id=vid, kernel_height=kh, kernel_width=kw, stride_height=kh, stride_width=kw,
           padding_left=0, padding_right=0, padding_top=0, padding_bottom=0, dilation_height=1,
           dilation_width=1, ceil_mode=False, count_include_pad=False, divisor_override=0,
           output1_id=out, output2_id=-1)
    if r == 3:
        view(b, out, shape(node), out=b.out(node))


def _upsample_check(node: Node):
    if rank(node.args[0]) != 4 or rank(node) != 4:
        return f"nearest upsampling of a rank-{rank(node.args[0])} tensor"
    return None


def _nearest_sources(node: Node) -> tuple[list[int], list[int]]:
    """Source row of each output row and source column of each output column, computed by the
    op itself on an index grid (float64 holds the indices exactly)."""
    h, w = shape(node.args[0])[-2:]
    grid = torch.arange(h * w, dtype=torch.float64).reshape(1, 1, h, w)
    src = node.target(grid, *node.args[1:], **node.kwargs)[0, 0].long()  # edge ops are callable
    rows, cols = src[:, 0] // w, src[0, :] % w
    if not torch.equal(src, rows[:, None] * w + cols[None, :]):
        raise ValueError("nearest upsampling that is not separable")
    return rows.tolist(), cols.tolist()


def _upsample_nearest(node: Node, b) -> None:
    x = node.args[0]
    n, c, h, w = shape(x)
    rows, cols = _nearest_sources(node)
    oh, ow = len(rows), len(cols)
    vid = b.id(x)
    if oh % h == 0 and ow % w == 0 and rows == [i // (oh // h) for i in range(oh)] \
            and cols == [j // (ow // w) for j in range(ow)]:
        sh, sw = oh // h, ow // w
        vid = view(b, vid, [n, c, h, 1, w, 1])
        big = b.new_value(b.dtype(x), [n, c, h, sh, w, sw])
        b.emit("MPSExpand", input1_id=vid, output_id=big, num_dims=6, shape=[n, c, h, sh, w, sw])
        view(b, big, shape(node), out=b.out(node))
        return
    steps = [(axis, src) for axis, src, size in ((2, rows, h), (3, cols, w)) if src != list(range(size))]
    if not steps:
        b.alias(node, vid)
        return
    for i, (axis, src) in enumerate(steps):
        vid = index_select(b, vid, axis, src, out=b.out(node) if i == len(steps) - 1 else None)


def _bilinear_check(node: Node):
    if rank(node.args[0]) != 4 or rank(node) != 4:
        return f"bilinear upsampling of a rank-{rank(node.args[0])} tensor"
    if not is_float(node.args[0]):
        return "bilinear upsampling of a non-float tensor"
    return None


def _bilinear_matrix(node: Node, axis: int) -> torch.Tensor:
    """``A [out, in]`` of ``axis`` (2: rows, 3: columns): the op applied to the one-hot basis of
    that axis, the other axis of size 1 and left at 1."""
    size, out = shape(node.args[0])[axis], shape(node)[axis]
    basis = torch.eye(size, dtype=torch.float32).reshape(size, 1, size, 1)
    if axis == 3:
        basis = basis.transpose(2, 3)
    sizes = [out, 1] if axis == 2 else [1, out]
    align = bool(arg(node, 2, "align_corners", False))
    if op_key(node.target) is aten.upsample_bilinear2d.vec:
        scales = arg(node, 3, "scale_factors", None)
        if scales is not None:  # torch then derives the scale from the factor, not from the sizes
            scales = [float(scales[0]), 1.0] if axis == 2 else [1.0, float(scales[1])]
        result = aten.upsample_bilinear2d.vec(basis, None if scales is not None else sizes, align, scales)
    else:
        scale = arg(node, 3 if axis == 2 else 4, "scales_h" if axis == 2 else "scales_w", None)
        result = aten.upsample_bilinear2d.default(basis, sizes, align, scale if axis == 2 else None,
                                                  scale if axis == 3 else None)
    return result.reshape(size, out).t().contiguous()


def _resized(node: Node, axis: int) -> bool:
    size = shape(node.args[0])[axis]
    return size != shape(node)[axis] or not torch.equal(_bilinear_matrix(node, axis), torch.eye(size))


def _upsample_bilinear(node: Node, b) -> None:
    x = node.args[0]
    vid, cur = b.id(x), shape(x)
    steps = [axis for axis in (3, 2) if _resized(node, axis)]
    if not steps:
        b.alias(node, vid)
        return
    dt = b.dtype(node)
    if all(shape(x)[axis] == 1 for axis in steps):  # from single pixels/rows/columns: one broadcast
        b.emit("MPSExpand", input1_id=vid, output_id=b.out(node), num_dims=4, shape=shape(node))
        return
    for k, axis in enumerate(steps):
        cur = cur[:axis] + [shape(node)[axis]] + cur[axis + 1:]
        out = b.out(node) if k == len(steps) - 1 else b.new_value(dt, cur)
        if shape(x)[axis] == 1:  # every output row/column is the one input row/column
            b.emit("MPSExpand", input1_id=vid, output_id=out, num_dims=4, shape=cur)
        elif axis == 3:  # x @ A_w^T
            b.emit("MPSMatMul", input1_id=vid, input2_id=b.constant(_bilinear_matrix(node, 3).t().contiguous(),
                                                                    dtype=dt), output_id=out)
        else:  # A_h @ x
            b.emit("MPSMatMul", input1_id=b.constant(_bilinear_matrix(node, 2), dtype=dt), input2_id=vid,
                   output_id=out)
        vid = out


LOWERINGS = [
    Lowering((aten.max_pool2d_with_indices.default,), _max_pool, _check(True), generic="args"),
    Lowering((aten.avg_pool2d.default,), _avg_pool, _check(False)),
    Lowering((aten._adaptive_avg_pool2d.default,), _adaptive, _adaptive_check),
    Lowering((aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default, aten._upsample_nearest_exact2d.vec,
              aten._upsample_nearest_exact2d.default), _upsample_nearest, _upsample_check, preserve=True),
    Lowering((aten.upsample_bilinear2d.vec, aten.upsample_bilinear2d.default), _upsample_bilinear, _bilinear_check,
             preserve=True),
]
