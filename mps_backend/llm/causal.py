"""The causal-LM family: transformers' decoder-only language models from ``hf:FOLDER`` checkpoints and
``gguf:FILE.gguf`` files, exported to executorch's LLM runner (``TextLLMRunner``) as one ``forward`` method.

``forward`` is the static decode step (``tokens [1, 1], input_pos [1]``) or, with ``--prefill-chunk C``, the
chunked prefill-and-decode step (``tokens [1, n], 1 <= n <= C``): :class:`mps_backend.llm.decoder.HFDecoder`,
transformers' own modeling code over a static KV cache (:mod:`mps_backend.llm.decoder`). Its self-check
reads a fixed English prompt and greedy steps against the eager float32 model (:mod:`mps_backend.llm.verify`).
"""

from __future__ import annotations

import torch

from mps_backend.llm.checkpoint import LoadedLM
from mps_backend.llm.decoder import HFDecoder, dynamic_shapes, example_inputs
from mps_backend.llm.family import Family, Method
from mps_backend.llm.gguf import load_gguf
from mps_backend.llm.options import ExportOptions
from mps_backend.llm.spec import ModelSpec
from mps_backend.llm.swap import Replacements
from mps_backend.llm.verify import verify_export


class CausalLM(Family):
    """transformers' ``*ForCausalLM`` models (the registration's fallback: any model type no other family takes)."""

    name = "causal-lm"

    def load(self, spec: ModelSpec, options: ExportOptions, *, progress=None, scratch=None, keep_quantized=False) -> LoadedLM:
        if spec.kind != "gguf":
            return super().load(spec, options, progress=progress, scratch=scratch)
        bar = (lambda total: progress.bytes_bar("load weights", total)) if progress is not None else None
        return load_gguf(
            spec.path, options.dtype, clamp_fp16=options.clamp_fp16, bar=bar, scratch=scratch, keep_quantized=keep_quantized
        )

    def decoder(self, lm: LoadedLM, max_seq_len: int, rows: int, changes: Replacements) -> torch.nn.Module:
        """The ``forward`` module: the static decode step (``rows`` 1) or the chunked prefill-and-decode step."""
        return HFDecoder(lm.model, max_seq_len, rows, changes).eval()

    def methods(self, lm: LoadedLM, max_seq_len: int, rows: int) -> list[Method]:
        def build(changes: Replacements):
            return self.decoder(lm, max_seq_len, rows, changes), example_inputs(chunk=rows), dynamic_shapes(rows)

        return [Method("forward", build)]

    def verify(self, result, spec: str, options: ExportOptions, pte, export):
        return verify_export(result, spec, options, export=export, pte=pte)


FAMILY = CausalLM()

__all__ = ["FAMILY", "CausalLM"]
