"""Indexing: index_select, embedding, index.Tensor, index_put, slice_scatter, select_scatter, gather.

- ``index_select`` -> MPSIndexSelect (dim normalised; the device casts the index to int32).
- ``embedding`` -> MPSEmbedding with ``padding_idx`` always written as -1: the device zeroes the rows
  whose index equals ``padding_idx`` (semantics §6 #3) while torch's forward returns the stored row;
  the schema default 0 would zero row 0.
- ``index.Tensor`` with one non-None index -> MPSIndexTensor (the runtime aborts on more, and the
  metal-kernel graph type aborts always: never emitted). Several indices that select an outer
  product on adjacent axes (``x[:, :, rows[:, None], cols]``, what torch's interpolation
  decompositions gather) -> one MPSIndexSelect per axis, each distinct gather emitted once; other
  multi-index patterns stay on CPU. Negative index values are
  made non-negative first (``i + (i < 0) * size``, computed once per index value and axis size):
  the device gather's handling of them is unverified.
- ``index_put`` -> MPSIndexPut with one index, ``accumulate=False`` only (the device always
  overwrites); ``values_shape`` is the full indexed shape ``x.shape[:k] + idx.shape +
  x.shape[k+1:]`` (what the device scatter requires, values broadcast to it right-aligned as in
  torch).
- ``slice_scatter``: step 1 is a concatenation of the untouched slices around ``src`` (no index
  constant); step > 1 is MPSScatter with an int64 index constant ``arange(start, end, step)`` on
  ``dim`` broadcast to ``src``'s shape. start/end are normalised and clamped like ``slice``.
- ``select_scatter`` (kept whole): ``src`` viewed with the axis restored, then as slice_scatter.
- ``gather``: linear offsets ``index * stride[dim] + base`` (``base`` a constant of the other axes'
  offsets, computed from shapes) select from the flattened input with one MPSIndexSelect.
"""
from __future__ import annotations

import math

import torch
from torch.fx import Node

from ._util import arg, clamp_index, norm_dim, rank, shape, val
from .registry import Lowering, op_key
from .shape import binary, cat_values, slice_value, vdtype, view

aten = torch.ops.aten

_INDEX_DTYPES = (torch.int32, torch.int64)
#: the device casts gather indices to int32 (semantics §3.1)
INT32_LIMIT = 2 ** 31


def _index_reason(idx: Node, what: str = "index"):
    dt = val(idx).dtype
    if dt == torch.bool:
        return f"boolean mask {what} (data-dependent shape; the device gathers integer indices only)"
    if dt not in _INDEX_DTYPES:
        return f"{what} of dtype {dt} (int32/int64 required)"
    return None


def _device_shape(s) -> list[int]:
    return list(s) or [1]


_RESHAPES = (aten.view_copy.default, aten.unsqueeze_copy.default, aten.squeeze_copy.dims, aten.view.default,
             aten.unsqueeze.default)


def _clamped_nonneg(idx: Node) -> bool:
    """``idx`` is the result of a clamp with a lower bound >= 0 (e.g. the source rows and
    columns torch's interpolation decompositions compute), possibly reshaped."""
    while idx.op == "call_function" and op_key(idx.target) in _RESHAPES:
        idx = idx.args[0]
    if idx.op != "call_function" or op_key(idx.target) not in (aten.clamp.default, aten.clamp_min.default):
        return False
    lo = arg(idx, 1, "min", None)
    return isinstance(lo, (int, float)) and lo >= 0


def _nonneg_index(b, idx: Node, size: int) -> int:
    """``idx + (idx < 0) * size``: torch's negative indices made explicit. Skipped for constant
    indices that are already non-negative (lowerings may read constant data) and for clamp
    results with a lower bound >= 0."""
    vid = b.id(idx)
    data = b.constants.get(vid)
    if (data is not None and bool((data >= 0).all())) or _clamped_nonneg(idx):
        return vid
    dt = vdtype(b, vid)

    def make() -> int:
        neg = b.memo(("negative index", vid), lambda: binary(b, "MPSLt", vid, b.scalar(0, dt)))
        shift = binary(b, "MPSMul", neg, b.scalar(int(size), dt))
        return binary(b, "MPSAdd", vid, shift)
    # once per index value and axis size: e.g. a KV cache's input_pos indexes every layer's caches
    return b.memo(("non-negative index", vid, int(size)), make)


