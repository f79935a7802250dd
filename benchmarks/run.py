"""Run every benchmark in this folder with its defaults (llm_scale.py: the Llama-3.2-1B and -3B shapes;
device_cost.py: the device cost model's bytes per decode step at the 1B shape, fp16 and int4, then
with ``--archs`` over every architecture of tests/llm/test_export.py, ~6 minutes; gguf_memory.py: loading a
synthetic 1B GGUF, against transformers' own loader; llm_quality.py: SmolLM2-135M-Instruct's perplexity
on the README's prose per precision, against eager bfloat16's); each prints ratios to a yardstick
measured in the same run. Exit status 1 when any missed a target."""

from __future__ import annotations

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent
#: a script run more than once: the argument lists of its runs (others: once, no arguments)
RUNS = {"device_cost": [[], ["--archs"]]}


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("*.py")):
        if script.name == "run.py":
            continue
        for args in RUNS.get(script.stem, [[]]):
            name = " ".join([script.stem, *args])
            print(f"== {name}", flush=True)
            if subprocess.run([sys.executable, str(script), *args]).returncode != 0:
                failed.append(name)
    if failed:
        print(f"targets missed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
