"""Reductions.

- ``mean`` -> MPSMean with explicit dims: the device reads empty dims as "no reduction"
  (semantics §6 #20), so reduce-all (``dim=None`` or ``[]``) is written as every axis.
- ``sum`` -> MPSMean then MPSMul by the element count (a scalar of the compute dtype). The
  mean never overflows; ``mean * count`` overflows float16 exactly where the float16 sum does, as in
  torch. In fp16 mode the count is applied as factors that float16 holds exactly.
- ``amax/amin``, ``max/min`` (all, ``.dim`` values and indices), ``argmax/argmin``: the reduced axes
  are permuted last and the tensor is viewed as ``[1, M, 1, R]``; one MPSMaxPool2DWithIndices with a
  ``1 x R`` window gives the maximum of each row and its int32 index flattened over the window, i.e.
  the position in the row-major order of the reduced axes (torch's ``argmax`` index for one dim and
  for ``dim=None``). Indices are cast to int64. ``min`` pools the negation (``-max(-x)``, exact).
  The device has no MPSMax/MPSMin (never dispatched, §6 #28). Unverified on the device: pooling
  windows as wide as a whole row (e.g. a vocabulary), NaN propagation and the index of ties (torch:
  NaN wins, first index among equal maxima).
- ``topk`` and the integer ``max/min/argmax/argmin/amax/amin`` (``rank_select``): the reduced axes
  permuted last, viewed as ``[M, n]``; for every pair of a row, ``j`` comes before ``i`` when ``x_j`` is
  better (greater for largest; NaN is the greatest value, as in torch) or equal at a lower index
  (``[n, n]`` constant). ``rank_i`` = the number of such ``j`` = ``n * mean(flags)`` (MPSMean of 0/1 in
  the compute float dtype: the sum is exact and the rounding of ``sum / n`` times ``n`` stays below 0.5
  for ``n <= 512`` even in float16). The position holding rank ``r`` is ``|rank - r| < 0.5``: exactly one
  1 among 0s per (row, r), so one max pool over all ``k`` ranks gives the positions (whatever the
  pool's tie rule), and one MPSIndexSelect the values. Exact for every dtype: no arithmetic on the
  values, only comparisons. Order: best first, equal values lowest index first (torch's max/argmax
  return the first index; topk's order among equal values is torch's implementation detail, e.g.
  index 2 for ``topk([2, 2, 2, 2], 1)``). Limits: ``n <= 512``, ``M * n * n <= 2^22`` comparisons;
  ``sorted=False`` with ``k > 1`` stays on CPU (torch's order of unsorted results is an implementation
  detail). sort / argsort: the device has no sort node kind (``NOT_LOWERED``).
  ``median`` of all elements (torch's lower median, rank ``(n - 1) // 2`` ascending) is the same
  selection, plus rank ``n - 1``: NaN ranks last, so NaN there means the median is NaN (torch).
  ``median.dim`` is not registered: its lowering would be the same selection per row (a row with NaN
  gives its first NaN's index: NaNs would rank among themselves by descending index), but a program
  returning its ``(values, indices)`` namedtuple cannot be serialized by ExecuTorch with or without a
  delegate (``torch.return_types.median`` has no pytree serialization name), so delegating it turns the
  operator suite's skips into emit failures; register it once that is fixed upstream.
- ``prod``: the reduced axes permuted last and viewed as ``[M, N]``, the two halves multiplied until one
  column is left (a column of ones pads an odd count): exact for integers (wrapping products are
  associative; torch multiplies integers and bool in int64, so does the lowering), ``log2(N)`` roundings
  per element for floats (torch's own vectorised order differs as well).
- ``any``: ``x != 0`` (bool input as is) cast to 0/1 in the compute float dtype (exact), averaged
  over the reduced axes with MPSMean and compared ``> 0`` (three nodes for a bool input). The mean of
  ``n`` zeros/ones is at least ``1/n`` when one is set: with ``n <= 2^24`` (float32) or ``n <= 2^14``
  (float16, where ``2^-14`` is the smallest normal number and the sum stays below 65504) that is a
  positive normal number, so the test is exact. Larger reductions are max-pooled as above.
  ``all`` reaches edge as ``logical_not(any(logical_not(x)))``.
  ``any.dims(x, [])`` reduces nothing (unlike sum/mean/amax/var, where ``[]`` means every axis).
- ``cumsum`` over an axis of size n <= 512: a matmul with a constant lower-triangular ones matrix
  ``[n, n]`` (mathematically exact; the rounding order differs from a sequential scan).
- ``var.correction``: mean, deviation, mean of squares, times ``n / (n - correction)``. In fp16
  mode the squared deviations are float16 and overflow where ``|x - mean| > 255`` (torch upcasts).
Integer inputs of mean/sum/cumsum/var stay on CPU (the device averages floats and a float detour is
inexact for large integers; max/min: ``rank_select`` above); ``any`` and ``prod`` take every dtype.
Exception: ``mean`` / ``sum`` with a float ``dtype=`` argument (``torch.mean(int64_tensor,
dtype=torch.float32)``; torch's mean of an integer tensor without it is an error): torch casts the input
to that dtype and reduces, and so does the lowering (one MPSCast first; in fp16 graphs the cast is to
float16, which holds integers exactly up to 2048 and overflows above 65504, as any float32 value of an
fp16 graph).
"""

