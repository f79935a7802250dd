"""MPSCast (semantics §5.11, last row): cast to the device dtype of ``dtype`` (float64 => f32).

Float -> integer truncates toward zero (MPSGraph rounding unverified); -> Bool: non-zero => true.
No aten-mode differences.
"""

from __future__ import annotations

from mps_backend.serialization.model import DataType

from ..core import KernelContext, device_dtype


def cast(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    if node["dtype"] == DataType.int4:
        ctx.fail("cast to int4 is not modelled (int4 exists only as quantized constants)")
    ctx.set(node["output_id"], x.to(device_dtype(node["dtype"])))


KERNELS = {"MPSCast": cast}
