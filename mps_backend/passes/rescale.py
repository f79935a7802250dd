"""``(x * a) / d`` with scalars ``a``, ``d`` powers of two -> ``x * (a / d)``, or ``x`` when ``a == d``; ``x * 1`` -> ``x``.

Scaling by a power of two is exact, so the result is torch's bit for bit, except where ``x * a`` leaves
the normal range of the compute dtype: there torch's result is inf (or loses bits) and this one is the
exact value. It matters in float16 graphs: SAM's prompt rescaling ``points * 1024 / 1024`` overflows
float16 (65504) where the float32 model is finite. The multiply stays when something else reads it.

``x * 1`` (``1 * x``) of an ``x`` of the product's dtype and shape is ``x`` bit for bit (NaN, infinities and
signed zeros included). Transformers' eager attention writes one where the query is scaled beforehand
(Whisper, BART: ``matmul(q, k^T) * scaling`` with ``scaling=1.0``), over the whole ``[heads, n, n]``
scores: in Whisper-tiny's encoder a float32 program's multiply wrote and read 103 MiB of scores per layer.

Scalars are Python numbers or one-element constants read through dtype casts (edge graphs lift
``x * 1024``'s scalar into a 0-dim int64 constant cast to x's dtype). The rewritten division is an
``aten.mul.Scalar`` (``aten.alias_copy`` for a ratio of 1) carrying the division's metadata.
"""

from __future__ import annotations

import math

import torch
from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  (defines torch.ops.dim_order_ops)
from torch.export import ExportedProgram
from torch.fx import Node

from ._graph import constant_tensor, edge_op, is_call, replace_node

aten = torch.ops.aten
_CASTS = (torch.ops.dim_order_ops._to_dim_order_copy.default, aten._to_copy.default)
_MULS = (aten.mul.Tensor, aten.mul.Scalar)
_DIVS = (aten.div.Tensor, aten.div.Scalar)


def power_of_two(c: object) -> bool:
    return (
        isinstance(c, (int, float)) and not isinstance(c, bool) and c != 0 and math.isfinite(c) and math.frexp(abs(c))[0] == 0.5
    )


def scalar_of(ep: ExportedProgram, a: object) -> int | float | None:
    """The number a scalar operand holds (module doc), None when it is not one."""
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return a
    casts = []
    while is_call(a, *_CASTS):
        assert isinstance(a, Node)
        casts.append(a.meta["val"].dtype)
        a = a.args[0]
    data = constant_tensor(ep, a)
    if data is None or data.numel() != 1 or data.dtype == torch.bool:
        return None
    v = data.detach().reshape(())
    for dtype in reversed(casts):
        v = v.to(dtype)
    return v.item()


def _rescaling(ep: ExportedProgram, div: Node, use_fp16: bool) -> tuple[Node, float] | None:
    """(x, a / d) when ``div`` is ``(x * a) / d`` of a float ``x`` of the division's dtype and shape, with
    powers of two whose ratio is a normal number of the compute dtype."""
    m, d = div.args[0], scalar_of(ep, div.args[1])
    out = div.meta["val"]
    if not (is_call(m, *_MULS) and power_of_two(d) and out.dtype.is_floating_point) or div.kwargs:
        return None
    assert isinstance(m, Node)
    for x, a in (m.args[:2], m.args[1::-1]):
        if isinstance(x, Node) and x.meta["val"].dtype == out.dtype and list(x.meta["val"].shape) == list(out.shape):
            a = scalar_of(ep, a)
            break
    else:
        return None
    if not power_of_two(a) or a is None or d is None:
        return None
    ratio = a / d  # exact: a quotient of powers of two
    info = torch.finfo(torch.float16 if use_fp16 and out.dtype == torch.float32 else out.dtype)
    return (x, ratio) if info.tiny <= abs(ratio) <= info.max else None


def fold_power_of_two_rescales(ep: ExportedProgram, use_fp16: bool) -> int:
    """Rewrite every ``(x * a) / d`` of powers of two and every ``x * 1`` (module doc); returns how many."""
    graph, folded = ep.graph, 0
    for div in list(graph.nodes):
        if not is_call(div, *_DIVS):
            continue
        found = _rescaling(ep, div, use_fp16)
        if found is None:
            continue
        x, ratio = found
        with graph.inserting_after(div):
            if ratio == 1:
                new = graph.call_function(edge_op(div, aten.alias_copy.default), (x,))
            else:
                new = graph.call_function(edge_op(div, aten.mul.Scalar), (x, float(ratio)))
        mul = div.args[0]
        replace_node(div, new)
        if isinstance(mul, Node) and not mul.users:
            graph.erase_node(mul)
        folded += 1
    for mul in list(graph.nodes):
        x = _unit_factor(ep, mul) if is_call(mul, *_MULS) and not mul.kwargs else None
        if x is None:
            continue
        with graph.inserting_after(mul):
            new = graph.call_function(edge_op(mul, aten.alias_copy.default), (x,))
        replace_node(mul, new)
        folded += 1
    return folded


def _unit_factor(ep: ExportedProgram, mul: Node) -> Node | None:
    """``x`` when ``mul`` is ``x * 1`` or ``1 * x`` with ``x`` of the product's dtype and shape."""
    out = mul.meta["val"]
    for x, a in (mul.args[:2], mul.args[1::-1]):
        val = x.meta.get("val") if isinstance(x, Node) else None
        if (
            isinstance(val, torch.Tensor)
            and val.dtype == out.dtype
            and list(val.shape) == list(out.shape)
            and scalar_of(ep, a) == 1
        ):
            return x
    return None


__all__ = ["fold_power_of_two_rescales", "power_of_two", "scalar_of"]
