"""Compile specs of the MPS delegate. The only key is ``use_fp16`` (one byte, bool; default on),
as the upstream backend defined it. Unknown keys are an error, not silently ignored."""

from __future__ import annotations

from typing import Iterable

from executorch.exir.backend.compile_spec_schema import CompileSpec

USE_FP16 = "use_fp16"


def fp16_spec(use_fp16: bool) -> CompileSpec:
    return CompileSpec(USE_FP16, bytes([1 if use_fp16 else 0]))


def parse(compile_specs: Iterable[CompileSpec] | None) -> bool:
    """Return use_fp16 from ``compile_specs``; raise ValueError on anything else."""
    use_fp16 = True
    for spec in compile_specs or ():
        if spec.key != USE_FP16:
            raise ValueError(f"unknown MPS compile spec {spec.key!r} (the only key is {USE_FP16!r})")
        value = bytes(spec.value)
        if len(value) != 1 or value[0] not in (0, 1):
            raise ValueError(f"compile spec {USE_FP16!r} must be one byte 0 or 1, got {value!r}")
        use_fp16 = bool(value[0])
    return use_fp16
