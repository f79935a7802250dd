"""A model family: everything the one export loop (:func:`mps_backend.llm.export.export_llm`) asks of the
kind of model it exports. The loop is the same for every model: load, check, quantize, build and export
each method, lower, write, self-check; a :class:`Family` says what each step is for its models.

A family is one module of this package defining ``FAMILY``, an instance of a :class:`Family` subclass, and
one :class:`mps_backend.llm.registry.Registration` (the module's name, the spec kinds and model types it
takes): ``mps_backend.llm.causal`` (transformers' causal LMs, ``hf:`` and ``gguf:``),
``mps_backend.llm.llama`` (``llama:`` checkpoints of executorch's example llama),
``mps_backend.llm.vision`` (vision-language models, executorch's MultimodalRunner) and
``mps_backend.llm.whisper`` (Whisper, executorch's ASR runner). docs/adding-models.md adds one.

What a family provides (the loop calls them in this order):

- :meth:`Family.load`: the eager model in the export's precision (a :class:`~mps_backend.llm.checkpoint.LoadedLM`);
- :meth:`Family.check`: refusals that need the loaded model and the cache length, before anything heavy;
- :meth:`Family.rows`: the rows one call of its decode step computes (``--prefill-chunk``), checked;
- :meth:`Family.quantize_target`: what ``--quantize`` quantizes (and what stays in float);
- :meth:`Family.methods`: the program's methods in export order, each a :class:`Method`: its name and how to
  build its module, example inputs and dynamic shapes (what building it replaces of the model is recorded
  in a :class:`~mps_backend.llm.swap.Replacements` and undone once the method is exported);
- :meth:`Family.metadata`: the constant methods its runner reads (:func:`runner_metadata` builds the LLM
  runners' set);
- :attr:`Family.signature`, :meth:`Family.describe`: what the export summary says of the program;
- :attr:`Family.unplanned_inputs`: methods whose inputs the runner hands in place;
- :meth:`Family.verify`: the self-check of the written program (``--verify-steps``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable

import torch

from mps_backend.errors import CheckpointError
from mps_backend.llm import guards
from mps_backend.llm.checkpoint import LoadedLM, check_kv_cache_size, load_hf
from mps_backend.llm.chunking import ChunkChoice, choose, model_shape
from mps_backend.llm.decoder import cache_layout, check_chunk
from mps_backend.llm.options import ExportOptions
from mps_backend.llm.spec import ModelSpec
from mps_backend.llm.swap import Replacements
from mps_backend.progress import Progress

#: what building a method gives: its module, example inputs, and dynamic shapes (None: static)
Built = tuple[torch.nn.Module, tuple, Any]


@dataclass(frozen=True)
class Method:
    """One method of the program: its name (what the runner calls) and ``build(changes)``, which builds its
    module, example inputs and dynamic shapes, recording what it replaces of the model in ``changes``."""

    name: str
    build: Callable[[Replacements], Built]


def runner_metadata(lm: LoadedLM, *, rows: int, context: int, dynamic: bool, extra: dict[str, Any] | None = None) -> dict:
    """The constant methods executorch's LLM runners read (``extension/llm/runner``), as executorch's own llama
    export writes them: ``get_max_seq_len`` the rows one call takes (the runner prefills that many a call),
    ``get_max_context_len`` the cache's length (the runner stops there), ``enable_dynamic_shape`` whether a
    call takes fewer rows than that; ``extra`` a family's own, then the BOS and EOS ids."""
    meta: dict[str, Any] = {
        "get_max_seq_len": rows,
        "get_max_context_len": context,
        "get_vocab_size": lm.vocab_size,
        "get_n_layers": lm.n_layers,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False,
        "enable_dynamic_shape": dynamic,
        **(extra or {}),
    }
    if lm.bos_id is not None:
        meta["get_bos_id"] = lm.bos_id
    if lm.eos_ids:
        meta["get_eos_ids"] = list(lm.eos_ids)
    return meta


def check_transformers_model(lm: LoadedLM, max_seq_len: int) -> None:
    """What a transformers model's decode step would allocate, refused before it is: the KV cache beyond the
    program's memory plan, recurrent states beyond their bound."""
    cfg = lm.model.config.get_text_config() if hasattr(lm.model.config, "get_text_config") else lm.model.config
    kv, k_cols, v_cols = cache_layout(lm.model, cfg)
    check_kv_cache_size(lm.n_layers, kv, (k_cols + v_cols) / 2, max_seq_len, lm.dtype)
    guards.check_state_sizes(lm.model, cfg, lm.dtype)  # recurrent states, before the decode step allocates them


