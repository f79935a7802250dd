"""Pooling: max / average pooling (1-d to 3-d, ceil_mode), adaptive average / max pooling (1-d to
3-d, any output size), nearest and bilinear upsampling.

The device has two pooling nodes, MPSMaxPool2DWithIndices and MPSAvgPool2D, which pool the last two
axes of an NCHW tensor with explicit (top, bottom, left, right) padding. Everything here is built
from them (1-d pooling reaches us as a 2-d pool on an unsqueezed tensor):

- ``ceil_mode`` is never passed to the device (its ceil handling with padding differs from torch,
  semantics §5.14, §6 #7). Where ceil mode grows the output, the last window reaches past the
  padded input; those positions (the *tail*) are padded explicitly after the torch padding, and
  the device pools in floor mode: max pooling pads with -inf, so the tail is never chosen. Average
  pooling: with ``count_include_pad=False`` the device counts only input elements, which is torch's
  divisor; with ``count_include_pad=True`` torch counts the padding but not the tail, so the input
  is first padded with zeros by an MPSConstantPadND (counted as input) and the pool pads only the
  tail, uncounted.
- ``divisor_override`` becomes an explicit multiply of the window mean (the device's own f32
  multiplier breaks f16 graphs, §6 #8).
- 3-d pooling is separable: a box max is the max over depth of the max over H, W; a box average
  is the depth average of H, W averages, because torch's divisor (with or without the padding, and
  clipped to the padded input in ceil mode) is the product of one count per axis. The input
  ``[N, C, D, H, W]`` is viewed as ``[1, N*C*D, H, W]`` and pooled over H, W, then viewed as
  ``[1, N*C, D, OH*OW]`` and pooled with kernel ``(kd, 1)``.
- Max-pool indices are int32 on the device; when read they are cast to int64. A second stage's
  indices are positions in the plane its input was pooled over; they are turned into positions in
  the input plane by gathering the first stage's (offset) indices with one MPSIndexSelect on the
  flattened tensor. A pooling keeps the first maximum of its window in row-major order (the last
  NaN), as torch and the device model do; stages run innermost axes first (W before H, the H, W
  plane before depth), so the composition keeps torch's element: the first depth (row) holding the
  maximum, and in it the first (h, w). In fp16 mode indices are those of the float16-rounded input:
  two elements of a window that round to the same float16 value tie, and the first is returned
  where float32 torch returns the larger.
- Adaptive pooling: along an axis of size n pooled to o, bin i is ``[floor(i*n/o), ceil((i+1)*n/o))``;
  bins may overlap and have (at most two) different lengths. The bins of one length L whose starts
  share the divisor t are windows of a pooling with kernel L and stride t (t = L when n % o == 0:
  plain pooling); one pooling per length, concatenated, then one MPSIndexSelect with a constant
  index picks the bins in order. When each axis has one length, the two axes of a plane share one
  pooling; otherwise each axis is its own stage. An avg with a 1x1(x1) output is one MPSMean. A bin
  length lies in [n/o, n/o + 2), so an axis has at most two lengths: two poolings, a cat and a
  gather per axis bound the node count whatever the sizes (a pooling of stride t computes at most
  n windows).

Precision: each stage rounds its output in fp16 mode (a stage mean of means is exact in exact
arithmetic), so separable averages carry one rounding per stage.

Nearest upsampling (``upsample_nearest2d``, ``_upsample_nearest_exact2d``) is separable: the source
row/column of every output row/column is obtained by running the same aten op on an index grid at
lowering time (shapes only, so torch's own float scale arithmetic is reproduced exactly). Integer
factors become view + expand + view (a broadcast copy); other mappings one MPSIndexSelect per axis
with that constant index.

Bilinear upsampling (``upsample_bilinear2d``; the union has no resize member) is separable and
linear: ``out = A_h @ x @ A_w^T`` with constant interpolation matrices ``A_h [H', H]``,
``A_w [W', W]`` whose rows hold torch's two lerp weights. They are obtained, like the nearest
indices, by running the aten op itself on one-hot float32 inputs at lowering time (one axis at a
time, the other of size 1), so the weights are torch's float32 weights bit for bit. Each resized
axis is one MPSMatMul (broadcast over N, C); an axis of input size 1 is a broadcast (MPSExpand), an
unchanged axis nothing. Deviation: a matmul reads every input row/column with weight 0 or more, so
an inf or NaN in the input makes its whole output column/row NaN, where torch confines it to the
output pixels whose two taps include it. Finite inputs match torch up to rounding.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.serialization.generated import nodes as N

from ._util import arg, is_float, rank, shape, val
from .emit import binary, cat_values, index_select, vdtype, view, vshape
from .registry import Lowering, op_key

aten = torch.ops.aten

#: max pooling: positions in the input must fit the device's int32 indices
_INT32_ELEMENTS = 2**31 - 1


# ---- one device pooling ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Axis:
    """How one axis is pooled: kernel, stride, dilation and the explicit padding before / after it.
    ``pad`` is torch's (symmetric) padding; ``after - pad`` is the ceil-mode tail."""

    k: int = 1
    s: int = 1
    d: int = 1
    before: int = 0
    after: int = 0
    pad: int = 0

    @property
    def tail(self) -> int:
        return self.after - self.pad

    @property
    def identity(self) -> bool:
        return self.k == 1 and self.s == 1 and self.before == self.after == 0

    def size(self, n: int) -> int:
        """Floor-mode output size over an axis of size n."""
        return (n + self.before + self.after - self.d * (self.k - 1) - 1) // self.s + 1


