"""Op-table rows: constant-producing ops (full, full_like, scalar_tensor, zeros/ones, empty) and
arange. In fp16 graphs their dtype must be float16 (the harness rejects float32 inside)."""

from __future__ import annotations

import torch

from .harness import randint, randn, row

ROWS = [
    row("aten.full.default", "const-full", lambda x: torch.full((3, 4), 2.5) + x, randn(3, 4), kinds="MPSFull"),
    row("aten.full.default", "const-full-broadcast", lambda x: x * torch.full((4,), -0.1), randn(3, 4), kinds="MPSFull"),
    row(
        "aten.full.default",
        "const-full-int",
        lambda x: torch.full((3, 4), 7) + x,
        randint(-9, 9, (3, 4), torch.int64),
        kinds="MPSFull",
    ),
    row(
        "aten.full.default",
        "const-full-bool",
        lambda x: torch.full((3, 4), True) & x,
        lambda: torch.rand(3, 4) > 0.5,
        kinds="MPSFull",
    ),
    row(
        "aten.full.default",
        "const-full-inf",
        lambda x: torch.minimum(x, torch.full((4,), float("inf"))),
        randn(3, 4),
        kinds="MPSFull",
    ),
    row(
        "aten.full.default",
        "const-full-not-f32",
        lambda x: torch.full((3,), 2**25 + 1) + x,
        randint(-9, 9, (3,), torch.int64),
        cpu_reason="not exact in float32",
    ),
    row("aten.sub.Tensor", "const-zeros", lambda x: torch.zeros(3, 4) - x, randn(3, 4), kinds="MPSFull"),
    row(
        "aten.add.Tensor",
        "const-ones-int32",
        lambda x: torch.ones(4, dtype=torch.int32) + x,
        randint(-9, 9, (3, 4)),
        kinds="MPSFull",
    ),
    row("aten.full_like.default", "const-full-like", lambda x: torch.full_like(x, 3.25), randn(3, 4), kinds="MPSFullLike"),
    row(
        "aten.full_like.default",
        "const-full-like-dtype",
        lambda x: torch.full_like(x, 3, dtype=torch.int32),
        randn(3, 4),
        kinds="MPSFullLike",
    ),
    row(
        "aten.full_like.default",
        "const-ones-like",
        lambda x: torch.ones_like(x) + x,
        randint(-9, 9, (2, 3), torch.int16),
        kinds="MPSFullLike",
    ),
    row(
        "aten.full_like.default",
        "const-zeros-like",
        lambda x: torch.zeros_like(x),
        randn(2, 3, dtype=torch.float16),
        kinds="MPSFullLike",
    ),
    row(
        "aten.scalar_tensor.default", "const-scalar-tensor", lambda x: x + torch.scalar_tensor(1.5), randn(3, 4), kinds="MPSFull"
    ),
    row(
        "dim_order_ops._empty_dim_order.default",
        "const-empty",
        lambda x: torch.empty(3, 4).zero_() + x,
        randn(3, 4),
        kinds="MPSFull",
    ),
    row("aten.add.Tensor", "const-zero-size", lambda x: (x + 1, torch.full((0, 4), 2.0)), randn(3, 4), cpu_reason="empty"),
    # arange: only ranges the device formula reproduces exactly
    row("aten.arange.start_step", "range-arange-float", lambda x: torch.arange(6.0) + x, randn(2, 6), kinds="MPSArange"),
    row(
        "aten.arange.start_step",
        "range-arange-int",
        lambda x: torch.arange(1, 9, 2) + x,
        randint(-9, 9, (2, 4), torch.int64),
        kinds="MPSArange",
    ),
    row(
        "aten.arange.start_step",
        "range-arange-int32",
        lambda x: torch.arange(-3, 5, dtype=torch.int32) * x,
        randint(-9, 9, (8,)),
        kinds="MPSArange",
    ),
    row(
        "aten.arange.start_step", "range-arange-dyadic", lambda x: torch.arange(-1.0, 1.0, 0.25) + x, randn(8), kinds="MPSArange"
    ),
    row(
        "aten.arange.start_step",
        "range-arange-descending",
        lambda x: torch.arange(10.0, 0.0, -1.5) + x,
        randn(7),
        kinds="MPSArange",
    ),
    row(
        "aten.arange.start_step",
        "range-arange-half",
        lambda x: torch.arange(0, 4, 0.5, dtype=torch.float16) + x,
        randn(8, dtype=torch.float16),
        kinds="MPSArange",
    ),
    row(
        "aten.arange.start_step",
        "range-arange-step-tenth",
        lambda x: torch.arange(0.0, 1.0, 0.1) + x,
        randn(10),
        cpu_reason="not exact",
    ),
    row(
        "aten.arange.start_step",
        "range-arange-large",
        lambda x: torch.arange(2**25, 2**25 + 4) + x,
        randint(0, 9, (4,), torch.int64),
        cpu_reason="2**24",
    ),
]
