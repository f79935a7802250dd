"""Store a constant weight read only by linears transposed.

The device's matmul reads ``x @ W.T``: a linear's lowering emits ``MPSPermute(W)`` before its
``MPSMatMul`` / ``MPSAddmm``. For a constant weight read only as the weight of linear nodes (any
number of them: an LSTM's shared weights, a tied head used twice), this pass makes the program's
constant ``W.T`` -- a view of the model's tensor, no copy; the blob writer copies it transposed,
straight from the model's memory, once -- and gives the linears ``permute(W.T, [1, 0])`` (one node, so
the graph still computes ``W``). After lowering, ``simplify`` cancels the two permutes, so each matmul
reads the transposed constant and no permute is left on the device.

A weight read by anything else (an embedding tied to the head, a computed weight) keeps its layout.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node

from ._graph import edge_op, is_call

aten = torch.ops.aten


def _only_linear_weight(w: Node) -> bool:
    return bool(w.users) and all(
        is_call(u, aten.linear.default) and u.args[1] is w and w not in (u.args[0], *u.args[2:], *u.kwargs.values())
        for u in w.users
    )


def transpose_linear_weights(ep: ExportedProgram) -> int:
    """Rewrite every constant 2-d weight read only by linears (module doc); returns how many."""
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if getattr(s.arg, "name", None)}
    mutated = set(ep.graph_signature.buffers_to_mutate.values())
    graph, done = ep.graph, 0
    for w in [n for n in graph.nodes if n.op == "placeholder"]:
        spec = specs.get(w.name)
        if spec is None or spec.target in mutated or not _only_linear_weight(w):
            continue
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            store = ep.state_dict
        elif spec.kind is InputKind.CONSTANT_TENSOR:
            store = ep.constants
        else:
            continue
        tensor = store.get(spec.target)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2 or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            continue
        original = w.meta["val"]
        store[spec.target] = tensor.detach().t()  # a view: the program handed to preprocess owns this dict
        w.meta["val"] = torch.empty(original.shape[::-1], dtype=original.dtype, device="meta")
        first = next(iter(w.users))
        with graph.inserting_before(first):
            permute = graph.call_function(edge_op(first, aten.permute_copy.default), (w, [1, 0]))
        permute.meta["val"] = original
        for user in list(w.users):
            if user is not permute:
                user.replace_input_with(w, permute)
        done += 1
    return done


__all__ = ["transpose_linear_weights"]
