"""Convolution: 1-d, 2-d and 3-d, forward and transposed -> MPSConv2D / MPSDepthwiseConv2D.

Arguments: ``stride``, ``padding``, ``dilation`` and ``output_padding`` are int lists holding one value
per spatial dim or one value for all of them (the schema's rule: ``nn.Conv2d(padding="valid")`` exports
``padding=[0]``, a direct ``aten.convolution`` call may pass ``[s]``); ``_params`` expands them, for the
check and the lowering alike, so a node the check accepts always lowers.

Weights stay in torch layout (OIHW / OIL); the device permutes them (semantics §5.12). A weight a
decomposition needs in another layout is re-laid out by a list of steps (view / permute / reverse one
axis, ``_Weight``): a constant weight through ``b.relaid_constant``, written into the blob straight from
the model's tensor, once per weight (the original leaves the blob when nothing else reads it); a
computed one on the device (MPSView / MPSPermute / MPSIndexSelect with a reversed constant index).

Forward 1-d and 2-d: one MPSConv2D (MPSDepthwiseConv2D for a depthwise 2-d one).

Forward 3-d, ``y[n, o, z] = sum_t conv2d(xpad[n, :, z*sd + t*dd], W[:, :, t]) + bias``: one 2-d
convolution with the ``kD`` depth taps stacked into the input channels. x ``[N, C, D, H, W]`` is permuted
to ``[N, D, C*H*W]`` and padded in depth (MPSConstantPadND); one MPSIndexSelect gathers the rows
``z*sd + t*dd`` of every output depth ``z`` and tap ``t``, viewed as ``[N*Do, kD*C, H, W]`` (channels
ordered ``(group, tap, channel of the group)``: an MPSPermute when groups > 1); the 2-d convolution
(same groups) uses ``W`` re-laid out to ``[O, kD*I, kH, kW]`` (``W.permute(0, 2, 1, 3, 4)``), and its
``[N*Do, O, Ho, Wo]`` result is permuted back to ``[N, O, Do, Ho, Wo]``. The device sums all
``kD*kH*kW*I`` products in one convolution, as eager does. Every tensor has rank <= 5.

Transposed convolution (the device's convolution is forward only), exactly, per spatial dim:
``conv_transpose(x, W, s, p, op, d, g) = conv(zero_insert(x, s), W', stride 1, dilation d, groups g,
padding lo = d*(k-1) - p before and hi = d*(k-1) - p + op after)``, ``W'`` the kernel flipped in every
spatial dim with its in/out channel axes swapped within each group (``[C_in, C_out/g, *k] ->
[C_out, C_in/g, *k]``; flipping every spatial axis reverses the flattened kernel axis, so one
reversal). Zero insertion puts ``s-1`` zeros after every element: a view to ``[P*S, 1, R]`` (``P``,
``R``: the sizes before and after the axis), a constant pad of the unit axis to ``s``, a view back
(the last two axes at once: ``[P*H, 1, W, 1]`` padded to ``[P*H, sh, W, sw]``); the ``s-1`` trailing
zeros it leaves are taken off ``hi``. Every pad has 2, 4 or 6 non-negative entries on a rank <= 4
tensor (semantics §5.15). Positive ``lo``/``hi`` are the convolution's own (asymmetric) padding
fields, negative ones crop the input first (MPSSlice). A 3-d one zero-inserts in all three axes and
goes through the 3-d decomposition.

A transposed 2-d convolution with ``kernel == stride`` (square ``r x r``, r > 1), no padding, output
padding or dilation, one group -- the upsampling kind (SAM's and U-Nets' ``ConvTranspose2d(k=2, s=2)``)
-- has no overlapping windows: ``out[n, o, r*h + i, r*w + j] = sum_c x[n, c, h, w] W[c, o, i, j] + b[o]``.
That is a 1x1 MPSConv2D to ``C_out * r * r`` channels (weight ``W.permute(1, 2, 3, 0)`` as
``[C_out*r*r, C_in, 1, 1]``, bias repeated ``r*r`` times) followed by MPSPixelShuffle(r), whose channel
order ``o*r*r + i*r + j`` is exactly that layout: no zero insertion, ``r*r`` times less work.

A per-output-channel affine map folded in by ``mps_backend.passes.conv_epilogue`` (an inference batch
norm or a hardsigmoid reading the convolution; ``node.meta[CHANNEL_AFFINE]``): the node's value is
``y * scale + shift``, computed with ``W * scale`` and ``b * scale + shift`` (float64, rounded once, ``W *
scale`` written straight into the blob); the MPS node's debug handle names the absorbed fx nodes too.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.passes.conv_epilogue import CHANNEL_AFFINE, ChannelAffine
from mps_backend.serialization.generated import nodes as N

from ._util import arg, is_float, per_dim, rank, shape, val
from .emit import expand, index_select, permute, slice_value, vdtype, view, vshape
from .registry import Lowering

aten = torch.ops.aten


# ---- arguments and support check -----------------------------------------------------------------


@dataclass(frozen=True)
class _Params:
    """A convolution's int-list arguments, one entry per spatial dim."""

    stride: tuple
    padding: tuple
    dilation: tuple
    output_padding: tuple
    groups: int
    transposed: bool