# ---- index_select / embedding ---------------------------------------------------------------------

def _index_select_check(node: Node):
    return _index_reason(node.args[2])


def _index_select(node: Node, b) -> None:
    x, dim, idx = node.args[:3]
    b.emit("MPSIndexSelect", input1_id=b.id(x), output_id=b.out(node), dim=norm_dim(dim, rank(x)),
           index_id=b.id(idx))


def _embedding_check(node: Node):
    w, idx = node.args[:2]
    if rank(w) != 2:
        return f"embedding weight of rank {rank(w)} (2 required)"
    if val(w).numel() >= INT32_LIMIT:
        return "embedding table with >= 2^31 elements (the device casts indices to int32)"
    return _index_reason(idx, "embedding indices")


def _embedding(node: Node, b) -> None:
    w, idx = node.args[:2]
    out_shape = shape(node)
    device = _device_shape(shape(idx)) + [shape(w)[1]]  # a 0-d index is [1] on the device
    out = b.out(node) if device == out_shape else b.new_value(b.dtype(w), device)
    # padding_idx: torch's forward ignores it, the device would zero those rows -> always -1
    b.emit("MPSEmbedding", input1_id=b.id(w), input2_id=b.id(idx), output_id=out, padding_idx=-1,
           scale_grad_by_freq=False, sparse=False)
    if device != out_shape:
        view(b, out, out_shape, out=b.out(node))


# ---- index.Tensor / index_put ---------------------------------------------------------------------

def _single_index(node: Node):
    """(position, index node) of the only non-None index, or a reason string."""
    indices = list(node.args[1])
    present = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(present) != 1:
        return (f"{len(present)} index tensors: the device gathers/scatters along one axis only "
                "(more abort at runtime; the metal-kernel path does not exist)")
    k, idx = present[0]
    reason = _index_reason(idx)
    if reason:
        return reason
    if k >= rank(node.args[0]):
        return f"index at position {k} of a rank-{rank(node.args[0])} tensor"
    return present[0]


def _outer_indices(node: Node):
    """For two or more index tensors: [(axis, index node)] when they select an outer product of
    per-axis indices on adjacent axes (index ``j`` of ``m`` has, right-aligned to rank ``m``, its
    only non-1 size at position ``j``, like ``x[:, rows[:, None], cols]``), else a reason string."""
    x = node.args[0]
    present = [(k, i) for k, i in enumerate(node.args[1]) if i is not None]
    m = len(present)
    for k, idx in present:
        reason = _index_reason(idx)
        if reason:
            return reason
        if k >= rank(x):
            return f"index at position {k} of a rank-{rank(x)} tensor"
    axes = [k for k, _ in present]
    if axes != list(range(axes[0], axes[0] + m)):
        return (f"index tensors on axes {axes}, not adjacent (torch moves the indexed axes first); the "
                "device gathers along one axis at a time")
    for j, (_, idx) in enumerate(present):
        s = shape(idx)
        padded = [1] * (m - len(s)) + s
        if len(s) > m or any(d != 1 for t, d in enumerate(padded) if t != j):
            return (f"{m} index tensors that do not select an outer product (index {j} has shape {s}): the "
                    "device gathers along one axis at a time (MPSIndexTensor aborts on more than one)")
    return present


def _index_check(node: Node):
    n = sum(i is not None for i in node.args[1])
    found = _single_index(node) if n <= 1 else _outer_indices(node)
    return found if isinstance(found, str) else None


