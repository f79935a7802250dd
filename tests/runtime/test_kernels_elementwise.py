"""Device-model kernels of the elementwise families, on one-node graphs written with the writer.

Every expectation is the behaviour of docs/device-semantics.md (§3.3, §5.1-§5.8, §5.11
MPSCast, §5.16) written out here independently of the kernels.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mps_backend.runtime.core import DeviceError
from mps_backend.serialization.model import DataType

from .helpers import GraphSpec, one_node, run_graph

NAN, INF = math.nan, math.inf
F16, F32, I32, I64 = torch.float16, torch.float32, torch.int32, torch.int64


def same(actual: torch.Tensor, expected: torch.Tensor, exact: bool = False, **tol) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert tuple(actual.shape) == tuple(expected.shape), (tuple(actual.shape), tuple(expected.shape))
    if exact:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(actual, expected, equal_nan=True, **tol)


def t(values, dtype=F32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def rnd(*shape, dtype=F32, seed=0, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def fails(match: str):
    return pytest.raises(DeviceError, match=match)


# ------------------------------------------------------------------------------------- activations
class TestActivations:
    def test_hardtanh_selects_bounds_and_passes_nan(self):
        x = t([-3.0, -1.0, 0.5, 2.0, NAN])
        y = run_graph("MPSHardTanh", [x], min_value=-1.5, max_value=1.0)
        same(y, t([-1.5, -1.0, 0.5, 1.0, NAN]), exact=True)

    def test_hardtanh_bounds_are_constants_in_x_dtype(self):
        x = t([0.0, 0.2], F16)
        y = run_graph("MPSHardTanh", [x], min_value=0.1, max_value=6.0)
        same(y, t([0.1, 0.2], F16), exact=True)  # 0.1 rounded to f16

    def test_relu(self):
        same(run_graph("MPSReLU", [t([-1.0, 0.0, 3.0])], input2_id=0), t([0.0, 0.0, 3.0]), exact=True)

    def test_gelu_tanh_is_x_times_tanh_x_on_device(self):
        x = rnd(4, 5)
        same(run_graph("MPSGELU", [x], approximate="tanh"), x * torch.tanh(x))
        same(run_graph("MPSGELU", [x], approximate="tanh", mode="aten"), F.gelu(x, approximate="tanh"))

    def test_gelu_exact(self):
        x = rnd(4, 5)
        expected = 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
        same(run_graph("MPSGELU", [x], approximate="none"), expected)

    def test_gelu_in_place_ids_multiplies_inner_result_by_itself(self):
        x = rnd(6)
        g = GraphSpec()
        v = g.input(x)
        g.node("MPSGELU", input1_id=v, output_id=v, approximate="tanh").output(v)
        (y,) = g.run([x])
        same(y, torch.tanh(x) * torch.tanh(x))

    def test_gelu_f16_rounds_tanh_and_the_product(self):
        x = rnd(64, dtype=F16, scale=3)
        xf = x.float()
        inner = torch.tanh(xf).half().float()  # the tanh op's f16 output, then the multiplication
        same(run_graph("MPSGELU", [x], approximate="tanh"), (inner * xf).half(), exact=True)

    def test_leaky_relu(self):
        x = t([-2.0, -0.0, 0.0, 3.0, NAN])
        same(run_graph("MPSLeakyReLU", [x], negative_slope=0.25), t([-0.5, -0.0, 0.0, 3.0, NAN]), exact=True)

    def test_softmax(self):
        x = rnd(3, 7)
        same(run_graph("MPSSoftmax", [x], dim=-1, half_to_float=False), torch.softmax(x, -1))
        same(run_graph("MPSSoftmax", [x], dim=0, half_to_float=False), torch.softmax(x, 0))

    @pytest.mark.parametrize("op", ["MPSSoftmax", "MPSLogSoftmax"])
    def test_half_to_float_aborts(self, op):
        x = rnd(2, 3, dtype=F16)
        with fails("half to float"):
            run_graph(op, [x], dim=1, half_to_float=True)
        y = run_graph(op, [x], dim=1, half_to_float=True, mode="aten", out_dtype=DataType.float32)
        assert y.dtype == F32

    def test_log_softmax_is_log_of_f16_softmax(self):
        x = t([[0.0, -20.0, -1.0]], F16)
        y = run_graph("MPSLogSoftmax", [x], dim=1, half_to_float=False)
        probs = torch.softmax(x.float(), 1).half()  # the softmax tensor is f16 on the device
        same(y, torch.log(probs.float()).half(), exact=True)
        assert y[0, 1] == -INF
        aten = run_graph("MPSLogSoftmax", [x], dim=1, half_to_float=False, mode="aten")
        assert torch.isfinite(aten).all()
        same(aten, torch.log_softmax(x.float(), 1).half(), exact=True)


# ------------------------------------------------------------------------------------------ binary
class TestAddSub:
    def test_alpha_one_is_plain_add(self):
        a, b = rnd(3), rnd(3, seed=1)
        same(run_graph("MPSAdd", [a, b], alpha=1.0), a + b, exact=True)

    def test_alpha_scales_b(self):
        a, b = rnd(3), rnd(3, seed=1)
        same(run_graph("MPSAdd", [a, b], alpha=0.5), a + b * 0.5)
        same(run_graph("MPSSub", [a, b], alpha=2.0), a - b * 2.0)

    def test_alpha_is_truncated_for_integer_operands(self):
        a, b = t([10, 20], I32), t([1, -3], I32)
        same(run_graph("MPSAdd", [a, b], alpha=2.0), t([12, 14], I32), exact=True)
        same(run_graph("MPSAdd", [a, b], alpha=2.7), t([12, 14], I32), exact=True)  # 2.7 -> 2
        same(run_graph("MPSSub", [a, b], alpha=-1.9), t([11, 17], I32), exact=True)  # -1.9 -> -1

    def test_schema_default_alpha_zero_drops_b(self):
        a, b = rnd(3), rnd(3, seed=1)
        same(run_graph("MPSAdd", [a, b], alpha=0.0), a, exact=True)

    @pytest.mark.parametrize("da,db,dout", [(I32, F16, F16), (F16, F32, F32), (torch.bool, I64, I64), (torch.int8, I32, I32)])
    def test_promotion(self, da, db, dout):
        a, b = t([1, 0, 1], da), t([2, 3, 4], db)
        y = run_graph("MPSAdd", [a, b], alpha=1.0, out_dtype=None)
        same(y, a.to(dout) + b.to(dout), exact=True)

    def test_int64_is_rounded_when_promoted_to_f16(self):
        a, b = t([2049], I64), t([0.0], F16)
        same(run_graph("MPSAdd", [a, b], alpha=1.0), t([2048.0], F16), exact=True)

    def test_broadcast(self):
        a, b = rnd(2, 1, 3), rnd(4, 1, seed=1)
        same(run_graph("MPSMul", [a, b]), a * b)

    def test_shape_mismatch_fails_to_build(self):
        with fails("MPSGraph would fail"):
            run_graph("MPSMul", [rnd(2), rnd(3)])

    def test_f16_rounds_alpha_times_b_and_the_sum(self):
        a, b = t([-3.0], F16), t([1.0 + 2.0**-10], F16)
        # 3 * b = 3 + 1.5 * 2^-9 is a tie in f16 and rounds to 3 + 2^-8; -3 + that = 2^-8.
        # Without the intermediate rounding: -3 + 3.0029296875 = 3 * 2^-10 (exact in f16).
        same(run_graph("MPSAdd", [a, b], alpha=3.0), t([2.0**-8], F16), exact=True)


class TestArithmetic:
    def test_pow(self):
        a, b = t([2.0, 4.0, 9.0]), t([3.0, 0.5, 0.5])
        same(run_graph("MPSPow", [a, b]), t([8.0, 2.0, 3.0]))

    def test_pow_integer(self):
        same(run_graph("MPSPow", [t([2, 3], I32), t([10, 2], I32)]), t([1024, 9], I32), exact=True)

    def test_minimum_does_not_propagate_nan(self):
        a, b = t([1.0, NAN, NAN, 5.0]), t([NAN, 2.0, NAN, 3.0])
        same(run_graph("MPSMinimum", [a, b]), t([1.0, 2.0, NAN, 3.0]), exact=True)
        same(run_graph("MPSMinimum", [a, b], mode="aten"), t([NAN, NAN, NAN, 3.0]), exact=True)

    def test_minimum_integers(self):
        same(run_graph("MPSMinimum", [t([1, 7], I64), t([3, -2], I32)]), t([1, -2], I64), exact=True)

    @pytest.mark.parametrize("op", ["MPSMin", "MPSMax", "MPSAtan2"])
    def test_not_dispatched(self, op):
        for mode in ("faithful", "aten"):
            with fails("not dispatched"):
                run_graph(op, [rnd(2), rnd(2, seed=1)], mode=mode)


class TestDivision:
    def test_float_true_division(self):
        a, b = rnd(5), rnd(5, seed=1)
        same(run_graph("MPSDiv", [a, b], rounding_mode=None), a / b, exact=True)

    def test_integer_division_without_mode_stays_integer(self):
        a, b = t([7, -7, 6], I32), t([2, 2, -4], I32)
        same(run_graph("MPSDiv", [a, b], rounding_mode=None), t([3, -3, -1], I32), exact=True)
        aten = run_graph("MPSDiv", [a, b], rounding_mode=None, mode="aten")
        same(aten, t([3.5, -3.5, -1.5]), exact=True)

    def test_integer_division_by_zero_is_not_modelled(self):
        with fails("division by zero"):
            run_graph("MPSDiv", [t([1], I32), t([0], I32)], rounding_mode=None)

    def test_integer_operands_with_mode_give_f32(self):
        a, b = t([7, -7], I64), t([2, 2], I64)
        same(run_graph("MPSDiv", [a, b], rounding_mode="floor"), t([3.0, -4.0]), exact=True)
        same(run_graph("MPSDiv", [a, b], rounding_mode="trunc"), t([3.0, -3.0]), exact=True)
        same(run_graph("MPSDiv", [a, b], rounding_mode="floor", mode="aten"), t([3, -4], I64), exact=True)

    def test_trunc_with_f16_first_operand_aborts(self):
        a, b = t([7.0], F16), t([2.0], F32)
        with fails("float16"):
            run_graph("MPSDiv", [a, b], rounding_mode="trunc")
        same(run_graph("MPSDiv", [b, a], rounding_mode="trunc"), t([0.0]), exact=True)  # a is f32 here
        same(run_graph("MPSDiv", [a, a], rounding_mode="floor"), t([1.0], F16), exact=True)
        same(run_graph("MPSDiv", [a, b], rounding_mode="trunc", mode="aten"), t([3.0]), exact=True)

    def test_invalid_mode_with_float_output(self):
        with fails("rounding mode"):
            run_graph("MPSDiv", [t([1.0]), t([2.0])], rounding_mode="round")

    def test_fmod_default_trunc(self):
        a, b = t([5.5, -5.5, 5.5]), t([2.0, 2.0, -2.0])
        same(run_graph("MPSFmod", [a, b], rounding_mode=None), t([1.5, -1.5, 1.5]), exact=True)

    def test_fmod_f16_aborts(self):
        x = t([5.5], F16)
        with fails("float16"):
            run_graph("MPSFmod", [x, x], rounding_mode=None)
        same(run_graph("MPSFmod", [x, t([2.0], F16)], rounding_mode=None, mode="aten"), t([1.5], F16))

    def test_fmod_integers_return_f32(self):
        same(run_graph("MPSFmod", [t([7, -7], I32), t([3, 3], I32)], rounding_mode=None), t([1.0, -1.0]), exact=True)

    def test_fmod_floor_returns_the_quotient(self):
        a, b = t([7.0, -7.0]), t([2.0, 2.0])
        same(run_graph("MPSFmod", [a, b], rounding_mode="floor"), t([3.0, -4.0]), exact=True)
        same(run_graph("MPSFmod", [a, b], rounding_mode="floor", mode="aten"), t([1.0, -1.0]), exact=True)

    def test_remainder_default_floor(self):
        a, b = t([5.5, -5.5, 5.5]), t([2.0, 2.0, -2.0])
        same(run_graph("MPSRemainder", [a, b], rounding_mode=None), t([1.5, 0.5, -0.5]), exact=True)

    def test_remainder_integers_return_f32(self):
        same(run_graph("MPSRemainder", [t([-7], I32), t([3], I32)], rounding_mode=None), t([2.0]), exact=True)
        same(run_graph("MPSRemainder", [t([-7], I32), t([3], I32)], rounding_mode=None, mode="aten"), t([2], I32), exact=True)

    def test_remainder_trunc_returns_the_quotient(self):
        same(run_graph("MPSRemainder", [t([-7.0]), t([2.0])], rounding_mode="trunc"), t([-3.0]), exact=True)

    def test_remainder_f16_rounds_each_step(self):
        a, b = t([1000.3], F16), t([0.7], F16)
        af, bf = a.float(), b.float()
        q = torch.floor((af / bf).half().float())
        expected = (af - (q * bf).half().float()).half()
        same(run_graph("MPSRemainder", [a, b], rounding_mode=None), expected, exact=True)


# --------------------------------------------------------------------------- bitwise and compare
class TestBitwise:
    @pytest.mark.parametrize(
        "op,fn", [("MPSBitwiseAnd", torch.bitwise_and), ("MPSBitwiseOr", torch.bitwise_or), ("MPSBitwiseXor", torch.bitwise_xor)]
    )
    def test_integers_and_bools(self, op, fn):
        a, b = t([12, -1, 5], torch.int8), t([10, 7, 0], I32)
        same(run_graph(op, [a, b]), fn(a.to(I32), b), exact=True)
        p, q = t([True, True, False, False], torch.bool), t([True, False, True, False], torch.bool)
        same(run_graph(op, [p, q]), fn(p, q), exact=True)

    def test_float_operands_fail(self):
        with fails("bitwise"):
            run_graph("MPSBitwiseAnd", [t([1.0]), t([1], I32)])

    def test_not(self):
        same(run_graph("MPSBitwiseNot", [t([True, False], torch.bool)]), t([False, True], torch.bool), exact=True)
        same(run_graph("MPSBitwiseNot", [t([0, 5, -1], I32)]), t([-1, -6, 0], I32), exact=True)
        with fails("bitwise NOT"):
            run_graph("MPSBitwiseNot", [t([1.0])])


class TestCompare:
    @pytest.mark.parametrize(
        "op,fn",
        [
            ("MPSEq", torch.eq),
            ("MPSNe", torch.ne),
            ("MPSGe", torch.ge),
            ("MPSGt", torch.gt),
            ("MPSLe", torch.le),
            ("MPSLt", torch.lt),
        ],
    )
    def test_bool_output_with_broadcast(self, op, fn):
        a, b = t([[1.0], [2.0], [NAN]]), t([1.0, 2.0, 3.0])
        y = run_graph(op, [a, b], out_dtype=DataType.bool, out_dims=(3, 3))
        same(y, fn(a, b), exact=True)

    def test_operands_are_promoted_before_comparing(self):
        # int64 2049 promoted to f16 becomes 2048
        y = run_graph("MPSEq", [t([2049, 2050], I64), t([2048.0, 2048.0], F16)])
        same(y, t([True, False], torch.bool), exact=True)


# ------------------------------------------------------------------------------------------- unary
FLOAT_MATH = [
    ("MPSExp", torch.exp),
    ("MPSExp2", torch.exp2),
    ("MPSReciprocal", torch.reciprocal),
    ("MPSSqrt", torch.sqrt),
    ("MPSRsqrt", torch.rsqrt),
    ("MPSLog", torch.log),
    ("MPSLog10", torch.log10),
    ("MPSLog2", torch.log2),
    ("MPSErf", torch.erf),
    ("MPSSigmoid", torch.sigmoid),
    ("MPSSin", torch.sin),
    ("MPSCos", torch.cos),
    ("MPSTan", torch.tan),
    ("MPSAsin", torch.asin),
    ("MPSAcos", torch.acos),
    ("MPSAtan", torch.atan),
    ("MPSSinh", torch.sinh),
    ("MPSCosh", torch.cosh),
    ("MPSTanh", torch.tanh),
    ("MPSAsinh", torch.asinh),
    ("MPSAcosh", torch.acosh),
    ("MPSAtanh", torch.atanh),
]


class TestUnary:
    @pytest.mark.parametrize("op,fn", FLOAT_MATH)
    def test_float_math_f32_and_f16(self, op, fn):
        x = torch.linspace(0.05, 0.95, 19)
        if op == "MPSAcosh":
            x = x + 1.0
        same(run_graph(op, [x]), fn(x))
        h = x.half()
        same(run_graph(op, [h]), fn(h.float()).half(), exact=True)

    @pytest.mark.parametrize("op", ["MPSExp", "MPSSqrt", "MPSSigmoid"])
    def test_float_math_on_integers(self, op):
        x = t([1, 4], I32)
        with fails("unverified"):
            run_graph(op, [x])
        assert run_graph(op, [x], mode="aten", out_dtype=DataType.float32).dtype == F32

    @pytest.mark.parametrize("op,fn", [("MPSNeg", torch.neg), ("MPSAbs", torch.abs), ("MPSSign", torch.sign)])
    def test_integer_capable(self, op, fn):
        for x in (t([-3, 0, 4], I64), t([-1.5, 0.0, 2.5], F16)):
            same(run_graph(op, [x]), fn(x), exact=True)

    def test_floor_ceil(self):
        x = t([-1.5, -0.5, 0.5, 1.5])
        same(run_graph("MPSFloor", [x]), t([-2.0, -1.0, 0.0, 1.0]), exact=True)
        same(run_graph("MPSCeil", [x]), t([-1.0, -0.0, 1.0, 2.0]), exact=True)
        same(run_graph("MPSFloor", [t([3, -3], I32)]), t([3, -3], I32), exact=True)

    def test_round_ties_away_from_zero(self):
        x = t([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, 2.6, -2.4, NAN, INF])
        same(run_graph("MPSRound", [x]), t([1.0, 2.0, 3.0, -1.0, -3.0, 0.0, 3.0, -2.0, NAN, INF]), exact=True)
        same(run_graph("MPSRound", [x], mode="aten"), torch.round(x), exact=True)
        h = t([0.5, 2.5, -2.5, 1023.5, 0.4998], F16)
        same(run_graph("MPSRound", [h]), t([1.0, 3.0, -3.0, 1024.0, 0.0], F16), exact=True)
        same(run_graph("MPSRound", [t([7, -7], I32)]), t([7, -7], I32), exact=True)

    def test_isnan_isinf(self):
        x = t([1.0, NAN, INF, -INF])
        same(run_graph("MPSIsnan", [x], out_dtype=DataType.bool), t([False, True, False, False], torch.bool))
        same(run_graph("MPSIsinf", [x], out_dtype=DataType.bool), t([False, False, True, True], torch.bool))

    def test_logical_not(self):
        same(run_graph("MPSLogicalNot", [t([True, False], torch.bool)]), t([False, True], torch.bool), exact=True)
        with fails("unverified"):
            run_graph("MPSLogicalNot", [t([0, 2], I32)])
        same(
            run_graph("MPSLogicalNot", [t([0, 2], I32)], mode="aten", out_dtype=DataType.bool),
            t([True, False], torch.bool),
            exact=True,
        )


# ----------------------------------------------------------------------------------- clamp, where
class TestClamp:
    def test_both_bounds(self):
        x = t([-2.0, 0.5, 3.0])
        same(run_graph("MPSClamp", [x], min_max=(-1.0, 1.0)), t([-1.0, 0.5, 1.0]), exact=True)

    def test_one_bound_does_not_propagate_nan(self):
        x = t([NAN, -2.0, 2.0])
        same(run_graph("MPSClamp", [x], min_max=(0.0, INF)), t([0.0, 0.0, 2.0]), exact=True)
        same(run_graph("MPSClamp", [x], min_max=(-INF, 1.0)), t([1.0, -2.0, 1.0]), exact=True)
        same(run_graph("MPSClamp", [x], min_max=(0.0, INF), mode="aten"), t([NAN, 0.0, 2.0]), exact=True)

    def test_bounds_in_x_dtype(self):
        same(run_graph("MPSClamp", [t([-5, 0, 5], I32)], min_max=(-1.5, 2.7)), t([-1, 0, 2], I32), exact=True)

    @pytest.mark.parametrize("min_max", [None, (-INF, INF)])
    def test_no_bound_never_sets_the_output(self, min_max):
        x = t([1.0, 2.0])
        with fails("never set"):
            run_graph("MPSClamp", [x], min_max=min_max)
        same(run_graph("MPSClamp", [x], min_max=min_max, mode="aten"), x, exact=True)


class TestWhere:
    def test_bool_condition_with_broadcast(self):
        c = t([[True], [False]], torch.bool)
        a, b = rnd(2, 3), rnd(3, seed=1)
        same(run_graph("MPSWhere", [c, a, b], out_dtype=DataType.float32, out_dims=(2, 3)), torch.where(c, a, b), exact=True)

    def test_non_bool_condition_is_cast(self):
        c = t([0.0, 0.5, NAN, -0.0])
        a, b = t([1, 2, 3, 4], I32), t([-1, -2, -3, -4], I32)
        same(run_graph("MPSWhere", [c, a, b], out_dtype=DataType.int32), t([-1, 2, 3, -4], I32), exact=True)

    def test_values_must_share_a_dtype(self):
        with fails("mixed dtypes"):
            run_graph("MPSWhere", [t([True], torch.bool), t([1.0]), t([1.0], F16)])


# ------------------------------------------------------------------------------- full, arange, cast
def _full(op, shape, fill, dtype, inputs=(), **kw):
    fields = dict(shape=shape, fill_value=fill, dtype=int(dtype))
    if not inputs:
        fields["input1_id"] = -1
    return run_graph(op, list(inputs), **fields, **kw)


class TestFull:
    def test_full(self):
        same(_full("MPSFull", [2, 3], 1.5, DataType.float32), torch.full((2, 3), 1.5), exact=True)

    def test_fill_converted_to_dtype(self):
        same(_full("MPSFull", [2], 2.7, DataType.int32), t([2, 2], I32), exact=True)
        same(_full("MPSFull", [2], -2.7, DataType.int64), t([-2, -2], I64), exact=True)
        same(_full("MPSFull", [1], 0.5, DataType.bool), t([True], torch.bool), exact=True)
        same(_full("MPSFull", [1], 16777217.0, DataType.int32), t([16777216], I32), exact=True)  # float32 field
        same(_full("MPSFull", [1], 0.1, DataType.float16), t([0.1], F16), exact=True)

    def test_empty_shape_is_one_element(self):
        same(_full("MPSFull", [], 3.0, DataType.float32), t([3.0]), exact=True)

    def test_zero_elements_bind_no_tensor(self):
        with fails("never set"):
            _full("MPSFull", [2, 0], 1.0, DataType.float32)

    def test_float64_is_f32_and_invalid_dtypes_abort(self):
        same(_full("MPSFull", [1], 0.1, DataType.float64), t([0.1]), exact=True)
        with fails("Invalid MPS data type"):
            _full("MPSFull", [1], 1.0, DataType.uint8)

    def test_full_like_takes_shape_of_input_and_dtype_as_written(self):
        x = rnd(2, 3)
        y = _full("MPSFullLike", [7], 4.0, DataType.int32, inputs=[x], out_dtype=DataType.int32)
        same(y, torch.full((2, 3), 4, dtype=I32), exact=True)

    def test_float32_full_stays_f32_in_an_f16_graph(self):
        x = t([1.0, 2.0], F16)
        g = GraphSpec()
        xi = g.input(x)
        f, s = g.value(DataType.float32, [2]), g.value(DataType.float16, [2])
        g.node("MPSFull", input1_id=-1, output_id=f, shape=[2], fill_value=0.5, dtype=int(DataType.float32))
        g.node("MPSAdd", input1_id=xi, input2_id=f, output_id=s, alpha=1.0).output(s)
        (y,), report = g.run([x], report=True)
        same(y, t([1.5, 2.5]), exact=True)  # promoted to f32
        assert report[0].reinterpreted and report[0].device_dtype == F32


class TestArange:
    def _arange(self, start, end, step, dtype, mode="faithful"):
        return run_graph("MPSArange", [], start=start, end=end, step=step, dtype=int(dtype), mode=mode)

    def test_integers(self):
        same(self._arange(0, 5, 1, DataType.int64), torch.arange(5), exact=True)
        same(self._arange(5, 0, -2, DataType.int32), t([5, 3, 1], I32), exact=True)

    def test_integer_dtype_truncates_start_and_step(self):
        # n = ceil((5.5 - 0.5) / 1.5) = 4; start_d = 0, step_d = 1
        same(self._arange(0.5, 5.5, 1.5, DataType.int32), t([0, 1, 2, 3], I32), exact=True)

    def test_float_size_and_values(self):
        y = self._arange(0.0, 1.0, 0.1, DataType.float32)
        step = np.float32(0.1)
        n = math.ceil(float(np.float32(1.0) - np.float32(0.0)) / float(step))
        expected = torch.from_numpy(np.arange(n, dtype=np.float32) * step + np.float32(0.0))
        same(y, expected, exact=True)

    def test_f16_coordinates_are_rounded(self):
        y = self._arange(0.0, 4100.0, 1.0, DataType.float16)
        expected = torch.from_numpy(np.arange(4100).astype(np.float16))
        same(y, expected, exact=True)
        assert y[2049] == 2048

    def test_bad_sizes(self):
        with fails("int32"):
            self._arange(0.0, 1.0, 0.0, DataType.float32)
        with fails("negative size"):
            self._arange(0.0, 5.0, -1.0, DataType.float32)


class TestCast:
    def test_float_to_int_truncates_and_to_bool_is_nonzero(self):
        x = t([-1.7, -0.2, 0.0, 1.7])
        same(run_graph("MPSCast", [x], dtype=int(DataType.int32)), t([-1, 0, 0, 1], I32), exact=True)
        same(run_graph("MPSCast", [x], dtype=int(DataType.bool)), t([True, True, False, True], torch.bool), exact=True)

    def test_float64_maps_to_f32_and_uint8_aborts(self):
        x = t([1, 2], I32)
        same(run_graph("MPSCast", [x], dtype=int(DataType.float64)), t([1.0, 2.0]), exact=True)
        with fails("Invalid MPS data type"):
            run_graph("MPSCast", [x], dtype=int(DataType.uint8))


# ------------------------------------------------------------------------------------ fp16 graphs
class TestFp16Graph:
    def test_each_op_output_is_rounded_to_f16(self):
        """Cast(in->f16) ; t = x + y ; u = t - x ; Cast(u->f32): with per-op rounding x + 2^-12 == x."""
        x, y = t([1.0, 1.0]), t([2.0**-12, 2.0**-9])
        g = GraphSpec()
        xi, yi = g.input(x), g.input(y)
        s, d = g.value(DataType.float32, [2]), g.value(DataType.float32, [2])
        g.node("MPSCast", input1_id=xi, output_id=xi, dtype=int(DataType.float16))
        g.node("MPSCast", input1_id=yi, output_id=yi, dtype=int(DataType.float16))
        g.node("MPSAdd", input1_id=xi, input2_id=yi, output_id=s, alpha=1.0)
        g.node("MPSSub", input1_id=s, input2_id=xi, output_id=d, alpha=1.0)
        g.node("MPSCast", input1_id=d, output_id=d, dtype=int(DataType.float32)).output(d)
        (out,) = g.run([x, y])
        same(out, t([0.0, 2.0**-9]), exact=True)

    def test_one_node_builder_defaults(self):
        g = one_node("MPSAdd", [t([1.0])], constants=[t([2.0])], alpha=1.0)
        assert g.graph.nodes[0].fields == {"input1_id": 0, "input2_id": 1, "output_id": 2, "alpha": 1.0}
        same(g.run([t([1.0])])[0], t([3.0]), exact=True)
