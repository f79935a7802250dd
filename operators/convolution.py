"""Convolution: 1-d and 2-d forward convolutions -> MPSConv2D / MPSDepthwiseConv2D.

Weights stay in torch layout (OIHW / OIL); the device permutes them (semantics §5.12).
Transposed and 3-d convolutions stay on CPU.
"""
from __future__ import annotations

import torch
from torch.fx import Node

from ._util import arg, is_float, shape
from .registry import Lowering

aten = torch.ops.aten


def _check(node: Node):
    if arg(node, 6, "transposed", False):
        return "transposed convolution (MPSConv computes forward convolution only)"
    if len(shape(node.args[1])) not in (3, 4):
        return f"{len(shape(node.args[1])) - 2}-d convolution (the device has 1-d and 2-d)"
    if not is_float(node.args[0]) or not is_float(node.args[1]):
        return "convolution of non-float tensors"
    dts = {a.meta["val"].dtype for a in node.args[:3] if isinstance(a, Node)}
    if len(dts) != 1:
        return f"mixed dtypes {sorted(map(str, dts))} in convolution"
    return None


def _lower(node: Node, b) -> None:
    x, w, bias = node.args[:3]
    stride, padding, dilation = (list(arg(node, i, n)) for i, n in ((3, "stride"), (4, "padding"), (5, "dilation")))
    groups = int(arg(node, 8, "groups", 1))
    wshape = shape(w)
    if len(wshape) == 3:  # conv1d: H = 1, everything acts on W
        stride, padding, dilation = [1, stride[0]], [0, padding[0]], [1, dilation[0]]
    c_in = shape(x)[1]
    depthwise = len(wshape) == 4 and groups > 1 and groups == c_in and wshape[0] == c_in and wshape[1] == 1
    b.emit("MPSDepthwiseConv2D" if depthwise else "MPSConv2D",
           input1_id=b.id(x), input2_id=b.id(w), input3_id=b.id(bias) if isinstance(bias, Node) else -1,
           output_id=b.out(node),
           stride_x=int(stride[1]), stride_y=int(stride[0]),
           dilation_x=int(dilation[1]), dilation_y=int(dilation[0]), groups=groups,
           padding_left=int(padding[1]), padding_right=int(padding[1]),
           padding_top=int(padding[0]), padding_bottom=int(padding[0]))


LOWERINGS = [Lowering((aten.convolution.default,), _lower, _check)]
