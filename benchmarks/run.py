"""Run every benchmark in this folder with its defaults (llm_scale.py: the Llama-3.2-1B and -3B shapes;
device_cost.py: the device cost model's bytes per decode step at the 1B shape, fp16 and int4);
each prints ratios to a yardstick measured in the same run. Exit status 1 when any missed a target."""

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
