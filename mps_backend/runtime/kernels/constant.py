"""Constant-producing members (semantics §5.7, ``ConstantOps.mm``). Constants from the segment
are loaded by the interpreter (§1).

``dtype`` is used as written: a float32 MPSFull in an fp16 graph stays f32 on the device.
``fill_value`` is a float32 converted to ``dtype`` (truncated for integers, non-zero => true).
No aten-mode differences.
"""

from __future__ import annotations

import math

import torch

from ..core import KernelContext, device_dtype, f32, scalar_const


def _filled(ctx: KernelContext, shape, fill_value: float, dtype: int) -> torch.Tensor:
    dt = device_dtype(dtype)
    if any(d < 0 for d in shape):
        ctx.fail(f"constant of negative shape {list(shape)}")
    ctx.reserve(math.prod(shape), dt.itemsize, f"constant of shape {list(shape)}")
    return scalar_const(f32(fill_value), dt).expand(*shape).contiguous()


def full(ctx: KernelContext, node) -> None:
    shape = list(node["shape"])
    if math.prod(shape) == 0:  # numel of [] is 1; a zero-element fill binds no tensor (nil)
        ctx.values.pop(node["output_id"], None)
        return
    ctx.set(node["output_id"], _filled(ctx, shape or [1], node["fill_value"], node["dtype"]))


def full_like(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])  # only its device shape is used; dtype comes from the node
    ctx.set(node["output_id"], _filled(ctx, x.shape, node["fill_value"], node["dtype"]))


KERNELS = {"MPSFull": full, "MPSFullLike": full_like}
