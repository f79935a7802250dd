"""Shape members (semantics §5.11): results may be views of their inputs (kernels never write in place)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core import KernelContext, checked, same_dtype, wrap_dim


def permute(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    perm = list(node["perm"])[: node["num_dims"]]
    if len(perm) != x.dim() or sorted(perm) != list(range(x.dim())):
        ctx.fail(f"perm {perm} is not a permutation of rank {x.dim()} (nil output on device)")
    ctx.set(node["output_id"], x.permute(perm))


def view(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    shape = list(node["shape"]) or [1]  # getMPSShape: empty => [1]
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        ctx.fail(f"reshape to {shape}")
    ctx.set(node["output_id"], checked(ctx, "reshape", x.reshape, shape))


def expand(ctx: KernelContext, node) -> None:
    x, shape = ctx.get(node["input1_id"]), list(node["shape"])
    if not ctx.faithful:
        ctx.set(node["output_id"], checked(ctx, "expand", x.expand, shape))
        return
    if len(shape) < x.dim():
        ctx.fail(f"expand shape {shape} shorter than rank {x.dim()} (read past the vector)")
    # device bug: only the first rank(x) entries are used, so rank-increasing expands break
    t = [x.shape[i] if shape[i] == -1 else shape[i] for i in range(x.dim())]
    ctx.set(node["output_id"], checked(ctx, "broadcast_to", x.broadcast_to, t))


def cat(ctx: KernelContext, node) -> None:
    ids = list(node["input_ids"])
    ts = [ctx.get(i) for i in ids if i == -1 or ctx.values.get(i) is not None]  # nil inputs skipped
    if not ts:
        ctx.fail("concatenation of no (non-nil) tensors")
    same_dtype(ctx, *ts, what="Cat inputs")
    axis = wrap_dim(ctx, node["dim"], ts[0].dim())
    ctx.set(node["output_id"], checked(ctx, "cat shapes", torch.cat, ts, axis))


def squeeze(ctx: KernelContext, node) -> None:
    x, dims = ctx.get(node["input1_id"]), list(node["dims"])
    if not dims:
        if not ctx.faithful:
            ctx.set(node["output_id"], x.squeeze())
            return
        dims = [1]  # device bug: getMPSShape turns [] into [1] => squeeze axis 1
    axes = {wrap_dim(ctx, d, x.dim()) for d in dims}
    for a in axes:
        if x.shape[a] != 1:
            ctx.fail(f"squeeze of axis {a} with size {x.shape[a]}")
    ctx.set(node["output_id"], x.reshape([s for i, s in enumerate(x.shape) if i not in axes]))


def unsqueeze(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    dim = wrap_dim(ctx, node["dim"], x.dim() + 1)  # torch convention for negatives (device unverified)
    ctx.set(node["output_id"], x.unsqueeze(dim))


def _axis(ctx: KernelContext, dim: int, rank: int) -> int:
    if dim < 0:
        ctx.fail(f"negative dim {dim} (the runtime uses it as an unsigned axis / NSArray index)")
    if dim >= rank:
        ctx.fail(f"dim {dim} out of range for rank {rank}")
    return dim


def select(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    axis = _axis(ctx, node["dim"], x.dim())
    size, index = x.shape[axis], node["index"]
    if not -size <= index < size:
        ctx.fail(f"select index {index} out of range for size {size}")
    ctx.set(node["output_id"], x.select(axis, index))


def slice_(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    axis = _axis(ctx, node["dim"], x.dim())
    step = node["step"]
    if step < 1:
        ctx.fail(f"slice step {step} (must be >= 1)")
    size = x.shape[axis]
    start, end = (min(max(v + size if v < 0 else v, 0), size) for v in (node["start"], node["end"]))
    ctx.set(node["output_id"], x[(slice(None),) * axis + (slice(start, max(start, end), step),)])


def pixel_shuffle(ctx: KernelContext, node) -> None:
    x, r = ctx.get(node["input1_id"]), node["upscale_factor"]
    if x.dim() < 3:
        ctx.fail(f"pixel shuffle of rank {x.dim()} (needs >= 3)")
    if r < 1 or x.shape[-3] % (r * r):
        ctx.fail(f"pixel shuffle: {x.shape[-3]} channels not divisible by upscale_factor {r} squared")
    ctx.set(node["output_id"], x if r == 1 else F.pixel_shuffle(x, r))


def split_with_sizes(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    sizes = list(node["split_sizes"]) or [1]  # getMPSShape: empty => [1]
    axis = wrap_dim(ctx, node["dim"], x.dim())
    if any(s < 0 for s in sizes) or sum(sizes) != x.shape[axis]:
        ctx.fail(f"split sizes {sizes} do not sum to {x.shape[axis]}")
    outs = list(node["output_ids"])
    if len(outs) < len(sizes):
        ctx.fail(f"{len(sizes)} pieces but only {len(outs)} output ids")
    for vid, piece in zip(outs, torch.split(x, sizes, axis)):
        ctx.set(vid, piece)


KERNELS = {
    "MPSPermute": permute,
    "MPSView": view,
    "MPSExpand": expand,
    "MPSCat": cat,
    "MPSSqueeze": squeeze,
    "MPSUnsqueeze": unsqueeze,
    "MPSSelect": select,
    "MPSSlice": slice_,
    "MPSPixelShuffle": pixel_shuffle,
    "MPSSplitWithSizes": split_with_sizes,
}
