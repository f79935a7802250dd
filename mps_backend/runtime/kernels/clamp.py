"""Clamp and where (semantics §5.8, ``ClampOps.mm``).

MPSClamp reads its bounds from the wrapper ``MPSNode.min_max`` (absent => -inf/+inf); the bounds
are constants in x's dtype. With neither bound the output id is never set.

Device behaviour kept in faithful mode, torch semantics in aten mode:
* min-only / max-only clamps use MPSGraph maximum/minimum, which do not propagate NaN (modelled
  as ``fmax``/``fmin``); aten: ``torch.clamp`` (NaN propagates).
* neither bound: output never set; aten: identity.
"""

from __future__ import annotations

import math

import torch

from mps_backend.dtypes import FLOAT_DTYPES

from ..core import KernelContext, compute, f32, same_dtype, scalar_const, to


def clamp(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    lo, hi = (-math.inf, math.inf) if node.min_max is None else (f32(v) for v in node.min_max)
    use_min, use_max = lo != -math.inf, hi != math.inf
    if not (use_min or use_max):
        if not ctx.faithful:
            ctx.set(node["output_id"], x)
        return  # the runtime assigns nothing: the output id keeps whatever it had (usually nil)
    lo_t = compute(scalar_const(lo, x.dtype)) if use_min else None
    hi_t = compute(scalar_const(hi, x.dtype)) if use_max else None
    xc = compute(x)
    if (use_min and use_max) or not ctx.faithful or x.dtype not in FLOAT_DTYPES:
        out = torch.clamp(xc, lo_t, hi_t)
    else:
        out = torch.fmax(xc, lo_t) if use_min else torch.fmin(xc, hi_t)
    ctx.set(node["output_id"], to(out, x.dtype))


def where(ctx: KernelContext, node) -> None:
    cond = ctx.get(node["input1_id"])
    a, b = ctx.get(node["input2_id"]), ctx.get(node["input3_id"])
    same_dtype(ctx, a, b, what="Where values")
    if cond.dtype != torch.bool:
        cond = cond != 0  # cast to Bool: non-zero (and NaN) => true
    ctx.set(node["output_id"], torch.where(cond, a, b))


KERNELS = {"MPSClamp": clamp, "MPSWhere": where}
