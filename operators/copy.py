"""Copies and casts: clone / _clone_dim_order (identity on the device), _to_copy /
_to_dim_order_copy (a real MPSCast when the device dtype changes, never dropped), and functional
``copy(self, src)`` (``self.copy_(src)``'s value: ``src`` broadcast to ``self``'s shape and cast to
its dtype; ``self``'s data is not read, so a same-shape same-dtype copy is ``src`` itself).

The device's float -> integer rounding and integer overflow behaviour are unverified, so those
casts only ever see values the target holds exactly: float -> integer truncates first
(``where(x < 0, ceil(x), floor(x))``, torch's rounding; skipped when the value comes straight from
floor / ceil / round / trunc, already integral), and a narrowing integer cast wraps first
(``x & (2**bits - 1)``, minus ``2**bits`` above the signed maximum, torch's wrap-around). Edge
graphs cast every integer scalar operand this way (an int64 constant narrowed to int32 ...).
"""

from __future__ import annotations

import torch
from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  (defines torch.ops.dim_order_ops)
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.serialization.generated import nodes as N

from ._util import rank, shape
from .emit import binary, compare, const, expand, where
from .registry import Lowering, op_key
from .unary import trunc

aten = torch.ops.aten
dim_order_ops = torch.ops.dim_order_ops


def _layout_reason(node: Node):
    order = node.kwargs.get("dim_order")
    if order is not None and list(order) != list(range(rank(node))):
        return f"dim_order {list(order)} (the device holds contiguous tensors only)"
    fmt = node.kwargs.get("memory_format")
    if fmt not in (None, torch.contiguous_format, torch.preserve_format):
        return f"memory_format {fmt} (the device holds contiguous tensors only)"
    return None


def _copy_check(node: Node):
    return _layout_reason(node)  # every pair of device dtypes casts exactly: see _exact_cast


#: float ops whose result is integral (or inf/NaN): casting it to an integer needs no truncation
INTEGRAL = frozenset({aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default})


def _exact_cast(b: GraphBuilder, vid: int, src: torch.dtype, dst: torch.dtype, integral: bool = False) -> int:
    """MPSCast of a value made exact in ``dst`` first (torch's truncation / wrap-around);
    ``integral``: the float value is known to be a whole number."""
    if src.is_floating_point and dst != torch.bool and not dst.is_floating_point and not integral:
        vid = trunc(b, vid)
    elif src != torch.bool and not src.is_floating_point and dst != torch.bool and not dst.is_floating_point:
        bits = torch.iinfo(dst).bits
        if bits < torch.iinfo(src).bits:
            low = binary(b, N.MPSBitwiseAnd, vid, const(b, 2**bits - 1, src))
            high = compare(b, N.MPSGe, low, const(b, 2 ** (bits - 1), src))
            vid = where(b, high, binary(b, N.MPSSub, low, const(b, 2**bits, src)), low)
    return b.cast(vid, dst)


def _copy(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    src, dst = b.dtype(x), b.dtype(node)
    integral = isinstance(x, Node) and x.op == "call_function" and op_key(x.target) in INTEGRAL
    b.alias(node, b.id(x) if src == dst else _exact_cast(b, b.id(x), src, dst, integral))


def _copy_into(node: Node, b: GraphBuilder) -> None:
    src = node.args[1]
    vid, sdt, ddt = b.id(src), b.dtype(src), b.dtype(node)
    if sdt != ddt:
        vid = _exact_cast(b, vid, sdt, ddt)
    if shape(src) != shape(node):
        vid = expand(b, vid, shape(src), shape(node))
    b.alias(node, vid)


LOWERINGS = [
    Lowering(
        (
            aten.clone.default,
            aten._to_copy.default,
            dim_order_ops._clone_dim_order.default,
            dim_order_ops._to_dim_order_copy.default,
        ),
        _copy,
        _copy_check,
    ),
    Lowering((aten.copy.default,), _copy_into),
]