#: (index, name, default, least allowed value) of the int-list arguments of aten.convolution
_LISTS = ((3, "stride", [1], 1), (4, "padding", [0], 0), (5, "dilation", [1], 1), (7, "output_padding", [0], 0))


def _params(node: Node) -> _Params | str:
    """The arguments expanded to one int per spatial dim, or the reason they cannot be."""
    n = rank(node.args[1]) - 2
    lists = []
    for index, name, default, least in _LISTS:
        given = arg(node, index, name, default)
        values = per_dim(given, n)
        if values is None:
            return f"convolution {name} {given!r}: the schema takes one int or {n} (one per spatial dim)"
        if min(values) < least:
            return f"convolution {name} {values} (must be >= {least})"
        lists.append(tuple(values))
    groups = arg(node, 8, "groups", 1)
    if not isinstance(groups, int) or groups < 1:
        return f"convolution groups {groups!r}"
    stride, padding, dilation, output_padding = lists
    return _Params(stride, padding, dilation, output_padding, groups=groups, transposed=bool(arg(node, 6, "transposed", False)))


def _common_reason(node: Node):
    if not is_float(node.args[0]) or not is_float(node.args[1]):
        return "convolution of non-float tensors"
    dts = {a.meta["val"].dtype for a in node.args[:3] if isinstance(a, Node)}
    if len(dts) != 1:
        return f"mixed dtypes {sorted(map(str, dts))} in convolution"
    return None


def _check(node: Node):
    x, w = node.args[:2]
    r = rank(w)
    if r not in (3, 4, 5):
        return f"{r - 2}-d convolution (lowered: 1-d, 2-d and 3-d)"
    if rank(x) != r:
        return f"convolution of a rank-{rank(x)} input with a rank-{r} weight"
    reason = _common_reason(node)
    if reason is None:
        p = _params(node)
        reason = p if isinstance(p, str) else None
    return reason


# ---- weights re-laid out -------------------------------------------------------------------------


def _relay(t: torch.Tensor, steps: tuple) -> torch.Tensor:
    """``steps`` applied to a tensor (what the device ops of ``_Weight.value`` compute)."""
    for op, a in steps:
        t = t.reshape(a) if op == "view" else t.permute(a) if op == "permute" else t.flip(a)
    return t


@dataclass(frozen=True)
class _Weight:
    """Weight value ``vid`` (shape ``shape``) and the re-layout ``steps`` a decomposition applies to it:
    ``("view", shape)``, ``("permute", perm)``, ``("reverse", axis)``."""

    vid: int
    shape: tuple
    steps: tuple = ()

    def then(self, *steps) -> _Weight:
        return _Weight(self.vid, self.shape, self.steps + tuple(steps))

    @property
    def out_shape(self) -> list[int]:
        s = list(self.shape)
        for op, a in self.steps:
            s = list(a) if op == "view" else [s[i] for i in a] if op == "permute" else s
        return s

    def value(self, b: GraphBuilder) -> int:
        """The re-laid-out weight's value id, made once per graph (weights shared by several nodes)."""
        if not self.steps:
            return self.vid
        return b.memo(("re-laid weight", self.vid, self.steps), functools.partial(self._make, b))

    def _make(self, b: GraphBuilder) -> int:
        vid = b.relaid_constant(self.vid, functools.partial(_relay, steps=self.steps), self.out_shape)
        if vid is not None:  # a constant: re-laid out while written into the blob
            return vid
        vid = self.vid
        for op, a in self.steps:  # a computed weight: re-laid out on the device
            if op == "view":
                vid = view(b, vid, a)
            elif op == "permute":
                vid = permute(b, vid, a)
            else:  # no negative-step slice on the device: a gather with a reversed index
                vid = index_select(b, vid, a, list(range(vshape(b, vid)[a] - 1, -1, -1)))
        return vid


