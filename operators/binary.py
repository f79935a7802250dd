"""Binary arithmetic and comparisons: add, sub, mul, div, eq/ne/ge/gt/le/lt.

Scalar operands become one-element constants whose declared dtype *and bytes* are torch's
promoted dtype of (tensor, scalar) in the graph's compute precision, so the device's binary
promotion (semantics §3.3) reproduces torch's result dtype.
"""
from __future__ import annotations

import torch
from torch.fx import Node

from ._util import arg, is_float, operand, scalar_dtype, val
from .registry import Lowering

aten = torch.ops.aten


def _operand_dtype(node: Node) -> torch.dtype:
    a, other = node.args[0], node.args[1]
    if isinstance(a, Node) and not isinstance(other, Node):
        return scalar_dtype(a, other)
    return val(node).dtype


def _ids(node: Node, b) -> tuple[int, int]:
    dt = _operand_dtype(node)
    return operand(b, node, node.args[0], dt), operand(b, node, node.args[1], dt)


def _arith(op: str, with_alpha: bool = False):
    def lower(node: Node, b) -> None:
        a, c = _ids(node, b)
        fields = {"input1_id": a, "input2_id": c, "output_id": b.out(node)}
        if with_alpha:
            fields["alpha"] = float(arg(node, 2, "alpha", 1))
        b.emit(op, **fields)
    return lower


def _alpha_check(node: Node):
    alpha = arg(node, 2, "alpha", 1)
    if not is_float(node) and float(alpha) != int(alpha):
        return "non-integer alpha on an integer add/sub"
    return None


def _div_check(node: Node):
    if not is_float(node):
        return f"division producing {val(node).dtype}"
    return None


def _div(node: Node, b) -> None:
    """True division. Integer operands are cast to the result dtype first: the device would
    otherwise divide integers (semantics §6 #12)."""
    out_dt = b.dtype(node)
    ids = []
    for x in node.args[:2]:
        if isinstance(x, Node):
            vid = b.id(x)
            if not val(x).dtype.is_floating_point:
                vid = b.cast(vid, out_dt)
            ids.append(vid)
        else:
            ids.append(b.scalar(float(x), out_dt))
    b.emit("MPSDiv", input1_id=ids[0], input2_id=ids[1], output_id=b.out(node), rounding_mode=None)
    # rounding_mode absent (null) = plain division; any other string is a device assert


COMPARISONS = {"eq": "MPSEq", "ne": "MPSNe", "ge": "MPSGe", "gt": "MPSGt", "le": "MPSLe", "lt": "MPSLt"}


def _compare(op: str):
    def lower(node: Node, b) -> None:
        a, other = node.args[0], node.args[1]
        dt = scalar_dtype(a, other) if not isinstance(other, Node) else val(a).dtype
        b.emit(op, input1_id=operand(b, node, a, dt), input2_id=operand(b, node, other, dt),
               output_id=b.out(node))
    return lower


LOWERINGS = [
    Lowering((aten.add.Tensor, aten.add.Scalar), _arith("MPSAdd", True), _alpha_check),
    Lowering((aten.sub.Tensor, aten.sub.Scalar), _arith("MPSSub", True), _alpha_check),
    Lowering((aten.mul.Tensor, aten.mul.Scalar), _arith("MPSMul")),
    Lowering((aten.div.Tensor, aten.div.Scalar), _div, _div_check),
    *(Lowering((getattr(aten, name).Tensor, getattr(aten, name).Scalar), _compare(op))
      for name, op in COMPARISONS.items()),
]
