"""Whisper for executorch's ASR runner: an ``hf:`` Whisper checkpoint -> one ``.pte`` with the runner's
methods, each step one MPS delegate.

The runner (``extension/asr/runner``, ``AsrRunner`` in executorch 1.1 and ``Seq2SeqRunner`` in 1.4;
docs/speech-vision.md cites the lines) calls:

    encoder(features: float32 [1, n_mels, 3000]) -> one tensor
    text_decoder(token: int64 [1, 1], <that tensor>, cache_position: int64 [1]) -> logits [1, 2, vocab]

once per utterance and once per token. It hands the decoder the encoder's output on every call and
nothing else, so what a decode step needs from the audio must be that tensor. Here it is the
cross-attention keys and values of every decoder layer, computed once by ``encoder``
(:class:`WhisperEncoderStep`): ``[2 * layers, heads, frames * head_dim]``, row ``2l`` layer ``l``'s
keys transposed (``[heads, head_dim, frames]``, what ``q @ K^T`` reads), row ``2l + 1`` its values
(``[heads, frames, head_dim]``). A decode step (:class:`WhisperDecoderStep`) reads them in place (a
slice and a view per layer); it never projects the encoder states again.

The decoder's self-attention is the language models' decode step (:mod:`mps_backend.llm.decoder`):
transformers' own modeling code with a static KV cache passed as ``past_key_values``, K stored
transposed, grouped attention over the old cache plus the new row, the rows written after the
delegate by ``index_put_`` on CPU, the mask computed from ``cache_position``.

The runner takes the argmax of the decoder's last logits row (``logits_to_token``: a rank-3 tensor's last
row, ``extension/llm/sampler/util.h``) from the start token on, and applies no decoding rule of its own. So
``text_decoder`` returns two rows: row 0 the model's logits, row 1 those the generation config allows at
``cache_position`` (:func:`mps_backend.llm.whisper_decoding.runner_table`: the decoder prompt forced, the
language detected or ``--language``'s, ``--task``, ``begin_suppress_tokens``, ``suppress_tokens``; the
others ``-inf``): the runner decodes as transformers' ``generate`` does without timestamps, and
``mps-backend transcribe`` reads row 0 and applies the rules itself (timestamps and long audio included).
"""

from __future__ import annotations

import pathlib

import torch

from mps_backend.errors import CheckpointError
from mps_backend.llm.attention import use_grouped_attention
from mps_backend.llm.checkpoint import LoadedLM, load_hf
from mps_backend.llm.decoder import StaticCache, additive_mask, register_kv_caches
from mps_backend.llm.family import Family, Method, chunk_rows
from mps_backend.llm.folder_check import json_object
from mps_backend.llm.generate import Tokenizer
from mps_backend.llm.options import ExportOptions
from mps_backend.llm.spec import parse_model_spec
from mps_backend.llm.swap import Replacements
from mps_backend.llm.transcribe import transcribe_ids
from mps_backend.llm.verify import LLMVerification, precision_name, tolerance
from mps_backend.llm.whisper_decoding import WhisperRules, decoder_rules, describe_rules, generation_config, runner_table
from mps_backend.quantize import Quantization

#: the method names executorch's ASR runner calls (extension/asr/runner/runner.cpp:28-29 at v1.1.0)
ENCODER_METHOD, DECODER_METHOD = "encoder", "text_decoder"
#: mel frames of one 30-second window: the runner's ``[1, n_mels, 3000]``
WINDOW_FRAMES = 3000


def cross_kv_shape(config) -> tuple[int, int, int]:
    """The encoder method's output: ``[2 * decoder_layers, heads, frames * head_dim]``."""
    heads = int(config.decoder_attention_heads)
    head_dim = int(config.d_model) // heads
    return 2 * int(config.decoder_layers), heads, int(config.max_source_positions) * head_dim


