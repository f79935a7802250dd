"""Device model of the ExecuTorch MPS delegate and the emulator that runs whole ``.pte`` files (three
layers: ``shim_build`` compiles the C++ shim, ``shim_bridge`` loads it into executorch's runtime and serves
its callback, ``emulator`` loads and runs programs).

Import-light: the submodules (and torch/executorch) load on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mps_backend._lazy import lazy_attributes

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily (_LAZY)
    from .emulator import (  # noqa: F401
        InputMismatchError,
        LoadedMethod,
        constant_method_values,
        program_input_specs,
        run_pte,
        run_with_etdump,
        verify_bundled,
    )
    from .shim_bridge import load_emulator  # noqa: F401
    from .shim_build import EmulatorBuildError, EmulatorError, build_shim  # noqa: F401

#: public name -> submodule that defines it
_LAZY = {
    "run_pte": "emulator",
    "load_emulator": "shim_bridge",
    "build_shim": "shim_build",
    "EmulatorError": "shim_build",
    "EmulatorBuildError": "shim_build",
    "InputMismatchError": "emulator",
    "LoadedMethod": "emulator",
    "constant_method_values": "emulator",
    "verify_bundled": "emulator",
    "run_with_etdump": "emulator",
    "program_input_specs": "emulator",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
