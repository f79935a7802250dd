"""Load and run programs in another executorch runtime: the compatibility matrix.

    PYTHONPATH=.runtime-et/1.4.0 .venv/bin/python scripts/compat_check.py CASE_DIR   # one JSON per case

(or that runtime's venv Python). For each ``CASE.pte`` in CASE_DIR (written by
tests/test_runtime_matrix.py with executorch 1.5.1):
- ``verifies``: the runtime parses the program with full verification (``InternalConsistency``);
- ``meta``: the forward method's input/output sizes and dtypes as this runtime reads them (a program
  without ``forward``, such as Whisper's: those of each method that takes inputs, by name);
- ``operators_missing``: operators the program names (``CASE.operators.json``, listed by the caller:
  executorch's own deserializer needs ``flatc`` in some releases) that this runtime's registry lacks;
- ``load``: ``ok`` or the runtime's error. MPS delegates run on the emulated device when
  ``mps_backend`` is importable (its shim is built against this runtime's headers and registers
  ``MPSBackend`` in this runtime's registry: ``emulator`` says whether that worked); without it a
  program with MPS delegates stops at "Backend MPSBackend is not registered";
- ``outputs``: with ``CASE.inputs.pt`` (a list of steps, each a list of input tensors for ``forward``,
  or ``{"method": NAME, "inputs": [...]}`` where an input ``{"output_of": K}`` is output 0 of step K,
  as executorch's ASR runner hands the encoder's output to every decoder step), the number of steps
  run through the runtime's own module (``_load_for_executorch_from_buffer``, state such as a KV cache
  kept between steps); the outputs are saved to ``CASE.out-<version>.pt`` for the caller;
- ``refused``: with ``CASE.refused.pt`` (steps run after those), each step's error, or ``ran``.
Only torch, executorch, the standard library and (for the emulator) ``mps_backend.runtime`` are used.
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


def _methods(program) -> list[str]:
    """``forward``, or every method that takes inputs (not the constant metadata methods)."""
    names = [program.get_method_name(i) for i in range(program.num_methods())]
    return ["forward"] if "forward" in names else [n for n in names if program.method_meta(n).num_inputs() > 0]


def _meta(program) -> dict:
    names = _methods(program)
    if names != ["forward"]:
        return {name: _method_meta(program, name) for name in names}
    return _method_meta(program, "forward")


def _method_meta(program, name: str) -> dict:
    meta = program.method_meta(name)
    return {
        "inputs": [
            [list(meta.input_tensor_meta(i).sizes()), str(meta.input_tensor_meta(i).dtype())] for i in range(meta.num_inputs())
        ],
        "outputs": [
            [list(meta.output_tensor_meta(i).sizes()), str(meta.output_tensor_meta(i).dtype())] for i in range(meta.num_outputs())
        ],
    }


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
    plan_ops = set(json.loads(pte.with_name(pte.stem + ".operators.json").read_text()))
    result["operators_missing"] = sorted(plan_ops - registered)
    try:
        for name in _methods(program):
            program.load_method(name)
        result["load"] = "ok"
    except Exception as e:  # noqa: BLE001
        result["load"] = str(e)
        return result
    inputs = pte.with_name(pte.stem + ".inputs.pt")
    if inputs.exists():
        module = runtime._load_for_executorch_from_buffer(data)
        outputs: list[list] = []
        for step in torch.load(inputs):
            method, args = (step["method"], step["inputs"]) if isinstance(step, dict) else ("forward", step)
            args = [outputs[a["output_of"]][0] if isinstance(a, dict) else a for a in args]
            outputs.append(list(module.run_method(method, tuple(args))))
        torch.save(outputs, pte.with_name(f"{pte.stem}.out-{version}.pt"))
        result["outputs"] = len(outputs)
        refused = pte.with_name(pte.stem + ".refused.pt")
        if refused.exists():  # steps the program must refuse (after the steps above, on their state)
            result["refused"] = [_refusal(module, step) for step in torch.load(refused)]
    return result


def _refusal(module, step) -> str:
    """The runtime's error for a step that must fail, or ``ran`` when it did not fail."""
    try:
        module.run_method("forward", tuple(step))
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return "ran"


def _emulate() -> str:
    """Register the emulated MPS delegate in this runtime: ``ok`` or why not."""
    try:
        from mps_backend.runtime.emulator import load_emulator  # noqa: PLC0415

        load_emulator()
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return f"{type(e).__name__}: {e}"
    return "ok" if "MPSBackend" in runtime._get_registered_backend_names() else "not registered"


def main() -> None:
    folder = Path(sys.argv[1])
    version = _version()
    registered = set(runtime._get_operator_names())
    emulator = _emulate()
    for pte in sorted(folder.glob("*.pte")):
        print(json.dumps({**check(pte, version, registered), "emulator": emulator}), flush=True)


if __name__ == "__main__":
    main()
