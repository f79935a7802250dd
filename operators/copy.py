"""Copies and casts: clone / _clone_dim_order (identity on the device), _to_copy /
_to_dim_order_copy (a real MPSCast when the device dtype changes, never dropped)."""
from __future__ import annotations

import torch
from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  (defines torch.ops.dim_order_ops)
from torch.fx import Node

from ._util import rank, val
from .registry import Lowering

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


def _cast_reason(src: torch.dtype, dst: torch.dtype):
    if src == dst or src == torch.bool or dst == torch.bool or dst.is_floating_point:
        return None
    if src.is_floating_point:
        return f"{src} -> {dst} cast: MPSGraph float-to-integer rounding is unverified"
    if torch.iinfo(dst).bits < torch.iinfo(src).bits:
        return f"{src} -> {dst} narrowing cast: MPSGraph integer overflow behaviour is unverified"
    return None


def _copy_check(node: Node):
    return _layout_reason(node) or _cast_reason(val(node.args[0]).dtype, val(node).dtype)


def _copy(node: Node, b) -> None:
    x = node.args[0]
    src, dst = b.dtype(x), b.dtype(node)
    b.alias(node, b.id(x) if src == dst else b.cast(b.id(x), dst))


LOWERINGS = [Lowering((aten.clone.default, aten._to_copy.default, dim_order_ops._clone_dim_order.default,
                       dim_order_ops._to_dim_order_copy.default), _copy, _copy_check)]
