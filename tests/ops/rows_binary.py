"""Op-table rows: binary arithmetic, division family, pow, minimum/maximum, atan2, bitwise,
logical and comparison ops."""

from __future__ import annotations

import torch

from .harness import randbool, randint, randn, row, uniform, values

NAN, INF = float("nan"), float("inf")


def pow2(*shape):
    """Divisors ±0.5, ±2, ±4: quotients are exact, so the floor/trunc decompositions are exact in f16."""

    def make():
        mags = torch.tensor([0.5, 2.0, 4.0])[torch.randint(0, 3, shape)]
        return mags * (torch.randint(0, 2, shape) * 2 - 1)

    return make


def nonzero(*shape, lo=0.5, hi=3.0):
    return lambda: (torch.rand(*shape) * (hi - lo) + lo) * (torch.randint(0, 2, shape) * 2 - 1)


def nonzero_int(*shape, dtype=torch.int8):
    return lambda: (torch.randint(1, 12, shape) * (torch.randint(0, 2, shape) * 2 - 1)).to(dtype)


ARITH = [
    row("aten.add.Tensor", "binary-add", torch.add, randn(3, 4), randn(3, 4), kinds="MPSAdd"),
    row("aten.sub.Tensor", "binary-sub-broadcast", torch.sub, randn(3, 1), randn(1, 4), kinds="MPSSub"),
    row("aten.mul.Tensor", "binary-mul", torch.mul, randn(3, 4), randn(4), kinds="MPSMul"),
    row("aten.mul.Tensor", "binary-mul-int-float", torch.mul, randint(-9, 9, (3, 4)), randn(3, 4), kinds={"MPSCast", "MPSMul"}),
    row("aten.div.Tensor", "binary-div", torch.div, randn(3, 4), nonzero(3, 4), kinds="MPSDiv"),
    row("aten.div.Tensor", "binary-div-scalar", lambda x: x / 3.0, randn(3, 4), kinds="MPSDiv"),
    # (x * a) / d, a and d powers of two: x * (a / d), exact; x * 1024 alone overflows float16 here
    row(
        "aten.mul.Tensor",
        "binary-mul-div-pow2-rescale",
        lambda x: x * 1024 / 1024 + 1,
        uniform(-1000, 1000, 3, 4),
        kinds="MPSAdd",
    ),
    row("aten.mul.Tensor", "binary-mul-div-pow2-ratio", lambda x: x * 4096 / 16, uniform(-200, 200, 3, 4), kinds="MPSMul"),
    row(
        "aten.mul.Tensor",
        "binary-mul-div-not-pow2",
        lambda x: x * 3 / 1024,
        uniform(-1000, 1000, 3, 4),
        kinds={"MPSMul", "MPSDiv"},
    ),
    # integer true division: cast first (the device divides integers, §6 #12)
    row(
        "aten.div.Tensor",
        "binary-div-int",
        torch.div,
        randint(-50, 50, (3, 4)),
        nonzero_int(3, 4, dtype=torch.int32),
        kinds={"MPSCast", "MPSDiv"},
    ),
    # f16 tensor + 0-dim f32 tensor: torch keeps f16, the device would promote to f32 -> cast
    row(
        "aten.add.Tensor",
        "binary-add-half-0dim-float",
        lambda x, y: x + y,
        randn(3, 4, dtype=torch.float16),
        randn(),
        kinds={"MPSCast", "MPSAdd"},
    ),
    row("aten.sub.Tensor", "binary-rsub", lambda x: 1.0 - x, randn(3, 4), kinds="MPSSub"),
    row("aten.sub.Tensor", "binary-rsub-alpha", lambda x: torch.rsub(x, 2.0, alpha=3), randn(3, 4), kinds="MPSSub"),
    row("aten.sub.Tensor", "binary-rsub-int", lambda x: 10 - x, randint(-9, 9, (3, 4), torch.int64), kinds="MPSSub"),
]

