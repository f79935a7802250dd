"""Speech to text with an exported Whisper ``.pte`` on the emulated MPS runtime.

    from mps_backend.llm.transcribe import transcribe
    print(transcribe("whisper.pte", "speech.flac", "./whisper-tiny").text)

The calls are executorch's ASR runner's (``extension/asr/runner/runner.cpp`` at v1.1.0, the same in
``seq2seq_runner.cpp`` at v1.4.0; the 1.5.1 wheel binds neither), written out over
:class:`mps_backend.runtime.LoadedMethod`: ``encoder`` once on a window's features, which must return one
tensor (runner.cpp:216-231); then ``text_decoder(token [1, 1], that tensor, cache_position [1])`` once per
token from cache position 0. :func:`transcribe_ids` without rules is the runner's loop: from
``decoder_start_token_id``, the argmax of the logits' last row (temperature 0, runner.cpp:243-298), until an id of
``get_eos_ids`` (read as ``llm::get_eos_ids`` reads it, llm_runner_helper.cpp:153-178) or
``max_new_tokens`` (runner.cpp:267, 316-318); the export's self-check uses it. With the checkpoint's
rules (:mod:`mps_backend.llm.whisper_decoding`) it is transformers' ``generate``: the prompt fed token by
token, the rules applied to each step's logits; :func:`decode_windows` is ``generate``'s loop over 30-second
windows. The runner itself does not stop at the cache's length; this loop refuses a ``max_new_tokens``
beyond it.

Audio: :func:`read_audio` (libsndfile through ``soundfile``, channels averaged, libsoxr's resampling to
16 kHz, block by block); features: transformers' own ``WhisperFeatureExtractor`` (the checkpoint folder's
``preprocessor_config.json``, else Whisper's defaults with the program's mel bins).
"""

from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from mps_backend.llm.generate import Tokenizer
from mps_backend.llm.greedy import GenerationStats, greedy
from mps_backend.llm.whisper_decoding import WhisperRules, decoder_rules, detect_language, generation_config, rule_scores
from mps_backend.runtime import LoadedMethod, constant_method_values
from mps_backend.runtime.emulator import program_input_specs

#: the sample rate Whisper's feature extractor expects
SAMPLE_RATE = 16000
#: mel frames of one window (Whisper's 30 seconds)
WINDOW_FRAMES = 3000


@dataclass
class Transcription:
    text: str
    #: the decoder's tokens: the prompt (the start token, language, task...), then the generated ones
    tokens: list[int]
    stopped_by: str
    prompt_length: int = 1
    #: the windows' segments (their times with timestamps on)
    segments: list = field(default_factory=list)
    encoder_seconds: float = 0.0
    decode_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def stats(self) -> str:
        n = len(self.tokens) - self.prompt_length
        rate = n / self.decode_seconds if self.decode_seconds > 0 else 0.0
        return (
            f"{n} tokens ({self.stopped_by}); emulated on this CPU, not a device: encoder {self.encoder_seconds:.2f}s, "
            f"decode {rate:.1f} tokens/s"
        )


#: the longest audio ``transcribe`` reads (``--max-seconds``): an hour, at most 230 MB of 16 kHz float32 samples
MAX_SECONDS = 3600.0
#: samples (frames x channels) read at a time: mixed down and resampled block by block
_BLOCK_SAMPLES = 1 << 20
#: the largest sample magnitude ``read_audio`` takes (full scale is 1; float files written on a 16-bit scale
#: reach 32768): beyond about 1e17 the feature extractor's float32 power spectrum overflows to infinity
MAX_SAMPLE = float(1 << 20)


