"""Binary arithmetic, bitwise and comparison ops.

Operands: tensor operands whose device dtype differs from the op's common dtype are cast first
(the device promotes with PyTorch's tensor table, which ignores torch's 0-dim/scalar rules, e.g.
f16 tensor + 0-dim f32 tensor is f16 in torch but f32 on the device). Scalar operands become
one-element constants whose declared dtype *and bytes* are the common dtype in the graph's
compute precision (docs/upstream-defects.md #3); integer scalars wrap like torch (``int8 + 300`` adds 44).

Device limits handled here (semantics §5.2, §6):
* integer comparisons with a float scalar are rewritten exactly in the integer domain
  (``x > 0.5`` -> ``x > 0``; out-of-range bounds -> constant results), so an fp16 graph does not
  round large integers to f16 to compare them. (torch itself compares in float32, so the two differ
  only for |x| > 2**24, where torch's float32 rounding is the inexact side.)
* no MPSMin/MPSMax/MPSAtan2 (not dispatched): ``minimum`` is MPSMinimum plus NaN propagation,
  ``maximum`` a compare-and-select, ``atan2`` a quadrant-corrected atan decomposition.
* MPSDiv 'trunc' and MPSFmod abort on f16 operands: in f16 graphs ``trunc`` is
  ``where(q < 0, ceil(q), floor(q))`` and fmod ``a - trunc(a / b) * b``; f32 graphs use the members.
* division with a rounding mode, fmod and remainder of integers: the device computes those members in
  f32 and returns f32 (§6 #13), inexact past 2**24 (2**11 in f16 graphs). They are written with
  integer members only: ``q0 = MPSDiv(a, b)`` without a mode is the device's integer division (integer
  result, §6 #12; its rounding of negative quotients is unverified, so only ``|q0 - a/b| < 1`` is
  assumed: truncation, floor or any other rounding to an adjacent integer), then the remainder
  ``r0 = a - q0 * b`` says which neighbour it is: the floor quotient is ``q0 - 1`` exactly when
  ``r0 != 0`` and ``r0``'s sign differs from ``b``'s. Every step is exact integer arithmetic (``|q0 * b|``
  is at most ``|a| + |b|``), so under that one assumption floor_divide / div(rounding_mode=...) /
  remainder / fmod of every integer dtype equal torch's exactly, at any magnitude and in fp16 graphs
  too (no float involved). Division by zero raises in torch (nothing to match).
* float floor division / fmod / remainder are ``floor(a / b)``-style decompositions (as the device's
  own members compute them): they agree with torch except where ``a / b`` rounds onto an integer
  (torch, like Python, gives ``1.0 // 0.1 == 9.0``; the device ``10.0``).
* integer ``pow``: exact repeated multiplication for exponents 0..16 (wraps like torch); MPSPow on
  integers is unverified, other integer powers stay on CPU. Float ``pow`` with the exponents torch
  special-cases (0, ±0.5, 1, ±1, 2, 3, 4, -2) uses the same exact ops (mul, sqrt, rsqrt, reciprocal).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  (defines torch.ops.dim_order_ops)
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.dtypes import FLOAT_DTYPES
from mps_backend.serialization.generated import nodes as N

from ._util import arg, is_float, scalar_dtype, val
from .emit import Binary, binary, compare, const, convert, finish, full_like, unary, vdtype, where
from .registry import Lowering
from .unary import maximum, minimum, trunc

aten = torch.ops.aten
dim_order_ops = torch.ops.dim_order_ops


# ---------------------------------------------------------------------------------------------
# operands


def _common_dtype(node: Node) -> torch.dtype:
    """torch's common dtype of the first two arguments (tensor or scalar)."""
    a, other = node.args[0], node.args[1]
    va = val(a) if isinstance(a, Node) else a
    vo = val(other) if isinstance(other, Node) else other
    if not isinstance(va, torch.Tensor):  # scalar first (pow.Scalar, rsub with swapped roles)
        return scalar_dtype(other, a)
    return torch.result_type(va, vo)


def _operand(b: GraphBuilder, x, dtype: torch.dtype) -> int:
    """A tensor argument as device dtype ``dtype`` (cast if needed), or a scalar constant."""
    if isinstance(x, Node):
        return convert(b, b.id(x), dtype)
    return const(b, x, dtype)