DIVISION = [
    row(
        "aten.div.Tensor_mode",
        "binary-div-trunc",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        randn(4, 5, scale=8.0),
        pow2(4, 5),
        kinds="MPSDiv",
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-div-trunc-random",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        randn(4, 5, scale=8.0),
        nonzero(4, 5),
        precisions=("fp32",),
        kinds="MPSDiv",
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-div-floor",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        randn(4, 5, scale=8.0),
        pow2(4, 5),
        kinds="MPSDiv",
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-div-floor-scalar",
        lambda a: torch.div(a, -2.0, rounding_mode="floor"),
        randn(4, 5, scale=8.0),
        kinds="MPSDiv",
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-div-trunc-int8",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        randint(-128, 128, (4, 5), torch.int8),
        nonzero_int(4, 5),
        kinds={"MPSCast", "MPSDiv"},
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-div-floor-int8",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        randint(-128, 128, (4, 5), torch.int8),
        nonzero_int(4, 5),
        kinds={"MPSCast", "MPSDiv"},
    ),
    # integers: the device's integer MPSDiv (rounding unverified) corrected with the remainder's sign:
    # exact integer arithmetic, no float detour (§6 #13), any integer dtype and magnitude
    row(
        "aten.div.Tensor_mode",
        "binary-div-floor-int32",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        randint(-99, 99, (4, 6)),
        nonzero_int(4, 6, dtype=torch.int32),
        kinds={"MPSDiv", "MPSLt", "MPSBitwiseAnd"},
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-div-trunc-int64",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        randint(-999, 999, (4, 6), torch.int64),
        nonzero_int(4, 6, dtype=torch.int64),
        kinds="MPSDiv",
    ),
    # magnitudes no float holds exactly (2**53 + 1 and neighbours), both signs, exact quotients
    row(
        "aten.div.Tensor_mode",
        "binary-div-floor-int64-large",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        values([2**53 + 1, -(2**53 + 1), 2**62 + 7, -(2**62) - 7, 9, -9, 10, -10, 0, 2**31 + 5], torch.int64),
        values([3, 3, -7, -7, 3, 3, -5, -5, -4, 2**31 + 4], torch.int64),
        kinds="MPSDiv",
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-div-trunc-int16-scalar",
        lambda a: torch.div(a, -7, rounding_mode="trunc"),
        randint(-32768, 32768, (5, 4), torch.int16),
        kinds="MPSDiv",
    ),
    row("aten.div.Tensor_mode", "binary-floor-divide", torch.floor_divide, randn(4, 5, scale=8.0), pow2(4, 5), kinds="MPSDiv"),
    row(
        "aten.div.Tensor_mode",
        "binary-floor-divide-int8",
        torch.floor_divide,
        randint(-128, 128, (4, 5), torch.int8),
        nonzero_int(4, 5),
        kinds={"MPSCast", "MPSDiv"},
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-floor-divide-int64",
        torch.floor_divide,
        randint(-100, 100, (4, 5), torch.int64),
        nonzero_int(4, 5, dtype=torch.int64),
        kinds="MPSDiv",
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-floor-divide-int64-broadcast",
        torch.floor_divide,
        randint(-10, 10, (20,), torch.int64),
        values([3], torch.int64),
        kinds="MPSDiv",
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-floor-divide-int32-scalar",
        lambda a: torch.floor_divide(a, -3),
        randint(-(2**31), 2**31, (4, 5)),
        kinds="MPSDiv",
    ),
    row(
        "aten.div.Tensor_mode",
        "binary-floor-divide-int16-float-scalar",
        lambda a: torch.floor_divide(a, 2.5),
        randint(-100, 100, (4, 5), torch.int16),
        kinds={"MPSCast", "MPSDiv"},
    ),
    # fmod: MPSFmod in f32 graphs; f16 graphs decompose (MPSFmod aborts on f16, §6 #14)
    row(
        "aten.fmod.Tensor",
        "binary-fmod-f32",
        torch.fmod,
        randn(4, 5, scale=8.0),
        nonzero(4, 5),
        precisions=("fp32",),
        kinds="MPSFmod",
    ),
    row(
        "aten.fmod.Tensor",
        "binary-fmod-f16",
        torch.fmod,
        randn(4, 5, scale=8.0),
        pow2(4, 5),
        precisions=("fp16",),
        kinds={"MPSDiv", "MPSCeil", "MPSFloor"},
    ),
    row(
        "aten.fmod.Scalar",
        "binary-fmod-scalar",
        lambda a: torch.fmod(a, 1.5),
        randn(4, 5, scale=8.0),
        precisions=("fp32",),
        kinds="MPSFmod",
    ),
    row(
        "aten.fmod.Scalar",
        "binary-fmod-scalar-pow2",
        lambda a: torch.fmod(a, -0.5),
        randn(4, 5, scale=8.0),
        precisions=("fp16",),
        kinds="MPSDiv",
    ),
    row(
        "aten.fmod.Tensor",
        "binary-fmod-int8",
        torch.fmod,
        randint(-128, 128, (4, 5), torch.int8),
        nonzero_int(4, 5),
        kinds="MPSDiv",
    ),
    row(
        "aten.fmod.Tensor",
        "binary-fmod-int32",
        torch.fmod,
        randint(-99, 99, (4, 6)),
        nonzero_int(4, 6, dtype=torch.int32),
        kinds={"MPSDiv", "MPSWhere"},
    ),
    row(
        "aten.fmod.Tensor",
        "binary-fmod-int64-large",
        torch.fmod,
        values([2**53 + 1, -(2**53 + 1), 2**62 + 7, -9, 9, 0], torch.int64),
        values([-3, 3, 10, 4, -4, -7], torch.int64),
        kinds="MPSDiv",
    ),
    row("aten.remainder.Tensor", "binary-remainder", torch.remainder, randn(4, 5, scale=8.0), pow2(4, 5), kinds="MPSRemainder"),
    row(
        "aten.remainder.Tensor",
        "binary-remainder-random",
        torch.remainder,
        randn(4, 5, scale=8.0),
        nonzero(4, 5),
        precisions=("fp32",),
        kinds="MPSRemainder",
    ),
    row(
        "aten.remainder.Scalar",
        "binary-remainder-scalar",
        lambda a: torch.remainder(a, 4.0),
        randn(4, 5, scale=8.0),
        kinds="MPSRemainder",
    ),
    row(
        "aten.remainder.Tensor",
        "binary-remainder-int8",
        torch.remainder,
        randint(-128, 128, (4, 5), torch.int8),
        nonzero_int(4, 5),
        kinds={"MPSDiv", "MPSWhere"},
    ),
    row(
        "aten.remainder.Tensor",
        "binary-remainder-int64",
        torch.remainder,
        randint(-99, 99, (4, 6), torch.int64),
        nonzero_int(4, 6, dtype=torch.int64),
        kinds={"MPSDiv", "MPSWhere"},
    ),
    row(
        "aten.remainder.Scalar",
        "binary-remainder-int32-scalar",
        lambda a: torch.remainder(a, -5),
        randint(-999, 999, (4, 6)),
        kinds="MPSDiv",
    ),
]

