"""The mps-backend command line."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from mps_backend.tools.cli import main


@pytest.fixture(scope="module")
def demo_pte(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "demo.pte"
    assert main(["export", "--verify", "-o", str(out)]) == 0
    return out


def test_export_prints_summary_and_verifies(demo_pte, capsys):
    out = demo_pte.parent / "again.pte"
    assert main(["export", "--fp32", "--verify", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    for needle in (
        "precision        float32",
        "MPS delegates    1",
        "nodes delegated  ",
        "constant bytes",
        ".pte size",
        "verify: max abs error",
        "OK",
    ):
        assert needle in text, text
    assert out.stat().st_size > 0


def test_inspect_describes_the_delegate(demo_pte, capsys):
    assert main(["inspect", str(demo_pte), "--values"]) == 0
    text = capsys.readouterr().out
    assert "1 delegate(s), 1 MPS" in text
    assert "header: segment offset" in text and "MPSConv2D" in text and "inputs: 0:float32[1, 3, 32, 32]" in text


def test_inspect_maps_the_file_instead_of_reading_it(demo_pte, capsys, monkeypatch):
    """A multi-GB .pte is inspected through a memory map: pages are read where the tables and the MPS
    graph are, the weights are not copied (the reader works on views of the mapping)."""
    import pathlib

    from mps_backend.serialization import pte

    mapped = []
    real_map = pte.map_file
    monkeypatch.setattr(pte, "map_file", lambda path: mapped.append(path) or real_map(path))
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda self: pytest.fail(f"{self} read whole"))
    assert main(["inspect", str(demo_pte)]) == 0
    assert [pathlib.Path(p) for p in mapped] == [demo_pte]
    assert "1 delegate(s), 1 MPS" in capsys.readouterr().out


def test_inspect_rejects_a_file_that_is_not_a_pte(tmp_path, capsys):
    bogus = tmp_path / "bogus.pte"
    bogus.write_bytes(b"definitely not a program" * 10)
    assert main(["inspect", str(bogus)]) == 2
    assert "bogus.pte" in capsys.readouterr().err


def test_inspect_reports_a_malformed_blob(demo_pte, tmp_path, capsys):
    data = demo_pte.read_bytes()
    blob_start = data.find(b"MP00") - 4
    broken = bytearray(data)
    broken[blob_start + 4 : blob_start + 8] = b"XX00"  # break the MP00 magic inside the delegate
    path = tmp_path / "broken.pte"
    path.write_bytes(bytes(broken))
    assert main(["inspect", str(path)]) == 2
    assert "malformed blob" in capsys.readouterr().out


def test_run_with_npz_inputs_and_outputs(demo_pte, tmp_path, capsys):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, input_0=np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "out.npz"
    assert main(["run", str(demo_pte), "--inputs", str(inputs), "--out", str(out)]) == 0
    assert "output 0: torch.float32 [1, 10]" in capsys.readouterr().out
    with np.load(out) as npz:
        assert npz["output_0"].shape == (1, 10) and np.isfinite(npz["output_0"]).all()


def test_console_script_is_installed():
    exe = shutil.which("mps-backend") or str(__import__("pathlib").Path(sys.executable).parent / "mps-backend")
    proc = subprocess.run([exe, "ops"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "aten.convolution.default" in proc.stdout