def _operands(node: Node, b: GraphBuilder, dtype: torch.dtype | None = None) -> tuple[int, int]:
    """Both operands in device dtype ``dtype`` (default: the device dtype of the operands' torch common dtype)."""
    dt = dtype or b.result_dtype(node, _common_dtype(node))
    return _operand(b, node.args[0], dt), _operand(b, node.args[1], dt)


# ---------------------------------------------------------------------------------------------
# add / sub / mul / rsub


def _arith(op: Binary, with_alpha: bool = False, swap: bool = False):
    def lower(node: Node, b: GraphBuilder) -> None:
        x, y = _operands(node, b, b.dtype(node))
        if swap:  # rsub: other - alpha * self
            x, y = y, x
        fields: dict[str, Any] = {"alpha": float(arg(node, 2, "alpha", 1))} if with_alpha else {}
        b.emit(op(input1_id=x, input2_id=y, output_id=b.out(node), **fields))

    return lower


def _alpha_check(node: Node):
    alpha = arg(node, 2, "alpha", 1)
    if not is_float(node) and float(alpha) != int(alpha):
        return "non-integer alpha on an integer add/sub"
    if val(node).dtype == torch.bool:
        return "add/sub of bool tensors (device Bool arithmetic is unverified)"
    return None


def _mul_check(node: Node):
    if val(node).dtype == torch.bool:
        return "mul of bool tensors (device Bool arithmetic is unverified)"
    return None


# ---------------------------------------------------------------------------------------------
# division family


def _div_check(node: Node):
    if not is_float(node):
        return f"division producing {val(node).dtype}"
    return None


def _div(node: Node, b: GraphBuilder) -> None:
    """True division. Integer operands are cast to the result dtype first: the device would
    otherwise divide integers (semantics §6 #12). ``(x * a) / d`` with powers of two was rewritten
    before lowering (``mps_backend.passes.rescale``)."""
    x, y = _operands(node, b, b.dtype(node))
    b.emit(N.MPSDiv(input1_id=x, input2_id=y, output_id=b.out(node), rounding_mode=None))
    # rounding_mode absent (null) = plain division; any other string is a device assert


def _int_or_float(node: Node, what: str):
    if val(node).dtype == torch.bool:
        return f"{what} of bool tensors (torch has no bool quotient)"
    return None


def _rounded_div(b: GraphBuilder, x: int, y: int, mode: str) -> int:
    """``div(x, y, rounding_mode=mode)`` of two float values of one dtype."""
    if mode == "floor":
        return binary(b, N.MPSDiv, x, y, rounding_mode="floor")
    if vdtype(b, x) == torch.float32:
        return binary(b, N.MPSDiv, x, y, rounding_mode="trunc")
    return trunc(b, binary(b, N.MPSDiv, x, y))  # 'trunc' aborts on f16 (§6 #14)


def _fmod(b: GraphBuilder, x: int, y: int) -> int:
    if vdtype(b, x) == torch.float32:
        return binary(b, N.MPSFmod, x, y)  # null mode = 'trunc': x - trunc(x / y) * y
    q = trunc(b, binary(b, N.MPSDiv, x, y))
    return binary(b, N.MPSSub, x, binary(b, N.MPSMul, q, y))


def _remainder(b: GraphBuilder, x: int, y: int) -> int:
    return binary(b, N.MPSRemainder, x, y)  # null mode = 'floor': x - floor(x / y) * y


def _int_divmod(b: GraphBuilder, x: int, y: int) -> tuple[int, int]:
    """(floor quotient, floor remainder) of two integer values of one dtype, exactly, with integer
    members only (module docstring): ``q0`` the device's integer division, ``r0 = x - q0 * y``; q0 is
    one above the floor exactly when ``r0 != 0`` and ``r0 < 0 != y < 0``."""
    dt = vdtype(b, x)
    zero = const(b, 0, dt)
    q0 = binary(b, N.MPSDiv, x, y)  # no rounding mode: integer division with an integer result
    r0 = binary(b, N.MPSSub, x, binary(b, N.MPSMul, q0, y))
    y_neg = compare(b, N.MPSLt, y, zero)
    above = binary(b, N.MPSBitwiseAnd, compare(b, N.MPSNe, r0, zero), compare(b, N.MPSNe, compare(b, N.MPSLt, r0, zero), y_neg))
    q = binary(b, N.MPSSub, q0, b.cast(above, dt))
    r = where(b, above, binary(b, N.MPSAdd, r0, y), r0)
    return q, r


