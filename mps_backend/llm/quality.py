"""Quality of an exported language model as users compare it: the ``.pte`` teacher-forced over a real
text on the emulated runtime, against an eager model over the same tokens.

    from mps_backend.llm.quality import pte_logits, compare, perplexity
    dev = pte_logits("model.pte", ids)               # [len(ids), vocab], one decode step per token
    ref = model(input_ids=torch.tensor([ids])).logits[0]
    print(perplexity(dev, ids), compare(dev, ref))   # top-1 agreement, largest relative logit gap

Figures:
- perplexity: ``exp`` of the mean negative log-likelihood of each next token (token ``i + 1`` under the
  logits after token ``i``), computed in float64 from the logits;
- top-1 agreement: the share of positions where both put the same token first;
- largest relative logit gap: ``max |logits - reference| / max |reference|`` over every position (the
  measure of the export's self-check, :mod:`mps_backend.llm.verify`).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import torch

from mps_backend.runtime import LoadedMethod


def pte_logits(pte: str | pathlib.Path, ids: list[int]) -> torch.Tensor:
    """The ``.pte``'s float32 logits after each of ``ids``, fed one per decode step from position 0
    (teacher forcing: the text's tokens, not the program's own choices)."""
    step = LoadedMethod(pathlib.Path(pte), "forward")
    rows = []
    for pos, token in enumerate(ids):
        out = step([torch.tensor([[token]], dtype=torch.long), torch.tensor([pos], dtype=torch.long)])[0]
        rows.append(out.reshape(-1).float())
    return torch.stack(rows)


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    """Perplexity of ``ids[1:]`` under ``logits[:-1]`` (the logits after each token)."""
    logp = torch.log_softmax(logits[: len(ids) - 1].double(), dim=-1)
    nll = -logp.gather(1, torch.tensor(ids[1:]).reshape(-1, 1)).mean()
    return float(torch.exp(nll))


@dataclass
class Agreement:
    positions: int
    top1_agree: int  # positions whose argmax equals the reference's
    max_gap: float  # max |logits - reference|
    scale: float  # max |reference|

    @property
    def top1(self) -> float:
        return self.top1_agree / self.positions if self.positions else 0.0

    @property
    def relative_gap(self) -> float:
        return self.max_gap / self.scale if self.scale > 0 else float("inf")

    def __str__(self) -> str:
        top1 = f"top-1 {self.top1_agree}/{self.positions} ({100 * self.top1:.1f} %)"
        return f"{top1}, largest relative logit gap {self.relative_gap:.3g}"


def compare(logits: torch.Tensor, reference: torch.Tensor) -> Agreement:
    """How close ``logits`` are to ``reference`` (both [positions, vocab])."""
    if logits.shape != reference.shape:
        raise ValueError(f"logits {list(logits.shape)} and reference {list(reference.shape)} differ in shape")
    a, b = logits.float(), reference.float()
    return Agreement(
        positions=a.shape[0],
        top1_agree=int((a.argmax(-1) == b.argmax(-1)).sum()),
        max_gap=float((a - b).abs().max()),
        scale=float(b.abs().max()),
    )
