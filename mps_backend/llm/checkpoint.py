"""Language-model checkpoints on disk -> an eager model in the export precision.

- ``hf:PATH``: a Hugging Face checkpoint folder (``config.json``, ``*.safetensors`` or
  ``pytorch_model*.bin``, tokenizer files), loaded with transformers' ``from_pretrained`` with
  ``local_files_only=True``: nothing is downloaded.
- ``llama:CHECKPOINT.pth`` with ``params.json``: a Meta / executorch llama checkpoint, loaded into
  executorch's example llama (``executorch.examples.models.llama``) with its KV cache.

The weights are loaded straight into the export precision (float16 for ``fp16``, float32 for
``fp32``): the MPS delegate computes in that precision anyway, and loading at it avoids a second copy
of the model. bfloat16 has no MPS support, so a bfloat16 checkpoint becomes float16 (or float32).
A weight that does not fit float16 (|x| > 65504) is an error naming the tensor, or is clamped to
±65504 when asked (``clamp_fp16=True``).
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

#: transformers ``model_type`` values the project tests (tests/test_llm.py, tiny random checkpoints)
TESTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text")

FP16_MAX = float(torch.finfo(torch.float16).max)


class CheckpointError(ValueError):
    """A checkpoint cannot be exported as asked (missing file, unsupported model, float16 overflow)."""


@dataclass
class LoadedLM:
    """An eager language model ready for the static decode step, with what the runner needs."""

    model: torch.nn.Module
    kind: str  # "hf" or "llama"
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


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _read_json(path: pathlib.Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e


def check_fp16_range(model: torch.nn.Module, *, clamp: bool = False) -> int:
    """Find float16 weights that overflowed (inf where the checkpoint held a finite value beyond
    ±65504) after a conversion to float16. Raise :class:`CheckpointError` naming the first tensors,
    or, with ``clamp``, clamp them to ±65504 in place; return how many values were clamped."""
    bad: list[str] = []
    clamped = 0
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.dtype != torch.float16:
            continue
        over = torch.isinf(t)
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
            "weights outside the float16 range (|x| > 65504) in " + ", ".join(bad[:5])
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            + ": export with --dtype fp32, or --clamp-fp16 to clamp them to ±65504")
    return clamped


def _dtype_of_checkpoint(config: Any) -> torch.dtype | None:
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) else None


def _hf_weight_bytes(folder: pathlib.Path) -> int:
    files = list(folder.glob("*.safetensors")) or list(folder.glob("pytorch_model*.bin"))
    if not files:
        return 0
    if files[0].suffix == ".safetensors":
        from safetensors import safe_open  # noqa: PLC0415

        total = 0
        for f in files:
            with safe_open(str(f), "pt") as st:
                for key in st.keys():
                    sl = st.get_slice(key)
                    numel = 1
                    for d in sl.get_shape():
                        numel *= d
                    total += numel * _SAFETENSORS_ITEMSIZE.get(sl.get_dtype(), 4)
        return total
    return sum(f.stat().st_size for f in files)


_SAFETENSORS_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                         "U8": 1, "BOOL": 1}


def load_hf(folder: str | pathlib.Path, dtype: torch.dtype, *, clamp_fp16: bool = False,
            say: Callable[[str], None] = lambda m: None) -> LoadedLM:
    """A transformers causal LM from a local checkpoint folder, weights in ``dtype``."""
    folder = pathlib.Path(folder)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json (expected a Hugging Face checkpoint folder)")
    try:
        import transformers  # noqa: PLC0415
    except ImportError as e:
        raise CheckpointError("Hugging Face checkpoints need transformers: pip install 'mps-backend[llm]'") from e

    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = str(getattr(config, "model_type", "?"))
    notes = []
    if model_type not in TESTED_MODEL_TYPES:
        notes.append(f"model type {model_type!r} is not among the tested ones ({', '.join(TESTED_MODEL_TYPES)})")
    source = _dtype_of_checkpoint(config)
    if source == torch.bfloat16 and dtype == torch.float16:
        notes.append("bfloat16 checkpoint: weights converted to float16 (the MPS delegate has no bfloat16)")
    # eager attention: transformers' plain matmul/softmax attention (every architecture has it;
    # some, like Gemma 2's soft-capped attention, have no sdpa path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=dtype, attn_implementation="eager")
    model.eval().requires_grad_(False)
    if dtype == torch.float16:
        clamped = check_fp16_range(model, clamp=clamp_fp16)
        if clamped:
            notes.append(f"{clamped} weight values beyond ±65504 clamped to the float16 range")
    gen = _read_json(folder / "generation_config.json")
    bos = gen.get("bos_token_id", getattr(config, "bos_token_id", None))
    eos = _ids(gen.get("eos_token_id", getattr(config, "eos_token_id", None)))
    tok = folder / "tokenizer.json"
    return LoadedLM(model=model, kind="hf", model_type=model_type, n_layers=int(text.num_hidden_layers),
                    vocab_size=int(text.vocab_size), max_positions=int(getattr(text, "max_position_embeddings", 0) or 0),
                    bos_id=None if bos is None else int(_ids(bos)[0]), eos_ids=eos, dtype=dtype, source_dtype=source,
                    weight_bytes=_hf_weight_bytes(folder), tokenizer_path=tok if tok.is_file() else None,
                    notes=notes)


def load_llama(checkpoint: str | pathlib.Path, params: str | pathlib.Path | None, dtype: torch.dtype,
               max_seq_len: int, *, clamp_fp16: bool = False) -> LoadedLM:
    """executorch's example llama with its KV cache, weights from a Meta-format ``.pth``."""
    checkpoint = pathlib.Path(checkpoint)
    params = pathlib.Path(params) if params else checkpoint.with_name("params.json")
    if not checkpoint.is_file():
        raise CheckpointError(f"{checkpoint}: no such checkpoint file")
    if not params.is_file():
        raise CheckpointError(f"{params}: no such params file (give --params params.json)")
    from executorch.examples.models.llama.llama_transformer import construct_transformer  # noqa: PLC0415
    from executorch.examples.models.llama.model_args import ModelArgs  # noqa: PLC0415

    p = _read_json(params)
    known = set(ModelArgs.__dataclass_fields__)
    args = ModelArgs(**{k: v for k, v in p.items() if k in known}, use_kv_cache=True,
                     max_seq_len=max_seq_len, max_context_len=max_seq_len, generate_full_logits=False)
    state = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)
    if "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    weight_bytes = sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    if args.vocab_size <= 0:
        args.vocab_size = int(state["tok_embeddings.weight"].shape[0])
    with torch.device("meta"):
        model = construct_transformer(args)
    sources = {t.dtype for t in state.values() if isinstance(t, torch.Tensor) and t.is_floating_point()}
    state = {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in state.items()}
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
    tok = next((f for f in (checkpoint.with_name("tokenizer.model"), checkpoint.with_name("tokenizer.json"))
                if f.is_file()), None)
    return LoadedLM(model=model, kind="llama", model_type="llama", n_layers=args.n_layers, vocab_size=args.vocab_size,
                    max_positions=0, bos_id=p.get("bos_id"), eos_ids=_ids(p.get("eos_ids", p.get("eos_id"))),
                    dtype=dtype, source_dtype=next(iter(sources)) if len(sources) == 1 else None,
                    weight_bytes=weight_bytes, tokenizer_path=tok, notes=notes)


