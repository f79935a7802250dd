"""Binary arithmetic (semantics §5.2, ``BinaryOps.mm``): promote both operands, broadcast, apply.

Intermediates that are separate device tensors (``alpha * b``; the quotient, its rounding and the
product of Div/Fmod/Remainder) are rounded to f16 in f16 graphs, like every op output.

Device behaviour kept in faithful mode, torch semantics in aten mode:
* MPSDiv on integers without a mode: integer division with an integer result (truncating toward
  zero: MPSGraph's rounding is unverified); aten: true division, float result.
* MPSDiv/MPSFmod/MPSRemainder on integers with a mode: computed and returned in f32; aten: integer.
* ``trunc`` mode (MPSDiv "trunc", MPSFmod's default) with an f16 first operand aborts; aten computes.
* MPSFmod with "floor" / MPSRemainder with "trunc" return the quotient; aten: torch.fmod/remainder.
* MPSMinimum does not propagate NaN (modelled as ``fmin``); aten: ``torch.minimum``.
MPSMin, MPSMax and MPSAtan2 have no dispatch case (NotImplemented) in both modes.
"""

from __future__ import annotations

import torch

from mps_backend.dtypes import FLOAT_DTYPES

from ..core import KernelContext, compute, f32, promote, round_to, scalar_const, to


def _operands(ctx: KernelContext, node) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    """Both operands cast to the promoted dtype D, then widened for computing (f16 -> f32)."""
    a, b = ctx.get(node["input1_id"]), ctx.get(node["input2_id"])
    d = promote(ctx, a, b)
    return compute(a.to(d)), compute(b.to(d)), d


def _with_alpha(sign: int):
    def kernel(ctx: KernelContext, node) -> None:
        a, b, d = _operands(ctx, node)
        alpha = f32(node["alpha"])
        if alpha != 1.0:  # exact compare, as the runtime does
            b = round_to(b * compute(scalar_const(alpha, d)), d)  # alpha: a [1] constant of dtype D
        ctx.set(node["output_id"], to(a + b if sign > 0 else a - b, d))

    return kernel


def _simple(fn):
    def kernel(ctx: KernelContext, node) -> None:
        a, b, d = _operands(ctx, node)
        ctx.set(node["output_id"], to(fn(a, b), d))

    return kernel


def minimum(ctx: KernelContext, node) -> None:
    a, b, d = _operands(ctx, node)
    nan_propagating = not ctx.faithful or d not in FLOAT_DTYPES
    ctx.set(node["output_id"], to(torch.minimum(a, b) if nan_propagating else torch.fmin(a, b), d))


def not_dispatched(ctx: KernelContext, node) -> None:
    ctx.fail(f"{node.op} is not dispatched by the runtime (NotImplemented at init)")


# ------------------------------------------------------------------------------------------------
# Div / Fmod / Remainder: one template (divModeTemplate), the op name picks the remainder forms

_DEFAULT_MODE = {"MPSDiv": None, "MPSFmod": "trunc", "MPSRemainder": "floor"}
_ATEN = {"MPSFmod": torch.fmod, "MPSRemainder": torch.remainder}


def _div_aten(ctx: KernelContext, node, mode: str | None) -> None:
    a, b = ctx.get(node["input1_id"]), ctx.get(node["input2_id"])
    out_dtype = torch.result_type(a, b)
    if node.op == "MPSDiv":
        if mode not in (None, "trunc", "floor"):
            ctx.fail(f"invalid rounding mode {mode!r}")
        if mode is None and out_dtype not in FLOAT_DTYPES:
            out_dtype = torch.float32  # true division of integers
        r = torch.div(compute(a), compute(b), rounding_mode=mode)
    else:
        r = _ATEN[node.op](compute(a), compute(b))
    ctx.set(node["output_id"], to(r, out_dtype))


def div_mode(ctx: KernelContext, node) -> None:
    mode = node["rounding_mode"]
    if mode is None:  # absent string => the op's default
        mode = _DEFAULT_MODE[node.op]
    if not ctx.faithful:
        _div_aten(ctx, node, mode)
        return
    a_dtype = ctx.get(node["input1_id"]).dtype
    if mode == "trunc" and a_dtype == torch.float16:
        ctx.fail("MPS: does not support trunc_divide op with float16 input (ET_CHECK abort)")
    a, b, d = _operands(ctx, node)
    if d not in FLOAT_DTYPES and mode in ("trunc", "floor"):
        a, b, d = a.float(), b.float(), torch.float32  # integers with a mode: cast to f32 first
    if d not in FLOAT_DTYPES:  # a non-float quotient is returned before any other mode is looked at
        ctx.set(node["output_id"], _int_div(ctx, a, b))
        return
    q = round_to(a / b, d)
    if mode is None:
        out = q
    elif mode == "trunc":
        q = torch.trunc(q)
        out = a - round_to(q * b, d) if node.op == "MPSFmod" else q
    elif mode == "floor":
        q = torch.floor(q)
        out = a - round_to(q * b, d) if node.op == "MPSRemainder" else q
    else:
        ctx.fail(f"invalid rounding mode {mode!r} (debug assert; nil tensor in release builds)")
    ctx.set(node["output_id"], to(out, d))


def _int_div(ctx: KernelContext, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """MPSGraph integer division (result stays integer). Rounding of negative quotients and
    division by zero are unverified: truncation is modelled, zero divisors are refused."""
    if a.dtype == torch.bool:
        ctx.fail("division of Bool tensors")
    if bool((b == 0).any()):
        ctx.fail("integer division by zero: the device result is unverified (not modelled)")
    return torch.div(a, b, rounding_mode="trunc")


KERNELS = {
    "MPSAdd": _with_alpha(+1),
    "MPSSub": _with_alpha(-1),
    "MPSMul": _simple(torch.mul),
    "MPSPow": _simple(torch.pow),
    "MPSMinimum": minimum,
    "MPSDiv": div_mode,
    "MPSFmod": div_mode,
    "MPSRemainder": div_mode,
    "MPSMin": not_dispatched,
    "MPSMax": not_dispatched,
    "MPSAtan2": not_dispatched,
}
