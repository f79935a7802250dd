"""Activations: relu, gelu, hardtanh, leaky_relu, softmax, log_softmax, hardswish, hardsigmoid, elu,
softplus.

* gelu ``approximate='tanh'``: the device computes ``x * tanh(x)`` (§6 #1), so the tanh formula is
  written out with elementwise members.
* log_softmax: MPSLogSoftmax is ``log(softmax(x))``, which underflows to -inf where torch is finite
  (§5.1), and the union has no max reduction for ``x - max - log(sum(exp(x - max)))`` (reduce.py's
  max is a max-pool trick whose NaN handling is unverified). The device's stable softmax gives it:
  every ``p_i > 0`` satisfies ``lse = x_i - log(p_i)``, so
  ``lse = sum(p * (x - log p)) / sum(p)`` (terms with ``p == 0`` dropped; their weight is 0 anyway)
  and ``log_softmax = x - lse``. The large-``p`` terms dominate and are accurate, so the result is
  finite wherever torch's is, and dividing by ``sum(p)`` cancels the rounding of the probabilities.
* hardswish / hardsigmoid are kept whole (``preserve``: executorch's decomposition is seven edge
  nodes each, with constant casts) and written as ``hardtanh(0.5 + x/6, 0, 1)`` -- one MPSAdd with
  ``alpha = 1/6`` and one MPSHardTanh -- times ``x`` for hardswish: two and three MPS nodes. The same
  function as torch's ``clamp(x + 3, 0, 6) / 6`` up to rounding (a few ulp). MPSHardTanh passes NaN
  through like torch; ``hardswish(-inf) = -inf * 0 = NaN`` as in torch. A hardsigmoid that is the
  only reader of a convolution with constant weights is one MPSHardTanh: the convolution folds
  ``x / 6 + 0.5`` into its weights and bias (convolution.py).
  silu is left to the default decomposition (sigmoid, mul), which is lowered.
* elu (also selu, which reaches edge as elu): torch's ``x > 0 ? scale * x : alpha * scale *
  expm1(input_scale * x)`` with the accurate ``expm1`` of unary.py (``2 t / (1 - t)``, ``t = tanh(x / 2)``,
  for the non-positive arguments; the general form when ``input_scale < 0``): one MPSWhere, the
  scalings only when not 1. Measured against eager (device model) over ``[-20, 20]`` and
  ``±[1e-30, 1e-3]``: max relative error 1.8e-7 (fp32); fp16 1.3e-3 against the float32 result (results in
  float16's normal range). ``exp(x) - 1`` would lose every digit near 0.
* softplus is kept whole (``preserve``): torch's ``log1p(exp(beta * x)) / beta`` (the default
  decomposition) overflows float16 for ``beta * x > 11`` where the result is just ``x``, so it is written
  ``(relu(z) + log1p(exp(-|z|))) / beta`` with ``z = beta * x`` (the same function, no overflow), and
  ``x`` where ``z > threshold`` as in torch. Max relative error against eager over ``[-20, 20]`` and
  ``±[1e-30, 1e-3]``: 2.4e-7 (fp32), 1.5e-3 (fp16, normal range).
* mish, logsigmoid and celu reach edge decomposed into softplus-like terms, ``log1p`` / ``expm1``
  (lowered in unary.py, accurate near 0) and elementwise members: nothing to add here. Measured the
  same way (fp32 / fp16): logsigmoid 2.4e-7 / 1.5e-3, celu 2.5e-7 / 1.7e-3, mish (on the preserved
  softplus) 3.3e-7 / 2.1e-3 for ``|mish(x)| >= 1e-3``, up to 1.7e-2 below, where ``tanh(softplus(x)) ~
  exp(x)`` is a float16 subnormal (selu: 2.1e-7 / 2e-3, the latter for results near 6e-5, for the same
  reason).
"""

from __future__ import annotations

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.serialization.generated import nodes as N