POW = [
    row("aten.pow.Tensor_Tensor", "binary-pow-tensor", torch.pow, uniform(0.1, 3.0, 3, 4), randn(3, 4), kinds="MPSPow"),
    row("aten.pow.Tensor_Scalar", "binary-pow-2", lambda x: x**2, randn(3, 4, scale=3.0), kinds="MPSMul"),
    row("aten.pow.Tensor_Scalar", "binary-pow-3", lambda x: x**3, randn(3, 4, scale=3.0), kinds="MPSMul"),
    # x**4 is two squarings (two roundings) where torch rounds once: fp16 2e-3
    row(
        "aten.pow.Tensor_Scalar",
        "binary-pow-4",
        lambda x: torch.pow(x, 4.0),
        randn(3, 4, scale=2.0),
        kinds="MPSMul",
        tol={"fp16": 2e-3},
    ),
    row("aten.pow.Tensor_Scalar", "binary-pow-half", lambda x: x**0.5, uniform(0.0, 9.0, 3, 4), kinds="MPSSqrt"),
    row("aten.pow.Tensor_Scalar", "binary-pow-minus-half", lambda x: x**-0.5, uniform(0.1, 9.0, 3, 4), kinds="MPSRsqrt"),
    row("aten.pow.Tensor_Scalar", "binary-pow-minus-1", lambda x: x**-1, nonzero(3, 4), kinds="MPSReciprocal"),
    row(
        "aten.pow.Tensor_Scalar",
        "binary-pow-minus-2",
        lambda x: x**-2.0,
        nonzero(3, 4),
        kinds={"MPSMul", "MPSReciprocal"},
        tol={"fp16": 2e-3},
    ),  # x*x then 1/(x*x): two roundings
    row("aten.pow.Tensor_Scalar", "binary-pow-0", lambda x: x**0, values([NAN, 0.0, -2.0, INF]), kinds="MPSFullLike"),
    row("aten.pow.Tensor_Scalar", "binary-pow-frac", lambda x: x**2.5, uniform(0.0, 6.0, 3, 4), kinds="MPSPow"),
    row("aten.pow.Scalar", "binary-pow-scalar-base", lambda x: 2.0**x, randn(3, 4, scale=3.0), kinds="MPSPow"),
    row("aten.pow.Tensor_Scalar", "binary-pow-int", lambda x: x**3, randint(-20, 20, (3, 4)), kinds="MPSMul"),
    row(
        "aten.pow.Tensor_Scalar", "binary-pow-int-wraps", lambda x: x**5, randint(-100, 100, (3, 4), torch.int16), kinds="MPSMul"
    ),
    row(
        "aten.pow.Tensor_Scalar",
        "binary-pow-int-float-exponent",
        lambda x: x**0.5,
        randint(0, 50, (3, 4)),
        kinds={"MPSCast", "MPSSqrt"},
    ),
    row("aten.pow.Tensor_Tensor", "binary-pow-int-tensor", torch.pow, randint(0, 5, (4,)), randint(0, 4, (4,)), cpu_reason="pow"),
]

