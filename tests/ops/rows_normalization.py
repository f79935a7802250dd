"""Op-table rows: batch-statistics normalization (instance norm, training-mode batch norm without
running stats: ``_native_batch_norm_legit.no_stats``) -> MPSLayerNorm over ``[C, B * R]``. (Inference
batch / layer / group norm rows are in rows_pad_pool_norm.py.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .harness import randn, row


class AffineInstanceNorm(torch.nn.Module):
    """InstanceNorm2d with non-trivial affine parameters (the default ones are 1 and 0)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.InstanceNorm2d(3, affine=True)
        with torch.no_grad():
            self.norm.weight.copy_(torch.tensor([0.5, -1.5, 2.0]))
            self.norm.bias.copy_(torch.tensor([0.25, 0.0, -1.0]))

    def forward(self, x):
        return self.norm(x)


ROWS = [
    # instance norm: view [1, N*C, H, W] -> batch statistics per channel: one MPSLayerNorm over [N*C, H*W];
    # fp16: normalisation and (affine) product and sum rounded -> 3 roundings
    row(
        "aten._native_batch_norm_legit.no_stats",
        "norm-instance-norm-2d",
        None,
        randn(2, 3, 4, 5, scale=2.0, offset=1.0),
        kinds="MPSLayerNorm",
        module=lambda: torch.nn.InstanceNorm2d(3),
        tol={"fp16": 3e-3},
    ),
    row(
        "aten._native_batch_norm_legit.no_stats",
        "norm-instance-norm-2d-affine",
        AffineInstanceNorm,
        randn(2, 3, 4, 4),
        kinds={"MPSLayerNorm", "MPSMul", "MPSAdd"},
        tol={"fp16": 3e-3},
    ),
    row(
        "aten._native_batch_norm_legit.no_stats",
        "norm-instance-norm-1d",
        None,
        randn(2, 4, 7),
        kinds="MPSLayerNorm",
        module=lambda: torch.nn.InstanceNorm1d(4),
        tol={"fp16": 3e-3},
    ),
    row(
        "aten._native_batch_norm_legit.no_stats",
        "norm-instance-norm-functional-eps",
        lambda x: F.instance_norm(x, eps=1e-3),
        randn(1, 2, 3, 3),
        kinds="MPSLayerNorm",
        tol={"fp16": 3e-3},
    ),
    # batch norm with batch statistics (training=True, no running stats): channels moved first
    row(
        "aten._native_batch_norm_legit.no_stats",
        "norm-batch-stats",
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        randn(3, 4, 2, 2),
        randn(4),
        randn(4),
        kinds={"MPSPermute", "MPSLayerNorm", "MPSMul"},
        tol={"fp16": 3e-3},
    ),
    row(
        "aten._native_batch_norm_legit.no_stats",
        "norm-batch-stats-rank2",
        lambda x: F.batch_norm(x, None, None, training=True),
        randn(5, 3),
        kinds={"MPSPermute", "MPSLayerNorm"},
        tol={"fp16": 3e-3},
    ),
]
