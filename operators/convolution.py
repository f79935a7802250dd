"""Convolution: 1-d and 2-d forward convolutions -> MPSConv2D / MPSDepthwiseConv2D.

Weights stay in torch layout (OIHW / OIL); the device permutes them (semantics §5.12).

Transposed 2-d convolution with ``kernel == stride`` (square ``r x r``), no padding, output padding
or dilation, one group -- the upsampling kind (SAM's and U-Nets' ``ConvTranspose2d(k=2, s=2)``) --
has no overlapping windows: ``out[n, o, r*h + i, r*w + j] = sum_c x[n, c, h, w] W[c, o, i, j] + b[o]``.
That is a 1x1 MPSConv2D to ``C_out * r * r`` channels (weight ``W.permute(1, 2, 3, 0)`` as
``[C_out*r*r, C_in, 1, 1]``, bias repeated ``r*r`` times) followed by MPSPixelShuffle(r), whose
channel order ``o*r*r + i*r + j`` is exactly that layout. Constant weights are re-laid out once
(the original leaves the blob when nothing else reads it); computed ones are permuted on the device.
Other transposed and 3-d convolutions stay on CPU.
"""
from __future__ import annotations

import torch
from torch.fx import Node

from ._util import arg, is_float, shape
from .registry import Lowering
from .shape import expand, permute, vdtype, view

aten = torch.ops.aten


def _common_reason(node: Node):
    if not is_float(node.args[0]) or not is_float(node.args[1]):
        return "convolution of non-float tensors"
    dts = {a.meta["val"].dtype for a in node.args[:3] if isinstance(a, Node)}
    if len(dts) != 1:
        return f"mixed dtypes {sorted(map(str, dts))} in convolution"
    return None


def _transposed_reason(node: Node):
    wshape = shape(node.args[1])
    stride, padding, dilation, out_pad = (list(arg(node, i, n)) for i, n in (
        (3, "stride"), (4, "padding"), (5, "dilation"), (7, "output_padding")))
    groups = int(arg(node, 8, "groups", 1))
    ok = (len(wshape) == 4 and wshape[2] == wshape[3] and stride == [wshape[2]] * 2 and not any(padding)
          and not any(out_pad) and dilation == [1, 1] and groups == 1)
    if not ok:
        return (f"transposed convolution with weight {wshape}, stride {stride}, padding {padding}, output padding "
                f"{out_pad}, dilation {dilation}, groups {groups}: MPSConv computes forward convolution only; "
                "lowered only for 2-d, square kernel == stride, no padding/dilation/groups (1x1 conv + pixel shuffle)")
    return None


def _check(node: Node):
    if len(shape(node.args[1])) not in (3, 4):
        return f"{len(shape(node.args[1])) - 2}-d convolution (the device has 1-d and 2-d)"
    reason = _common_reason(node)
    if reason is None and arg(node, 6, "transposed", False):
        reason = _transposed_reason(node)
    return reason


def _emit(b, op: str, x: int, w: int, bias: int, out: int, stride, padding, dilation, groups: int) -> None:
    b.emit(op, input1_id=x, input2_id=w, input3_id=bias, output_id=out,
           stride_x=int(stride[1]), stride_y=int(stride[0]),
           dilation_x=int(dilation[1]), dilation_y=int(dilation[0]), groups=groups,
           padding_left=int(padding[1]), padding_right=int(padding[1]),
           padding_top=int(padding[0]), padding_bottom=int(padding[0]))


def _transposed(node: Node, b) -> None:
    x, w, bias = node.args[:3]
    c_in, c_out, r, _ = shape(w)
    wid = b.id(w)

    def weight() -> int:  # [C_in, C_out, r, r] -> [C_out * r * r, C_in, 1, 1]
        data = b.constants.get(wid)
        if data is not None:
            return b.constant(data.permute(1, 2, 3, 0).reshape(c_out * r * r, c_in, 1, 1).contiguous(),
                              dtype=vdtype(b, wid))
        return view(b, permute(b, wid, [1, 2, 3, 0]), [c_out * r * r, c_in, 1, 1])

    bias_id = -1
    if isinstance(bias, Node):
        bid = b.id(bias)

        def repeated() -> int:  # each output channel's bias for its r * r sub-pixels
            data = b.constants.get(bid)
            if data is not None:
                return b.constant(data.repeat_interleave(r * r), dtype=vdtype(b, bid))
            return view(b, expand(b, view(b, bid, [c_out, 1]), [c_out, 1], [c_out, r * r]), [c_out * r * r])
        bias_id = b.memo(("transposed conv bias", bid, r), repeated)
    n, _, h, wd = shape(x)
    y = b.new_value(b.dtype(node), [n, c_out * r * r, h, wd])
    _emit(b, "MPSConv2D", b.id(x), b.memo(("transposed conv weight", wid), weight), bias_id, y,
          [1, 1], [0, 0], [1, 1], 1)
    b.emit("MPSPixelShuffle", input1_id=y, output_id=b.out(node), upscale_factor=r)


def _lower(node: Node, b) -> None:
    if arg(node, 6, "transposed", False):
        _transposed(node, b)
        return
    x, w, bias = node.args[:3]
    stride, padding, dilation = (list(arg(node, i, n)) for i, n in ((3, "stride"), (4, "padding"), (5, "dilation")))
    groups = int(arg(node, 8, "groups", 1))
    wshape = shape(w)
    if len(wshape) == 3:  # conv1d: H = 1, everything acts on W
        stride, padding, dilation = [1, stride[0]], [0, padding[0]], [1, dilation[0]]
    c_in = shape(x)[1]
    depthwise = len(wshape) == 4 and groups > 1 and groups == c_in and wshape[0] == c_in and wshape[1] == 1
    _emit(b, "MPSDepthwiseConv2D" if depthwise else "MPSConv2D", b.id(x), b.id(w),
          b.id(bias) if isinstance(bias, Node) else -1, b.out(node), stride, padding, dilation, groups)


LOWERINGS = [Lowering((aten.convolution.default,), _lower, _check)]
