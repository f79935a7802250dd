"""The precision policy (issue #35, ``mps_backend.precision``): one object shared by the partitioner,
the compile specs, the lowering passes and the builder; and the zoo path's float16 on high-norm
tokens (``export_model`` of a float32-traced transformer encoder whose residual stream carries a few
massive channels, as trained ViTs' high-norm tokens and LLMs' massive activations do)."""

from __future__ import annotations

import pytest
import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec

from mps_backend import MPSPartitioner
from mps_backend import compile_specs as specs
from mps_backend.precision import Precision


def test_policy_travels_in_the_compile_specs():
    assert specs.parse(None) == Precision.FP16 and specs.parse([specs.fp16_spec(False)]) == Precision.FP32
    for policy in (Precision.FP16, Precision.FP32, Precision.FP16_UNIFORM, Precision(rescale_exponent=3)):
        assert specs.parse(specs.precision_specs(policy)) == policy
        assert MPSPartitioner(precision=policy).precision == policy
    assert MPSPartitioner(use_fp16=False).precision == Precision.FP32 and MPSPartitioner().use_fp16
    with pytest.raises(ValueError, match="disagree"):
        specs.parse([specs.fp16_spec(False), CompileSpec(specs.PRECISION, Precision.FP16.encode())])
    with pytest.raises(ValueError, match="disagree"):
        MPSPartitioner(use_fp16=False, precision=Precision.FP16)
    with pytest.raises(ValueError, match="4 bytes"):
        specs.parse([CompileSpec(specs.PRECISION, bytes([1, 1]))])


#: a few channels of two tokens carry the high norm (the other tokens are N(0, 1))
HIGH = {(0, 3): 3e4, (0, 7): 1e4, (5, 3): 2e4}


def _encoder(norm_first: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=norm_first)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(1, 12, 64)
    for (token, channel), value in HIGH.items():
        x[0, token, channel] = value
    return model, x


def _gap(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest relative gap of a token: max |out - ref| / max |ref| per token (NaN/inf: inf)."""
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-norm", "post-norm"])
def test_export_model_fp16_on_high_norm_tokens(norm_first):
    """A float32-traced nn.TransformerEncoder through export_model in float16 (the zoo path): its layer
    norm statistics and softmax are float32 islands, the pre-norm residual stream float32, so the
    high-norm tokens (3e4: squared, 9e8, far past 65,504) are computed: as close to eager float32 as
    eager bfloat16 is. Lowered with every value float16 (Precision.FP16_UNIFORM) the statistics overflow."""
    from mps_backend.export import export_model
    from mps_backend.runtime import run_pte

    model, x = _encoder(norm_first)
    with torch.no_grad():
        ref = model(x)
        yard = {dt: _gap(model.to(dt)(x.to(dt)).float(), ref) for dt in (torch.bfloat16, torch.float16)}
        model.float()
    result = export_model(model, [x])
    assert result.report.on_cpu == [], str(result.report)
    gap = _gap(run_pte(result.pte, [x])[0], ref)
    kind, bf16, fp16 = "pre" if norm_first else "post", yard[torch.bfloat16], yard[torch.float16]
    print(f"\n{kind}-norm encoder, high-norm tokens: .pte fp16 gap {gap:.3g}, eager bf16 {bf16:.3g}, eager fp16 {fp16:.3g}")
    assert gap <= yard[torch.bfloat16], f".pte gap {gap:.3g} > eager bfloat16's {yard[torch.bfloat16]:.3g}"
    import unittest.mock

    import mps_backend.export as zoo_export

    uniform = lambda **kw: MPSPartitioner(precision=Precision.FP16_UNIFORM)  # noqa: E731
    with unittest.mock.patch.object(zoo_export, "MPSPartitioner", uniform):
        before = export_model(model, [x])
    assert _gap(run_pte(before.pte, [x])[0], ref) > yard[torch.bfloat16]


class _HalfResidual(torch.nn.Module):
    """A float16 model fed float32 (a vision-language text decoder's embeddings): ``x.to(float16)`` starts a
    residual stream that a transformers-style RMSNorm reads in float32."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(self.lin.weight.dtype)
        h32 = h.float()
        normed = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)
        return (h + self.lin(normed)).float()


def test_a_float32_input_cast_down_into_the_float32_residual_stays_float32():
    """The input's cast to float16 is widened into the float32 residual, so the float32 input is read as
    float32 (not boundary-cast to float16): 1.6e5 (Gemma's scaled outlier embeddings) stays finite.
    Before: the input was declared float16 on the device and overflowed to inf (NaN after the norm)."""
    from mps_backend.export import export_model
    from mps_backend.runtime import run_pte

    x = torch.randn(1, 4, 16)
    x[0, 1, 3] = 1.6e5
    model = _HalfResidual().eval()
    with torch.no_grad():
        ref = model(x)  # float32 weights: the casts are no-ops
        result = export_model(model.half(), [x])
    assert result.report.on_cpu == [], str(result.report)
    out = run_pte(result.pte, [x])[0]
    assert torch.isfinite(out).all(), out
    gap = _gap(out, ref)
    assert gap < 2e-3, f"gap {gap:.3g}"
