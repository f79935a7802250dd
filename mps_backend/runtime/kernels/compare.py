"""Comparisons (semantics §5.4, ``BinaryOps.mm``): promote both operands, broadcast, compare; Bool out.

Promotion happens before comparing (e.g. an int64 operand compared with an f16 one is first
rounded to f16), so operands are cast to the promoted dtype explicitly. No aten-mode differences.
"""

from __future__ import annotations

import torch

from ..core import KernelContext, promote


def _compare(fn):
    def kernel(ctx: KernelContext, node) -> None:
        a, b = ctx.get(node["input1_id"]), ctx.get(node["input2_id"])
        d = promote(ctx, a, b)
        ctx.set(node["output_id"], fn(a.to(d), b.to(d)))  # comparisons are exact in every dtype

    return kernel


KERNELS = {
    "MPSEq": _compare(torch.eq),
    "MPSNe": _compare(torch.ne),
    "MPSGe": _compare(torch.ge),
    "MPSGt": _compare(torch.gt),
    "MPSLe": _compare(torch.le),
    "MPSLt": _compare(torch.lt),
}
