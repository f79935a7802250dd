"""Mixture-of-experts routers on the device (issue #39 item 4).

A router picks each token's top-k experts with ``aten.topk``, which the MPS lowering computes exactly
(``operators/reduce.py``, ``rank_select``: pairwise comparisons, best first, equal values lowest index
first). DeepSeek V2/V3, GLM-4 MoE, dots1, Solar Open, EXAONE MoE and MiniMax M2 route with
``torch.topk(..., sorted=False)`` (the experts, and for grouped routing the groups): torch leaves the
order of such a result unspecified (its CPU kernel returns a partial-sort order that changes with the
input size), and the lowering refuses ``sorted=False`` with ``k > 1`` for arbitrary programs, which
left one ``aten::topk`` on the CPU per MoE layer, between two delegates.

In a language model the routers' results are order-free: the indices select experts (or groups, through a
scatter into a mask), the scores are gathered by those indices, and the experts' outputs are summed
over the k choices. :func:`sort_unsorted_topk` makes those nodes ``sorted=True``: best first is one of
the orders ``sorted=False`` allows, so the program computes the same set of experts with the same
weights (the sum over them in another order: float rounding only).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

aten = torch.ops.aten


def sort_unsorted_topk(ep: ExportedProgram) -> int:
    """Set ``sorted=True`` on every ``aten.topk`` of ``ep`` with ``sorted=False`` (in place); returns how
    many. Only for programs whose topk results are used order-free (a language model's routers)."""
    changed = 0
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function" or node.target != aten.topk.default:
            continue
        args = list(node.args)
        if len(args) > 4 and args[4] is False:
            args[4] = True
            node.args = tuple(args)
            changed += 1
        elif node.kwargs.get("sorted") is False:
            node.kwargs = {**node.kwargs, "sorted": True}
            changed += 1
    if changed:
        ep.graph_module.recompile()
    return changed
