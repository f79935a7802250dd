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
    row("binary-add", torch.add, randn(3, 4), randn(3, 4), kinds="MPSAdd"),
    row("binary-sub-broadcast", torch.sub, randn(3, 1), randn(1, 4), kinds="MPSSub"),
    row("binary-mul", torch.mul, randn(3, 4), randn(4), kinds="MPSMul"),
    row("binary-mul-int-float", torch.mul, randint(-9, 9, (3, 4)), randn(3, 4), kinds={"MPSCast", "MPSMul"}),
    row("binary-div", torch.div, randn(3, 4), nonzero(3, 4), kinds="MPSDiv"),
    row("binary-div-scalar", lambda x: x / 3.0, randn(3, 4), kinds="MPSDiv"),
    # (x * a) / d, a and d powers of two: x * (a / d), exact; x * 1024 alone overflows float16 here
    row("binary-mul-div-pow2-rescale", lambda x: x * 1024 / 1024 + 1, uniform(-1000, 1000, 3, 4), kinds="MPSAdd"),
    row("binary-mul-div-pow2-ratio", lambda x: x * 4096 / 16, uniform(-200, 200, 3, 4), kinds="MPSMul"),
    row("binary-mul-div-not-pow2", lambda x: x * 3 / 1024, uniform(-1000, 1000, 3, 4), kinds={"MPSMul", "MPSDiv"}),
    # integer true division: cast first (the device divides integers, §6 #12)
    row("binary-div-int", torch.div, randint(-50, 50, (3, 4)), nonzero_int(3, 4, dtype=torch.int32), kinds={"MPSCast", "MPSDiv"}),
    # f16 tensor + 0-dim f32 tensor: torch keeps f16, the device would promote to f32 -> cast
    row("binary-add-half-0dim-float", lambda x, y: x + y, randn(3, 4, dtype=torch.float16), randn(), kinds={"MPSCast", "MPSAdd"}),
    row("binary-rsub", lambda x: 1.0 - x, randn(3, 4), kinds="MPSSub"),
    row("binary-rsub-alpha", lambda x: torch.rsub(x, 2.0, alpha=3), randn(3, 4), kinds="MPSSub"),
    row("binary-rsub-int", lambda x: 10 - x, randint(-9, 9, (3, 4), torch.int64), kinds="MPSSub"),
]

