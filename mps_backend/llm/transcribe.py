"""Speech to text with an exported Whisper ``.pte`` on the emulated MPS runtime.

    from mps_backend.llm.transcribe import transcribe
    print(transcribe("whisper.pte", "speech.wav", "./whisper-tiny").text)

The loop is executorch's ASR runner's (``extension/asr/runner/runner.cpp`` at v1.1.0, the same in
``seq2seq_runner.cpp`` at v1.4.0; the 1.5.1 wheel binds neither), written out over
:class:`mps_backend.runtime.LoadedMethod`: ``encoder`` once on the features, which must return one
tensor (runner.cpp:216-231); then, from ``decoder_start_token_id`` at cache position 0,
``text_decoder(token [1, 1], that tensor, cache_position [1])`` once per token, the next token the
argmax of its logits (temperature 0, runner.cpp:243-298), until an id of ``get_eos_ids`` (read as
``llm::get_eos_ids`` reads it, llm_runner_helper.cpp:153-178) or ``max_new_tokens``
(runner.cpp:267, 316-318). The runner itself does not stop at the cache's length; this loop refuses a
``max_new_tokens`` beyond ``get_max_seq_len``.

Features come from transformers' own ``WhisperFeatureExtractor`` (the checkpoint folder's
``preprocessor_config.json``, else Whisper's defaults with the program's mel bins), the audio from a
PCM ``.wav`` read with the standard library's :mod:`wave`.
"""

from __future__ import annotations

import pathlib
import time
import wave
from dataclasses import dataclass, field

import torch

#: the sample rate Whisper's feature extractor expects
SAMPLE_RATE = 16000


@dataclass
class Transcription:
    text: str
    #: the decoder's tokens: the start token, then the generated ones (as the runner returns them)
    tokens: list[int]
    stopped_by: str
    encoder_seconds: float = 0.0
    decode_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def stats(self) -> str:
        n = len(self.tokens) - 1
        rate = n / self.decode_seconds if self.decode_seconds > 0 else 0.0
        return (
            f"{n} tokens ({self.stopped_by}); emulated on this CPU, not a device: encoder {self.encoder_seconds:.2f}s, "
            f"decode {rate:.1f} tokens/s"
        )


def read_wav(path: str | pathlib.Path) -> tuple[torch.Tensor, int]:
    """A PCM ``.wav`` (8-bit unsigned, 16/24/32-bit signed; channels averaged) as float32 samples in
    [-1, 1] and its sample rate."""
    import numpy as np  # noqa: PLC0415

    try:
        with wave.open(str(path), "rb") as w:
            width, channels, rate, n = w.getsampwidth(), w.getnchannels(), w.getframerate(), w.getnframes()
            raw = w.readframes(n)
    except (wave.Error, EOFError) as e:
        raise ValueError(f"{path}: not a PCM .wav file the wave module reads ({e})") from None
    if width == 1:
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width in (2, 4):
        samples = np.frombuffer(raw, dtype=f"<i{width}").astype(np.float32) / float(2 ** (8 * width - 1))
    elif width == 3:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        samples = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
    else:
        raise ValueError(f"{path}: {8 * width}-bit samples are not supported (8, 16, 24 or 32-bit PCM)")
    if channels > 1:
        samples = samples[: len(samples) // channels * channels].reshape(-1, channels).mean(axis=1)
    if samples.size == 0:
        raise ValueError(f"{path}: no samples")
    return torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)), rate


def resample(samples: torch.Tensor, rate: int, to: int = SAMPLE_RATE) -> torch.Tensor:
    """Linear interpolation to ``to`` Hz (no low-pass filter: a rate above 16 kHz aliases what lies
    above 8 kHz, a band Whisper's 80 or 128 mel bins hardly cover)."""
    import numpy as np  # noqa: PLC0415

    if rate == to:
        return samples
    n = max(1, round(len(samples) * to / rate))
    x = np.arange(n) * (rate / to)
    return torch.from_numpy(np.interp(x, np.arange(len(samples)), samples.numpy()).astype(np.float32))


def feature_extractor(folder: str | pathlib.Path | None, n_mels: int):
    """transformers' ``WhisperFeatureExtractor``: the folder's ``preprocessor_config.json`` if it has one,
    else Whisper's defaults with ``n_mels`` bins; its bins must be the program's."""
    from transformers import WhisperFeatureExtractor  # noqa: PLC0415

    p = pathlib.Path(folder) if folder else None
    if p is not None and p.is_dir() and (p / "preprocessor_config.json").is_file():
        fe = WhisperFeatureExtractor.from_pretrained(p, local_files_only=True, trust_remote_code=False)
    else:
        fe = WhisperFeatureExtractor(feature_size=n_mels)
    if fe.feature_size != n_mels:
        raise ValueError(f"{p}/preprocessor_config.json: {fe.feature_size} mel bins, the program's encoder takes {n_mels}")
    return fe


