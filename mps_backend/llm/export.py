"""Language model checkpoint on disk -> runner-ready ``.pte`` for the MPS delegate.

    from mps_backend.llm import export_llm
    result = export_llm("hf:./SmolLM2-135M", "smollm2.pte", dtype="fp16", max_seq_len=1024)
    print(result.summary())

What the ``.pte`` holds (see :mod:`mps_backend.llm.decoder`): ``forward(tokens [1, 1], input_pos
[1]) -> float32 logits [1, vocab]`` with the KV cache as mutable buffers, delegated to MPS as one
partition, plus the constant methods executorch's LLM runner reads (:data:`METADATA_METHODS`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mps_backend._notices import quiet_reraised_failures
from mps_backend.errors import MPSBackendError
from mps_backend.llm.checkpoint import CheckpointError, LoadedLM, check_kv_cache_size, load_hf, load_llama
from mps_backend.llm.decoder import (
    ExecutorchLlamaDecoder,
    HFDecoder,
    cache_layout,
    check_chunk,
    dynamic_shapes,
    example_inputs,
)
from mps_backend.llm.routers import sort_unsorted_topk
from mps_backend.llm.spec import parse_model_spec
from mps_backend.llm.vision import is_vision_language
from mps_backend.partitioner import MPSPartitioner, PartitionReport, backend_config, edge_compile_config
from mps_backend.progress import CountingWriter, Progress
from mps_backend.runtime_kernels import DEFAULT_TARGET

#: the constant methods executorch's LLM runner (``extension/llm/runner``) reads, as executorch's
#: own llama export writes them
METADATA_METHODS = (
    "get_max_seq_len",
    "get_max_context_len",
    "get_vocab_size",
    "get_n_layers",
    "get_bos_id",
    "get_eos_ids",
    "use_kv_cache",
    "use_sdpa_with_kv_cache",
    "enable_dynamic_shape",
)

#: default KV-cache length (capped by the model's ``max_position_embeddings``)
DEFAULT_MAX_SEQ_LEN = 2048

DTYPES = {"fp16": torch.float16, "fp32": torch.float32}

#: the rows one delegate call computes when the export does not say (``--prefill-chunk``): 1, the static
#: one-token step. A chunk C > 1 cuts the prompt's calls C-fold, but its attention scores over the
#: whole cache (C rows x the cache length, per head) are written and read by every step, decode too:
#: at the Llama-3.2-1B shape with a 2048-row cache, C = 16 makes a float16 decode step 1.160x the
#: memory floor (1.010x at C = 1), above the 1.03x decode bound (docs/llm.md, The chunk)
DEFAULT_PREFILL_CHUNK = 1


@dataclass
class LLMExportResult:
    path: pathlib.Path
    model_type: str
    precision: str
    max_seq_len: int
    report: PartitionReport
    delegates: int
    pte_bytes: int
    weight_bytes: int
    metadata: dict[str, Any]
    quantize: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: the self-check (``verify_steps``): a :class:`mps_backend.llm.verify.LLMVerification`
    verification: Any = None
    quantize_embedding: bool = False
    #: ``--quantize-head`` as given (None: the default, :func:`mps_backend.quantize.resolve_head`)
    quantize_head: str | None = None
    #: MPS delegates of each method of the program
    method_delegates: dict[str, int] = field(default_factory=dict)
    #: the methods' static signatures, as the summary states them
    signature: str = "decode step tokens [1, 1], input_pos [1]"
    #: rows one delegate call computes (1: the static decode step, prompts prefilled token by token)
    prefill_chunk: int = 1

    def summary(self) -> str:
        r = self.report
        lines = [
            f"model            {self.model_type} ({self.precision}"
            + (f", {self.quantize} weight-only" if self.quantize else "")
            + (", int8 embedding (a scale per row)" if self.quantize_embedding else "")
            + ")",
            (
                f"max_seq_len      {self.max_seq_len} (KV cache; {self.signature}; the device computes "
                f"{self.prefill_chunk} rows per text_decoder call)"
                if is_vision_language(self.model_type)
                else f"max_seq_len      {self.max_seq_len} (static shapes: {self.signature})"
                if self.prefill_chunk == 1
                else f"max_seq_len      {self.max_seq_len} (KV cache; forward tokens [1, n], 1 <= n <= "
                f"{self.prefill_chunk}, input_pos [1]: the device computes {self.prefill_chunk} rows per call)"
            ),
            f"MPS delegates    {self.delegates}"
            + (
                " (" + ", ".join(f"{m} {n}" for m, n in self.method_delegates.items()) + ")"
                if len(self.method_delegates) > 1
                else ""
            ),
            f"nodes delegated  {len(r.delegated)}/{r.total}",
            f".pte size        {self.pte_bytes:,} bytes (checkpoint weights {self.weight_bytes:,})",
            "seconds          " + ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items()),
        ]
        lines += [f"note             {n}" for n in self.notes]
        if r.on_cpu:
            lines.append(str(r).split("\n", 1)[1])
        if self.verification is not None:
            lines.append(str(self.verification))
        return "\n".join(lines)


def load_checkpoint(
    spec: str,
    dtype: str = "fp16",
    *,
    params: str | None = None,
    max_seq_len: int | None = None,
    clamp_fp16: bool = False,
    progress: Progress | None = None,
    scratch: pathlib.Path | None = None,
    keep_quantized: bool = False,
) -> LoadedLM:
    """Load ``hf:FOLDER``, ``gguf:FILE.gguf`` or ``llama:CHECKPOINT.pth`` in the export precision (no
    export). ``scratch``: a folder for converted hf:/gguf: weights (:func:`mps_backend.llm.checkpoint.load_hf`,
    :func:`mps_backend.llm.gguf.load_gguf`). ``keep_quantized``: a GGUF's quantized tensors kept as
    they are (:func:`mps_backend.llm.gguf.load_gguf`)."""
    if dtype not in DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}: use fp16 or fp32")
    kind, path = parse_model_spec(spec)
    if kind in ("hf", "gguf"):
        bar = (lambda total: progress.bytes_bar("load weights", total)) if progress is not None else None
        if kind == "gguf":
            from mps_backend.llm.gguf import load_gguf  # noqa: PLC0415

            return load_gguf(path, DTYPES[dtype], clamp_fp16=clamp_fp16, bar=bar, scratch=scratch, keep_quantized=keep_quantized)
        return load_hf(path, DTYPES[dtype], clamp_fp16=clamp_fp16, bar=bar, scratch=scratch)
    bar = (lambda total: progress.bytes_bar("convert weights", total)) if progress is not None else None
    return load_llama(path, params, DTYPES[dtype], max_seq_len or DEFAULT_MAX_SEQ_LEN, clamp_fp16=clamp_fp16, bar=bar)


def resolve_max_seq_len(lm: LoadedLM, requested: int | None) -> tuple[int, str | None]:
    """The KV-cache length: the request, else DEFAULT_MAX_SEQ_LEN capped by the model's positions."""
    if requested is not None:
        if requested < 2:
            raise CheckpointError(f"--max-seq-len must be at least 2, got {requested}")
        if lm.max_positions and requested > lm.max_positions:
            return requested, (
                f"max_seq_len {requested} exceeds the model's max_position_embeddings "
                f"{lm.max_positions}: quality past that length is the model's own"
            )
        return requested, None
    if lm.max_positions:
        return min(DEFAULT_MAX_SEQ_LEN, lm.max_positions), None
    return DEFAULT_MAX_SEQ_LEN, None


