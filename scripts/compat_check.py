"""Load programs in another executorch runtime (its venv's Python, or its package first on PYTHONPATH).

    PYTHONPATH=.runtime-et1.4 .venv/bin/python scripts/compat_check.py CASE_DIR   # one JSON object per case

For each ``CASE.pte`` in CASE_DIR (written by tests/test_runtime_matrix.py with executorch 1.5.1):
- ``verifies``: the runtime parses the program with full verification (``InternalConsistency``);
- ``meta``: the forward method's input/output sizes and dtypes as this runtime reads them;
- ``operators_missing``: operators the program names that this runtime's kernel registry lacks;
- ``load``: ``ok`` or the runtime's error; a program with MPS delegates stops at "Backend MPSBackend is
  not registered" (the runtime wheels for 1.0-1.4 link their backend registry into the pybindings
  without exporting ``register_backend``, so the emulated delegate cannot be registered there: the
  delegate itself is checked by the device model, its format unchanged since 0.4);
- ``outputs``: for programs without MPS delegates, the outputs on ``CASE.inputs.pt``, saved to
  ``CASE.out-<version>.pt`` for the caller to compare.
Only torch, executorch and the standard library are used (nothing of mps_backend).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

try:
    from executorch.extension.pybindings import _portable_lib as runtime  # executorch <= 1.4
except ImportError:
    from executorch.extension.pybindings import _C as runtime  # executorch 1.5
import executorch


def _version() -> str:
    try:
        from executorch.version import __version__  # noqa: PLC0415
    except ImportError:
        __version__ = getattr(executorch, "__version__", "unknown")
    return re.sub(r"\+.*", "", __version__)


def _meta(program) -> dict:
    meta = program.method_meta("forward")
    return {"inputs": [[list(meta.input_tensor_meta(i).sizes()), str(meta.input_tensor_meta(i).dtype())]
                       for i in range(meta.num_inputs())],
            "outputs": [[list(meta.output_tensor_meta(i).sizes()), str(meta.output_tensor_meta(i).dtype())]
                        for i in range(meta.num_outputs())]}


def check(pte: Path, version: str, registered: set[str]) -> dict:
    data = pte.read_bytes()
    result: dict = {"case": pte.stem, "runtime": version}
    try:
        program = runtime._load_program_from_buffer(data, program_verification=runtime.Verification.InternalConsistency)
        result["verifies"] = True
    except Exception as e:  # noqa: BLE001 - reported, not raised
        result.update(verifies=False, error=str(e))
        return result
    result["meta"] = _meta(program)
    from executorch.exir._serialize._program import deserialize_pte_binary  # noqa: PLC0415

    plan_ops = {f"{o.name}.{o.overload}" if o.overload else o.name
                for plan in deserialize_pte_binary(data).program.execution_plan for o in plan.operators}
    result["operators_missing"] = sorted(plan_ops - registered)
    try:
        program.load_method("forward")
        result["load"] = "ok"
    except Exception as e:  # noqa: BLE001
        result["load"] = str(e)
        return result
    inputs = pte.with_name(pte.stem + ".inputs.pt")
    if inputs.exists():
        module = runtime._load_for_executorch_from_buffer(data)
        outputs = module.run_method("forward", tuple(torch.load(inputs)))
        torch.save(list(outputs), pte.with_name(f"{pte.stem}.out-{version}.pt"))
        result["outputs"] = len(outputs)
    return result


def main() -> None:
    folder = Path(sys.argv[1])
    version = _version()
    registered = set(runtime._get_operator_names())
    for pte in sorted(folder.glob("*.pte")):
        print(json.dumps(check(pte, version, registered)), flush=True)


if __name__ == "__main__":
    main()
