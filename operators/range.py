"""arange -> MPSArange, only where the device formula reproduces torch's values exactly.

The device (semantics §5.16) computes ``n = int32(ceil((f32(end) - f32(start)) / step))`` (the
difference in float32) and ``out = cast(i, dtype) * step_d + start_d`` with ``step``/``start``
converted to the dtype (truncated for integers); torch computes ``start + i * step`` in double and
rounds once. They agree when every ``i``, ``i * step`` and ``start + i * step`` is exact in the
output dtype (and the fields are exact float32): integer ranges below 2**24, dyadic float ranges
whose values fit the significand (24 bits for float32, 11 for float16). The element count is
recomputed the device's way and must match the graph. Other ranges stay on CPU.
In fp16 graphs a float32 range is produced in float16 (``dtype`` = compute dtype, never float32).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.dtypes import mps_dtype
from mps_backend.serialization.generated import nodes as N

from ._util import arg, val
from .registry import Lowering, op_key

aten = torch.ops.aten

_SIGNIFICAND = {torch.float32: 24, torch.float16: 11}


def _key(node: Node):
    return op_key(node.target)


def _range_args(node: Node) -> tuple:
    if _key(node) == aten.arange.default:
        return 0, arg(node, 0, "end"), 1
    return arg(node, 0, "start"), arg(node, 1, "end"), arg(node, 2, "step", 1)


def _exact_f32(v) -> bool:
    return math.isfinite(float(v)) and float(np.float32(v)) == float(v)


def _arange_check(node: Node):
    start, end, step = _range_args(node)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, end, step)):
        return f"arange({start}, {end}, {step}) with non-numeric bounds"
    dt = val(node).dtype
    n = int(val(node).shape[0])
    if not all(_exact_f32(v) for v in (start, end, step)) or step == 0:
        return f"arange({start}, {end}, {step}): bounds not exact in float32 (MPSArange fields are float32)"
    span = float(np.float32(end) - np.float32(start))  # the device's element count
    if math.ceil(span / float(np.float32(step))) != n:
        return f"arange({start}, {end}, {step}): the device would produce a different element count"
    last = Fraction(start) + (n - 1) * Fraction(step)
    if dt in _SIGNIFICAND:
        limit = 2 ** _SIGNIFICAND[dt]
        scale = math.lcm(Fraction(start).denominator, Fraction(step).denominator)
        ints = [abs(Fraction(start) * scale), abs(last * scale), abs((n - 1) * Fraction(step) * scale), n - 1]
        if any(v >= limit for v in ints) or (dt == torch.float16 and (scale > 2**24 or abs(last) > 65504)):
            return (
                f"arange({start}, {end}, {step}) as {dt}: values not all exact in {dt} (the device "
                "rounds i * step and + start separately)"
            )
        return None
    if dt == torch.bool or dt.is_floating_point:
        return f"arange of {dt}"
    if not all(float(v).is_integer() for v in (start, step)):
        return f"arange({start}, {end}, {step}) as {dt}: the device truncates fractional start/step"
    info = torch.iinfo(dt)
    if any(abs(v) >= 2**24 for v in (start, last, (n - 1) * step)) or not info.min <= last <= info.max:
        return f"arange({start}, {end}, {step}) as {dt}: values beyond 2**24 (float32 fields)"
    return None


def _arange(node: Node, b: GraphBuilder) -> None:
    start, end, step = _range_args(node)
    b.emit(
        N.MPSArange(
            output_id=b.out(node), start=float(start), end=float(end), step=float(step), dtype=int(mps_dtype(b.dtype(node)))
        )
    )


LOWERINGS = [
    Lowering((aten.arange.default, aten.arange.start, aten.arange.start_step), _arange, _arange_check, generic="outputs")
]
