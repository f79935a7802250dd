"""Op-table rows: unary math, clamp / where, and pinned regressions of upstream defects."""

from __future__ import annotations

import torch

from .harness import randbool, randint, randn, row, uniform, values

NAN, INF = float("nan"), float("inf")
ROUND_DECIMALS = torch.ops.aten.round.decimals
SPECIAL = [0.0, -0.0, 1.5, -2.25, INF, -INF, NAN, 3.0]


def nonzero(*shape):
    """Values in ±[0.5, 3] (for reciprocals)."""
    return lambda: (torch.rand(*shape) * 2.5 + 0.5) * (torch.randint(0, 2, shape) * 2 - 1)


# (op, input factory) for the float-valued unary functions: inputs inside each domain and small
# enough that float16 neither overflows nor loses the argument
FLOAT_UNARY = {
    "exp": (torch.exp, randn(3, 4, scale=2.0), "MPSExp"),
    "reciprocal": (torch.reciprocal, nonzero(3, 4), "MPSReciprocal"),
    "sqrt": (torch.sqrt, uniform(0.01, 9.0, 3, 4), "MPSSqrt"),
    "rsqrt": (torch.rsqrt, uniform(0.05, 9.0, 3, 4), "MPSRsqrt"),
    "log": (torch.log, uniform(0.05, 20.0, 3, 4), "MPSLog"),
    "log10": (torch.log10, uniform(0.05, 20.0, 3, 4), "MPSLog10"),
    "log2": (torch.log2, uniform(0.05, 20.0, 3, 4), "MPSLog2"),
    "erf": (torch.erf, randn(3, 4, scale=1.5), "MPSErf"),
    "sigmoid": (torch.sigmoid, randn(3, 4, scale=3.0), "MPSSigmoid"),
    "sin": (torch.sin, randn(3, 4, scale=2.0), "MPSSin"),
    "cos": (torch.cos, randn(3, 4, scale=2.0), "MPSCos"),
    "tan": (torch.tan, uniform(-1.2, 1.2, 3, 4), "MPSTan"),
    "asin": (torch.asin, uniform(-0.95, 0.95, 3, 4), "MPSAsin"),
    "acos": (torch.acos, uniform(-0.95, 0.95, 3, 4), "MPSAcos"),
    "atan": (torch.atan, randn(3, 4, scale=3.0), "MPSAtan"),
    "sinh": (torch.sinh, randn(3, 4, scale=2.0), "MPSSinh"),
    "cosh": (torch.cosh, randn(3, 4, scale=2.0), "MPSCosh"),
    "tanh": (torch.tanh, randn(3, 4, scale=2.0), "MPSTanh"),
    "asinh": (torch.asinh, randn(3, 4, scale=3.0), "MPSAsinh"),
    "acosh": (torch.acosh, uniform(1.05, 6.0, 3, 4), "MPSAcosh"),
    "atanh": (torch.atanh, uniform(-0.9, 0.9, 3, 4), "MPSAtanh"),
}

