"""Shared pytest fixtures (keep this file tiny)."""
from __future__ import annotations

import pathlib

import pytest

#: the read-only fixtures shared by all worktrees: <repo>/../shared/fixtures
SHARED_FIXTURES = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"


@pytest.fixture(scope="session")
def upstream_pte_dir() -> pathlib.Path:
    """Folder of .pte files lowered by the old upstream MPS lowering (wire-compatibility fixtures)."""
    path = SHARED_FIXTURES / "upstream-pte"
    if not path.is_dir():
        pytest.skip(f"upstream fixtures not found at {path} "
                    "(expected <repo>/../shared/fixtures/upstream-pte)")
    return path
