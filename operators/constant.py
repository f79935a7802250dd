"""Constant-producing ops: full, full_like, scalar_tensor, zeros/ones(_like), empty (as zeros).

MPSFull / MPSFullLike carry their own ``dtype``: it is always the graph's compute dtype (float16 in
fp16 graphs — a float32 fill would promote everything downstream to f32, semantics §6 #11).
``fill_value`` is a float32 field: integer fills must be exact in float32. Zero-size results stay on
CPU (the generic checks: the device binds no tensor for them). ``empty`` has no defined contents;
zeros are a valid value.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  (defines torch.ops.dim_order_ops)
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.dtypes import mps_dtype
from mps_backend.serialization.generated import nodes as N

from ._util import arg, rank, val
from .emit import scalar_value
from .registry import Lowering, op_key

aten = torch.ops.aten
dim_order_ops = torch.ops.dim_order_ops


def _key(node: Node):
    return op_key(node.target)


#: target -> (index of the fill value argument, or the fixed float fill), whether it is a *_like op
_FILLS = {
    aten.full.default: (1, False),
    aten.full_like.default: (1, True),
    aten.scalar_tensor.default: (0, False),
    aten.zeros.default: (0.0, False),
    aten.ones.default: (1.0, False),
    aten.zeros_like.default: (0.0, True),
    aten.ones_like.default: (1.0, True),
    aten.empty.memory_format: (0.0, False),
    aten.empty_like.default: (0.0, True),
    dim_order_ops._empty_dim_order.default: (0.0, False),
}


def _fill(node: Node):
    where, _ = _FILLS[_key(node)]
    if isinstance(where, float):  # zeros / ones / empty: a fixed fill
        return where
    return arg(node, where, "s" if where == 0 else "fill_value")


def _full_check(node: Node):
    fmt = node.kwargs.get("memory_format")
    if fmt not in (None, torch.contiguous_format, torch.preserve_format):
        return f"memory_format {fmt} (the device holds contiguous tensors only)"
    order = node.kwargs.get("dim_order")
    if order is not None and list(order) != list(range(rank(node))):
        return f"dim_order {list(order)} (the device holds contiguous tensors only)"
    dt = val(node).dtype
    value = _fill(node)
    if not isinstance(value, (int, float, bool)):
        return f"fill value {value!r} is not a number"
    if not dt.is_floating_point and dt != torch.bool:
        if isinstance(value, float) and not math.isfinite(value):
            return f"non-finite fill {value} for {dt}"
        v = float(scalar_value(value, dt))
        if float(np.float32(v)) != v:
            return f"fill value {v} is not exact in float32 (MPSFull.fill_value is a float32 field)"
    return None


def _full(node: Node, b: GraphBuilder) -> None:
    dt = b.dtype(node)
    value = float(scalar_value(_fill(node), dt))
    shape = [int(d) for d in val(node).shape] or [1]  # rank 0 is [1] on the device
    out = b.out(node)
    if _FILLS[_key(node)][1]:
        b.emit(
            N.MPSFullLike(input1_id=b.id(node.args[0]), output_id=out, shape=shape, fill_value=value, dtype=int(mps_dtype(dt)))
        )
    else:
        b.emit(N.MPSFull(input1_id=-1, output_id=out, shape=shape, fill_value=value, dtype=int(mps_dtype(dt))))


LOWERINGS = [Lowering(tuple(_FILLS), _full, _full_check)]
