"""Linear algebra: mm, bmm -> MPSMatMul; addmm -> MPSAddmm with alpha and beta read."""
from __future__ import annotations

import torch
from torch.fx import Node

from ._util import is_float, val
from .registry import Lowering

aten = torch.ops.aten


def _float_same(node: Node):
    dts = {val(a).dtype for a in node.args if isinstance(a, Node)}
    if not all(d.is_floating_point for d in dts):
        return "integer matrix multiplication (MPSGraph matmul is float-only here)"
    if len(dts) != 1:
        return f"mixed operand dtypes {sorted(map(str, dts))}; MPSGraph matmul does not promote"
    return None


def _matmul(node: Node, b) -> None:
    b.emit("MPSMatMul", input1_id=b.id(node.args[0]), input2_id=b.id(node.args[1]), output_id=b.out(node))


def _addmm_check(node: Node):
    reason = _float_same(node)
    if reason:
        return reason
    if not isinstance(node.args[0], Node):
        return "addmm with a non-tensor bias"
    return None if is_float(node) else "integer addmm"


def _addmm(node: Node, b) -> None:
    bias, m1, m2 = (b.id(a) for a in node.args[:3])
    b.emit("MPSAddmm", input1_id=bias, input2_id=m1, input3_id=m2, output_id=b.out(node),
           beta=float(node.kwargs.get("beta", 1)), alpha=float(node.kwargs.get("alpha", 1)))


LOWERINGS = [
    Lowering((aten.mm.default, aten.bmm.default), _matmul, _float_same),
    Lowering((aten.addmm.default,), _addmm, _addmm_check),
]
