"""Op-table rows: mm, bmm, addmm (alpha/beta), baddbmm, matmul patterns, linear."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .harness import randint, randn, row, values


class Linear(torch.nn.Module):
    def __init__(self, bias: bool = True, i: int = 4, o: int = 5):
        super().__init__()
        self.fc = torch.nn.Linear(i, o, bias=bias)

    def forward(self, x):
        return self.fc(x)


class TiedWeight(torch.nn.Module):
    """The weight is read by a linear and by a matmul: it must stay in the blob untransposed."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return self.fc(x) + x @ self.fc.weight


class SharedLinear(torch.nn.Module):
    """One linear applied twice (like an RNN cell over time steps): the transposed weight is made once
    and both linears read it (regression: the second read the dropped original)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))


def _sdpa(**kw):
    return lambda q, k, v, *mask: F.scaled_dot_product_attention(q, k, v, *mask, **kw)


ROWS = [
    row("aten.mm.default", "linalg-mm", torch.mm, randn(3, 4), randn(4, 5), kinds="MPSMatMul"),
    row("aten.bmm.default", "linalg-bmm", torch.bmm, randn(2, 3, 4), randn(2, 4, 5), kinds="MPSMatMul"),
    row(
        "aten.mm.default",
        "linalg-mm-int",
        torch.mm,
        randint(-3, 3, (3, 4), torch.int64),
        randint(-3, 3, (4, 2), torch.int64),
        cpu_reason="integer matrix multiplication",
    ),
    row("aten.addmm.default", "linalg-addmm", torch.addmm, randn(5), randn(3, 4), randn(4, 5), kinds="MPSAddmm"),
    # upstream defect: alpha / beta are keyword-only and were never read (always 1)
    row(
        "aten.addmm.default",
        "linalg-addmm-alpha-beta",
        lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=-2.0),
        randn(3, 5),
        randn(3, 4),
        randn(4, 5),
        kinds="MPSAddmm",
        tol={"fp16": 2e-3},
    ),  # fp16: alpha, beta products rounded
    # beta=0: torch ignores the bias (NaN included); the device would compute 0 * NaN
    row(
        "aten.addmm.default",
        "linalg-addmm-beta0",
        lambda b, x, w: torch.addmm(b, x, w, beta=0, alpha=3),
        values([float("nan")] * 5),
        randn(3, 4),
        randn(4, 5),
        kinds="MPSMatMul",
        tol={"fp16": 2e-3},
    ),  # fp16: product and scale rounded
    row(
        "aten.bmm.default",
        "linalg-baddbmm",
        lambda b, x, w: torch.baddbmm(b, x, w, beta=0.5, alpha=2.0),
        randn(2, 3, 5),
        randn(2, 3, 4),
        randn(2, 4, 5),
        kinds="MPSMatMul",
        tol={"fp16": 2e-3},
    ),  # fp16: 3 roundings
    row("aten.mm.default", "linalg-matmul-4d-2d", lambda a, b: a @ b, randn(2, 2, 3, 4), randn(4, 5), kinds="MPSMatMul"),
    row(
        "aten.bmm.default",
        "linalg-matmul-broadcast",
        lambda a, b: torch.matmul(a, b),
        randn(2, 1, 3, 4),
        randn(3, 4, 2),
        kinds="MPSMatMul",
    ),
    # matrix @ vector reaches edge as mul + sum
    row(
        "aten.mul.Tensor",
        "linalg-matmul-vec",
        lambda a, b: a @ b,
        randn(3, 4),
        randn(4),
        kinds={"MPSMul", "MPSMean"},
        tol={"fp16": 2e-3},
    ),  # fp16: product, mean and count scaling rounded
    # linear: kept whole (MPSAddmm with a bias for rank >= 2: broadcast matmul, else MPSMatMul);
    row("aten.linear.default", "linalg-linear-3d", Linear, randn(2, 3, 4), kinds="MPSAddmm"),
    row("aten.linear.default", "linalg-linear-4d", Linear, randn(2, 2, 3, 4), kinds="MPSAddmm"),
    row(
        "aten.linear.default", "linalg-linear-no-bias", None, randn(2, 3, 4), kinds="MPSMatMul", module=lambda: Linear(bias=False)
    ),
    row("aten.linear.default", "linalg-linear-2d", Linear, randn(3, 4), kinds="MPSAddmm"),
    # out_features=1: the transposed [K, 1] weight has strides (1, K) yet reports contiguous
    row(
        "aten.linear.default", "linalg-linear-one-output", None, randn(4, 16), kinds="MPSAddmm", module=lambda: Linear(i=16, o=1)
    ),
    row("aten.linear.default", "linalg-linear-shared-weight", SharedLinear, randn(3, 4), kinds="MPSAddmm", tol={"fp16": 2e-3}),
    row("aten.linear.default", "linalg-linear-1d", Linear, randn(4)),
    row("aten.linear.default", "linalg-linear-tied-weight", TiedWeight, randn(3, 4), kinds="MPSMatMul"),
    row(
        "aten.linear.default",
        "linalg-linear-weight-input",
        lambda x, w, b: F.linear(x, w, b),
        randn(2, 3, 4),
        randn(5, 4),
        randn(5),
    ),
    # torch 2.14's SDPA decomposition: scaled bmm, softmax, the fully-masked-row guard
    # (eq -inf / logical_not / any.dim / where with full_like 0), bmm; causal adds arange/le/logical_and.
    # fp16: ~8 chained roundings through softmax and two matmuls (measured <= 7e-4)
    row(
        "aten.mul.Scalar",
        "linalg-sdpa",
        _sdpa(),
        randn(2, 4, 8, 16),
        randn(2, 4, 8, 16),
        randn(2, 4, 8, 16),
        kinds={"MPSMatMul", "MPSSoftmax", "MPSMean"},
        tol={"fp16": 3e-3},
    ),
    row(
        "aten._softmax.default",
        "linalg-sdpa-causal",
        _sdpa(is_causal=True),
        randn(1, 2, 6, 8),
        randn(1, 2, 6, 8),
        randn(1, 2, 6, 8),
        kinds={"MPSMatMul", "MPSSoftmax"},
        tol={"fp16": 3e-3},
    ),
    row(
        "aten._softmax.default",
        "linalg-sdpa-float-mask",
        _sdpa(),
        randn(1, 2, 6, 8),
        randn(1, 2, 6, 8),
        randn(1, 2, 6, 8),
        randn(6, 6),
        kinds={"MPSMatMul", "MPSSoftmax"},
        tol={"fp16": 3e-3},
    ),
    # a fully masked row: torch returns zeros there (the guard), not NaN
    row(
        "aten._softmax.default",
        "linalg-sdpa-bool-mask",
        _sdpa(),
        randn(1, 2, 4, 8),
        randn(1, 2, 4, 8),
        randn(1, 2, 4, 8),
        values(
            [[True, False, True, False], [False, False, False, False], [True, True, True, True], [False, True, False, False]],
            torch.bool,
        ),
        kinds={"MPSMatMul", "MPSSoftmax", "MPSWhere"},
        tol={"fp16": 3e-3},
    ),
]
