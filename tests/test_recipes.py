"""executorch.export recipes for MPS (mps_backend.recipes): registered on import, each recipe exports a
program that runs (MPS delegates emulated) and matches eager."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from mps_backend.recipes import MPSRecipeType
from mps_backend.runtime import load_emulator, run_pte
from mps_backend.serialization.pte import delegate_blobs


def test_import_mps_backend_registers_the_provider():
    code = (
        "import mps_backend; from executorch.export import recipe_registry; "
        "print(recipe_registry.list_backends()); "
        "print(sorted(r.value for r in recipe_registry.get_supported_recipes('mps')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    backends, recipes = out.stdout.strip().splitlines()[-2:]
    assert "'mps'" in backends
    assert all(r.value in recipes for r in MPSRecipeType)


def test_session_runs_mps_delegates_without_loading_the_emulator_by_hand():
    """A fresh process, the README's recipe lines only: run_method runs the MPS delegate (emulated)."""
    code = (
        "import torch, mps_backend\n"
        "from executorch.export import ExportRecipe, export\n"
        "from mps_backend.recipes import MPSRecipeType\n"
        "torch.manual_seed(0)\n"
        "model, x = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval(), torch.randn(2, 8)\n"
        "session = export(model, [(x,)], ExportRecipe.get_recipe(MPSRecipeType.FP32))\n"
        "got = session.run_method('forward', (x,))[0]\n"
        "print('max error', float((got - model(x)).abs().max()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.split("max error")[-1]) <= 1e-6


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).eval()


@pytest.mark.parametrize("recipe", list(MPSRecipeType), ids=lambda r: r.value)
def test_recipe_exports_and_runs(recipe):
    from executorch.export import ExportRecipe, export

    from mps_backend.quantize import quantizable, resolve_group_size, weight_only_config

    load_emulator()
    model, x = _model(), torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    session = export(model, [(x,)], ExportRecipe.get_recipe(recipe))
    pte = session.get_pte_buffer()
    blobs = [d for d in delegate_blobs(pte) if d.backend_id == "MPSBackend"]
    assert len(blobs) == 1
    got = session.run_method("forward", (x,))[0]
    torch.testing.assert_close(got, run_pte(pte, [x])[0], rtol=0, atol=0)  # the session runs the same program
    scheme = "int4" if "int4" in recipe.value else "int8" if "int8" in recipe.value else None
    reference = model
    if scheme:  # the recipes quantize with torchao's own quantize_ (symmetric), not mps_backend's quantizer
        from torchao.quantization import quantize_

        group = resolve_group_size(scheme, None)
        reference = copy.deepcopy(model)
        quantize_(reference, weight_only_config(scheme, group), filter_fn=quantizable(scheme, group))
    with torch.no_grad():
        want = reference(x)
    err = ((got - want).abs().max() / want.abs().max()).item()
    fp16 = "fp32" not in recipe.value
    assert err <= (3e-3 if fp16 else 1e-6), err


def test_xnnpack_fallback_takes_what_mps_leaves_on_cpu():
    from executorch.export import ExportRecipe, export

    load_emulator()
    torch.manual_seed(0)

    class ChannelsLast(torch.nn.Module):  # a dim-order change: MPS keeps it on CPU (dim_order [0, 2, 3, 1]), XNNPACK's
        def forward(self, x):
            return x.to(memory_format=torch.channels_last)

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), ChannelsLast()).eval()
    x = torch.randn(1, 3, 16, 16)
    plain = export(model, [(x,)], ExportRecipe.get_recipe(MPSRecipeType.FP32)).get_pte_buffer()
    fallback = export(model, [(x,)], ExportRecipe.get_recipe(MPSRecipeType.FP32_XNNPACK_FALLBACK))
    ids = [d.backend_id for d in delegate_blobs(fallback.get_pte_buffer(), backend_id=None)]
    assert "MPSBackend" in ids and "XnnpackBackend" in ids
    assert "XnnpackBackend" not in [d.backend_id for d in delegate_blobs(plain, backend_id=None)]
    torch.testing.assert_close(fallback.run_method("forward", (x,))[0], model(x), rtol=1e-4, atol=1e-5)


def test_unknown_parameters_are_an_error():
    from executorch.export import ExportRecipe

    with pytest.raises(ValueError, match="group_size"):
        ExportRecipe.get_recipe(MPSRecipeType.FP16, group_size=32)
    recipe = ExportRecipe.get_recipe(MPSRecipeType.INT4_WEIGHT_ONLY, group_size=64)
    assert recipe.quantization_recipe.ao_quantization_configs[0].ao_base_config.granularity.group_size == 64
