"""Language models for the MPS delegate: checkpoints on disk -> runner-ready ``.pte``, and greedy
generation with it on the emulated runtime.

    from mps_backend.llm import export_llm, generate
    export_llm("hf:./my-checkpoint", "model.pte", dtype="fp16", max_seq_len=512)
    for piece in generate("model.pte", "./my-checkpoint", "Hello", max_new_tokens=32):
        print(piece, end="", flush=True)

Needs the ``llm`` extra (transformers): ``pip install 'mps-backend[llm]'``.
"""

from __future__ import annotations

from mps_backend._lazy import lazy_attributes
from mps_backend.errors import CheckpointError  # noqa: F401  (public: the refusals of every family)

_LAZY = {
    "export_llm": "export",
    "LLMExportResult": "export",
    "ExportOptions": "options",
    "load_checkpoint": "export",
    "generate": "generate",
    "generate_ids": "generate",
    "iter_tokens": "generate",
    "GenerationStats": "generate",
    "Tokenizer": "generate",
    "generate_with_executorch_runner": "generate",
}

__all__ = sorted([*_LAZY, "CheckpointError"])

__getattr__, _dir = lazy_attributes(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted({*globals(), *_dir()})