def read_audio(
    path: str | pathlib.Path, max_seconds: float = MAX_SECONDS, to: int | None = SAMPLE_RATE
) -> tuple[np.ndarray, int]:
    """An audio file as mono float32 samples at ``to`` Hz (None: its own rate), and its own rate. Read with
    libsndfile (``soundfile``): WAV (PCM 8/16/24/32-bit, float), FLAC, Ogg/Vorbis, MP3, AIFF and the other
    formats it reads. Block by block: the channels averaged (as ``librosa.to_mono`` and ffmpeg's ``-ac 1``
    downmix of stereo), then resampled by libsoxr (``soxr.ResampleStream``, its default "HQ" quality: a
    linear-phase low-pass below the lower Nyquist frequency, so nothing above 8 kHz folds into Whisper's
    band; the same samples as ``soxr.resample`` of the whole), so memory is bounded by the output: at most
    ``max_seconds`` at ``to`` Hz, whatever the file's rate and channels. Refused in one line: what
    libsndfile cannot read, a header's rate below 1 Hz or length beyond ``max_seconds`` (nothing is
    read then), no samples, a non-finite sample, a sample beyond :data:`MAX_SAMPLE` (whose features would
    overflow)."""
    import soundfile  # noqa: PLC0415
    import soxr  # noqa: PLC0415

    parts = []
    try:
        with soundfile.SoundFile(str(path)) as f:
            rate, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
            if rate < 1 or channels < 1:
                raise ValueError(f"{path}: its header says {rate} Hz, {channels} channels")
            if frames > max_seconds * rate:
                raise ValueError(
                    f"{path}: {frames / rate:.1f} s of audio (its header), more than {max_seconds:g} s (--max-seconds)"
                )
            stream = None if to in (None, rate) else soxr.ResampleStream(rate, to, 1, dtype="float32")
            block, done = max(1, _BLOCK_SAMPLES // channels), 0
            while True:
                data = f.read(min(block, frames - done), dtype="float32", always_2d=True) if done < frames else None
                last = data is None or len(data) == 0
                mono = np.zeros(0, np.float32) if last else data.mean(axis=1, dtype=np.float32)
                bad = ~np.isfinite(mono)
                if bad.any():
                    raise ValueError(
                        f"{path}: a non-finite sample (NaN or infinity) at {(done + int(np.argmax(bad))) / rate:.3f} s"
                    )
                big = np.abs(mono) > MAX_SAMPLE
                if big.any():
                    at = int(np.argmax(big))
                    raise ValueError(
                        f"{path}: a sample of {mono[at]:.3g} at {(done + at) / rate:.3f} s, beyond {MAX_SAMPLE:.0f} "
                        "(full scale is 1)"
                    )
                parts.append(mono if stream is None else stream.resample_chunk(mono, last=last))
                if last:
                    break
                done += len(data)
    except (RuntimeError, soundfile.LibsndfileError, EOFError, OverflowError, MemoryError) as e:
        why = getattr(e, "error_string", None) or str(e).strip() or type(e).__name__
        raise ValueError(f"{path}: not an audio file libsndfile reads ({why.rstrip('.')})") from None
    samples = np.concatenate(parts)
    if samples.size == 0:
        raise ValueError(f"{path}: no samples" + (f" at {to} Hz (from {frames} at {rate} Hz)" if frames else ""))
    return samples, rate


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


def encoder_input(pte) -> tuple[int, int]:
    """(mel bins, frames) of the program's ``encoder`` input."""
    specs = program_input_specs(pte, method="encoder")
    if len(specs) != 1 or len(specs[0][0]) != 3:
        raise ValueError(f"the program's encoder takes {specs}, not one features tensor [1, n_mels, frames]")
    return int(specs[0][0][1]), int(specs[0][0][2])


def preprocessor_path(pte: str | pathlib.Path) -> pathlib.Path:
    """Where ``mps-backend export`` writes a Whisper program's features program by default: beside it."""
    pte = pathlib.Path(pte)
    return pte.with_name(f"{pte.stem}-preprocessor.pte")


class Preprocessor:
    """A features program (:mod:`mps_backend.llm.whisper_preprocessor`) on the emulated runtime: one
    window's waveform (16 kHz, at most ``n_samples``) -> ``[1, n_mels, frames]``."""

    def __init__(self, path: str | pathlib.Path, n_mels: int, frames: int):
        meta = constant_method_values(path)
        if "n_samples" not in meta or "feature_size" not in meta:
            raise ValueError(f"{path}: not a Whisper preprocessor program (no n_samples, feature_size methods)")
        self.n_samples, self.rate = int(meta["n_samples"]), int(meta.get("sampling_rate", SAMPLE_RATE))
        got = (int(meta["feature_size"]), int(meta.get("nb_max_frames", -1)))
        if got != (n_mels, frames):
            raise ValueError(
                f"{path}: makes features [1, {got[0]}, {got[1]}], the program's encoder takes [1, {n_mels}, {frames}]"
            )
        self.method = LoadedMethod(path, "forward")

    def __call__(self, samples: np.ndarray) -> torch.Tensor:
        return self.method([torch.from_numpy(np.ascontiguousarray(samples[: self.n_samples]))])[0]


class WhisperProgram:
    """A Whisper ``.pte``'s methods on the emulated runtime and the metadata the loop reads."""

    def __init__(self, pte: str | pathlib.Path | bytes):
        meta = constant_method_values(pte)
        for name in ("decoder_start_token_id", "get_max_seq_len"):
            if name not in meta:
                raise ValueError(f"the program has no {name} method: not a Whisper export (mps-backend export --model hf:...)")
        self.start = int(meta["decoder_start_token_id"])
        self.max_len = int(meta["get_max_seq_len"])
        eos = meta.get("get_eos_ids")
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.encoder, self.decoder = LoadedMethod(pte, "encoder"), LoadedMethod(pte, "text_decoder")

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        outputs = self.encoder([features])
        if len(outputs) != 1 or not isinstance(outputs[0], torch.Tensor):  # runner.cpp:224-228
            raise ValueError(f"the encoder returned {len(outputs)} outputs; the ASR runner needs a single tensor")
        return outputs[0]

    def step(self, token: int, cross: torch.Tensor, cache_position: int) -> torch.Tensor:
        """The step's logits rows ``[rows, vocab]``: ``[1, 2, vocab]`` from this project's exports (the model's,
        then the generation config's rules applied: :mod:`mps_backend.llm.whisper`), ``[1, vocab]`` from
        older ones."""
        out = self.decoder([torch.tensor([[token]]), cross, torch.tensor([cache_position])])[0]
        return out.reshape(-1, out.shape[-1])


def transcribe_ids(
    pte: str | pathlib.Path | bytes | WhisperProgram,
    features: torch.Tensor,
    max_new_tokens: int | None = None,
    *,
    rules: WhisperRules | None = None,
    stop_at_eos: bool = True,
    logits: list[torch.Tensor] | None = None,
    result: Transcription | None = None,
) -> list[int]:
    """The greedy loop (:func:`mps_backend.llm.greedy.greedy`) on ``features`` ``[1, n_mels, 3000]``: the
    prompt and the tokens after it.

    ``rules`` None: the ASR runner's loop (the module doc): from the program's ``decoder_start_token_id``,
    the argmax of each step's last logits row (the rules the program was exported with applied). ``rules``
    (:func:`mps_backend.llm.whisper_decoding.decoder_rules`):
    transformers' ``generate``: the prompt fed token by token (its language detected from the first step
    if it is to be), then the argmax of :func:`~mps_backend.llm.whisper_decoding.rule_scores` per step, until the rules'
    EOS (else the program's). ``max_new_tokens``: tokens after the prompt (default: as many as the cache
    holds). ``logits``: a list receiving each step's logits rows ``[rows, vocab]``, as the program returned them
    (:meth:`WhisperProgram.step`)."""
    program = pte if isinstance(pte, WhisperProgram) else WhisperProgram(pte)
    prompt = list(rules.prompt) if rules is not None else [program.start]
    room = program.max_len - len(prompt) + 1  # the last token is not fed back
    n = room if max_new_tokens is None else int(max_new_tokens)
    if n < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {n}")
    if n > room:
        raise ValueError(
            f"max_new_tokens {n} exceeds the decoder's cache of {program.max_len} positions (get_max_seq_len)"
            + (f" less the prompt's {len(prompt) - 1}" if len(prompt) > 1 else "")
        )
    eos = set(rules.eos) if rules is not None and rules.eos else program.eos
    t0 = time.perf_counter()
    cross = program.encode(features)
    t1 = time.perf_counter()

    # the runner's loop reads the last row (logits_to_token), the rules' loop the model's own (row 0)
    row = -1 if rules is None else 0

    def step(token: int, cache_position: int) -> torch.Tensor:
        out = program.step(token, cross, cache_position)
        if logits is not None:
            logits.append(out.float().clone())
        return out[row]

    stats = GenerationStats(prompt_tokens=len(prompt))
    fed = prompt[:1]
    out = step(fed[0], 0)
    for position in range(1, len(prompt)):  # the prompt, fed as given (its language detected)
        given = prompt[position]
        fed.append(detect_language(rules, out) if given is None else given)
        out = step(fed[-1], position)
    stats.prefill_seconds = time.perf_counter() - t1
    # logits_to_token at temperature 0 (the runner), or transformers' rules first
    process = None if rules is None else lambda generated, scores: rule_scores(rules, fed + generated, scores)
    tokens = fed + list(greedy(step, out, len(prompt), n, stats=stats, eos=eos, stop_at_eos=stop_at_eos, process=process))
    if result is not None:
        result.encoder_seconds, result.stopped_by = t1 - t0, stats.stopped_by
        result.decode_seconds = stats.prefill_seconds + stats.decode_seconds
    return tokens


@dataclass
class Segment:
    """A stretch of the transcription: its tokens (timestamps included) and, from its timestamp tokens,
    its start and end in seconds (None without timestamps)."""

    tokens: list[int]
    start: float | None = None
    end: float | None = None
    #: the text of its tokens (timestamps left out), set by :func:`transcribe`
    text: str = ""


#: mel frames per encoder position (Whisper's two convolutions, the second of stride 2), and the seconds of
#: one timestamp step and of one mel frame (transformers' generate: input_stride, time_precision,
#: time_precision_features)
INPUT_STRIDE, TIME_PRECISION, FRAME_SECONDS = 2, 0.02, 0.01


def split_segments(seq: list[int], rules: WhisperRules, seek: int, frames: int) -> tuple[list[Segment], int]:
    """transformers' ``_retrieve_segment``: the window's generated tokens ``seq`` (its EOS removed), cut
    after each pair of timestamp tokens, and the frames to advance (to the last pair's timestamp, or the
    whole window when the tokens end with a single timestamp or hold no pair)."""
    begin = rules.timestamp_begin
    offset = seek * TIME_PRECISION / INPUT_STRIDE
    is_ts = [begin is not None and t >= begin for t in seq]
    single_ending = is_ts[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(seq) - 1) if is_ts[i] and is_ts[i + 1]]
    if not cuts:
        stamps = [t for t, ts in zip(seq, is_ts) if ts]
        last = frames * FRAME_SECONDS / TIME_PRECISION
        if stamps and stamps[-1] != begin:  # no pair but a timestamp: the last one
            last = stamps[-1] - begin
        start, end = (offset, offset + int(last) * TIME_PRECISION) if begin is not None else (None, None)
        return [Segment(list(seq), start, end)], frames
    if single_ending:
        cuts.append(len(seq))
    else:
        cuts[-1] += 1  # the last timestamp in the last segment: it was no single ending
    segments, last = [], 0
    for i, cut in enumerate(cuts):
        part = seq[last:cut]
        end = part[-1 if i < len(cuts) - 1 or single_ending else -2]
        segments.append(Segment(part, offset + (part[0] - begin) * TIME_PRECISION, offset + (end - begin) * TIME_PRECISION))
        last = cut
    return segments, frames if single_ending else (seq[last - 2] - begin) * INPUT_STRIDE