_ONE = _Axis()  # an axis a stage leaves alone


def _pool(b: GraphBuilder, kind: str, vid: int, h: _Axis, w: _Axis, include_pad: bool = False) -> tuple[int, int | None]:
    """One pooling node over the last two axes of the 4-D value ``vid`` (``kind`` "max" or "avg"),
    floor mode with explicit padding: (values, int32 indices or None)."""
    n, c, hh, ww = vshape(b, vid)
    out_shape = [n, c, h.size(hh), w.size(ww)]
    out = b.new_value(vdtype(b, vid), out_shape)
    fields: dict[str, Any] = {
        "input1_id": vid,
        "kernel_height": h.k,
        "kernel_width": w.k,
        "stride_height": h.s,
        "stride_width": w.s,
        "padding_left": w.before,
        "padding_right": w.after,
        "padding_top": h.before,
        "padding_bottom": h.after,
        "dilation_height": h.d,
        "dilation_width": w.d,
        "ceil_mode": False,
        "divisor_override": 0,
        "output1_id": out,
    }
    if kind == "max":
        idx = b.new_value(torch.int32, out_shape)
        b.emit(N.MPSMaxPool2DWithIndices(**fields, count_include_pad=False, output2_id=idx))
        return out, idx
    b.emit(N.MPSAvgPool2D(**fields, count_include_pad=include_pad, output2_id=-1))
    return out, None


def _avg(b: GraphBuilder, vid: int, h: _Axis, w: _Axis, count: str) -> int:
    """Window means over the last two axes of ``vid``, divided by the count of ``count``: "input"
    (count_include_pad=False: the device counts input elements only), "padding" (torch's
    count_include_pad=True: the padding counted, the ceil-mode tail not) or "window" (every
    position, tail included: the kernel size). The device counts all of its explicit padding or
    none of it, so for "padding" with a tail the padding is made zeros of the input first."""
    if count != "padding" or h.tail == w.tail == 0:
        return _pool(b, "avg", vid, h, w, include_pad=count != "input")[0]
    if h.pad or w.pad:
        s = vshape(b, vid)
        padded = b.new_value(vdtype(b, vid), s[:2] + [s[2] + 2 * h.pad, s[3] + 2 * w.pad])
        b.emit(N.MPSConstantPadND(input1_id=vid, output_id=padded, pad=[w.pad, w.pad, h.pad, h.pad], value=0.0))
        vid = padded
    h, w = (replace(a, before=0, after=a.tail, pad=0) for a in (h, w))
    return _pool(b, "avg", vid, h, w, include_pad=False)[0]


