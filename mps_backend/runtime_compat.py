"""Will the app's runtime load this program? The CPU kernels each executorch release registers.

Apps ship the MPS delegate runtime with executorch 1.0-1.4. The MPS delegate itself is the same in all of
them (its schema has not changed since 0.4), but every operator left on CPU runs on a kernel the app's
executorch must register, and a program that names an operator the runtime lacks fails when the app
loads it ("Missing operator"), not at export. ``mps_backend/data/runtime_kernels.json`` lists, per
release, the operators of executorch's standard CPU kernel libraries (portable, quantized, prim ops),
read from each release's sources by ``scripts/runtime_kernels.py``. :func:`check_kernels` looks every
operator of a program up in the target release's list.

The default target is the oldest release with the MPS delegate runtime (1.0): a program that passes runs
on every app that ships the delegate. ``target_runtime="1.4"`` (``--target-runtime 1.4``) if the app
ships a newer executorch; ``None`` skips the check.
"""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterable

from mps_backend.errors import MPSBackendError, MPSBackendWarning

#: the releases the MPS delegate runtime shipped in, oldest first (patch releases share the kernel set
#: of the latest patch listed in the data)
RUNTIME_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
DEFAULT_TARGET = RUNTIME_VERSIONS[0]
#: kernel libraries an app links when it builds executorch with its standard CPU kernels
LIBRARIES = ("portable", "quantized", "prim")


class RuntimeCompatError(MPSBackendError, ValueError):
    """The program needs a CPU kernel the target executorch runtime does not register."""


class RuntimeCompatWarning(MPSBackendWarning):
    """As :class:`RuntimeCompatError`, when the caller asked for warnings."""


@dataclass(frozen=True)
class MissingKernel:
    operator: str  # "aten::sort.values": the name the runtime looks up
    nodes: tuple[str, ...]  # edge nodes that run on it, when the edge program is known

    def describe(self, version: str) -> str:
        where = f" (node{'s' if len(self.nodes) > 1 else ''} {', '.join(self.nodes)})" if self.nodes else ""
        return f"{self.operator}{where}: no kernel in executorch {version}'s {'/'.join(LIBRARIES)} kernel libraries"


@functools.cache
def _data() -> dict[str, dict[str, list[str]]]:
    text = resources.files("mps_backend.data").joinpath("runtime_kernels.json").read_text()
    return json.loads(text)


def _release(version: str) -> str:
    """'1.4' -> the latest patch release of 1.4 in the data ('1.4.1'); a full version must be listed."""
    data = _data()
    if version in data:
        return version
    patches = sorted((v for v in data if v.startswith(version + ".")), key=lambda v: tuple(map(int, v.split("."))))
    if not patches:
        known = sorted({".".join(v.split(".")[:2]) for v in data})
        raise ValueError(
            f"unknown executorch runtime {version!r}: known are {', '.join(known)} "
            "(the releases that ship the MPS delegate runtime)"
        )
    return patches[-1]


def kernels(version: str = DEFAULT_TARGET) -> frozenset[str]:
    """Operator names (``"aten::add.out"``) the standard CPU kernel libraries of ``version`` register."""
    entry = _data()[_release(version)]
    return frozenset(name for lib in LIBRARIES for name in entry[lib])


def program_operators(pte: Any) -> list[str]:
    """Every operator a program's execution plans name (what the runtime resolves at load time).
    ``pte``: the ``.pte`` bytes, or an ``ExecutorchProgramManager`` (``edge.to_executorch()``; nothing
    is serialized then)."""
    if hasattr(pte, "executorch_program"):
        program = pte.executorch_program
    else:
        from executorch.exir._serialize._program import deserialize_pte_binary  # noqa: PLC0415

        program = deserialize_pte_binary(bytes(pte)).program
    names = []
    for plan in program.execution_plan:
        for op in plan.operators:
            name = f"{op.name}.{op.overload}" if op.overload else op.name
            if name not in names:
                names.append(name)
    return names


def _kernel_name(target: Any) -> str | None:
    """The runtime operator name an edge node's target becomes in the program (its out variant)."""
    import torch  # noqa: PLC0415
    from executorch.exir.operator.convert import to_out_variant  # noqa: PLC0415

    # an EdgeOpOverload wraps the aten OpOverload in ``_op`` (an OpOverload's own ``_op`` is its C++ function)
    op = target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", target)
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    if schema.is_mutable or any(a.is_out for a in schema.arguments):
        return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    try:
        out = to_out_variant(op)[0]
    except Exception:  # noqa: BLE001 - no out variant: the op is not emitted as a kernel call
        return None
    s = out._schema
    return f"{s.name}.{s.overload_name}" if s.overload_name else s.name


def _nodes_by_kernel(graph_modules: Iterable[Any]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for gm in graph_modules:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            name = _kernel_name(node.target)
            if name is not None:
                found.setdefault(name, []).append(f"{node.name} ({getattr(node.target, '__name__', node.target)})")
    return found


def missing_kernels(pte: Any, target_runtime: str = DEFAULT_TARGET, edge_graphs: Iterable[Any] = ()) -> list[MissingKernel]:
    """Operators of ``pte`` (bytes or an ``ExecutorchProgramManager``) with no kernel in ``target_runtime``;
    ``edge_graphs`` (the program's graph modules) name the nodes that use each one. With a program
    manager and no ``edge_graphs``, its own methods' graphs are used."""
    if not edge_graphs and hasattr(pte, "methods") and hasattr(pte, "exported_program"):
        edge_graphs = [pte.exported_program(name).graph_module for name in pte.methods]
    have = kernels(target_runtime)
    missing = [name for name in program_operators(pte) if name not in have]
    if not missing:
        return []
    nodes = _nodes_by_kernel(edge_graphs)
    return [MissingKernel(name, tuple(nodes.get(name, ()))) for name in missing]


def check_kernels(
    pte: Any, target_runtime: str | None = DEFAULT_TARGET, *, edge_graphs: Iterable[Any] = (), warn_only: bool = False
) -> list[MissingKernel]:
    """Raise :class:`RuntimeCompatError` (or warn, with ``warn_only``) when the program's CPU part needs a
    kernel the target runtime lacks; returns what is missing. ``target_runtime=None`` checks nothing."""
    if target_runtime is None:
        return []
    missing = missing_kernels(pte, target_runtime, edge_graphs)
    if missing:
        version = _release(target_runtime)
        msg = (
            f"the program would not load in executorch {version} (the target runtime): "
            + "; ".join(m.describe(version) for m in missing)
            + ". Lower those nodes to MPS (see the partitioner's report for why they stayed on CPU), "
            "change the model, or target a newer runtime if the app ships one (--target-runtime / "
            "target_runtime=...)"
        )
        if warn_only:
            warnings.warn(RuntimeCompatWarning(msg), stacklevel=2)
        else:
            raise RuntimeCompatError(msg)
    return missing
