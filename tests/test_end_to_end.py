"""Whole .pte files through the emulated MPS runtime against eager PyTorch (verification level 4)."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules

from mps_backend import MPSPartitioner
from mps_backend.export import TOLERANCE, export_model, verify
from mps_backend.runtime import InputMismatchError, run_pte
from mps_backend.runtime.interpreter import execute
from mps_backend.tools.demo import demo_model


@pytest.fixture(scope="module")
def demo():
    return demo_model()


@pytest.fixture(scope="module", params=[False, True], ids=["fp32", "fp16"])
def demo_pte(request, demo):
    return request.param, export_model(*demo, use_fp16=request.param).pte


def test_demo_matches_eager(demo, demo_pte):
    use_fp16, pte = demo_pte
    v = verify(pte, *demo, use_fp16=use_fp16)
    # fp32: 1e-4 of the output scale (the device model computes in float32 like eager).
    # fp16: every op rounds to float16 (2^-11 relative); TOLERANCE[True] = 3e-2 of the scale, and the
    # demo measures ~3e-4, so a wrong lowering (errors of order 1) cannot pass.
    assert v.relative <= TOLERANCE[use_fp16], str(v)
    if use_fp16:
        assert v.relative > 0, "fp16 output bit-identical to fp32 eager: is the graph really computing in f16?"


def test_emulator_equals_interpreter_bit_for_bit(demo, demo_pte):
    _, pte = demo_pte
    model, inputs = demo
    ep = torch.export.export(model, inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner(use_fp16=demo_pte[0])])
    blob = [m for _, m, _ in get_lowered_submodules(edge.exported_program().graph_module)][0].processed_bytes
    direct = execute(blob, list(inputs))
    via_runtime = run_pte(pte, list(inputs))
    assert len(direct) == len(via_runtime) == 1
    assert direct[0].dtype == via_runtime[0].dtype
    assert torch.equal(direct[0], via_runtime[0])


class CpuInTheMiddle(torch.nn.Module):
    """relu/linear on MPS, float64 arithmetic on CPU (the device has no float64), then more MPS work."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = (h.double() * 3.0).sin().float()
        return self.b(h) * 2.0


@pytest.mark.parametrize("use_fp16", [False, True], ids=["fp32", "fp16"])
def test_program_mixing_cpu_ops_between_two_delegates(use_fp16):
    torch.manual_seed(0)
    model, x = CpuInTheMiddle().eval(), torch.randn(3, 8)
    result = export_model(model, (x,), use_fp16=use_fp16)
    assert result.delegates == 2
    assert result.report.on_cpu and all("float64" in n.reason for n in result.report.on_cpu), result.report
    got = run_pte(result.pte, [x])[0]
    want = model(x)
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err <= TOLERANCE[use_fp16], err


def test_wrong_inputs_are_clear_errors_and_the_process_survives(demo, demo_pte):
    _, pte = demo_pte
    x = demo[1][0]
    with pytest.raises(InputMismatchError, match="takes 1 inputs, got 2"):
        run_pte(pte, [x, x])
    with pytest.raises(InputMismatchError, match="dtype"):
        run_pte(pte, [x.double()])
    with pytest.raises(InputMismatchError, match="shape"):
        run_pte(pte, [x[:, :2]])
    assert run_pte(pte, [x])[0].shape == (1, 10)  # still works afterwards


def test_verify_fails_on_nan_outputs(monkeypatch):
    """max() with a NaN must not turn into a pass: a device output of NaN where eager is finite fails."""
    import mps_backend.runtime as runtime

    model = torch.nn.Identity()
    x = torch.ones(3)
    monkeypatch.setattr(runtime, "run_pte", lambda pte, inputs: [torch.tensor([1.0, float("nan"), 1.0])])
    v = verify(b"", model, (x,), use_fp16=False)
    assert not v.ok, str(v)
    monkeypatch.setattr(runtime, "run_pte", lambda pte, inputs: [torch.ones(3)])
    assert verify(b"", model, (x,), use_fp16=False).ok
