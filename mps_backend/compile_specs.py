"""Compile specs of the MPS delegate: how the partitioner's :class:`~mps_backend.precision.Precision`
reaches ``preprocess``.

``use_fp16`` (one byte, bool; default on) is the upstream backend's key: 1 is ``Precision.FP16``, 0
``Precision.FP32``. ``mps_precision`` (four bytes, :meth:`Precision.encode`) carries any other policy
(``Precision.FP16_UNIFORM``, a rescale exponent ...); when both are given they must agree on float16.
Unknown keys are an error, not silently ignored."""

from __future__ import annotations

from typing import Iterable

from executorch.exir.backend.compile_spec_schema import CompileSpec

from mps_backend.precision import Precision

USE_FP16 = "use_fp16"
PRECISION = "mps_precision"


def fp16_spec(use_fp16: bool) -> CompileSpec:
    return CompileSpec(USE_FP16, bytes([1 if use_fp16 else 0]))


def precision_specs(precision: Precision) -> list[CompileSpec]:
    """The compile specs that carry ``precision`` (``use_fp16`` alone for FP16 and FP32)."""
    specs = [fp16_spec(precision.float16)]
    if precision not in (Precision.FP16, Precision.FP32):
        specs.append(CompileSpec(PRECISION, precision.encode()))
    return specs


def parse(compile_specs: Iterable[CompileSpec] | None) -> Precision:
    """The precision policy ``compile_specs`` describe; ValueError on anything else."""
    use_fp16, policy = None, None
    for spec in compile_specs or ():
        value = bytes(spec.value)
        if spec.key == USE_FP16:
            if len(value) != 1 or value[0] not in (0, 1):
                raise ValueError(f"compile spec {USE_FP16!r} must be one byte 0 or 1, got {value!r}")
            use_fp16 = bool(value[0])
        elif spec.key == PRECISION:
            policy = Precision.decode(value)
        else:
            raise ValueError(f"unknown MPS compile spec {spec.key!r} (the keys are {USE_FP16!r} and {PRECISION!r})")
    if policy is None:
        return Precision.of(True if use_fp16 is None else use_fp16)
    if use_fp16 is not None and use_fp16 != policy.float16:
        raise ValueError(f"compile specs {USE_FP16!r} ({int(use_fp16)}) and {PRECISION!r} ({policy}) disagree")
    return policy
