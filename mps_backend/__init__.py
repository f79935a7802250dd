"""mps_backend: lower PyTorch models to the ExecuTorch MPS delegate.

    from mps_backend import MPSPartitioner
    edge = to_edge_transform_and_lower(torch.export.export(model, args), partitioner=[MPSPartitioner()])

Importing this package registers the MPS recipe provider with ``executorch.export`` (as XNNPACK, CoreML
and QNN register theirs; ``mps_backend.recipes``), its one side effect besides a logging filter that drops
one upstream deprecation notice torchao causes (:mod:`mps_backend._notices`); every other public name (``__all__``)
loads its module on first use. Every exception the package raises is an :class:`MPSBackendError`, every
warning an :class:`MPSBackendWarning`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mps_backend._notices  # noqa: F401  (first: it quiets one upstream notice the next import prints)
from mps_backend import recipes as _recipes  # noqa: F401  (registers MPSRecipeProvider with executorch.export)
from mps_backend._lazy import lazy_attributes

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily (_LAZY)
    from mps_backend.backend import LoweringBug, LoweringError, MPSBackend  # noqa: F401
    from mps_backend.errors import CheckpointError, InternalError, MPSBackendError, MPSBackendWarning  # noqa: F401
    from mps_backend.export import ExportResult, export_model, make_static, verify  # noqa: F401
    from mps_backend.partitioner import (  # noqa: F401
        CpuNode,
        DynamicShapeWarning,
        MPSPartitioner,
        PartitionReport,
        edge_compile_config,
    )
    from mps_backend.passes.program import Float16RangeError, Float16RangeWarning  # noqa: F401
    from mps_backend.recipes import EmulatorUnavailableWarning, MPSRecipeType  # noqa: F401
    from mps_backend.runtime.emulator import EmulatorError, InputMismatchError  # noqa: F401
    from mps_backend.runtime.program_check import ProgramFormatError  # noqa: F401
    from mps_backend.runtime_kernels import RuntimeCompatError, RuntimeCompatWarning  # noqa: F401
    from mps_backend.serialization.errors import MPSFormatError  # noqa: F401

__version__ = "0.1.0"

#: public name -> submodule that defines it
_LAZY = {
    # lowering
    "MPSPartitioner": "partitioner",
    "MPSBackend": "backend",
    "PartitionReport": "partitioner",
    "CpuNode": "partitioner",
    "edge_compile_config": "partitioner",
    "MPSRecipeType": "recipes",
    # export with progress, verification and the whole-program checks
    "export_model": "export",
    "ExportResult": "export",
    "make_static": "export",
    "verify": "export",
    # errors and warnings
    "MPSBackendError": "errors",
    "MPSBackendWarning": "errors",
    "InternalError": "errors",
    "LoweringError": "backend",
    "LoweringBug": "backend",
    "Float16RangeError": "passes.program",
    "Float16RangeWarning": "passes.program",
    "RuntimeCompatError": "runtime_kernels",
    "RuntimeCompatWarning": "runtime_kernels",
    "DynamicShapeWarning": "partitioner",
    "EmulatorUnavailableWarning": "recipes",
    "EmulatorError": "runtime.emulator",
    "InputMismatchError": "runtime.emulator",
    "ProgramFormatError": "runtime.program_check",
    "MPSFormatError": "serialization.errors",
    "CheckpointError": "errors",
}

__all__ = sorted([*_LAZY, "__version__"])

__getattr__, _dir = lazy_attributes(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted({*globals(), *_dir()})
