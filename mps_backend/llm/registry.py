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
    Registration("llama", "mps_backend.llm.export", ("llama",), ()),
    Registration("causal-lm", "mps_backend.llm.export", ("hf", "gguf"), (), "MODEL_FOR_CAUSAL_LM_MAPPING"),
)


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


__all__ = ["ENCODER_DECODER_TYPES", "FAMILIES", "VISION_LANGUAGE_TYPES", "Registration", "model_types", "registration"]