def _int_truncated(b: GraphBuilder, x: int, y: int, q: int, r: int) -> int:
    """Where the truncated quotient/remainder differ from the floored ones: a non-zero remainder
    of a negative quotient (operand signs differ)."""
    zero = const(b, 0, vdtype(b, x))
    signs_differ = compare(b, N.MPSNe, compare(b, N.MPSLt, x, zero), compare(b, N.MPSLt, y, zero))
    return binary(b, N.MPSBitwiseAnd, compare(b, N.MPSNe, r, zero), signs_differ)


def _int_floor_divide(b: GraphBuilder, x: int, y: int) -> int:
    return _int_divmod(b, x, y)[0]


def _int_trunc_divide(b: GraphBuilder, x: int, y: int) -> int:
    q, r = _int_divmod(b, x, y)
    return binary(b, N.MPSAdd, q, b.cast(_int_truncated(b, x, y, q, r), vdtype(b, x)))


def _int_remainder(b: GraphBuilder, x: int, y: int) -> int:
    return _int_divmod(b, x, y)[1]


def _int_fmod(b: GraphBuilder, x: int, y: int) -> int:
    q, r = _int_divmod(b, x, y)
    return where(b, _int_truncated(b, x, y, q, r), binary(b, N.MPSSub, r, y), r)


def _division(float_fn, int_fn):
    """Lower ``float_fn(b, x, y)`` on float operands (the result dtype), ``int_fn`` on integer ones."""

    def lower(node: Node, b: GraphBuilder) -> None:
        dt = b.dtype(node)
        x, y = _operands(node, b, dt)
        finish(b, node, (float_fn if dt in FLOAT_DTYPES else int_fn)(b, x, y))

    return lower


def _div_mode_check(node: Node):
    mode = node.kwargs.get("rounding_mode", arg(node, 2, "rounding_mode", None))
    if mode is None:
        return _div_check(node)
    if mode not in ("trunc", "floor"):
        return f"rounding_mode={mode!r}"
    return _int_or_float(node, f"division with rounding_mode={mode!r}")


def _div_mode(node: Node, b: GraphBuilder) -> None:
    mode = node.kwargs.get("rounding_mode", arg(node, 2, "rounding_mode", None))
    if mode is None:
        _div(node, b)
        return
    _division(lambda b, x, y: _rounded_div(b, x, y, mode), _int_floor_divide if mode == "floor" else _int_trunc_divide)(node, b)


# ---------------------------------------------------------------------------------------------
# pow

#: float exponents torch computes with plain ops (and so do we): exponent -> recipe
_FLOAT_POW = (0, 0.5, -0.5, 1, -1, 2, 3, 4, -2)


def _int_exponent(e) -> int | None:
    if not isinstance(e, (int, float)):
        return None
    if isinstance(e, float) and not e.is_integer():
        return None
    return int(e)


def _pow_check(node: Node):
    if is_float(node):
        return None
    base, exponent = node.args[0], node.args[1]
    if isinstance(base, Node) and not isinstance(exponent, Node):
        k = _int_exponent(exponent)
        if k is not None and 0 <= k <= 16:
            return None
    return (
        f"{val(node).dtype} pow: MPSPow on integer tensors is unverified (only scalar exponents "
        "0..16 are lowered, as exact multiplications)"
    )


def _power(b: GraphBuilder, x: int, k: int) -> int:
    """x ** k for an integer k >= 0 by square-and-multiply (exact for integers)."""
    if k == 0:
        return full_like(b, x, 1.0, vdtype(b, x))
    result: int | None = None
    base = x
    while k:
        if k & 1:
            result = base if result is None else binary(b, N.MPSMul, result, base)
        k >>= 1
        if k:
            base = binary(b, N.MPSMul, base, base)
    assert result is not None
    return result


def _pow_scalar_exponent(b: GraphBuilder, x: int, e) -> int:
    dt = vdtype(b, x)
    k = _int_exponent(e)
    if dt not in FLOAT_DTYPES:
        assert k is not None  # the check takes small integer exponents only
        return _power(b, x, k)
    if e in _FLOAT_POW:
        if e == 0.5:
            return unary(b, N.MPSSqrt, x)
        if e == -0.5:
            return unary(b, N.MPSRsqrt, x)
        if e == 3:  # torch: x * x * x
            return binary(b, N.MPSMul, binary(b, N.MPSMul, x, x), x)
        if k is not None and k < 0:
            return unary(b, N.MPSReciprocal, x if k == -1 else _power(b, x, -k))
        assert k is not None  # the exponents of _FLOAT_POW other than ±0.5 are integers
        return _power(b, x, k)
    return binary(b, N.MPSPow, x, const(b, e, dt))