def _offset(b: GraphBuilder, idx: int, step: int) -> int:
    """``idx + i * step`` along axis 2 of the int32 value ``idx`` (``[1, M, D, P]``): plane positions
    of depth slice i made positions in the whole ``D x P`` volume."""
    depth = vshape(b, idx)[2]
    return binary(
        b, N.MPSAdd, idx, b.constant(torch.arange(depth, dtype=torch.int32).reshape(depth, 1) * step, dtype=torch.int32)
    )


def _compose(b: GraphBuilder, outer: int, inner: int) -> int:
    """Indices through two stages: ``outer [A, B, P, Q]`` holds final indices; ``inner`` (4-D, same
    A, B) holds positions in outer's ``P x Q`` plane. Returns ``outer[a, b].flatten()[inner[a, b]]``
    (one gather on the flattened ``outer``)."""
    a, bb, p, q = vshape(b, outer)
    inner_shape = vshape(b, inner)
    if a * bb > 1:  # plane (a, b) starts at (a * B + b) * P * Q of the flattened tensor
        base = torch.arange(a * bb, dtype=torch.int32).reshape(a, bb, 1, 1) * (p * q)
        inner = binary(b, N.MPSAdd, inner, b.constant(base, dtype=torch.int32))
    flat = view(b, outer, [a * bb * p * q])
    pos = view(b, inner, [math.prod(inner_shape)])
    out = b.new_value(torch.int32, [math.prod(inner_shape)])
    b.emit(N.MPSIndexSelect(input1_id=flat, index_id=pos, dim=0, output_id=out))
    return view(b, out, inner_shape)


# ---- binding a node's results ------------------------------------------------------------------


def _indices_read(node: Node) -> bool:
    return any(u.target is operator.getitem and u.args[1] == 1 and u.users for u in node.users)


def _reshaped(b: GraphBuilder, vid: int, target: list[int]) -> int:
    return vid if vshape(b, vid) == target else view(b, vid, target)


def _bind(b: GraphBuilder, node: Node, values: int, idx: int | None = None) -> None:
    """Bind the node to its results: ``values`` (and for (values, indices) nodes the int32 ``idx``,
    cast to int64 when read) in the node's shape."""
    if idx is None:
        b.alias(node, _reshaped(b, values, shape(node)))
        return
    target = _out_shape(node)
    values, idx = _reshaped(b, values, target), _reshaped(b, idx, target)
    want = b.result_dtype(node, val(node)[0].dtype)
    if vdtype(b, values) != want:  # pooled in float32 (see _source)
        values = b.cast(values, want)
    if _indices_read(node):
        idx = b.cast(idx, torch.int64)
    b.ids[node] = (values, idx)


def _out_shape(node: Node) -> list[int]:
    v = val(node)
    return [int(d) for d in (v[0] if isinstance(v, (tuple, list)) else v).shape]


# ---- max / avg pooling ---------------------------------------------------------------------------


def _ints(v, n: int, default) -> list[int]:
    """An int-or-list argument as n ints (torch repeats a single value)."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return [v] * n
    v = [int(i) for i in v]
    return v * n if len(v) == 1 else v


def _axes(node: Node, n: int, max_pool: bool) -> list[_Axis]:
    """The n pooled axes of a max / avg pool node with torch's padding, plus the ceil-mode tail:
    the positions past the padded input that ceil mode's last window reaches (read off the output
    size; 0 in floor mode). Padding the tail makes floor-mode pooling produce torch's windows."""
    k = _ints(arg(node, 1, "kernel_size"), n, None)
    s = _ints(arg(node, 2, "stride", None), n, k)
    p = _ints(arg(node, 3, "padding", 0), n, 0)
    d = _ints(arg(node, 4, "dilation", 1), n, 1) if max_pool else [1] * n
    axes = []
    for i, (size, out) in enumerate(zip(shape(node.args[0])[-n:], _out_shape(node)[-n:])):
        tail = max(0, (out - 1) * s[i] + d[i] * (k[i] - 1) + 1 - (size + 2 * p[i]))
        axes.append(_Axis(k[i], s[i], d[i], p[i], p[i] + tail, p[i]))
    return axes


