"""A language-model checkpoint on disk -> a runner-ready ``.pte`` for the MPS delegate: the one export loop.

    from mps_backend.llm import export_llm
    result = export_llm("hf:./SmolLM2-135M", "smollm2.pte", dtype="fp16", max_seq_len=1024)
    print(result.summary())

:func:`export_llm` runs the same steps for every model: check the request, load the checkpoint, check
what the model asks for, quantize, build and ``torch.export`` each method of the program, lower them to
MPS, write the ``.pte`` atomically, and check it (``--verify-steps``). What differs between models comes
from the model's family (:mod:`mps_backend.llm.family`): the registration that takes its spec kind and
model type (:mod:`mps_backend.llm.registry`) names the family's module, whose ``FAMILY`` gives its
loader, its methods with their example inputs, its runner metadata, what ``--quantize`` touches, its
rows check and its self-check. The options travel as one :class:`~mps_backend.llm.options.ExportOptions`.

What a causal LM's ``.pte`` holds (:mod:`mps_backend.llm.causal`, :mod:`mps_backend.llm.decoder`):
``forward(tokens [1, 1], input_pos [1]) -> float32 logits [1, vocab]`` (or ``tokens [1, n]``, ``n`` up to
``--prefill-chunk``), the KV cache as mutable buffers, delegated to MPS as one partition, plus the constant
methods executorch's LLM runner reads (:data:`METADATA_METHODS`); a vision-language model's, Whisper's: the
methods of their runners (:mod:`mps_backend.llm.vision`, :mod:`mps_backend.llm.whisper`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pathlib
import re
import tempfile
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules

from mps_backend._notices import quiet_reraised_failures
from mps_backend.config import check_environment
from mps_backend.errors import CheckpointError, MPSBackendError
from mps_backend.export import drop_unused_constants, release_export_caches
from mps_backend.export_scope import export_scope
from mps_backend.files import output_target, publish_checked, staging_path, write_atomically
from mps_backend.llm import guards
from mps_backend.llm.checkpoint import LoadedLM
from mps_backend.llm.chunking import device_named
from mps_backend.llm.family import Family, Method
from mps_backend.llm.folder_check import json_object
from mps_backend.llm.gguf import one_metadata_read
from mps_backend.llm.options import DEFAULT_MAX_SEQ_LEN, ExportOptions
from mps_backend.llm.registry import registration
from mps_backend.llm.routers import sort_unsorted_topk
from mps_backend.llm.spec import ModelSpec, parse_model_spec
from mps_backend.llm.swap import Replacements
from mps_backend.partitioner import MPSPartitioner, PartitionReport, backend_config, edge_compile_config
from mps_backend.precision import Precision
from mps_backend.progress import CountingWriter, Progress
from mps_backend.quantize import apply_plan, quantize_embeddings
from mps_backend.runtime_kernels import DEFAULT_TARGET, check_kernels

#: the constant methods executorch's LLM runner (``extension/llm/runner``) reads, as executorch's
#: own llama export writes them (mps_backend.llm.family.runner_metadata)
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


@dataclass
class LLMExportResult:
    path: pathlib.Path
    model_type: str
    #: the options the export ran with (:class:`~mps_backend.llm.options.ExportOptions`)
    options: ExportOptions
    #: the KV cache's length (``--max-seq-len``, or the default it became)
    max_seq_len: int
    report: PartitionReport
    delegates: int
    pte_bytes: int
    weight_bytes: int
    metadata: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: the self-check (``verify_steps``): a :class:`mps_backend.llm.verify.LLMVerification`
    verification: Any = None
    #: MPS delegates of each method of the program
    method_delegates: dict[str, int] = field(default_factory=dict)
    #: the methods' static signatures, as the summary states them
    signature: str = "decode step tokens [1, 1], input_pos [1]"
    #: rows one delegate call computes (``--prefill-chunk``, or the family's default it became; 1: the
    #: static decode step, prompts prefilled token by token)
    prefill_chunk: int = 1
    #: how the chunk was chosen when ``--prefill-chunk`` was not given (:class:`mps_backend.llm.chunking.ChunkChoice`)
    chunk_choice: Any = None
    #: the model's family (mps_backend.llm.registry)
    family: str = ""
    #: the summary's line of the cache and the rows a call computes (the family's :meth:`~mps_backend.llm.family.Family.describe`)
    length: str = ""

    @property
    def precision(self) -> str:
        """``float16`` / ``float32`` (another precision policy: its name)."""
        p = self.options.precision
        return "float16" if p == Precision.FP16 else "float32" if p == Precision.FP32 else p.name

    @property
    def quantize(self) -> str | None:
        return self.options.quantize

    @property
    def quantize_embedding(self) -> bool:
        return self.options.quantize_embedding

    @property
    def quantize_head(self) -> str | None:
        return self.options.quantize_head

    def summary(self) -> str:
        r = self.report
        lines = [
            f"model            {self.model_type} ({self.precision}"
            + (f", {self.quantize} weight-only" if self.quantize else "")
            + (", int8 embedding (a scale per row)" if self.quantize_embedding else "")
            + ")",
            f"max_seq_len      {self.length}",
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


def model_type_of(spec: ModelSpec) -> str | None:
    """The model type of a checkpoint as its registration is looked up: an ``hf:`` folder's ``config.json``
    (read by the folder check's bounded reader; None when it cannot be read: the loader says why), a
    ``llama:`` checkpoint's ``llama``; a ``gguf:`` file's is its loader's (the causal LMs take them all)."""
    if spec.kind == "llama":
        return "llama"
    if spec.kind != "hf":
        return None
    try:
        config = json_object(pathlib.Path(spec.path), "config.json")
    except (CheckpointError, OSError):
        return None
    value = config.get("model_type") if config else None
    return value if isinstance(value, str) else None


def family_for(spec: ModelSpec) -> Family:
    """The family that exports ``spec``: ``FAMILY`` of the module its registration names."""
    return importlib.import_module(registration(spec.kind, model_type_of(spec)).module).FAMILY


def load_checkpoint(
    spec: str,
    dtype: str | Precision = "fp16",
    *,
    params: str | None = None,
    max_seq_len: int | None = None,
    clamp_fp16: bool = False,
    progress: Progress | None = None,
    scratch: pathlib.Path | None = None,
    keep_quantized: bool = False,
) -> LoadedLM:
    """Load ``hf:FOLDER``, ``gguf:FILE.gguf`` or ``llama:CHECKPOINT.pth`` in the export precision, as its
    family's loader does for an export (no export). ``scratch``: a folder for converted hf:/gguf: weights
    (:func:`mps_backend.llm.checkpoint.load_hf`, :func:`mps_backend.llm.gguf.load_gguf`). ``keep_quantized``:
    a GGUF's quantized tensors kept as they are (:func:`mps_backend.llm.gguf.load_gguf`; an export without
    ``--quantize`` keeps them)."""
    options = ExportOptions.of(dtype, params=params, max_seq_len=max_seq_len, clamp_fp16=clamp_fp16)
    parsed = parse_model_spec(spec)
    return family_for(parsed).load(parsed, options, progress=progress, scratch=scratch, keep_quantized=keep_quantized)


def resolve_max_seq_len(lm: LoadedLM, requested: int | None) -> tuple[int, str | None]:
    """The KV-cache length: the request, else DEFAULT_MAX_SEQ_LEN capped by the model's positions."""
    if requested is not None:
        if lm.max_positions and requested > lm.max_positions:
            return requested, (
                f"max_seq_len {requested} exceeds the model's max_position_embeddings "
                f"{lm.max_positions}: quality past that length is the model's own"
            )
        return requested, None
    if lm.max_positions:
        return min(DEFAULT_MAX_SEQ_LEN, lm.max_positions), None
    return DEFAULT_MAX_SEQ_LEN, None


def program_methods(family: Family, lm: LoadedLM, max_seq_len: int, rows: int) -> list[Method]:
    """The program's methods, built once the model is loaded, checked and quantized (the step after the
    load-and-check step: harness.fuzz_checkpoint stops here)."""
    return family.methods(lm, max_seq_len, rows)


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


def export_llm(
    model: str,
    output: str | os.PathLike,
    options: ExportOptions | None = None,
    *,
    progress: bool | Progress = False,
    dtype: str | Precision = "fp16",
    quantize: str | None = None,
    group_size: int | None = None,
    max_seq_len: int | None = None,
    params: str | None = None,
    clamp_fp16: bool = False,
    target_runtime: str | None = DEFAULT_TARGET,
    allow_missing_kernels: bool = False,
    verify_steps: int = 0,
    quantize_embedding: bool = False,
    prefill_chunk: int | None = None,
    quantize_head: str | None = None,
    allow_requantize: bool = False,
    device: str = "any",
    language: str | None = None,
    task: str | None = None,
) -> LLMExportResult:
    """Export a language-model checkpoint (``hf:FOLDER``, ``gguf:FILE.gguf``, or ``llama:CHECKPOINT.pth``
    with ``params``) to ``output``, a ``.pte`` its runner (executorch's LLM, multimodal or ASR runner) loads
    with the MPS delegate.

    ``options``: an :class:`~mps_backend.llm.options.ExportOptions`; or the same as keywords, each named as
    its flag of ``mps-backend export``: ``dtype`` (``fp16``, the default, or ``fp32`` on the device; or a
    :class:`~mps_backend.precision.Precision`), ``quantize`` (``int4`` or ``int8`` weight-only, torchao, with
    ``group_size``, ``quantize_head`` and ``allow_requantize``), ``max_seq_len`` (the static KV-cache length,
    default 2048 capped by the model's positions), ``target_runtime`` (as in
    :func:`mps_backend.export.export_model`, checked before anything is written), ``verify_steps`` (after
    writing, that many decode steps of the ``.pte`` against the eager float32 model,
    :mod:`mps_backend.llm.verify`, the CLI's default 4, into ``result.verification``),
    ``quantize_embedding`` (the embedding table int8 with a scale per row, dequantized after the lookup),
    ``prefill_chunk`` (rows one call computes; not given: the chunk chosen for ``device``, ``any`` or an Apple
    GPU of the cost model's table such as ``m2`` or ``a17-pro``: :mod:`mps_backend.llm.chunking`); Whisper's
    ``language`` and ``task`` (the decoding executorch's ASR runner gets from the program). A ``gguf:``
    file without ``quantize`` keeps its quantized tensors (:func:`mps_backend.llm.gguf.load_gguf`)."""
    keywords = dict(
        quantize=quantize,
        group_size=group_size,
        max_seq_len=max_seq_len,
        params=params,
        clamp_fp16=clamp_fp16,
        target_runtime=target_runtime,
        allow_missing_kernels=allow_missing_kernels,
        verify_steps=verify_steps,
        quantize_embedding=quantize_embedding,
        prefill_chunk=prefill_chunk,
        quantize_head=quantize_head,
        allow_requantize=allow_requantize,
        device=device,
        language=language,
        task=task,
    )
    if options is None:
        options = ExportOptions.of(dtype, **keywords)
    elif dtype != "fp16" or any(getattr(ExportOptions, k) != v for k, v in keywords.items()):
        raise TypeError("export_llm: give the options either as an ExportOptions or as keywords, not both")
    out = pathlib.Path(output)
    output_target(out)  # a directory, device or FIFO is refused before the checkpoint is read
    spec = parse_model_spec(model)
    guards.check_output_is_not_an_input(out, spec.kind, spec.path, options.params)  # -o FOLDER/model.safetensors...
    check_environment()  # the byte-count settings, parsed before any work (a bad one is one ConfigError)
    family = family_for(spec)
    if (options.language is not None or options.task is not None) and not family.takes_language:
        raise CheckpointError(f"--language and --task apply to Whisper checkpoints, not to a {family.name} model")
    prog = progress if isinstance(progress, Progress) else Progress(enabled=bool(progress))
    weights = _checkpoint_state(spec.path)  # checked again before the weights are copied and before the write
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
        # a GGUF's metadata (its whole vocabulary: 2.8 CPU s for SmolLM2's) read once by the load's config and
        # the self-check's tokenizer and eager reference
        cleanup.enter_context(one_metadata_read())
        with prog.stage("load checkpoint", ticker=False):
            lm = family.load(spec, options, progress=prog, scratch=pathlib.Path(scratch), keep_quantized=not options.quantize)
        notes = list(lm.notes)
        seq_len, note = resolve_max_seq_len(lm, options.max_seq_len)
        guards.check_verify_steps(options.verify_steps, seq_len)  # before anything is written
        guards.check_positions(lm.model, lm.max_positions, seq_len)  # a learned position table bounds the cache
        family.check(lm, options, seq_len)
        if note:
            notes.append(note)
        choice = family.chunk_choice(lm, options, seq_len)  # without --prefill-chunk: for --device
        rows = family.rows(lm, options, seq_len) if choice is None else choice.chunk
        if choice is not None:
            notes.append(choice.line())
        elif device_named(options.device) is not None:  # named, but the rows were not chosen for it: say so
            given = "--prefill-chunk gave them" if options.prefill_chunk is not None else f"the {family.name} runner fixes them"
            notes.append(f"--device {options.device}: not used: {given} ({rows} rows a call)")
        if options.quantization:
            plan = options.quantization.plan(family.quantize_target(lm))  # the weights every decode step reads; none: an error
            notes.append(plan.summary() + family.quantize_rest)
            with prog.stage(f"quantize {options.quantize}"):
                apply_plan(plan, scratch)
            del plan
        if options.quantize_embedding:
            with prog.stage("quantize embedding int8"):
                quantize_embeddings(lm.model)
        methods = program_methods(family, lm, seq_len, rows)
        meta = family.metadata(lm, seq_len, rows)
        model_type, weight_bytes = lm.model_type, lm.weight_bytes
        del lm  # the methods hold the model; nothing else may keep the weights alive past lowering
        partitioner = MPSPartitioner(precision=options.precision, dynamic_ok=family.dynamic(rows))
        with torch.no_grad(), export_scope():  # torch's provenance shared, its operator census kept (export_scope)
            eps = {}
            with prog.stage("torch.export"):
                for method in methods:
                    # what the method replaces of the model is undone once it is exported, also on error
                    with Replacements() as changes:
                        try:
                            module, inputs, dynamic = method.build(changes)
                            ep = torch.export.export(module, inputs, dynamic_shapes=dynamic, strict=False)
                            eps[method.name] = drop_unused_constants(ep)
                            sort_unsorted_topk(eps[method.name])  # MoE routers: order-free top-k, on the device
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
            with prog.stage("to_executorch"), warnings.catch_warnings():
                # executorch warns that a mutated buffer's initial contents are not serialized: the KV
                # caches' are never read (positions after input_pos are masked; docs/llm.md, The program)
                warnings.filterwarnings("ignore", message="Mutation on a buffer in the model is detected", category=UserWarning)
                # the KV-cache writes (index_put on CPU, mps_backend.partitioner.CACHE_WRITE_REASON) made in
                # place: index_put_ writes the rows, no aten::copy_ of a whole cache back into its buffer
                program = edge.to_executorch(backend_config(edge, family.unplanned_inputs))
            del edge
            check_kernels(program, options.target_runtime, warn_only=options.allow_missing_kernels)
        _check_checkpoint_unchanged(weights, "while its weights were copied into the program")
        # with a self-check, the program is written beside the output under a temporary name and
        # put in place only once it passed (publish_checked): a wrong program never reaches the path
        written = staging_path(out) if options.verify_steps else out
        with prog.stage(f"write {out.name}", ticker=False):
            bar = prog.bytes_bar("write", 0)
            size = write_atomically(written, lambda f: program.write_to_file(CountingWriter(f, bar)))
            bar.close()
    program = None  # released before the verification loads the eager model
    result = LLMExportResult(
        path=out,
        model_type=model_type,
        options=options,
        max_seq_len=seq_len,
        report=partitioner.report(),
        delegates=sum(method_delegates.values()),
        pte_bytes=size,
        weight_bytes=weight_bytes,
        metadata=meta,
        seconds=dict(prog.seconds),
        notes=notes,
        method_delegates=method_delegates,
        signature=family.signature,
        prefill_chunk=rows,
        chunk_choice=choice,
        family=family.name,
        length=family.describe(seq_len, rows),
    )
    if options.verify_steps:

        def export_truncated(truncated: str, path: pathlib.Path, truncated_params: str | None) -> None:
            """The self-check's layer-truncated copy, exported with these options (its cache and rows as resolved)."""
            copy = options.replace(params=truncated_params, max_seq_len=seq_len, prefill_chunk=rows, verify_steps=0)
            export_llm(truncated, path, copy)

        try:
            with prog.stage(f"verify {options.verify_steps} steps"):
                result.verification = family.verify(result, model, options, written, export_truncated)
        except BaseException:
            written.unlink(missing_ok=True)  # an unchecked program is never left, under any name
            raise
        result.path = publish_checked(written, out, result.verification.ok)
        result.seconds = dict(prog.seconds)
    return result


def _refusal(model_type: str, error: BaseException) -> CheckpointError:
    """One line for a model whose decode step cannot be exported: the model type, the innermost
    function of transformers' modeling code the failure came from (the part that cannot run), why."""
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
    return sum(
        1
        for _, lowered, _ in get_lowered_submodules(edge.exported_program(method).graph_module)
        if lowered.backend_id == "MPSBackend"
    )
