"""MPSMean (semantics §5.10)."""

from __future__ import annotations

from mps_backend.dtypes import FLOAT_DTYPES

from ..core import KernelContext, compute, to, wrap_dim


def mean(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    if x.dtype not in FLOAT_DTYPES:
        ctx.fail(f"mean of a {x.dtype} tensor")
    n, dims = node["num_dims"], list(node["dims"])
    if n > len(dims):
        ctx.fail(f"num_dims {n} exceeds the {len(dims)} entries of dims")
    axes = sorted({wrap_dim(ctx, d, x.dim()) for d in dims[:n]})
    if len(axes) != n:
        ctx.fail(f"duplicate axes in dims {dims[:n]}")
    if not axes:
        if ctx.faithful:  # device: empty dims => no reduction at all (torch reduces everything)
            ctx.set(node["output_id"], x)
            return
        axes = list(range(x.dim()))
    out = compute(x).mean(dim=axes, keepdim=bool(node["keep_dims"]))
    ctx.set(node["output_id"], to(out, x.dtype))


KERNELS = {"MPSMean": mean}