DIVISION = [
    row(
        "binary-div-trunc",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        randn(4, 5, scale=8.0),
        pow2(4, 5),
        kinds="MPSDiv",
    ),
    row(
        "binary-div-trunc-random",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        randn(4, 5, scale=8.0),
        nonzero(4, 5),
        precisions=("fp32",),
        kinds="MPSDiv",
    ),
    row(
        "binary-div-floor",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        randn(4, 5, scale=8.0),
        pow2(4, 5),
        kinds="MPSDiv",
    ),
    row("binary-div-floor-scalar", lambda a: torch.div(a, -2.0, rounding_mode="floor"), randn(4, 5, scale=8.0), kinds="MPSDiv"),
    row(
        "binary-div-trunc-int8",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        randint(-128, 128, (4, 5), torch.int8),
        nonzero_int(4, 5),
        kinds={"MPSCast", "MPSDiv"},
    ),
    row(
        "binary-div-floor-int8",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        randint(-128, 128, (4, 5), torch.int8),
        nonzero_int(4, 5),
        kinds={"MPSCast", "MPSDiv"},
    ),
    # integers: the device's integer MPSDiv (rounding unverified) corrected with the remainder's sign:
    # exact integer arithmetic, no float detour (§6 #13), any integer dtype and magnitude
    row(
        "binary-div-floor-int32",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        randint(-99, 99, (4, 6)),
        nonzero_int(4, 6, dtype=torch.int32),
        kinds={"MPSDiv", "MPSLt", "MPSBitwiseAnd"},
    ),
    row(
        "binary-div-trunc-int64",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        randint(-999, 999, (4, 6), torch.int64),
        nonzero_int(4, 6, dtype=torch.int64),
        kinds="MPSDiv",
    ),
    # magnitudes no float holds exactly (2**53 + 1 and neighbours), both signs, exact quotients
    row(
        "binary-div-floor-int64-large",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        values([2**53 + 1, -(2**53 + 1), 2**62 + 7, -(2**62) - 7, 9, -9, 10, -10, 0, 2**31 + 5], torch.int64),
        values([3, 3, -7, -7, 3, 3, -5, -5, -4, 2**31 + 4], torch.int64),
        kinds="MPSDiv",
    ),
    row(
        "binary-div-trunc-int16-scalar",
        lambda a: torch.div(a, -7, rounding_mode="trunc"),
        randint(-32768, 32768, (5, 4), torch.int16),
        kinds="MPSDiv",
    ),
    row("binary-floor-divide", torch.floor_divide, randn(4, 5, scale=8.0), pow2(4, 5), kinds="MPSDiv"),
    row(
        "binary-floor-divide-int8",
        torch.floor_divide,
        randint(-128, 128, (4, 5), torch.int8),
        nonzero_int(4, 5),
        kinds={"MPSCast", "MPSDiv"},
    ),
    row(
        "binary-floor-divide-int64",
        torch.floor_divide,
        randint(-100, 100, (4, 5), torch.int64),
        nonzero_int(4, 5, dtype=torch.int64),
        kinds="MPSDiv",
    ),
    row(
        "binary-floor-divide-int64-broadcast",
        torch.floor_divide,
        randint(-10, 10, (20,), torch.int64),
        values([3], torch.int64),
        kinds="MPSDiv",
    ),
    row(
        "binary-floor-divide-int32-scalar", lambda a: torch.floor_divide(a, -3), randint(-(2**31), 2**31, (4, 5)), kinds="MPSDiv"
    ),
    row(
        "binary-floor-divide-int16-float-scalar",
        lambda a: torch.floor_divide(a, 2.5),
        randint(-100, 100, (4, 5), torch.int16),
        kinds={"MPSCast", "MPSDiv"},
    ),
    # fmod: MPSFmod in f32 graphs; f16 graphs decompose (MPSFmod aborts on f16, §6 #14)
    row("binary-fmod-f32", torch.fmod, randn(4, 5, scale=8.0), nonzero(4, 5), precisions=("fp32",), kinds="MPSFmod"),
    row(
        "binary-fmod-f16",
        torch.fmod,
        randn(4, 5, scale=8.0),
        pow2(4, 5),
        precisions=("fp16",),
        kinds={"MPSDiv", "MPSCeil", "MPSFloor"},
    ),
    row("binary-fmod-scalar", lambda a: torch.fmod(a, 1.5), randn(4, 5, scale=8.0), precisions=("fp32",), kinds="MPSFmod"),
    row("binary-fmod-scalar-pow2", lambda a: torch.fmod(a, -0.5), randn(4, 5, scale=8.0), precisions=("fp16",), kinds="MPSDiv"),
    row("binary-fmod-int8", torch.fmod, randint(-128, 128, (4, 5), torch.int8), nonzero_int(4, 5), kinds="MPSDiv"),
    row(
        "binary-fmod-int32",
        torch.fmod,
        randint(-99, 99, (4, 6)),
        nonzero_int(4, 6, dtype=torch.int32),
        kinds={"MPSDiv", "MPSWhere"},
    ),
    row(
        "binary-fmod-int64-large",
        torch.fmod,
        values([2**53 + 1, -(2**53 + 1), 2**62 + 7, -9, 9, 0], torch.int64),
        values([-3, 3, 10, 4, -4, -7], torch.int64),
        kinds="MPSDiv",
    ),
    row("binary-remainder", torch.remainder, randn(4, 5, scale=8.0), pow2(4, 5), kinds="MPSRemainder"),
    row(
        "binary-remainder-random",
        torch.remainder,
        randn(4, 5, scale=8.0),
        nonzero(4, 5),
        precisions=("fp32",),
        kinds="MPSRemainder",
    ),
    row("binary-remainder-scalar", lambda a: torch.remainder(a, 4.0), randn(4, 5, scale=8.0), kinds="MPSRemainder"),
    row(
        "binary-remainder-int8",
        torch.remainder,
        randint(-128, 128, (4, 5), torch.int8),
        nonzero_int(4, 5),
        kinds={"MPSDiv", "MPSWhere"},
    ),
    row(
        "binary-remainder-int64",
        torch.remainder,
        randint(-99, 99, (4, 6), torch.int64),
        nonzero_int(4, 6, dtype=torch.int64),
        kinds={"MPSDiv", "MPSWhere"},
    ),
    row("binary-remainder-int32-scalar", lambda a: torch.remainder(a, -5), randint(-999, 999, (4, 6)), kinds="MPSDiv"),
]