from ._util import arg, is_float, norm_dim, rank
from .emit import binary, compare, const, finish, unary, vdtype, vshape, where
from .registry import Lowering
from .unary import expm1, expm1_nonpositive, log1p

aten = torch.ops.aten


def _float_input(node: Node):
    return None if is_float(node.args[0]) else "activation of a non-float tensor"


def _relu(node: Node, b: GraphBuilder) -> None:
    x = b.id(node.args[0])
    b.emit(N.MPSReLU(input1_id=x, input2_id=-1, output_id=b.out(node)))


def _gelu_check(node: Node):
    approx = node.kwargs.get("approximate", "none")
    if approx not in ("none", "tanh"):
        return f"gelu approximate={approx!r} is not a torch mode"
    return _float_input(node)


def _gelu(node: Node, b: GraphBuilder) -> None:
    x = b.id(node.args[0])
    if node.kwargs.get("approximate", "none") == "none":
        b.emit(N.MPSGELU(input1_id=x, output_id=b.out(node), approximate="none"))
        return
    # The device computes x*tanh(x) for approximate='tanh' (semantics §6 #1): use the formula.
    # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    dt = b.dtype(node.args[0])
    x3 = binary(b, N.MPSMul, binary(b, N.MPSMul, x, x), x)
    inner = binary(b, N.MPSAdd, x, binary(b, N.MPSMul, x3, b.scalar(0.044715, dt)))
    t = unary(b, N.MPSTanh, binary(b, N.MPSMul, inner, b.scalar(0.7978845608028654, dt)))
    one_plus = binary(b, N.MPSAdd, t, b.scalar(1.0, dt))
    binary(b, N.MPSMul, binary(b, N.MPSMul, x, b.scalar(0.5, dt)), one_plus, out=b.out(node))


def _hardtanh(node: Node, b: GraphBuilder) -> None:
    lo, hi = arg(node, 1, "min_val", -1.0), arg(node, 2, "max_val", 1.0)
    b.emit(N.MPSHardTanh(input1_id=b.id(node.args[0]), output_id=b.out(node), min_value=float(lo), max_value=float(hi)))


def _leaky_relu(node: Node, b: GraphBuilder) -> None:
    b.emit(
        N.MPSLeakyReLU(
            input1_id=b.id(node.args[0]), output_id=b.out(node), negative_slope=float(arg(node, 1, "negative_slope", 0.01))
        )
    )


def _softmax_check(node: Node):
    if arg(node, 2, "half_to_float", False):
        return "softmax with half_to_float=True: the MPS runtime aborts on it"
    return _float_input(node)


def _softmax(op: type[N.MPSSoftmaxTable]):
    def lower(node: Node, b: GraphBuilder) -> None:
        dim = norm_dim(arg(node, 1, "dim"), rank(node.args[0]))
        b.emit(op(input1_id=b.id(node.args[0]), output_id=b.out(node), dim=dim, half_to_float=False))

    return lower


def _log_softmax(node: Node, b: GraphBuilder) -> None:
    x = b.id(node.args[0])
    dt, dims = vdtype(b, x), vshape(b, x)
    dim = norm_dim(arg(node, 1, "dim"), rank(node.args[0]))
    p = b.emit(N.MPSSoftmax(input1_id=x, dim=dim, half_to_float=False, output_id=b.new_value(dt, dims)))
    terms = binary(b, N.MPSMul, p, binary(b, N.MPSSub, x, unary(b, N.MPSLog, p)))
    terms = where(b, compare(b, N.MPSEq, p, const(b, 0, dt)), const(b, 0, dt), terms)  # 0 * inf
    kept = list(dims) or [1]
    kept[dim] = 1

    def total(v):  # mean over dim (the device's only reduction); the 1/n cancels in the ratio
        return b.emit(N.MPSMean(input1_id=v, num_dims=1, dims=[dim], keep_dims=True, output_id=b.new_value(dt, kept)))

    lse = binary(b, N.MPSDiv, total(terms), total(p))
    b.emit(N.MPSSub(input1_id=x, input2_id=lse, output_id=b.out(node), alpha=1.0))


