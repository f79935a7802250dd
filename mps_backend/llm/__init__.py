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

_LAZY = {
    "export_llm": "export",
    "LLMExportResult": "export",
    "load_checkpoint": "export",
    "CheckpointError": "checkpoint",
    "generate": "generate",
    "generate_ids": "generate",
    "iter_tokens": "generate",
    "GenerationStats": "generate",
    "Tokenizer": "generate",
    "generate_with_executorch_runner": "generate",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
