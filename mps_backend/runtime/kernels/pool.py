"""MPSMaxPool2DWithIndices, MPSAvgPool2D (semantics §5.14): NCHW with the file's explicit padding.

The padding (top, bottom, left, right) is applied to the input first; windows then run over the padded
plane with no implicit padding, in floor or ceil mode (PyTorch's ceil rule, applied to the padded size:
a last window must start inside the padded plane and is clipped to it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mps_backend.dtypes import FLOAT_DTYPES

from ..core import KernelContext, checked, compute, to


def _geometry(ctx: KernelContext, node, x: torch.Tensor):
    if x.dim() != 4:
        ctx.fail(f"2-D pooling of a rank-{x.dim()} tensor (NCHW required)")
    if x.dtype not in FLOAT_DTYPES:
        ctx.fail(f"pooling of {x.dtype} tensors")
    k = (node["kernel_height"], node["kernel_width"])
    s = (node["stride_height"], node["stride_width"])
    d = (node["dilation_height"], node["dilation_width"])
    pads = (node["padding_left"], node["padding_right"], node["padding_top"], node["padding_bottom"])
    if min(k + s + d) < 1 or min(pads) < 0:
        ctx.fail(f"pooling kernel {k}, stride {s}, dilation {d}, padding {pads}")
    return k, s, d, pads


def _torch_padding(k, d, pads, ceil: bool):
    """(pad_h, pad_w) when torch's implicit padding computes the same windows (fast path), else None."""
    left, right, top, bottom = pads
    if left != right or top != bottom or (ceil and any(pads)):  # torch's ceil rule differs with padding
        return None
    if 2 * top > d[0] * (k[0] - 1) + 1 or 2 * left > d[1] * (k[1] - 1) + 1:
        return None
    return top, left


def _reserve_padded(ctx: KernelContext, x: torch.Tensor, pads, what: str) -> None:
    left, right, top, bottom = pads
    shape = [*x.shape[:-2], x.shape[-2] + top + bottom, x.shape[-1] + left + right]
    ctx.reserve(math.prod(shape), 4, f"{what} input padded to {shape}")


def max_pool(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    k, s, d, pads = _geometry(ctx, node, x)
    _reserve_padded(ctx, x, pads, "max pool")
    ceil = bool(node["ceil_mode"])
    native = _torch_padding(k, d, pads, ceil)
    if native is not None:
        y, idx = checked(ctx, "max pool window", F.max_pool2d, compute(x), k, s, native, d, ceil, True)
    else:
        left, right, top, bottom = pads
        xp = F.pad(compute(x), pads, value=float("-inf"))
        y, ip = checked(ctx, "max pool window", F.max_pool2d, xp, k, s, 0, d, ceil, True)
        wp, w = xp.shape[-1], x.shape[-1]
        idx = (ip // wp - top) * w + (ip % wp - left)  # flattened over the unpadded H x W plane
    if node["output2_id"] == -1:
        ctx.fail("indices output id -1")
    ctx.set(node["output1_id"], to(y, x.dtype))
    ctx.set(node["output2_id"], idx.to(torch.int32) if ctx.faithful else idx)  # device: int32 indices


def _tail(ctx: KernelContext, n: int, k: int, s: int, d: int, ceil: bool) -> int:
    """Extra (never counted) positions past a padded axis of length n that ceil-mode windows reach."""
    span = d * (k - 1) + 1
    if n < span:
        ctx.fail(f"pooling window of span {span} larger than padded size {n}")
    out = ((n - span + s - 1) // s if ceil else (n - span) // s) + 1
    if ceil and (out - 1) * s >= n:
        out -= 1
    return max(0, (out - 1) * s + span - n)


def _window_sum(t: torch.Tensor, k, s, d) -> torch.Tensor:
    if d == (1, 1):
        return F.avg_pool2d(t, k, s, divisor_override=1)
    n, c, h, w = t.shape
    ones = torch.ones((1, 1) + k, dtype=t.dtype)
    y = F.conv2d(t.reshape(n * c, 1, h, w), ones, stride=s, dilation=d)
    return y.reshape(n, c, *y.shape[-2:])


def avg_pool(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    k, s, d, pads = _geometry(ctx, node, x)
    _reserve_padded(ctx, x, pads, "average pool")
    ceil, divisor = bool(node["ceil_mode"]), node["divisor_override"]
    include_pad = bool(node["count_include_pad"]) or divisor != 0
    native = _torch_padding(k, d, pads, ceil) if d == (1, 1) and divisor == 0 else None
    if native is not None:
        y = checked(ctx, "avg pool window", F.avg_pool2d, compute(x), k, s, native, ceil, include_pad)
        ctx.set(node["output1_id"], to(y, x.dtype))
        return
    h, w = x.shape[-2] + pads[2] + pads[3], x.shape[-1] + pads[0] + pads[1]
    tail = (0, _tail(ctx, w, k[1], s[1], d[1], ceil), 0, _tail(ctx, h, k[0], s[0], d[0], ceil))
    sums = _window_sum(F.pad(compute(x), tuple(a + b for a, b in zip(pads, tail))), k, s, d)
    ones = torch.ones((1, 1) + x.shape[-2:])
    mask = F.pad(F.pad(ones, pads, value=float(include_pad)), tail)  # counted positions
    y = sums / _window_sum(mask, k, s, d)
    if divisor != 0:
        if x.dtype != torch.float32:
            ctx.fail("avg pool divisor_override multiplies by an f32 constant: mixed dtypes in an f16 graph")
        y = y * torch.tensor(k[0] * k[1] / divisor, dtype=torch.float32)
    ctx.set(node["output1_id"], to(y, x.dtype))  # output2_id is ignored


KERNELS = {"MPSMaxPool2DWithIndices": max_pool, "MPSAvgPool2D": avg_pool}
