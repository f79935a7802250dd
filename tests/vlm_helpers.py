"""Tiny random vision-language checkpoints on disk for the vision tests (nothing is downloaded): Gemma 3,
SmolVLM and LLaVA at a small width, each saved with ``save_pretrained`` beside its transformers processor
(image processor at a 32-pixel resolution, a byte-level BPE tokenizer trained here with the family's
special tokens), as a hub checkpoint folder looks; and a test picture."""

from __future__ import annotations

import pathlib

import numpy as np
import torch

from harness.fuzz_inputs import vlm_processor
from tests.llm_helpers import CORPUS

FAMILIES = ("gemma3", "smolvlm", "llava")
#: the random seed of each family's checkpoint: one whose greedy continuation varies (seed 0's LLaVA alternates two tokens)
SEEDS = {"gemma3": 0, "smolvlm": 0, "llava": 1}
#: the prompt after the image
PROMPT = "the quick brown fox"
#: the language model's shape (every family): 2 layers, 64 wide, grouped KV heads
TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 1,
}
#: the vision tower's shape: 32-pixel images
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 32}
#: planted outliers (``outliers=True``, Gemma 3 and LLaVA): these hidden channels of the text tokens of
#: :data:`OUTLIER_WORDS` reach 1e4..2e5 in the residual stream (:func:`plant_outliers`)
OUTLIER_CHANNELS = (3, 17)
OUTLIER_WORDS = (" quick", " fox")  # as the prompt holds them (byte-level BPE: the space is part of the token)
OUTLIER_RANGE = (1e4, 2e5)


def _tokenizer(specials: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<s>", "</s>", *specials], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _fast(tok, extra: dict):
    import transformers

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>", extra_special_tokens=extra
    )


def build(family: str, *, mlp_bias: bool = False):
    """(model, processor) of ``family``: random weights, transformers' own classes (``mlp_bias``: LLaVA's
    Llama with MLP biases, for the planted outliers)."""
    import transformers

    if family == "gemma3":
        tok = _tokenizer(["<start_of_image>", "<image_soft_token>", "<end_of_image>"])
        fast = _fast(tok, {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"})
        cfg = transformers.Gemma3Config(
            vision_config=transformers.SiglipVisionConfig(patch_size=4, **VISION),
            text_config=transformers.Gemma3TextConfig(
                vocab_size=tok.get_vocab_size(),
                head_dim=16,
                sliding_window=8,
                layer_types=["sliding_attention", "full_attention"],
                **TEXT,
            ),
            mm_tokens_per_image=16,
            # an output head of its own: with the tied one a random model's next token is its current one
            tie_word_embeddings=False,
            boi_token_index=tok.token_to_id("<start_of_image>"),
            eoi_token_index=tok.token_to_id("<end_of_image>"),
            image_token_index=tok.token_to_id("<image_soft_token>"),
        )
        model = transformers.Gemma3ForConditionalGeneration(cfg)
        processor = vlm_processor(family, fast)
    elif family == "smolvlm":
        grid = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
        tok = _tokenizer(["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>", *grid])
        fast = _fast(
            tok,
            {
                "image_token": "<image>",
                "fake_image_token": "<fake_token_around_image>",
                "global_image_token": "<global-img>",
                "end_of_utterance_token": "<end_of_utterance>",
            },
        )
        cfg = transformers.SmolVLMConfig(
            vision_config=transformers.SmolVLMVisionConfig(patch_size=4, **VISION),
            text_config=transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), tie_word_embeddings=True, **TEXT),
            scale_factor=2,
            image_token_id=tok.token_to_id("<image>"),
        )
        model = transformers.SmolVLMForConditionalGeneration(cfg)
        # images up to 64 pixels: split into 32-pixel tiles and a global view (5 images for the test picture)
        processor = vlm_processor(family, fast)
    elif family == "llava":
        tok = _tokenizer(["<image>"])
        fast = _fast(tok, {"image_token": "<image>"})
        cfg = transformers.LlavaConfig(
            vision_config=transformers.CLIPVisionConfig(patch_size=8, projection_dim=32, **VISION),
            text_config=transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), mlp_bias=mlp_bias, **TEXT),
            image_token_id=tok.token_to_id("<image>"),
            vision_feature_layer=-2,
            vision_feature_select_strategy="default",
        )
        model = transformers.LlavaForConditionalGeneration(cfg)
        processor = vlm_processor(family, fast)
    else:
        raise ValueError(family)
    return model.eval(), processor


def plant_outliers(model, processor) -> None:
    """A few massive activations above float16's 65504, built from float16-representable weights: the
    embedding rows of :data:`OUTLIER_WORDS` carry 2e4 in :data:`OUTLIER_CHANNELS`. Gemma 3's embedding scale
    (sqrt(hidden) = 8) makes that 1.6e5 in the residual stream of those tokens' positions; LLaVA's Llama
    amplifies it in layer 0's MLP as training builds such channels (one unit per channel reads it through
    the RMSNorm, silent below a bias of -40, and writes it back 1000-fold: ~1.1e5)."""
    embed = model.get_input_embeddings().weight
    for word in OUTLIER_WORDS:
        for t in processor.tokenizer.encode(word, add_special_tokens=False):
            for c in OUTLIER_CHANNELS:
                embed[t, c] = 2e4
    if model.config.model_type == "llava":
        mlp = model.model.language_model.layers[0].mlp
        for u, c in enumerate(OUTLIER_CHANNELS):  # unit u amplifies channel c
            mlp.gate_proj.weight[u].zero_()
            mlp.gate_proj.weight[u, c] = 10.0
            mlp.gate_proj.bias[u] = -40.0
            mlp.up_proj.weight[u].zero_()
            mlp.up_proj.weight[u, c] = 1.0
            mlp.up_proj.bias[u] = 0.0
            mlp.down_proj.weight[c].zero_()
            mlp.down_proj.weight[c, u] = 1000.0


def save_vlm(folder: pathlib.Path, family: str, *, seed: int | None = None, outliers: bool = False) -> pathlib.Path:
    """Write a random ``family`` checkpoint with its processor into ``folder``."""
    seed = SEEDS[family] if seed is None else seed
    torch.manual_seed(seed)
    model, processor = build(family, mlp_bias=outliers)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if p.dim() == 1:  # trained-like norm weights and biases
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
            elif "embed_tokens" in name or "lm_head" in name:  # the next token depends on this one
                p.normal_(0.0, 1.0, generator=gen)
            else:
                p.mul_(4.0)
        if outliers:
            plant_outliers(model, processor)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def picture(seed: int = 0):
    """The test picture: 40 x 48 random pixels (a PIL image)."""
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8))


def eager(folder: pathlib.Path):
    import transformers

    return transformers.AutoModelForImageTextToText.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def processor_inputs(folder: pathlib.Path, prompt: str = PROMPT):
    from mps_backend.llm.multimodal import load_processor, process

    return process(load_processor(folder), prompt, picture())


def eager_generate(folder: pathlib.Path, n: int) -> list[int]:
    """transformers' own greedy ``generate`` on the processor's inputs (its dynamic cache, its masks): the
    new tokens, up to ``n`` (and an EOS, included)."""
    batch = processor_inputs(folder)
    with torch.no_grad():
        out = eager(folder).generate(**batch, max_new_tokens=n, do_sample=False)
    return out[0, batch["input_ids"].shape[1] :].tolist()
