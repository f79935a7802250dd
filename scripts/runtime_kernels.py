"""Write mps_backend/data/runtime_kernels.json: the CPU kernels each executorch runtime release registers.

For every release tag of an executorch git checkout (the releases that ship the MPS delegate runtime,
1.0.x-1.4.x): the operators of its portable kernel library (``kernels/portable/functions.yaml``), its
quantized kernel library (``kernels/quantized/quantized.yaml``) and its prim ops
(``kernels/prim_ops/register_prim_ops.cpp``: the symbolic-size and scalar ops every runtime has). These
are what an app links when it builds executorch with its standard kernel libraries; the export-time
check (``mps_backend.runtime_kernels``) refuses a program whose CPU part needs an operator the target
release lacks, which would otherwise fail only when the app loads it.

    python scripts/runtime_kernels.py --repo PATH/TO/executorch   # a clone with its release tags

Run by hand when a release is added; the JSON is committed (nothing is read from the network or from
the checkout at export or test time).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import yaml

RELEASES = ("v1.0.0", "v1.0.1", "v1.1.0", "v1.2.0", "v1.3.0", "v1.3.1", "v1.4.0", "v1.4.1")
OUT = Path(__file__).resolve().parents[1] / "mps_backend" / "data" / "runtime_kernels.json"


def _show(repo: Path, tag: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{tag}:{path}"], check=True, capture_output=True, text=True).stdout


def _yaml_ops(text: str) -> list[str]:
    ops = set()
    for entry in yaml.safe_load(text) or ():
        name = entry.get("op") or (entry.get("func") or "").split("(")[0]
        if name:
            ops.add(name if "::" in name else f"aten::{name}")
    return sorted(ops)


def _prim_ops(text: str) -> list[str]:
    return sorted(set(re.findall(r'"((?:aten|executorch_prim)::[A-Za-z0-9_.]+)"', text)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, type=Path, help="an executorch git checkout with release tags")
    args = parser.parse_args()
    data = {}
    for tag in RELEASES:
        data[tag.lstrip("v")] = {
            "portable": _yaml_ops(_show(args.repo, tag, "kernels/portable/functions.yaml")),
            "quantized": _yaml_ops(_show(args.repo, tag, "kernels/quantized/quantized.yaml")),
            "prim": _prim_ops(_show(args.repo, tag, "kernels/prim_ops/register_prim_ops.cpp")),
        }
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}: " + ", ".join(f"{v} ({sum(map(len, d.values()))} operators)" for v, d in data.items()))


if __name__ == "__main__":
    main()