def _encoder_input(pte) -> tuple[int, int]:
    """(mel bins, frames) of the program's ``encoder`` input."""
    from mps_backend.runtime.emulator import program_input_specs  # noqa: PLC0415

    specs = program_input_specs(pte, method="encoder")
    if len(specs) != 1 or len(specs[0][0]) != 3:
        raise ValueError(f"the program's encoder takes {specs}, not one features tensor [1, n_mels, frames]")
    return int(specs[0][0][1]), int(specs[0][0][2])


def transcribe_ids(
    pte: str | pathlib.Path | bytes,
    features: torch.Tensor,
    max_new_tokens: int | None = None,
    *,
    stop_at_eos: bool = True,
    logits: list[torch.Tensor] | None = None,
    result: Transcription | None = None,
) -> list[int]:
    """The ASR runner's loop (the module doc) on ``features`` ``[1, n_mels, 3000]``: the start token
    and the greedy tokens after it. ``logits``: a list receiving each step's logits."""
    from mps_backend.runtime import LoadedMethod, constant_method_values  # noqa: PLC0415

    meta = constant_method_values(pte)
    for name in ("decoder_start_token_id", "get_max_seq_len"):
        if name not in meta:
            raise ValueError(f"the program has no {name} method: not a Whisper export (mps-backend export --model hf:...)")
    max_len = int(meta["get_max_seq_len"])
    n = max_len if max_new_tokens is None else int(max_new_tokens)
    if n < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {n}")
    if n > max_len:
        raise ValueError(f"max_new_tokens {n} exceeds the decoder's cache of {max_len} positions (get_max_seq_len)")
    eos = meta.get("get_eos_ids")
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    encoder, decoder = LoadedMethod(pte, "encoder"), LoadedMethod(pte, "text_decoder")
    t0 = time.perf_counter()
    outputs = encoder([features])
    if len(outputs) != 1 or not isinstance(outputs[0], torch.Tensor):  # runner.cpp:224-228
        raise ValueError(f"the encoder returned {len(outputs)} outputs; the ASR runner needs a single tensor")
    cross = outputs[0]
    t1 = time.perf_counter()
    tokens = [int(meta["decoder_start_token_id"])]
    stopped = "max_new_tokens"
    for cache_position in range(n):
        step = decoder([torch.tensor([[tokens[-1]]]), cross, torch.tensor([cache_position])])[0].reshape(-1)
        if logits is not None:
            logits.append(step.float().clone())
        tokens.append(int(torch.argmax(step)))  # logits_to_token at temperature 0
        if stop_at_eos and tokens[-1] in eos:
            stopped = "EOS"
            break
    if result is not None:
        result.encoder_seconds, result.decode_seconds, result.stopped_by = t1 - t0, time.perf_counter() - t1, stopped
    return tokens


def transcribe(
    pte: str | pathlib.Path, audio: str | pathlib.Path, tokenizer: str | pathlib.Path, max_new_tokens: int | None = None
) -> Transcription:
    """The text the program hears in ``audio`` (a PCM .wav; its first 30 seconds, Whisper's window).
    ``tokenizer``: the checkpoint folder (tokenizer.json, and preprocessor_config.json if any) or a
    tokenizer.json."""
    from mps_backend.llm.generate import Tokenizer  # noqa: PLC0415

    pte = pathlib.Path(pte)
    tok = Tokenizer(tokenizer)
    n_mels, frames = _encoder_input(pte)
    fe = feature_extractor(tokenizer, n_mels)
    if fe.nb_max_frames != frames:
        raise ValueError(f"the feature extractor makes {fe.nb_max_frames} frames, the program's encoder takes {frames}")
    samples, rate = read_wav(audio)
    notes = []
    if rate != fe.sampling_rate:
        notes.append(f"resampled from {rate} Hz to {fe.sampling_rate} Hz (linear interpolation)")
        samples = resample(samples, rate, fe.sampling_rate)
    if len(samples) > fe.n_samples:
        notes.append(f"{len(samples) / fe.sampling_rate:.1f} s of audio: only the first {fe.chunk_length} s are transcribed")
    features = fe(samples.numpy(), sampling_rate=fe.sampling_rate, return_tensors="pt").input_features
    result = Transcription("", [], "", notes=notes)
    result.tokens = transcribe_ids(pte, features, max_new_tokens, result=result)
    result.text = tok.decode(result.tokens[1:], skip_special_tokens=True)
    return result
