"""Activations (semantics §5.1, ``ActivationOps.mm``).

Device bugs kept in faithful mode, torch semantics in aten mode:
* MPSGELU ``approximate == "tanh"``: device computes ``x * tanh(x)``; aten: tanh-approximated GELU.
* MPSLogSoftmax: device computes ``log(softmax(x))`` with the softmax rounded to x's dtype first
  (f16 underflow gives ``-inf``); aten: fused ``log_softmax``.
* ``half_to_float``: device aborts; aten: softmax computed and returned in f32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mps_backend.dtypes import FLOAT_DTYPES

from ..core import KernelContext, compute, f32, round_to, scalar_const, to

_SQRT1_2 = f32(math.sqrt(0.5))  # the float constant of mpsNormCdfOp


def hardtanh(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    lo = scalar_const(f32(node["min_value"]), x.dtype)
    hi = scalar_const(f32(node["max_value"]), x.dtype)
    if not ctx.faithful:
        ctx.set(node["output_id"], torch.minimum(torch.maximum(x, lo), hi))
        return
    t = torch.where(x < lo, lo, x)  # selections only: exact in any dtype, NaN passes through
    ctx.set(node["output_id"], torch.where(x > hi, hi, t))


def relu(ctx: KernelContext, node) -> None:
    ctx.set(node["output_id"], torch.relu(ctx.get(node["input1_id"])))


def gelu(ctx: KernelContext, node) -> None:
    x, out = ctx.get(node["input1_id"]), node["output_id"]
    approximate = node["approximate"]
    if approximate is None:
        ctx.fail("MPSGELU.approximate missing (the runtime dereferences it: crash)")
    if x.dtype not in FLOAT_DTYPES:
        ctx.fail(f"GELU of a {x.dtype} tensor (erf/tanh need a float type)")
    if not ctx.faithful:
        mode = "tanh" if approximate == "tanh" else "none"
        ctx.set(out, to(F.gelu(compute(x), approximate=mode), x.dtype))
        return
    if approximate == "tanh":
        inner = torch.tanh(compute(x))  # device bug: the plain tanh op, not the tanh approximation
    else:
        c = compute(scalar_const(_SQRT1_2, x.dtype))
        inner = (torch.erf(compute(x) * c) + 1.0) * 0.5
    # the runtime binds the inner result to output_id, then multiplies by T(input1_id): with
    # input1_id == output_id that re-reads the inner result (out = inner * inner)
    ctx.set(out, to(inner, x.dtype))
    ctx.set(out, to(compute(ctx.get(out)) * compute(ctx.get(node["input1_id"])), x.dtype))


def leaky_relu(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    xc = compute(x)
    slope = f32(node["negative_slope"])
    ctx.set(node["output_id"], to(torch.where(xc >= 0, xc, xc * slope), x.dtype))


def _softmax_input(ctx: KernelContext, node) -> tuple[torch.Tensor, bool]:
    x = ctx.get(node["input1_id"])
    if x.dtype not in FLOAT_DTYPES:
        ctx.fail(f"softmax of a {x.dtype} tensor")
    half_to_float = bool(node["half_to_float"])
    if half_to_float and ctx.faithful:
        ctx.fail("softmax with half to float conversion is not supported on MPS (ET_CHECK abort)")
    return x, half_to_float


def softmax(ctx: KernelContext, node) -> None:
    x, half_to_float = _softmax_input(ctx, node)
    out_dtype = torch.float32 if half_to_float else x.dtype
    ctx.set(node["output_id"], to(torch.softmax(compute(x), node["dim"]), out_dtype))


def log_softmax(ctx: KernelContext, node) -> None:
    x, half_to_float = _softmax_input(ctx, node)
    if not ctx.faithful:
        out_dtype = torch.float32 if half_to_float else x.dtype
        ctx.set(node["output_id"], to(torch.log_softmax(compute(x), node["dim"]), out_dtype))
        return
    probs = round_to(torch.softmax(compute(x), node["dim"]), x.dtype)  # a separate device tensor
    ctx.set(node["output_id"], to(torch.log(probs), x.dtype))


KERNELS = {
    "MPSHardTanh": hardtanh,
    "MPSReLU": relu,
    "MPSGELU": gelu,
    "MPSLeakyReLU": leaky_relu,
    "MPSSoftmax": softmax,
    "MPSLogSoftmax": log_softmax,
}
