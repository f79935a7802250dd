"""The suite's scheduling holds: tests of one ``xdist_group`` run on one pytest-xdist worker (``make test``:
``-n 2 --dist loadgroup``), so that the module and session fixtures they share are built once.

pytest 9.2 computes ``Item.nodeid`` from ``Item._id`` and ignores the ``_nodeid`` that pytest-xdist 3.8.0's
``loadgroup`` sets to the test's id plus ``@group``: every group was silently ignored and each worker built
the shared exports again (the SmolLM2 exports of tests/llm/test_gguf.py ran twice in the run of 9f4faaa,
8 exports instead of 4). pyproject.toml pins pytest to 9.1.1; this test fails on a pair that splits groups.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

TESTS = textwrap.dedent(
    """
    import os, pathlib, pytest

    OUT = pathlib.Path(os.environ["SCHEDULING_OUT"])

    @pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.xdist_group(f"g{g}")) for g in range(4)])
    @pytest.mark.parametrize("member", range(3))
    def test_member(group, member):
        (OUT / f"{group}-{member}").write_text(os.environ["PYTEST_XDIST_WORKER"])
    """
)


def test_a_group_runs_on_one_worker(tmp_path):
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_groups.py").write_text(TESTS)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "suite"],
        cwd=tmp_path,
        env={**os.environ, "SCHEDULING_OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = {}
    for f in out.iterdir():
        workers.setdefault(f.name.split("-")[0], set()).add(f.read_text())
    assert len(workers) == 4 and sum(1 for _ in out.iterdir()) == 12, sorted(p.name for p in out.iterdir())
    split = {g: sorted(w) for g, w in workers.items() if len(w) != 1}
    assert not split, f"xdist groups split over workers (pytest {__import__('pytest').__version__}): {split}"
