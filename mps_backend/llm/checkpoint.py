"""Language-model checkpoints on disk -> an eager model in the export precision.

- ``hf:PATH``: a Hugging Face checkpoint folder (``config.json``, ``*.safetensors``, tokenizer files):
  transformers builds the model from the config with its parameters on the meta device, and the
  weights come from the safetensors files (:func:`load_hf`); nothing is downloaded.
- ``llama:CHECKPOINT.pth`` with ``params.json``: a Meta / executorch llama checkpoint, loaded into
  executorch's example llama (``executorch.examples.models.llama``) with its KV cache.
- ``gguf:FILE.gguf``: :mod:`mps_backend.llm.gguf`, through :func:`load_state_dict_into` as ``hf:``.

The weights are loaded straight into the export precision (float16 for ``fp16``, float32 for
``fp32``): the MPS delegate computes in that precision anyway, and loading at it avoids a second copy
of the model. A weight the checkpoint already stores in that precision is mapped from the file, not
read (both loaders): the blob writer reads its pages and hands them back to the kernel
(:mod:`mps_backend.pages`). bfloat16 has no MPS support, so a bfloat16 checkpoint becomes float16
(or float32). A weight that does not fit float16 (|x| > 65504) is an error naming the tensor, or is
clamped to ±65504 when asked (``clamp_fp16=True``).
"""

from __future__ import annotations

import abc
import ctypes
import dataclasses
import pathlib
import pickle
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mps_backend.errors import CheckpointError, MPSBackendError
from mps_backend.llm.folder_check import check_declared_weights, check_folder_weights, json_object, weight_files
from mps_backend.llm.formats import TensorEntry, read_json_object, read_safetensors_header
from mps_backend.llm.registry import TESTED_MODEL_TYPES, registration
from mps_backend.pages import PageReleaser, ScratchFile, map_copy_on_write, mapped_tensor
from mps_backend.passes import FP16_MAX, largest_magnitude
from mps_backend.runtime.program_check import max_plan_bytes


