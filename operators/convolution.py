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

Epilogue folding: when the only reader of a forward convolution with constant weights (and bias)
first maps each output channel affinely, ``y * s + t``, the map goes into the weights and bias:
``W' = W * s``, ``b' = b * s + t`` (computed in float64 and rounded once to the graph's dtype; ``W'``
is computed straight into the blob), and the convolution writes the mapped value. Readers folded:

* an inference batch norm with constant statistics and affine parameters:
  ``s = gamma / sqrt(var + eps)``, ``t = beta - mean * s``; it then emits nothing
  (``normalization._batch_norm``);
* hardsigmoid: ``s = 1/6``, ``t = 0.5``; it then emits only its MPSHardTanh(0, 1)
  (``activation._hardsigmoid``): one MPS node instead of two (mobilenet_v3's squeeze-excitation).

The reader finds the value under ``folded_into(reader)``; the MPS node's debug handle names both fx
nodes. The original weights leave the blob when nothing else reads them. Against eager PyTorch the
folded result differs by rounding only (one rounding of ``W * s`` instead of one per output): on
a deep random-weight network the device stays as close to a float64 reference as eager float32 is.
"""
from __future__ import annotations

import torch
from torch.fx import Node

from ._util import arg, is_float, shape, val
from .registry import Lowering, op_key
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


def folded_into(reader: Node) -> tuple[str, Node]:
    """Builder memo key under which a convolution records the value id it computed for ``reader``
    (a batch norm's output, or hardsigmoid's ``x / 6 + 0.5``) after folding it in."""
    return ("folded into convolution", reader)


def _per_channel(b, a, c: int, fill: float) -> torch.Tensor:
    """Float64 data of constant ``a`` (a ``[C]`` parameter), or ``fill`` for an absent one."""
    if isinstance(a, Node):
        return b.constants.original(b.id(a)).double()
    return torch.full((c,), fill, dtype=torch.float64)


def _epilogue(node: Node, b) -> tuple[Node, torch.Tensor, torch.Tensor] | None:
    """(reader, scale, shift): the per-output-channel map ``y * scale + shift`` (float64) that the
    only reader of convolution ``node``'s result applies first, when the weights, bias and the
    reader's parameters are constants of this graph; None otherwise (see the module doc)."""
    if len(node.users) != 1:
        return None
    (reader,) = node.users
    target = op_key(reader.target)
    c = shape(node.args[1])[0]
    if target is aten.hardsigmoid.default:  # hardsigmoid(y) = hardtanh(y / 6 + 0.5, 0, 1)
        params = []
    elif target is aten._native_batch_norm_legit_no_training.default and reader.args[0] is node:
        params = list(reader.args[1:5])
    else:
        return None
    if not all(b.constants.original(b.ids.get(a, -1)) is not None
               for a in (node.args[1], node.args[2], *params) if a is not None):
        return None
    if not params:
        return reader, _per_channel(b, None, c, 1 / 6), _per_channel(b, None, c, 0.5)
    gamma, beta, mean, var = (_per_channel(b, a, c, f) for a, f in zip(params, (1.0, 0.0, 0.0, 1.0)))
    scale = gamma / torch.sqrt(var + float(reader.args[6]))
    return reader, scale, beta - mean * scale


def _folded(node: Node, b) -> tuple[Node, int, int] | None:
    """(reader, weight id, bias id) of the convolution with its reader's epilogue folded in."""
    epilogue = _epilogue(node, b)
    if epilogue is None:
        return None
    reader, scale, shift = epilogue
    w, bias = node.args[1:3]
    wid = b.scaled_constant(b.id(w), scale)  # float64 product, rounded once, written into the blob
    if wid is None:
        return None
    folded_bias = _per_channel(b, bias, shape(w)[0], 0.0) * scale + shift
    return reader, wid, b.constant(folded_bias.to(val(w).dtype), dtype=vdtype(b, wid))


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
    op = "MPSDepthwiseConv2D" if depthwise else "MPSConv2D"
    folded = _folded(node, b)
    if folded is not None:
        reader, wid, bid = folded
        out = b.out(node)  # holds the reader's pre-activation, not the convolution's result
        _emit(b, op, b.id(x), wid, bid, out, stride, padding, dilation, groups)
        b.node_origin[-1] = (node, reader)
        b.memo(folded_into(reader), lambda: out)
        return
    _emit(b, op, b.id(x), b.id(w), b.id(bias) if isinstance(bias, Node) else -1, b.out(node),
          stride, padding, dilation, groups)


LOWERINGS = [Lowering((aten.convolution.default,), _lower, _check)]
