"""MPSConstantPadND (semantics §5.15)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..core import KernelContext


def constant_pad(ctx: KernelContext, node) -> None:
    x, pad = ctx.get(node["input1_id"]), list(node["pad"])
    if len(pad) not in (2, 4, 6) or len(pad) > 2 * x.dim():
        ctx.fail(f"pad of {len(pad)} entries for rank {x.dim()} (2, 4 or 6 and <= 2*rank required)")
    if min(pad) < 0:
        ctx.fail(f"negative pad {pad} (read through an unsigned type)")
    shape = list(x.shape)
    for i in range(len(pad) // 2):
        shape[-1 - i] += pad[2 * i] + pad[2 * i + 1]
    ctx.reserve(math.prod(shape), x.element_size(), f"padded tensor {shape}")
    value = torch.tensor(node["value"], dtype=torch.float32).to(x.dtype).item()  # f32 -> x's dtype
    ctx.set(node["output_id"], F.pad(x, pad, value=value))


KERNELS = {"MPSConstantPadND": constant_pad}