def _pow(node: Node, b: GraphBuilder) -> None:
    dt = b.dtype(node)
    base, exponent = node.args[0], node.args[1]
    if isinstance(base, Node) and not isinstance(exponent, Node):
        finish(b, node, _pow_scalar_exponent(b, convert(b, b.id(base), dt), exponent))
        return
    b.emit(N.MPSPow(input1_id=_operand(b, base, dt), input2_id=_operand(b, exponent, dt), output_id=b.out(node)))


# ---------------------------------------------------------------------------------------------
# minimum / maximum / atan2


def _minmax(fn):
    def lower(node: Node, b: GraphBuilder) -> None:
        x, y = _operands(node, b, b.dtype(node))
        finish(b, node, fn(b, x, y))

    return lower


def _atan2(b: GraphBuilder, y: int, x: int) -> int:
    """atan2(y, x) without MPSAtan2 (not dispatched). ``t = atan(y / x)`` is right for x > 0; for x
    negative (or -0) the result is ``t ± pi`` with the sign of y (y's sign bit: y < 0 or 1/y < 0,
    which also catches -0). Cases where y / x is NaN are fixed up: both zero -> ``±0`` or ``±pi``
    (from y itself), both infinite -> ``±pi/4`` or ``±3pi/4`` (from the signs)."""
    dt = vdtype(b, y)

    def c(v):
        return const(b, v, dt)

    def sign_bit(v):  # v < 0, including -0 (1 / -0 = -inf) and -inf (v < 0 itself)
        return binary(b, N.MPSBitwiseOr, compare(b, N.MPSLt, v, c(0)), compare(b, N.MPSLt, unary(b, N.MPSReciprocal, v), c(0)))

    x_neg, y_neg = sign_bit(x), sign_bit(y)
    pi = where(b, y_neg, c(-math.pi), c(math.pi))  # ±pi with y's sign
    # both infinite: atan(±1) is the right base angle; both zero: y (±0) is
    both_inf = binary(b, N.MPSBitwiseAnd, unary(b, N.MPSIsinf, y, torch.bool), unary(b, N.MPSIsinf, x, torch.bool))
    one = where(b, y_neg, c(-1.0), c(1.0))
    ratio = where(b, both_inf, binary(b, N.MPSMul, one, where(b, x_neg, c(-1.0), c(1.0))), binary(b, N.MPSDiv, y, x))
    t = unary(b, N.MPSAtan, ratio)
    y_zero = compare(b, N.MPSEq, y, c(0))
    x_nan = unary(b, N.MPSIsnan, x, torch.bool)
    t = where(b, binary(b, N.MPSBitwiseAnd, y_zero, unary(b, N.MPSLogicalNot, x_nan, torch.bool)), y, t)
    return where(b, x_neg, binary(b, N.MPSAdd, t, pi), t)


def _atan2_lower(node: Node, b: GraphBuilder) -> None:
    y, x = _operands(node, b, b.dtype(node))
    finish(b, node, _atan2(b, y, x))


def _float_out(node: Node):
    return None if is_float(node) else f"{val(node).dtype} result"


# ---------------------------------------------------------------------------------------------
# bitwise / logical


def _bitwise_check(node: Node):
    dt = val(node).dtype
    if dt.is_floating_point:
        return f"bitwise op producing {dt}"
    return None


def _bitwise(op: type[N.MPSNode2x1Table]):
    def lower(node: Node, b: GraphBuilder) -> None:
        x, y = _operands(node, b, b.dtype(node))
        b.emit(op(input1_id=x, input2_id=y, output_id=b.out(node)))

    return lower


def _logical(op: type[N.MPSNode2x1Table]):
    """logical_and/or/xor: operands as Bool (``x != 0``), then the bitwise member (logical on Bool)."""

    def as_bool(b: GraphBuilder, x) -> int:
        vid = b.id(x)
        if vdtype(b, vid) == torch.bool:
            return vid
        return compare(b, N.MPSNe, vid, const(b, 0, vdtype(b, vid)))

    def lower(node: Node, b: GraphBuilder) -> None:
        b.emit(op(input1_id=as_bool(b, node.args[0]), input2_id=as_bool(b, node.args[1]), output_id=b.out(node)))

    return lower


# ---------------------------------------------------------------------------------------------
# comparisons

