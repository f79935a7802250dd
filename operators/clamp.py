"""clamp (scalar and tensor bounds) and where.

* ``clamp.default`` of a float tensor with ``lo <= hi`` -> one MPSHardTanh (bounds in its table
  fields, an absent one as ∓inf): ``where(x < lo, lo, x)`` then ``where(x > hi, hi, ...)``, which is
  torch's clamp, NaN passing through (semantics §5.1).
* other scalar clamps (integer tensors, ``lo > hi``) -> MPSClamp with the bounds in
  ``MPSNode.min_max`` (the table has none; §5.8). An absent bound is written as ∓inf, which the
  device reads as "no bound"; at least one bound is always present (the device never assigns the
  output otherwise, §6 #24). One-bound clamps are MPSGraph maximum/minimum, which drop NaN: float
  clamps get ``where(isnan(x), x, clamp)``. ``lo > hi`` is two one-bound clamps (torch:
  ``min(max(x, lo), hi)``). Bounds are float32 fields: integer tensors need bounds inside the dtype
  and exact in float32.
* ``clamp.Tensor`` -> the NaN-propagating ``maximum`` / ``minimum`` of unary.py (torch propagates NaN
  from the bounds too).
* ``where.self`` -> MPSWhere with both branches cast to the result dtype (the device does not
  promote); scalar branches reach here as ``scalar_tensor`` nodes (constant.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.dtypes import FLOAT_DTYPES
from mps_backend.serialization.generated import nodes as N

from ._util import arg, val
from .emit import convert, finish, vdtype, vshape, where
from .registry import Lowering, op_key
from .unary import isnan, maximum, minimum

aten = torch.ops.aten


def _key(node: Node):
    return op_key(node.target)


def _scalar_bounds(node: Node) -> tuple:
    key = _key(node)
    if key == aten.clamp_min.default:
        return arg(node, 1, "min"), None
    if key == aten.clamp_max.default:
        return None, arg(node, 1, "max")
    return arg(node, 1, "min"), arg(node, 2, "max")


def _clamp_check(node: Node):
    lo, hi = _scalar_bounds(node)
    if lo is None and hi is None:
        return "clamp without bounds (the device never assigns the output, §6 #24)"
    dt = val(node).dtype
    if dt == torch.bool:
        return "clamp of a bool tensor"
    for bound in (lo, hi):
        if bound is None:
            continue
        bound = float(bound)
        if math.isnan(bound):
            return "NaN clamp bound"
        if not dt.is_floating_point:
            info = torch.iinfo(dt)
            if not bound.is_integer() or not info.min <= bound <= info.max:
                return f"clamp bound {bound} is not a {dt} value"
            if float(np.float32(bound)) != bound:
                return f"clamp bound {bound} is not exact in float32 (MPSMinMax fields are float32)"
    return None


def _emit_clamp(b: GraphBuilder, x: int, lo: float, hi: float) -> int:
    return b.emit(N.MPSClamp(input1_id=x, output_id=b.new_value(vdtype(b, x), vshape(b, x))), min_max=(lo, hi))


def _clamp(node: Node, b: GraphBuilder) -> None:
    lo, hi = _scalar_bounds(node)
    x = convert(b, b.id(node.args[0]), b.dtype(node))  # int tensor with float bounds: float result
    # the fields are float32: a bound that rounds to ∓inf there is no bound on the device (and none
    # in torch either: every float32 value is inside it)
    lo = -math.inf if lo is None else float(np.float32(lo))
    hi = math.inf if hi is None else float(np.float32(hi))
    if lo == -math.inf and hi == math.inf:  # the device would never assign the output (§6 #24)
        finish(b, node, x)
        return
    if lo <= hi and vdtype(b, x) in FLOAT_DTYPES:
        r = b.emit(N.MPSHardTanh(input1_id=x, min_value=lo, max_value=hi, output_id=b.new_value(vdtype(b, x), vshape(b, x))))
        finish(b, node, r)
        return
    if lo > hi:  # torch: min(max(x, lo), hi); MPSGraph clamp with crossed bounds is unspecified
        r = _emit_clamp(b, _emit_clamp(b, x, lo, math.inf), -math.inf, hi)
    else:
        r = _emit_clamp(b, x, lo, hi)
    if vdtype(b, x) in FLOAT_DTYPES:
        r = where(b, isnan(b, x), x, r)  # maximum/minimum (one bound) drop NaN on the device
    finish(b, node, r)


def _clamp_tensor_check(node: Node):
    if val(node).dtype == torch.bool:
        return "clamp of a bool tensor"
    if arg(node, 1, "min") is None and arg(node, 2, "max") is None:
        return "clamp without bounds"
    return None


def _clamp_tensor(node: Node, b: GraphBuilder) -> None:
    dt = b.dtype(node)
    r = convert(b, b.id(node.args[0]), dt)
    lo, hi = arg(node, 1, "min"), arg(node, 2, "max")
    if lo is not None:
        r = maximum(b, r, convert(b, b.id(lo), dt))
    if hi is not None:
        r = minimum(b, r, convert(b, b.id(hi), dt))
    finish(b, node, r)


def _where(node: Node, b: GraphBuilder) -> None:
    cond, x, y = node.args[:3]
    dt = b.dtype(node)
    b.emit(
        N.MPSWhere(
            input1_id=b.id(cond), input2_id=convert(b, b.id(x), dt), input3_id=convert(b, b.id(y), dt), output_id=b.out(node)
        )
    )


LOWERINGS = [
    Lowering((aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default), _clamp, _clamp_check),
    Lowering((aten.clamp.Tensor,), _clamp_tensor, _clamp_tensor_check),
    Lowering((aten.where.self,), _where),
]