UNARY = [
    *(row(f"aten.{name}.default", f"unary-{name}", fn, x, kinds=kind) for name, (fn, x, kind) in FLOAT_UNARY.items()),
    # exp2 is not core ATen: it reaches a partitioner only through the exception list
    row(
        "aten.exp2.default",
        "unary-exp2",
        torch.exp2,
        randn(3, 4, scale=2.0),
        kinds="MPSExp2",
        non_core=[torch.ops.aten.exp2.default],
    ),
    row("aten.exp.default", "unary-exp-special", torch.exp, values(SPECIAL), kinds="MPSExp"),
    # integer inputs of float-valued functions: cast to float first (torch returns float)
    row("aten.exp.default", "unary-exp-int32", torch.exp, randint(-4, 5, (3, 4)), kinds={"MPSCast", "MPSExp"}),
    row("aten.sqrt.default", "unary-sqrt-int64", torch.sqrt, randint(0, 50, (6,), torch.int64), kinds={"MPSCast", "MPSSqrt"}),
    row("aten.sigmoid.default", "unary-sigmoid-bool", torch.sigmoid, randbool(6), kinds={"MPSCast", "MPSSigmoid"}),
    row("aten.neg.default", "unary-neg", torch.neg, randn(3, 4), kinds="MPSNeg"),
    row("aten.neg.default", "unary-neg-int", torch.neg, randint(-100, 100, (3, 4)), kinds="MPSNeg"),
    row("aten.abs.default", "unary-abs", torch.abs, values(SPECIAL), kinds="MPSAbs"),
    row("aten.abs.default", "unary-abs-int", torch.abs, randint(-100, 100, (3, 4), torch.int64), kinds="MPSAbs"),
    row("aten.sign.default", "unary-sign", torch.sign, values(SPECIAL[:6] + [-7.0, 0.25]), kinds="MPSSign"),
    row("aten.sign.default", "unary-sign-int", torch.sign, randint(-3, 4, (3, 4)), kinds="MPSSign"),
    row("aten.sign.default", "unary-sign-bool", torch.sign, randbool(4), cpu_reason="bool input"),
    row("aten.floor.default", "unary-floor", torch.floor, randn(4, 5, scale=4.0), kinds="MPSFloor"),
    row("aten.ceil.default", "unary-ceil", torch.ceil, randn(4, 5, scale=4.0), kinds="MPSCeil"),
    row(
        "aten.floor.default",
        "unary-floor-special",
        torch.floor,
        values([-0.0, -0.5, 0.5, INF, -INF, NAN, -2.0, 1e6]),
        kinds="MPSFloor",
    ),
    row(
        "aten.trunc.default",
        "unary-trunc",
        torch.trunc,
        values([-0.0, -0.5, 0.5, -1.5, 2.75, -2.75, INF, -INF, NAN, -3.0]),
        kinds={"MPSFloor", "MPSCeil", "MPSWhere"},
    ),
    # round: device ties go away from zero; torch rounds half to even (decomposed, exact)
    row(
        "aten.round.default",
        "unary-round-ties",
        torch.round,
        values([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5, 1022.5, -1023.5, 0.49999997, -0.49999997]),
        kinds={"MPSRound", "MPSFloor", "MPSWhere"},
    ),
    row("aten.round.default", "unary-round", torch.round, randn(4, 5, scale=5.0), kinds="MPSRound"),
    row(
        "aten.round.default",
        "unary-round-special",
        torch.round,
        values([-0.0, INF, -INF, NAN, 8388609.0, -8388609.0, 1e9, 0.25]),
        precisions=("fp32",),
        kinds="MPSRound",
    ),  # fp16 would round the large inputs to inf
    row("aten.round.default", "unary-round-int", torch.round, randint(-50, 50, (5,))),  # identity on integers
    # decimals (not core ATen): torch's round(x * 10^d) / 10^d with the half-to-even rounding (same
    # float32 operations); fp16: the scaled value and the quotient round to float16 -> 2e-3
    row(
        "aten.round.decimals",
        "unary-round-decimals",
        lambda x: torch.round(x, decimals=2),
        randn(4, 5, scale=3.0),
        kinds={"MPSRound", "MPSMul", "MPSDiv"},
        tol={"fp16": 2e-3},
        non_core=[ROUND_DECIMALS],
    ),
    row(
        "aten.round.decimals",
        "unary-round-decimals-negative",
        lambda x: torch.round(x, decimals=-1),
        randn(4, 5, scale=300.0),
        kinds={"MPSRound", "MPSDiv", "MPSMul"},
        tol={"fp16": 2e-3},
        non_core=[ROUND_DECIMALS],
    ),
    row(
        "aten.round.decimals",
        "unary-round-decimals-ties",
        lambda x: torch.round(x, decimals=1),
        values([0.25, 0.35, -0.25, 1.05, 2.5]),
        precisions=("fp32",),
        kinds="MPSRound",
        non_core=[ROUND_DECIMALS],
    ),
    row("aten.floor.default", "unary-floor-int", torch.floor, randint(-50, 50, (5,), torch.int64)),
    row("aten.ceil.default", "unary-ceil-int8", torch.ceil, randint(-50, 50, (5,), torch.int8)),
    row("aten.isnan.default", "unary-isnan", torch.isnan, values(SPECIAL), kinds="MPSIsnan"),
    row("aten.isinf.default", "unary-isinf", torch.isinf, values(SPECIAL), kinds="MPSIsinf"),
    row("aten.isnan.default", "unary-isnan-int", torch.isnan, randint(-5, 5, (2, 3)), kinds="MPSFullLike"),
    row("aten.isinf.default", "unary-isinf-int", lambda x: torch.isinf(x) | (x > 2), randint(-5, 5, (2, 3)), kinds="MPSFullLike"),
    row("aten.bitwise_not.default", "unary-bitwise-not", torch.bitwise_not, randint(-100, 100, (3, 4)), kinds="MPSBitwiseNot"),
    row(
        "aten.bitwise_not.default",
        "unary-bitwise-not-int8",
        torch.bitwise_not,
        randint(-100, 100, (3, 4), torch.int8),
        kinds="MPSBitwiseNot",
    ),
    row("aten.bitwise_not.default", "unary-bitwise-not-bool", torch.bitwise_not, randbool(3, 4), kinds="MPSBitwiseNot"),
    row("aten.logical_not.default", "unary-logical-not-bool", torch.logical_not, randbool(3, 4), kinds="MPSLogicalNot"),
    # non-bool: the device's logical NOT skips the cast to Bool -> compare with zero
    row("aten.logical_not.default", "unary-logical-not-float", torch.logical_not, values(SPECIAL), kinds="MPSEq"),
    row("aten.logical_not.default", "unary-logical-not-int", torch.logical_not, randint(-2, 3, (3, 4)), kinds="MPSEq"),
    # log1p: 2 atanh(x / (2 + x)) for |x| < 0.5, log(1 + x) elsewhere; expm1: 2t / (1 - t), t = tanh(x/2),
    # for x <= 0.5, exp(x) - 1 above. Max relative error of each element vs eager (device model, see
    # unary.py): fp32 2.3e-7 / 1.6e-7, fp16 1.3e-3 (normal float16 range)
    row("aten.log1p.default", "unary-log1p", torch.log1p, uniform(-0.99, 5.0, 4, 6), kinds={"MPSAtanh", "MPSLog", "MPSWhere"}),
    row(
        "aten.log1p.default",
        "unary-log1p-tiny",
        torch.log1p,
        values([1e-9, -1e-9, 3e-7, -3e-7, 1e-4, -0.0, 0.0, -0.49, 0.49]),
        precisions=("fp32",),
        kinds="MPSAtanh",
    ),  # log(1 + x) would give 0 for the first four
    # relative check of small values in fp16 (the harness scales by max |eager|, here about 1): log1p's
    # ~3 float16 roundings and the division's -> 2e-3
    row(
        "aten.log1p.default",
        "unary-log1p-small-fp16",
        lambda x: torch.log1p(x) / x,
        values([1e-3, -1e-3, 2e-4, -3e-4, 0.01, -0.3, 0.4]),
        precisions=("fp16",),
        kinds="MPSAtanh",
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.log1p.default",
        "unary-log1p-special",
        torch.log1p,
        values([-1.0, -2.0, INF, -INF, NAN, -0.0, 1e4, -0.5, 0.5]),
        kinds="MPSAtanh",
    ),
    row("aten.log1p.default", "unary-log1p-int", torch.log1p, randint(0, 100, (3, 4)), kinds={"MPSCast", "MPSAtanh"}),
    row("aten.expm1.default", "unary-expm1", torch.expm1, randn(4, 6, scale=3.0), kinds={"MPSTanh", "MPSExp", "MPSWhere"}),
    row(
        "aten.expm1.default",
        "unary-expm1-tiny",
        torch.expm1,
        values([1e-9, -1e-9, 3e-7, -3e-7, 1e-4, -0.0, 0.0, 0.5, 0.51]),
        precisions=("fp32",),
        kinds="MPSTanh",
    ),
    # the same relative check for expm1 (2t / (1 - t) then the division: ~4 float16 roundings)
    row(
        "aten.expm1.default",
        "unary-expm1-small-fp16",
        lambda x: torch.expm1(x) / x,
        values([1e-3, -1e-3, 2e-4, -3e-4, 0.01, -0.3, 0.4]),
        precisions=("fp16",),
        kinds="MPSTanh",
        tol={"fp16": 2e-3},
    ),
    row("aten.expm1.default", "unary-expm1-special", torch.expm1, values([INF, -INF, NAN, -0.0, -100.0, 10.0]), kinds="MPSTanh"),
]

