"""MPSConv2D, MPSDepthwiseConv2D (semantics §5.12): NCHW, torch-layout weights, explicit padding."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mps_backend.dtypes import FLOAT_DTYPES

from ..core import KernelContext, checked, compute, same_dtype, to


def _conv(ctx: KernelContext, node, x: torch.Tensor, w: torch.Tensor, groups: int) -> torch.Tensor:
    """conv2d of x [N,C,H,W] with w [O,I,kH,kW], explicit pads, plus the optional bias (f32 math)."""
    bias = None if node["input3_id"] == -1 else ctx.get(node["input3_id"])
    dt = same_dtype(ctx, x, w, *([] if bias is None else [bias]), what="convolution operands")
    if dt not in FLOAT_DTYPES:
        ctx.fail(f"convolution of {dt} tensors")
    stride, dilation = (node["stride_y"], node["stride_x"]), (node["dilation_y"], node["dilation_x"])
    pads = [node[k] for k in ("padding_left", "padding_right", "padding_top", "padding_bottom")]
    if min(stride + dilation) < 1 or min(pads) < 0:
        ctx.fail(f"convolution stride {stride}, dilation {dilation}, padding {pads}")
    if bias is not None and bias.numel() != w.shape[0]:
        ctx.fail(f"bias of {bias.numel()} elements for {w.shape[0]} output channels")
    padded = [*x.shape[:-2], x.shape[-2] + pads[2] + pads[3], x.shape[-1] + pads[0] + pads[1]]
    ctx.reserve(math.prod(padded), 4, f"convolution input padded to {padded}")
    xp = F.pad(compute(x), pads) if any(pads) else compute(x)
    b = None if bias is None else compute(bias).reshape(-1)
    y = checked(ctx, "convolution shapes", F.conv2d, xp, compute(w), b, stride, 0, dilation, groups)
    return to(y, dt)


def conv2d(ctx: KernelContext, node) -> None:
    x, w = ctx.get(node["input1_id"]), ctx.get(node["input2_id"])
    conv1d = w.dim() == 3
    if x.dim() != w.dim() or w.dim() not in (3, 4):
        ctx.fail(f"convolution of a rank-{x.dim()} input with a rank-{w.dim()} weight")
    if conv1d:  # [N,C,L] -> [N,C,1,L], [O,I,K] -> [O,I,1,K]
        x, w = x.unsqueeze(2), w.unsqueeze(2)
    y = _conv(ctx, node, x, w, node["groups"])
    if conv1d:
        if y.shape[2] != 1:
            ctx.fail(f"conv1d: squeeze of axis 2 with size {y.shape[2]}")
        y = y.squeeze(2)
    ctx.set(node["output_id"], y)


def depthwise_conv2d(ctx: KernelContext, node) -> None:
    x, w = ctx.get(node["input1_id"]), ctx.get(node["input2_id"])
    if w.dim() == 3:
        ctx.fail("depthwise convolution with a rank-3 weight (ET_CHECK abort)")
    if x.dim() != 4 or w.dim() != 4 or w.shape[1] != 1 or w.shape[0] % x.shape[1]:
        ctx.fail(f"depthwise convolution of {tuple(x.shape)} with weight {tuple(w.shape)}")
    ctx.set(node["output_id"], _conv(ctx, node, x, w, x.shape[1]))  # the groups field is ignored


KERNELS = {"MPSConv2D": conv2d, "MPSDepthwiseConv2D": depthwise_conv2d}
