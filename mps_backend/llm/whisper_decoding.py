"""Whisper's decoding rules for greedy decoding, as transformers' ``WhisperForConditionalGeneration.generate``
applies them (``transformers/models/whisper/generation_whisper.py`` and ``generation/logits_process.py`` at
5.23.0), read from the checkpoint's generation config:

- the decoder prompt (``_retrieve_init_tokens``): ``decoder_start_token_id``; then the language (``--language``,
  else the old ``forced_decoder_ids``' entries, else, for a checkpoint with ``lang_to_id``, detected: the argmax
  of the first step's logits over the language tokens, ``detect_language``); the task (``--task``, else
  ``forced_decoder_ids``', else ``transcribe`` when a language was given); ``<|notimestamps|>`` unless
  timestamps are on;
- ``begin_suppress_tokens`` at the first generated token (``SuppressTokensAtBeginLogitsProcessor``),
  ``suppress_tokens`` at every one (``SuppressTokensLogitsProcessor``);
- with timestamps on, ``WhisperTimeStampLogitsProcessor``'s rules: timestamps in pairs, never decreasing,
  the first token a timestamp of at most ``max_initial_timestamp_index``, a timestamp chosen when their
  probabilities together outweigh the best text token.

:func:`decoder_rules` reads them; :func:`rule_scores` is the one function that applies them to a step's
logits (the logits processor :func:`mps_backend.llm.transcribe.transcribe_ids` hands the greedy loop,
:func:`mps_backend.llm.greedy.greedy`). What else
``generate`` may apply from a generation config (repetition penalties, ``bad_words_ids``, sampling) no
Whisper checkpoint sets; the temperature fallback and no-speech detection (``logprob_threshold``,
``no_speech_threshold``...) are off unless asked for, and are not done here.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import torch

#: the tasks Whisper's prompt names (transformers' TASK_IDS)
TASKS = ("translate", "transcribe")


@dataclass(frozen=True)
class WhisperRules:
    """What greedy decoding applies (the module doc), resolved from a generation config."""

    #: the decoder prompt; ``None`` at index 1: the language, detected from the first step's logits
    prompt: tuple[int | None, ...]
    #: the language tokens (for the detection)
    language_ids: tuple[int, ...] = ()
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    timestamps: bool = False
    #: the first timestamp token (``no_timestamps_token_id + 1``)
    timestamp_begin: int | None = None
    no_timestamps: int | None = None
    #: the timestamp rule's end of text ("after a lone timestamp, no text token below it")
    timestamp_eos: int | None = None
    max_initial_timestamp_index: int | None = None
    #: tokens that end the decoding (the generation config's ``eos_token_id``)
    eos: tuple[int, ...] = ()


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))


def generation_config(folder: str | pathlib.Path):
    """The checkpoint's generation config as transformers loads it with the model: ``generation_config.json``,
    else made from ``config.json`` (``GenerationConfig.from_model_config``); ``None`` if the folder has neither."""
    from transformers import AutoConfig, GenerationConfig  # noqa: PLC0415

    p = pathlib.Path(folder)
    if (p / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(p, local_files_only=True)
    if (p / "config.json").is_file():
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(p, local_files_only=True, trust_remote_code=False))
    return None


def _language_id(gen, language: str) -> int:
    """``language`` ("fr", "french" or "<|fr|>") -> its token, as transformers' ``language_to_id``."""
    from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE  # noqa: PLC0415

    lang_to_id = getattr(gen, "lang_to_id", None)
    if not lang_to_id:
        raise ValueError(f"--language {language}: the checkpoint's generation config has no lang_to_id (not multilingual)")
    name = language.lower()
    if name in lang_to_id:
        token = name
    elif name in TO_LANGUAGE_CODE:
        token = f"<|{TO_LANGUAGE_CODE[name]}|>"
    elif name in TO_LANGUAGE_CODE.values():
        token = f"<|{name}|>"
    else:
        raise ValueError(f"--language {language}: not a language Whisper knows (a code such as 'fr' or a name such as 'french')")
    if token not in lang_to_id:
        raise ValueError(f"--language {language}: {token} is not in the checkpoint's lang_to_id")
    return int(lang_to_id[token])