def _check(n: int, max_pool: bool):
    """Support check of an n-d pooling, adaptive or not (2: 1-d and 2-d pools, 3: 3-d pools)."""

    def check(node: Node):
        x = node.args[0]
        if rank(x) not in (n + 1, n + 2):
            return f"{n}-d pooling of a rank-{rank(x)} tensor"
        if not is_float(x):
            return "pooling of a non-float tensor"
        if max_pool and math.prod(shape(x)) > _INT32_ELEMENTS:
            return "max pooling of more than 2^31 - 1 elements (the device's pooling indices are int32)"
        return None

    return check


def _source(b: GraphBuilder, node: Node) -> int:
    """The value a pooling node reads. In fp16 mode a max pool whose indices are read pools a float32
    user input in float32: rounded to float16 first, nearby values tie and the index of the first one
    would come out instead of the largest's."""
    x = node.args[0]
    exact = b.float32_input(x) if _indices_read(node) else None
    return exact if exact is not None else b.id(x)


def _planes(b: GraphBuilder, x: Node, n: int, vid: int) -> tuple[int, list[int], int]:
    """(number M of pooled planes / volumes, their n spatial sizes, the input ``vid`` as a 4-D value:
    ``[N, C, H, W]`` itself, or viewed as ``[1, M, H, W]`` / ``[1, M*D, H, W]``)."""
    s = shape(x)
    m, sizes = math.prod(s[:-n]), s[-n:]
    if len(s) == 4 and n == 2:
        return m, sizes, vid
    return m, sizes, view(b, vid, [1, m * math.prod(sizes[:-2])] + sizes[-2:])


def _volume(b: GraphBuilder, vid: int, m: int, depth: int) -> int:
    """A 4-D value of M*D planes viewed as ``[1, M, D, plane]`` (depth pooled as height)."""
    s = vshape(b, vid)
    return view(b, vid, [1, m, depth, s[2] * s[3]])


def _max_pool(node: Node, b: GraphBuilder) -> None:
    """max_pool2d/3d_with_indices: values, and indices over the input plane / volume."""
    x, n = node.args[0], 3 if op_key(node.target) is aten.max_pool3d_with_indices.default else 2
    axes = _axes(node, n, True)
    m, sizes, vid = _planes(b, x, n, _source(b, node))
    if n == 2:
        _bind(b, node, *_pool(b, "max", vid, axes[0], axes[1]))
        return
    dk, hk, wk = axes
    if hk.identity and wk.identity:  # depth only: positions in [D, H*W] planes are volume positions
        _bind(b, node, *_pool(b, "max", _volume(b, vid, m, sizes[0]), dk, _ONE))
        return
    # H, W of every depth slice, then depth over the [D, OH*OW] planes
    plane_values, plane_idx = _pool(b, "max", vid, hk, wk)
    assert plane_idx is not None  # a max pool has indices
    values, idx = _volume(b, plane_values, m, sizes[0]), _volume(b, plane_idx, m, sizes[0])
    idx = _offset(b, idx, sizes[1] * sizes[2])  # positions in the D x H x W volume
    if not dk.identity:
        values, depth_idx = _pool(b, "max", values, dk, _ONE)
        assert depth_idx is not None
        idx = _compose(b, idx, depth_idx)
    _bind(b, node, values, idx)


def _avg_pool(node: Node, b: GraphBuilder) -> None:
    """avg_pool2d/3d: window means (one stage per pooled plane), divisor_override as a multiply."""
    x, n = node.args[0], 3 if op_key(node.target) is aten.avg_pool3d.default else 2
    divisor = arg(node, 6, "divisor_override", None)
    # divisor_override: sum / divisor = (mean over whole windows) * kernel size / divisor
    count = "window" if divisor is not None else "padding" if arg(node, 5, "count_include_pad", True) else "input"
    axes = _axes(node, n, False)
    m, sizes, out = _planes(b, x, n, b.id(x))
    if n == 3:
        dk, hk, wk = axes
        if not (hk.identity and wk.identity):
            out = _avg(b, out, hk, wk, count)
        out = _volume(b, out, m, sizes[0])
        if not dk.identity:
            out = _avg(b, out, dk, _ONE, count)
    else:
        out = _avg(b, out, axes[0], axes[1], count)
    if divisor is not None:
        k = math.prod(a.k for a in axes)
        out = binary(b, N.MPSMul, out, b.scalar(k / int(divisor), vdtype(b, out)))
    _bind(b, node, out)