# ---- emit helpers --------------------------------------------------------------------------------


def _kind(c_in: int, wshape: list[int], groups: int) -> type[N.MPSConvTable]:
    """MPSDepthwiseConv2D for a depthwise 2-d convolution (one filter per input channel; the device's
    channel multiplier > 1 is unverified, and a rank-3 weight aborts it), else MPSConv2D."""
    depthwise = len(wshape) == 4 and groups > 1 and groups == c_in and wshape[0] == c_in and wshape[1] == 1
    return N.MPSDepthwiseConv2D if depthwise else N.MPSConv2D


def _emit(
    b: GraphBuilder, op: type[N.MPSConvTable], x: int, w: int, bias: int, out: int, stride, lo, hi, dilation, groups: int
) -> None:
    """One MPSConv node; ``lo``/``hi``: non-negative padding before/after each spatial dim."""
    if len(stride) == 1:  # conv1d: H = 1, everything acts on W (the device unsqueezes rank-3 operands)
        stride, lo, hi, dilation = [1, *stride], [0, *lo], [0, *hi], [1, *dilation]
    b.emit(
        op(
            input1_id=x,
            input2_id=w,
            input3_id=bias,
            output_id=out,
            stride_x=int(stride[1]),
            stride_y=int(stride[0]),
            dilation_x=int(dilation[1]),
            dilation_y=int(dilation[0]),
            groups=int(groups),
            padding_left=int(lo[1]),
            padding_right=int(hi[1]),
            padding_top=int(lo[0]),
            padding_bottom=int(hi[0]),
        )
    )


