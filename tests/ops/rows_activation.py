"""Op-table rows: activations (relu, leaky_relu, hardtanh, softmax, log_softmax, hardswish,
hardsigmoid, silu, elu / selu / celu, softplus, mish, logsigmoid; gelu is pinned in rows_elementwise.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .harness import randn, row, values

NAN, INF = float("nan"), float("inf")

ROWS = [
    row("aten.relu.default", "act-relu", torch.relu, randn(3, 4), kinds="MPSReLU"),
    row("aten.leaky_relu.default", "act-leaky-relu", lambda x: F.leaky_relu(x, 0.2), randn(3, 4), kinds="MPSLeakyReLU"),
    row("aten.hardtanh.default", "act-hardtanh", lambda x: F.hardtanh(x, -0.5, 2.0), randn(3, 4, scale=2.0), kinds="MPSHardTanh"),
    row("aten._softmax.default", "act-softmax", lambda x: torch.softmax(x, -1), randn(3, 8, scale=3.0), kinds="MPSSoftmax"),
    # log_softmax from the device's stable softmax: lse = sum(p (x - log p)) / sum(p); fp16: the
    # weighted mean rounds a few f16 terms of size ~|lse| -> 3e-3 of the output scale
    row(
        "aten._log_softmax.default",
        "act-log-softmax",
        lambda x: torch.log_softmax(x, -1),
        randn(3, 8, scale=3.0),
        kinds={"MPSSoftmax", "MPSMean", "MPSLog"},
        tol={"fp16": 3e-3},
    ),
    row(
        "aten._log_softmax.default",
        "act-log-softmax-dim0",
        lambda x: torch.log_softmax(x, 0),
        randn(5, 3, 2, scale=2.0),
        kinds="MPSSoftmax",
        tol={"fp16": 3e-3},
    ),
    # probabilities that underflow (f16 below 6e-8, f32 below 1e-45): log(softmax) would be -inf
    row(
        "aten._log_softmax.default",
        "act-log-softmax-underflow",
        lambda x: torch.log_softmax(x, -1),
        values([[0.0, -5.0, -20.0, -40.0, -120.0], [30.0, 0.0, -10.0, 50.0, -90.0]]),
        kinds="MPSSoftmax",
        tol={"fp16": 3e-3},
    ),
    row(
        "aten._log_softmax.default",
        "act-log-softmax-inf",
        lambda x: torch.log_softmax(x, -1),
        values([[0.0, -INF, 1.0], [NAN, 0.0, 1.0]]),
        kinds="MPSSoftmax",
        tol={"fp16": 3e-3},
    ),
    # hardswish / hardsigmoid kept whole (preserve): hardtanh(0.5 + x/6, 0, 1) (times x); fp16: the
    # scaled add, the clamp and the product each round -> 2e-3
    row(
        "aten.hardswish.default",
        "act-hardswish",
        F.hardswish,
        randn(4, 6, scale=4.0),
        kinds={"MPSAdd", "MPSHardTanh", "MPSMul"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.hardswish.default",
        "act-hardswish-special",
        F.hardswish,
        values([NAN, INF, -INF, -3.0, 3.0, 0.0, -2.9, 2.9]),
        kinds="MPSHardTanh",
    ),
    row(
        "aten.hardsigmoid.default",
        "act-hardsigmoid",
        F.hardsigmoid,
        randn(4, 6, scale=4.0),
        kinds={"MPSAdd", "MPSHardTanh"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.hardsigmoid.default",
        "act-hardsigmoid-special",
        F.hardsigmoid,
        values([NAN, INF, -INF, -3.0, 3.0, 0.0, -2.9, 2.9]),
        kinds="MPSHardTanh",
    ),
    # silu: the default decomposition (sigmoid, mul) is lowered
    row("aten.sigmoid.default", "act-silu", F.silu, randn(4, 6, scale=3.0), kinds={"MPSSigmoid", "MPSMul"}, tol={"fp16": 2e-3}),
    # ---- elu family: x > 0 ? scale x : alpha scale expm1(input_scale x), expm1 = 2t / (1 - t),
    # t = tanh(x / 2) (accurate near 0). Max relative error vs eager (device model, unary.py): fp32
    # 1.8e-7, fp16 1.3e-3 of each element (normal float16 range)
    row("aten.elu.default", "act-elu", F.elu, randn(4, 6, scale=3.0), kinds={"MPSTanh", "MPSWhere"}),
    row("aten.elu.default", "act-elu-alpha", lambda x: F.elu(x, 0.5), randn(3, 4, 5, scale=2.0), kinds={"MPSTanh", "MPSWhere"}),
    row(
        "aten.elu.default",
        "act-elu-scales",
        lambda x: torch.ops.aten.elu(x, 1.5, 2.0, 0.5),
        randn(4, 6, scale=3.0),
        kinds={"MPSTanh", "MPSMul"},
    ),
    # a negative input_scale: the expm1 argument is positive for x <= 0 (general expm1)
    row(
        "aten.elu.default",
        "act-elu-negative-input-scale",
        lambda x: torch.ops.aten.elu(x, 1.0, 1.0, -0.5),
        randn(4, 6, scale=3.0),
        kinds={"MPSTanh", "MPSExp"},
    ),
    # tiny negatives: exp(x) - 1 would be 0 or off by 100 %
    row(
        "aten.elu.default",
        "act-elu-tiny",
        F.elu,
        values([-1e-9, -3e-7, -1e-4, -0.0, 0.0, 2e-8, NAN, INF, -INF, -30.0]),
        precisions=("fp32",),
        kinds="MPSTanh",
    ),
    row("aten.elu.default", "act-elu-special", F.elu, values([NAN, INF, -INF, -0.0, 0.0, -1e-3, -30.0, 5.0]), kinds="MPSTanh"),
    # selu (edge: elu with selu's constants): fp32 2.1e-7; fp16 1.3e-3, 2e-3 for results near 6e-5
    row("aten.elu.default", "act-selu", F.selu, randn(4, 6, scale=3.0), kinds={"MPSTanh", "MPSWhere"}),
    # celu: the decomposition's expm1 (lowered, general form): fp32 2.5e-7, fp16 1.7e-3 per element
    # (normal range; the harness's scale is max |eager|)
    row("aten.expm1.default", "act-celu", lambda x: F.celu(x, 0.7), randn(4, 6, scale=3.0), kinds={"MPSTanh", "MPSExp"}),
    # ---- softplus (preserved): (relu(z) + log1p(exp(-|z|))) / beta, x above the threshold; no
    # float16 overflow of exp(beta x) (torch's formula) -- fp16 rows reach x = 19 with threshold 20.
    # Max relative error per element vs eager: fp32 2.4e-7, fp16 1.5e-3
    row("aten.softplus.default", "act-softplus", F.softplus, randn(4, 6, scale=6.0), kinds={"MPSReLU", "MPSAtanh", "MPSWhere"}),
    row(
        "aten.softplus.default",
        "act-softplus-beta-threshold",
        lambda x: F.softplus(x, 2.0, 5.0),
        randn(4, 6, scale=3.0),
        kinds={"MPSReLU", "MPSDiv"},
    ),
    row(
        "aten.softplus.default",
        "act-softplus-large",
        F.softplus,
        values([11.5, 15.0, 19.0, 20.5, -15.0, -0.0, NAN, INF, -INF]),
        kinds="MPSReLU",
    ),
    # mish = x tanh(softplus(x)) on the preserved softplus: fp32 3.3e-7, fp16 2.1e-3 per element where
    # |mish| >= 1e-3 (below, float16 subnormal intermediates: the harness's scale is max |eager|)
    row("aten.softplus.default", "act-mish", F.mish, randn(4, 6, scale=3.0), kinds={"MPSReLU", "MPSTanh"}),
    # logsigmoid: min(x, 0) - log1p(exp(-|x|)) (decomposition), log1p lowered: fp32 2.4e-7, fp16 1.5e-3
    row("aten.log1p.default", "act-log-sigmoid", F.logsigmoid, randn(4, 6, scale=4.0), kinds={"MPSAtanh", "MPSLog"}),
    row(
        "aten.log1p.default",
        "act-log-sigmoid-special",
        F.logsigmoid,
        values([-10.0, -5.0, -1.0, 0.0, 1.0, 5.0, 10.0, 30.0, -INF, INF, NAN]),
        kinds="MPSAtanh",
    ),
]
