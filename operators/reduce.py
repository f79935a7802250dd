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
Integer inputs of mean/sum/max/min/cumsum/var stay on CPU (the device pools/averages floats and a
float detour is inexact for large integers); ``any`` takes every dtype.
"""
from __future__ import annotations

import math
import operator

import torch
from torch.fx import Node

from ._util import arg, is_float, norm_dim, rank, shape, val
from .registry import Lowering, op_key
from .shape import binary, permute, unary, vdtype, view, vshape

aten = torch.ops.aten

#: largest reduction ``any`` lowers as a mean of 0/1 flags (1/n stays a normal number), per compute dtype
ANY_MEAN_MAX = {torch.float32: 2 ** 24, torch.float16: 2 ** 14}
#: largest axis cumsum lowers: the triangular constant has n*n elements
CUMSUM_MAX = 512


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
            return (f"{what} of a {val(node.args[0]).dtype} tensor: the device reduces floats only and a "
                    "float detour is inexact for large integers")
        dtype = node.kwargs.get("dtype")
        if dtype is not None and dtype != val(node.args[0]).dtype:
            return f"{what} with dtype={dtype} (accumulation dtype change)"
        return None
    return check


# ---- mean / sum -----------------------------------------------------------------------------------

def _mean_value(b, x: Node, dims: list[int], keep: bool, out: int | None = None) -> int:
    if out is None:
        s = _device_shape(x)
        s = [1 if i in dims else d for i, d in enumerate(s)] if keep else [d for i, d in enumerate(s)
                                                                          if i not in dims]
        out = b.new_value(b.dtype(x), s)
    b.emit("MPSMean", input1_id=b.id(x), output_id=out, num_dims=len(dims), dims=dims, keep_dims=keep)
    return out


def _mean(node: Node, b) -> None:
    x = node.args[0]
    dims = _reduce_dims(arg(node, 1, "dim", None), rank(x))
    _mean_value(b, x, dims, bool(arg(node, 2, "keepdim", False)), out=b.out(node))


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


def _sum(node: Node, b) -> None:
    x = node.args[0]
    s = _device_shape(x)
    is_default = op_key(node.target) is aten.sum.default
    dims = _reduce_dims(None if is_default else arg(node, 1, "dim", None), rank(x))
    keep = False if is_default else bool(arg(node, 2, "keepdim", False))
    n = math.prod(s[d] for d in dims)
    if n == 1:
        _mean_value(b, x, dims, keep, out=b.out(node))
        return
    dt = b.dtype(x)
    vid = _mean_value(b, x, dims, keep)
    factors = _exact_factors(n, dt)
    for i, f in enumerate(factors):
        vid = binary(b, "MPSMul", vid, b.scalar(float(f), dt), out=b.out(node) if i == len(factors) - 1 else None)


# ---- max / min / argmax / argmin / any / all (max pooling over a [1, M, 1, R] view) ---------------

def pool_reduce(b, vid: int, in_shape: list[int], dims: list[int], negate: bool = False) -> tuple[int, int]:
    """Max (of ``-x`` if ``negate``) over ``dims`` of float value ``vid``: returns (values, int32
    indices), both of shape ``[1, M, 1, 1]`` with M = product of the kept axes in order."""
    in_shape = list(in_shape) or [1]
    r = len(in_shape)
    keep = [d for d in range(r) if d not in dims]
    perm = keep + list(dims)
    if perm != list(range(r)):
        vid = permute(b, vid, perm)
    if negate:
        vid = unary(b, "MPSNeg", vid)
    m, n = math.prod(in_shape[d] for d in keep), math.prod(in_shape[d] for d in dims)
    vid = view(b, vid, [1, m, 1, n])
    values = b.new_value(vdtype(b, vid), [1, m, 1, 1])
    indices = b.new_value(torch.int32, [1, m, 1, 1])
    b.emit("MPSMaxPool2DWithIndices", input1_id=vid, kernel_height=1, kernel_width=n, stride_height=1,
           stride_width=n, padding_left=0, padding_right=0, padding_top=0, padding_bottom=0,
           dilation_height=1, dilation_width=1, ceil_mode=False, count_include_pad=False,
           divisor_override=0, output1_id=values, output2_id=indices)
    return values, indices


def _finish_values(b, values: int, negate: bool, out: int) -> None:
    if negate:
        values = unary(b, "MPSNeg", values)
    view(b, values, vshape(b, out), out=out)


def _finish_indices(b, indices: int, out: int) -> None:
    view(b, b.cast(indices, torch.int64), vshape(b, out), out=out)


#: target -> (what it returns, whether it reduces -x)
_MINMAX = {
    aten.amax.default: ("values", False), aten.amin.default: ("values", True),
    aten.max.default: ("all", False), aten.min.default: ("all", True),
    aten.max.dim: ("pair", False), aten.min.dim: ("pair", True),
    aten.argmax.default: ("index", False), aten.argmin.default: ("index", True),
}


def _minmax_check(node: Node):
    if not is_float(node.args[0]):
        return (f"max/min of a {val(node.args[0]).dtype} tensor: the device max-pools floats only and a "
                "float detour is inexact for large integers")
    return None


def _minmax(node: Node, b) -> None:
    x = node.args[0]
    kind, negate = _MINMAX[op_key(node.target)]
    dims = _reduce_dims(None if kind == "all" else arg(node, 1, "dim", None), rank(x))
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


def _any(node: Node, b) -> None:
    x = node.args[0]
    target = op_key(node.target)
    dim = None if target is aten.any.default else arg(node, 1, "dim", None)
    dt = b.dtype(x)
    vid = b.id(x)
    if target is aten.any.dims and dim is not None and len(dim) == 0:  # any.dims(x, []) reduces nothing
        if dt == torch.bool:
            b.alias(node, vid)
        else:
            binary(b, "MPSNe", vid, b.scalar(0, dt), out=b.out(node))
        return
    dims = _reduce_dims(dim, rank(x))
    if dt != torch.bool:
        vid = binary(b, "MPSNe", vid, b.scalar(0, dt))
    fdt = b.compute_dtype(torch.float32)
    flags = b.cast(vid, fdt)
    out = b.out(node)
    if math.prod(_device_shape(x)[d] for d in dims) <= ANY_MEAN_MAX[fdt]:
        keep = target is not aten.any.default and bool(arg(node, 2, "keepdim", False))
        frac = b.emit_value("MPSMean", fdt, vshape(b, out), input1_id=flags, num_dims=len(dims), dims=dims,
                            keep_dims=keep)
        binary(b, "MPSGt", frac, b.scalar(0.0, fdt), out=out)
        return
    values, _ = pool_reduce(b, flags, shape(x), dims)
    hit = binary(b, "MPSGt", values, b.scalar(0.0, fdt))
    view(b, hit, vshape(b, out), out=out)


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
        return (f"cumsum over an axis of size {n} > {CUMSUM_MAX}: lowered as a matmul with an n x n "
                "triangular constant, too large")
    return None


def _cumsum(node: Node, b) -> None:
    x = node.args[0]
    if rank(x) == 0:
        b.alias(node, b.id(x))
        return
    s = shape(x)
    d = norm_dim(arg(node, 1, "dim"), rank(x))
    a, n, c = math.prod(s[:d]), s[d], math.prod(s[d + 1:])
    xv = view(b, b.id(x), [a, n, c] if a > 1 else [n, c])
    tri = b.constant(torch.tril(torch.ones(n, n, dtype=torch.float32)), dtype=b.dtype(x))
    out3 = b.new_value(b.dtype(x), vshape(b, xv))
    b.emit("MPSMatMul", input1_id=tri, input2_id=xv, output_id=out3)
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


def _var(node: Node, b) -> None:
    x = node.args[0]
    dims = _var_dims(node)
    keep = bool(node.kwargs.get("keepdim", False))
    n = math.prod(_device_shape(x)[d] for d in dims)
    c = _correction(node)
    dt = b.dtype(x)
    mean = _mean_value(b, x, dims, True)
    dev = binary(b, "MPSSub", b.id(x), mean)
    sq = binary(b, "MPSMul", dev, dev)
    s = _device_shape(x)
    out_shape = [1 if i in dims else d for i, d in enumerate(s)] if keep else [d for i, d in enumerate(s)
                                                                               if i not in dims]
    last = c == 0
    msq = b.out(node) if last else b.new_value(dt, out_shape)
    b.emit("MPSMean", input1_id=sq, output_id=msq, num_dims=len(dims), dims=dims, keep_dims=keep)
    if not last:
        binary(b, "MPSMul", msq, b.scalar(n / (n - c), dt), out=b.out(node))


LOWERINGS = [
    Lowering((aten.mean.dim, aten.mean.default), _mean, _float_check("mean")),
    Lowering((aten.sum.dim_IntList, aten.sum.default), _sum, _float_check("sum")),
    Lowering((aten.amax.default, aten.amin.default, aten.max.default, aten.min.default,
              aten.argmax.default, aten.argmin.default), _minmax, _minmax_check),
    Lowering((aten.max.dim, aten.min.dim), _minmax, _minmax_check),
    Lowering((aten.any.dim, aten.any.dims, aten.any.default), _any),
    Lowering((aten.cumsum.default,), _cumsum, _cumsum_check),
    Lowering((aten.var.correction,), _var, _var_check),
]