class WhisperEncoderStep(torch.nn.Module):
    """``encoder``: mel features (float32, cast to the model's dtype) -> every decoder layer's
    cross-attention keys (transposed) and values, stacked (see the module doc)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.encoder = model.model.encoder
        self.cross = torch.nn.ModuleList(layer.encoder_attn for layer in model.model.decoder.layers)
        self.dtype = next(model.parameters()).dtype

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        h = self.encoder(features.to(self.dtype)).last_hidden_state[0]  # [frames, d_model]
        frames = h.shape[0]
        rows = []
        for attn in self.cross:
            heads, d = attn.num_heads, attn.head_dim
            # K^T [d_model, frames] is [heads, head_dim, frames]; the projections as the model's own
            # modules compute them (a quantized one's too); the transposes once per utterance
            k_t = attn.k_proj(h).transpose(0, 1)
            v = attn.v_proj(h).view(frames, heads, d).transpose(0, 1)  # [heads, frames, head_dim]
            rows += [k_t.reshape(heads, d * frames), v.reshape(heads, frames * d)]
        return torch.stack(rows)


class _CrossLayer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values


class _CrossCache:
    """transformers' cross-attention cache as WhisperAttention reads it once filled: ``layers[i].keys``
    (here K transposed, for :func:`mps_backend.llm.attention.grouped_attention`) and ``.values``."""

    def __init__(self, cross: torch.Tensor, heads: int, head_dim: int):
        frames = cross.shape[-1] // head_dim
        self.layers = [
            _CrossLayer(cross[2 * i].view(1, heads, head_dim, frames), cross[2 * i + 1].view(1, heads, frames, head_dim))
            for i in range(cross.shape[0] // 2)
        ]


def _encoder_decoder_cache(self_cache: StaticCache, cross: _CrossCache):
    """An ``EncoderDecoderCache`` (the class WhisperAttention checks for) over the static self-attention
    cache and the precomputed cross-attention keys and values, every layer marked as filled."""
    from transformers.cache_utils import EncoderDecoderCache  # noqa: PLC0415

    class _Cache(EncoderDecoderCache):
        def __init__(self):  # no transformers cache machinery: the two caches as given
            self.self_attention_cache, self.cross_attention_cache = self_cache, cross
            self.is_updated = dict.fromkeys(range(len(cross.layers)), True)

        # what transformers' mask functions ask of a cache: every layer full attention (the decode step
        # passes its mask precomputed)
        is_sliding = is_linear = is_dummy = property(lambda self: (False,) * len(self.is_updated))

        def get_seq_length(self, layer_idx: int = 0):
            return self_cache.get_seq_length(layer_idx)

    return _Cache()


class WhisperDecoderStep(torch.nn.Module):
    """``text_decoder``: one token at ``cache_position`` against the cross-attention keys and values
    of :class:`WhisperEncoderStep` -> float32 logits ``[1, 2, vocab]``: the model's, and those ``rules``
    allow at ``cache_position`` (the others ``-inf``; the row the ASR runner reads, the module doc)."""

    def __init__(
        self, model: torch.nn.Module, max_seq_len: int, changes: Replacements | None = None, rules: WhisperRules | None = None
    ):
        super().__init__()
        config = model.config
        self.model = model
        self.max_seq_len = int(max_seq_len)
        self.heads = int(config.decoder_attention_heads)
        self.head_dim = int(config.d_model) // self.heads
        self.grouped = use_grouped_attention(model, changes if changes is not None else Replacements())
        if not self.grouped:
            raise CheckpointError(
                f"{type(model).__name__}: its attention does not dispatch through transformers' AttentionInterface "
                "(the decode step's grouped attention over the cache and the cross-attention K/V needs it)"
            )
        dtype = next(model.parameters()).dtype
        register_kv_caches(self, int(config.decoder_layers), self.heads, self.head_dim, self.max_seq_len, dtype, grouped=True)
        self.mask_dtype = dtype
        if rules is None:
            rules = WhisperRules(prompt=(decoder_start_id(model),))
        table = runner_table(rules, int(config.vocab_size))
        self.last_row = table.shape[0] - 1
        # [positions, 2, vocab]: row 0 keeps every logit (the model's), row 1 the rules' tokens; one where
        # writes the output's two rows from the logits (no full -inf tensor, no concatenation)
        self.register_buffer("allowed", torch.stack([torch.ones_like(table), table], dim=1), persistent=False)

    def forward(self, tokens: torch.Tensor, cross: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        k = torch.arange(self.max_seq_len, dtype=cache_position.dtype)
        mask = additive_mask(k < cache_position, self.mask_dtype)  # the old cache; the new row joins separately
        self_cache = StaticCache(self, cache_position)
        cache = _encoder_decoder_cache(self_cache, _CrossCache(cross, self.heads, self.head_dim))
        out = self.model.model.decoder(
            input_ids=tokens,
            attention_mask=mask,
            encoder_hidden_states=cross,  # not read: every layer's cross keys/values are in the cache
            past_key_values=cache,
            position_ids=cache_position.view(1, -1),
            use_cache=True,
        )
        self_cache.write_pending()  # the cache rows, after attention: index_put on CPU, in place
        logits = self.model.proj_out(out.last_hidden_state[:, -1:, :]).float()  # [1, 1, vocab]
        allowed = self.allowed.index_select(0, cache_position.clamp(max=self.last_row))  # [1, 2, vocab]
        return torch.where(allowed, logits, float("-inf"))


#: the static signatures, as the export summary states them
WHISPER_SIGNATURE = (
    "encoder features float32 [1, n_mels, 3000] -> cross-attention K/V; "
    "text_decoder token [1, 1], that K/V, cache_position [1] -> logits [1, 2, vocab] (the model's; the generation "
    "config's rules applied, the row the ASR runner reads)"
)


def check_positions(model: torch.nn.Module, max_seq_len: int) -> None:
    """Whisper's decoder embeds positions from a learned table: a cache longer than it is refused."""
    positions = int(model.config.max_target_positions)
    if max_seq_len > positions:
        raise CheckpointError(
            f"--max-seq-len {max_seq_len}: Whisper's decoder embeds at most {positions} positions "
            "(max_target_positions: a learned table, no position beyond it exists)"
        )


