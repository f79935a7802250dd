"""Graph passes on exported programs, before partitioning and lowering."""
from __future__ import annotations

import torch


def drop_unused_constants(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Remove parameters, buffers and lifted constants that no node reads (in place; returns ``ep``).

    torch.export keeps every registered tensor as a graph input, read or not. An unread one is never
    delegated, so executorch stores it in the program as a CPU constant: e.g. executorch's example
    llama gives each layer an alias of the rope tables that only the top-level module reads, and
    the .pte then carried a second float32 copy of them. Mutated buffers are kept (the program
    writes them back)."""
    from torch.export.graph_signature import InputKind  # noqa: PLC0415

    sig = ep.graph_signature
    unread = {n.name: n for n in ep.graph.nodes if n.op == "placeholder" and not n.users}
    mutated = set(sig.buffers_to_mutate.values())
    kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    drop = [s for s in sig.input_specs
            if s.kind in kinds and getattr(s.arg, "name", None) in unread and s.target not in mutated]
    if not drop:
        return ep
    for spec in drop:
        ep.graph.erase_node(unread[spec.arg.name])
        sig.input_specs.remove(spec)
    kept = {s.target for s in sig.input_specs}
    for spec in drop:
        if spec.target not in kept:
            (ep.constants if spec.kind is InputKind.CONSTANT_TENSOR else ep.state_dict).pop(spec.target, None)
    ep.graph_module.recompile()
    return ep