def chunk_rows(options: ExportOptions, max_seq_len: int, default: int = 1) -> int:
    """``--prefill-chunk`` (``default`` when not given) checked against the cache's length."""
    try:
        return check_chunk(default if options.prefill_chunk is None else options.prefill_chunk, max_seq_len)
    except ValueError as e:
        raise CheckpointError(f"--prefill-chunk: {e}") from None


class Family(abc.ABC):
    """The protocol of a model family (the module doc); the defaults are a decoder-only language model's."""

    #: its registration's name (mps_backend.llm.registry)
    name = ""
    #: the program's static signatures, as the export summary states them
    signature = "decode step tokens [1, 1], input_pos [1]"
    #: methods whose inputs the caller's tensors are used for in place, not copied into the program's memory
    unplanned_inputs: tuple[str, ...] = ()
    #: what ``--quantize`` leaves in float, as the summary's note adds it ("" : nothing)
    quantize_rest = ""
    #: whether its program takes ``--language`` and ``--task`` (Whisper's decoding rules)
    takes_language = False

    def load(
        self, spec: ModelSpec, options: ExportOptions, *, progress: Progress | None = None, scratch=None, keep_quantized=False
    ) -> LoadedLM:
        """The eager model of ``spec`` in the precision of ``options`` (weights converted into ``scratch``
        files when given; ``progress``: the loading's byte bar): an ``hf:`` folder's transformers model, of
        the class its registration's auto mapping names (:func:`mps_backend.llm.checkpoint.load_hf`).
        ``keep_quantized``: a file's quantized tensors kept as they are where the family can (``gguf:``;
        the export asks for it without ``--quantize``)."""
        bar = (lambda total: progress.bytes_bar("load weights", total)) if progress is not None else None
        return load_hf(spec.path, options.dtype, clamp_fp16=options.clamp_fp16, bar=bar, scratch=scratch)

    def check(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> None:
        """Refuse, before anything heavy is done, what this family cannot export of ``lm`` as asked: a
        transformers model's KV cache or recurrent states beyond their bounds (:func:`check_transformers_model`)."""
        check_transformers_model(lm, max_seq_len)

    def rows(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> int:
        """The rows one call of the decode step computes (``--prefill-chunk``; 1: the static one-token step;
        not given: the chunk :meth:`chunk_choice` chooses for ``--device``)."""
        choice = self.chunk_choice(lm, options, max_seq_len)
        return choice.chunk if choice is not None else chunk_rows(options, max_seq_len)

    def chunk_choice(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> ChunkChoice | None:
        """Without ``--prefill-chunk``, the chunk chosen for ``--device`` from an estimate of the model's calls
        (:mod:`mps_backend.llm.chunking`); None when the chunk was given (or the family fixes its rows)."""
        if options.prefill_chunk is not None:
            return None
        dtype_bytes = 2 if options.precision.float16 else 4
        shape = model_shape(
            lm.model, cache=max_seq_len, layers=lm.n_layers, element_bytes=dtype_bytes, quantization=options.quantization
        )
        return choose(shape, options.device)

    def quantize_target(self, lm: LoadedLM) -> torch.nn.Module:
        """What ``--quantize`` quantizes: the weights every decode step reads."""
        return lm.model

    @abc.abstractmethod
    def methods(self, lm: LoadedLM, max_seq_len: int, rows: int) -> list[Method]:
        """The program's methods in export order."""
        raise NotImplementedError

    def metadata(self, lm: LoadedLM, max_seq_len: int, rows: int) -> dict[str, Any]:
        """The constant methods of the program (the runner's metadata)."""
        return runner_metadata(lm, rows=rows if rows > 1 else max_seq_len, context=max_seq_len, dynamic=rows > 1)

    def dynamic(self, rows: int) -> bool:
        """Whether the program has dynamic shapes (left on CPU by the partitioner: a chunk's padding, positions
        and row slices have the prompt's length)."""
        return rows > 1

    def describe(self, max_seq_len: int, rows: int) -> str:
        """The summary's line of the cache and the rows a call computes."""
        if rows == 1:
            return f"{max_seq_len} (static shapes: {self.signature})"
        return (
            f"{max_seq_len} (KV cache; forward tokens [1, n], 1 <= n <= {rows}, input_pos [1]: the device computes "
            f"{rows} rows per call)"
        )

    @abc.abstractmethod
    def verify(self, result: Any, spec: str, options: ExportOptions, pte, export: Callable) -> Any:
        """The self-check of the program written to ``pte`` (:class:`mps_backend.llm.verify.LLMVerification`);
        ``export(spec, path, params)`` exports a layer-truncated copy (its ``spec`` and ``params.json``) with the
        export's options."""
        raise NotImplementedError


__all__ = ["Built", "Family", "Method", "check_transformers_model", "chunk_rows", "runner_metadata"]
