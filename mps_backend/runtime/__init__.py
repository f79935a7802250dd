"""Device model of the ExecuTorch MPS delegate and the emulator that runs whole ``.pte`` files.

Import-light: the submodules (and torch/executorch) load on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mps_backend._lazy import lazy_attributes

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily (_LAZY)
    from .emulator import (  # noqa: F401
        EmulatorBuildError,
        EmulatorError,
        InputMismatchError,
        LoadedMethod,
        build_shim,
        constant_method_values,
        load_emulator,
        program_input_specs,
        run_pte,
        run_with_etdump,
        verify_bundled,
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
    "verify_bundled": "emulator",
    "run_with_etdump": "emulator",
    "program_input_specs": "emulator",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
