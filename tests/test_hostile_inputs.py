"""Hostile inputs, round 3 (#26): bundled programs, checkpoint folders, pickles, program-check bounds.
Each test checks a whole class of input: a one-line typed error (or a correct result), no crash, no
traceback, nothing executed or opened that the input names."""

from __future__ import annotations

import random

import pytest
import torch

from mps_backend.runtime.program_check import ProgramFormatError
from mps_backend.tools.cli import main


def _one_line_error(err: str) -> bool:
    return "Traceback" not in err and any(line.startswith("error: ") for line in err.splitlines())


# ---------------------------------------------------------------- bundled programs (.bpte)


@pytest.fixture(scope="module")
def bundled():
    from mps_backend.export import bundle, export_model

    model = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    pte = export_model(model, [x], use_fp16=False).pte
    with torch.no_grad():
        y = model(x)
    return bytes(pte), bundle(pte, [[x], [x]], [[y], [y]])


def _bpte_without_inputs(program: bytes) -> bytes:
    """A well-formed BP08 flatbuffer whose one test case has expected outputs but no inputs field."""
    import flatbuffers

    b = flatbuffers.Builder(0)
    prog = b.CreateByteVector(program)
    name = b.CreateString("forward")
    b.StartVector(4, 0, 4)
    outs = b.EndVector()
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(1, outs, 0)  # expected_outputs only
    case = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(case)
    cases = b.EndVector()
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(1, cases, 0)
    suite = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(suite)
    suites = b.EndVector()
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(1, suites, 0)
    b.PrependUOffsetTRelativeSlot(2, prog, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"BP08")
    return bytes(b.Output())


def test_bundled_program_goes_through_the_program_check(bundled, tmp_path, capsys):
    from mps_backend.runtime.bundled_check import read_bundled

    pte, bpte = bundled
    program, cases = read_bundled(bpte, ProgramFormatError)
    assert bytes(program) == pte and cases == {"forward": 2}
    at = bpte.index(pte)
    bad_id = bytearray(bpte)
    k = at + pte.index(b"MPSBackend")
    bad_id[k] = 0xFF  # a backend id that is not UTF-8: executorch's log redirection aborted on it
    no_inputs = _bpte_without_inputs(pte)
    for i, data in enumerate((bytes(bad_id), no_inputs)):
        path = tmp_path / f"bad{i}.bpte"
        path.write_bytes(data)
        for argv in (["run", str(path)], ["run", str(path), "--random"], ["inspect", str(path)]):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert _one_line_error(err) and str(path) in err or "test case" in err, (argv, err)


def test_mutated_bundled_programs_are_refused_or_well_formed(bundled, tmp_path, capsys):
    """Random byte and u32 mutations of a .bpte: the bundle reader and the program check either accept
    it or raise ProgramFormatError (never another exception: inspect no longer shells out to flatc)."""
    from mps_backend.export import unbundle
    from mps_backend.runtime.emulator import _check_bundled
    from mps_backend.runtime.program_check import check_program

    _, bpte = bundled
    rng = random.Random(26)
    refused = 0
    for n in range(300):
        data = bytearray(bpte)
        pos = rng.randrange(len(data) - 4)
        if n % 3 == 0:  # a near-limit u32 (lengths, offsets)
            data[pos : pos + 4] = rng.choice((0xFFFFFFFF, 0xFFFFFFF0, 0x7FFFFFFF, 0x80000000)).to_bytes(4, "little")
        else:
            data[pos] = rng.randrange(256)
        try:
            check_program(unbundle(bytes(data)))
            _check_bundled(bytes(data), "forward")
        except ProgramFormatError:
            refused += 1
    assert refused > 30
    path = tmp_path / "m.bpte"
    data = bytearray(bpte)
    data[0:4] = (0xFFFFFFF0).to_bytes(4, "little")  # the root offset
    path.write_bytes(bytes(data))
    assert main(["inspect", str(path)]) == 2 and _one_line_error(capsys.readouterr().err)