def decoder_for(lm: LoadedLM, max_seq_len: int, chunk: int = 1) -> torch.nn.Module:
    """The forward module of a loaded model: the static decode step (``chunk`` 1) or the chunked
    prefill-and-decode step (:mod:`mps_backend.llm.decoder`)."""
    if lm.kind == "hf":
        return HFDecoder(lm.model, max_seq_len, chunk).eval()
    return ExecutorchLlamaDecoder(lm.model, max_seq_len, chunk).eval()


def program_methods(lm: LoadedLM, max_seq_len: int, chunk: int = 1) -> list[tuple[str, Callable[[], tuple]]]:
    """The program's methods in export order: (name, a function building its module and example inputs
    when called, so that a method may change the model for itself after the previous one was exported).
    A language model: ``forward``, the static decode step or the chunked prefill-and-decode step
    (``chunk`` rows a call, with its dynamic shapes: the builder returns them third); Whisper: the ASR
    runner's ``encoder`` and ``text_decoder`` (:mod:`mps_backend.llm.whisper`)."""
    if lm.model_type == "whisper":
        from mps_backend.llm.whisper import whisper_methods  # noqa: PLC0415

        return whisper_methods(lm.model, max_seq_len)
    if is_vision_language(lm.model_type):  # chunk: the rows of one text_decoder call
        from mps_backend.llm.vision import vision_methods  # noqa: PLC0415

        return vision_methods(lm.model, max_seq_len, chunk)
    return [("forward", lambda: (decoder_for(lm, max_seq_len, chunk), example_inputs(chunk=chunk), dynamic_shapes(chunk)))]


