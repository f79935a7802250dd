"""mps-backend debug: the float16-vs-float32 gap per edge node points at the op that loses precision."""

from __future__ import annotations

import torch

from mps_backend.tools.cli import main
from mps_backend.tools.debug import fp16_gap_table


class _Cancels(torch.nn.Module):
    """(h + 1000) - 1000: float16's step at 1000 is 0.5, so the small h loses its low bits there."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.a(x)
        return self.b((h + 1000.0) - 1000.0)


def test_the_cancelling_op_is_where_precision_is_lost():
    torch.manual_seed(0)
    rows = fp16_gap_table(_Cancels().eval(), [torch.randn(2, 16) * 0.1])
    by_target = {}
    for r in rows:
        by_target.setdefault(r.target, []).append(r)
    worst = max(rows, key=lambda r: r.added)
    assert worst.target in ("aten.sub.Tensor", "aten.add.Tensor"), worst
    assert worst.gap > 1e-2
    first_linear = next(r for r in rows if r.target in ("aten.addmm.default", "aten.linear.default"))
    assert first_linear.gap < 2e-3  # before the cancellation, float16 is close
    weights = [r for r in rows if r.target == "input or weight"]
    assert weights and all(r.gap < 1e-3 for r in weights)  # rounding weights to float16


def test_debug_command_prints_the_table(capsys):
    assert main(["debug", "-m", "demo", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "float16 vs float32" in out and "where float16 loses the most (largest added gap, top 3)" in out
    assert "aten.convolution.default" in out
