"""Type-check the lowering side with mypy: ``python scripts/typecheck.py [extra mypy arguments]``.

Checked: the ``operators`` and ``serialization`` packages (not ``serialization/generated``, the flatc
bindings) and the pipeline modules of ``mps_backend`` (``PIPELINE`` below). The configuration is the
``[tool.mypy]`` sections of pyproject.toml. The exit status is mypy's.

The installed package maps import names with setuptools ``package-dir`` (``mps_backend.operators`` is
./operators, ``mps_backend.serialization`` is ./serialization), which an editable install resolves with
an import hook that mypy cannot follow. So mypy runs in a temporary tree of symlinks laid out as the
installed package: ``mps_backend/<each entry of ./mps_backend>``, ``mps_backend/operators``,
``mps_backend/serialization``. The cache stays in the repository (.mypy_cache, ignored by git), so a
second run only re-checks what changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "mps_backend"

# Packages of mps_backend that live outside ./mps_backend (setuptools package-dir), checked whole.
MAPPED = {"operators": ROOT / "operators", "serialization": ROOT / "serialization"}

# The pipeline: the mps_backend modules that take an exported program to an MPS delegate blob. A module
# may be a file (checked with -m) or a package (checked with -p, whole).
PIPELINE = ["backend", "partitioner", "builder", "pages", "simplify", "passes", "compile_specs", "dtypes", "errors"]


def build_tree(dest: Path) -> Path:
    """Lay out ``dest/mps_backend`` as the installed package, with symlinks; return ``dest``."""
    pkg = dest / PACKAGE
    pkg.mkdir()
    for entry in sorted((ROOT / PACKAGE).iterdir()):
        if entry.name in MAPPED or entry.name == "__pycache__":
            continue
        (pkg / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    for name, real in MAPPED.items():
        (pkg / name).symlink_to(real, target_is_directory=True)
    return dest


def targets() -> list[str]:
    """mypy's -p/-m arguments: the mapped packages, then each pipeline module as a package or a module."""
    args: list[str] = []
    for name in MAPPED:
        args += ["-p", f"{PACKAGE}.{name}"]
    for name in PIPELINE:
        base = ROOT / PACKAGE / name
        if base.is_dir():
            args += ["-p", f"{PACKAGE}.{name}"]
        elif base.with_suffix(".py").is_file():
            args += ["-m", f"{PACKAGE}.{name}"]
        else:
            raise SystemExit(f"typecheck: pipeline module {PACKAGE}.{name} is neither {name}.py nor {name}/")
    return args


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="mps-typecheck-") as tmp:
        tree = build_tree(Path(tmp))
        cmd = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            *targets(),
            *argv,
        ]
        env = dict(os.environ)
        env.pop("MYPYPATH", None)  # the tree alone decides where mps_backend is
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(repo_path(line))
        return proc.wait()


def repo_path(line: str) -> str:
    """mypy names files relative to the tree (mps_backend/operators/x.py); name them as in the repo (operators/x.py)."""
    for name in MAPPED:
        if line.startswith(f"{PACKAGE}/{name}/"):
            return line[len(PACKAGE) + 1 :]
    return line


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
