"""The op library's node-emission API: value ids in, a fresh value id out.

Every lowering writes MPS nodes through these functions or through ``GraphBuilder.emit``, which takes
one typed node (``serialization.generated.nodes``, imported as ``N``), e.g.
``b.emit(N.MPSExp(input1_id=x, output_id=b.out(node)))``: a missing, unknown or mistyped field is a
TypeError naming the member and the field where the node is built, and mypy checks the fields.
Helpers take the node kind as its class (``unary(b, N.MPSNeg, x)``). They are typed against the one
builder (:class:`mps_backend.builder.GraphBuilder`) and value-level: arguments are value ids the
builder already declared, the result is a new value whose dtype and shape are what the device
computes (docs/device-semantics.md §5):

* elementwise members broadcast their operands (``bshape``); the result dtype is the operands'
  promotion, except comparisons, which produce bool (``device_facts.BOOL_RESULT``);
* fields a member's schema table has but a call leaves out get their neutral value (the node
  class's default, from ``device_facts.NEUTRAL_FIELDS``: ``alpha = 1.0`` of MPSAdd/MPSSub, an absent
  ``rounding_mode`` of MPSDiv/MPSFmod/MPSRemainder); every other field must be given;
* node kinds the runtime never dispatches (MPSMin, MPSMax, MPSAtan2) are refused by ``emit``.

``out=`` writes into an existing value (normally the fx node's ``b.out(node)``) instead of a new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.dtypes import mps_dtype, torch_dtype
from mps_backend.serialization.device_facts import BOOL_RESULT
from mps_backend.serialization.generated import nodes as N

#: the node kinds ``unary`` takes (one input, one output: MPSExp, MPSNeg, ...)
Unary = type[N.MPSNode1x1Table]
#: the node kinds ``binary`` takes (two inputs, one output, and MPSAdd/MPSSub's alpha or the division
#: members' rounding_mode)
Binary = type[N.MPSNode2x1Table] | type[N.MPSNodeWithAlpha2x1Table] | type[N.MPSDivNode2x1Table]


# ---- what a value is ------------------------------------------------------------------------------


def vdtype(b: GraphBuilder, vid: int) -> torch.dtype:
    """Declared (= device) dtype of value ``vid``."""
    return torch_dtype(b.graph.values[vid].datatype)


def vshape(b: GraphBuilder, vid: int) -> list[int]:
    """Declared shape of value ``vid`` (rank 0 is ``[]``)."""
    return list(b.graph.values[vid].dims)


def bshape(b: GraphBuilder, *vids: int) -> list[int]:
    """Broadcast shape of some values (the shape an elementwise device op produces)."""
    return list(torch.broadcast_shapes(*(tuple(vshape(b, v)) for v in vids)))


def _into(b: GraphBuilder, out: int | None, dtype: torch.dtype, shape: Iterable[int]) -> int:
    return b.new_value(dtype, shape) if out is None else out


# ---- constants and casts ------------------------------------------------------------------------


def scalar_value(value: Any, dtype: torch.dtype) -> Any:
    """A Python scalar converted the way torch converts a scalar operand to ``dtype``
    (integers wrap: ``int8_tensor + 300`` adds 44)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    return int(torch.tensor([value]).to(dtype)[0])


def const(b: GraphBuilder, value: Any, dtype: torch.dtype) -> int:
    """A one-element constant of ``dtype`` holding ``value`` (bytes and declared dtype agree)."""
    return b.scalar(scalar_value(value, dtype), dtype)


def convert(b: GraphBuilder, vid: int, dtype: torch.dtype) -> int:
    """``vid`` as ``dtype`` (an MPSCast only when the dtype differs)."""
    return vid if vdtype(b, vid) == dtype else b.cast(vid, dtype)


def finish(b: GraphBuilder, node: Node, vid: int) -> None:
    """Bind fx ``node`` to ``vid``, cast to the node's device dtype when needed."""
    b.alias(node, convert(b, vid, b.dtype(node)))


def full_like(b: GraphBuilder, x: int, value: float, dtype: torch.dtype) -> int:
    """A tensor of x's shape filled with ``value`` (MPSFullLike; ``dtype`` is a device dtype)."""
    return b.emit(
        N.MPSFullLike(
            input1_id=x,
            shape=vshape(b, x),
            fill_value=float(value),
            dtype=int(mps_dtype(dtype)),
            output_id=b.new_value(dtype, vshape(b, x)),
        )
    )


# ---- elementwise ----------------------------------------------------------------------------------


def unary(b: GraphBuilder, op: Unary, x: int, dtype: torch.dtype | None = None, out: int | None = None) -> int:
    """A one-input member; the result keeps ``x``'s dtype unless ``dtype`` says otherwise."""
    out = _into(b, out, dtype or vdtype(b, x), vshape(b, x))
    b.emit(op(input1_id=x, output_id=out))
    return out


