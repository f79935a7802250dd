"""Unary math (semantics §5.5, ``UnaryOps.mm``): one MPSGraph op each, dtype preserved, no casts.

Floats are computed in f32 and rounded to the input dtype. Integer inputs are not cast to float on
the device: Neg/Abs/Sign are exact integer ops and Floor/Ceil/Round keep integer values; for the
float-only math (exp, log, trig, ...) the device result of an integer input is unverified, so the
faithful model refuses it (a lowering must cast first).

Device behaviour kept in faithful mode, torch semantics in aten mode:
* MPSRound rounds ties away from zero (MPSGraph ``round``); aten: half-to-even ``torch.round``.
* float-only math on integers: refused; aten: torch's float result.
* MPSLogicalNot on a non-Bool input: unverified, refused; aten: ``x == 0``.
"""

from __future__ import annotations

import torch

from mps_backend.dtypes import FLOAT_DTYPES

from ..core import KernelContext, compute, to

_FLOAT_MATH = {
    "MPSExp": torch.exp,
    "MPSExp2": torch.exp2,
    "MPSReciprocal": torch.reciprocal,
    "MPSSqrt": torch.sqrt,
    "MPSRsqrt": torch.rsqrt,
    "MPSLog": torch.log,
    "MPSLog10": torch.log10,
    "MPSLog2": torch.log2,
    "MPSErf": torch.erf,
    "MPSSigmoid": torch.sigmoid,
    "MPSSin": torch.sin,
    "MPSCos": torch.cos,
    "MPSTan": torch.tan,
    "MPSAsin": torch.asin,
    "MPSAcos": torch.acos,
    "MPSAtan": torch.atan,
    "MPSSinh": torch.sinh,
    "MPSCosh": torch.cosh,
    "MPSTanh": torch.tanh,
    "MPSAsinh": torch.asinh,
    "MPSAcosh": torch.acosh,
    "MPSAtanh": torch.atanh,
}
_ANY_DTYPE = {"MPSNeg": torch.neg, "MPSAbs": torch.abs, "MPSSign": torch.sign}
_ROUNDING = {"MPSFloor": torch.floor, "MPSCeil": torch.ceil}


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest, ties away from zero (exact: ``x - trunc(x)`` is exact in binary floats)."""
    t = torch.trunc(x)
    return torch.where((x - t).abs() >= 0.5, t + torch.sign(x), t)


def _float_math(fn):
    def kernel(ctx: KernelContext, node) -> None:
        x = ctx.get(node["input1_id"])
        if x.dtype in FLOAT_DTYPES:
            ctx.set(node["output_id"], to(fn(compute(x)), x.dtype))
        elif ctx.faithful:
            ctx.fail(
                f"{node.op} of a {x.dtype} tensor: the device keeps the integer dtype and its "
                "result is unverified (not modelled; cast to float first)"
            )
        else:
            ctx.set(node["output_id"], fn(x))

    return kernel


def _same_dtype(fn):
    def kernel(ctx: KernelContext, node) -> None:
        x = ctx.get(node["input1_id"])
        ctx.set(node["output_id"], to(fn(compute(x)), x.dtype))

    return kernel


def _rounding(fn):
    def kernel(ctx: KernelContext, node) -> None:
        x = ctx.get(node["input1_id"])
        if x.dtype not in FLOAT_DTYPES:
            ctx.set(node["output_id"], x)  # integral values are already rounded
            return
        ctx.set(node["output_id"], to(fn(compute(x)), x.dtype))

    return kernel


_ROUND_FAITHFUL, _ROUND_ATEN = _rounding(round_half_away), _rounding(torch.round)


def round_(ctx: KernelContext, node) -> None:
    (_ROUND_FAITHFUL if ctx.faithful else _ROUND_ATEN)(ctx, node)


def _predicate(fn):
    def kernel(ctx: KernelContext, node) -> None:
        ctx.set(node["output_id"], fn(ctx.get(node["input1_id"])))

    return kernel


def logical_not(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    if x.dtype != torch.bool and ctx.faithful:
        ctx.fail(
            f"logical NOT of a {x.dtype} tensor: applied without a cast to Bool on the device, result unverified (not modelled)"
        )
    ctx.set(node["output_id"], torch.logical_not(x))


KERNELS = {
    **{op: _float_math(fn) for op, fn in _FLOAT_MATH.items()},
    **{op: _same_dtype(fn) for op, fn in _ANY_DTYPE.items()},
    **{op: _rounding(fn) for op, fn in _ROUNDING.items()},
    "MPSRound": round_,
    "MPSIsnan": _predicate(torch.isnan),
    "MPSIsinf": _predicate(torch.isinf),
    "MPSLogicalNot": logical_not,
}
