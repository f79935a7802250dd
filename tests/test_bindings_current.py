"""The committed generated code (flatc bindings, ``schema_info.py``, the typed node classes ``nodes.py``) is
exactly what scripts/generate_bindings.py produces."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "serialization" / "generated"


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_bindings_are_current(tmp_path):
    out = tmp_path / "generated"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_bindings.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    fresh, committed = _files(out), _files(COMMITTED)
    assert {"schema_info.py", "nodes.py", "mpsgraph/MPSGraph.py", "mobile/Module.py"} <= fresh.keys()
    differing = sorted(name for name in fresh.keys() & committed.keys() if fresh[name] != committed[name])
    only_fresh = sorted(fresh.keys() - committed.keys())
    only_committed = sorted(committed.keys() - fresh.keys())
    assert not (differing or only_fresh or only_committed), (
        "serialization/generated/ is stale; run `python scripts/generate_bindings.py`.\n"
        f"differing: {differing}\nmissing from serialization/generated: {only_fresh}\n"
        f"not produced by the script: {only_committed}"
    )