def decode_windows(
    program: WhisperProgram,
    features: torch.Tensor,
    rules: WhisperRules,
    max_new_tokens: int | None = None,
    result: Transcription | None = None,
) -> list[Segment]:
    """transformers' sequential decoding (``generate``'s loop over ``seek``, greedy, no temperature
    fallback, not conditioned on the previous window): ``features`` ``[1, n_mels, T]`` (``T`` 3000 for
    audio up to 30 s) cut into 3000-frame windows from ``seek`` (the last one padded with zero
    features), each decoded by :func:`transcribe_ids` from the same prompt (its language detected on the
    first window), split by :func:`split_segments`, ``seek`` moved as it says. A window whose tokens
    would not move ``seek`` (two ``<|0.00|>`` timestamps: transformers would repeat it forever) moves
    it by the whole window."""
    total = int(features.shape[-1])
    window = WINDOW_FRAMES
    seek, segments = 0, []
    encoder_seconds = decode_seconds = 0.0
    stopped = "EOS"
    while seek < total:
        frames = min(window, total - seek)
        part = features[:, :, seek : seek + frames]
        if frames < window:
            part = torch.nn.functional.pad(part, (0, window - frames))
        step = Transcription("", [], "")
        tokens = transcribe_ids(program, part, max_new_tokens, rules=rules, result=step)
        encoder_seconds, decode_seconds = encoder_seconds + step.encoder_seconds, decode_seconds + step.decode_seconds
        if step.stopped_by != "EOS":
            stopped = step.stopped_by
        if None in rules.prompt:  # the language, detected once
            rules = replace(rules, prompt=tuple(tokens[: len(rules.prompt)]))
        seq = tokens[len(rules.prompt) :]
        if seq and seq[-1] in set(rules.eos):
            seq = seq[:-1]
        found, advance = split_segments(seq, rules, seek, frames)
        segments += found
        seek += advance if advance > 0 else frames
    if result is not None:
        result.encoder_seconds, result.decode_seconds, result.stopped_by = encoder_seconds, decode_seconds, stopped
        result.tokens = list(rules.prompt) + [t for s in segments for t in s.tokens]
        result.prompt_length = len(rules.prompt)
    return segments


