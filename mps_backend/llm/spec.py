"""Language-model specs, parsed in one place (``mps-backend export --model SPEC``, ``export_llm(SPEC)``,
the self-check, the benchmarks):

- ``hf:FOLDER``: a Hugging Face checkpoint folder (``config.json``, ``*.safetensors``, tokenizer files);
- ``gguf:FILE.gguf``: one GGUF file as llama.cpp and Ollama use it (weights, config and tokenizer in it);
- ``llama:CHECKPOINT.pth``: a Meta / executorch llama checkpoint with its ``params.json``.
"""

from __future__ import annotations

from typing import NamedTuple

from mps_backend.errors import CheckpointError

#: spec kind -> what follows the colon
KINDS = {"hf": "FOLDER", "gguf": "FILE.gguf", "llama": "CHECKPOINT.pth"}
#: how the specs read in help texts and errors
USAGE = " or ".join(f"{kind}:{what}" for kind, what in KINDS.items())


class ModelSpec(NamedTuple):
    kind: str  # a key of KINDS
    path: str


def is_llm_spec(spec: str) -> bool:
    """Whether ``spec`` names a language-model checkpoint (its prefix is one of :data:`KINDS`)."""
    return spec.partition(":")[0] in KINDS


def parse_model_spec(spec: str) -> ModelSpec:
    """``hf:FOLDER``, ``gguf:FILE.gguf`` or ``llama:CHECKPOINT.pth`` -> (kind, path)."""
    kind, sep, path = spec.partition(":")
    if not sep or kind not in KINDS or not path:
        raise CheckpointError(f"not a language-model spec: {spec!r} (use {USAGE})")
    return ModelSpec(kind, path)
