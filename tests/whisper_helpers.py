"""Tiny random Whisper checkpoints on disk for the speech tests (nothing is downloaded): transformers'
``WhisperForConditionalGeneration`` at a small width with Whisper's real input geometry (80 mel bins,
3000 frames, 1500 encoder positions), saved with ``save_pretrained`` beside the LLM tests' tokenizer
and transformers' ``WhisperFeatureExtractor`` config, as a hub checkpoint folder looks; and a test
utterance as a 16-bit PCM ``.wav``."""

from __future__ import annotations

import pathlib
import wave

import numpy as np
import torch

#: the tokenizer's special tokens (tests/llm_helpers.train_tokenizer): <s> starts the decoder, </s> ends it
START, EOS = 0, 1
#: the shape: Whisper's input geometry, a small width
CONFIG = {
    "num_mel_bins": 80,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_source_positions": 1500,
    "max_target_positions": 64,
    "decoder_start_token_id": START,
    "bos_token_id": START,
    "eos_token_id": EOS,
    "pad_token_id": EOS,
    # Whisper's defaults name token ids of its 51865-token vocabulary
    "begin_suppress_tokens": None,
    "suppress_tokens": None,
    # an output head of its own: with the tied one a random model's next token is its current one
    "tie_word_embeddings": False,
}
#: planted outliers (``outliers=True``): hidden channels that reach 1e4..2e5 at some positions in the
#: residual stream of both stacks, as in trained transformers (a few "massive activations")
OUTLIER_CHANNELS = (3, 17)
OUTLIER_POSITIONS = {"encoder": (0, 1, 750), "decoder": (0, 1)}
OUTLIER_RANGE = (1e4, 2e5)


def plant_outliers(model) -> None:
    """Give the residual stream of the encoder and the decoder a few massive activations, built from
    float16-representable weights as training builds them: the position embeddings of
    :data:`OUTLIER_POSITIONS` carry 2e4 in :data:`OUTLIER_CHANNELS`, and layer 0's MLP amplifies them
    (one unit per channel reads it through the LayerNorm and writes it back 6000-fold), so the hidden
    states of those positions reach ~1e5 in those channels (above float16's 65504)."""
    for name in ("encoder", "decoder"):
        stack = getattr(model.model, name)
        pos = stack.embed_positions.weight
        mlp = stack.layers[0]
        for j, c in enumerate(OUTLIER_CHANNELS):
            for p in OUTLIER_POSITIONS[name]:
                pos[p, c] = 2e4
            u = j  # the MLP unit that amplifies channel c
            mlp.fc1.weight[u].zero_()
            mlp.fc1.weight[u, c] = 10.0
            mlp.fc1.bias[u] = -40.0  # silent unless LayerNorm(h)[c] > 4: the outlier positions only
            mlp.fc2.weight[c].zero_()
            mlp.fc2.weight[c, u] = 6000.0


def save_whisper(
    folder: pathlib.Path, tokenizer, *, seed: int = 0, outliers: bool = False, config: dict | None = None
) -> pathlib.Path:
    """Write a random Whisper checkpoint (config.json, model.safetensors, generation_config.json,
    tokenizer files, preprocessor_config.json) into ``folder``."""
    import transformers

    cfg = transformers.WhisperConfig(**({"vocab_size": tokenizer.get_vocab_size()} | CONFIG | (config or {})))
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if p.dim() == 1:  # trained-like LayerNorm weights and biases (initialised to ones / zeros)
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
            elif "embed_tokens" in name or "proj_out" in name:  # the next token depends on this one
                p.normal_(0.0, 1.0, generator=gen)
            elif "embed_positions" not in name:
                p.mul_(4.0)
        if outliers:
            plant_outliers(model)
    model.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    transformers.WhisperFeatureExtractor(feature_size=cfg.num_mel_bins).save_pretrained(folder)
    return folder


def utterance(seconds: float = 2.0, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """A test signal: a rising chirp with harmonics, a pause, noise (float32 in [-1, 1])."""
    t = np.arange(int(seconds * rate)) / rate
    sig = 0.3 * np.sin(2 * np.pi * (150 + 300 * t) * t) + 0.1 * np.sin(2 * np.pi * (450 + 900 * t) * t)
    sig[int(0.4 * len(t)) : int(0.55 * len(t))] = 0.0
    sig += 0.02 * np.random.default_rng(seed).standard_normal(t.size)
    return np.clip(sig, -1, 1).astype(np.float32)


def write_wav(path: pathlib.Path, samples: np.ndarray, rate: int = 16000, channels: int = 1) -> pathlib.Path:
    """``samples`` (float in [-1, 1]) as a 16-bit PCM .wav (the same signal in every channel)."""
    pcm = np.round(np.clip(samples, -1, 1) * 32767).astype("<i2")
    if channels > 1:
        pcm = np.repeat(pcm[:, None], channels, axis=1)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


def features(folder: pathlib.Path, samples: np.ndarray) -> torch.Tensor:
    """transformers' WhisperFeatureExtractor of the checkpoint on ``samples`` (16 kHz): [1, 80, 3000]."""
    import transformers

    fe = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    return fe(samples, sampling_rate=16000, return_tensors="pt").input_features


def eager_whisper(folder: pathlib.Path, dtype=torch.float32):
    import transformers

    return transformers.WhisperForConditionalGeneration.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()


def eager_generate(folder: pathlib.Path, feats: torch.Tensor, n: int) -> list[int]:
    """transformers' own greedy Whisper ``generate`` (its dynamic caches, its cross-attention cache):
    the tokens after the start token, up to ``n`` (and an EOS, included)."""
    model = eager_whisper(folder)
    with torch.no_grad():
        out = model.generate(feats, max_new_tokens=n, do_sample=False)[0].tolist()
    return out[1:] if out and out[0] == START else out