POW = [
    row("binary-pow-tensor", torch.pow, uniform(0.1, 3.0, 3, 4), randn(3, 4), kinds="MPSPow"),
    row("binary-pow-2", lambda x: x**2, randn(3, 4, scale=3.0), kinds="MPSMul"),
    row("binary-pow-3", lambda x: x**3, randn(3, 4, scale=3.0), kinds="MPSMul"),
    # x**4 is two squarings (two roundings) where torch rounds once: fp16 2e-3
    row("binary-pow-4", lambda x: torch.pow(x, 4.0), randn(3, 4, scale=2.0), kinds="MPSMul", tol={"fp16": 2e-3}),
    row("binary-pow-half", lambda x: x**0.5, uniform(0.0, 9.0, 3, 4), kinds="MPSSqrt"),
    row("binary-pow-minus-half", lambda x: x**-0.5, uniform(0.1, 9.0, 3, 4), kinds="MPSRsqrt"),
    row("binary-pow-minus-1", lambda x: x**-1, nonzero(3, 4), kinds="MPSReciprocal"),
    row(
        "binary-pow-minus-2", lambda x: x**-2.0, nonzero(3, 4), kinds={"MPSMul", "MPSReciprocal"}, tol={"fp16": 2e-3}
    ),  # x*x then 1/(x*x): two roundings
    row("binary-pow-0", lambda x: x**0, values([NAN, 0.0, -2.0, INF]), kinds="MPSFullLike"),
    row("binary-pow-frac", lambda x: x**2.5, uniform(0.0, 6.0, 3, 4), kinds="MPSPow"),
    row("binary-pow-scalar-base", lambda x: 2.0**x, randn(3, 4, scale=3.0), kinds="MPSPow"),
    row("binary-pow-int", lambda x: x**3, randint(-20, 20, (3, 4)), kinds="MPSMul"),
    row("binary-pow-int-wraps", lambda x: x**5, randint(-100, 100, (3, 4), torch.int16), kinds="MPSMul"),
    row("binary-pow-int-float-exponent", lambda x: x**0.5, randint(0, 50, (3, 4)), kinds={"MPSCast", "MPSSqrt"}),
    row("binary-pow-int-tensor", torch.pow, randint(0, 5, (4,)), randint(0, 4, (4,)), cpu_reason="pow"),
]

MINMAX = [
    row("binary-minimum", torch.minimum, randn(3, 4), randn(4), kinds={"MPSMinimum", "MPSIsnan"}),
    row(
        "binary-minimum-nan",
        torch.minimum,
        values([NAN, 1.0, NAN, -INF, 0.0, 2.0]),
        values([0.0, NAN, NAN, 3.0, -0.0, INF]),
        kinds="MPSMinimum",
    ),
    row("binary-minimum-int", torch.minimum, randint(-9, 9, (3, 4)), randint(-9, 9, (3, 4)), kinds="MPSMinimum"),
    row("binary-minimum-mixed", torch.minimum, randint(-9, 9, (3, 4)), randn(3, 4, scale=5.0), kinds={"MPSCast", "MPSMinimum"}),
    row("binary-maximum", torch.maximum, randn(3, 4), randn(3, 1), kinds={"MPSLt", "MPSWhere"}),
    row(
        "binary-maximum-nan",
        torch.maximum,
        values([NAN, 1.0, NAN, -INF, 5.0, 2.0]),
        values([0.0, NAN, NAN, 3.0, -7.0, INF]),
        kinds={"MPSWhere", "MPSIsnan"},
    ),
    row(
        "binary-maximum-int",
        torch.maximum,
        values([-(2**31), 5, -3, 2**31 - 1], torch.int32),
        values([0, -(2**31), -3, 0], torch.int32),
        kinds="MPSWhere",
    ),
    row("binary-maximum-bool", torch.maximum, randbool(6), randbool(6), kinds="MPSBitwiseOr"),
    row("binary-atan2", torch.atan2, randn(4, 5), randn(4, 5), kinds={"MPSAtan", "MPSDiv"}),
    row("binary-atan2-broadcast", torch.atan2, randn(4, 1, scale=3.0), randn(1, 5), kinds="MPSAtan"),
    row(
        "binary-atan2-special",
        torch.atan2,
        values([0.0, -0.0, 0.0, -0.0, 1.0, -1.0, INF, -INF, INF, -INF, 2.0, NAN, 0.0, 1.0, -0.0, 3.0]),
        values([0.0, 0.0, -0.0, -0.0, -0.0, -0.0, INF, INF, -INF, -INF, -INF, 1.0, NAN, INF, -5.0, 0.0]),
        kinds="MPSAtan",
    ),
]