MINMAX = [
    row("aten.minimum.default", "binary-minimum", torch.minimum, randn(3, 4), randn(4), kinds={"MPSMinimum", "MPSIsnan"}),
    row(
        "aten.minimum.default",
        "binary-minimum-nan",
        torch.minimum,
        values([NAN, 1.0, NAN, -INF, 0.0, 2.0]),
        values([0.0, NAN, NAN, 3.0, -0.0, INF]),
        kinds="MPSMinimum",
    ),
    row(
        "aten.minimum.default",
        "binary-minimum-int",
        torch.minimum,
        randint(-9, 9, (3, 4)),
        randint(-9, 9, (3, 4)),
        kinds="MPSMinimum",
    ),
    row(
        "aten.minimum.default",
        "binary-minimum-mixed",
        torch.minimum,
        randint(-9, 9, (3, 4)),
        randn(3, 4, scale=5.0),
        kinds={"MPSCast", "MPSMinimum"},
    ),
    row("aten.maximum.default", "binary-maximum", torch.maximum, randn(3, 4), randn(3, 1), kinds={"MPSLt", "MPSWhere"}),
    row(
        "aten.maximum.default",
        "binary-maximum-nan",
        torch.maximum,
        values([NAN, 1.0, NAN, -INF, 5.0, 2.0]),
        values([0.0, NAN, NAN, 3.0, -7.0, INF]),
        kinds={"MPSWhere", "MPSIsnan"},
    ),
    row(
        "aten.maximum.default",
        "binary-maximum-int",
        torch.maximum,
        values([-(2**31), 5, -3, 2**31 - 1], torch.int32),
        values([0, -(2**31), -3, 0], torch.int32),
        kinds="MPSWhere",
    ),
    row("aten.maximum.default", "binary-maximum-bool", torch.maximum, randbool(6), randbool(6), kinds="MPSBitwiseOr"),
    row("aten.atan2.default", "binary-atan2", torch.atan2, randn(4, 5), randn(4, 5), kinds={"MPSAtan", "MPSDiv"}),
    row("aten.atan2.default", "binary-atan2-broadcast", torch.atan2, randn(4, 1, scale=3.0), randn(1, 5), kinds="MPSAtan"),
    row(
        "aten.atan2.default",
        "binary-atan2-special",
        torch.atan2,
        values([0.0, -0.0, 0.0, -0.0, 1.0, -1.0, INF, -INF, INF, -INF, 2.0, NAN, 0.0, 1.0, -0.0, 3.0]),
        values([0.0, 0.0, -0.0, -0.0, -0.0, -0.0, INF, INF, -INF, -INF, -INF, 1.0, NAN, INF, -5.0, 0.0]),
        kinds="MPSAtan",
    ),
]