COMPARISONS = {"eq": N.MPSEq, "ne": N.MPSNe, "ge": N.MPSGe, "gt": N.MPSGt, "le": N.MPSLe, "lt": N.MPSLt}


def _int_vs_float(b: GraphBuilder, op: type[N.MPSNode2x1Table], x: int, c: float):
    """``x op c`` for an integer x and a float scalar c, as (op, integer bound) or a constant bool."""
    info = torch.iinfo(vdtype(b, x))
    lo, hi = info.min, info.max
    if math.isnan(c):
        return op == N.MPSNe
    if math.isinf(c):
        above = c > 0  # every x is below +inf / above -inf
        return {N.MPSGt: not above, N.MPSGe: not above, N.MPSLt: above, N.MPSLe: above, N.MPSEq: False, N.MPSNe: True}[op]
    fl, ce = math.floor(c), math.ceil(c)
    if op == N.MPSGt:
        return False if fl >= hi else True if fl < lo else (op, fl)
    if op == N.MPSGe:
        return False if ce > hi else True if ce <= lo else (op, ce)
    if op == N.MPSLt:
        return False if ce <= lo else True if ce > hi else (op, ce)
    if op == N.MPSLe:
        return False if fl < lo else True if fl >= hi else (op, fl)
    if fl != c or not lo <= fl <= hi:  # Eq / Ne with a non-integral or unreachable value
        return op == N.MPSNe
    return (op, fl)


def _compare(op: type[N.MPSNode2x1Table]):
    def lower(node: Node, b: GraphBuilder) -> None:
        a, other = node.args[0], node.args[1]
        if isinstance(other, float) and not val(a).dtype.is_floating_point and val(a).dtype != torch.bool:
            x = b.id(a)
            rule = _int_vs_float(b, op, x, other)
            if isinstance(rule, bool):
                b.alias(node, full_like(b, x, float(rule), torch.bool))
            else:
                b.alias(node, compare(b, rule[0], x, const(b, rule[1], vdtype(b, x))))
            return
        x, y = _operands(node, b)
        b.emit(op(input1_id=x, input2_id=y, output_id=b.out(node)))

    return lower


LOWERINGS = [
    Lowering((aten.add.Tensor, aten.add.Scalar), _arith(N.MPSAdd, True), _alpha_check),
    Lowering((aten.sub.Tensor, aten.sub.Scalar), _arith(N.MPSSub, True), _alpha_check),
    Lowering((aten.rsub.Tensor, aten.rsub.Scalar), _arith(N.MPSSub, True, swap=True), _alpha_check),
    Lowering((aten.mul.Tensor, aten.mul.Scalar), _arith(N.MPSMul), _mul_check),
    Lowering((aten.div.Tensor, aten.div.Scalar), _div, _div_check),
    Lowering((aten.div.Tensor_mode, aten.div.Scalar_mode), _div_mode, _div_mode_check),
    Lowering(
        (aten.floor_divide.default, aten.floor_divide.Scalar),
        _division(lambda b, x, y: _rounded_div(b, x, y, "floor"), _int_floor_divide),
        lambda node: _int_or_float(node, "floor_divide"),
    ),
    Lowering((aten.fmod.Tensor, aten.fmod.Scalar), _division(_fmod, _int_fmod), lambda node: _int_or_float(node, "fmod")),
    Lowering(
        (aten.remainder.Tensor, aten.remainder.Scalar),
        _division(_remainder, _int_remainder),
        lambda node: _int_or_float(node, "remainder"),
    ),
    Lowering((aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar), _pow, _pow_check),
    Lowering((aten.minimum.default,), _minmax(minimum)),
    Lowering((aten.maximum.default,), _minmax(maximum)),
    Lowering((aten.atan2.default,), _atan2_lower, _float_out),
    *(
        Lowering((getattr(aten, f"bitwise_{name}").Tensor, getattr(aten, f"bitwise_{name}").Scalar), _bitwise(op), _bitwise_check)
        for name, op in (("and", N.MPSBitwiseAnd), ("or", N.MPSBitwiseOr), ("xor", N.MPSBitwiseXor))
    ),
    *(
        Lowering((getattr(aten, f"logical_{name}").default,), _logical(op))
        for name, op in (("and", N.MPSBitwiseAnd), ("or", N.MPSBitwiseOr), ("xor", N.MPSBitwiseXor))
    ),
    *(Lowering((getattr(aten, name).Tensor, getattr(aten, name).Scalar), _compare(op)) for name, op in COMPARISONS.items()),
]
