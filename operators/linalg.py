"""Linear algebra: mm, bmm -> MPSMatMul; addmm -> MPSAddmm with alpha and beta read; linear kept whole.

- ``addmm``: ``beta``/``alpha`` are keyword-only in ATen and are always read and written (the
  upstream lowering never read them). ``beta == 0`` is a plain product (torch ignores the bias then,
  NaN/inf included, while the device would compute ``0 * bias``), ``alpha != 1`` a scalar multiply.
- ``linear`` (``preserve``): ``x @ w.T (+ bias)``. A constant weight whose only readers are linear
  nodes is stored transposed, in place of the original (the blob holds one copy). Any other weight
  (a dequantized int4/int8 weight, a head tied to the embedding table, a computed weight) larger than
  the input and output together is read untransposed as the left operand, ``(W @ x.T).T``, so only
  activation-sized values are permuted (a decode step permutes one row, not the weight); otherwise the
  device transposes the weight (MPSPermute). An input of rank >= 2 with a bias is one MPSAddmm (its product is
  MPSGraph's broadcasting matmul, like MPSMatMul: ``[..., K] @ [K, N]``); without a bias one MPSMatMul;
  a rank-1 input is viewed as ``[1, K]`` and back.
"""

from __future__ import annotations

import math

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.passes._graph import is_call
from mps_backend.serialization.generated import nodes as N

from ._util import is_float, rank, shape, val
from .emit import binary, permute, view
from .registry import Lowering

aten = torch.ops.aten


def _float_same(node: Node):
    dts = {val(a).dtype for a in node.args if isinstance(a, Node)}
    if not all(d.is_floating_point for d in dts):
        return "integer matrix multiplication (MPSGraph matmul is float-only here)"
    if len(dts) != 1:
        return f"mixed operand dtypes {sorted(map(str, dts))}; MPSGraph matmul does not promote"
    return None


def _matmul(node: Node, b: GraphBuilder) -> None:
    b.emit(N.MPSMatMul(input1_id=b.id(node.args[0]), input2_id=b.id(node.args[1]), output_id=b.out(node)))


def _addmm_check(node: Node):
    reason = _float_same(node)
    if reason:
        return reason
    if not isinstance(node.args[0], Node):
        return "addmm with a non-tensor bias"
    return None if is_float(node) else "integer addmm"


def _addmm(node: Node, b: GraphBuilder) -> None:
    bias, m1, m2 = (b.id(a) for a in node.args[:3])
    beta, alpha = float(node.kwargs.get("beta", 1)), float(node.kwargs.get("alpha", 1))
    if beta == 0:  # torch ignores the bias entirely (no 0 * inf = nan)
        if alpha == 1:
            b.emit(N.MPSMatMul(input1_id=m1, input2_id=m2, output_id=b.out(node)))
            return
        p = b.new_value(b.dtype(node), shape(node))
        b.emit(N.MPSMatMul(input1_id=m1, input2_id=m2, output_id=p))
        binary(b, N.MPSMul, p, b.scalar(alpha, b.dtype(node)), out=b.out(node))
        return
    b.emit(N.MPSAddmm(input1_id=bias, input2_id=m1, input3_id=m2, output_id=b.out(node), beta=beta, alpha=alpha))


# ---- linear ---------------------------------------------------------------------------------------


def _linear_check(node: Node):
    x, w = node.args[:2]
    reason = _float_same(node)
    if reason:
        return reason
    if rank(w) != 2:
        return f"linear weight of rank {rank(w)}"
    if rank(x) == 0:
        return "linear of a rank-0 input"
    return None


def _weight_t(b: GraphBuilder, w: Node) -> int:
    """Value id of ``w.T`` (an MPSPermute; for a constant weight read only by linears the pass
    ``mps_backend.passes.linear_weights`` made ``w`` a permute of the transposed constant, and
    ``simplify`` cancels the two permutes)."""
    return permute(b, b.id(w), [1, 0])


def _weight_prepared(w: Node) -> bool:
    """``w`` is the ``permute(W.T)`` that ``linear_weights`` made of a stored-transposed constant."""
    return is_call(w, aten.permute_copy.default)


def _linear_weight_left(node: Node, b: GraphBuilder) -> None:
    """``(W @ x.T).T``: the weight is read untransposed, as the left operand; only activation-sized
    values are permuted (a decode step's one row), never a dequantized weight or a tied table."""
    x, w = node.args[:2]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    xs, out_shape = shape(x), shape(node)
    n_out = shape(w)[0]
    dt = b.dtype(node)
    if rank(x) == 1:  # x as a column: no permute at all
        col = view(b, b.id(x), [xs[0], 1])
        mm = b.new_value(dt, [n_out, 1])
        b.emit(N.MPSMatMul(input1_id=b.id(w), input2_id=col, output_id=mm))
        res = view(b, mm, [n_out], out=None if bias is not None else b.out(node))
        if bias is not None:
            binary(b, N.MPSAdd, res, b.id(bias), out=b.out(node))
        return
    rows = math.prod(xs[:-1])
    x2 = b.id(x) if rank(x) == 2 else view(b, b.id(x), [rows, xs[-1]])
    xt = permute(b, x2, [1, 0])
    mm = b.new_value(dt, [n_out, rows])
    b.emit(N.MPSMatMul(input1_id=b.id(w), input2_id=xt, output_id=mm))
    flat = rank(x) == 2 and bias is None
    res = permute(b, mm, [1, 0], out=b.out(node) if flat else None)
    if flat:
        return
    if bias is not None:
        res = binary(b, N.MPSAdd, res, b.id(bias), out=b.out(node) if rank(x) == 2 else None)
    if rank(x) > 2:
        view(b, res, out_shape, out=b.out(node))


def _linear(node: Node, b: GraphBuilder) -> None:
    x, w = node.args[:2]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    if not _weight_prepared(w) and math.prod(shape(x)) + math.prod(shape(node)) < math.prod(shape(w)):
        _linear_weight_left(node, b)
        return
    wt = _weight_t(b, w)
    if bias is not None and rank(x) >= 2:
        b.emit(N.MPSAddmm(input1_id=b.id(bias), input2_id=b.id(x), input3_id=wt, output_id=b.out(node), beta=1.0, alpha=1.0))
        return
    xid = b.id(x) if rank(x) > 1 else view(b, b.id(x), [1, shape(x)[0]])
    out_shape = shape(node)
    mm_shape = out_shape if rank(x) > 1 else [1, out_shape[0]]
    last = bias is None and rank(x) > 1
    mm = b.out(node) if last else b.new_value(b.dtype(node), mm_shape)
    b.emit(N.MPSMatMul(input1_id=xid, input2_id=wt, output_id=mm))
    if last:
        return
    if bias is not None:
        mm = binary(b, N.MPSAdd, mm, b.id(bias), out=b.out(node) if rank(x) > 1 else None)
    if rank(x) == 1:
        view(b, mm, out_shape, out=b.out(node))


LOWERINGS = [
    Lowering((aten.mm.default, aten.bmm.default), _matmul, _float_same),
    Lowering((aten.addmm.default,), _addmm, _addmm_check),
    Lowering((aten.linear.default,), _linear, _linear_check, preserve=True),
]
