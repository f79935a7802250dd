"""The options of a language-model export: one frozen :class:`ExportOptions`, validated once when built,
passed whole from the command line (``mps-backend export --model hf:...``) and the Python API
(:func:`mps_backend.llm.export_llm`) to the model's family.

Each option has the name of its flag (``--max-seq-len`` is ``max_seq_len``, ``--prefill-chunk``
``prefill_chunk``, ...) and of the export result's field that reports what it became; the precision is a
:class:`mps_backend.precision.Precision` (``--dtype fp16|fp32``: ``Precision.FP16`` / ``Precision.FP32``;
any other policy, ``Precision.FP16_UNIFORM``, from the Python API). What depends on the model (the cache
length a ``max_seq_len`` of None becomes, the rows a ``prefill_chunk`` may have) is checked by the family
once the model is loaded. The self-check's layer-truncated re-export is ``options.replace(...)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from mps_backend.errors import CheckpointError
from mps_backend.llm.chunking import device_named
from mps_backend.llm.whisper_decoding import TASKS
from mps_backend.precision import Precision
from mps_backend.quantize import HEADS, SCHEMES, Quantization, QuantizationError
from mps_backend.runtime_kernels import DEFAULT_TARGET

#: default KV-cache length (capped by the model's ``max_position_embeddings``)
DEFAULT_MAX_SEQ_LEN = 2048
#: the largest ``--group-size``: beyond any weight's row (the bound of ``hidden_size`` and ``intermediate_size``)
MAX_GROUP_SIZE = 1 << 18
#: ``--dtype`` values -> the precision policy
DTYPES = {"fp16": Precision.FP16, "fp32": Precision.FP32}


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ExportOptions:
    #: how the device computes (``--dtype``); its ``float16`` also says the weights' dtype
    precision: Precision = Precision.FP16
    #: the KV cache's length (``--max-seq-len``); None: 2048 capped by the model's positions
    max_seq_len: int | None = None
    #: rows one delegate call computes (``--prefill-chunk``); None: the family's default (a text model's: the
    #: chunk chosen for ``device``, :mod:`mps_backend.llm.chunking`)
    prefill_chunk: int | None = None
    #: the Apple GPU the prompt chunk is chosen for (``--device``: ``any``, or a device of the cost model's
    #: table as :data:`mps_backend.llm.chunking.DEVICE_CHOICES` spells it, e.g. ``m2``, ``m3-pro``, ``a17-pro``)
    device: str = "any"
    #: Whisper: the language its program's decoding forces (``--language``: a code such as ``fr`` or a name;
    #: None: the generation config's, else detected), for executorch's ASR runner (docs/speech-vision.md)
    language: str | None = None
    #: Whisper: ``transcribe`` or ``translate`` (``--task``; None: the generation config's)
    task: str | None = None
    #: weight-only quantization ``int4`` / ``int8`` (``--quantize``)
    quantize: str | None = None
    #: columns sharing a scale (``--group-size``; 0: one per output channel; None: the scheme's default)
    group_size: int | None = None
    #: the output head under ``quantize`` (``--quantize-head``: ``int8``, ``int4``, ``float``)
    quantize_head: str | None = None
    #: re-round int4 weights already on a finer 4-bit grid (a 4-bit checkpoint's blocks) at ``group_size`` too
    #: (``--allow-requantize``; default: they keep their grid, :func:`mps_backend.quantize.checkpoint_grid`)
    allow_requantize: bool = False
    #: the embedding table int8 with a scale per row (``--quantize-embedding``)
    quantize_embedding: bool = False
    #: decode steps of the self-check after writing (``--verify-steps``; 0: none)
    verify_steps: int = 0
    #: a ``llama:`` checkpoint's ``params.json`` (``--params``; default: beside the checkpoint)
    params: str | None = None
    #: clamp float16 weights beyond ±65504 instead of refusing them (``--clamp-fp16``)
    clamp_fp16: bool = False
    #: the oldest executorch release whose CPU kernels the program may need (``--target-runtime``; None: no check)
    target_runtime: str | None = DEFAULT_TARGET
    #: a missing CPU kernel is a warning, not an error (``--allow-missing-kernels``)
    allow_missing_kernels: bool = False

    def __post_init__(self) -> None:
        """Refuse options no export can honour, in one line each, before anything is read."""
        if not isinstance(self.precision, Precision):
            raise CheckpointError(f"unknown dtype {self.precision!r}: use fp16, fp32 or a Precision")
        if not _count(self.verify_steps) or self.verify_steps < 0:
            raise CheckpointError(f"--verify-steps {self.verify_steps}: give a count of 0 (no check) or more")
        if self.quantize is not None and self.quantize not in SCHEMES:
            raise QuantizationError(f"unknown quantization scheme {self.quantize!r}: use one of {', '.join(SCHEMES)}")
        if self.group_size is not None:
            if not _count(self.group_size) or not 0 <= self.group_size <= MAX_GROUP_SIZE:
                raise CheckpointError(
                    f"--group-size {self.group_size}: give 0 (one scale per output channel) or a group of 1 to "
                    f"{MAX_GROUP_SIZE} columns"
                )
            if not self.quantize:
                raise CheckpointError(f"--group-size {self.group_size} applies to --quantize int4|int8")
        if self.allow_requantize and not self.quantize:
            raise CheckpointError("--allow-requantize applies to --quantize int4|int8")
        if self.quantize_head is not None:
            if not self.quantize:
                raise CheckpointError(f"--quantize-head {self.quantize_head} applies to --quantize int4|int8")
            if self.quantize_head not in HEADS:
                raise QuantizationError(f"--quantize-head {self.quantize_head!r}: use one of {', '.join(HEADS)}")
        if self.max_seq_len is not None and (not _count(self.max_seq_len) or self.max_seq_len < 2):
            raise CheckpointError(f"--max-seq-len must be at least 2, got {self.max_seq_len}")
        if self.prefill_chunk is not None and (not _count(self.prefill_chunk) or self.prefill_chunk < 1):
            raise CheckpointError(f"--prefill-chunk: give a count of at least 1 rows a call, got {self.prefill_chunk!r}")
        if self.task is not None and self.task not in TASKS:
            raise CheckpointError(f"--task {self.task!r}: use one of {', '.join(TASKS)}")
        if self.language is not None and (not isinstance(self.language, str) or not self.language.strip()):
            raise CheckpointError(f"--language {self.language!r}: give a language code such as fr, or a name")
        try:
            device_named(self.device)
        except ValueError as e:
            raise CheckpointError(f"--device: {e}") from None

    @classmethod
    def of(cls, dtype: str | Precision = "fp16", **options) -> ExportOptions:
        """The options from the keyword API: ``dtype`` ``fp16`` / ``fp32`` or a :class:`Precision`, the rest
        by their names."""
        precision = dtype if isinstance(dtype, Precision) else DTYPES.get(dtype) if isinstance(dtype, str) else None
        if precision is None:
            raise CheckpointError(f"unknown dtype {dtype!r}: use fp16 or fp32")
        return cls(precision=precision, **options)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights are loaded in: float16 when the device computes in float16."""
        return torch.float16 if self.precision.float16 else torch.float32

    @property
    def quantization(self) -> Quantization | None:
        """``--quantize`` with its settings as one value (None: no quantization): what the export quantizes
        with and what every eager reference of the export dequantizes alike."""
        if not self.quantize:
            return None
        return Quantization(self.quantize, self.group_size, self.quantize_head, self.allow_requantize)

    def replace(self, **changes) -> ExportOptions:
        """These options with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)


__all__ = ["DEFAULT_MAX_SEQ_LEN", "DTYPES", "MAX_GROUP_SIZE", "ExportOptions"]