def unplanned_inputs(model_type: str) -> tuple[str, ...]:
    """Methods whose inputs the caller's tensors are used for in place, not copied into the program's
    memory: Whisper's ``text_decoder``, handed the encoder's cross-attention K/V every step."""
    if model_type == "whisper":
        from mps_backend.llm.whisper import DECODER_METHOD  # noqa: PLC0415

        return (DECODER_METHOD,)
    return ()


def metadata(lm: LoadedLM, max_seq_len: int, chunk: int = 1) -> dict[str, Any]:
    """The runner's metadata: with a chunk, ``get_max_seq_len`` is the rows one call takes (executorch's
    runner prefills that many per call) and ``get_max_context_len`` the cache length, as executorch's
    own llama export writes them."""
    if lm.model_type == "whisper":
        from mps_backend.llm.whisper import whisper_metadata  # noqa: PLC0415

        return whisper_metadata(lm, max_seq_len)
    if is_vision_language(lm.model_type):
        from mps_backend.llm.vision import vision_metadata  # noqa: PLC0415

        return vision_metadata(lm, max_seq_len, chunk)
    meta: dict[str, Any] = {
        "get_max_seq_len": chunk if chunk > 1 else max_seq_len,
        "get_max_context_len": max_seq_len,
        "get_vocab_size": lm.vocab_size,
        "get_n_layers": lm.n_layers,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False,
        "enable_dynamic_shape": chunk > 1,
    }
    if lm.bos_id is not None:
        meta["get_bos_id"] = lm.bos_id
    if lm.eos_ids:
        meta["get_eos_ids"] = list(lm.eos_ids)
    return meta


def _checkpoint_state(source: str | os.PathLike, files=None) -> dict[str, tuple[int, ...]]:
    """(size, mtime, ctime, inode, device) of each weight file of a checkpoint: the ``*.safetensors``
    of an hf: folder, or the gguf: / llama: checkpoint file (symlinks followed, as the loader does)."""
    if files is None:
        p = pathlib.Path(source)
        files = sorted(str(f) for f in p.glob("*.safetensors")) if p.is_dir() else [str(p)]
    state = {}
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            state[f] = ()
            continue
        state[f] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    return state


def _check_checkpoint_unchanged(before: dict[str, tuple[int, ...]], when: str) -> None:
    """Refuse (CheckpointError) when a weight file was written, truncated or replaced since the export
    began reading it: the program would hold a mix of old and new weights, and a truncated mapped file
    ends the process with SIGBUS when its missing pages are read."""
    after = _checkpoint_state(None, list(before))
    for f, was in before.items():
        now = after[f]
        if now != was:
            how = "truncated or extended" if not now or not was or now[0] != was[0] else "rewritten in place"
            raise CheckpointError(
                f"{f} was {how} while the export read it ({when}): nothing written; export again once the "
                "checkpoint is no longer being changed"
            )


def output_target(path: str | os.PathLike) -> pathlib.Path:
    """The file an export to ``path`` replaces, checked before any work: ``path`` itself, or for a
    symlink the file it points to (written through: the link stays, its target gets the new program,
    as ``cp`` does). A directory, or anything else that is not a regular file (a device such as
    /dev/full, a FIFO, a socket), is refused with OSError; so are a missing folder and a symlink loop."""
    from mps_backend.llm.guards import real_path  # noqa: PLC0415

    path = pathlib.Path(path)
    target = real_path(path) if path.is_symlink() else path  # a symlink loop: one OSError line
    shown = f"{path} (a symlink to {target})" if target != path else str(path)
    if target.is_dir():
        raise IsADirectoryError(f"{shown} is a directory, not a file to write")
    if target.exists() and not target.is_file():
        raise FileExistsError(f"{shown} is not a regular file (a device, FIFO or socket): refusing to replace it")
    if path.is_symlink() and not target.parent.is_dir():
        raise FileNotFoundError(f"{shown}: folder {target.parent} does not exist")
    return target