BITWISE = [
    row(
        "aten.bitwise_and.Tensor",
        "binary-bitwise-and",
        torch.bitwise_and,
        randint(-99, 99, (3, 4)),
        randint(-99, 99, (3, 4)),
        kinds="MPSBitwiseAnd",
    ),
    row(
        "aten.bitwise_or.Scalar",
        "binary-bitwise-or-scalar",
        lambda x: x | 6,
        randint(-99, 99, (3, 4), torch.int64),
        kinds="MPSBitwiseOr",
    ),
    row(
        "aten.bitwise_xor.Tensor",
        "binary-bitwise-xor-int8",
        torch.bitwise_xor,
        randint(-99, 99, (3, 4), torch.int8),
        randint(-99, 99, (4,), torch.int8),
        kinds="MPSBitwiseXor",
    ),
    row(
        "aten.bitwise_and.Scalar",
        "binary-bitwise-and-scalar-int16",
        lambda x: x & 0x0F0F,
        randint(-999, 999, (3, 4), torch.int16),
        kinds="MPSBitwiseAnd",
    ),
    row(
        "aten.bitwise_and.Tensor",
        "binary-bitwise-and-bool",
        torch.bitwise_and,
        randbool(3, 4),
        randbool(3, 4),
        kinds="MPSBitwiseAnd",
    ),
    row("aten.bitwise_xor.Scalar", "binary-bitwise-xor-bool-scalar", lambda x: x ^ True, randbool(3, 4), kinds="MPSBitwiseXor"),
    row(
        "aten.logical_and.default",
        "binary-logical-and",
        torch.logical_and,
        values([0.0, NAN, -0.0, 2.0]),
        values([1.0, 1.0, 1.0, 0.0]),
        kinds={"MPSNe", "MPSBitwiseAnd"},
    ),
    row(
        "aten.logical_or.default",
        "binary-logical-or-int",
        torch.logical_or,
        randint(-2, 2, (3, 4)),
        randbool(3, 4),
        kinds="MPSBitwiseOr",
    ),
    row(
        "aten.logical_xor.default", "binary-logical-xor", torch.logical_xor, randbool(3, 4), randbool(3, 4), kinds="MPSBitwiseXor"
    ),
]

_CMP = {"eq": torch.eq, "ne": torch.ne, "ge": torch.ge, "gt": torch.gt, "le": torch.le, "lt": torch.lt}
_GRID = [-1.0, 0.0, 0.5, 1.0, NAN, INF, -INF, -0.0]

COMPARE = [
    *(
        row(
            f"aten.{name}.Tensor",
            f"compare-{name}",
            fn,
            values(_GRID * 2),
            values(_GRID[::-1] + _GRID),
            kinds=f"MPS{name.title()}",
        )
        for name, fn in _CMP.items()
    ),
    *(
        row(
            f"aten.{name}.Scalar",
            f"compare-{name}-scalar",
            lambda x, fn=fn: fn(x, 0.5),
            values(_GRID),
            kinds=f"MPS{name.title()}",
        )
        for name, fn in _CMP.items()
    ),
    row("aten.lt.Tensor", "compare-int-float-tensors", torch.lt, randint(-3, 3, (3, 4)), randn(3, 4, scale=2.0), kinds="MPSLt"),
    row("aten.ge.Scalar", "compare-int64-int-scalar", lambda x: x >= 3, randint(-9, 9, (3, 4), torch.int64), kinds="MPSGe"),
    row("aten.eq.Scalar", "compare-int8-wrapping-scalar", lambda x: x == 257, values([1, 2, -1], torch.int8), kinds="MPSEq"),
    row("aten.ne.Scalar", "compare-float-int-scalar", lambda x: x != 1, values(_GRID), kinds="MPSNe"),
    row("aten.eq.Tensor", "compare-bool", torch.eq, randbool(3, 4), randbool(3, 4), kinds="MPSEq"),
]

ROWS = ARITH + DIVISION + POW + MINMAX + BITWISE + COMPARE
