"""Functions of transformers' modeling modules swapped for the decode step's forward (the one torch.export
traces), and put back when it returns, also when it raises.

Some modeling code calls a module-level function the device cannot compute as written, or must see a
chunk's padding rows through: RoPE as complex numbers (:func:`mps_backend.llm.attention.real_rotary`), the
scans that update a recurrent state for several rows (:data:`mps_backend.llm.recurrent.CHUNK_SCANS`). Each
is a ``(module name, function name, wrap)`` swap: ``wrap(own)`` gives the function to use meanwhile.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterable

#: (modeling module name, function name, wrap: transformers' own function -> the one to use meanwhile)
Swap = tuple[str, str, Callable[[Callable], Callable]]


def modeling_modules(model) -> frozenset[str]:
    """The names of the modules ``model``'s submodules are defined in."""
    return frozenset(type(m).__module__ for m in model.modules())


@contextlib.contextmanager
def swapped(swaps: Iterable[Swap]):
    """While open, each swap's function of its module is ``wrap(own)``; transformers' own is put back after."""
    saved = []
    try:
        for name, fn, wrap in swaps:
            module = sys.modules[name]
            own = getattr(module, fn)
            saved.append((module, fn, own))
            setattr(module, fn, wrap(own))
        yield
    finally:
        for module, fn, own in reversed(saved):
            setattr(module, fn, own)


__all__ = ["Swap", "modeling_modules", "swapped"]
