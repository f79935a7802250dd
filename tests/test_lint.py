"""The code passes the project's linters, so CI's test command checks them (``make lint`` runs the same three):
ruff's checks and its formatting (configured in pyproject.toml) and mypy on operators/, serialization/ and
the pipeline (scripts/typecheck.py, configured by pyproject.toml's [tool.mypy] sections)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 600  # a cold mypy run checks the pipeline's modules with numpy's stubs; the machine may be shared


def _ruff() -> str:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is part of the test extra (pip install -e '.[test]')"
    return ruff


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)


def test_ruff_is_clean():
    r = _run([_ruff(), "check", "--output-format", "concise", "."])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_is_clean():
    r = _run([_ruff(), "format", "--check", "."])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_mypy_is_clean():
    assert importlib.util.find_spec("mypy"), "mypy is part of the test extra (pip install -e '.[test]')"
    r = _run([sys.executable, str(ROOT / "scripts" / "typecheck.py")])
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]


def test_the_pipeline_never_imports_the_tooling():
    """mps_backend/tools/ drives the pipeline (CLI, zoo, suite flow, ...); nothing else imports it."""
    import ast

    offenders = []
    for folder in ("mps_backend", "operators", "serialization"):
        for path in (ROOT / folder).rglob("*.py"):
            if "tools" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                if any(n == "mps_backend.tools" or n.startswith("mps_backend.tools.") for n in names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


def test_the_repository_tracks_no_symlinks_and_no_build_folders():
    """A clean clone must not carry links to one machine's folders: a tracked `.runtime-et` link once pointed
    at a developer's checkout and made `make test` fail on CI with "Too many levels of symbolic links"."""
    if not (ROOT / ".git").exists():
        return  # an sdist or installed copy has no history to check
    r = _run(["git", "ls-files", "-s"])
    assert r.returncode == 0, r.stderr
    links = [line.split("\t", 1)[1] for line in r.stdout.splitlines() if line.startswith("120000 ")]
    assert not links, f"tracked symlinks: {links}"
    generated = (".venv", ".runtime-et", ".venv-et1.4", ".pytest_cache")
    tracked = [p for p in r.stdout.splitlines() if p.split("\t", 1)[1].split("/", 1)[0] in generated]
    assert not tracked, f"tracked generated files: {tracked[:5]}"
