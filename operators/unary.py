"""Unary math: one MPS member each where the device computes torch's result, decompositions
where it does not (semantics §5.5, §6), plus the elementwise emission helpers shared by the
elementwise families (binary, clamp, activation, constant).

Rules applied here:
* float-valued functions (exp, log, trig, erf, sigmoid, sqrt, ...) of integer/bool tensors: the
  device keeps the integer dtype, torch returns float — the input is cast to the result dtype first.
* floor / ceil / trunc / round of integers are identities (no MPSFloor on integers: the runtime
  cites a missing ``floorOp_i64`` kernel).
* ``round``: the device's MPSRound rounds ties away from zero (§6 #30), torch rounds half to even.
  Non-ties are taken from MPSRound (any round-to-nearest agrees there); ties (``x - floor(x) ==
  0.5``, exact in binary floats) become the even neighbour ``2 * (e - floor(e / 2))`` with
  ``e = floor(x)`` — every step exact, whatever the device does on ties.
* ``trunc`` has no member: ``where(x < 0, ceil(x), floor(x))``.
* ``round(x, decimals=d)``: torch's own formula, ``round(x * 10^d) / 10^d`` (``d < 0``: ``round(x / 10^-d) *
  10^-d``) with ``10^|d|`` rounded to the compute dtype once and the half-to-even rounding above: the
  same operations as torch's CPU kernel, so the same float32 result.
* ``isnan`` / ``isinf`` of integers: constant False (MPSFullLike).
* ``log1p`` has no member and ``log(1 + x)`` loses everything below ``|x| ~ ulp(1)`` (``1 + x`` rounds
  to 1). For ``|x| < 0.5``: ``log1p(x) = 2 * atanh(x / (2 + x))`` (exact identity: ``(1 + s) / (1 - s) =
  1 + x`` for ``s = x / (2 + x)``), where ``|s| < 1/3`` and every step keeps its relative accuracy (one
  rounding each for ``2 + x`` and the quotient, MPSAtanh, an exact doubling); elsewhere ``log(1 + x)``
  (``1 + x`` is exact for ``x`` in ``[-1, -0.5]``, and for ``x >= 0.5`` the log is >= 0.4, so the rounding
  of ``1 + x`` costs at most ~2 ulp). Special values come out as torch's: ``log1p(-1) = -inf``, ``x < -1``
  NaN, ``+inf``, ``-0``. Measured against eager (device model, 2e5 points over ``[-1, 1e4]`` and
  ``±[1e-30, 1e-3]``): max relative error 2.3e-7 (fp32, ~2 ulp) and 1.3e-3 (fp16 against the float32
  result, for results in float16's normal range; float16 itself rounds by up to 4.9e-4). ``log(1 + x)``
  would be off by 100 % below ``|x| = 6e-8`` (fp32) / ``5e-4`` (fp16).
* ``expm1`` has no member and ``exp(x) - 1`` loses the relative accuracy near 0. For ``x <= 0.5``:
  ``expm1(x) = 2 t / (1 - t)`` with ``t = tanh(x / 2)`` (exact identity; ``1 - t`` is in ``(0.75, 2)``, no
  cancellation; ``-inf`` gives ``-1``, ``-0`` gives ``-0``); above, ``exp(x) - 1`` (>= 0.65, accurate).
  Measured like log1p over ``[-100, 80]`` and ``±[1e-30, 1e-3]``: max relative error 1.6e-7 (fp32), 1.3e-3
  (fp16, normal range).
* ``logical_not`` of a non-bool tensor: ``x == 0`` (the device applies logical NOT without a cast
  to bool, §5.5); bool: MPSLogicalNot.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.dtypes import FLOAT_DTYPES
from mps_backend.serialization.generated import nodes as N

from ._util import val
from .emit import Unary, binary, compare, const, convert, finish, full_like, unary, vdtype, where
from .registry import Lowering

aten = torch.ops.aten


# ---------------------------------------------------------------------------------------------
# emission helpers (value ids in, value ids out; every intermediate is a fresh value)


def isnan(b: GraphBuilder, x: int) -> int:
    if vdtype(b, x) in FLOAT_DTYPES:
        return unary(b, N.MPSIsnan, x, torch.bool)
    return full_like(b, x, 0.0, torch.bool)


def trunc(b: GraphBuilder, x: int) -> int:
    """Round toward zero (float x): ``where(x < 0, ceil(x), floor(x))`` — no MPSDiv 'trunc', which
    aborts on f16 (§6 #14)."""
    neg = compare(b, N.MPSLt, x, const(b, 0, vdtype(b, x)))
    return where(b, neg, unary(b, N.MPSCeil, x), unary(b, N.MPSFloor, x))


def round_half_even(b: GraphBuilder, x: int) -> int:
    """torch.round of a float tensor (see the module docstring)."""
    dt = vdtype(b, x)
    nearest = unary(b, N.MPSRound, x)
    e = unary(b, N.MPSFloor, x)
    # x - floor(x) is exact except for x in (-0.5, 0), where 1 - |x| may round up, onto 0.5 only
    # for x = -(0.5 - ulp/2), whose tie answer 2 * (-1 - floor(-0.5)) = 0 is right anyway
    frac = binary(b, N.MPSSub, x, e)
    half = unary(b, N.MPSFloor, binary(b, N.MPSMul, e, const(b, 0.5, dt)))
    even = binary(b, N.MPSMul, binary(b, N.MPSSub, e, half), const(b, 2, dt))
    tie = compare(b, N.MPSEq, frac, const(b, 0.5, dt))
    return where(b, tie, even, nearest)


def log1p(b: GraphBuilder, x: int) -> int:
    """``log(1 + x)`` of a float value, accurate near 0 (module docstring)."""
    dt = vdtype(b, x)
    s = binary(b, N.MPSDiv, x, binary(b, N.MPSAdd, const(b, 2.0, dt), x))
    a = unary(b, N.MPSAtanh, s)
    near0 = binary(b, N.MPSAdd, a, a)  # 2 * atanh(s), exact
    far = unary(b, N.MPSLog, binary(b, N.MPSAdd, const(b, 1.0, dt), x))
    small = compare(b, N.MPSLt, unary(b, N.MPSAbs, x), const(b, 0.5, dt))
    return where(b, small, near0, far)


def expm1(b: GraphBuilder, x: int) -> int:
    """``exp(x) - 1`` of a float value, accurate near 0 (module docstring)."""
    dt = vdtype(b, x)
    near0 = expm1_nonpositive(b, x)
    far = binary(b, N.MPSSub, unary(b, N.MPSExp, x), const(b, 1.0, dt))
    return where(b, compare(b, N.MPSGt, x, const(b, 0.5, dt)), far, near0)


def expm1_nonpositive(b: GraphBuilder, x: int) -> int:
    """``2 t / (1 - t)``, ``t = tanh(x / 2)``: expm1 for ``x <= 0.5`` (inaccurate far above)."""
    dt = vdtype(b, x)
    t = unary(b, N.MPSTanh, binary(b, N.MPSMul, x, const(b, 0.5, dt)))
    return binary(b, N.MPSDiv, binary(b, N.MPSAdd, t, t), binary(b, N.MPSSub, const(b, 1.0, dt), t))


def minimum(b: GraphBuilder, x: int, y: int) -> int:
    """torch.minimum of two values of one dtype: MPSMinimum does not propagate NaN (§5.2)."""
    dt = vdtype(b, x)
    if dt == torch.bool:
        return binary(b, N.MPSBitwiseAnd, x, y)
    m = binary(b, N.MPSMinimum, x, y)
    if dt not in FLOAT_DTYPES:
        return m
    return where(b, isnan(b, y), y, where(b, isnan(b, x), x, m))


def maximum(b: GraphBuilder, x: int, y: int) -> int:
    """torch.maximum of two values of one dtype. There is no MPSMax: ``where(x < y, y, x)`` (which
    keeps a NaN x), then a NaN y is propagated. Exact, also for integers (no negation overflow)."""
    dt = vdtype(b, x)
    if dt == torch.bool:
        return binary(b, N.MPSBitwiseOr, x, y)
    m = where(b, compare(b, N.MPSLt, x, y), y, x)
    if dt not in FLOAT_DTYPES:
        return m
    return where(b, isnan(b, y), y, m)


def out_shape(node: Node) -> list[int]:
    return [int(d) for d in val(node).shape]


# ---------------------------------------------------------------------------------------------
# lowerings

FLOAT_MATH = {
    aten.exp.default: N.MPSExp,
    aten.exp2.default: N.MPSExp2,
    aten.reciprocal.default: N.MPSReciprocal,
    aten.sqrt.default: N.MPSSqrt,
    aten.rsqrt.default: N.MPSRsqrt,
    aten.log.default: N.MPSLog,
    aten.log10.default: N.MPSLog10,
    aten.log2.default: N.MPSLog2,
    aten.erf.default: N.MPSErf,
    aten.sigmoid.default: N.MPSSigmoid,
    aten.sin.default: N.MPSSin,
    aten.cos.default: N.MPSCos,
    aten.tan.default: N.MPSTan,
    aten.asin.default: N.MPSAsin,
    aten.acos.default: N.MPSAcos,
    aten.atan.default: N.MPSAtan,
    aten.sinh.default: N.MPSSinh,
    aten.cosh.default: N.MPSCosh,
    aten.tanh.default: N.MPSTanh,
    aten.asinh.default: N.MPSAsinh,
    aten.acosh.default: N.MPSAcosh,
    aten.atanh.default: N.MPSAtanh,
}
SAME_DTYPE = {aten.neg.default: N.MPSNeg, aten.abs.default: N.MPSAbs, aten.sign.default: N.MPSSign}


def _float_result(node: Node):
    if not val(node).dtype.is_floating_point:
        return f"{val(node).dtype} result of a float-valued function"
    return None


def _float_math(op: Unary):
    def lower(node: Node, b: GraphBuilder) -> None:
        x = convert(b, b.id(node.args[0]), b.dtype(node))  # integer inputs: cast to float first
        b.emit(op(input1_id=x, output_id=b.out(node)))

    return lower


def _float_formula(fn):
    """A float-valued function written with several members (integer inputs cast first)."""

    def lower(node: Node, b: GraphBuilder) -> None:
        finish(b, node, fn(b, convert(b, b.id(node.args[0]), b.dtype(node))))

    return lower


def _not_bool(node: Node):
    if val(node.args[0]).dtype == torch.bool:
        return "bool input (torch has no numeric result for it; the device op is unverified on Bool)"
    return None


def _same_dtype(op: Unary):
    def lower(node: Node, b: GraphBuilder) -> None:
        b.emit(op(input1_id=b.id(node.args[0]), output_id=b.out(node)))

    return lower


def _rounding(kind: str):
    def lower(node: Node, b: GraphBuilder) -> None:
        x = b.id(node.args[0])
        if vdtype(b, x) not in FLOAT_DTYPES:  # integers are already integral
            b.alias(node, x)
            return
        if kind in ("floor", "ceil"):
            # fp16 mode on a float32 user input: one node on the float32 value (rounding it to float16
            # first would move -1.0001 to -1.0 and floor it to -1), its integral result cast to float16.
            # (trunc and round are several nodes with float16 constants: they stay in float16.)
            exact = b.float32_input(node.args[0])
            src = exact if exact is not None else x
            out = b.new_value(vdtype(b, src), b.graph.values[src].dims)
            b.emit((N.MPSFloor if kind == "floor" else N.MPSCeil)(input1_id=src, output_id=out))
            b.alias(node, out if exact is None else b.cast(out, b.dtype(node)))
        else:
            b.alias(node, trunc(b, x) if kind == "trunc" else round_half_even(b, x))

    return lower


def _round_decimals(node: Node, b: GraphBuilder) -> None:
    x = b.id(node.args[0])
    d = int(node.kwargs.get("decimals", node.args[1] if len(node.args) > 1 else 0))
    dt = vdtype(b, x)
    if d == 0:
        b.alias(node, round_half_even(b, x))
        return
    scale = const(b, 10.0 ** abs(d), dt)
    if d > 0:
        finish(b, node, binary(b, N.MPSDiv, round_half_even(b, binary(b, N.MPSMul, x, scale)), scale))
    else:
        finish(b, node, binary(b, N.MPSMul, round_half_even(b, binary(b, N.MPSDiv, x, scale)), scale))


def _round_decimals_check(node: Node):
    if not val(node.args[0]).dtype.is_floating_point:
        return f"round with decimals of a {val(node.args[0]).dtype} tensor"
    return None


def _predicate(op: Unary):
    def lower(node: Node, b: GraphBuilder) -> None:
        x = b.id(node.args[0])
        if vdtype(b, x) in FLOAT_DTYPES:
            b.emit(op(input1_id=x, output_id=b.out(node)))
        else:  # integers are never NaN or infinite
            b.alias(node, full_like(b, x, 0.0, torch.bool))

    return lower


def _int_or_bool(node: Node):
    dt = val(node.args[0]).dtype
    if dt.is_floating_point:
        return f"bitwise op on a {dt} tensor"
    return None


def _bitwise_not(node: Node, b: GraphBuilder) -> None:
    b.emit(N.MPSBitwiseNot(input1_id=b.id(node.args[0]), output_id=b.out(node)))


def _logical_not(node: Node, b: GraphBuilder) -> None:
    x = b.id(node.args[0])
    if vdtype(b, x) == torch.bool:
        b.emit(N.MPSLogicalNot(input1_id=x, output_id=b.out(node)))
    else:
        b.alias(node, compare(b, N.MPSEq, x, const(b, 0, vdtype(b, x))))


LOWERINGS = [
    # exp2 is not core ATen: it reaches the partitioner only with EdgeCompileConfig(
    # _core_aten_ops_exception_list=[aten.exp2.default]) (``preserve`` cannot keep an op that no
    # decomposition removes)
    *(Lowering((t,), _float_math(op), _float_result) for t, op in FLOAT_MATH.items()),
    *(Lowering((t,), _same_dtype(op), _not_bool) for t, op in SAME_DTYPE.items()),
    Lowering((aten.log1p.default,), _float_formula(log1p), _float_result),
    Lowering((aten.expm1.default,), _float_formula(expm1), _float_result),
    Lowering((aten.floor.default,), _rounding("floor"), _not_bool),
    Lowering((aten.ceil.default,), _rounding("ceil"), _not_bool),
    Lowering((aten.trunc.default,), _rounding("trunc"), _not_bool),
    Lowering((aten.round.default,), _rounding("round"), _not_bool),
    Lowering((aten.round.decimals,), _round_decimals, _round_decimals_check),
    Lowering((aten.isnan.default,), _predicate(N.MPSIsnan)),
    Lowering((aten.isinf.default,), _predicate(N.MPSIsinf)),
    Lowering((aten.bitwise_not.default,), _bitwise_not, _int_or_bool),
    Lowering((aten.logical_not.default,), _logical_not),
]

__all__ = ["LOWERINGS", "expm1", "expm1_nonpositive", "isnan", "log1p", "maximum", "minimum", "round_half_even", "trunc"]