def _remove_stale_partials(path: pathlib.Path) -> None:
    """Remove the temporary files an earlier write to ``path`` left when its process was killed (SIGKILL
    runs no cleanup): ``.NAME.PID.*.partial`` whose PID is no longer a running process. A live writer's
    (another export to the same path) is left alone."""
    from mps_backend.llm.guards import temp_stem, writer_gone  # noqa: PLC0415

    stem = temp_stem(path.name)
    for tmp in path.parent.glob(f".{glob.escape(stem)}.*.partial"):
        if writer_gone(tmp.name[len(stem) + 2 :].split(".", 1)[0]):
            tmp.unlink(missing_ok=True)


def write_atomically(path: pathlib.Path, write) -> int:
    """``write(f)`` into a temporary file beside the target (:func:`output_target`), then rename it
    there: an interrupted export never leaves a truncated file nor destroys the file that was there,
    and a failed write (a full disk) leaves no temporary file; one killed (SIGKILL) leaves its temporary
    file, removed by the next write to the path. Returns the size."""
    from mps_backend.llm.guards import temp_stem  # noqa: PLC0415

    path = output_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{temp_stem(path.name)}.{os.getpid()}.", suffix=".partial", dir=path.parent)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
        except OSError as e:  # ENOSPC, EIO, EDQUOT...: one line, the old file is intact
            raise OSError(e.errno, f"writing {path} failed ({e.strerror or e}); nothing was replaced") from e
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 -> what open() would have given
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def export_llm(
    model: str,
    output: str | os.PathLike,
    *,
    dtype: str = "fp16",
    quantize: str | None = None,
    group_size: int | None = None,
    max_seq_len: int | None = None,
    params: str | None = None,
    clamp_fp16: bool = False,
    progress: bool | Progress = False,
    target_runtime: str | None = DEFAULT_TARGET,
    allow_missing_kernels: bool = False,
    verify_steps: int = 0,
    quantize_embedding: bool = False,
    prefill_chunk: int | None = None,
    quantize_head: str | None = None,
) -> LLMExportResult:
    """Export a language-model checkpoint (``hf:FOLDER``, ``gguf:FILE.gguf``, or ``llama:CHECKPOINT.pth``
    with ``params``) to ``output``, a ``.pte`` executorch's LLM runner loads with the MPS delegate.

    ``dtype``: ``fp16`` (default) or ``fp32`` on the device. ``quantize``: ``int4`` or ``int8``
    weight-only (torchao, ``group_size`` as in ``mps-backend export``). ``max_seq_len``: the static
    KV-cache length (default 2048 capped by the model's positions). ``target_runtime``: as in
    :func:`mps_backend.export.export_model` (checked before anything is written). ``verify_steps``:
    after writing, run that many decode steps of the ``.pte`` against the eager float32 model
    (:mod:`mps_backend.llm.verify`; the CLI's default is 4) into ``result.verification``.
    ``quantize_embedding``: the embedding table int8 with a scale per row, dequantized after the
    lookup (:class:`mps_backend.quantize.RowQuantizedEmbedding`). ``quantize_head``: the output head
    under ``quantize`` (``int8``, the default; ``int4``; ``float``). A ``gguf:`` file without
    ``quantize`` keeps its quantized tensors (:func:`mps_backend.llm.gguf.load_gguf`)."""
    from executorch.exir import to_edge_transform_and_lower  # noqa: PLC0415

    from mps_backend.export import drop_unused_constants, release_export_caches  # noqa: PLC0415
    from mps_backend.runtime_kernels import check_kernels  # noqa: PLC0415

    out = pathlib.Path(output)
    output_target(out)  # a directory, device or FIFO is refused before the checkpoint is read
    kind, source = parse_model_spec(model)
    from mps_backend.llm import guards  # noqa: PLC0415

    guards.check_output_is_not_an_input(out, kind, source, params)  # -o FOLDER/model.safetensors, a link to it...
    guards.check_export_options(verify_steps, group_size, quantize)
    if quantize_head is not None and not quantize:
        raise CheckpointError(f"--quantize-head {quantize_head} applies to --quantize int4|int8")
    prog = progress if isinstance(progress, Progress) else Progress(enabled=bool(progress))
    weights = _checkpoint_state(source)  # checked again before the weights are copied and before the write
    # converted weights (bfloat16 -> float16) and quantized int8 data are written here and mapped back,
    # one tensor at a time (mps_backend.pages.ScratchFile: each file unlinked once mapped); the folder
    # is removed when the export ends, also on error
    # (beside the output: the disk the .pte goes to, not a tmpfs that would count as memory)
    folder = output_target(out).parent
    folder.mkdir(parents=True, exist_ok=True)
    guards.remove_stale_scratch(folder / out.name)  # those of exports killed before they could remove theirs
    with (
        tempfile.TemporaryDirectory(prefix=guards.scratch_prefix(out), dir=folder) as scratch,
        contextlib.ExitStack() as cleanup,
    ):
        cleanup.callback(release_export_caches)  # first out: the cache keeps the weights mapped
        # a model's code torch cannot trace is refused in one line (_refusal), not after torch's own traceback
        cleanup.enter_context(quiet_reraised_failures())
        with prog.stage("load checkpoint", ticker=False):
            lm = load_checkpoint(
                model,
                dtype,
                params=params,
                max_seq_len=max_seq_len,
                clamp_fp16=clamp_fp16,
                progress=prog,
                scratch=pathlib.Path(scratch),
                keep_quantized=not quantize,
            )
        notes = list(lm.notes)
        seq_len, note = resolve_max_seq_len(lm, max_seq_len)
        guards.check_verify_steps(verify_steps, seq_len)  # before anything is written
        guards.check_positions(lm.model, lm.max_positions, seq_len)  # a learned position table bounds the cache
        if lm.kind == "hf":
            cfg = lm.model.config.get_text_config() if hasattr(lm.model.config, "get_text_config") else lm.model.config
            kv, k_cols, v_cols = cache_layout(lm.model, cfg)
            check_kv_cache_size(lm.n_layers, kv, (k_cols + v_cols) / 2, seq_len, lm.dtype)
            guards.check_state_sizes(lm.model, cfg, lm.dtype)  # recurrent states, before the decode step allocates them
        if note:
            notes.append(note)
        vision = is_vision_language(lm.model_type)
        if vision and quantize_embedding:
            raise CheckpointError(
                f"--quantize-embedding: not done for vision-language models ({lm.model_type}): their token_embedding "
                "method reads the float table"
            )
        if quantize:
            from mps_backend.quantize import quantization_count, quantize_model, resolve_group_size  # noqa: PLC0415

            group = resolve_group_size(quantize, group_size)
            # a vision-language model: its text decoder and head (what each decode step reads); the vision
            # encoder runs once an image and stays in float (mps_backend.llm.vision.text_part)
            target, rest = lm.model, ""
            if vision:
                from mps_backend.llm.vision import text_part  # noqa: PLC0415

                target, rest = text_part(lm.model), "; the vision encoder stays in float"
            elif lm.model_type == "whisper":  # the decoder and head (mps_backend.llm.whisper.quantize_target)
                from mps_backend.llm.whisper import quantize_target  # noqa: PLC0415

                target, rest = quantize_target(lm.model), "; the audio encoder stays in float"
            note = quantization_count(target, quantize, group, quantize_head)  # none quantized: an error, not a label
            notes.append(note + rest)
            with prog.stage(f"quantize {quantize}"):
                quantize_model(target, quantize, group, head=quantize_head, scratch=scratch)
        if quantize_embedding:
            from mps_backend.quantize import quantize_embeddings  # noqa: PLC0415

            with prog.stage("quantize embedding int8"):
                quantize_embeddings(lm.model)
        if vision:  # the rows of one text_decoder call: at least an image's embeddings
            from mps_backend.llm.vision import check_rows  # noqa: PLC0415

            chunk = check_rows(lm.model, prefill_chunk, seq_len)
        else:
            try:
                chunk = check_chunk(DEFAULT_PREFILL_CHUNK if prefill_chunk is None else prefill_chunk, seq_len)
            except ValueError as e:
                raise CheckpointError(f"--prefill-chunk: {e}") from None
        if chunk > 1 and lm.model_type == "whisper":
            raise CheckpointError("--prefill-chunk: Whisper's text_decoder reads one token a call (the ASR runner's contract)")
        methods = program_methods(lm, seq_len, chunk)
        meta = metadata(lm, seq_len, chunk)
        model_type, weight_bytes = lm.model_type, lm.weight_bytes
        del lm  # the methods hold the model; nothing else may keep the weights alive past lowering
        # a chunk's padding, positions and row slices have the prompt's length: on CPU by design
        partitioner = MPSPartitioner(use_fp16=dtype == "fp16", dynamic_ok=chunk > 1 or vision)
        with torch.no_grad():
            eps = {}
            with prog.stage("torch.export"):
                for name, build in methods:
                    try:
                        module, inputs, *dynamic = build()
                        eps[name] = drop_unused_constants(
                            torch.export.export(module, inputs, dynamic_shapes=dynamic[0] if dynamic else None, strict=False)
                        )
                        sort_unsorted_topk(eps[name])  # MoE routers: order-free top-k, on the device
                    except Exception as e:  # noqa: BLE001 - any failure of the model's code is one line naming it
                        raise _refusal(model_type, e) from None
                    del module
            del methods
            _check_checkpoint_unchanged(weights, "before its weights were copied into the program")
            with prog.stage("lower to MPS"):
                try:
                    edge = to_edge_transform_and_lower(
                        eps if len(eps) > 1 else eps["forward"],
                        partitioner=[partitioner],
                        constant_methods=meta,
                        compile_config=edge_compile_config(),
                    )
                except MPSBackendError:
                    raise
                except Exception as e:  # noqa: BLE001 - executorch's edge verifier on the model's graph (data-dependent sizes)
                    raise _refusal(model_type, e) from e
            del eps
            method_delegates = {name: _count_mps_delegates(edge, name) for name in sorted(edge.methods)}
            delegates = sum(method_delegates.values())
            with prog.stage("to_executorch"), warnings.catch_warnings():
                # executorch warns that a mutated buffer's initial contents are not serialized: the KV
                # caches' are never read (positions after input_pos are masked; docs/llm.md, The program)
                warnings.filterwarnings("ignore", message="Mutation on a buffer in the model is detected", category=UserWarning)
                # the KV-cache writes (index_put on CPU, mps_backend.partitioner.CACHE_WRITE_REASON) made in
                # place: index_put_ writes the rows, no aten::copy_ of a whole cache back into its buffer
                program = edge.to_executorch(backend_config(edge, unplanned_inputs(model_type)))
            del edge
            check_kernels(program, target_runtime, warn_only=allow_missing_kernels)
        _check_checkpoint_unchanged(weights, "while its weights were copied into the program")
        # with a self-check, the program is written beside the output under a temporary name and
        # put in place only once it passed (publish_checked): a wrong program never reaches the path
        written = _staging_path(out) if verify_steps else out
        with prog.stage(f"write {out.name}", ticker=False):
            bar = prog.bytes_bar("write", 0)
            size = write_atomically(written, lambda f: program.write_to_file(CountingWriter(f, bar)))
            bar.close()
    program = None  # released before the verification loads the eager model
    result = LLMExportResult(
        path=out,
        model_type=model_type,
        precision="float16" if dtype == "fp16" else "float32",
        max_seq_len=seq_len,
        report=partitioner.report(),
        delegates=delegates,
        pte_bytes=size,
        weight_bytes=weight_bytes,
        metadata=meta,
        quantize=quantize,
        quantize_embedding=quantize_embedding,
        quantize_head=quantize_head,
        prefill_chunk=chunk,
        seconds=dict(prog.seconds),
        notes=notes,
        method_delegates=method_delegates,
    )
    if model_type == "whisper":
        from mps_backend.llm.whisper import WHISPER_SIGNATURE  # noqa: PLC0415

        result.signature = WHISPER_SIGNATURE
    if is_vision_language(model_type):
        from mps_backend.llm.vision import VISION_SIGNATURE  # noqa: PLC0415

        result.signature = VISION_SIGNATURE
    if verify_steps:
        from mps_backend.llm.verify import verify_export  # noqa: PLC0415

        def export_truncated(spec: str, path: pathlib.Path, truncated_params: str | None) -> None:
            export_llm(
                spec,
                path,
                dtype=dtype,
                quantize=quantize,
                group_size=group_size,
                max_seq_len=seq_len,
                params=truncated_params,
                clamp_fp16=clamp_fp16,
                target_runtime=target_runtime,
                allow_missing_kernels=allow_missing_kernels,
                quantize_embedding=quantize_embedding,
                prefill_chunk=chunk,
                quantize_head=quantize_head,
            )

        try:
            with prog.stage(f"verify {verify_steps} steps"):
                if model_type == "whisper":
                    from mps_backend.llm.whisper import verify_whisper  # noqa: PLC0415

                    result.verification = verify_whisper(result, model, steps=verify_steps, group_size=group_size, pte=written)
                elif is_vision_language(model_type):
                    from mps_backend.llm.vision import verify_vision  # noqa: PLC0415

                    result.verification = verify_vision(result, model, steps=verify_steps, pte=written, group_size=group_size)
                else:
                    result.verification = verify_export(
                        result,
                        model,
                        steps=verify_steps,
                        group_size=group_size,
                        params=params,
                        export=export_truncated,
                        pte=written,
                    )
        except BaseException:
            written.unlink(missing_ok=True)  # an unchecked program is never left, under any name
            raise
        result.path = publish_checked(written, out, result.verification.ok)
        result.seconds = dict(prog.seconds)
    return result


