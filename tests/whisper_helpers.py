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

#: the tests' speech clip (:func:`speech_clip`)
FIXTURE_SPEECH = pathlib.Path(__file__).resolve().parent / "fixtures" / "speech" / "fox-22050.flac"
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
    folder: pathlib.Path,
    tokenizer,
    *,
    seed: int = 0,
    outliers: bool = False,
    config: dict | None = None,
    special: tuple[str, str] = ("<s>", "</s>"),
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
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=special[0], eos_token=special[1]).save_pretrained(
        folder
    )
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


#: the language tokens of the Whisper-like tokenizer (Whisper's own order begins en, zh, de, es, ru, ko, fr)
LANGUAGES = ("en", "zh", "de", "es", "ru", "ko", "fr")
#: Whisper's timestamp tokens: <|0.00|> .. <|30.00|> every 0.02 s
TIMESTAMPS = 1501


def whisper_tokenizer(languages=LANGUAGES, timestamps: int = TIMESTAMPS):
    """A tokenizer laid out as Whisper's: byte-level BPE text tokens first, then ``<|endoftext|>``,
    ``<|startoftranscript|>``, the language tokens (none for an English-only model), the task tokens,
    ``<|startoflm|>``, ``<|startofprev|>``, ``<|nospeech|>``, ``<|notimestamps|>`` (special), then the
    timestamp tokens (added, not special: as in the hub's tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.llm_helpers import CORPUS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=160, special_tokens=[], show_progress=False))
    specials = ["<|endoftext|>", "<|startoftranscript|>", *[f"<|{lang}|>" for lang in languages]]
    specials += ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    tok.add_special_tokens(specials)
    tok.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(timestamps)])
    return tok


def whisper_generation(tok, *, multilingual: bool = True, **overrides) -> dict:
    """A generation config as the hub's Whisper checkpoints carry (openai/whisper-*'s fields) for
    :func:`whisper_tokenizer`'s ids: the start and end tokens, ``no_timestamps_token_id``, the prompt
    (multilingual: ``forced_decoder_ids`` leaving the language to detect, ``lang_to_id``, ``task_to_id``),
    ``begin_suppress_tokens`` (the space and the end) and ``suppress_tokens`` (a few rare text tokens, the task
    and prompt tokens); ``overrides`` replace fields (None removes one)."""
    ids = tok.token_to_id
    eos, sot = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    gen = {
        "decoder_start_token_id": sot,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "no_timestamps_token_id": ids("<|notimestamps|>"),
        "prev_sot_token_id": ids("<|startofprev|>"),
        "max_initial_timestamp_index": 50,
        "return_timestamps": False,
        "begin_suppress_tokens": [ids("Ġ"), eos],
        "suppress_tokens": [ids(s) for s in (",", "q", "x", "z")]
        + [ids(s) for s in ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>")],
        "is_multilingual": multilingual,
        "max_length": 448,
    }
    if multilingual:
        langs = [t for t in tok.get_vocab() if len(t) <= 6 and t.startswith("<|") and t[2:-2] in LANGUAGES]
        gen["lang_to_id"] = {t: ids(t) for t in sorted(langs, key=ids)}
        gen["task_to_id"] = {"translate": ids("<|translate|>"), "transcribe": ids("<|transcribe|>")}
        gen["forced_decoder_ids"] = [[1, None], [2, ids("<|transcribe|>")]]
    else:
        gen["forced_decoder_ids"] = [[1, ids("<|notimestamps|>")]]
    gen.update(overrides)
    return {k: v for k, v in gen.items() if v is not None}


def save_whisper_like(
    folder: pathlib.Path, tok, gen: dict, *, seed: int = 0, config: dict | None = None, timestamp_scale: float = 0.75
) -> pathlib.Path:
    """:func:`save_whisper` with :func:`whisper_tokenizer`'s layout: the model's start and end tokens
    from ``gen``, and ``gen`` as its generation_config.json. The output head's rows of the 1501 timestamp
    tokens are scaled by ``timestamp_scale``: at full scale a random model chooses them over the 160 text
    tokens nearly always (a trained one writes text between them)."""
    import json

    import safetensors.torch

    ids = {k: gen[k] for k in ("decoder_start_token_id", "bos_token_id", "eos_token_id", "pad_token_id")}
    save_whisper(folder, tok, seed=seed, config=ids | (config or {}), special=("<|endoftext|>", "<|endoftext|>"))
    weights = safetensors.torch.load_file(folder / "model.safetensors")
    weights["proj_out.weight"][gen["no_timestamps_token_id"] + 1 :] *= timestamp_scale
    safetensors.torch.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return folder


def generate(folder: pathlib.Path, feats: torch.Tensor, n: int, gen: dict | None = None, **kwargs) -> list[int]:
    """transformers' Whisper ``generate`` (greedy) with the checkpoint's generation config, or ``gen`` made
    the model's own (passed as ``generation_config=``, the fields it leaves unset would come back from the
    checkpoint's): every token of its sequence (the windows' generated tokens, their EOS dropped)."""
    import transformers

    model = eager_whisper(folder)
    if gen is not None:
        model.generation_config = transformers.GenerationConfig(**gen)
    with torch.no_grad():
        return model.generate(feats, max_new_tokens=n, do_sample=False, **kwargs)[0].tolist()


def speech_clip() -> tuple[np.ndarray, int]:
    """The tests' speech (tests/fixtures/speech/fox-22050.flac: espeak-ng 1.51, en-us, 150 words a minute,
    "The quick brown fox jumps over the lazy dog at nine. Then it sat on a stump over the river.",
    6.6 s, 22050 Hz, 16-bit FLAC): float32 samples and the rate."""
    import soundfile

    data, rate = soundfile.read(FIXTURE_SPEECH, dtype="float32")
    return data, rate


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance over the reference's word count (1.0 for an empty reference unless
    the hypothesis is empty too)."""
    ref, hyp = reference.split(), hypothesis.split()
    if not ref:
        return 0.0 if not hyp else 1.0
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / len(ref)