def _derived_llama_buffer(name: str) -> bool:
    """Buffers executorch's llama computes itself (rope tables, masks, KV caches)."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf in {"freqs_cos", "freqs_sin", "mask", "k_cache", "v_cache", "cache_positions"} or "rope" in name


def _materialize_llama_buffers(model: torch.nn.Module, args: Any, dtype: torch.dtype) -> None:
    """Rebuild the derived buffers left on the meta device from a one-layer, one-token-vocabulary
    twin built on the CPU (every layer's buffers have the same shape and contents: rope tables,
    masks, empty KV caches); KV caches take the weights' dtype."""
    import dataclasses  # noqa: PLC0415

    from executorch.examples.models.llama.llama_transformer import construct_transformer  # noqa: PLC0415

    meta = [name for name, b in model.named_buffers() if b.is_meta]
    if not meta:
        return
    twin = dict(construct_transformer(dataclasses.replace(args, vocab_size=1, n_layers=1)).named_buffers())
    for name in meta:
        module_name, _, leaf = name.rpartition(".")
        parts = name.split(".")
        if len(parts) > 2 and parts[0] == "layers":
            parts[1] = "0"
        value = twin[".".join(parts)].clone()
        if value.is_floating_point() and "cache" in leaf:
            value = value.to(dtype)
        module = model.get_submodule(module_name) if module_name else model
        module._buffers[leaf] = value
