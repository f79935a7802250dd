"""The precision policy: how the device computes a program's float values.

One :class:`Precision` object is shared by the partitioner (it travels to ``preprocess`` in the
compile specs), the lowering passes (:func:`mps_backend.passes.precision.assign_device_dtypes` decides
each value's device dtype from it) and the builder (which declares each value in that dtype).

* ``Precision.FP32`` (``use_fp16=False``): every value in the dtype the traced program gives it.
* ``Precision.FP16`` (``use_fp16=True``, the default): float32 weights are stored in float16 and the
  device computes in float16, except where the model computes in float32 on purpose or float16 would
  overflow (docs/architecture.md, Precision; docs/llm.md, Precision):

  - *float32 islands*: values the traced program computes from a float16 -> float32 cast (transformers'
    RMSNorm statistics, softmax, SiLU; soft-caps and RoPE where a model upcasts them) stay float32; so do
    norm statistics (layer norm, group norm, batch statistics, variance, vector norms, mean of squares)
    and softmax in any program: their inputs are cast to float32, their results back where the reader
    computes in float16;
  - *float32 residual*: a float16 value a float32 computation reads is computed in float32 from the
    start, back through elementwise ops as far as they reach (the residual stream up to the matmuls,
    embedding lookups and constants that feed it): the stream's massive activations (tens of thousands,
    past 65,504 in some models) never pass through float16;
  - *rescaled matmuls*: a float16 matmul whose result is read in float32 (the residual branch's
    ``o_proj`` / ``down_proj``) computes ``(x * 2**-k) @ W`` and multiplies its result by ``2**k`` in
    float32: exact (powers of two) in float16's normal range, and a result up to ``65504 * 2**k`` fits.

  ``FP16_UNIFORM`` is the upstream delegate's ``use_fp16``: every float value float16 (no islands); it
  is what a float16 program computed before, kept to measure against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

#: fx node meta key: the device dtype of a node's float results (set by the precision pass)
DEVICE_DTYPE = "mps_dtype"
#: fx node meta key: True on the casts and power-of-two scalings the precision pass inserts (the zoo's
#: node count counts them beside the boundary casts: harness/zoo.py)
PRECISION_INSERTED = "mps_precision_inserted"


@dataclass(frozen=True)
class Precision:
    #: float32 values become float16 (weights stored, values computed), but for the parts below
    float16: bool = True
    #: the model's own float32 computations, norm statistics and softmax stay float32
    float32_islands: bool = True
    #: float16 values a float32 computation reads are computed in float32 (the residual stream)
    float32_residual: bool = True
    #: a float16 matmul read in float32 computes ``(x * 2**-k) @ W`` then ``* 2**k`` in float32; 0: off
    rescale_exponent: int = 5

    FP32: ClassVar[Precision]
    FP16: ClassVar[Precision]
    FP16_UNIFORM: ClassVar[Precision]

    def __post_init__(self) -> None:
        if not 0 <= self.rescale_exponent <= 14:
            raise ValueError(f"rescale_exponent {self.rescale_exponent} outside 0..14 (2**-k must stay a float16 normal)")

    @classmethod
    def of(cls, value: Any) -> Precision:
        """A policy from a Precision or the old ``use_fp16`` boolean (True: FP16, False: FP32)."""
        if isinstance(value, Precision):
            return value
        if isinstance(value, bool):
            return cls.FP16 if value else cls.FP32
        raise TypeError(f"precision must be a Precision or a bool (use_fp16), got {value!r}")

    @property
    def mixed(self) -> bool:
        """float16 with float32 parts (islands or residual)."""
        return self.float16 and (self.float32_islands or self.float32_residual)

    @property
    def name(self) -> str:
        if not self.float16:
            return "fp32"
        if self == Precision.FP16:
            return "fp16"
        if self == Precision.FP16_UNIFORM:
            return "fp16-uniform"
        return f"fp16(islands={int(self.float32_islands)},residual={int(self.float32_residual)},rescale={self.rescale_exponent})"

    def default_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The device dtype of a value of traced dtype ``dtype`` the policy has no particular reason
        to keep: float32 -> float16 in float16 mode; anything else as traced."""
        return torch.float16 if self.float16 and dtype == torch.float32 else dtype

    def encode(self) -> bytes:
        """Four bytes: float16, islands, residual, rescale exponent (the ``mps_precision`` compile spec)."""
        return bytes([int(self.float16), int(self.float32_islands), int(self.float32_residual), self.rescale_exponent])

    @classmethod
    def decode(cls, data: bytes) -> Precision:
        data = bytes(data)
        if len(data) != 4 or any(b > 1 for b in data[:3]):
            raise ValueError(f"compile spec 'mps_precision' must be 4 bytes (3 flags 0/1, an exponent), got {data!r}")
        return cls(bool(data[0]), bool(data[1]), bool(data[2]), data[3])

    def __str__(self) -> str:
        return self.name


Precision.FP32 = Precision(float16=False, float32_islands=False, float32_residual=False, rescale_exponent=0)
Precision.FP16 = Precision()
Precision.FP16_UNIFORM = Precision(float16=True, float32_islands=False, float32_residual=False, rescale_exponent=0)
