"""MPSMatMul, MPSAddmm (semantics §5.6): no dtype promotion; a matmul accumulates in f32 and is
rounded once. Addmm is several MPSGraph ops (matmul, alpha/beta multiplies, add): in f16 graphs
each of those intermediates is its own f16 tensor, so each is rounded."""

from __future__ import annotations

import torch

from ..core import KernelContext, checked, compute, f32, round_to, same_dtype, scalar_const, to

#: float32 bytes of an operand widened at once (float16 operands are computed in float32)
CHUNK_BYTES = 64 << 20


def _wide(ctx: KernelContext, vid: int, index=None) -> torch.Tensor:
    """``compute(get(vid)[index])``: taken from the interpreter's cache of float16 weights kept widened
    when it keeps ``vid`` (exactly the numbers widening here gives), else widened here."""
    if ctx.widened is not None and vid in ctx.widen_ids:
        wide = ctx.get_computed(vid)
        return wide if index is None else wide[index]
    t = ctx.get(vid)
    return compute(t if index is None else t[index])


def _matmul(ctx: KernelContext, aid: int, bid: int) -> torch.Tensor:
    a, b = ctx.get(aid), ctx.get(bid)
    if a.dim() < 2 or b.dim() < 2:
        ctx.fail(f"matrix multiplication of ranks {a.dim()} and {b.dim()} (MPSGraph needs rank >= 2)")
    if a.dtype == torch.bool:
        ctx.fail("matrix multiplication of bool tensors")
    if a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0] and torch.float16 in (a.dtype, b.dtype):
        # an LLM head's float16 weights widened whole would be gigabytes: a block of a's rows or
        # b's columns at a time (each result element is the same dot product)
        if a.numel() * 4 > CHUNK_BYTES:
            rows = max(1, CHUNK_BYTES // (4 * a.shape[1]))
            return torch.cat([_wide(ctx, aid, slice(r, r + rows)) @ _wide(ctx, bid) for r in range(0, a.shape[0], rows)])
        if b.numel() * 4 > CHUNK_BYTES:
            cols = max(1, CHUNK_BYTES // (4 * b.shape[0]))
            blocks = [_wide(ctx, aid) @ _wide(ctx, bid, (slice(None), slice(c, c + cols))) for c in range(0, b.shape[1], cols)]
            return torch.cat(blocks, dim=1)
    return checked(ctx, "matmul shapes", torch.matmul, _wide(ctx, aid), _wide(ctx, bid))


def matmul(ctx: KernelContext, node) -> None:
    a, b = ctx.get(node["input1_id"]), ctx.get(node["input2_id"])
    dt = same_dtype(ctx, a, b, what="MatMul operands")
    ctx.set(node["output_id"], to(_matmul(ctx, node["input1_id"], node["input2_id"]), dt))


def addmm(ctx: KernelContext, node) -> None:
    bias, m1, m2 = (ctx.get(node[k]) for k in ("input1_id", "input2_id", "input3_id"))
    dt = same_dtype(ctx, bias, m1, m2, what="Addmm operands")
    p = round_to(_matmul(ctx, node["input2_id"], node["input3_id"]), dt)
    alpha, beta = f32(node["alpha"]), f32(node["beta"])
    if alpha != 1.0:
        p = round_to(p * compute(scalar_const(alpha, dt)), dt)
    c = compute(bias)
    if beta != 1.0:
        c = round_to(c * compute(scalar_const(beta, dt)), dt)
    ctx.set(node["output_id"], to(checked(ctx, "addmm bias broadcast", torch.add, p, c), dt))


KERNELS = {"MPSMatMul": matmul, "MPSAddmm": addmm}
