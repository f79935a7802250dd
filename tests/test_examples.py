"""The example export script works as its docstring says (plain to_edge / to_backend flow)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from mps_backend.serialization.pte import delegate_blobs

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "export_to_backend.py"


def test_export_to_backend_example(tmp_path):
    out = tmp_path / "demo.pte"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--model", "demo", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "device model vs eager" in proc.stdout and f"wrote {out}" in proc.stdout
    assert len(delegate_blobs(out.read_bytes())) == 1
