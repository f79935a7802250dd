"""Device model of the ExecuTorch MPS delegate and the emulator that runs whole ``.pte`` files.

Import-light: the submodules (and torch/executorch) load on first attribute access.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .emulator import (
        EmulatorBuildError,
        EmulatorError,
        InputMismatchError,
        LoadedMethod,
        build_shim,
        constant_method_values,
        load_emulator,
        run_pte,
    )

#: public name -> submodule that defines it
_LAZY = {
    "run_pte": "emulator",
    "load_emulator": "emulator",
    "build_shim": "emulator",
    "EmulatorError": "emulator",
    "EmulatorBuildError": "emulator",
    "InputMismatchError": "emulator",
    "LoadedMethod": "emulator",
    "constant_method_values": "emulator",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return list(__all__)