def decoder_rules(gen, *, language: str | None = None, task: str | None = None, timestamps: bool | None = None) -> WhisperRules:
    """The rules of ``gen`` (a transformers ``GenerationConfig``) for one call of ``generate(language=,
    task=, return_timestamps=)``: its ``_set_return_timestamps``, ``_set_language_and_task`` and
    ``_retrieve_init_tokens`` (the language left to detect as ``None`` at index 1)."""
    no_ts = getattr(gen, "no_timestamps_token_id", None)
    if timestamps is None:
        timestamps = bool(getattr(gen, "return_timestamps", False))
    if timestamps and no_ts is None:
        raise ValueError("--timestamps: the checkpoint's generation config has no no_timestamps_token_id")
    multilingual = getattr(gen, "is_multilingual", None)
    if multilingual is False and (task is not None or language is not None):
        raise ValueError(
            "--language and --task apply to a multilingual checkpoint (its generation config: is_multilingual false)"
        )
    task_to_id = getattr(gen, "task_to_id", None)
    if task is not None:
        if task not in TASKS:
            raise ValueError(f"--task {task}: one of {', '.join(TASKS)}")
        if not task_to_id:
            raise ValueError(f"--task {task}: the checkpoint's generation config has no task_to_id")
    if language is None:
        language = getattr(gen, "language", None)
    if task is None:
        task = getattr(gen, "task", None)
    prompt: list[int | None] = [int(gen.decoder_start_token_id)]
    if task is None and language is None:
        forced = getattr(gen, "forced_decoder_ids", None)
        if forced and forced[0][0] == 1:
            for i, (index, token) in enumerate(forced, start=1):
                if index != i:
                    raise ValueError(f"the generation config's forced_decoder_ids {forced} do not follow Whisper's prompt")
                prompt.append(token)
    lang_to_id = getattr(gen, "lang_to_id", None)
    undefined = len(prompt) <= 1 or prompt[1] is None
    lang: int | None = _language_id(gen, language) if language is not None else None
    if lang is not None or (lang_to_id and undefined):
        # a given language, or one to detect (None at index 1)
        if len(prompt) > 1:
            prompt[1] = lang
        else:
            prompt.append(lang)
        detect = lang is None
    else:
        detect = False
    if task is not None:
        # (transformers also calls replace_or_add here, and drops its result)
        prompt.append(int(task_to_id[task]))
    elif language is not None and task_to_id and not any(t in set(task_to_id.values()) for t in prompt):
        prompt.append(int(task_to_id["transcribe"]))
    if not timestamps and no_ts is not None and prompt[-1] != no_ts:
        prompt.append(int(no_ts))
    elif timestamps and prompt[-1] == no_ts:
        prompt = prompt[:-1]
    prompt = [t for i, t in enumerate(prompt) if t is not None or (i == 1 and detect)]
    eos = getattr(gen, "eos_token_id", None)
    return WhisperRules(
        prompt=tuple(prompt),
        language_ids=tuple(int(v) for v in (lang_to_id or {}).values()) if detect else (),
        suppress=_ids(getattr(gen, "suppress_tokens", None)),
        begin_suppress=_ids(getattr(gen, "begin_suppress_tokens", None)),
        timestamps=bool(timestamps),
        timestamp_begin=None if no_ts is None else int(no_ts) + 1,
        no_timestamps=None if no_ts is None else int(no_ts),
        timestamp_eos=(_ids(eos) or _ids(getattr(gen, "bos_token_id", None)) or (None,))[0],
        max_initial_timestamp_index=getattr(gen, "max_initial_timestamp_index", None),
        eos=_ids(eos),
    )


def detect_language(rules: WhisperRules, logits: torch.Tensor) -> int:
    """The language token: the argmax of the first step's logits over the language tokens."""
    ids = torch.tensor(rules.language_ids, dtype=torch.long)
    return int(ids[torch.argmax(logits.reshape(-1).float()[ids])])


