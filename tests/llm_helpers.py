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