def binary(
    b: GraphBuilder, op: Binary, x: int, y: int, dtype: torch.dtype | None = None, out: int | None = None, **fields: Any
) -> int:
    """A two-input member, operands broadcast; result dtype: bool for a comparison, else the
    promotion of the operands' dtypes (give ``dtype`` to declare another one). ``fields``: the
    member's other fields (``alpha``, ``rounding_mode``; neutral when left out)."""
    if dtype is None:
        dtype = torch.bool if op.KIND in BOOL_RESULT else torch.promote_types(vdtype(b, x), vdtype(b, y))
    out = _into(b, out, dtype, bshape(b, x, y))
    b.emit(op(input1_id=x, input2_id=y, output_id=out, **fields))
    return out


def compare(b: GraphBuilder, op: type[N.MPSNode2x1Table], x: int, y: int) -> int:
    """A comparison member (bool result)."""
    if op.KIND not in BOOL_RESULT:
        raise ValueError(f"{op.KIND} is not a comparison")
    return binary(b, op, x, y)


def where(b: GraphBuilder, cond: int, x: int, y: int, out: int | None = None) -> int:
    """MPSWhere; ``x`` and ``y`` must already share a dtype (the device does not promote)."""
    if vdtype(b, x) != vdtype(b, y):
        raise ValueError(f"where branches of dtypes {vdtype(b, x)} and {vdtype(b, y)}")
    out = _into(b, out, vdtype(b, x), bshape(b, cond, x, y))
    b.emit(N.MPSWhere(input1_id=cond, input2_id=x, input3_id=y, output_id=out))
    return out


# ---- shapes ---------------------------------------------------------------------------------------


def view(b: GraphBuilder, vid: int, new_shape: Iterable[int], out: int | None = None) -> int:
    """MPSView of ``vid`` to ``new_shape`` (static: no -1)."""
    dims = [int(d) for d in new_shape]
    out = _into(b, out, vdtype(b, vid), dims)
    b.emit(N.MPSView(input1_id=vid, output_id=out, num_dims=len(dims), shape=dims))
    return out


def permute(b: GraphBuilder, vid: int, perm: Iterable[int], out: int | None = None) -> int:
    """MPSPermute of ``vid`` by ``perm`` (non-negative dims)."""
    order = [int(p) for p in perm]
    s = vshape(b, vid)
    out = _into(b, out, vdtype(b, vid), [s[p] for p in order])
    b.emit(N.MPSPermute(input1_id=vid, output_id=out, num_dims=len(order), perm=order))
    return out


def expand(b: GraphBuilder, vid: int, in_shape: Sequence[int], out_shape: Sequence[int], out: int | None = None) -> int:
    """``vid`` (of shape ``in_shape``) broadcast to ``out_shape``."""
    if len(out_shape) > len(in_shape):  # the device only reads rank(x) entries: view up first (§6 #18)
        vid = view(b, vid, [1] * (len(out_shape) - len(in_shape)) + list(in_shape))
    out = _into(b, out, vdtype(b, vid), out_shape)
    b.emit(N.MPSExpand(input1_id=vid, output_id=out, num_dims=len(out_shape), shape=[int(d) for d in out_shape]))
    return out


def slice_value(b: GraphBuilder, vid: int, dim: int, start: int, end: int, step: int = 1) -> int:
    """MPSSlice ``[start:end:step]`` of ``vid`` along non-negative ``dim`` (``step >= 1``)."""
    s = vshape(b, vid)
    s[dim] = len(range(start, end, step))
    out = b.new_value(vdtype(b, vid), s)
    b.emit(N.MPSSlice(input1_id=vid, output_id=out, dim=dim, start=start, end=end, step=step))
    return out


def index_select(b: GraphBuilder, vid: int, dim: int, index: Sequence[int] | torch.Tensor, out: int | None = None) -> int:
    """MPSIndexSelect of ``vid`` along ``dim`` with a constant int32 index (the device casts its
    index to int32 anyway, semantics §5.9)."""
    idx = torch.as_tensor(index, dtype=torch.int32).reshape(-1)
    s = vshape(b, vid)
    s[dim] = idx.numel()
    out = _into(b, out, vdtype(b, vid), s)
    b.emit(N.MPSIndexSelect(input1_id=vid, output_id=out, dim=dim, index_id=b.constant(idx, dtype=torch.int32)))
    return out


def cat_values(b: GraphBuilder, vids: Sequence[int], dim: int, out: int | None = None) -> int:
    """MPSCat of values of one dtype along non-negative ``dim``."""
    s = vshape(b, vids[0])
    s[dim] = sum(vshape(b, v)[dim] for v in vids)
    out = _into(b, out, vdtype(b, vids[0]), s)
    b.emit(N.MPSCat(input_ids=list(vids), output_id=out, dim=dim))
    return out