def transcribe(
    pte: str | pathlib.Path,
    audio: str | pathlib.Path,
    tokenizer: str | pathlib.Path,
    max_new_tokens: int | None = None,
    *,
    language: str | None = None,
    task: str | None = None,
    timestamps: bool | None = None,
    max_seconds: float = MAX_SECONDS,
    preprocessor: str | pathlib.Path | None = None,
) -> Transcription:
    """The text the program hears in ``audio`` (any file :func:`read_audio` reads), decoded by the checkpoint's
    generation config as transformers' ``generate`` decodes (``language``, ``task``, ``timestamps``: its
    arguments), window by window when longer than 30 s (:func:`decode_windows`). ``tokenizer``: the
    checkpoint folder (tokenizer.json, generation_config.json, preprocessor_config.json if any) or a
    tokenizer.json (its folder's generation config, if any, is read). ``preprocessor``: the features program
    (:mod:`mps_backend.llm.whisper_preprocessor`; default: :func:`preprocessor_path` if it exists, ``"none"``:
    transformers' ``WhisperFeatureExtractor``); audio longer than its window gets the extractor's features
    of the whole, as transformers' long-form decoding reads them."""
    pte = pathlib.Path(pte)
    tok = Tokenizer(tokenizer)
    n_mels, frames = encoder_input(pte)
    fe = feature_extractor(tokenizer, n_mels)
    if fe.nb_max_frames != frames:
        raise ValueError(f"the feature extractor makes {fe.nb_max_frames} frames, the program's encoder takes {frames}")
    folder = pathlib.Path(tokenizer)
    gen = generation_config(folder if folder.is_dir() else folder.parent)
    notes = []
    if gen is None:
        if language or task or timestamps:
            raise ValueError(
                f"{tokenizer}: no generation_config.json or config.json beside it (--language, --task, --timestamps)"
            )
        notes.append("no generation config beside the tokenizer: greedy from the program's start token, no decoding rules")
    rules = None if gen is None else decoder_rules(gen, language=language, task=task, timestamps=timestamps)
    samples, rate = read_audio(audio, max_seconds, fe.sampling_rate)
    if rate != fe.sampling_rate:
        notes.append(f"resampled from {rate} Hz to {fe.sampling_rate} Hz (soxr)")
    result = Transcription("", [], "", notes=notes)
    program = WhisperProgram(pte)
    long = len(samples) > fe.n_samples
    if preprocessor is None and preprocessor_path(pte).is_file():
        preprocessor = preprocessor_path(pte)
    front = None
    if preprocessor is not None and str(preprocessor) != "none":
        if not pathlib.Path(preprocessor).is_file():
            raise ValueError(f"{preprocessor}: no such preprocessor program")
        front = Preprocessor(preprocessor, n_mels, frames)
        notes.append(
            f"features by {preprocessor} (the preprocessor program)"
            + (" for the first window only" if long and rules is None else "")
        )
        if front.rate != fe.sampling_rate:
            raise ValueError(f"{preprocessor}: takes {front.rate} Hz audio, the feature extractor {fe.sampling_rate} Hz")
    if front is not None and long and rules is not None:
        notes.append(
            f"long audio: features of the whole by transformers' WhisperFeatureExtractor ({preprocessor} takes one window)"
        )
    if rules is None:
        if long:
            notes.append(f"{len(samples) / fe.sampling_rate:.1f} s of audio: only the first {fe.chunk_length} s are transcribed")
        if front is not None:
            features = front(samples)
        else:
            features = fe(samples, sampling_rate=fe.sampling_rate, return_tensors="pt").input_features
        result.tokens = transcribe_ids(program, features, max_new_tokens, result=result)
        result.segments = [Segment(result.tokens[1:])]
    else:
        if long and not rules.timestamps:
            if timestamps is False:
                raise ValueError(f"{len(samples) / fe.sampling_rate:.1f} s of audio: long-form decoding needs timestamps")
            rules = decoder_rules(gen, language=language, task=task, timestamps=True)
            notes.append(f"{len(samples) / fe.sampling_rate:.1f} s of audio: decoded window by window with timestamps")
        if front is not None and not long:
            features = front(samples)
        else:  # long audio: features of the whole, as transformers' pipeline makes them for long-form generate
            kwargs = {"truncation": False, "padding": "longest"} if long else {}
            features = fe(samples, sampling_rate=fe.sampling_rate, return_tensors="pt", **kwargs).input_features
        result.segments = decode_windows(program, features, rules, max_new_tokens, result=result)
    text = [t for seg in result.segments for t in seg.tokens]
    if rules is not None and rules.timestamp_begin is not None:
        text = [t for t in text if t < rules.timestamp_begin]
        for seg in result.segments:
            seg.text = tok.decode([t for t in seg.tokens if t < rules.timestamp_begin], skip_special_tokens=True)
    result.text = tok.decode(text, skip_special_tokens=True)
    return result