def _staging_path(out: pathlib.Path) -> pathlib.Path:
    """Where an export with a self-check writes its program until the check has passed: a hidden
    file beside the output, named as :func:`write_atomically`'s temporary files are, so that one left
    by a killed export is removed by the next write to the output."""
    from mps_backend.llm.guards import temp_stem  # noqa: PLC0415

    target = output_target(out)
    return target.with_name(f".{temp_stem(target.name)}.{os.getpid()}.unverified.partial")


def failed_path(out: str | os.PathLike) -> pathlib.Path:
    """Where a program that failed its self-check is kept, beside the output: ``NAME.failed.pte`` (a long NAME
    shortened as temporary names are: :func:`mps_backend.llm.guards.temp_stem`)."""
    from mps_backend.llm.guards import temp_stem  # noqa: PLC0415

    target = output_target(out)
    return target.with_name(f"{temp_stem(target.stem)}.failed{target.suffix or '.pte'}")


def publish_checked(written: pathlib.Path, out: pathlib.Path, ok: bool) -> pathlib.Path:
    """Put a self-checked program in place: at the output path when the check passed (an atomic
    rename, replacing what was there); otherwise at :func:`failed_path`, leaving the output path as it
    was (a file that was there stays). Returns where the program is."""
    where = output_target(out) if ok else failed_path(out)
    os.replace(written, where)
    return where


