"""Program-level passes before partitioning (whole exported programs): unread constants, the float16 range."""

from __future__ import annotations

import torch

from mps_backend.errors import MPSBackendError, MPSBackendWarning


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
    drop = [s for s in sig.input_specs if s.kind in kinds and getattr(s.arg, "name", None) in unread and s.target not in mutated]
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


#: largest float16 magnitude
FP16_MAX = float(torch.finfo(torch.float16).max)


class Float16RangeError(MPSBackendError, ValueError):
    """Constants the delegate would hold in float16 have values beyond float16's range."""


class Float16RangeWarning(MPSBackendWarning):
    """A constant held in float16 by the delegate has values beyond float16's range (they become inf)."""


def largest_magnitude(t: torch.Tensor) -> float:
    """max |t| by one reduction (no whole-tensor temporary); 0 for an empty tensor."""
    if not t.numel():
        return 0.0
    low, high = torch.aminmax(t.detach())
    return max(-float(low), float(high))


def fp16_overflow(name: str, tensor: torch.Tensor) -> str | None:
    """``"name (k of n values, largest |x| m)"`` when float32 ``tensor`` has finite values beyond
    ±65504 (one reduction; counted only then), else None. One-element constants (a -1e9 fill value)
    are not reported: as ±inf they keep their meaning."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.dtype != torch.float32 or tensor.numel() <= 1:
        return None  # tensor subclasses (torchao's quantized weights) hold their own data types
    t = tensor.detach()
    largest = largest_magnitude(t)
    if largest <= FP16_MAX or largest == float("inf"):
        return None
    count = int((t.abs() > FP16_MAX).sum())
    return f"{name} ({count} of {t.numel()} values, largest |x| {largest:.3g})"


def check_fp16_constants(ep: torch.export.ExportedProgram) -> None:
    """Raise :class:`Float16RangeError` naming the float32 parameters, buffers and constant tensors
    of ``ep`` that float16 cannot hold (they would become ±inf on a float16 device)."""
    tensors = {**ep.state_dict, **ep.constants}
    bad = [msg for name, t in tensors.items() if isinstance(t, torch.Tensor) for msg in [fp16_overflow(name, t)] if msg]
    if bad:
        raise Float16RangeError(
            "float16 mode: constants with values beyond float16's range (|x| > 65504) would become inf on the "
            "device: "
            + ", ".join(bad[:5])
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            + ". Export in float32 (MPSPartitioner(use_fp16=False), mps-backend export --fp32), or rescale them"
        )
