"""Export-time check that the app's executorch runtime has a kernel for every operator left on CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mps_backend.export import export_model
from mps_backend.runtime_compat import (
    RUNTIME_VERSIONS,
    RuntimeCompatError,
    RuntimeCompatWarning,
    check_kernels,
    kernels,
    missing_kernels,
    program_operators,
)
from mps_backend.tools.cli import main


class GridSample(nn.Module):
    """grid_sampler_2d: no MPS lowering (stays on CPU); portable kernel since executorch 1.1."""

    def forward(self, x, grid):
        return nn.functional.grid_sample(x, grid, align_corners=False) * 2.0


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, 8, 8, generator=g), torch.rand(1, 4, 4, 2, generator=g) * 2 - 1]


def test_kernel_sets_per_release():
    # data read from each release's sources (scripts/runtime_kernels.py): what changed between them
    assert "aten::add.out" in kernels("1.0") and "executorch_prim::sym_max.Scalar" in kernels("1.0")
    assert "quantized_decomposed::dequantize_per_tensor.out" in kernels("1.0")
    assert "aten::grid_sampler_2d.out" not in kernels("1.0") and "aten::grid_sampler_2d.out" in kernels("1.1")
    assert "aten::_adaptive_avg_pool2d.out" in kernels("1.3") - kernels("1.2")
    assert all(kernels(a) <= kernels(b) for a, b in zip(RUNTIME_VERSIONS, RUNTIME_VERSIONS[1:]))
    with pytest.raises(ValueError, match="known are 1.0, 1.1"):
        kernels("0.7")


def test_missing_cpu_kernel_is_an_export_error_naming_node_op_and_version():
    model = GridSample().eval()
    with pytest.raises(RuntimeCompatError) as err:
        export_model(model, _inputs(), use_fp16=False)  # default target: 1.0
    msg = str(err.value)
    assert "aten::grid_sampler_2d.out" in msg and "aten_grid_sampler_2d_default" in msg and "1.0.1" in msg
    result = export_model(model, _inputs(), use_fp16=False, target_runtime="1.1")
    assert "aten::grid_sampler_2d.out" in program_operators(result.pte)
    with pytest.warns(RuntimeCompatWarning, match="grid_sampler_2d"):
        export_model(model, _inputs(), use_fp16=False, allow_missing_kernels=True)


def test_delegated_programs_pass_on_every_release():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()
    result = export_model(model, [torch.randn(1, 3, 8, 8)], use_fp16=True)
    for version in RUNTIME_VERSIONS:
        assert missing_kernels(result.pte, version) == []
    assert check_kernels(result.pte, None) == []


def test_cli_target_runtime(tmp_path, capsys, monkeypatch):
    script = tmp_path / "m.py"
    script.write_text(
        "import torch\nfrom torch import nn\n"
        "class M(nn.Module):\n"
        "    def forward(self, x, g):\n"
        "        return nn.functional.grid_sample(x, g, align_corners=False) * 2.0\n"
        "def make():\n"
        "    return M().eval(), (torch.randn(1, 2, 8, 8), torch.rand(1, 4, 4, 2) * 2 - 1)\n"
    )
    out = tmp_path / "m.pte"
    assert main(["export", "-m", f"{script}:make", "--fp32", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "aten::grid_sampler_2d.out" in err and "executorch 1.0.1" in err and not out.exists()
    assert main(["export", "-m", f"{script}:make", "--fp32", "-o", str(out), "--target-runtime", "1.4"]) == 0
    assert out.exists()