BITWISE = [
    row("binary-bitwise-and", torch.bitwise_and, randint(-99, 99, (3, 4)), randint(-99, 99, (3, 4)), kinds="MPSBitwiseAnd"),
    row("binary-bitwise-or-scalar", lambda x: x | 6, randint(-99, 99, (3, 4), torch.int64), kinds="MPSBitwiseOr"),
    row(
        "binary-bitwise-xor-int8",
        torch.bitwise_xor,
        randint(-99, 99, (3, 4), torch.int8),
        randint(-99, 99, (4,), torch.int8),
        kinds="MPSBitwiseXor",
    ),
    row("binary-bitwise-and-scalar-int16", lambda x: x & 0x0F0F, randint(-999, 999, (3, 4), torch.int16), kinds="MPSBitwiseAnd"),
    row("binary-bitwise-and-bool", torch.bitwise_and, randbool(3, 4), randbool(3, 4), kinds="MPSBitwiseAnd"),
    row("binary-bitwise-xor-bool-scalar", lambda x: x ^ True, randbool(3, 4), kinds="MPSBitwiseXor"),
    row(
        "binary-logical-and",
        torch.logical_and,
        values([0.0, NAN, -0.0, 2.0]),
        values([1.0, 1.0, 1.0, 0.0]),
        kinds={"MPSNe", "MPSBitwiseAnd"},
    ),
    row("binary-logical-or-int", torch.logical_or, randint(-2, 2, (3, 4)), randbool(3, 4), kinds="MPSBitwiseOr"),
    row("binary-logical-xor", torch.logical_xor, randbool(3, 4), randbool(3, 4), kinds="MPSBitwiseXor"),
]

_CMP = {"eq": torch.eq, "ne": torch.ne, "ge": torch.ge, "gt": torch.gt, "le": torch.le, "lt": torch.lt}
_GRID = [-1.0, 0.0, 0.5, 1.0, NAN, INF, -INF, -0.0]

COMPARE = [
    *(
        row(f"compare-{name}", fn, values(_GRID * 2), values(_GRID[::-1] + _GRID), kinds=f"MPS{name.title()}")
        for name, fn in _CMP.items()
    ),
    *(
        row(f"compare-{name}-scalar", lambda x, fn=fn: fn(x, 0.5), values(_GRID), kinds=f"MPS{name.title()}")
        for name, fn in _CMP.items()
    ),
    row("compare-int-float-tensors", torch.lt, randint(-3, 3, (3, 4)), randn(3, 4, scale=2.0), kinds="MPSLt"),
    row("compare-int64-int-scalar", lambda x: x >= 3, randint(-9, 9, (3, 4), torch.int64), kinds="MPSGe"),
    row("compare-int8-wrapping-scalar", lambda x: x == 257, values([1, 2, -1], torch.int8), kinds="MPSEq"),
    row("compare-float-int-scalar", lambda x: x != 1, values(_GRID), kinds="MPSNe"),
    row("compare-bool", torch.eq, randbool(3, 4), randbool(3, 4), kinds="MPSEq"),
]

ROWS = ARITH + DIVISION + POW + MINMAX + BITWISE + COMPARE
