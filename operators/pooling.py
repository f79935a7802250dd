"""Pooling: max_pool2d_with_indices -> MPSMaxPool2DWithIndices, avg_pool2d -> MPSAvgPool2D.

ceil_mode is lowered only where it does not change the output size: the device's ceil
handling with padding differs from torch (semantics §5.14). Max-pool indices are int32 on
the device; when read they are cast to int64. divisor_override becomes an explicit multiply
(the device's own f32 multiplier breaks f16 graphs).
"""
from __future__ import annotations

import math
import operator

import torch
from torch.fx import Node

from ._util import arg, is_float, shape
from .registry import Lowering

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


LOWERINGS = [
    Lowering((aten.max_pool2d_with_indices.default,), _max_pool, _check(True), generic="args"),
    Lowering((aten.avg_pool2d.default,), _avg_pool, _check(False)),
]
