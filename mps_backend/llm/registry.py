"""The model families: which family adapter exports a checkpoint of a given kind and model type.

Each family is one module of this package defining ``FAMILY``, an :class:`mps_backend.llm.family.Family`
(its methods with their example inputs, its runner metadata, what ``--quantize`` touches, its rows
check, its self-check), and one :class:`Registration` in :data:`FAMILIES`: the module's name, the spec
kinds and model types it takes, and the transformers auto mapping its ``hf:`` models are built from.
The first registration that takes a checkpoint exports it; the last takes every other model type of
its kinds (transformers' causal LMs). docs/adding-models.md adds one.

This module is data only (it imports nothing of the package): the folder check and the loaders read
the model types and mappings here before any family module is imported; the export imports the
family's module by its name (:func:`mps_backend.llm.export.family_for`).
"""

from __future__ import annotations

from typing import NamedTuple


class Registration(NamedTuple):
    #: the family's name, as the export summary and errors say it
    name: str
    #: the module defining ``FAMILY``
    module: str
    #: the spec kinds it takes (mps_backend.llm.spec.KINDS)
    kinds: tuple[str, ...]
    #: the model types it takes; empty: every model type of its kinds no registration before it takes
    model_types: tuple[str, ...]
    #: the transformers auto mapping (``transformers.models.auto.modeling_auto``) its ``hf:`` models come from
    transformers_mapping: str | None = None


FAMILIES = (
    Registration("speech", "mps_backend.llm.whisper", ("hf",), ("whisper",), "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING"),
    Registration(
        "vision-language",
        "mps_backend.llm.vision",
        ("hf",),
        ("gemma3", "llava", "smolvlm"),
        "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING",
    ),
    Registration("llama", "mps_backend.llm.llama", ("llama",), ()),
    Registration("causal-lm", "mps_backend.llm.causal", ("hf", "gguf"), (), "MODEL_FOR_CAUSAL_LM_MAPPING"),
)


#: the transformers ``model_type`` values the tests export (tiny random checkpoints: tests/llm/test_export.py's families,
#: tests/llm/test_decoder.py's table, tests/llm/test_prefill.py's cases, the vision-language families, Whisper;
#: tests/llm/test_family.py checks the list against them); a checkpoint of another type gets a note
TESTED_MODEL_TYPES = (
    "afmoe", "apertus", "arcee", "cohere", "cohere2", "deepseek_v2", "deepseek_v3", "diffllama", "ernie4_5", "exaone4",
    "falcon", "falcon_h1", "gemma", "gemma2", "gemma3", "gemma3_text", "glm", "glm4", "glm4_moe_lite", "gpt2", "gpt_neox",
    "gpt_oss", "granite", "granitemoe", "granitemoehybrid", "helium", "hunyuan_v1_dense", "lfm2", "llama", "llama4_text",
    "llava", "minicpm3", "mistral", "mixtral", "olmo", "olmo2", "olmo3", "olmo_hybrid", "olmoe", "opt", "persimmon", "phi",
    "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_5_text", "qwen3_moe", "qwen3_next", "seed_oss", "smollm3", "smolvlm",
    "stablelm", "starcoder2", "whisper",
)  # fmt: skip


def registration(kind: str, model_type: str | None) -> Registration:
    """The registration that exports a ``kind:`` checkpoint of ``model_type``."""
    for reg in FAMILIES:
        if kind in reg.kinds and (not reg.model_types or model_type in reg.model_types):
            return reg
    raise KeyError(f"no model family takes {kind}: checkpoints")  # every kind has a fallback: a bug


def model_types(name: str) -> tuple[str, ...]:
    """The model types family ``name`` takes."""
    return next(reg.model_types for reg in FAMILIES if reg.name == name)


#: transformers model types exported to executorch's MultimodalRunner (mps_backend.llm.vision)
VISION_LANGUAGE_TYPES = model_types("vision-language")
#: encoder-decoder model types exported (to executorch's ASR runner: mps_backend.llm.whisper)
ENCODER_DECODER_TYPES = model_types("speech")


__all__ = [
    "ENCODER_DECODER_TYPES",
    "FAMILIES",
    "TESTED_MODEL_TYPES",
    "VISION_LANGUAGE_TYPES",
    "Registration",
    "model_types",
    "registration",
]
