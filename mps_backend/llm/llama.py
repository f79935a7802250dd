"""The ``llama:`` family: a Meta / executorch llama checkpoint (``CHECKPOINT.pth`` with its ``params.json``)
loaded into executorch's example llama (:func:`mps_backend.llm.checkpoint.load_llama`), exported as the
causal LMs are (:mod:`mps_backend.llm.causal`: one ``forward`` method for executorch's LLM runner, the same
self-check), its decode step :class:`mps_backend.llm.decoder.ExecutorchLlamaDecoder` (executorch's own
static KV cache, K stored transposed, grouped attention)."""

from __future__ import annotations

import torch

from mps_backend.llm.causal import CausalLM
from mps_backend.llm.checkpoint import LoadedLM, load_llama
from mps_backend.llm.decoder import ExecutorchLlamaDecoder
from mps_backend.llm.options import DEFAULT_MAX_SEQ_LEN, ExportOptions
from mps_backend.llm.spec import ModelSpec
from mps_backend.llm.swap import Replacements


class Llama(CausalLM):
    """executorch's example llama with its KV cache (its loader checks the cache's size itself)."""

    name = "llama"

    def load(self, spec: ModelSpec, options: ExportOptions, *, progress=None, scratch=None, keep_quantized=False) -> LoadedLM:
        bar = (lambda total: progress.bytes_bar("convert weights", total)) if progress is not None else None
        length = options.max_seq_len or DEFAULT_MAX_SEQ_LEN
        return load_llama(spec.path, options.params, options.dtype, length, clamp_fp16=options.clamp_fp16, bar=bar)

    def check(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> None:
        pass  # load_llama refused a cache beyond the plan budget before building the model

    def decoder(self, lm: LoadedLM, max_seq_len: int, rows: int, changes: Replacements) -> torch.nn.Module:
        return ExecutorchLlamaDecoder(lm.model, max_seq_len, rows, changes).eval()


FAMILY = Llama()

__all__ = ["FAMILY", "Llama"]