def _pad(b: GraphBuilder, vid: int, pad: list[int]) -> int:
    """MPSConstantPadND with zeros (``pad``: 2, 4 or 6 non-negative entries, last axis first)."""
    s = vshape(b, vid)
    for k in range(len(pad) // 2):
        s[-1 - k] += pad[2 * k] + pad[2 * k + 1]
    out = b.new_value(vdtype(b, vid), s)
    b.emit(N.MPSConstantPadND(input1_id=vid, output_id=out, pad=[int(p) for p in pad], value=0.0))
    return out


def _out_size(size: int, k: int, stride: int, lo: int, hi: int, dilation: int) -> int:
    return (size + lo + hi - dilation * (k - 1) - 1) // stride + 1


def _bias_id(b: GraphBuilder, bias) -> int:
    return b.id(bias) if isinstance(bias, Node) else -1


# ---- forward convolution -------------------------------------------------------------------------


def _conv(
    b: GraphBuilder, x: int, xs: list[int], w: _Weight, bias: int, stride, lo, hi, dilation, groups: int, out: int | None = None
) -> int:
    """Forward convolution of value ``x`` (shape ``xs``, ``[N, C, *S]``) with weight ``w`` (torch layout
    ``[O, C/groups, *k]`` after its steps) and bias id ``bias`` (-1: none), padded by ``lo``/``hi``
    before/after each spatial dim (negative: cropped). Writes ``out`` (a new value when None)."""
    xs, lo, hi = list(xs), list(lo), list(hi)
    for i in range(len(lo)):
        if lo[i] < 0 or hi[i] < 0:  # the device's pads are non-negative: crop first
            axis, start = 2 + i, max(-lo[i], 0)
            end = xs[axis] - max(-hi[i], 0)
            x = slice_value(b, x, axis, start, end)
            xs[axis], lo[i], hi[i] = end - start, max(lo[i], 0), max(hi[i], 0)
    if len(lo) == 3:
        return _conv3d(b, x, xs, w, bias, stride, lo, hi, dilation, groups, out)
    ws = w.out_shape
    if out is None:
        spatial = [_out_size(*a) for a in zip(xs[2:], ws[2:], stride, lo, hi, dilation)]
        out = b.new_value(vdtype(b, x), [xs[0], ws[0], *spatial])
    _emit(b, _kind(xs[1], ws, groups), x, w.value(b), bias, out, stride, lo, hi, dilation, groups)
    return out


def _conv3d(
    b: GraphBuilder, x: int, xs: list[int], w: _Weight, bias: int, stride, lo, hi, dilation, groups: int, out: int | None
) -> int:
    """3-d convolution as one 2-d convolution over the stacked depth taps (module doc); pads >= 0."""
    n, c, d, h, wd = xs
    o, i, kd, kh, kw = w.out_shape
    sd, dd = stride[0], dilation[0]
    dp = d + lo[0] + hi[0]
    do = (dp - dd * (kd - 1) - 1) // sd + 1
    v = view(b, permute(b, x, [0, 2, 1, 3, 4]), [n, d, c * h * wd])  # [N, D, C*H*W]
    if lo[0] or hi[0]:
        v = _pad(b, v, [0, 0, lo[0], hi[0]])
    rows = [z * sd + t * dd for z in range(do) for t in range(kd)]
    if rows != list(range(dp)):
        v = index_select(b, v, 1, rows)  # [N, Do*kD, C*H*W]: the kD input depths of each output depth
    if groups > 1 and kd > 1:  # channels (tap, group, channel) -> (group, tap, channel), as the weight
        v = permute(b, view(b, v, [n * do, kd, groups, c // groups * h * wd]), [0, 2, 1, 3])
    v = view(b, v, [n * do, kd * c, h, wd])
    if kd == 1:
        w2 = w.then(("view", (o, i, kh, kw)))
    else:  # [O, I, kD, kH, kW] -> [O, kD*I, kH, kW], input channel t*I + c
        w2 = w.then(("view", (o, i, kd, kh * kw)), ("permute", (0, 2, 1, 3)), ("view", (o, kd * i, kh, kw)))
    y = _conv(b, v, [n * do, kd * c, h, wd], w2, bias, stride[1:], lo[1:], hi[1:], dilation[1:], groups)
    ho, wo = vshape(b, y)[2:]
    return permute(b, view(b, y, [n, do, o, ho, wo]), [0, 2, 1, 3, 4], out=out)


# ---- transposed convolution ----------------------------------------------------------------------


def _zero_insert(b: GraphBuilder, x: int, xs: list[int], stride) -> tuple[int, list[int]]:
    """``x`` ``[N, C, *S]`` with ``s - 1`` zeros after every element along each spatial axis (``s`` its
    stride): ``[N, C, *(S * s)]`` (module doc)."""
    xs = list(xs)
    axes = [2 + i for i, s in enumerate(stride) if s > 1]
    while axes:
        a = axes.pop()
        s = stride[a - 2]
        if axes and axes[-1] == a - 1 and a == len(xs) - 1:  # the last two axes, one pad
            a0 = axes.pop()
            v = view(b, x, [math.prod(xs[:a]), 1, xs[a], 1])
            v = _pad(b, v, [0, s - 1, 0, 0, 0, stride[a0 - 2] - 1])  # [P*H, sh, W, sw]
            xs[a0] *= stride[a0 - 2]
        else:
            v = view(b, x, [math.prod(xs[: a + 1]), 1, math.prod(xs[a + 1 :])])
            v = _pad(b, v, [0, 0, 0, s - 1])  # [P*S, s, R]
        xs[a] *= s
        x = view(b, v, xs)
    return x, xs


def _is_upsampling(node: Node, p: _Params) -> bool:
    """kernel == stride (square r x r, r > 1), no padding / output padding / dilation, one group."""
    k = shape(node.args[1])[2:]
    return (
        len(k) == 2
        and k[0] == k[1] > 1
        and list(p.stride) == k
        and not any(p.padding)
        and not any(p.output_padding)
        and p.dilation == (1, 1)
        and p.groups == 1
    )


def _upsampling(node: Node, b: GraphBuilder) -> None:
    """1x1 convolution + pixel shuffle (module doc)."""
    x, w, bias = node.args[:3]
    c_in, c_out, r, _ = shape(w)
    weight = _Weight(b.id(w), tuple(shape(w))).then(("permute", (1, 2, 3, 0)), ("view", (c_out * r * r, c_in, 1, 1)))
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
    _emit(b, N.MPSConv2D, b.id(x), weight.value(b), bias_id, y, [1, 1], [0, 0], [0, 0], [1, 1], 1)
    b.emit(N.MPSPixelShuffle(input1_id=y, output_id=b.out(node), upscale_factor=r))


def _transposed(node: Node, b: GraphBuilder, p: _Params) -> None:
    """Zero insertion + forward convolution with the flipped, channel-swapped kernel (module doc)."""
    x, w, bias = node.args[:3]
    c_in, c_out_g, *k = shape(w)
    g, taps = p.groups, math.prod(k)
    # [C_in, C_out/g, *k] -> [g, C_in/g, C_out/g, K] -> [g, C_out/g, C_in/g, K], K reversed -> [C_out, C_in/g, *k]
    steps: list[tuple[str, Any]] = [("view", (g, c_in // g, c_out_g, taps)), ("permute", (0, 2, 1, 3))]
    if taps > 1:
        steps.append(("reverse", 3))
    steps.append(("view", (g * c_out_g, c_in // g, *k)))
    weight = _Weight(b.id(w), tuple(shape(w))).then(*steps)
    xv, xs = _zero_insert(b, b.id(x), shape(x), p.stride)
    lo = [d * (kk - 1) - pad for d, kk, pad in zip(p.dilation, k, p.padding)]
    hi = [before + op - (s - 1) for before, op, s in zip(lo, p.output_padding, p.stride)]
    _conv(b, xv, xs, weight, _bias_id(b, bias), [1] * len(k), lo, hi, p.dilation, g, out=b.out(node))


# ---- channel affine map folded in (mps_backend.passes.conv_epilogue) ------------------------------


def _per_channel(b: GraphBuilder, a, c: int, fill: float) -> torch.Tensor:
    """Float64 data of constant ``a`` (a ``[C]`` parameter), or ``fill`` for an absent one."""
    if isinstance(a, Node):
        data = b.constants.original(b.id(a))
        assert data is not None, "the pass folds only convolutions with constant weights and bias"
        return data.double()
    return torch.full((c,), fill, dtype=torch.float64)


def _lower_affine(node: Node, b: GraphBuilder, p: _Params, affine: ChannelAffine) -> None:
    """The convolution with ``y * scale + shift`` folded into its weights and bias: ``W * scale``
    (float64 product, rounded once, written straight into the blob) and ``b * scale + shift``."""
    x, w, bias = node.args[:3]
    wid = b.scaled_constant(b.id(w), affine.scale)
    assert wid is not None, "the pass folds only convolutions with constant weights"
    folded_bias = _per_channel(b, bias, shape(w)[0], 0.0) * affine.scale + affine.shift
    bid = b.constant(folded_bias.to(val(w).dtype), dtype=vdtype(b, wid))
    _emit(
        b,
        _kind(shape(x)[1], shape(w), p.groups),
        b.id(x),
        wid,
        bid,
        b.out(node),
        p.stride,
        p.padding,
        p.padding,
        p.dilation,
        p.groups,
    )
    b.node_origin[-1] = (node, *affine.absorbed)


# ---- lowering ------------------------------------------------------------------------------------


def _lower(node: Node, b: GraphBuilder) -> None:
    p = _params(node)
    assert isinstance(p, _Params), p  # the support check accepted the node
    x, w, bias = node.args[:3]
    if p.transposed:
        if _is_upsampling(node, p):
            _upsampling(node, b)
        else:
            _transposed(node, b, p)
        return
    affine = node.meta.get(CHANNEL_AFFINE)
    if affine is not None:
        _lower_affine(node, b, p, affine)
        return
    _conv(
        b,
        b.id(x),
        shape(x),
        _Weight(b.id(w), tuple(shape(w))),
        _bias_id(b, bias),
        p.stride,
        p.padding,
        p.padding,
        p.dilation,
        p.groups,
        out=b.out(node),
    )


LOWERINGS = [Lowering((aten.convolution.default,), _lower, _check)]