def whisper_methods(model: torch.nn.Module, max_seq_len: int, rules: WhisperRules | None = None) -> list[Method]:
    """The ASR runner's methods: ``encoder`` (the model's eager attention), ``text_decoder`` (the model
    switched to grouped attention while it is built and exported; its decoding ``rules``, default none)."""
    config = model.config
    dtype = next(model.parameters()).dtype
    features = torch.zeros(1, int(config.num_mel_bins), WINDOW_FRAMES, dtype=torch.float32)
    cross = torch.zeros(cross_kv_shape(config), dtype=dtype)
    token, position = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)

    def decoder(changes: Replacements):
        return WhisperDecoderStep(model, max_seq_len, changes, rules).eval(), (token, cross, position), None

    return [
        Method(ENCODER_METHOD, lambda changes: (WhisperEncoderStep(model).eval(), (features,), None)),
        Method(DECODER_METHOD, decoder),
    ]


def quantize_target(model: torch.nn.Module) -> torch.nn.Module:
    """What ``--quantize`` quantizes in Whisper: the decoder (its self- and cross-attention projections, its
    MLPs; the cross-attention key and value projections run in ``encoder``, once a window) and the output
    head, as one container of those same modules: the weights every ``text_decoder`` step reads. The
    encoder's layers stay in the export's float precision: it runs once a 30-second window, bound by its
    activations (docs/speech-vision.md, Quantized Whisper: int8 encoder weights would save 1 % of its bytes)."""
    return torch.nn.ModuleDict({"decoder": model.model.decoder, "proj_out": model.proj_out})


def runner_rules(folder, language: str | None = None, task: str | None = None) -> WhisperRules | None:
    """The rules of the checkpoint's generation config for executorch's ASR runner: greedy, no timestamps, the
    language and task given (else the config's; a language left to detect is detected). None without a
    generation config (the start token and the argmax). Read from the folder's JSON, before the weights."""
    gen = generation_config(folder)
    if gen is None:
        if language is not None or task is not None:
            raise CheckpointError(f"{folder}: no generation_config.json or config.json (--language, --task)")
        return None
    try:
        return decoder_rules(gen, language=language, task=task, timestamps=False)
    except ValueError as e:
        raise CheckpointError(f"{folder}: {e}") from None