def rule_scores(rules: WhisperRules, tokens: list[int], logits: torch.Tensor, begin: int | None = None) -> torch.Tensor:
    """The scores the token after ``tokens`` (the prompt and the tokens generated so far) is chosen from, the
    step's ``logits`` ``[vocab]`` under ``rules`` (a logits processor of :func:`mps_backend.llm.greedy.greedy`);
    ``begin``: the index of the first generated token (default: the prompt's length). transformers'
    processors in its order (begin-suppress, suppress, timestamps), in float32."""
    scores = logits.reshape(-1).float().clone()
    vocab = scores.shape[0]
    inf = float("-inf")
    begin = len(rules.prompt) if begin is None else begin

    def drop(ids):
        kept = [i for i in ids if 0 <= i < vocab]
        if kept:
            scores[kept] = inf

    if len(tokens) == begin:
        drop(rules.begin_suppress)
    drop(rules.suppress)
    if rules.timestamps:
        ts = rules.timestamp_begin
        scores[rules.no_timestamps] = inf
        seq = tokens[begin:]
        last = len(seq) >= 1 and seq[-1] >= ts
        penultimate = len(seq) < 2 or seq[-2] >= ts
        if last:
            if penultimate:  # a pair closed: text next
                scores[ts:] = inf
            else:  # a lone timestamp: another, or the end
                scores[: rules.timestamp_eos] = inf
        stamps = [t for t in seq if t >= ts]
        floor = ts
        if stamps:  # timestamps never decrease; <|0.00|> not twice
            floor = stamps[-1] if last and not penultimate else stamps[-1] + 1
        scores[ts:floor] = inf
        if len(tokens) == begin:
            scores[:ts] = inf
            if rules.max_initial_timestamp_index is not None:
                scores[ts + int(rules.max_initial_timestamp_index) + 1 :] = inf
        logprobs = torch.nn.functional.log_softmax(scores, dim=-1)
        if logprobs[ts:].logsumexp(dim=-1) > logprobs[:ts].max():
            scores[:ts] = inf
    return scores


def runner_table(rules: WhisperRules, vocab: int) -> torch.Tensor:
    """The tokens executorch's ASR runner may choose at each cache position, as a bool ``[P + 1, vocab]``
    (``P`` the prompt's length; row ``min(cache_position, P)``): the runner feeds ``decoder_start_token_id`` and
    then the argmax of each step's logits, so the program's ``text_decoder`` keeps only these tokens in the
    logits row it reads (:class:`mps_backend.llm.whisper.WhisperDecoderStep`) and the runner decodes as
    ``generate`` with ``rules`` (timestamps off: the timestamp rules need the tokens so far).

    - a row before the prompt's last token: the prompt's next token (the language to detect: the language
      tokens, ``detect_language``'s argmax);
    - the prompt's last token's row (the first generated token): all but ``begin_suppress`` and ``suppress``;
    - the rows after: all but ``suppress``."""
    if rules.timestamps:
        raise ValueError("the runner's table decodes without timestamps")
    prompt = len(rules.prompt)
    table = torch.ones(prompt + 1, vocab, dtype=torch.bool)

    def only(row: int, ids) -> None:
        kept = [i for i in ids if 0 <= i < vocab]
        if not kept:
            raise ValueError(f"the decoder prompt's token {list(ids)} is outside the vocabulary of {vocab}")
        table[row] = False
        table[row, kept] = True

    for row in range(prompt - 1):
        nxt = rules.prompt[row + 1]
        only(row, rules.language_ids if nxt is None else (nxt,))

    def drop(row: int, ids) -> None:
        kept = [i for i in ids if 0 <= i < vocab]
        table[row, kept] = False

    drop(prompt - 1, rules.begin_suppress)
    drop(prompt - 1, rules.suppress)
    drop(prompt, rules.suppress)
    return table


def describe_rules(rules: WhisperRules, name=str) -> str:
    """The rules of :func:`runner_table` in a line of the export summary; ``name``: a token id's text."""
    prompt = " ".join("<language: detected>" if t is None else name(t) for t in rules.prompt)
    return (
        f"prompt [{prompt}], {len(rules.suppress)} suppressed tokens, {len(rules.begin_suppress)} more at the first "
        "generated token, no timestamps"
    )
