"""Lazy public names for a package: ``name -> submodule``, imported on first attribute access."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_attributes(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(``__getattr__``, ``__dir__``) for ``package`` whose public ``names`` live in submodules."""

    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def dir_() -> list[str]:
        return sorted(names)

    return getattr_, dir_