@dataclass
class LoadedLM:
    """An eager language model ready for the static decode step, with what the runner needs."""

    model: torch.nn.Module
    kind: str  # "hf" (a transformers model: hf: and gguf: checkpoints) or "llama" (executorch's llama)
    model_type: str
    n_layers: int
    vocab_size: int
    max_positions: int
    bos_id: int | None
    eos_ids: list[int]
    dtype: torch.dtype
    source_dtype: torch.dtype | None
    weight_bytes: int  # the checkpoint's tensor bytes on disk
    tokenizer_path: pathlib.Path | None = None
    notes: list[str] = field(default_factory=list)
    #: what a family resolved from the checkpoint for its program at load (Whisper: the decoding rules of its
    #: generation config, :func:`mps_backend.llm.whisper_decoding.decoder_rules`); None for the others
    decoding: Any = None


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _transformers_step(folder: pathlib.Path, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a transformers call that reads the folder's config: whatever it refuses
    the config with (its strict-dataclass validation errors, ValueError, TypeError, KeyError ... of a config
    that passed :func:`~mps_backend.llm.folder_check.check_folder`'s bounded checks) becomes one
    :class:`CheckpointError` line."""
    try:
        return fn(*args, **kwargs)
    except (MPSBackendError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - any refusal of the file's contents (found by harness.fuzz_checkpoint)
        detail = " ".join(line.strip() for line in str(e).splitlines() if line.strip())[:300]
        raise CheckpointError(f"{folder / 'config.json'}: transformers could not {what} it: {type(e).__name__}: {detail}") from e


def _token_ids(
    folder: pathlib.Path, gen: dict, config: Any, key: str, vocab: int, where: pathlib.Path | None = None
) -> list[int]:
    """The token ids ``key`` (``bos_token_id``, ``eos_token_id``) of generation_config.json, else of the
    config: an id or a list of ids, each a token of the vocabulary; anything else is a CheckpointError
    naming ``where`` (default: the folder's JSON file the ids came from)."""
    where = where or folder / ("generation_config.json" if key in gen else "config.json")
    value = gen[key] if key in gen else getattr(config, key, None)
    values = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
            raise CheckpointError(f"{where}: {key} {str(value)[:80]} is not a token id (an integer in [0, {vocab}))")
    return list(values)


def check_fp16_range(model: torch.nn.Module, *, clamp: bool = False) -> int:
    """Find float16 weights that overflowed (inf where the checkpoint held a finite value beyond
    ±65504) after a conversion to float16. Raise :class:`CheckpointError` naming the first tensors,
    or, with ``clamp``, clamp them to ±65504 in place; return how many values were clamped."""
    bad: list[str] = []
    clamped = 0
    pages = PageReleaser()  # a weight mapped from the checkpoint is not kept resident by this look
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.dtype != torch.float16:
            continue
        over = torch.isinf(t)
        pages.release(t)
        if not over.any():
            continue
        n = int(over.sum())
        if clamp:
            with torch.no_grad():
                t.clamp_(-FP16_MAX, FP16_MAX)
            clamped += n
        else:
            bad.append(f"{name} ({n} values)")
    if bad:
        raise CheckpointError(
            "weights outside the float16 range (|x| > 65504) in "
            + ", ".join(bad[:5])
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            + ": export with --dtype fp32, or --clamp-fp16 to clamp them to ±65504"
        )
    return clamped


def _read_tensor(
    f: Any, path: pathlib.Path, name: str, dtype: torch.dtype, shape: list[int], start: int, end: int
) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype)  # its span checked against its shape (read_safetensors_header)
    nbytes = t.numel() * t.element_size()
    if nbytes:
        # read straight into the tensor's memory (no intermediate buffer). Nothing frees a weight early:
        # its storage lives until the last reference goes, which export_llm drops stage by stage (the
        # loaded model, the decoder, the exported program: `del` once the delegate blob holds the weights)
        f.seek(start)
        if f.readinto(memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")) != nbytes:
            raise CheckpointError(f"{path}: tensor {name} is truncated")
    return t


#: bytes of a checkpoint tensor converted at once when the result goes to a scratch file
CONVERT_BLOCK_BYTES = 1 << 24


class _ConvertOnRead(abc.ABC):
    """A checkpoint tensor stored otherwise than in the export's dtype, as transformers' loader sees a
    safetensors slice: ``t[...]`` reads it (:meth:`_rows`, a subclass's), converts it to the export
    dtype and checks the float16 range (an overflow is recorded in ``overflows``, or clamped with
    ``clamp``, and raised after loading). With a ``scratch`` folder it is read and converted a block of
    rows at a time (:meth:`_row_bytes` each, :data:`CONVERT_BLOCK_BYTES` at once), written there and
    mapped back (:class:`mps_backend.pages.ScratchFile`): file-backed pages the blob writer hands back,
    so the converted weights are never resident as a whole either."""

    def __init__(
        self, name: str, shape: list[int], nbytes: int, dtype: torch.dtype, clamp: bool, overflows: list, bar: Any, scratch
    ):
        self.name, self.nbytes, self.dtype = name, nbytes, dtype
        self.clamp, self.overflows, self.bar, self.scratch = clamp, overflows, bar, scratch
        self.shape = torch.Size(shape)

    def get_shape(self) -> list[int]:
        return list(self.shape)

    @abc.abstractmethod
    def _row_bytes(self) -> int:
        """Bytes of one row (first dimension) that one block's size is counted in."""
        raise NotImplementedError

    @abc.abstractmethod
    def _rows(self, source: Any, first: int, count: int) -> torch.Tensor:
        """Rows ``first .. first + count`` of the tensor (all of a 0-d one), as stored, from ``source``
        (:meth:`_open`)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _open(self) -> Any:
        """A context manager giving :meth:`_rows` its source (an open file)."""
        raise NotImplementedError

    def __getitem__(self, index: Any) -> torch.Tensor:
        shape = list(self.shape)
        rows = int(shape[0]) if shape else 1
        # with a scratch folder, a block of rows at a time: no whole-tensor temporaries
        per = max(1, CONVERT_BLOCK_BYTES // max(1, self._row_bytes())) if self.scratch is not None and shape else rows
        out = ScratchFile(self.scratch, self.name) if self.scratch is not None else None
        over, t = 0, None
        try:
            with self._open() as source:
                for r in range(0, rows, per) if rows else [0]:
                    t, n = self._converted(self._rows(source, r, min(per, rows - r)))
                    over += n
                    if out is not None:
                        out.append(t)
        except BaseException:
            if out is not None:
                out.discard()
            raise
        if over:
            self.overflows.append((self.name, over))
        if self.bar is not None:
            self.bar.update(self.nbytes)
        if out is not None:
            t = out.mapped(self.dtype, shape)
            PageReleaser().trim()  # the blocks' buffers
        assert t is not None
        return t[index]

    def _converted(self, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        """``t`` in the export dtype, and how many of its values overflowed float16 (then clamped)."""
        # a reduction first: no whole-tensor temporaries unless something overflows
        if self.dtype == torch.float16 and t.numel() and largest_magnitude(t) > FP16_MAX:
            converted = t.to(self.dtype)
            over = torch.isinf(converted) & torch.isfinite(t)
            n = int(over.sum())
            if n:
                converted.clamp_(-FP16_MAX, FP16_MAX)
            return converted, n
        return t.to(self.dtype), 0


class _SafetensorsOnRead(_ConvertOnRead):
    """A safetensors tensor in another float dtype than the export's, read with a plain file read (a
    mapping's pages would stay resident next to the converted copy)."""

    def __init__(self, path: pathlib.Path, name: str, entry: TensorEntry, dtype, clamp, overflows, bar, scratch=None):
        super().__init__(name, list(entry.shape), entry.end - entry.start, dtype, clamp, overflows, bar, scratch)
        self.path, self.entry = path, entry

    def _row_bytes(self) -> int:
        return self.nbytes // max(1, int(self.shape[0]) if self.shape else 1)

    def _open(self) -> Any:
        return open(self.path, "rb", buffering=0)

    def _rows(self, source: Any, first: int, count: int) -> torch.Tensor:
        file_dtype, shape, start, end = self.entry.torch_dtype, self.entry.shape, self.entry.start, self.entry.end
        rows = max(1, int(shape[0]) if shape else 1)
        part_shape = [count, *shape[1:]] if shape else []
        lo = start + (end - start) * first // rows
        hi = start + (end - start) * (first + count) // rows if shape else end
        return _read_tensor(source, self.path, self.name, file_dtype, part_shape, lo, hi)


def _checkpoint_tensors(
    folder: pathlib.Path, dtype: torch.dtype, *, clamp_fp16: bool, overflows: list, bar: Any, scratch: pathlib.Path | None = None
) -> dict:
    """The checkpoint's tensors by their names in the files, as transformers' loader takes them: a
    tensor stored in ``dtype`` (or a non-float one) is mapped from the file, not read
    (:mod:`mps_backend.pages`: the blob writer reads its pages and hands them back, so the weights are
    never resident as a whole next to the blob); one to convert is a :class:`_SafetensorsOnRead` (mapped
    from ``scratch`` once converted, when given)."""
    files = weight_files(folder)  # the index's shards (or the one file): no other file is read
    if not files:
        raise CheckpointError(
            f"{folder}: no *.safetensors weights (other formats: convert with transformers' "
            "save_pretrained(..., safe_serialization=True))"
        )
    tensors: dict[str, Any] = {}
    for path in files:
        mapping = None
        for name, entry in read_safetensors_header(path).items():
            file_dtype, shape, start, end = entry.torch_dtype, entry.shape, entry.start, entry.end
            t = None
            if file_dtype == dtype or not file_dtype.is_floating_point:
                if mapping is None:
                    mapping = map_copy_on_write(path)
                t = mapped_tensor(mapping, start, file_dtype, shape)
                if t is None:  # empty or unaligned: read
                    with open(path, "rb", buffering=0) as f:
                        t = _read_tensor(f, path, name, file_dtype, shape, start, end)
                if bar is not None:
                    bar.update(end - start)
            else:
                t = _SafetensorsOnRead(path, name, entry, dtype, clamp_fp16, overflows, bar, scratch)
            tensors[name] = t
    return tensors


def _dtype_of_checkpoint(config: Any) -> torch.dtype | None:
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) else None


def _hf_weight_bytes(folder: pathlib.Path) -> int:
    """Bytes of the tensors in the checkpoint's safetensors files."""
    return sum(e.end - e.start for f in weight_files(folder) for e in read_safetensors_header(f).values())


def load_state_dict_into(
    model_class: Any,
    config: Any,
    tensors: Callable[[Any, list], dict],
    dtype: torch.dtype,
    *,
    where: str,
    missing_in: str,
    clamp_fp16: bool,
    progress: Any,
) -> tuple[torch.nn.Module, int]:
    """``model_class`` built by transformers' own ``from_pretrained`` from ``config`` (on the meta device,
    then its key renames, weight conversions and tied weights), its weights the state dict
    ``tensors(progress, overflows)`` (mapped, or converted on read: :class:`_ConvertOnRead`). Returns
    the model in eval mode without gradients and how many weight values were clamped to ±65504; a
    refusal of the tensors (``where``: its message's start), a missing or misshapen weight, a float16
    overflow without ``clamp_fp16`` are one :class:`CheckpointError` line."""
    overflows: list[tuple[str, int]] = []
    try:
        state = tensors(progress, overflows)
        try:
            model, info = model_class.from_pretrained(
                None,  # the weights are the state dict (transformers refuses a folder beside it)
                config=config,
                state_dict=state,
                dtype=dtype,
                attn_implementation="eager",
                # MoE: each token's top-k experts' weights gathered by the router's choice (index, bmm),
                # not transformers' default grouped_mm nor its loop over the experts hit (data-dependent)
                experts_implementation="batched_mm",
                local_files_only=True,
                trust_remote_code=False,
                output_loading_info=True,
            )
        except (MPSBackendError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - any refusal of the files' contents (harness.fuzz_checkpoint)
            detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise CheckpointError(f"{where}: {type(e).__name__}: {detail}") from None
        del state
    finally:
        if progress is not None:
            progress.close()
    if overflows and not clamp_fp16:
        name, n = overflows[0]
        raise CheckpointError(
            f"weights outside the float16 range (|x| > 65504) in {name} ({n} values)"
            + (f" and {len(overflows) - 1} more tensors" if len(overflows) > 1 else "")
            + ": export with --dtype fp32, or --clamp-fp16 to clamp them to ±65504"
        )
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise CheckpointError(
            f"{missing_in}: the checkpoint has no weights for {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    mismatched = sorted(info.get("mismatched_keys") or (), key=str)
    if mismatched:
        name, got, want = mismatched[0]
        raise CheckpointError(f"tensor {name}: shape {list(got)} in the checkpoint, {list(want)} in the model")
    model.eval().requires_grad_(False)
    return model, sum(n for _, n in overflows)


def load_hf(
    folder: str | pathlib.Path,
    dtype: torch.dtype,
    *,
    clamp_fp16: bool = False,
    bar: Callable[[int], Any] | None = None,
    scratch: pathlib.Path | None = None,
) -> LoadedLM:
    """A transformers causal LM from a local checkpoint folder, weights in ``dtype``. ``bar(total)``
    makes a progress bar (``update(nbytes)``, ``close()``) for the bytes read. ``scratch``: a folder
    where weights converted to ``dtype`` (e.g. bfloat16 -> float16) are written and mapped back from,
    one at a time, instead of being held in anonymous memory (see :class:`_ConvertOnRead`)."""
    folder = pathlib.Path(folder)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json (expected a Hugging Face checkpoint folder)")
    _, stored = check_folder_weights(folder)  # bounded checks of every file it will read, before any allocation (#26)
    try:
        import transformers  # noqa: PLC0415
    except ImportError as e:
        raise CheckpointError("Hugging Face checkpoints need transformers: pip install 'mps-backend[llm]'") from e

    # trust_remote_code=False: transformers never imports code from the folder nor asks on standard input
    # (check_folder refused an auto_map for a model type it does not ship)
    config = _transformers_step(
        folder, "read", transformers.AutoConfig.from_pretrained, folder, local_files_only=True, trust_remote_code=False
    )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = str(getattr(config, "model_type", "?"))
    notes = []
    if getattr(config, "auto_map", None):
        notes.append(f"config.json's auto_map ignored: transformers' own {model_type} code is used, never the folder's")
    if model_type not in TESTED_MODEL_TYPES:
        notes.append(f"model type {model_type!r} is not among the tested ones ({', '.join(TESTED_MODEL_TYPES)})")
    source = _dtype_of_checkpoint(config)
    if source == torch.bfloat16 and dtype == torch.float16:
        notes.append("bfloat16 checkpoint: weights converted to float16 (the MPS delegate has no bfloat16)")
    # eager attention: transformers' plain matmul/softmax attention (every architecture has it;
    # some, like Gemma 2's soft-capped attention, have no sdpa path). transformers' own loading builds
    # the model on the meta device and applies its key renames, weight conversions (MoE experts fused
    # into one tensor, ...) and tied weights to the tensors given as its state dict (mapped or read
    # here, see _checkpoint_tensors); the buffers it computes itself (rotary tables).
    weight_bytes = _hf_weight_bytes(folder)
    from transformers.models.auto import modeling_auto  # noqa: PLC0415

    mapping = getattr(modeling_auto, registration("hf", model_type).transformers_mapping)
    if type(config) not in mapping:
        raise CheckpointError(f"{folder}: model type {model_type!r} has no *ForCausalLM class in transformers")
    model_class = mapping[type(config)]
    _transformers_step(folder, "build a model from", check_declared_weights, folder, model_class, config, stored)
    model, clamped = load_state_dict_into(
        model_class,
        config,
        lambda progress, overflows: _checkpoint_tensors(
            folder, dtype, clamp_fp16=clamp_fp16, overflows=overflows, bar=progress, scratch=scratch
        ),
        dtype,
        where=f"{folder}: transformers cannot load this {model_type} checkpoint",
        missing_in=str(folder),
        clamp_fp16=clamp_fp16,
        progress=bar(weight_bytes) if bar is not None else None,
    )
    if clamped:
        notes.append(f"{clamped} weight values beyond ±65504 clamped to the float16 range")
    gen = json_object(folder, "generation_config.json") or {}
    vocab = int(text.vocab_size)
    bos = _token_ids(folder, gen, config, "bos_token_id", vocab)
    eos = _token_ids(folder, gen, config, "eos_token_id", vocab)
    tok = folder / "tokenizer.json"
    return LoadedLM(
        model=model,
        kind="hf",
        model_type=model_type,
        # an encoder-decoder's: its decoder's (the layers with a KV cache, the positions it embeds)
        n_layers=int(getattr(text, "decoder_layers", None) or text.num_hidden_layers),
        vocab_size=int(text.vocab_size),
        max_positions=int(getattr(text, "max_target_positions", None) or getattr(text, "max_position_embeddings", 0) or 0),
        bos_id=bos[0] if bos else None,
        eos_ids=eos,
        dtype=dtype,
        source_dtype=source,
        weight_bytes=weight_bytes,
        tokenizer_path=tok if tok.is_file() else None,
        notes=notes,
    )


def check_kv_cache_size(n_layers: int, kv_heads: int, head_dim: float, max_seq_len: int, dtype: torch.dtype) -> None:
    """Refuse, before anything is allocated, a KV cache the runtime could never plan: the K and V buffers
    of every layer beyond the program check's memory-plan budget (``MPS_BACKEND_MAX_PLAN_BYTES``, 4 GiB)."""
    per_token = round(2 * int(n_layers) * int(kv_heads) * float(head_dim) * torch.empty((), dtype=dtype).element_size())
    need, budget = per_token * int(max_seq_len), max_plan_bytes()
    if need >= budget:
        raise CheckpointError(
            f"--max-seq-len {max_seq_len}: the KV cache would take {need / 2**30:.3g} GiB "
            f"({per_token} bytes per position), beyond the {budget / 2**30:.3g} GiB a program's planned memory may hold "
            f"(MPS_BACKEND_MAX_PLAN_BYTES); at most {max(2, (budget - 1) // per_token)} positions fit"
        )


def load_llama(
    checkpoint: str | pathlib.Path,
    params: str | pathlib.Path | None,
    dtype: torch.dtype,
    max_seq_len: int,
    *,
    clamp_fp16: bool = False,
    bar: Callable[[int], Any] | None = None,
) -> LoadedLM:
    """executorch's example llama with its KV cache, weights from a Meta-format ``.pth`` (memory
    mapped). ``bar(total)`` makes a progress bar (``update(nbytes)``, ``close()``) for the checkpoint
    bytes converted to ``dtype`` (a tensor already in ``dtype`` stays mapped and counts at once)."""
    checkpoint = pathlib.Path(checkpoint)
    params = pathlib.Path(params) if params else checkpoint.with_name("params.json")
    if not checkpoint.is_file():
        raise CheckpointError(f"{checkpoint}: no such checkpoint file")
    if not params.is_file():
        raise CheckpointError(f"{params}: no such params file (give --params params.json)")
    from executorch.examples.models.llama.llama_transformer import construct_transformer  # noqa: PLC0415
    from executorch.examples.models.llama.model_args import ModelArgs  # noqa: PLC0415

    p = read_json_object(params)
    known = set(ModelArgs.__dataclass_fields__)
    args = ModelArgs(
        **{k: v for k, v in p.items() if k in known},
        use_kv_cache=True,
        max_seq_len=max_seq_len,
        max_context_len=max_seq_len,
        generate_full_logits=False,
    )
    n_kv = args.n_kv_heads or args.n_heads
    check_kv_cache_size(args.n_layers, n_kv, args.head_dim or args.dim // args.n_heads, max_seq_len, dtype)
    state = _load_pickle(checkpoint)
    if "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    weight_bytes = sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    if args.vocab_size <= 0:
        args.vocab_size = int(state["tok_embeddings.weight"].shape[0])
    with torch.device("meta"):
        model = construct_transformer(args)
    sources = {t.dtype for t in state.values() if isinstance(t, torch.Tensor) and t.is_floating_point()}
    progress = bar(weight_bytes) if bar is not None else None
    try:
        converted = {}
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                if v.is_floating_point():
                    v = v.to(dtype)  # reads the mapped pages when it converts
                if progress is not None:
                    progress.update(v.numel() * state[k].element_size())
            converted[k] = v
        state = converted
    finally:
        if progress is not None:
            progress.close()
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    del state
    missing = [k for k in missing if not _derived_llama_buffer(k)]
    if missing:
        raise CheckpointError(f"{checkpoint}: missing weights {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    _materialize_llama_buffers(model, args, dtype)
    model.eval().requires_grad_(False)
    notes = [f"ignored checkpoint entries: {', '.join(unexpected[:5])}"] if unexpected else []
    if dtype == torch.float16:
        clamped = check_fp16_range(model, clamp=clamp_fp16)
        if clamped:
            notes.append(f"{clamped} weight values beyond ±65504 clamped to the float16 range")
    tok = next(
        (f for f in (checkpoint.with_name("tokenizer.model"), checkpoint.with_name("tokenizer.json")) if f.is_file()), None
    )
    return LoadedLM(
        model=model,
        kind="llama",
        model_type="llama",
        n_layers=args.n_layers,
        vocab_size=args.vocab_size,
        max_positions=0,
        bos_id=p.get("bos_id"),
        eos_ids=_ids(p.get("eos_ids", p.get("eos_id"))),
        dtype=dtype,
        source_dtype=next(iter(sources)) if len(sources) == 1 else None,
        weight_bytes=weight_bytes,
        tokenizer_path=tok,
        notes=notes,
    )


def _load_pickle(checkpoint: pathlib.Path) -> dict:
    """The state dict of a ``.pth`` through ``torch.load(weights_only=True)``: its unpickler builds only
    tensors and plain containers and executes nothing (a ``__reduce__`` naming a function is refused);
    a refusal or a damaged file becomes one :class:`CheckpointError` line."""
    try:
        state = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as e:
        text = str(e)
        found = re.search(r"WeightsUnpickler error: ([^\n]*)", text)
        lines = [line for line in text.splitlines() if line.strip()]
        detail = (found.group(1) if found else lines[0] if lines else type(e).__name__)[:160]
        if isinstance(e, pickle.UnpicklingError):
            detail = f"the pickle would run code or build objects other than tensors: {detail}"
        raise CheckpointError(f"{checkpoint}: refused by torch.load(weights_only=True): {detail}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{checkpoint}: not a state dict (a {type(state).__name__})")
    return state


def _derived_llama_buffer(name: str) -> bool:
    """Buffers executorch's llama computes itself (rope tables, masks, KV caches)."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf in {"freqs_cos", "freqs_sin", "mask", "k_cache", "v_cache", "cache_positions"} or "rope" in name


def _materialize_llama_buffers(model: torch.nn.Module, args: Any, dtype: torch.dtype) -> None:
    """Rebuild the derived buffers left on the meta device from a one-layer, one-token-vocabulary
    twin built on the CPU (every layer's buffers have the same shape and contents: rope tables,
    masks), then give every float buffer the weights' dtype, as executorch's own llama export does
    with ``model.to(dtype)``: rope tables and the KV caches (which executorch's KVCache creates on the
    CPU in float32 whatever the device, so they are never meta)."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer  # noqa: PLC0415

    buffers = list(model.named_buffers(remove_duplicate=False))  # a buffer two modules share: both
    meta = any(b.is_meta for _, b in buffers)
    twin = dict(construct_transformer(dataclasses.replace(args, vocab_size=1, n_layers=1)).named_buffers()) if meta else {}
    done: dict[int, torch.Tensor] = {}  # id of a buffer -> what replaces it, once per tensor
    for name, buffer in buffers:
        module_name, _, leaf = name.rpartition(".")
        value = done.get(id(buffer))
        if value is None:
            value = buffer
            if buffer.is_meta:
                parts = name.split(".")
                if len(parts) > 2 and parts[0] == "layers":
                    parts[1] = "0"
                value = twin[".".join(parts)].clone()
            if value.is_floating_point() and value.dtype != dtype:
                value = value.to(dtype)
            done[id(buffer)] = value
        if value is not buffer:
            module = model.get_submodule(module_name) if module_name else model
            module._buffers[leaf] = value
