"""Shared pytest fixtures (keep this file tiny)."""

from __future__ import annotations

import pathlib

import pytest

#: fixtures kept in the repository: tests/fixtures (README.md there says what each is)
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def upstream_pte_dir() -> pathlib.Path:
    """Folder of .pte files lowered by the old upstream MPS lowering (wire-compatibility fixtures)."""
    path = FIXTURES / "upstream-pte"
    assert path.is_dir(), f"wire-compatibility fixtures missing at {path}"
    return path