def _refusal(model_type: str, error: BaseException) -> CheckpointError:
    """One line for a model whose decode step cannot be exported: the model type, the innermost
    function of transformers' modeling code the failure came from (the part that cannot run), why."""
    import traceback  # noqa: PLC0415

    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/transformers/models/" in f.filename.replace(os.sep, "/")]
    where = f" in {pathlib.Path(frames[-1].filename).stem}.{frames[-1].name}" if frames else ""
    if not frames:  # raised on the traced graph (executorch's verifier): its message quotes the model's code
        quoted = re.findall(r'File "[^"]*/transformers/models/[^"/]+/([^"/]+)\.py", line \d+, in (\w+)', str(error))
        where = f" in {quoted[-1][0]}.{quoted[-1][1]}" if quoted else ""
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    if "data-dependent" in detail:  # e.g. JetMoE's experts, split by the router's counts
        detail = f"a tensor size computed from the values (the device compiles static shapes): {detail}"
    return CheckpointError(f"model type {model_type!r}: the static decode step cannot be exported{where}: {detail}")


def _count_mps_delegates(edge, method: str = "forward") -> int:
    from executorch.exir.lowered_backend_module import get_lowered_submodules  # noqa: PLC0415

    return sum(
        1
        for _, lowered, _ in get_lowered_submodules(edge.exported_program(method).graph_module)
        if lowered.backend_id == "MPSBackend"
    )