# ---- adaptive pooling ---------------------------------------------------------------------------


def _bins(n: int, o: int) -> list[tuple[int, int]]:
    """torch's adaptive bins: [floor(i*n/o), ceil((i+1)*n/o)) for each output i."""
    return [(i * n // o, -(-(i + 1) * n // o)) for i in range(o)]


def _groups(n: int, o: int) -> list[tuple[_Axis, list[tuple[int, int]]]]:
    """The poolings of an adaptive axis: per bin length L, (kernel L with the largest stride t that
    hits every start, [(bin, window of that pooling)])."""
    by_length: dict[int, list[tuple[int, int]]] = {}
    for i, (start, end) in enumerate(_bins(n, o)):
        by_length.setdefault(end - start, []).append((i, start))
    groups = []
    for length, bins in sorted(by_length.items()):
        t = math.gcd(*(start for _, start in bins)) or length
        groups.append((_Axis(length, t), [(i, start // t) for i, start in bins]))
    return groups


def _take(b: GraphBuilder, out: tuple[int, int | None], axis: int, index: list[int]) -> tuple[int, int | None]:
    """Values and indices gathered along ``axis`` (nothing when ``index`` selects every position)."""
    if index == list(range(vshape(b, out[0])[axis])):
        return out
    values, idx = out
    return index_select(b, values, axis, index), None if idx is None else index_select(b, idx, axis, index)


def _adaptive_axis(b: GraphBuilder, kind: str, vid: int, axis: int, o: int) -> tuple[int, int | None]:
    """Adaptive pooling of axis 2 or 3 of a 4-D value to ``o`` bins: one pooling per bin length,
    concatenated, then the bins picked in order."""
    groups = _groups(vshape(b, vid)[axis], o)
    outs, index, offset = [], [0] * o, 0
    for a, bins in groups:
        outs.append(_pool(b, kind, vid, *((a, _ONE) if axis == 2 else (_ONE, a))))
        for i, j in bins:
            index[i] = offset + j
        offset += vshape(b, outs[-1][0])[axis]
    if len(outs) == 1:
        out = outs[0]
    else:
        idxs = [i for _, i in outs]
        out = (
            cat_values(b, [v for v, _ in outs], axis),
            None if any(i is None for i in idxs) else cat_values(b, [i for i in idxs if i is not None], axis),
        )
    return _take(b, out, axis, index)


def _adaptive_plane(b: GraphBuilder, kind: str, vid: int, oh: int, ow: int) -> tuple[int, int | None]:
    """Adaptive pooling of the last two axes of a 4-D value: (values, indices in that plane)."""
    h, w = vshape(b, vid)[2:]
    if kind == "avg" and (oh, ow) == (h, w):
        return vid, None
    gh, gw = _groups(h, oh), _groups(w, ow)
    if len(gh) == len(gw) == 1:  # one pooling for the plane (plain pooling when the sizes divide)
        (ah, bins_h), (aw, bins_w) = gh[0], gw[0]
        out = _pool(b, kind, vid, ah, aw)
        out = _take(b, out, 2, [j for _, j in bins_h])
        return _take(b, out, 3, [j for _, j in bins_w])
    # W first: the H stage then keeps the first row holding a row maximum, and in that row the
    # W stage kept the first column, torch's first maximum in (h, w) order
    first = _adaptive_axis(b, kind, vid, 3, ow) if ow != w else (vid, None)
    values, idx = _adaptive_axis(b, kind, first[0], 2, oh) if oh != h else first
    if kind == "max" and first[1] is not None and idx is not None and idx is not first[1]:
        idx = _compose(b, first[1], idx)  # H-stage positions in the W-stage output plane
    return values, idx


def _adaptive(node: Node, b: GraphBuilder) -> None:
    """_adaptive_avg_pool2d/3d, adaptive_max_pool2d/3d (values and indices)."""
    key = op_key(node.target)
    kind = "max" if key in (aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default) else "avg"
    n = 3 if key in (aten._adaptive_avg_pool3d.default, aten.adaptive_max_pool3d.default) else 2
    x, out_sizes = node.args[0], [int(d) for d in node.args[1]]
    r = rank(x)
    if kind == "avg" and all(o == 1 for o in out_sizes):  # global average
        b.emit(N.MPSMean(input1_id=b.id(x), output_id=b.out(node), num_dims=n, dims=list(range(r - n, r)), keep_dims=True))
        return
    m, sizes, vid = _planes(b, x, n, _source(b, node) if kind == "max" else b.id(x))
    if n == 2:
        _bind(b, node, *_adaptive_plane(b, kind, vid, *out_sizes))
        return
    (depth, h, w), (od, oh, ow) = sizes, out_sizes
    values, idx = _adaptive_plane(b, kind, vid, oh, ow)  # always pools (max: idx is set)
    values = _volume(b, values, m, depth)
    if idx is not None:
        idx = _offset(b, _volume(b, idx, m, depth), h * w)  # positions in the D x H x W volume
    if od != depth:
        values, depth_idx = _adaptive_axis(b, kind, values, 2, od)
        if idx is not None and depth_idx is not None:
            idx = _compose(b, idx, depth_idx)
    _bind(b, node, values, idx)


# ---- upsampling ---------------------------------------------------------------------------------


def _upsample_check(node: Node):
    if rank(node.args[0]) != 4 or rank(node) != 4:
        return f"nearest upsampling of a rank-{rank(node.args[0])} tensor"
    return None


def _nearest_sources(node: Node) -> tuple[list[int], list[int]]:
    """Source row of each output row and source column of each output column, computed by the
    op itself on an index grid (float64 holds the indices exactly)."""
    h, w = shape(node.args[0])[-2:]
    grid = torch.arange(h * w, dtype=torch.float64).reshape(1, 1, h, w)
    src = node.target(grid, *node.args[1:], **node.kwargs)[0, 0].long()  # edge ops are callable
    rows, cols = src[:, 0] // w, src[0, :] % w
    if not torch.equal(src, rows[:, None] * w + cols[None, :]):
        raise ValueError("nearest upsampling that is not separable")
    return rows.tolist(), cols.tolist()


def _upsample_nearest(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    n, c, h, w = shape(x)
    rows, cols = _nearest_sources(node)
    oh, ow = len(rows), len(cols)
    vid = b.id(x)
    if (
        oh % h == 0
        and ow % w == 0
        and rows == [i // (oh // h) for i in range(oh)]
        and cols == [j // (ow // w) for j in range(ow)]
    ):
        sh, sw = oh // h, ow // w
        vid = view(b, vid, [n, c, h, 1, w, 1])
        big = b.new_value(b.dtype(x), [n, c, h, sh, w, sw])
        b.emit(N.MPSExpand(input1_id=vid, output_id=big, num_dims=6, shape=[n, c, h, sh, w, sw]))
        view(b, big, shape(node), out=b.out(node))
        return
    steps = [(axis, src) for axis, src, size in ((2, rows, h), (3, cols, w)) if src != list(range(size))]
    if not steps:
        b.alias(node, vid)
        return
    for i, (axis, src) in enumerate(steps):
        vid = index_select(b, vid, axis, src, out=b.out(node) if i == len(steps) - 1 else None)


def _bilinear_check(node: Node):
    if rank(node.args[0]) != 4 or rank(node) != 4:
        return f"bilinear upsampling of a rank-{rank(node.args[0])} tensor"
    if not is_float(node.args[0]):
        return "bilinear upsampling of a non-float tensor"
    return None


def _bilinear_matrix(node: Node, axis: int) -> torch.Tensor:
    """``A [out, in]`` of ``axis`` (2: rows, 3: columns): the op applied to the one-hot basis of
    that axis, the other axis of size 1 and left at 1."""
    size, out = shape(node.args[0])[axis], shape(node)[axis]
    basis = torch.eye(size, dtype=torch.float32).reshape(size, 1, size, 1)
    if axis == 3:
        basis = basis.transpose(2, 3)
    sizes = [out, 1] if axis == 2 else [1, out]
    align = bool(arg(node, 2, "align_corners", False))
    if op_key(node.target) is aten.upsample_bilinear2d.vec:
        scales = arg(node, 3, "scale_factors", None)
        if scales is not None:  # torch then derives the scale from the factor, not from the sizes
            scales = [float(scales[0]), 1.0] if axis == 2 else [1.0, float(scales[1])]
        result = aten.upsample_bilinear2d.vec(basis, None if scales is not None else sizes, align, scales)
    else:
        scale = arg(node, 3 if axis == 2 else 4, "scales_h" if axis == 2 else "scales_w", None)
        result = aten.upsample_bilinear2d.default(basis, sizes, align, scale if axis == 2 else None, scale if axis == 3 else None)
    return result.reshape(size, out).t().contiguous()


def _resized(node: Node, axis: int) -> bool:
    size = shape(node.args[0])[axis]
    return size != shape(node)[axis] or not torch.equal(_bilinear_matrix(node, axis), torch.eye(size))


def _upsample_bilinear(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    vid, cur = b.id(x), shape(x)
    steps = [axis for axis in (3, 2) if _resized(node, axis)]
    if not steps:
        b.alias(node, vid)
        return
    dt = b.dtype(node)
    if all(shape(x)[axis] == 1 for axis in steps):  # from single pixels/rows/columns: one broadcast
        b.emit(N.MPSExpand(input1_id=vid, output_id=b.out(node), num_dims=4, shape=shape(node)))
        return
    for k, axis in enumerate(steps):
        cur = cur[:axis] + [shape(node)[axis]] + cur[axis + 1 :]
        out = b.out(node) if k == len(steps) - 1 else b.new_value(dt, cur)
        if shape(x)[axis] == 1:  # every output row/column is the one input row/column
            b.emit(N.MPSExpand(input1_id=vid, output_id=out, num_dims=4, shape=cur))
        elif axis == 3:  # x @ A_w^T
            b.emit(
                N.MPSMatMul(
                    input1_id=vid, input2_id=b.constant(_bilinear_matrix(node, 3).t().contiguous(), dtype=dt), output_id=out
                )
            )
        else:  # A_h @ x
            b.emit(N.MPSMatMul(input1_id=b.constant(_bilinear_matrix(node, 2), dtype=dt), input2_id=vid, output_id=out))
        vid = out


LOWERINGS = [
    Lowering((aten.max_pool2d_with_indices.default,), _max_pool, _check(2, True), generic="args"),
    Lowering((aten.max_pool3d_with_indices.default,), _max_pool, _check(3, True), generic="args"),
    Lowering((aten.avg_pool2d.default,), _avg_pool, _check(2, False)),
    Lowering((aten.avg_pool3d.default,), _avg_pool, _check(3, False)),
    Lowering((aten._adaptive_avg_pool2d.default,), _adaptive, _check(2, False)),
    Lowering((aten._adaptive_avg_pool3d.default,), _adaptive, _check(3, False)),
    Lowering((aten.adaptive_max_pool2d.default,), _adaptive, _check(2, True), generic="args"),
    Lowering((aten.adaptive_max_pool3d.default,), _adaptive, _check(3, True), generic="args"),
    Lowering(
        (
            aten.upsample_nearest2d.vec,
            aten.upsample_nearest2d.default,
            aten._upsample_nearest_exact2d.vec,
            aten._upsample_nearest_exact2d.default,
        ),
        _upsample_nearest,
        _upsample_check,
        preserve=True,
    ),
    Lowering(
        (aten.upsample_bilinear2d.vec, aten.upsample_bilinear2d.default), _upsample_bilinear, _bilinear_check, preserve=True
    ),
]
