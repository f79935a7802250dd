"""Kernel table of the device model: one kernel per MPSNodeUnion member.

Each module below exports ``KERNELS: dict[str, fn(ctx, node)]``; ``build_kernels`` merges them into
one read-only mapping (duplicates and non-members are errors). ``KERNELS`` is that mapping, built
once at import; nothing registers itself by side effect.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Callable, Mapping

from mps_backend.serialization.model import UNION_MEMBERS

Kernel = Callable[..., None]

#: kernel modules, one per op family
MODULES = (
    # elementwise families
    "activation",
    "binary",
    "bitwise",
    "compare",
    "unary",
    "clamp",
    "constant",
    "range",
    "cast",
    # structured families
    "shape",
    "indexing",
    "linalg",
    "conv",
    "norm",
    "pool",
    "pad",
    "quant",
    "reduce",
)


def build_kernels() -> Mapping[str, Kernel]:
    """Union member name -> kernel, merged from every module of ``MODULES``."""
    merged: dict[str, Kernel] = {}
    for name in MODULES:
        qualified = f"{__name__}.{name}"
        module = importlib.import_module(qualified)
        table = getattr(module, "KERNELS", None)
        if not isinstance(table, Mapping):
            raise TypeError(f"{qualified} does not export a KERNELS mapping")
        for op, fn in table.items():
            if op not in UNION_MEMBERS:
                raise ValueError(f"{qualified}: {op!r} is not a member of MPSNodeUnion")
            if op in merged:
                raise ValueError(f"{qualified}: a second kernel for {op}")
            merged[op] = fn
    return MappingProxyType(merged)


KERNELS: Mapping[str, Kernel] = build_kernels()

__all__ = ["KERNELS", "MODULES", "Kernel", "build_kernels"]