def _index_outer(node: Node, b) -> None:
    """One MPSIndexSelect per indexed axis with the flattened index; a gather shared by several
    nodes (the same rows of the same tensor) is emitted once."""
    x = node.args[0]
    vid, cur = b.id(x), shape(x)
    for k, idx in _outer_indices(node):
        n = math.prod(shape(idx))
        iv = _nonneg_index(b, idx, shape(x)[k])
        if shape(idx) != [n]:
            iv = b.memo(("flat index", iv), lambda iv=iv, n=n: view(b, iv, [n]))
        cur = cur[:k] + [n] + cur[k + 1:]

        def gather(src=vid, k=k, iv=iv, out_shape=cur) -> int:
            return b.emit_value("MPSIndexSelect", b.dtype(x), out_shape, input1_id=src, index_id=iv, dim=k)
        vid = b.memo(("index_select", vid, k, iv), gather)
    b.alias(node, vid)


def _indexed_shape(x: Node, k: int, idx: Node) -> list[int]:
    """Shape the device gathers/scatters: a 0-d index is [1] on the device."""
    s = shape(x)
    return s[:k] + _device_shape(shape(idx)) + s[k + 1:]


def _index_tensor(node: Node, b) -> None:
    if sum(i is not None for i in node.args[1]) > 1:
        _index_outer(node, b)
        return
    x = node.args[0]
    k, idx = _single_index(node)
    ids = [-1] * len(node.args[1])
    ids[k] = _nonneg_index(b, idx, shape(x)[k])
    device = _indexed_shape(x, k, idx)
    out = b.out(node) if device == shape(node) else b.new_value(b.dtype(x), device)
    b.emit("MPSIndexTensor", input1_id=b.id(x), indices_id=ids, output_id=out)
    if device != shape(node):
        view(b, out, shape(node), out=b.out(node))


def _index_put_check(node: Node):
    if bool(arg(node, 3, "accumulate", False)):
        return "index_put with accumulate=True: the device scatter always overwrites"
    found = _single_index(node)
    if isinstance(found, str):
        return found
    x, values = node.args[0], node.args[2]
    if val(values).dtype != val(x).dtype:
        return f"index_put of {val(values).dtype} values into {val(x).dtype} (the device does not promote)"
    k, idx = found
    try:
        torch.broadcast_shapes(tuple(shape(values)), tuple(_indexed_shape(x, k, idx)))
    except RuntimeError:
        return f"index_put values of shape {shape(values)} do not broadcast to {_indexed_shape(x, k, idx)}"
    return None


def _index_put(node: Node, b) -> None:
    x, _, values = node.args[:3]
    k, idx = _single_index(node)
    ids = [-1] * len(node.args[1])
    ids[k] = _nonneg_index(b, idx, shape(x)[k])
    b.emit("MPSIndexPut", input1_id=b.id(x), indices_id=ids, values_shape=_indexed_shape(x, k, idx),
           values_id=b.id(values), output_id=b.out(node))


# ---- slice_scatter / select_scatter ---------------------------------------------------------------

def _scatter_check(node: Node):
    x, src = node.args[:2]
    if val(src).dtype != val(x).dtype:
        return f"scatter of {val(src).dtype} into {val(x).dtype} (the device does not promote)"
    step = int(arg(node, 5, "step", 1)) if _is_slice_scatter(node) else 1
    if step < 1:
        return f"slice_scatter step {step}"
    return None


def _is_slice_scatter(node: Node) -> bool:
    return op_key(node.target) is aten.slice_scatter.default


def _scatter_range(b, node: Node, x: Node, src_vid: int, dim: int, start: int, end: int, step: int) -> None:
    """``x`` with ``x[dim][start:end:step]`` replaced by value ``src_vid`` (shape of that slice)."""
    size = shape(x)[dim]
    count = len(range(start, end, step))
    if step == 1 or count == 1:
        end = start + count
        pieces = []
        if start > 0:
            pieces.append(slice_value(b, b.id(x), dim, 0, start))
        pieces.append(src_vid)
        if end < size:
            pieces.append(slice_value(b, b.id(x), dim, end, size))
        if len(pieces) == 1:  # src covers the whole axis
            b.alias(node, src_vid)
        else:
            cat_values(b, pieces, dim, out=b.out(node))
        return
    src_shape = _device_shape(b.graph.values[src_vid].dims)
    line = torch.arange(start, end, step, dtype=torch.int64)
    idx = line.reshape([-1 if d == dim else 1 for d in range(len(src_shape))]).expand(src_shape).contiguous()
    b.emit("MPSScatter", input1_id=b.id(x), output_id=b.out(node), dim=dim,
           idx_id=b.constant(idx, dtype=torch.int64), src_id=src_vid)


