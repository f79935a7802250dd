"""Shared pytest fixtures and the end-of-run hook (keep this file tiny)."""
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


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the process as soon as pytest has reported everything, without Python's interpreter
    finalization. A clean-clone CI run once died with SIGSEGV after printing "1398 passed": a crash
    while native libraries (torch, the executorch pybindings and the kernels they registered) tore
    down at exit, not in any test, and not reproducible on rerun. The exit status stays pytest's own;
    a crash during a test still kills the run (and pytest's faulthandler prints where)."""
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None:  # pytest stopped before the session ran (usage error, --help): exit normally
        return
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


_EXIT_STATUS = pytest.StashKey[int]()
