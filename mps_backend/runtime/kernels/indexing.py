"""Gather/scatter members (semantics §5.9)."""

from __future__ import annotations

import torch

from ..core import KernelContext, checked, same_dtype, wrap_dim

_INT = (torch.int8, torch.int16, torch.int32, torch.int64)


def _index(ctx: KernelContext, idx: torch.Tensor, size: int, cast_int32: bool = False) -> torch.Tensor:
    """Index values as int64 for torch; out of range fails. IndexSelect/Embedding (``cast_int32``): the device
    casts the index to int32, so a value that does not fit int32 would read another row (2**32 + 5 row 5,
    2**32 - 1 the last): refused, never wrapped; a negative one too (torch's index_select and embedding refuse
    it, the device's gather of it is unverified; the lowering makes index.Tensor's negatives non-negative
    first). IndexTensor/IndexPut/Scatter: negatives count from the end (unverified on device)."""
    if cast_int32:
        if idx.numel() and idx.dtype == torch.int64 and (int(idx.min()) < -(2**31) or int(idx.max()) >= 2**31):
            bad = int(idx.max()) if int(idx.max()) >= 2**31 else int(idx.min())
            wrapped = int(torch.tensor(bad, dtype=torch.int64).to(torch.int32))
            ctx.fail(
                f"index {bad} does not fit int32: the device's cast to int32 would read index {wrapped} (refused, never wrapped)"
            )
        idx = idx.to(torch.int32)  # IndexSelect/Embedding cast any index dtype to int32
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= size):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            ctx.fail(f"index {bad} out of range [0, {size}) (the device's gather does not check it: refused, never wrapped)")
    elif idx.dtype not in _INT:
        ctx.fail(f"index tensor of dtype {idx.dtype} (bool masks unsupported)")
    idx = idx.long()
    if idx.numel() and (int(idx.min()) < -size or int(idx.max()) >= size):
        ctx.fail(f"index out of range for axis of size {size}")
    return torch.where(idx < 0, idx + size, idx)


def _gather(x: torch.Tensor, idx: torch.Tensor, axis: int) -> torch.Tensor:
    """x.shape[:axis] + idx.shape + x.shape[axis+1:]."""
    flat = x.index_select(axis, idx.reshape(-1))
    return flat.reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1 :])


def index_select(ctx: KernelContext, node) -> None:
    x, idx = ctx.get(node["input1_id"]), ctx.get(node["index_id"])
    axis = wrap_dim(ctx, node["dim"], x.dim())
    ctx.set(node["output_id"], _gather(x, _index(ctx, idx, x.shape[axis], cast_int32=True), axis))


def embedding(ctx: KernelContext, node) -> None:
    w, raw = ctx.get(node["input1_id"]), ctx.get(node["input2_id"])
    idx = _index(ctx, raw, w.shape[0], cast_int32=True)
    rows = _gather(w, idx, 0)
    pad = node["padding_idx"]
    if ctx.faithful and pad != -1:  # device bug: padding rows are zeroed in the forward pass
        hit = (raw.to(torch.int32).long() == pad).reshape(idx.shape + (1,) * (w.dim() - 1))
        rows = rows.masked_fill(hit, 0)
    ctx.set(node["output_id"], rows)


def _one_index(ctx: KernelContext, node, rank: int) -> tuple[int, int]:
    if ctx.graph is not None and ctx.graph.graph_type == 1:
        ctx.fail("metal_kernel graph: indexing aborts (Metal kernel path not yet implemented)")
    ids = list(node["indices_id"])
    present = [k for k, i in enumerate(ids) if i != -1]
    if not present:
        ctx.fail("no index tensor given (all indices_id are -1)")
    if len(present) > 1:
        ctx.fail(f"{len(present)} index tensors: Not yet implemented on device")
    k = present[0]
    if k >= rank:
        ctx.fail(f"index position {k} beyond rank {rank}")
    return k, ids[k]


def index_tensor(ctx: KernelContext, node) -> None:
    x = ctx.get(node["input1_id"])
    k, iid = _one_index(ctx, node, x.dim())
    ctx.set(node["output_id"], _gather(x, _index(ctx, ctx.get(iid), x.shape[k]), k))


def index_put(ctx: KernelContext, node) -> None:
    data, values = ctx.get(node["input1_id"]), ctx.get(node["values_id"])
    k, iid = _one_index(ctx, node, data.dim())
    idx = _index(ctx, ctx.get(iid), data.shape[k])
    same_dtype(ctx, data, values, what="IndexPut data and values")
    if len(node["values_shape"]):
        values = checked(ctx, "values broadcast", values.broadcast_to, tuple(node["values_shape"]))
    want = data.shape[:k] + idx.shape + data.shape[k + 1 :]
    if values.shape != want:
        ctx.fail(f"values shape {tuple(values.shape)} != {tuple(want)} required by the scatter")
    flat = values.reshape(data.shape[:k] + (idx.numel(),) + data.shape[k + 1 :])
    ctx.set(node["output_id"], data.index_copy(k, idx.reshape(-1), flat))


def scatter(ctx: KernelContext, node) -> None:
    data, src, idx = (ctx.get(node[f]) for f in ("input1_id", "src_id", "idx_id"))
    same_dtype(ctx, data, src, what="Scatter data and src")
    if idx.dtype not in (torch.int32, torch.int64):
        ctx.fail(f"scatter indices of dtype {idx.dtype} (Int32 or Int64 required)")
    axis = wrap_dim(ctx, node["dim"], data.dim())
    idx = _index(ctx, idx, data.shape[axis])
    ctx.set(node["output_id"], checked(ctx, "scatter shapes", torch.scatter, data, axis, idx, src))


KERNELS = {
    "MPSIndexSelect": index_select,
    "MPSEmbedding": embedding,
    "MPSIndexTensor": index_tensor,
    "MPSIndexPut": index_put,
    "MPSScatter": scatter,
}
