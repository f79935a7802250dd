"""Shared pytest fixtures and the scheduling of tests over pytest-xdist workers."""

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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (``make test``: ``-n 2 --dist loadgroup``)
def pytest_collection_modifyitems(config, items):
    """Scheduling: tests that share a cached preparation run one after the other on one worker.

    - op-table rows (a ``row`` parameter under tests/ops): a row's tests (op table per precision,
      whole-program path) are ordered together and form one xdist group, so they share the row's
      export and lowerings (``tests/ops/harness.py``: ``prepared``, ``lower``);
    - every other test: one group per file, so module- and session-scoped fixtures (exports shared
      by a file's tests) are built once, on one worker.
    """
    first: dict = {}
    keyed = []
    for pos, item in enumerate(items):
        row = getattr(getattr(item, "callspec", None), "params", {}).get("row")
        rid = getattr(row, "id", None)
        if rid is not None and item.path.parent.name == "ops":
            first.setdefault(rid, pos)
            group, key = f"op-row-{rid}", first[rid]
        else:
            group, key = item.path.name, pos
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        keyed.append((key, pos, item))
    items[:] = [item for _, _, item in sorted(keyed, key=lambda k: k[:2])]
