"""What the lowering passes read of a program: constant data and op identities."""

from __future__ import annotations

from typing import Any

import torch
from executorch.exir.dialects.edge._ops import EdgeOpOverload
from torch._export.utils import (
    get_buffer,
    get_lifted_tensor_constant,
    get_param,
    is_buffer,
    is_lifted_tensor_constant,
    is_param,
)
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, TensorArgument
from torch.fx import Node

from mps_backend.operators.registry import op_key

#: node.meta key: the name of the fx node a lowering pass put this node in the place of (its metadata,
#: debug handle included, is that node's)
REPLACES = "mps_replaces"


def replace_node(old: Node, new: Node) -> None:
    """``new`` takes ``old``'s place: its readers, its metadata (``REPLACES`` names it); ``old`` leaves."""
    new.meta = {**old.meta, REPLACES: old.meta.get(REPLACES, old.name)}
    old.replace_all_uses_with(new)
    old.graph.erase_node(old)


def constant_tensor(ep: ExportedProgram, node: Any) -> torch.Tensor | None:
    """The tensor a placeholder holds when it is a parameter, buffer or lifted constant, else None."""
    if not isinstance(node, Node) or node.op != "placeholder":
        return None
    for is_kind, get in ((is_param, get_param), (is_buffer, get_buffer), (is_lifted_tensor_constant, get_lifted_tensor_constant)):
        if is_kind(ep, node):
            return get(ep, node)
    return None


def constant_tensors(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    """Placeholder name -> the tensor it holds, for every parameter, buffer and lifted constant: what
    :func:`constant_tensor` gives for each placeholder, in one pass over the signature (each
    ``constant_tensor`` call rebuilds torch's name tables of every input: for all placeholders at once
    that is quadratic in their count)."""
    sig = ep.graph_signature
    non_persistent = set(sig.non_persistent_buffers)
    table = {}
    for s in sig.input_specs:
        if not isinstance(s.arg, TensorArgument) or not isinstance(s.target, str):
            continue
        if s.kind == InputKind.PARAMETER:
            table[s.arg.name] = ep.state_dict[s.target]
        elif s.kind == InputKind.BUFFER:
            table[s.arg.name] = ep.constants[s.target] if s.target in non_persistent else ep.state_dict[s.target]
        elif s.kind == InputKind.CONSTANT_TENSOR:
            table[s.arg.name] = ep.constants[s.target]
    return table


def target_of(node: Node) -> Any:
    """The aten OpOverload a call node runs (the registry's key: edge graphs wrap them in EdgeOpOverload)."""
    return op_key(node.target)


def is_call(node: Any, *targets: Any) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and target_of(node) in targets


def edge_op(node: Node, op: torch._ops.OpOverload) -> Any:
    """``op`` in the dialect ``node``'s graph uses (edge graphs call EdgeOpOverloads)."""
    if isinstance(node.target, EdgeOpOverload):
        from executorch.exir.dialects._ops import ops as exir_ops  # noqa: PLC0415

        return getattr(getattr(exir_ops.edge.aten, op._schema.name.split("::")[1]), op._overloadname)
    return op
