"""The op registry: one table of lowerings keyed by ``OpOverload`` objects.

A ``Lowering`` names its targets, a pure ``check(node) -> reason | None`` that reads only
``node.meta`` and args (never constant data, never mutating), and ``lower(node, builder)``
that emits MPS nodes. The registry adds the checks every node needs (device dtypes, static
shapes, non-empty tensors) in front of each lowering's own check.

Family modules (activation.py, binary.py, ...) each export ``LOWERINGS`` and may export
``NOT_LOWERED``, ``{op overload: why the device cannot compute it}`` (appended to the "no MPS lowering"
reason); ``default_registry`` builds the one immutable registry from them.
"""

from __future__ import annotations

import functools
import importlib
import operator
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Optional

import torch
from executorch.exir.dialects.edge._ops import EdgeOpOverload
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.dtypes import dtype_reason

Reason = Optional[str]
CheckFn = Callable[[Node], Reason]
LowerFn = Callable[[Node, GraphBuilder], None]

#: the op families, one module each (order only matters for readability of reports)
FAMILIES = (
    "activation",
    "binary",
    "clamp",
    "constant",
    "convolution",
    "copy",
    "indexing",
    "linalg",
    "normalization",
    "pad",
    "pooling",
    "quant",
    "range",
    "reduce",
    "shape",
    "unary",
)


def no_check(node: Node) -> Reason:
    return None


@dataclass(frozen=True)
class Lowering:
    targets: tuple
    lower: LowerFn
    check: CheckFn = no_check
    #: which tensors the generic checks look at: "all" (args and outputs), "outputs" only, or
    #: "args" (args and the first output: for ops whose other outputs are placeholders)
    generic: str = "all"
    #: ask to_edge_transform_and_lower not to decompose these targets (ops_to_not_decompose)
    preserve: bool = False


def op_key(target: Any) -> Any:
    """The registry key of an fx target: edge ops wrap the aten OpOverload in ``_op`` (a plain
    OpOverload has an ``_op`` too, the C++ handle, so only edge ops are unwrapped)."""
    return target._op if isinstance(target, EdgeOpOverload) else target


def _tensors(x: Any) -> Iterable[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for item in x:
            yield from _tensors(item)


#: the words every reason for a node left on CPU because of a dynamic shape starts or contains
DYNAMIC = "dynamic shape"
#: values of symbolic sizes (a dynamic dimension and what is computed from it)
SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def tensor_reason(t: torch.Tensor, what: str) -> Reason:
    reason = dtype_reason(t.dtype)
    if reason:
        return f"{what}: {reason}"
    if any(not isinstance(d, int) for d in t.shape):
        return f"{what} has a {DYNAMIC} {tuple(t.shape)}; the device compiles static shapes only"
    if t.numel() == 0:
        return f"{what} is empty (shape {tuple(t.shape)}); the device cannot hold zero-size tensors"
    return None


def generic_reason(node: Node, scope: str = "all") -> Reason:
    """Checks shared by every op: device dtypes, static shapes, no empty tensors."""
    val = node.meta.get("val")
    if val is None:
        return "node has no meta['val'] (not an exported tensor program?)"
    outputs = list(_tensors(val))
    for i, t in enumerate(outputs[:1] if scope == "args" else outputs):
        reason = tensor_reason(t, f"output {i}")
        if reason:
            return reason
    if scope != "outputs":
        for i, arg in enumerate(node.args):
            for a in arg if isinstance(arg, (list, tuple)) else [arg]:
                if isinstance(a, SYMBOLIC) or isinstance(a, Node) and isinstance(a.meta.get("val"), SYMBOLIC):
                    return f"{DYNAMIC}: input {i} ({getattr(a, 'name', a)}) is a symbolic size, not a value the graph can hold"
                if isinstance(a, Node):
                    for t in _tensors(a.meta.get("val")):
                        reason = tensor_reason(t, f"input {i} ({a.name})")
                        if reason:
                            return reason
    return None


class Registry:
    """Immutable map from op overload to its lowering."""

    def __init__(self, lowerings: Iterable[Lowering], not_lowered: dict | None = None):
        table: dict[Any, Lowering] = {}
        for low in lowerings:
            for t in low.targets:
                if t in table:
                    raise ValueError(f"two lowerings registered for {t}")
                table[t] = low
        self._table = MappingProxyType(table)
        #: ops without a lowering -> why (the device has no way to compute them)
        self._not_lowered = MappingProxyType(dict(not_lowered or {}))

    @property
    def targets(self) -> frozenset:
        return frozenset(self._table)

    @property
    def preserved(self) -> list:
        """Targets lowered whole that the default decompositions would otherwise split."""
        return sorted((t for t, low in self._table.items() if low.preserve), key=str)

    def lowering(self, target: Any) -> Lowering | None:
        return self._table.get(op_key(target))

    def check(self, node: Node) -> Reason:
        """None if the node can be lowered, else the reason it stays on CPU."""
        if node.op != "call_function":
            return f"{node.op} nodes are not operators"
        if isinstance(node.meta.get("val"), SYMBOLIC):  # sym_size and arithmetic on sizes: the CPU's
            return f"{DYNAMIC}: {_name(node.target)} computes a symbolic size (executorch computes it on CPU)"
        low = self.lowering(node.target)
        if low is None:
            why = self._not_lowered.get(op_key(node.target))
            return f"no MPS lowering for {_name(node.target)}" + (f": {why}" if why else "")
        return generic_reason(node, low.generic) or low.check(node)


def _name(target: Any) -> str:
    return getattr(target, "__name__", None) or str(target)


@functools.lru_cache(maxsize=None)
def default_registry() -> Registry:
    """The registry of all op families (built once; immutable)."""
    lowerings: list[Lowering] = [Lowering((operator.getitem,), _lower_getitem, generic="outputs")]
    not_lowered: dict = {}
    for family in FAMILIES:
        module = importlib.import_module(f"mps_backend.operators.{family}")
        lowerings.extend(module.LOWERINGS)
        not_lowered.update(getattr(module, "NOT_LOWERED", {}))
    return Registry(lowerings, not_lowered)


def _lower_getitem(node: Node, b: GraphBuilder) -> None:
    source, index = node.args
    b.alias(node, b.ids[source][index])
