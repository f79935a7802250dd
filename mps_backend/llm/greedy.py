"""The greedy loop every runner of the package and the export's self-check share, and its statistics.

A runner reads its prompt in its own way (a text prompt in pieces of the program's rows,
:func:`prefill`; a vision-language prompt image by image and segment by segment; Whisper's start
token after its encoder), then hands :func:`greedy` the prompt's last logits and a ``step(token,
position) -> logits`` that runs one decode step of its program. :func:`greedy` chooses each token as
the argmax of those logits (after ``process``, a logits processor: the place for decoding rules such
as suppressed tokens), records them when asked, and stops after an EOS id (yielded), after
``max_new_tokens``, or when the next position would be past the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterator

import torch

#: (the tokens chosen so far, the logits ``[vocab]`` the next is chosen from) -> the logits to choose from
LogitsProcessor = Callable[[list[int], torch.Tensor], torch.Tensor]
#: one decode step of a program: (token, its position) -> logits
Step = Callable[[int, int], torch.Tensor]


@dataclass
class GenerationStats:
    """What a greedy run did: the prompt's length, the tokens chosen, why it stopped, how long the
    prefill and the decode steps took (emulated on this CPU)."""

    #: the prompt's tokens (a vision-language prompt: its rows, an image's embeddings included)
    prompt_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stopped_by: str = ""
    #: set to a list to receive the logits each generated token was chosen from
    logits: list[torch.Tensor] | None = None

    @property
    def tokens_per_second(self) -> float:
        n = max(len(self.generated) - 1, 0)  # the first token comes from the prefill's last step
        return n / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def __str__(self) -> str:
        return (
            f"{self.prompt_tokens} prompt tokens, {len(self.generated)} generated ({self.stopped_by}); "
            f"emulated on this CPU, not a device: prefill {self.prefill_seconds:.2f}s, "
            f"decode {self.tokens_per_second:.1f} tokens/s"
        )


def eos_ids(meta: dict) -> set[int]:
    """The program's EOS ids (``get_eos_ids``: a list, one id, or none), as executorch's runners read them."""
    value = meta.get("get_eos_ids")
    return {int(v) for v in (value if isinstance(value, (list, tuple)) else [] if value is None else [value])}


def prefill(call: Callable[[list[int], int], torch.Tensor], ids: list[int], piece: int) -> tuple[list[torch.Tensor], list[int]]:
    """The prompt ``ids`` read as executorch's runner reads it: ``call(tokens, position)`` on pieces of
    at most ``piece`` tokens (1: token by token), in order. Returns each call's logits and the position of
    the last token each call read."""
    logits, rows = [], []
    for start in range(0, len(ids), piece):
        part = ids[start : start + piece]
        logits.append(call(part, start))
        rows.append(start + len(part) - 1)
    return logits, rows


def greedy(
    step: Step,
    logits: torch.Tensor,
    position: int,
    max_new_tokens: int,
    *,
    stats: GenerationStats,
    eos: Collection[int] = (),
    stop_at_eos: bool = True,
    max_len: int | None = None,
    end: str = "max_seq_len",
    process: LogitsProcessor | None = None,
) -> Iterator[int]:
    """Greedy tokens from ``logits``, the prompt's last, whose next token goes at ``position``: each the
    argmax of the logits (of ``process(generated, logits)`` when given), appended to ``stats.generated``
    (its logits to ``stats.logits`` when that is a list) and yielded; then ``step(token, position)`` gives
    the next logits (timed into ``stats.decode_seconds``). Stops after an EOS id of ``eos`` (yielded; with
    ``stop_at_eos``), after ``max_new_tokens``, or when ``position`` reaches ``max_len`` (the cache's
    length; ``stats.stopped_by`` says ``end`` then)."""
    stats.stopped_by = "max_new_tokens"
    while len(stats.generated) < max_new_tokens:
        scores = logits.reshape(-1)
        if process is not None:
            scores = process(list(stats.generated), scores)
        token = int(torch.argmax(scores))
        stats.generated.append(token)
        if stats.logits is not None:
            stats.logits.append(logits.reshape(-1).float().clone())
        yield token
        if stop_at_eos and token in eos:
            stats.stopped_by = "EOS"
            return
        if max_len is not None and position >= max_len:
            stats.stopped_by = end
            return
        if len(stats.generated) < max_new_tokens:
            t0 = time.perf_counter()  # decode time: the steps only, not the caller's work between them
            logits = step(token, position)
            stats.decode_seconds += time.perf_counter() - t0
            position += 1


__all__ = ["GenerationStats", "LogitsProcessor", "Step", "eos_ids", "greedy", "prefill"]