CLAMP = [
    # float clamps are one MPSHardTanh (NaN passes through, an absent bound is -inf/inf) ...
    row("aten.clamp.default", "clamp-both", lambda x: x.clamp(-0.5, 0.75), values(SPECIAL + [0.6, -0.7]), kinds="MPSHardTanh"),
    row("aten.clamp.default", "clamp-min", lambda x: x.clamp(min=0.25), values(SPECIAL), kinds="MPSHardTanh"),
    row("aten.clamp.default", "clamp-max", lambda x: x.clamp(max=-0.25), values(SPECIAL), kinds="MPSHardTanh"),
    row("aten.clamp.default", "clamp-equal-bounds", lambda x: x.clamp(0.5, 0.5), values(SPECIAL), kinds="MPSHardTanh"),
    # ... except crossed bounds (torch: min(max(x, lo), hi) = hi): two one-bound MPSClamps + NaN fix
    row("aten.clamp.default", "clamp-crossed", lambda x: x.clamp(1.0, -1.0), values(SPECIAL), kinds={"MPSClamp", "MPSIsnan"}),
    # infinite bounds are no bounds (an MPSClamp without bounds never sets its output)
    row("aten.clamp.default", "clamp-infinite-bounds", lambda x: x.clamp(-INF, INF) * 2, values(SPECIAL), kinds="MPSMul"),
    row("aten.clamp.default", "clamp-int", lambda x: x.clamp(-2, 3), randint(-5, 6, (3, 4)), kinds="MPSClamp"),
    row("aten.clamp.default", "clamp-int64-min", lambda x: x.clamp(min=0), randint(-5, 6, (3, 4), torch.int64), kinds="MPSClamp"),
    # int tensor, float bounds: float result (cast first)
    row(
        "aten.clamp.default",
        "clamp-int-float-bounds",
        lambda x: x.clamp(-1.5, 2.5),
        randint(-5, 6, (3, 4)),
        kinds={"MPSCast", "MPSHardTanh"},
    ),
    row(
        "aten.clamp.default",
        "clamp-int-bound-not-f32",
        lambda x: x.clamp(max=2**25 + 1),
        randint(-5, 6, (4,), torch.int64),
        cpu_reason="not exact in float32",
    ),
    row("aten.hardtanh.default", "clamp-relu6", torch.nn.functional.relu6, randn(3, 4, scale=5.0), kinds="MPSHardTanh"),
    row(
        "aten.clamp.Tensor",
        "clamp-tensor",
        lambda x, lo, hi: torch.clamp(x, lo, hi),
        randn(3, 4),
        randn(3, 1, scale=0.3, offset=-0.5),
        randn(1, 4, scale=0.3, offset=0.5),
        kinds={"MPSMinimum", "MPSWhere"},
    ),
    row(
        "aten.clamp.Tensor",
        "clamp-tensor-nan",
        lambda x, lo, hi: torch.clamp(x, lo, hi),
        values([1.0, NAN, 3.0, -2.0, 0.5]),
        values([NAN, 0.0, 0.0, 0.0, 0.0]),
        values([2.0, 2.0, NAN, 2.0, 1.0]),
        kinds={"MPSMinimum", "MPSIsnan"},
    ),
    row(
        "aten.clamp.Tensor",
        "clamp-tensor-min",
        lambda x, lo: torch.clamp(x, min=lo),
        randn(3, 4),
        randn(4),
        kinds={"MPSWhere", "MPSLt"},
    ),
    row(
        "aten.clamp.Tensor",
        "clamp-tensor-int",
        lambda x, hi: torch.clamp(x, max=hi),
        randint(-9, 9, (3, 4)),
        randint(-3, 3, (4,)),
        kinds="MPSMinimum",
    ),
    row("aten.where.self", "where", torch.where, randbool(3, 4), randn(3, 4), randn(3, 4), kinds="MPSWhere"),
    row("aten.where.self", "where-broadcast", torch.where, randbool(3, 1), randn(1, 4), randn(3, 4), kinds="MPSWhere"),
    row(
        "aten.where.self",
        "where-int",
        torch.where,
        randbool(3, 4),
        randint(-5, 5, (3, 4)),
        randint(-5, 5, (3, 4)),
        kinds="MPSWhere",
    ),
    # branches of different dtypes: cast to the result dtype (the device does not promote)
    row(
        "aten.where.self",
        "where-mixed",
        torch.where,
        randbool(3, 4),
        randint(-5, 5, (3, 4)),
        randn(3, 4),
        kinds={"MPSCast", "MPSWhere"},
    ),
    # scalar branches: scalar_tensor constants of the branch dtype (MPSFull with the compute dtype)
    row(
        "aten.where.self",
        "where-scalar",
        lambda c, x: torch.where(c, x, 0.5),
        randbool(3, 4),
        randn(3, 4),
        kinds={"MPSFull", "MPSWhere"},
    ),
    row("aten.where.self", "where-scalars", lambda c: torch.where(c, 1.0, -2.0), randbool(3, 4), kinds={"MPSFull", "MPSWhere"}),
    row(
        "aten.where.self",
        "where-scalar-int",
        lambda c, x: torch.where(c, x, 7),
        randbool(3, 4),
        randint(-5, 5, (3, 4), torch.int64),
        kinds={"MPSWhere"},
    ),
]

