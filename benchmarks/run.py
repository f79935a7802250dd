"""Run every benchmark in this folder; each prints ratios to a yardstick measured in the same run."""
from __future__ import annotations

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("*.py")):
        if script.name == "run.py":
            continue
        print(f"== {script.stem}", flush=True)
        if subprocess.run([sys.executable, str(script)]).returncode != 0:
            failed.append(script.stem)
    if failed:
        print(f"targets missed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
