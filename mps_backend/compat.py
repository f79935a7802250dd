"""Old export scripts that import ExecuTorch's removed MPS backend, run against this package.

    python -m mps_backend.compat old_export_script.py --its --own --args   # the script unchanged

or one line at the top of the script (before its executorch.backends.apple.mps imports)::

    import mps_backend.compat  # noqa: F401

Either makes these modules importable, with the names old scripts take from them:

| module | names |
|---|---|
| ``executorch.backends.apple.mps`` | ``MPSBackend``, ``MPSPartitioner`` |
| ``executorch.backends.apple.mps.partition`` | ``MPSPartitioner`` |
| ``executorch.backends.apple.mps.partition.mps_partitioner`` | ``MPSPartitioner`` |
| ``executorch.backends.apple.mps.mps_preprocess`` | ``MPSBackend`` |

``MPSPartitioner(compile_specs=[CompileSpec("use_fp16", bytes([True]))])`` and
``to_backend("MPSBackend", edge_program, compile_specs)`` work as they did. Nothing is installed
globally: the alias exists in the process that imported this module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import runpy
import sys
import types
from typing import Any

#: old module -> {name: "module:attribute" in this package}
ALIASES: dict[str, dict[str, str]] = {
    "executorch.backends.apple.mps": {
        "MPSBackend": "mps_backend.backend:MPSBackend",
        "MPSPartitioner": "mps_backend.partitioner:MPSPartitioner",
    },
    "executorch.backends.apple.mps.partition": {"MPSPartitioner": "mps_backend.partitioner:MPSPartitioner"},
    "executorch.backends.apple.mps.partition.mps_partitioner": {"MPSPartitioner": "mps_backend.partitioner:MPSPartitioner"},
    "executorch.backends.apple.mps.mps_preprocess": {"MPSBackend": "mps_backend.backend:MPSBackend"},
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the ALIASES modules; each resolves its names from this package on first access."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname not in ALIASES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        names = ALIASES[module.__name__]
        module.__path__ = []  # a package: its submodules are aliases too
        module.__doc__ = f"Alias of mps_backend for old scripts (mps_backend.compat): {', '.join(names)}"
        module.__all__ = sorted(names)

        def getattr_(name: str) -> Any:
            where = names.get(name)
            if where is None:
                raise AttributeError(
                    f"{module.__name__} (an mps_backend alias) has no {name!r}; it provides {', '.join(sorted(names))}"
                )
            mod, _, attr = where.partition(":")
            return getattr(importlib.import_module(mod), attr)

        module.__getattr__ = getattr_  # type: ignore[method-assign]


def install() -> None:
    """Make the old module names importable in this process (idempotent)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())


install()


def main(argv: list[str] | None = None) -> int:
    """``python -m mps_backend.compat SCRIPT [ARGS...]``: run SCRIPT as ``__main__`` with the aliases."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0] + "\n\nusage: python -m mps_backend.compat SCRIPT [ARGS...]")
        return 0 if argv else 2
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