# pinned regressions of the upstream defects (docs/upstream-defects.md §5)
REGRESSIONS = [
    # #3: scalar bytes must match the declared dtype
    row("aten.add.Tensor", "regress-int32-plus-int-scalar", lambda x: x + 3, randint(-100, 100, (3, 4)), kinds="MPSAdd"),
    row(
        "aten.mul.Tensor",
        "regress-int16-times-int-scalar",
        lambda x: x * -7,
        randint(-100, 100, (3, 4), torch.int16),
        kinds="MPSMul",
    ),
    row(
        "aten.add.Tensor",
        "regress-int8-wrapping-scalar",
        lambda x: x + 300,
        randint(-100, 100, (3, 4), torch.int8),
        kinds="MPSAdd",
    ),
    row(
        "aten.gt.Scalar",
        "regress-int-gt-half",
        lambda x: x > 0.5,
        values([-3, 0, 1, 2, 2049, 3001, -2049, 65537], torch.int32),
        kinds="MPSGt",
    ),
    # fp16 graphs: comparing in f16 would round 2049 and 2048.5 both to 2048
    row(
        "aten.gt.Scalar",
        "regress-int-gt-large-frac",
        lambda x: x > 2048.5,
        values([2048, 2049, 2050, -2049, 4097], torch.int32),
        kinds="MPSGt",
    ),
    row(
        "aten.le.Scalar",
        "regress-int-le-frac",
        lambda x: x <= -2.5,
        values([-3, -2, 0, 2049, -2049, 65537], torch.int64),
        kinds="MPSLe",
    ),
    row(
        "aten.eq.Scalar",
        "regress-int-eq-float",
        lambda x: x == 2049.0,
        values([2048, 2049, 2050, -1], torch.int32),
        kinds="MPSEq",
    ),
    row(
        "aten.eq.Scalar",
        "regress-int-eq-frac",
        lambda x: (x == 1.5) | (x != 2.5),
        values([1, 2, 3], torch.int32),
        kinds="MPSFullLike",
    ),
    row(
        "aten.lt.Scalar",
        "regress-int8-lt-out-of-range",
        lambda x: x < 300.5,
        randint(-100, 100, (5,), torch.int8),
        kinds="MPSFullLike",
    ),
    row("aten.ge.Scalar", "regress-int-ge-inf", lambda x: (x >= -INF) & (x < INF), randint(-100, 100, (5,)), kinds="MPSFullLike"),
    row("aten.mul.Tensor", "regress-fp16-scalar-2", lambda x: x * 2.0 + 1.0, randn(3, 4), kinds={"MPSMul", "MPSAdd"}),
    row(
        "aten.mul.Tensor",
        "regress-half-model-scalar",
        lambda x: x * 2.0 - 0.5,
        randn(3, 4, dtype=torch.float16),
        kinds={"MPSMul", "MPSSub"},
    ),
    row("aten.gt.Scalar", "regress-bool-gt-float", lambda x: x > 0.5, randbool(6), kinds="MPSGt"),
    # #21: add.Scalar / sub.Scalar positional alpha
    row(
        "aten.add.Scalar",
        "regress-add-scalar-alpha",
        lambda x: torch.ops.aten.add.Scalar(x, 2.0, 3.0),
        randn(3, 4),
        kinds="MPSAdd",
    ),
    row(
        "aten.sub.Scalar",
        "regress-sub-scalar-alpha",
        lambda x: torch.ops.aten.sub.Scalar(x, 2.0, 3.0),
        randn(3, 4),
        kinds="MPSSub",
    ),
    row("aten.add.Tensor", "regress-add-alpha", lambda x, y: torch.add(x, y, alpha=-2.5), randn(3, 4), randn(4), kinds="MPSAdd"),
    row(
        "aten.add.Tensor",
        "regress-int-add-alpha",
        lambda x, y: torch.add(x, y, alpha=3),
        randint(-9, 9, (3, 4)),
        randint(-9, 9, (3, 4)),
        kinds="MPSAdd",
    ),
    # #15: _to_copy keeps its dtype (a real MPSCast)
    row(
        "aten.div.Tensor",
        "regress-to-copy-int-to-float",
        lambda x: x.to(torch.float32) / 2,
        randint(-9, 9, (3, 4)),
        kinds={"MPSCast", "MPSDiv"},
    ),
    row("dim_order_ops._to_dim_order_copy.default", "regress-to-copy-half", lambda x: x.half(), randn(3, 4), kinds="MPSCast"),
    row(
        "dim_order_ops._to_dim_order_copy.default",
        "regress-to-copy-bool",
        lambda x: x.to(torch.bool),
        values([0.0, -0.0, 0.5, NAN, -3.0]),
        kinds="MPSCast",
    ),
    row(
        "aten.add.Tensor",
        "regress-to-copy-bool-to-int",
        lambda x: x.to(torch.int32) + 1,
        randbool(5),
        kinds={"MPSCast", "MPSAdd"},
    ),
    row(
        "dim_order_ops._to_dim_order_copy.default",
        "regress-to-copy-widen",
        lambda x: x.to(torch.int64),
        randint(-9, 9, (5,), torch.int8),
        kinds="MPSCast",
    ),
    # float -> int: truncated first (the device's rounding is unverified); narrowing: wrapped first
    row(
        "dim_order_ops._to_dim_order_copy.default",
        "regress-to-copy-float-to-int",
        lambda x: x.to(torch.int32),
        randn(4, 5, scale=20.0),
        kinds={"MPSFloor", "MPSCeil", "MPSCast"},
    ),
    row(
        "dim_order_ops._to_dim_order_copy.default",
        "regress-to-copy-float-to-int-special",
        lambda x: x.to(torch.int64),
        values([-0.0, -0.5, 0.5, -1.5, 2.75, -2.75, -3.0, 1000.5]),
        kinds="MPSCast",
    ),
    # functional copy(self, src): src broadcast to self's shape, cast to self's dtype
    row("aten.copy.default", "copy-same", lambda a, b: torch.ops.aten.copy(a, b) * 2, randn(3, 4), randn(3, 4), kinds="MPSMul"),
    row(
        "aten.copy.default",
        "copy-broadcast-cast",
        lambda a, b: torch.ops.aten.copy(a, b),
        randint(-9, 9, (3, 4), torch.int64),
        randn(4, scale=8.0),
        kinds={"MPSExpand", "MPSCast"},
    ),
    # straight from floor/ceil/round: already integral, one MPSCast
    row(
        "aten.floor.default",
        "regress-to-copy-floored",
        lambda x: torch.floor(x).to(torch.int64) - torch.ceil(x).to(torch.int32),
        randn(4, 5, scale=20.0),
        kinds={"MPSFloor", "MPSCeil", "MPSCast"},
    ),
    row(
        "dim_order_ops._to_dim_order_copy.default",
        "regress-to-copy-narrow",
        lambda x: x.to(torch.int8),
        values([0, 1, -1, 127, 128, -128, -129, 300, -300, 2**31 - 1, -(2**31)], torch.int32),
        kinds={"MPSBitwiseAnd", "MPSCast"},
    ),
    row(
        "dim_order_ops._to_dim_order_copy.default",
        "regress-to-copy-narrow-int64",
        lambda x: x.to(torch.int32),
        values([0, -1, 2**31, 2**32 + 5, -(2**31) - 1, 2**40 + 2**31 + 7], torch.int64),
        kinds={"MPSBitwiseAnd", "MPSCast"},
    ),
    # #1: gelu tanh must be the tanh formula, not x*tanh(x); fp16: seven ops, each rounded -> 3e-3
    row(
        "aten.gelu.default",
        "regress-gelu-tanh",
        lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
        randn(4, 5, scale=2.0),
        kinds={"MPSTanh", "MPSMul"},
        tol={"fp16": 3e-3},
    ),
    row("aten.gelu.default", "regress-gelu", torch.nn.functional.gelu, randn(4, 5, scale=2.0), kinds="MPSGELU"),
]

ROWS = UNARY + CLAMP + REGRESSIONS