def decoder_start_id(model: torch.nn.Module) -> int:
    """The token the runner starts the decoder with (generation_config's, else the config's)."""
    gen = getattr(model, "generation_config", None)
    start = getattr(gen, "decoder_start_token_id", None)
    if start is None:
        start = model.config.decoder_start_token_id
    return int(start)


def whisper_metadata(lm, max_seq_len: int) -> dict:
    """The constant methods: ``get_eos_ids`` (the one both ASR runners read, through
    ``llm::get_eos_ids``), and for the caller what the runner does not read: the decoder's start token
    (``AsrTranscribeConfig::decoder_start_token_id`` is the caller's), the cache length (the runner does not
    stop at it: the caller's ``max_new_tokens`` must), the vocabulary, the decoder's layers."""
    meta = {
        "get_max_seq_len": max_seq_len,
        "get_vocab_size": lm.vocab_size,
        "get_n_layers": lm.n_layers,
        "decoder_start_token_id": decoder_start_id(lm.model),
        "use_kv_cache": True,
    }
    if lm.eos_ids:
        meta["get_eos_ids"] = list(lm.eos_ids)
    return meta


def verification_features(n_mels: int) -> torch.Tensor:
    """Mel features of a fixed 2-second test signal (a chirp and noise) by transformers'
    ``WhisperFeatureExtractor``: the self-check's input."""
    import numpy as np  # noqa: PLC0415
    from transformers import WhisperFeatureExtractor  # noqa: PLC0415

    rate = 16000
    t = np.arange(2 * rate) / rate
    audio = 0.3 * np.sin(2 * np.pi * (200 + 400 * t) * t) + 0.05 * np.random.default_rng(0).standard_normal(t.size)
    fe = WhisperFeatureExtractor(feature_size=n_mels)
    return fe(audio.astype(np.float32), sampling_rate=rate, return_tensors="pt").input_features


def verify_whisper(result, model: str, options: ExportOptions, *, pte=None):
    """The export's self-check: ``encoder`` and the first ``options.verify_steps`` decode steps of the written
    ``.pte`` on the emulated runtime (greedy from the start token) against transformers' eager
    float32 Whisper on the same features and tokens; the tolerances of the language models. ``pte``: where
    the program is until it passed (default ``result.path``)."""
    steps = options.verify_steps
    if steps > result.max_seq_len:
        raise CheckpointError(f"--verify-steps {steps} exceeds --max-seq-len {result.max_seq_len}")
    _, folder = parse_model_spec(model)
    dtype = precision_name(options.precision)
    logits: list[torch.Tensor] = []
    features = verification_features(int(json_object(pathlib.Path(folder), "config.json", required=True)["num_mel_bins"]))
    tokens = transcribe_ids(pte or result.path, features, steps, stop_at_eos=False, logits=logits)
    ref, reference = eager_logits(folder, features, tokens[:-1], options.quantization, dtype)
    rows = torch.stack(logits).float()  # [steps, 2, vocab]: the model's logits, the rules' row
    dev = rows[:, 0]
    # the rules the export applied (runner_rules, as Speech.load resolves them)
    rules = runner_rules(folder, options.language, options.task) or WhisperRules(prompt=(tokens[0],))
    table = runner_table(rules, rows.shape[-1])
    allowed = table[torch.arange(len(ref)).clamp(max=table.shape[0] - 1)]  # each step's row
    # the tokens the runner chose (the rules' row's argmax) against eager's logits under the same rules
    agree = sum(int(a) == b for a, b in zip(torch.where(allowed, ref, float("-inf")).argmax(-1).tolist(), tokens[1:]))
    return LLMVerification(
        failure=rules_row_failure(rows, allowed, rules),
        steps=len(logits),
        max_abs_diff=float((dev - ref).abs().max()),
        scale=float(ref.abs().max()),
        tolerance=tolerance(dtype, options.quantize),
        tokens_agree=agree,
        reference=reference,
    )


