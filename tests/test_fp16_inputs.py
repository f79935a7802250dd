"""fp16 mode reads float32 user inputs in float32 where float16 rounding would flip a result: floor and
ceil, and the indices of max pools (ties between values float16 cannot tell apart). Everything else
computes in float16 as before (the boundary cast still feeds it): trunc and round among them."""

from __future__ import annotations

import torch
from torch import nn

from mps_backend.export import export_model
from mps_backend.runtime import run_pte


class _Rounding(nn.Module):
    def forward(self, x):
        return torch.floor(x), torch.ceil(x), x * 2


def test_floor_and_ceil_of_a_float32_input_do_not_see_float16_rounding():
    # each value rounds in float16 onto an integer (or a .5) on the other side of the result
    x = torch.tensor([[-1.0001177, 2.9999, 1.0001, -2.0002, 0.50001, 2.49998, 3.0001, -0.99995]])
    result = export_model(_Rounding().eval(), [x])
    assert result.report.on_cpu == []
    assert not torch.equal(torch.floor(x.half()).float(), torch.floor(x))  # the inputs do round across
    out = run_pte(result.pte, [x])
    for got, want in zip(out[:2], _Rounding()(x)[:2], strict=True):
        assert torch.equal(got, want), (got, want)
    torch.testing.assert_close(out[2], x * 2, rtol=1e-3, atol=0)  # the rest still computes in float16


class _MaxPools(nn.Module):
    def forward(self, x):
        v, i = nn.functional.adaptive_max_pool3d(x, (2, 2, 2), return_indices=True)
        v2, i2 = nn.functional.max_pool3d(x, 2, return_indices=True)
        v3, i3 = nn.functional.max_pool2d(x[0], 2, return_indices=True)  # a view: float16 (ties may differ)
        return v, i, v2, i2, v3


def test_max_pool_indices_on_a_float32_input_pick_the_largest_of_float16_ties():
    torch.manual_seed(0)
    x = torch.rand(1, 2, 4, 4, 4) * 0.5
    x[0, 0, 0, 0, 0], x[0, 0, 0, 1, 1], x[0, 0, 1, 1, 1] = 0.78737, 0.78740, 0.78747  # one float16 value
    assert x[0, 0, :2, :2, :2].half().eq(torch.tensor(0.78747).half()).sum() == 3
    result = export_model(_MaxPools().eval(), [x])
    assert result.report.on_cpu == []
    out = run_pte(result.pte, [x])
    want = _MaxPools()(x)
    assert torch.equal(out[1], want[1]) and torch.equal(out[3], want[3])  # indices of the largest
    assert out[1][0, 0, 0, 0, 0] == 1 * 16 + 1 * 4 + 1  # (1, 1, 1) in the 4x4x4 volume, not (0, 0, 0)
    for got, ref in ((out[0], want[0]), (out[2], want[2]), (out[4], want[4])):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=0)  # values: float16 precision
