"""Padding: constant_pad_nd -> MPSConstantPadND; reflection / replication pads -> MPSIndexSelect.

- ``constant_pad_nd``: the device takes 2, 4 or 6 non-negative entries (more abort, negative ones
  are read through an unsigned type, semantics §6 #22). Negative entries (cropping) become MPSSlice
  first; trailing all-zero pairs are dropped; a pad touching more than the last three axes stays on
  CPU. ``value`` is a float32 field converted to x's dtype on the device, so integer tensors need an
  integral value that float32 holds exactly.
- ``reflection_pad{1,2,3}d`` / ``replication_pad{1,2,3}d`` are kept whole (``preserve``; the
  default decomposition produces arange/abs/clamp + index.Tensor) and lowered to one MPSIndexSelect
  per padded axis with a constant source-index list (exact gathers, negative pads crop).
"""

from __future__ import annotations

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.serialization.generated import nodes as N

from ._util import arg, rank, shape, val
from .emit import index_select, slice_value
from .registry import Lowering, op_key

aten = torch.ops.aten


def _pairs(pad) -> list[tuple[int, int]]:
    pad = [int(p) for p in pad]
    return [(pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)]


def _constant_pad_check(node: Node):
    x, pad = node.args[0], list(node.args[1])
    if len(pad) % 2:
        return f"pad list of odd length {len(pad)}"
    pairs = _pairs(pad)
    if any(pair != (0, 0) for pair in pairs[3:]):
        return f"constant pad of {len(pad)} entries touching more than the last 3 axes (the device takes 2, 4 or 6 entries)"
    value = arg(node, 2, "value", 0)
    dt = val(x).dtype
    if dt == torch.bool and value not in (0, 1):
        return f"bool tensor padded with {value}"
    if not dt.is_floating_point and dt != torch.bool:
        v = float(value)
        if v != int(v) or abs(v) > 2**24:
            return f"integer tensor padded with {value} (the device's float32 pad value holds integers up to 2^24)"
    return None


def _constant_pad(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    pairs = _pairs(node.args[1])
    s, r = shape(x), rank(x)
    vid = b.id(x)
    for k, (lo, hi) in enumerate(pairs):
        if lo < 0 or hi < 0:
            axis = r - 1 - k
            vid = slice_value(b, vid, axis, max(-lo, 0), s[axis] - max(-hi, 0))
    pos = [max(p, 0) for pair in pairs for p in pair]
    while len(pos) > 2 and pos[-2:] == [0, 0]:
        pos = pos[:-2]
    if not any(pos):
        b.alias(node, vid)
        return
    b.emit(N.MPSConstantPadND(input1_id=vid, output_id=b.out(node), pad=pos, value=float(arg(node, 2, "value", 0))))


def _source_index(n: int, lo: int, hi: int, reflect: bool) -> list[int]:
    """For each output position along an axis of size n padded by (lo, hi): the source position."""
    out = []
    for i in range(-lo, n + hi):
        if reflect:
            j = abs(i)
            out.append(2 * (n - 1) - j if j >= n else j)
        else:
            out.append(min(max(i, 0), n - 1))
    return out


_REFLECT = (aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)


def _index_pad_check(node: Node):
    x, pad = node.args[0], [int(p) for p in node.args[1]]
    reflect = op_key(node.target) in _REFLECT
    s, r = shape(x), rank(x)
    if len(pad) % 2 or len(pad) // 2 > r:
        return f"padding {pad} for a rank-{r} tensor"
    for k, (lo, hi) in enumerate(_pairs(pad)):
        n = s[r - 1 - k]
        if reflect and (lo >= n or hi >= n):
            return f"reflection padding {(lo, hi)} not smaller than the axis size {n}"
    return None


def _index_pad(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    reflect = op_key(node.target) in _REFLECT
    s, r = shape(x), rank(x)
    todo = [(r - 1 - k, lo, hi) for k, (lo, hi) in enumerate(_pairs(node.args[1])) if (lo, hi) != (0, 0)]
    vid = b.id(x)
    if not todo:
        b.alias(node, vid)
        return
    for i, (axis, lo, hi) in enumerate(todo):
        out = b.out(node) if i == len(todo) - 1 else None
        vid = index_select(b, vid, axis, _source_index(s[axis], lo, hi, reflect), out=out)


LOWERINGS = [
    Lowering((aten.constant_pad_nd.default,), _constant_pad, _constant_pad_check),
    Lowering(
        _REFLECT + (aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default),
        _index_pad,
        _index_pad_check,
        preserve=True,
    ),
]