def rules_row_failure(rows: torch.Tensor, allowed: torch.Tensor, rules: WhisperRules) -> str | None:
    """Whether each step's rules row (``rows[:, -1]``, the one the ASR runner reads) is its logits row with
    exactly the tokens ``allowed`` at its step (rows of :func:`~mps_backend.llm.whisper_decoding.runner_table`)
    kept, the others ``-inf``; None if so, else why not."""
    if rows.shape[1] < 2:
        return "text_decoder returned one logits row: no row with the generation config's rules"
    for position, (raw, ruled, keep) in enumerate(zip(rows[:, 0], rows[:, -1], allowed)):
        if not torch.equal(ruled, torch.where(keep, raw, float("-inf"))):
            return (
                f"text_decoder's rules row at cache position {position} is not its logits with the generation "
                f"config's tokens allowed ({describe_rules(rules)})"
            )
    return None


def eager_logits(
    folder,
    features: torch.Tensor,
    tokens: list[int],
    quantization: Quantization | None = None,
    dtype="fp32",
):
    """transformers' eager float32 Whisper: logits after each of ``tokens`` (the decoder's input from
    the start token on), and the reference's name. Quantized exports: the weights quantized alike
    (in the export precision) and dequantized, as :mod:`mps_backend.llm.verify` does."""
    load = torch.float16 if quantization and dtype == "fp16" else torch.float32
    # the export's own loader: its folder check (no code from the folder runs) and the tensors the export read
    model = load_hf(folder, load, clamp_fp16=True).model
    reference = "eager transformers Whisper float32"
    if quantization:
        quantization.dequantize_alike(quantize_target(model))
        model.float()
        reference += f" ({quantization.scheme} decoder weights quantized alike, dequantized)"
    with torch.no_grad():
        out = model(input_features=features.to(model.dtype), decoder_input_ids=torch.tensor([tokens]))
    return out.logits[0].float(), reference


def _namer(lm: LoadedLM):
    """A token id -> its text in the checkpoint's tokenizer (the id itself without one, or for one it cannot
    decode: the summary's note only)."""
    if lm.tokenizer_path is None:
        return str
    try:
        tok = Tokenizer(lm.tokenizer_path)
    except (OSError, ValueError):
        return str

    def name(token: int) -> str:
        try:
            return tok.decode([token]) or str(token)
        except (OSError, ValueError):
            return str(token)

    return name


class Speech(Family):
    """Whisper for executorch's ASR runner (the module doc)."""

    name = "speech"
    signature = WHISPER_SIGNATURE
    unplanned_inputs = (DECODER_METHOD,)  # handed the encoder's cross-attention K/V every step, used in place
    quantize_rest = "; the audio encoder stays in float"
    takes_language = True

    def load(self, spec, options: ExportOptions, **kwargs) -> LoadedLM:
        rules = runner_rules(spec.path, options.language, options.task)  # a bad --language before the weights
        lm = super().load(spec, options, **kwargs)
        start = decoder_start_id(lm.model)
        if rules is None:
            rules = WhisperRules(prompt=(start,))
        elif rules.prompt[0] != start:
            raise CheckpointError(
                f"{spec.path}: the generation config's decoder_start_token_id {rules.prompt[0]} is not the model's {start}"
            )
        lm.decoding = rules
        lm.notes.append("text_decoder's last logits row, the one the ASR runner reads: " + describe_rules(rules, _namer(lm)))
        return lm

    def check(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> None:
        super().check(lm, options, max_seq_len)
        check_positions(lm.model, max_seq_len)

    def chunk_choice(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> None:
        return None  # its rows are fixed by its runner (rows below), not chosen for a device

    def rows(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> int:
        if chunk_rows(options, max_seq_len) > 1:
            raise CheckpointError("--prefill-chunk: Whisper's text_decoder reads one token a call (the ASR runner's contract)")
        return 1

    def quantize_target(self, lm: LoadedLM) -> torch.nn.Module:
        return quantize_target(lm.model)

    def methods(self, lm: LoadedLM, max_seq_len: int, rows: int) -> list[Method]:
        return whisper_methods(lm.model, max_seq_len, lm.decoding)

    def metadata(self, lm: LoadedLM, max_seq_len: int, rows: int) -> dict:
        return whisper_metadata(lm, max_seq_len)

    def verify(self, result, spec: str, options: ExportOptions, pte, export):
        return verify_whisper(result, spec, options, pte=pte)


FAMILY = Speech()
