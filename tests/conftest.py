"""Shared pytest fixtures and the scheduling of tests over pytest-xdist workers."""

from __future__ import annotations

import collections
import os
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


def pytest_configure(config):
    """A pytest-xdist worker computes on its share of the cores: ``cpu_count // workers`` torch threads
    (1 each for ``make test``'s 2 workers on 2 cores), also for the subprocesses it starts
    (``OMP_NUM_THREADS``). Two workers of 2 OpenMP threads each on 2 cores wait on each other's spinning
    threads: a small batched matmul took 1.5 ms instead of 11 us (the attention of the LLM tests).
    An ``OMP_NUM_THREADS`` set by the caller is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers and "OMP_NUM_THREADS" not in os.environ:
        import torch  # noqa: PLC0415

        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    # pytest-xdist's --loadscope-reorder (its default) may sort the groups by test count before handing them
    # out, which would put the smollm2 group (13 tests, the most CPU) after groups of more, cheaper tests: off,
    # so that the order of pytest_collection_modifyitems below (that sort, EARLY_GROUPS first) is the one used
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.fixture(scope="session")
def tokenizer():
    """The LLM tests' byte-level BPE tokenizer (``tests/llm_helpers.py``, 20 ms to train). Defined here: a
    shared fixture of a test file makes that file one xdist group, run on one worker, and the exports of
    tests/llm/test_export.py and tests/llm/test_decoder.py (one per test) share nothing but this."""
    from tests.llm_helpers import train_tokenizer  # noqa: PLC0415

    return train_tokenizer()


#: test files whose tests share a module-level cache (functools.cache) rather than a fixture -> the test
#: parameters its key is made of (tests/test_zoo.py: one export per case and precision)
_SHARED_CACHES = {"test_zoo.py": ("case", "precision")}
#: xdist groups run first, by name or name prefix (``smollm2-whole-layers``): the real-model tests
#: (tests/llm/test_gguf.py, one group per file SmolLM2 is exported from, so that the four exports, the most CPU of
#: the suite, share both workers)
EARLY_GROUPS = ("smollm2",)


def _shared(item) -> str | None:
    """What the test shares with other tests of its file, as a group name, or None: the class/module/
    package/session fixtures of a test file it uses (not pytest's own, not this file's: those are cheap),
    each with the index of its parameter when parametrized; or, in a file of ``_SHARED_CACHES``, the
    parameters its cache key is made of."""
    callspec = getattr(item, "callspec", None)
    params, indices = (callspec.params, callspec.indices) if callspec else ({}, {})
    keys = _SHARED_CACHES.get(item.path.name)
    if keys is not None:
        return "-".join(str(params[k]) for k in keys) if all(k in params for k in keys) else None
    info = getattr(item, "_fixtureinfo", None)
    here = pathlib.Path(__file__)
    names = sorted(
        name
        for name, defs in (info.name2fixturedefs.items() if info else ())
        if any(
            d.scope != "function" and here.parent in (path := pathlib.Path(d.func.__code__.co_filename)).parents and path != here
            for d in defs
            if getattr(d.func, "__code__", None) is not None
        )
    )
    return ",".join(f"{n}[{indices[n]}]" if n in indices else n for n in names) or None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (``make test``: ``-n 2 --dist loadgroup``)
def pytest_collection_modifyitems(config, items):
    """Scheduling: tests that share a cached preparation run one after the other on one worker.

    - op-table rows (a ``row`` parameter under tests/ops): a row's tests (op table per precision,
      whole-program path) are ordered together and form one xdist group, so they share the row's
      export and lowerings (``tests/ops/harness.py``: ``prepared``, ``lower``);
    - a test using fixtures wider than a function defined in its own file or folder (a module- or
      session-scoped export shared by the file's tests): one group per file and set of such fixtures
      (per parameter of a parametrized one), so each is built once, on one worker; in a file of
      ``_SHARED_CACHES``, one group per cache key;
    - every other test: no group (spread one by one over the workers).

    Order (pytest-xdist hands the work out in this order, its own reorder off: ``pytest_configure``): the
    groups of ``EARLY_GROUPS`` first, then the tests marked ``long`` (the longest of no group: one of them last
    would end the run on one worker while the other waits, 41 s at 740276a), then the groups by test count, most
    first, then the other tests of no group, each in collection order: the longest units start first and the
    short ones fill the end.

    A test marked ``@pytest.mark.targets("aten.gather.default", ...)`` is selected by ``-k`` on any
    part of those names, like the op-table rows named after their target.
    """
    first: dict = {}
    keyed = []
    for pos, item in enumerate(items):
        for mark in item.iter_markers("targets"):  # ``pytest -k index_put`` selects these tests too
            item.extra_keyword_matches.update(mark.args)
        row = getattr(getattr(item, "callspec", None), "params", {}).get("row")
        rid = getattr(row, "id", None)
        if rid is not None and item.path.parent.name == "ops":
            first.setdefault(rid, pos)
            group, key = f"op-row-{rid}", first[rid]
        else:
            shared = _shared(item)
            group, key = (None if shared is None else f"{item.path}::{shared}"), pos
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        mark = item.get_closest_marker("xdist_group")
        name = str(mark.args[0]) if mark is not None and mark.args else None
        keyed.append((name, key, pos, item))
    sizes = collections.Counter(name for name, *_ in keyed if name is not None)
    starts: dict = {}
    for name, key, *_ in keyed:
        starts.setdefault(name, key)

    def order(entry) -> tuple:
        name, key, pos, item = entry
        if name is None:
            return (1 if item.get_closest_marker("long") else 3, 0, 0, key, pos)
        return (0 if name.split("-")[0] in EARLY_GROUPS else 2, -sizes[name], starts[name], key, pos)

    items[:] = [entry[-1] for entry in sorted(keyed, key=order)]
