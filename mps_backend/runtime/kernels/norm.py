"""MPSBatchNorm, MPSLayerNorm (semantics §5.13)."""

from __future__ import annotations

import torch

from mps_backend.dtypes import FLOAT_DTYPES

from ..core import KernelContext, checked, compute, f32, round_to, same_dtype, to


def _operands(ctx: KernelContext, node, ids: tuple[str, ...]) -> tuple[torch.dtype, list[torch.Tensor]]:
    ts = [ctx.get(node[k]) for k in ids]  # weight/bias -1 (affine=False) => invalid table access
    dt = same_dtype(ctx, *ts, what="normalization operands")
    if dt not in FLOAT_DTYPES:
        ctx.fail(f"normalization of {dt} tensors")
    return dt, [compute(t) for t in ts]


def _set(ctx: KernelContext, vid: int, t: torch.Tensor) -> None:
    if vid == -1:
        ctx.fail("output id -1 (the runtime writes its value table at index -1)")
    ctx.set(vid, t)


def batch_norm(ctx: KernelContext, node) -> None:
    dt, (x, mean, var, w, b) = _operands(ctx, node, ("input_id", "mean_id", "var_id", "weight_id", "bias_id"))
    if x.dim() < 2:
        ctx.fail(f"batch norm of rank {x.dim()}")
    c = x.shape[1]
    if any(t.numel() != c for t in (mean, var, w, b)):
        ctx.fail(f"batch norm parameters do not have {c} elements")
    shape = (1, c) + (1,) * (x.dim() - 2)
    mean, var, w, b = (t.reshape(shape) for t in (mean, var, w, b))
    y = (x - mean) / torch.sqrt(var + f32(node["epsilon"])) * w + b
    _set(ctx, node["output1_id"], to(y, dt))
    _set(ctx, node["output2_id"], to(mean.reshape(-1), dt))  # device: output2 = mean; output3 never set


def layer_norm(ctx: KernelContext, node) -> None:
    dt, (x, w, b) = _operands(ctx, node, ("input1_id", "weight_id", "bias_id"))
    k = len(node["normalized_shape"])
    if not 1 <= k <= x.dim():
        ctx.fail(f"layer norm over {k} trailing axes of a rank-{x.dim()} tensor")
    axes = list(range(x.dim() - k, x.dim()))
    # separate MPSGraph ops in x's dtype (semantics §5.13): in float16 each intermediate is a float16
    # tensor, so a deviation beyond 255 squares to inf, as on the device
    mean = round_to(x.mean(axes, keepdim=True), dt)
    centered = round_to(x - mean, dt)
    var = round_to(round_to(centered.square(), dt).mean(axes, keepdim=True), dt)
    norm = round_to(centered / round_to(torch.sqrt(round_to(var + f32(node["eps"]), dt)), dt), dt)
    y = checked(ctx, "layer norm weight/bias broadcast", lambda: round_to(norm * w, dt) + b)
    _set(ctx, node["output1_id"], to(y, dt))
    _set(ctx, node["output2_id"], to(mean, dt))
    third = var if ctx.faithful else torch.rsqrt(var + f32(node["eps"]))  # device bug: variance, not rstd
    _set(ctx, node["output3_id"], to(third, dt))


KERNELS = {"MPSBatchNorm": batch_norm, "MPSLayerNorm": layer_norm}
