"""Op-table rows: activations (relu, leaky_relu, hardtanh, softmax, log_softmax, hardswish,
hardsigmoid, silu; gelu is pinned in rows_elementwise.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .harness import randn, row, values

NAN, INF = float("nan"), float("inf")

ROWS = [
    row("act-relu", torch.relu, randn(3, 4), kinds="MPSReLU"),
    row("act-leaky-relu", lambda x: F.leaky_relu(x, 0.2), randn(3, 4), kinds="MPSLeakyReLU"),
    row("act-hardtanh", lambda x: F.hardtanh(x, -0.5, 2.0), randn(3, 4, scale=2.0), kinds="MPSHardTanh"),
    row("act-softmax", lambda x: torch.softmax(x, -1), randn(3, 8, scale=3.0), kinds="MPSSoftmax"),
    # log_softmax from the device's stable softmax: lse = sum(p (x - log p)) / sum(p); fp16: the
    # weighted mean rounds a few f16 terms of size ~|lse| -> 3e-3 of the output scale
    row("act-log-softmax", lambda x: torch.log_softmax(x, -1), randn(3, 8, scale=3.0),
        kinds={"MPSSoftmax", "MPSMean", "MPSLog"}, tol={"fp16": 3e-3}),
    row("act-log-softmax-dim0", lambda x: torch.log_softmax(x, 0), randn(5, 3, 2, scale=2.0), kinds="MPSSoftmax",
        tol={"fp16": 3e-3}),
    # probabilities that underflow (f16 below 6e-8, f32 below 1e-45): log(softmax) would be -inf
    row("act-log-softmax-underflow", lambda x: torch.log_softmax(x, -1),
        values([[0.0, -5.0, -20.0, -40.0, -120.0], [30.0, 0.0, -10.0, 50.0, -90.0]]), kinds="MPSSoftmax",
        tol={"fp16": 3e-3}),
    row("act-log-softmax-inf", lambda x: torch.log_softmax(x, -1), values([[0.0, -INF, 1.0], [NAN, 0.0, 1.0]]),
        kinds="MPSSoftmax", tol={"fp16": 3e-3}),
    # hardswish / hardsigmoid kept whole (preserve): hardtanh(0.5 + x/6, 0, 1) (times x); fp16: the
    # scaled add, the clamp and the product each round -> 2e-3
    row("act-hardswish", F.hardswish, randn(4, 6, scale=4.0), kinds={"MPSAdd", "MPSHardTanh", "MPSMul"},
        tol={"fp16": 2e-3}),
    row("act-hardswish-special", F.hardswish, values([NAN, INF, -INF, -3.0, 3.0, 0.0, -2.9, 2.9]),
        kinds="MPSHardTanh"),
    row("act-hardsigmoid", F.hardsigmoid, randn(4, 6, scale=4.0), kinds={"MPSAdd", "MPSHardTanh"},
        tol={"fp16": 2e-3}),
    row("act-hardsigmoid-special", F.hardsigmoid, values([NAN, INF, -INF, -3.0, 3.0, 0.0, -2.9, 2.9]),
        kinds="MPSHardTanh"),
    # silu: the default decomposition (sigmoid, mul) is lowered
    row("act-silu", F.silu, randn(4, 6, scale=3.0), kinds={"MPSSigmoid", "MPSMul"}, tol={"fp16": 2e-3}),
    # log_sigmoid decomposes into log1p (no exact lowering)
    row("act-log-sigmoid", F.logsigmoid, randn(4), cpu_reason="no MPS lowering for aten.log1p"),
]