def _slice_scatter(node: Node, b) -> None:
    x, src = node.args[:2]
    dim = norm_dim(arg(node, 2, "dim", 0), rank(x))
    size = shape(x)[dim]
    start = clamp_index(arg(node, 3, "start", None), size, 0)
    end = max(clamp_index(arg(node, 4, "end", None), size, size), start)
    _scatter_range(b, node, x, b.id(src), dim, start, end, int(arg(node, 5, "step", 1)))


def _select_scatter(node: Node, b) -> None:
    x, src = node.args[:2]
    dim = norm_dim(node.args[2], rank(x))
    size = shape(x)[dim]
    index = int(node.args[3])
    index = index + size if index < 0 else index
    restored = shape(x)
    restored[dim] = 1
    _scatter_range(b, node, x, view(b, b.id(src), restored), dim, index, index + 1, 1)


def _select_scatter_check(node: Node):
    reason = _scatter_check(node)
    if reason:
        return reason
    if rank(node.args[0]) == 0:
        return "select_scatter into a rank-0 tensor"
    return None


# ---- gather ---------------------------------------------------------------------------------------

def _gather_check(node: Node):
    x, dim, idx = node.args[:3]
    reason = _index_reason(idx)
    if reason:
        return reason
    if rank(x) == 0 or rank(idx) != rank(x):
        return f"gather of rank {rank(x)} with an index of rank {rank(idx)}"
    if val(x).numel() >= INT32_LIMIT:
        return "gather from >= 2^31 elements (the device casts indices to int32)"
    return None


def _gather(node: Node, b) -> None:
    """out[p] = x.flat[idx[p] * stride[dim] + sum_{d != dim} p_d * stride[d]]."""
    x, dim, idx = node.args[:3]
    xs, ishape = shape(x), shape(idx)
    dim = norm_dim(dim, rank(x))
    strides = [math.prod(xs[d + 1:]) for d in range(len(xs))]
    dt = b.dtype(idx)
    base = torch.zeros(ishape, dtype=torch.int64)
    for d, n in enumerate(ishape):
        if d != dim and n > 1:
            base = base + (torch.arange(n, dtype=torch.int64) * strides[d]).reshape(
                [-1 if e == d else 1 for e in range(len(ishape))])
    lin = b.id(idx)
    if strides[dim] != 1:
        lin = binary(b, "MPSMul", lin, b.scalar(int(strides[dim]), dt))
    if bool(base.any()):
        lin = binary(b, "MPSAdd", lin, b.constant(base.to(dt), dtype=dt))
    numel = math.prod(ishape)
    flat_idx = view(b, lin, [numel])
    flat_x = view(b, b.id(x), [math.prod(xs)])
    picked = b.new_value(b.dtype(x), [numel])
    b.emit("MPSIndexSelect", input1_id=flat_x, output_id=picked, dim=0, index_id=flat_idx)
    view(b, picked, shape(node), out=b.out(node))


LOWERINGS = [
    Lowering((aten.index_select.default,), _index_select, _index_select_check),
    Lowering((aten.embedding.default,), _embedding, _embedding_check),
    Lowering((aten.index.Tensor,), _index_tensor, _index_check),
    Lowering((aten.index_put.default,), _index_put, _index_put_check),
    Lowering((aten.slice_scatter.default,), _slice_scatter, _scatter_check),
    Lowering((aten.select_scatter.default,), _select_scatter, _select_scatter_check, preserve=True),
    Lowering((aten.gather.default,), _gather, _gather_check),
]