def _hard_sigmoid_value(b: GraphBuilder, x: int, out: int | None = None) -> int:
    """``hardtanh(0.5 + x / 6, 0, 1)``: MPSAdd computes ``a + alpha * b``."""
    dt = vdtype(b, x)
    shifted = b.emit(N.MPSAdd(input1_id=const(b, 0.5, dt), input2_id=x, alpha=1 / 6, output_id=b.new_value(dt, vshape(b, x))))
    if out is None:
        out = b.new_value(dt, vshape(b, x))
    b.emit(N.MPSHardTanh(input1_id=shifted, output_id=out, min_value=0.0, max_value=1.0))
    return out


def _hardswish(node: Node, b: GraphBuilder) -> None:
    x = b.id(node.args[0])
    b.emit(N.MPSMul(input1_id=x, input2_id=_hard_sigmoid_value(b, x), output_id=b.out(node)))


def _hardsigmoid(node: Node, b: GraphBuilder) -> None:
    _hard_sigmoid_value(b, b.id(node.args[0]), out=b.out(node))


def _elu(node: Node, b: GraphBuilder) -> None:
    x = b.id(node.args[0])
    dt = vdtype(b, x)
    alpha, scale = float(arg(node, 1, "alpha", 1.0)), float(arg(node, 2, "scale", 1.0))
    input_scale = float(arg(node, 3, "input_scale", 1.0))

    def times(v, c):
        return v if c == 1.0 else binary(b, N.MPSMul, v, const(b, c, dt))

    # the negative branch is only read where x <= 0: there input_scale * x <= 0 when input_scale >= 0
    negative = (expm1_nonpositive if input_scale >= 0 else expm1)(b, times(x, input_scale))
    negative = times(negative, alpha * scale)
    positive = times(x, scale)
    finish(b, node, where(b, compare(b, N.MPSGt, x, const(b, 0, dt)), positive, negative))


def _softplus(node: Node, b: GraphBuilder) -> None:
    x = b.id(node.args[0])
    dt = vdtype(b, x)
    beta, threshold = float(arg(node, 1, "beta", 1.0)), float(arg(node, 2, "threshold", 20.0))
    z = x if beta == 1.0 else binary(b, N.MPSMul, x, const(b, beta, dt))
    # log1p(exp(z)) = relu(z) + log1p(exp(-|z|)): exp never overflows
    tail = log1p(b, unary(b, N.MPSExp, unary(b, N.MPSNeg, unary(b, N.MPSAbs, z))))
    relu_z = b.emit(N.MPSReLU(input1_id=z, input2_id=-1, output_id=b.new_value(dt, vshape(b, z))))
    soft = binary(b, N.MPSAdd, relu_z, tail)
    if beta != 1.0:
        soft = binary(b, N.MPSDiv, soft, const(b, beta, dt))
    finish(b, node, where(b, compare(b, N.MPSGt, z, const(b, threshold, dt)), x, soft))


LOWERINGS = [
    Lowering((aten.relu.default,), _relu),
    Lowering((aten.gelu.default,), _gelu, _gelu_check),
    Lowering((aten.hardtanh.default,), _hardtanh, _float_input),
    Lowering((aten.leaky_relu.default,), _leaky_relu, _float_input),
    Lowering((aten._softmax.default,), _softmax(N.MPSSoftmax), _softmax_check),
    Lowering((aten._log_softmax.default,), _log_softmax, _softmax_check),
    Lowering((aten.hardswish.default,), _hardswish, _float_input, preserve=True),
    Lowering((aten.hardsigmoid.default,), _hardsigmoid, _float_input, preserve=True),
    Lowering((aten.elu.default,), _elu, _float_input),
    Lowering((aten.softplus.default,), _softplus, _float_input, preserve=True),
]
