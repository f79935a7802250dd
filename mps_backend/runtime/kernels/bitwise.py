"""Bitwise ops (semantics §5.3): Bool operands use the logical op, integers the bitwise op, floats fail.

Binary members promote both operands first. The macOS 13 requirement is assumed met.
No aten-mode differences.
"""

from __future__ import annotations

import torch

from mps_backend.dtypes import FLOAT_DTYPES

from ..core import KernelContext, promote


def _bitwise(fn):
    def kernel(ctx: KernelContext, node) -> None:
        a, b = ctx.get(node["input1_id"]), ctx.get(node["input2_id"])
        d = promote(ctx, a, b)
        if d in FLOAT_DTYPES:
            ctx.fail(f"bitwise op on {d} operands (MPSGraph error)")
        ctx.set(node["output_id"], fn(a.to(d), b.to(d)))  # on Bool, torch's bitwise ops are logical

    return kernel


def bitwise_not(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    if x.dtype in FLOAT_DTYPES:
        ctx.fail(f"bitwise NOT of a {x.dtype} tensor (MPSGraph error)")
    ctx.set(node["output_id"], torch.bitwise_not(x))  # Bool: logical NOT


KERNELS = {
    "MPSBitwiseAnd": _bitwise(torch.bitwise_and),
    "MPSBitwiseOr": _bitwise(torch.bitwise_or),
    "MPSBitwiseXor": _bitwise(torch.bitwise_xor),
    "MPSBitwiseNot": bitwise_not,
}
