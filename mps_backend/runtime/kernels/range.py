"""MPSArange (semantics §5.16, ``RangeOps.mm``).

``n = int32(ceil((end - start) / step))`` with the difference in float32 and the division in
double; ``out = cast(0..n-1, dtype) * step_d + start_d`` where ``step_d``/``start_d`` are the
fields converted to ``dtype`` (truncated for integers). In f16 every step is an f16 tensor.
aten mode: ``torch.arange(start, end, step, dtype=dtype)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..core import KernelContext, compute, device_dtype, f32, round_to, scalar_const, to


def arange(ctx: KernelContext, node) -> None:
    dt = device_dtype(node["dtype"])
    start, end, step = f32(node["start"]), f32(node["end"]), f32(node["step"])
    if step != 0 and math.isfinite((end - start) / step):
        ctx.reserve(max(math.ceil((end - start) / step), 0), dt.itemsize, f"arange({start}, {end}, {step})")
    if not ctx.faithful:
        ctx.set(node["output_id"], torch.arange(start, end, step, dtype=dt))
        return
    span = float(np.float32(end) - np.float32(start))
    q = span / step if step != 0 else math.nan
    if not math.isfinite(q) or not -(2**31) <= math.ceil(q) < 2**31:
        ctx.fail(f"arange size ceil({span} / {step}) is not an int32 (undefined conversion)")
    n = math.ceil(q)
    if n < 0:
        ctx.fail(f"arange of negative size {n}")
    coords = compute(torch.arange(n, dtype=torch.int32).to(dt))
    scaled = round_to(coords * compute(scalar_const(step, dt)), dt)
    ctx.set(node["output_id"], to(scaled + compute(scalar_const(start, dt)), dt))


KERNELS = {"MPSArange": arange}