from __future__ import annotations

import math
import operator

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.serialization.generated import nodes as N

from ._util import arg, is_float, norm_dim, rank, shape, val
from .emit import binary, cat_values, convert, permute, slice_value, unary, vdtype, view, vshape
from .registry import Lowering, op_key

aten = torch.ops.aten

#: largest reduction ``any`` lowers as a mean of 0/1 flags (1/n stays a normal number), per compute dtype
ANY_MEAN_MAX = {torch.float32: 2**24, torch.float16: 2**14}
#: largest axis cumsum lowers: the triangular constant has n*n elements
CUMSUM_MAX = 512
#: topk / integer max: the most elements per row (float16 counts of up to 512 flags are exact to
#: within 0.5) and the most pairwise comparisons (rows * n * n)
RANK_MAX = 512
RANK_PAIRS_MAX = 2**22


def _reduce_dims(dims, r: int) -> list[int]:
    """Sorted non-negative axes; None / [] mean every axis (a rank-0 tensor is [1] on the device)."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(max(r, 1)))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({norm_dim(int(d), r) for d in dims})


def _device_shape(node_or_shape) -> list[int]:
    s = shape(node_or_shape) if isinstance(node_or_shape, Node) else list(node_or_shape)
    return s or [1]


def _float_check(what: str):
    def check(node: Node):
        if not is_float(node.args[0]):
            return (
                f"{what} of a {val(node.args[0]).dtype} tensor: the device reduces floats only and a "
                "float detour is inexact for large integers"
            )
        dtype = node.kwargs.get("dtype")
        if dtype is not None and dtype != val(node.args[0]).dtype:
            return f"{what} with dtype={dtype} (accumulation dtype change)"
        return None

    return check


# ---- mean / sum -----------------------------------------------------------------------------------


def _accumulate_check(what: str):
    """mean / sum: a float input, or any input with a float ``dtype=`` (torch casts the input to it
    first, and so does the lowering: e.g. ``mean(int64_tensor, dtype=torch.float32)``)."""

    def check(node: Node):
        dtype = node.kwargs.get("dtype")
        if dtype is not None and dtype.is_floating_point:
            return None
        return _float_check(what)(node)

    return check


def _reduce_input(b: GraphBuilder, node: Node) -> int:
    """The value mean / sum reduce: the input, cast to the ``dtype=`` argument when given."""
    vid = b.id(node.args[0])
    dtype = node.kwargs.get("dtype")
    return vid if dtype is None else convert(b, vid, b.dtype(node))


def _mean_value(b: GraphBuilder, x: Node, dims: list[int], keep: bool, out: int | None = None, vid: int | None = None) -> int:
    """MPSMean of ``x`` (or of ``vid``, a value of x's shape) over ``dims``."""
    vid = b.id(x) if vid is None else vid
    if out is None:
        s = _device_shape(x)
        s = [1 if i in dims else d for i, d in enumerate(s)] if keep else [d for i, d in enumerate(s) if i not in dims]
        out = b.new_value(vdtype(b, vid), s)
    b.emit(N.MPSMean(input1_id=vid, output_id=out, num_dims=len(dims), dims=dims, keep_dims=keep))
    return out


def _mean(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    dims = _reduce_dims(arg(node, 1, "dim", None), rank(x))
    _mean_value(b, x, dims, bool(arg(node, 2, "keepdim", False)), out=b.out(node), vid=_reduce_input(b, node))


def _exact_factors(n: int, dtype: torch.dtype) -> list[int]:
    """``n`` as a product of factors each exactly representable in ``dtype`` (float16: a factor
    that cannot be split further is kept rounded, relative error <= 2^-12)."""

    def exact(v: int) -> bool:
        return float(torch.tensor(float(v), dtype=dtype).item()) == float(v)

    if exact(n):
        return [n]
    factors, rest = [], n
    while rest > 1 and not exact(rest):
        p = next((p for p in range(2, math.isqrt(rest) + 1) if rest % p == 0), rest)
        chunk = p
        while rest % (chunk * p) == 0 and exact(chunk * p):
            chunk *= p
        factors.append(chunk)
        rest //= chunk
    if rest > 1:
        factors.append(rest)
    merged: list[int] = []
    for f in factors:  # greedily merge while still exact
        if merged and exact(merged[-1] * f):
            merged[-1] *= f
        else:
            merged.append(f)
    return merged


def _sum(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    s = _device_shape(x)
    is_default = op_key(node.target) is aten.sum.default
    dims = _reduce_dims(None if is_default else arg(node, 1, "dim", None), rank(x))
    keep = False if is_default else bool(arg(node, 2, "keepdim", False))
    n = math.prod(s[d] for d in dims)
    source = _reduce_input(b, node)
    if n == 1:
        _mean_value(b, x, dims, keep, out=b.out(node), vid=source)
        return
    dt = vdtype(b, source)
    vid = _mean_value(b, x, dims, keep, vid=source)
    factors = _exact_factors(n, dt)
    for i, f in enumerate(factors):
        vid = binary(b, N.MPSMul, vid, b.scalar(float(f), dt), out=b.out(node) if i == len(factors) - 1 else None)


# ---- max / min / argmax / argmin / any / all (max pooling over a [1, M, 1, R] view) ---------------


def _reduced_axes_last(b: GraphBuilder, vid: int, in_shape: list[int], dims: list[int]) -> tuple[int, list[int], list[int]]:
    """``vid`` permuted so the reduced ``dims`` come last: (value, its original shape, the kept axes)."""
    in_shape = list(in_shape) or [1]
    keep = [d for d in range(len(in_shape)) if d not in dims]
    perm = keep + list(dims)
    if perm != list(range(len(in_shape))):
        vid = permute(b, vid, perm)
    return vid, in_shape, keep


def pool_reduce(b: GraphBuilder, vid: int, in_shape: list[int], dims: list[int], negate: bool = False) -> tuple[int, int]:
    """Max (of ``-x`` if ``negate``) over ``dims`` of float value ``vid``: returns (values, int32
    indices), both of shape ``[1, M, 1, 1]`` with M = product of the kept axes in order."""
    vid, in_shape, keep = _reduced_axes_last(b, vid, in_shape, dims)
    if negate:
        vid = unary(b, N.MPSNeg, vid)
    m, n = math.prod(in_shape[d] for d in keep), math.prod(in_shape[d] for d in dims)
    vid = view(b, vid, [1, m, 1, n])
    values = b.new_value(vdtype(b, vid), [1, m, 1, 1])
    indices = b.new_value(torch.int32, [1, m, 1, 1])
    b.emit(
        N.MPSMaxPool2DWithIndices(
            input1_id=vid,
            kernel_height=1,
            kernel_width=n,
            stride_height=1,
            stride_width=n,
            padding_left=0,
            padding_right=0,
            padding_top=0,
            padding_bottom=0,
            dilation_height=1,
            dilation_width=1,
            ceil_mode=False,
            count_include_pad=False,
            divisor_override=0,
            output1_id=values,
            output2_id=indices,
        )
    )
    return values, indices


def _finish_values(b: GraphBuilder, values: int, negate: bool, out: int) -> None:
    if negate:
        values = unary(b, N.MPSNeg, values)
    view(b, values, vshape(b, out), out=out)


def _finish_indices(b: GraphBuilder, indices: int, out: int) -> None:
    view(b, convert(b, indices, torch.int64), vshape(b, out), out=out)


# ---- topk, integer max / min: ranks from pairwise comparisons -----------------------------------


def rank_select(
    b: GraphBuilder, vid: int, in_shape: list[int], dims: list[int], ranks: int | list[int], largest: bool
) -> tuple[int, int]:
    """The elements of rank ``ranks`` (a count k: ranks ``0..k-1``, the k largest / smallest) over ``dims``
    of value ``vid`` and their int64 indices (flattened over ``dims`` in row-major order), both
    ``[M, len(ranks)]`` (M = product of the kept axes, in order); exact for every dtype (module
    docstring). Equal values (NaNs among themselves too) rank by index."""
    ranks = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
    k = len(ranks)
    vid, in_shape, keep = _reduced_axes_last(b, vid, in_shape, dims)
    m, n = math.prod(in_shape[d] for d in keep), math.prod(in_shape[d] for d in dims)
    dt = vdtype(b, vid)
    fdt = b.compute_dtype(torch.float32)
    flat = view(b, vid, [m * n])
    mine, other = view(b, vid, [m, n, 1]), view(b, vid, [m, 1, n])  # element i, element j
    # beats[i, j]: j comes before i -- better, or equal (NaN counts as equal to NaN) and at a lower index
    beats = binary(b, N.MPSGt if largest else N.MPSLt, other, mine)
    tie = binary(b, N.MPSEq, other, mine)
    if dt.is_floating_point:  # NaN is the largest value (torch's topk / max / median)
        nan_i, nan_j = unary(b, N.MPSIsnan, mine, torch.bool), unary(b, N.MPSIsnan, other, torch.bool)
        better_nan = binary(b, N.MPSGt, nan_j, nan_i) if largest else binary(b, N.MPSGt, nan_i, nan_j)
        beats = binary(b, N.MPSBitwiseOr, beats, better_nan)
        tie = binary(b, N.MPSBitwiseOr, tie, binary(b, N.MPSBitwiseAnd, nan_i, nan_j))
    earlier = b.constant(torch.ones(n, n, dtype=torch.bool).tril(-1), dtype=torch.bool)  # [i, j]: j < i
    beats = binary(b, N.MPSBitwiseOr, beats, binary(b, N.MPSBitwiseAnd, tie, earlier))
    # rank_i = number of j that come before i: a mean of 0/1 flags times n, exact to within 0.5
    flags = b.cast(beats, fdt)
    mean = b.emit(N.MPSMean(input1_id=flags, num_dims=1, dims=[2], keep_dims=True, output_id=b.new_value(fdt, [m, n, 1])))
    rank_of = binary(b, N.MPSMul, view(b, mean, [m, 1, n]), b.scalar(float(n), fdt))
    wanted = b.constant(torch.tensor(ranks, dtype=torch.float32).reshape(1, k, 1), dtype=fdt)
    hit = binary(b, N.MPSLt, unary(b, N.MPSAbs, binary(b, N.MPSSub, rank_of, wanted)), b.scalar(0.5, fdt))
    # one hit per (row, rank): its position is the index of the maximum of the 0/1 flags
    _, where_hit = pool_reduce(b, b.cast(hit, fdt), [m * k, n], [1])
    index = view(b, where_hit, [m, k])
    rows = b.constant((torch.arange(m, dtype=torch.int32) * n).reshape(m, 1), dtype=torch.int32)
    picked = b.emit(
        N.MPSIndexSelect(
            input1_id=flat, dim=0, index_id=view(b, binary(b, N.MPSAdd, index, rows), [m * k]), output_id=b.new_value(dt, [m * k])
        )
    )
    return view(b, picked, [m, k]), b.cast(index, torch.int64)


def _topk_args(node: Node):
    x = node.args[0]
    k = int(arg(node, 1, "k"))
    dim = norm_dim(int(arg(node, 2, "dim", -1)), rank(x))
    return x, k, dim, bool(arg(node, 3, "largest", True)), bool(arg(node, 4, "sorted", True))


def _topk_check(node: Node):
    x, k, dim, _, is_sorted = _topk_args(node)
    if val(x).dtype == torch.bool:
        return "topk of a bool tensor"
    if not is_sorted and k > 1:
        return "topk with sorted=False: torch's order of the results is an implementation detail"
    return _rank_reason("topk", x, [dim], k)


def _topk(node: Node, b: GraphBuilder) -> None:
    x, k, dim, largest, _ = _topk_args(node)
    values, indices = rank_select(b, b.id(x), shape(x), [dim], k, largest)
    out_values, out_indices = b.outs(node)
    kept = [d for i, d in enumerate(_device_shape(x)) if i != dim]
    # [M, k] -> the kept axes and k last -> k back at position dim
    back = list(range(dim)) + [len(kept)] + list(range(dim, len(kept)))
    for vid, out in ((values, out_values), (indices, out_indices)):
        vid = view(b, vid, kept + [k])
        if back != list(range(len(back))):
            vid = permute(b, vid, back)
        view(b, vid, vshape(b, out), out=out)


def _median_check(node: Node):
    x = node.args[0]
    if val(x).dtype == torch.bool:
        return "median of a bool tensor"
    return _rank_reason("median", x, _reduce_dims(None, rank(x)))


def _median(node: Node, b: GraphBuilder) -> None:
    """torch's lower median of all elements: rank ``(n - 1) // 2`` in ascending order. With NaN the
    median is NaN (torch): NaN ranks last, so the rank ``n - 1`` element is NaN exactly when there is
    one."""
    x = node.args[0]
    dims = _reduce_dims(None, rank(x))
    n = val(x).numel()
    ranks = [(n - 1) // 2] + ([n - 1] if is_float(x) and n > 1 else [])
    values, _ = rank_select(b, b.id(x), shape(x), dims, ranks, largest=False)
    out = b.out(node)
    if len(ranks) == 2:
        median, last = slice_value(b, values, 1, 0, 1), slice_value(b, values, 1, 1, 2)
        values = b.emit(
            N.MPSWhere(
                input1_id=unary(b, N.MPSIsnan, last, torch.bool),
                input2_id=last,
                input3_id=median,
                output_id=b.new_value(vdtype(b, values), [1, 1]),
            )
        )
    view(b, values, vshape(b, out), out=out)


_NO_SORT = (
    "the device has no sort node kind (the delegate's schema has no MPSGraph sort / argSort); "
    "topk over axes of at most 512 elements is lowered (pairwise comparisons), a full sort is not"
)
#: ops the device cannot compute (registry: appended to the "no MPS lowering" reason)
NOT_LOWERED = {
    aten.sort.default: _NO_SORT,
    aten.sort.stable: _NO_SORT,
    aten.argsort.default: _NO_SORT,
    aten.argsort.stable: _NO_SORT,
}


#: target -> (what it returns, whether it reduces -x)
_MINMAX = {
    aten.amax.default: ("values", False),
    aten.amin.default: ("values", True),
    aten.max.default: ("all", False),
    aten.min.default: ("all", True),
    aten.max.dim: ("pair", False),
    aten.min.dim: ("pair", True),
    aten.argmax.default: ("index", False),
    aten.argmin.default: ("index", True),
}


def _rank_reason(what: str, x: Node, dims: list[int], k: int = 1):
    """None if ``rank_select`` can take ``x`` reduced over ``dims``, else why not."""
    s = _device_shape(x)
    n = math.prod(s[d] for d in dims)
    m = math.prod(s) // n
    if n > RANK_MAX:
        return (
            f"{what} over {n} > {RANK_MAX} elements: lowered as pairwise comparisons whose counts are "
            "exact up to that size in float16"
        )
    if m * n * n > RANK_PAIRS_MAX:
        return f"{what} of {m} rows of {n}: {m * n * n} pairwise comparisons > {RANK_PAIRS_MAX}"
    if k > n:
        return f"{what} of {k} of {n} elements"
    return None


def _minmax_check(node: Node):
    x = node.args[0]
    if is_float(x):
        return None
    if val(x).dtype == torch.bool:
        return "max/min of a bool tensor"
    kind, _ = _MINMAX[op_key(node.target)]
    dims = _reduce_dims(None if kind == "all" else arg(node, 1, "dim", None), rank(x))
    reason = _rank_reason(f"max/min of a {val(x).dtype} tensor", x, dims)
    if reason:
        return reason + " (the device max-pools floats only; a float detour is inexact for large integers)"
    return None


def _minmax(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    kind, negate = _MINMAX[op_key(node.target)]
    dims = _reduce_dims(None if kind == "all" else arg(node, 1, "dim", None), rank(x))
    if not is_float(x):  # integers: pairwise comparisons (exact; first index among equal values)
        values, indices = rank_select(b, b.id(x), shape(x), dims, 1, largest=not negate)
        negate = False
    else:
        values, indices = pool_reduce(b, b.id(x), shape(x), dims, negate)
    if kind in ("values", "all"):
        _finish_values(b, values, negate, b.out(node))
    elif kind == "index":
        _finish_indices(b, indices, b.out(node))
    else:
        outs = b.outs(node)
        _finish_values(b, values, negate, outs[0])
        if any(u.target is operator.getitem and u.args[1] == 1 and u.users for u in node.users):
            _finish_indices(b, indices, outs[1])


def _any(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    target = op_key(node.target)
    dim = None if target is aten.any.default else arg(node, 1, "dim", None)
    dt = b.dtype(x)
    vid = b.id(x)
    if target is aten.any.dims and dim is not None and len(dim) == 0:  # any.dims(x, []) reduces nothing
        if dt == torch.bool:
            b.alias(node, vid)
        else:
            binary(b, N.MPSNe, vid, b.scalar(0, dt), out=b.out(node))
        return
    dims = _reduce_dims(dim, rank(x))
    if dt != torch.bool:
        vid = binary(b, N.MPSNe, vid, b.scalar(0, dt))
    fdt = b.compute_dtype(torch.float32)
    flags = b.cast(vid, fdt)
    out = b.out(node)
    if math.prod(_device_shape(x)[d] for d in dims) <= ANY_MEAN_MAX[fdt]:
        keep = target is not aten.any.default and bool(arg(node, 2, "keepdim", False))
        frac = b.emit(
            N.MPSMean(input1_id=flags, num_dims=len(dims), dims=dims, keep_dims=keep, output_id=b.new_value(fdt, vshape(b, out)))
        )
        binary(b, N.MPSGt, frac, b.scalar(0.0, fdt), out=out)
        return
    values, _ = pool_reduce(b, flags, shape(x), dims)
    hit = binary(b, N.MPSGt, values, b.scalar(0.0, fdt))
    view(b, hit, vshape(b, out), out=out)


# ---- prod ------------------------------------------------------------------------------------------


def _prod(node: Node, b: GraphBuilder) -> None:
    """Pairwise products: the reduced axes (permuted last) viewed as ``[M, N]``, the two halves
    multiplied until one column is left (an odd column count is padded with a column of ones)."""
    x = node.args[0]
    dt = b.dtype(node)  # torch: integers and bool multiply as int64
    vid = convert(b, b.id(x), dt)
    s = _device_shape(x)
    dims = _reduce_dims(None if op_key(node.target) is aten.prod.default else [arg(node, 1, "dim")], rank(x))
    keep = [d for d in range(len(s)) if d not in dims]
    if keep + dims != list(range(len(s))):
        vid = permute(b, vid, keep + dims)
    m, n = math.prod(s[d] for d in keep), math.prod(s[d] for d in dims)
    vid = view(b, vid, [m, n])
    while n > 1:
        if n % 2:
            ones = b.memo(("prod ones", m, dt), lambda: b.constant(torch.ones(m, 1, dtype=dt), dtype=dt))
            vid = cat_values(b, [vid, ones], 1)
            n += 1
        vid = binary(b, N.MPSMul, slice_value(b, vid, 1, 0, n // 2), slice_value(b, vid, 1, n // 2, n))
        n //= 2
    out = b.out(node)
    view(b, vid, vshape(b, out), out=out)


# ---- cumsum / var ---------------------------------------------------------------------------------


def _cumsum_check(node: Node):
    reason = _float_check("cumsum")(node)
    if reason:
        return reason
    x = node.args[0]
    if rank(x) == 0:
        return None
    n = shape(x)[norm_dim(arg(node, 1, "dim"), rank(x))]
    if n > CUMSUM_MAX:
        return f"cumsum over an axis of size {n} > {CUMSUM_MAX}: lowered as a matmul with an n x n triangular constant, too large"
    return None


def _cumsum(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    if rank(x) == 0:
        b.alias(node, b.id(x))
        return
    s = shape(x)
    d = norm_dim(arg(node, 1, "dim"), rank(x))
    a, n, c = math.prod(s[:d]), s[d], math.prod(s[d + 1 :])
    xv = view(b, b.id(x), [a, n, c] if a > 1 else [n, c])
    tri = b.constant(torch.tril(torch.ones(n, n, dtype=torch.float32)), dtype=b.dtype(x))
    out3 = b.new_value(b.dtype(x), vshape(b, xv))
    b.emit(N.MPSMatMul(input1_id=tri, input2_id=xv, output_id=out3))
    view(b, out3, s, out=b.out(node))


def _correction(node: Node) -> float:
    c = node.kwargs.get("correction")
    return 1.0 if c is None else float(c)


def _var_dims(node: Node) -> list[int]:
    return _reduce_dims(arg(node, 1, "dim", None), rank(node.args[0]))


def _var_check(node: Node):
    reason = _float_check("var")(node)
    if reason:
        return reason
    n = math.prod(_device_shape(node.args[0])[d] for d in _var_dims(node))
    if n - _correction(node) <= 0:
        return f"var with correction {_correction(node)} over {n} elements (torch divides by zero)"
    return None


def _var(node: Node, b: GraphBuilder) -> None:
    x = node.args[0]
    dims = _var_dims(node)
    keep = bool(node.kwargs.get("keepdim", False))
    n = math.prod(_device_shape(x)[d] for d in dims)
    c = _correction(node)
    dt = b.dtype(x)
    mean = _mean_value(b, x, dims, True)
    dev = binary(b, N.MPSSub, b.id(x), mean)
    sq = binary(b, N.MPSMul, dev, dev)
    s = _device_shape(x)
    out_shape = [1 if i in dims else d for i, d in enumerate(s)] if keep else [d for i, d in enumerate(s) if i not in dims]
    last = c == 0
    msq = b.out(node) if last else b.new_value(dt, out_shape)
    b.emit(N.MPSMean(input1_id=sq, output_id=msq, num_dims=len(dims), dims=dims, keep_dims=keep))
    if not last:
        binary(b, N.MPSMul, msq, b.scalar(n / (n - c), dt), out=b.out(node))


LOWERINGS = [
    Lowering((aten.mean.dim, aten.mean.default), _mean, _accumulate_check("mean")),
    Lowering((aten.sum.dim_IntList, aten.sum.default), _sum, _accumulate_check("sum")),
    Lowering(
        (aten.amax.default, aten.amin.default, aten.max.default, aten.min.default, aten.argmax.default, aten.argmin.default),
        _minmax,
        _minmax_check,
    ),
    Lowering((aten.max.dim, aten.min.dim), _minmax, _minmax_check),
    Lowering((aten.topk.default,), _topk, _topk_check),
    Lowering((aten.prod.default, aten.prod.dim_int), _prod),
    Lowering((aten.median.default,), _median, _median_check),
    Lowering((aten.any.dim, aten.any.dims, aten.any.default), _any),
    Lowering((aten.cumsum.default,), _cumsum, _cumsum_check),
    Lowering((aten.var.correction,), _var, _var_check),
]
