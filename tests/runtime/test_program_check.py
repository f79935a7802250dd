"""The program check in front of executorch's runtime: hostile .pte files end in ProgramFormatError
(one line on the CLI), never in an abort or a signal of the process."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap

import pytest
import torch

from mps_backend.export import export_model
from mps_backend.runtime.program_check import ProgramFormatError, check_program
from mps_backend.tools.cli import main


@pytest.fixture(scope="module")
def pte() -> bytes:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    return export_model(model, [torch.randn(1, 4)], use_fp16=False).pte


def _replace(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) >= 1, old
    return data.replace(old, new, 1)


def test_valid_programs_pass(pte, upstream_pte_dir):
    check_program(pte)
    for path in sorted(upstream_pte_dir.glob("*.pte")):
        check_program(path.read_bytes())


@pytest.mark.parametrize(
    "old,new,message",
    [
        (b"MPSBackend", b"MPSBack\xffnd", "not UTF-8"),  # executorch logs the id: its log redirection aborts on it
        (b"MPSBackend", b"MPSBack\x1bnd", "control characters"),
        (b"forward", b"forw\xffrd", "not UTF-8"),
        (b"use_fp16", b"use_fp\xff6", "not UTF-8"),
    ],
)
def test_names_executorch_would_log_are_checked(pte, old, new, message):
    with pytest.raises(ProgramFormatError, match=message):
        check_program(_replace(pte, old, new))


def test_memory_plan_beyond_the_budget_is_refused(pte, monkeypatch):
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte_file = deserialize_pte_binary(pte)
    pte_file.program.execution_plan[0].non_const_buffer_sizes = [0, 8 << 30]  # one byte flipped does this
    hostile = bytes(serialize_pte_binary(pte_file=pte_file))
    with pytest.raises(ProgramFormatError, match="memory plan asks for 8 GiB"):
        check_program(hostile)
    monkeypatch.setenv("MPS_BACKEND_MAX_PLAN_BYTES", str(16 << 30))
    check_program(hostile)


def test_truncations_and_garbage_are_typed(pte):
    for cut in (0, 7, 31, 200, len(pte) // 2):
        with pytest.raises(ProgramFormatError):
            check_program(pte[:cut])
    with pytest.raises(ProgramFormatError, match="not an executorch program"):
        check_program(b"\0" * 64)
    header = bytearray(pte)
    struct.pack_into("<Q", header, 16, len(pte) * 4)  # program size beyond the file
    with pytest.raises(ProgramFormatError, match="program size"):
        check_program(bytes(header))


def test_run_gives_one_line_not_an_abort(pte, tmp_path):
    """In a subprocess: before the check, executorch's logging of the 0xFF id aborted the process."""
    bad = tmp_path / "bad.pte"
    bad.write_bytes(_replace(pte, b"MPSBackend", b"MPSBack\xffnd"))
    code = textwrap.dedent(f"""
        import sys
        from mps_backend.tools.cli import main
        sys.exit(main(["run", {str(bad)!r}]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "not UTF-8" in r.stderr and "Traceback" not in r.stderr


def test_inspect_refuses_a_bad_program(pte, tmp_path, capsys):
    bad = tmp_path / "bad.pte"
    bad.write_bytes(_replace(pte, b"use_fp16", b"use_fp\xff6"))
    assert main(["inspect", str(bad)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
