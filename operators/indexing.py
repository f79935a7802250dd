"""Indexing: index_select, embedding, index.Tensor, index_put, slice_scatter, select_scatter, gather,
scatter.

- ``index_select`` -> MPSIndexSelect (dim normalised; the device casts the index to int32).
- ``embedding`` -> MPSEmbedding with ``padding_idx`` always written as -1: the device zeroes the rows
  whose index equals ``padding_idx`` (semantics §6 #3) while torch's forward returns the stored row;
  the schema default 0 would zero row 0.
- ``index.Tensor`` with one non-None index -> MPSIndexTensor (the runtime aborts on more, and the
  metal-kernel graph type aborts always: never emitted). Several indices that select an outer
  product on adjacent axes (``x[:, :, rows[:, None], cols]``, what torch's interpolation
  decompositions gather) -> one MPSIndexSelect per axis, each distinct gather emitted once. Any
  other several indices (``x[rows, cols]``, indices on non-adjacent axes) are *linearized*: the
  indexed axes (moved to the front by one MPSPermute when they are not adjacent, as torch moves
  the result's broadcast index axes to the front) are viewed as one axis of size ``P = prod(sizes)``
  and ``lin = sum_j idx_j * stride_j`` (index tensors broadcast together, as in torch) selects from
  it with one MPSIndexSelect: exact integer arithmetic, one gather. ``P < 2^31`` (the device casts
  gather indices to int32). Negative index values are made non-negative first (``i + (i < 0) * size``,
  computed once per index value and axis size): the device gather's handling of them is unverified.
- ``index_put`` -> MPSIndexPut along one axis: one index as is; several index tensors linearized
  as for ``index.Tensor`` (the data viewed with the indexed axes as one, the values broadcast to the
  indexed shape and viewed the same way, the result viewed / permuted back). ``values_shape`` is the
  full indexed shape ``x.shape[:k] + idx.shape + x.shape[k+1:]`` (what the device scatter requires,
  values broadcast to it right-aligned as in torch). Duplicate positions: torch and the device
  leave the winner unspecified.
  ``accumulate=True`` (the device scatter always overwrites, §6 #10): for at most
  ``ACCUMULATE_MAX`` index entries, one gather - add - scatter per entry, in index order. That is
  torch's serial CPU kernel (``x[i] += v`` entry by entry), so duplicates sum in the same order and
  the result is bit-exact (integers wrap the same way); five MPS nodes per entry.
- ``slice_scatter``: step 1 is a concatenation of the untouched slices around ``src`` (no index
  constant); step > 1 is MPSScatter with an int64 index constant ``arange(start, end, step)`` on
  ``dim`` broadcast to ``src``'s shape. start/end are normalised and clamped like ``slice``.
- ``select_scatter`` (kept whole): ``src`` viewed with the axis restored, then as slice_scatter.
- ``scatter.src`` / ``scatter.value`` (no reduce) -> MPSScatter, the device's scatter along an axis in
  set mode (semantics §5.9: ``data.scatter(dim, idx, src)``). ``src`` is sliced to the index's shape
  (torch reads only that corner); a scalar value is expanded to it. MPSGraph's scatter-along-axis takes
  data and indices of one shape except on the axis (PyTorch's own MPS scatter slices the data when
  they differ), so an index smaller than the data on other axes scatters into that corner of the data,
  which is concatenated back with the rest, one MPSCat per such axis. Duplicate positions: torch and
  the device leave the winner unspecified.
- ``gather``: linear offsets ``index * stride[dim] + base`` (``base`` a constant of the other axes'
  offsets, computed from shapes) select from the flattened input with one MPSIndexSelect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.serialization.generated import nodes as N

from ._util import arg, clamp_index, norm_dim, rank, shape, val
from .emit import binary, cat_values, expand, permute, scalar_value, slice_value, vdtype, view, vshape, where
from .reduce import pool_reduce
from .registry import Lowering, op_key

aten = torch.ops.aten

_INDEX_DTYPES = (torch.int32, torch.int64)
#: the device casts gather indices to int32 (semantics §3.1)
INT32_LIMIT = 2**31
#: most index entries index_put(accumulate=True) lowers (five MPS nodes each)
ACCUMULATE_MAX = 32


def _indices_reason(x: Node, present: list) -> str | None:
    """Why the (position, index tensor) pairs of an index/index_put node cannot be lowered, or None."""
    for k, idx in present:
        reason = _index_reason(idx)
        if reason:
            return reason
        if k >= rank(x):
            return f"index at position {k} of a rank-{rank(x)} tensor"
    return None


def _index_reason(idx: Node, what: str = "index"):
    dt = val(idx).dtype
    if dt == torch.bool:
        return f"boolean mask {what} (data-dependent shape; the device gathers integer indices only)"
    if dt not in _INDEX_DTYPES:
        return f"{what} of dtype {dt} (int32/int64 required)"
    return None


def _device_shape(s) -> list[int]:
    return list(s) or [1]


_RESHAPES = (
    aten.view_copy.default,
    aten.unsqueeze_copy.default,
    aten.squeeze_copy.dims,
    aten.view.default,
    aten.unsqueeze.default,
)


def _clamped_nonneg(idx: Node) -> bool:
    """``idx`` is the result of a clamp with a lower bound >= 0 (e.g. the source rows and
    columns torch's interpolation decompositions compute), possibly reshaped."""
    while idx.op == "call_function" and op_key(idx.target) in _RESHAPES:
        idx = idx.args[0]
    if idx.op != "call_function" or op_key(idx.target) not in (aten.clamp.default, aten.clamp_min.default):
        return False
    lo = arg(idx, 1, "min", None)
    return isinstance(lo, (int, float)) and lo >= 0


def _nonneg_index(b: GraphBuilder, idx: Node, size: int) -> int:
    """``idx + (idx < 0) * size``: torch's negative indices made explicit. Skipped for constant
    indices that are already non-negative (lowerings may read constant data) and for clamp
    results with a lower bound >= 0."""
    vid = b.id(idx)
    data = b.constants.get(vid)
    if (data is not None and bool((data >= 0).all())) or _clamped_nonneg(idx):
        return vid
    dt = vdtype(b, vid)

    def make() -> int:
        neg = b.memo(("negative index", vid), lambda: binary(b, N.MPSLt, vid, b.scalar(0, dt)))
        shift = binary(b, N.MPSMul, neg, b.scalar(int(size), dt))
        return binary(b, N.MPSAdd, vid, shift)

    # once per index value and axis size: e.g. a KV cache's input_pos indexes every layer's caches
    return b.memo(("non-negative index", vid, int(size)), make)


# ---- index_select / embedding ---------------------------------------------------------------------


def _index_select_check(node: Node):
    return _index_reason(node.args[2])


def _index_select(node: Node, b: GraphBuilder) -> None:
    x, dim, idx = node.args[:3]
    b.emit(N.MPSIndexSelect(input1_id=b.id(x), output_id=b.out(node), dim=norm_dim(dim, rank(x)), index_id=b.id(idx)))


def _embedding_check(node: Node):
    w, idx = node.args[:2]
    if rank(w) != 2:
        return f"embedding weight of rank {rank(w)} (2 required)"
    if val(w).numel() >= INT32_LIMIT:
        return "embedding table with >= 2^31 elements (the device casts indices to int32)"
    return _index_reason(idx, "embedding indices")


def _embedding(node: Node, b: GraphBuilder) -> None:
    w, idx = node.args[:2]
    out_shape = shape(node)
    device = _device_shape(shape(idx)) + [shape(w)[1]]  # a 0-d index is [1] on the device
    out = b.out(node) if device == out_shape else b.new_value(b.dtype(w), device)
    # padding_idx: torch's forward ignores it, the device would zero those rows -> always -1
    b.emit(
        N.MPSEmbedding(
            input1_id=b.id(w), input2_id=b.id(idx), output_id=out, padding_idx=-1, scale_grad_by_freq=False, sparse=False
        )
    )
    if device != out_shape:
        view(b, out, out_shape, out=b.out(node))


# ---- embedding_bag --------------------------------------------------------------------------------
# Bags from runtime offsets, without a segment reduction (the device has none): the rows of all
# indices are gathered ([N, D]), a [bags, N] membership mask is computed from the offsets
# (offsets[b] <= n < end[b]; index == padding_idx excluded) and one matmul sums each bag. Mean divides
# by the bag's size (an empty bag gives 0, as torch); max takes the maximum of the bag's rows with the
# others at -inf (one max pool over the indices; an empty bag gives 0). The three auxiliary outputs
# (offset2bag, bag_size, max_indices) are not computed: a program that reads them keeps the node on CPU.

_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


def _embedding_bag_args(node: Node) -> dict:
    return {
        "mode": int(arg(node, 4, "mode", 0)),
        "weights": arg(node, 6, "per_sample_weights", None),
        "include_last": bool(arg(node, 7, "include_last_offset", False)),
        "padding_idx": arg(node, 8, "padding_idx", -1),
    }


def _embedding_bag_check(node: Node):
    w, idx, offsets = node.args[:3]
    a = _embedding_bag_args(node)
    if a["mode"] not in _BAG_MODES:
        return f"embedding_bag mode {a['mode']!r}"
    if rank(w) != 2 or rank(idx) != 1 or rank(offsets) != 1:
        return f"embedding_bag of weight rank {rank(w)}, indices rank {rank(idx)}, offsets rank {rank(offsets)}"
    if any(u.args[1] != 0 and u.users for u in node.users):
        return "embedding_bag whose offset2bag / bag_size / max_indices outputs are read (only the bags are lowered)"
    if val(w).numel() >= INT32_LIMIT or shape(idx)[0] >= 2**24:
        return "embedding_bag with >= 2^31 table elements or >= 2^24 indices"
    if shape(offsets)[0] - a["include_last"] < 1:
        return "embedding_bag with no bags"
    return _index_reason(idx, "embedding_bag indices") or _index_reason(offsets, "embedding_bag offsets")


def _embedding_bag(node: Node, b: GraphBuilder) -> None:
    w, idx, offsets = node.args[:3]
    a = _embedding_bag_args(node)
    n, n_off, dim = shape(idx)[0], shape(offsets)[0], shape(w)[1]
    bags = n_off - 1 if a["include_last"] else n_off
    dt, odt = b.dtype(w), vdtype(b, b.id(offsets))
    rows = b.new_value(dt, [n, dim])
    b.emit(
        N.MPSEmbedding(
            input1_id=b.id(w), input2_id=b.id(idx), output_id=rows, padding_idx=-1, scale_grad_by_freq=False, sparse=False
        )
    )
    if a["weights"] is not None:  # sum mode only (torch's rule): each row scaled by its weight
        rows = binary(b, N.MPSMul, rows, view(b, b.id(a["weights"]), [n, 1]))
    off = b.id(offsets)
    starts = view(b, off if bags == n_off else slice_value(b, off, 0, 0, bags), [bags, 1])
    pos = b.constant(torch.arange(n, dtype=odt).reshape(1, n), dtype=odt)
    total = b.constant(torch.tensor([n], dtype=odt), dtype=odt)

    def members(last_end_is_n: bool) -> int:
        """[bags, n] 0/1: index n in bag b (offsets[b] <= n < end of b), padding_idx excluded."""
        # bag b ends at offsets[b + 1]; the last one at n, or (include_last_offset) at offsets[bags]
        ends = [slice_value(b, off, 0, 1, bags)] if bags > 1 else []
        ends.append(total if last_end_is_n else slice_value(b, off, 0, bags, bags + 1))
        end = view(b, ends[0] if len(ends) == 1 else cat_values(b, ends, 0), [bags, 1])
        inside = binary(b, N.MPSBitwiseAnd, binary(b, N.MPSGe, pos, starts), binary(b, N.MPSLt, pos, end))
        padding = a["padding_idx"]
        if padding is not None and padding >= 0:  # rows of padding_idx count in no bag
            keep = binary(b, N.MPSNe, view(b, b.id(idx), [1, n]), b.scalar(int(padding), vdtype(b, b.id(idx))))
            inside = binary(b, N.MPSBitwiseAnd, inside, keep)
        return inside

    # the last bag ends at the last index, or with include_last_offset at the last offset
    inside = members(not a["include_last"])
    if a["mode"] == 2:  # max: the rows outside a bag become -inf, one max over the indices; empty bags 0
        masked = where(b, view(b, inside, [bags, n, 1]), view(b, rows, [1, n, dim]), b.scalar(float("-inf"), dt))
        values, _ = pool_reduce(b, masked, [bags, n, dim], [1])
        size = b.new_value(dt, [bags, 1])
        b.emit(N.MPSMatMul(input1_id=b.cast(inside, dt), input2_id=b.constant(torch.ones(n, 1), dtype=dt), output_id=size))
        filled = binary(b, N.MPSGt, size, b.scalar(0.0, dt))
        b.ids[node] = (where(b, filled, view(b, values, [bags, dim]), b.scalar(0.0, dt)), None, None, None)
        return
    mask = b.cast(inside, dt)
    out = b.new_value(dt, [bags, dim])
    if a["mode"] == 1:  # mean: each bag's row of the mask divided by its size (at least 1)
        # torch divides the last bag by n - its start even with include_last_offset (when the last
        # offset is not n, its sum and its divisor disagree); the device does the same
        counted = b.cast(members(True), dt) if a["include_last"] else mask
        size = b.new_value(dt, [bags, 1])
        b.emit(N.MPSMatMul(input1_id=counted, input2_id=b.constant(torch.ones(n, 1), dtype=dt), output_id=size))
        size = binary(b, N.MPSAdd, size, b.cast(binary(b, N.MPSEq, size, b.scalar(0.0, dt)), dt))
        divided = b.new_value(dt, [bags, n])
        b.emit(N.MPSDiv(input1_id=mask, input2_id=size, output_id=divided, rounding_mode=None))
        mask = divided
    b.emit(N.MPSMatMul(input1_id=mask, input2_id=rows, output_id=out))
    b.ids[node] = (out, None, None, None)


# ---- index.Tensor / index_put ---------------------------------------------------------------------


def _single_index(node: Node):
    """(position, index node) of the only non-None index, or a reason string."""
    indices = list(node.args[1])
    present = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(present) != 1:
        return (
            f"{len(present)} index tensors: the device gathers/scatters along one axis only "
            "(more abort at runtime; the metal-kernel path does not exist)"
        )
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
    reason = _indices_reason(x, present)
    if reason:
        return reason
    axes = [k for k, _ in present]
    if axes != list(range(axes[0], axes[0] + m)):
        return (
            f"index tensors on axes {axes}, not adjacent (torch moves the indexed axes first); the "
            "device gathers along one axis at a time"
        )
    for j, (_, idx) in enumerate(present):
        s = shape(idx)
        padded = [1] * (m - len(s)) + s
        if len(s) > m or any(d != 1 for t, d in enumerate(padded) if t != j):
            return (
                f"{m} index tensors that do not select an outer product (index {j} has shape {s}): the "
                "device gathers along one axis at a time (MPSIndexTensor aborts on more than one)"
            )
    return present


@dataclass(frozen=True)
class _Linear:
    """Several index tensors of ``x`` as one index into one axis (module docstring)."""

    perm: list[int] | None  # MPSPermute moving the indexed axes to the front (not adjacent), else None
    k: int  # the indexed axes are ``k .. k + m - 1`` of the (permuted) data
    data_shape: list[int]  # shape of the (permuted) data
    indices: list[tuple[int, Node]]  # (axis of x, index node)
    index_shape: list[int]  # the index tensors' broadcast shape

    @property
    def sizes(self) -> list[int]:
        return self.data_shape[self.k : self.k + len(self.indices)]

    @property
    def count(self) -> int:
        """Index entries: positions of the broadcast index shape."""
        return math.prod(self.index_shape)

    def flat_shape(self) -> list[int]:
        """The (permuted) data with the indexed axes as one."""
        m = len(self.indices)
        return self.data_shape[: self.k] + [math.prod(self.sizes)] + self.data_shape[self.k + m :]

    def indexed_shape(self) -> list[int]:
        """Shape of ``x[indices]`` (torch): the broadcast index shape in place of the indexed axes."""
        m = len(self.indices)
        return self.data_shape[: self.k] + self.index_shape + self.data_shape[self.k + m :]

    def flat_indexed_shape(self) -> list[int]:
        m = len(self.indices)
        return self.data_shape[: self.k] + [self.count] + self.data_shape[self.k + m :]


def _linear_plan(node: Node):
    """The ``_Linear`` plan of ``node``'s (one or more) index tensors, or a reason string."""
    x = node.args[0]
    present = [(k, i) for k, i in enumerate(node.args[1]) if i is not None]
    if not present:
        return "no index tensor"
    reason = _indices_reason(x, present)
    if reason:
        return reason
    try:
        index_shape = list(torch.broadcast_shapes(*(tuple(shape(i)) for _, i in present)))
    except RuntimeError:
        return f"index tensors of shapes {[shape(i) for _, i in present]} do not broadcast"
    axes = [k for k, _ in present]
    xs = shape(x)
    if axes == list(range(axes[0], axes[0] + len(axes))):
        perm, k, data_shape = None, axes[0], xs
    else:  # torch puts the broadcast index axes first: move the indexed axes there
        perm = axes + [d for d in range(len(xs)) if d not in axes]
        k, data_shape = 0, [xs[d] for d in perm]
    if math.prod(xs[a] for a in axes) >= INT32_LIMIT:
        return "indexed axes with >= 2^31 positions together (the device casts gather indices to int32)"
    return _Linear(perm, k, data_shape, present, index_shape)


def _linear_index(b: GraphBuilder, plan: _Linear) -> int:
    """``sum_j idx_j * stride_j`` (non-negative indices, broadcast), flattened to ``[count]``."""
    sizes = plan.sizes
    lin: int | None = None
    for j, (_, idx) in enumerate(plan.indices):
        term = _nonneg_index(b, idx, sizes[j])
        stride = math.prod(sizes[j + 1 :])
        if stride != 1:
            term = binary(b, N.MPSMul, term, b.scalar(int(stride), vdtype(b, term)))
        lin = term if lin is None else binary(b, N.MPSAdd, lin, term)
    assert lin is not None  # a plan has at least one index
    if vshape(b, lin) != [plan.count]:
        lin = view(b, lin, [plan.count])
    return lin


def _flat_data(b: GraphBuilder, x: Node, plan: _Linear) -> int:
    vid = b.id(x)
    if plan.perm is not None:
        vid = permute(b, vid, plan.perm)
    if plan.flat_shape() != plan.data_shape:
        vid = view(b, vid, plan.flat_shape())
    return vid


def _index_check(node: Node):
    n = sum(i is not None for i in node.args[1])
    if n <= 1:
        found = _single_index(node)
    else:
        found = _outer_indices(node)
        if isinstance(found, str):
            found = _linear_plan(node)
    return found if isinstance(found, str) else None


def _index_linear(node: Node, b: GraphBuilder) -> None:
    """Several index tensors as one linearized index: one MPSIndexSelect."""
    x = node.args[0]
    plan = _linear_plan(node)
    picked = b.emit(
        N.MPSIndexSelect(
            input1_id=_flat_data(b, x, plan),
            index_id=_linear_index(b, plan),
            dim=plan.k,
            output_id=b.new_value(b.dtype(x), plan.flat_indexed_shape()),
        )
    )
    view(b, picked, shape(node), out=b.out(node))


def _index_outer(node: Node, b: GraphBuilder) -> None:
    """One MPSIndexSelect per indexed axis with the flattened index; a gather shared by several
    nodes (the same rows of the same tensor) is emitted once."""
    x = node.args[0]
    vid, cur = b.id(x), shape(x)
    for k, idx in _outer_indices(node):
        n = math.prod(shape(idx))
        iv = _nonneg_index(b, idx, shape(x)[k])
        if shape(idx) != [n]:
            iv = b.memo(("flat index", iv), lambda iv=iv, n=n: view(b, iv, [n]))
        cur = cur[:k] + [n] + cur[k + 1 :]

        def gather(src=vid, k=k, iv=iv, out_shape=cur) -> int:
            return b.emit(N.MPSIndexSelect(input1_id=src, index_id=iv, dim=k, output_id=b.new_value(b.dtype(x), out_shape)))

        vid = b.memo(("index_select", vid, k, iv), gather)
    b.alias(node, vid)


def _indexed_shape(x: Node, k: int, idx: Node) -> list[int]:
    """Shape the device gathers/scatters: a 0-d index is [1] on the device."""
    s = shape(x)
    return s[:k] + _device_shape(shape(idx)) + s[k + 1 :]


def _index_tensor(node: Node, b: GraphBuilder) -> None:
    if sum(i is not None for i in node.args[1]) > 1:
        if isinstance(_outer_indices(node), str):
            _index_linear(node, b)
        else:
            _index_outer(node, b)
        return
    x = node.args[0]
    k, idx = _single_index(node)
    ids = [-1] * len(node.args[1])
    ids[k] = _nonneg_index(b, idx, shape(x)[k])
    device = _indexed_shape(x, k, idx)
    out = b.out(node) if device == shape(node) else b.new_value(b.dtype(x), device)
    b.emit(N.MPSIndexTensor(input1_id=b.id(x), indices_id=ids, output_id=out))
    if device != shape(node):
        view(b, out, shape(node), out=b.out(node))


def _index_put_check(node: Node):
    x, values = node.args[0], node.args[2]
    accumulate = bool(arg(node, 3, "accumulate", False))
    single = sum(i is not None for i in node.args[1]) == 1
    found = _single_index(node) if single and not accumulate else _linear_plan(node)
    if isinstance(found, str):
        return found
    if val(values).dtype != val(x).dtype:
        return f"index_put of {val(values).dtype} values into {val(x).dtype} (the device does not promote)"
    want = _indexed_shape(x, *found) if isinstance(found, tuple) else found.indexed_shape()
    try:
        torch.broadcast_shapes(tuple(shape(values)), tuple(want))
    except RuntimeError:
        return f"index_put values of shape {shape(values)} do not broadcast to {want}"
    if accumulate:
        if val(x).dtype == torch.bool:
            return "index_put with accumulate=True into a bool tensor"
        if found.count > ACCUMULATE_MAX:
            return (
                f"index_put with accumulate=True of {found.count} index entries: the device scatter "
                f"always overwrites, so each entry is a gather, add and scatter (at most {ACCUMULATE_MAX})"
            )
    return None


def _index_put(node: Node, b: GraphBuilder) -> None:
    x, _, values = node.args[:3]
    accumulate = bool(arg(node, 3, "accumulate", False))
    if sum(i is not None for i in node.args[1]) == 1 and not accumulate:
        k, idx = _single_index(node)
        ids = [-1] * len(node.args[1])
        ids[k] = _nonneg_index(b, idx, shape(x)[k])
        b.emit(
            N.MPSIndexPut(
                input1_id=b.id(x),
                indices_id=ids,
                values_shape=_indexed_shape(x, k, idx),
                values_id=b.id(values),
                output_id=b.out(node),
            )
        )
        return
    plan = _linear_plan(node)
    dt = b.dtype(x)
    data, lin = _flat_data(b, x, plan), _linear_index(b, plan)
    # the values broadcast to x[indices]'s shape, then viewed with the index axes as one
    vals = b.id(values)
    if _device_shape(shape(values)) != _device_shape(plan.indexed_shape()):
        vals = expand(b, vals, _device_shape(shape(values)), _device_shape(plan.indexed_shape()))
    vals = view(b, vals, plan.flat_indexed_shape())
    ids = [-1] * plan.k
    if not accumulate:
        data = b.emit(
            N.MPSIndexPut(
                input1_id=data,
                indices_id=ids + [lin],
                values_shape=plan.flat_indexed_shape(),
                values_id=vals,
                output_id=b.new_value(dt, plan.flat_shape()),
            )
        )
    else:  # torch's serial kernel: x[i_j] += v_j for j in index order
        one = plan.data_shape[: plan.k] + [1] + plan.flat_shape()[plan.k + 1 :]
        for j in range(plan.count):
            i_j = slice_value(b, lin, 0, j, j + 1)
            current = b.emit(N.MPSIndexSelect(input1_id=data, index_id=i_j, dim=plan.k, output_id=b.new_value(dt, one)))
            summed = binary(b, N.MPSAdd, current, slice_value(b, vals, plan.k, j, j + 1))
            data = b.emit(
                N.MPSIndexPut(
                    input1_id=data,
                    indices_id=ids + [i_j],
                    values_shape=one,
                    values_id=summed,
                    output_id=b.new_value(dt, plan.flat_shape()),
                )
            )
    if plan.perm is None:
        view(b, data, shape(x), out=b.out(node))
        return
    data = view(b, data, plan.data_shape)
    inverse = [plan.perm.index(d) for d in range(len(plan.perm))]
    permute(b, data, inverse, out=b.out(node))


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


def _scatter_range(b: GraphBuilder, node: Node, x: Node, src_vid: int, dim: int, start: int, end: int, step: int) -> None:
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
    b.emit(
        N.MPSScatter(input1_id=b.id(x), output_id=b.out(node), dim=dim, idx_id=b.constant(idx, dtype=torch.int64), src_id=src_vid)
    )


def _slice_scatter(node: Node, b: GraphBuilder) -> None:
    x, src = node.args[:2]
    dim = norm_dim(arg(node, 2, "dim", 0), rank(x))
    size = shape(x)[dim]
    start = clamp_index(arg(node, 3, "start", None), size, 0)
    end = max(clamp_index(arg(node, 4, "end", None), size, size), start)
    _scatter_range(b, node, x, b.id(src), dim, start, end, int(arg(node, 5, "step", 1)))


def _select_scatter(node: Node, b: GraphBuilder) -> None:
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


# ---- scatter --------------------------------------------------------------------------------------


def _scatter_src_check(node: Node):
    x, dim, idx = node.args[:3]
    src = node.args[3] if len(node.args) > 3 else node.kwargs.get("src", node.kwargs.get("value"))
    if node.kwargs.get("reduce") is not None:
        return f"scatter with reduce={node.kwargs['reduce']!r} (the device scatter only sets)"
    reason = _index_reason(idx)
    if reason:
        return reason
    if isinstance(src, Node) and val(src).dtype != val(x).dtype:
        return f"scatter of {val(src).dtype} into {val(x).dtype} (the device does not promote)"
    if rank(idx) != rank(x):
        return f"scatter into rank {rank(x)} with an index of rank {rank(idx)}"
    return None


def _scatter(node: Node, b: GraphBuilder) -> None:
    x, dim, idx = node.args[:3]
    src = node.args[3] if len(node.args) > 3 else node.kwargs.get("src", node.kwargs.get("value"))
    dt = b.dtype(x)
    xs, ishape = _device_shape(shape(x)), _device_shape(shape(idx))
    dim = norm_dim(dim, rank(x))
    if isinstance(src, Node):
        vid = b.id(src)
        for d, n in enumerate(ishape):  # torch reads src[:idx.shape]
            if _device_shape(shape(src))[d] != n:
                vid = slice_value(b, vid, d, 0, n)
    else:
        vid = expand(b, b.scalar(scalar_value(src, dt), dt), [1], ishape)
    # data and index of one shape except on dim: scatter into that corner of x, cat the rest back
    cut = [d for d in range(len(xs)) if d != dim and ishape[d] < xs[d]]
    if not cut:
        b.emit(N.MPSScatter(input1_id=b.id(x), idx_id=b.id(idx), src_id=vid, dim=dim, output_id=b.out(node)))
        return
    data = b.id(x)
    for d in cut:
        data = slice_value(b, data, d, 0, ishape[d])
    result = b.emit(
        N.MPSScatter(input1_id=data, idx_id=b.id(idx), src_id=vid, dim=dim, output_id=b.new_value(dt, vshape(b, data)))
    )
    # innermost cut axis first: the corner so far, then the rest of x on that axis (the corner's extent
    # on the cut axes before it)
    for i in range(len(cut) - 1, -1, -1):
        d = cut[i]
        rest = b.id(x)
        for e in cut[:i]:
            rest = slice_value(b, rest, e, 0, ishape[e])
        rest = slice_value(b, rest, d, ishape[d], xs[d])
        result = cat_values(b, [result, rest], d, out=b.out(node) if i == 0 else None)


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


def _gather(node: Node, b: GraphBuilder) -> None:
    """out[p] = x.flat[idx[p] * stride[dim] + sum_{d != dim} p_d * stride[d]]."""
    x, dim, idx = node.args[:3]
    xs, ishape = shape(x), shape(idx)
    dim = norm_dim(dim, rank(x))
    strides = [math.prod(xs[d + 1 :]) for d in range(len(xs))]
    dt = b.dtype(idx)
    base = torch.zeros(ishape, dtype=torch.int64)
    for d, n in enumerate(ishape):
        if d != dim and n > 1:
            base = base + (torch.arange(n, dtype=torch.int64) * strides[d]).reshape(
                [-1 if e == d else 1 for e in range(len(ishape))]
            )
    lin = b.id(idx)
    if strides[dim] != 1:
        lin = binary(b, N.MPSMul, lin, b.scalar(int(strides[dim]), dt))
    if bool(base.any()):
        lin = binary(b, N.MPSAdd, lin, b.constant(base.to(dt), dtype=dt))
    numel = math.prod(ishape)
    flat_idx = view(b, lin, [numel])
    flat_x = view(b, b.id(x), [math.prod(xs)])
    picked = b.new_value(b.dtype(x), [numel])
    b.emit(N.MPSIndexSelect(input1_id=flat_x, output_id=picked, dim=0, index_id=flat_idx))
    view(b, picked, shape(node), out=b.out(node))


LOWERINGS = [
    Lowering((aten.index_select.default,), _index_select, _index_select_check),
    Lowering((aten.embedding.default,), _embedding, _embedding_check),
    Lowering(
        (aten._embedding_bag.default, aten._embedding_bag_forward_only.default),
        _embedding_bag,
        _embedding_bag_check,
        generic="args",
    ),
    Lowering((aten.index.Tensor,), _index_tensor, _index_check),
    Lowering((aten.index_put.default,), _index_put, _index_put_check),
    Lowering((aten.slice_scatter.default,), _slice_scatter, _scatter_check),
    Lowering((aten.select_scatter.default,), _select_scatter, _select_scatter_check, preserve=True),
    Lowering((aten.gather.default,), _gather, _gather_check),
    Lowering((aten.scatter.src, aten.scatter.value), _scatter, _scatter_src_check),
]
