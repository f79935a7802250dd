"""Fuzzing the .pte entry points (check, inspect's listing, program_input_specs, run_pte) with every
mutant in a worker process under an address-space limit: only success or a typed error of the project;
a worker that dies (signal, abort, memory limit) or an untyped exception fails. `make fuzz` runs 100,000."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.fuzz_pte import _Worker, bases, campaign

REGRESSIONS = Path(__file__).parent / "fixtures" / "fuzz-regressions"


def test_regression_files_end_in_typed_errors():
    files = sorted(REGRESSIONS.glob("*.pte"))
    assert len(files) >= 3
    worker = _Worker(REGRESSIONS)
    try:
        results = {f.name: worker.run(f) for f in files}
        # a case past its time limit is a HANG and its worker is killed
        assert worker.run(files[0], seconds=0.0) == "HANG" and not worker.alive()
    finally:
        worker.close()
    # backend-id-not-utf8.pte aborted the process (executorch's log redirection); seed1-case8561/9677 ran
    # 65 s / 50 s within the default 4 GiB budgets (a convolution padding of 14,417,921; a 3.9 GB memory
    # plan), refused by the workers' 64 MiB budgets now; the others raised ValueError / IndexError out of
    # run_pte and program_input_specs
    assert all(r is not None and not r.startswith(("UNTYPED", "CRASH", "HANG")) for r in results.values()), results
    assert results["backend-id-not-utf8.pte"] == "ProgramFormatError"
    assert results["seed1-case8561-cnn_fp16.pte"] == "DeviceError"
    assert results["seed1-case9677-cnn_fp16.pte"] == "ProgramFormatError"


@pytest.mark.long
def test_seeded_campaign(tmp_path):
    base = bases()
    report = campaign(400, seed=3, crash_dir=tmp_path, jobs=2, base=base)
    assert report["failures"] == [], report
    # the same mutants with the same results on one worker as on two (per case, in case order)
    one = campaign(400, seed=3, jobs=1, base=base)
    assert one["digest"] == report["digest"] and one["counts"] == report["counts"], (one, report)
    counts = report["counts"]
    # not vacuous: mutants rejected by each layer, and some still run
    assert counts.get("ProgramFormatError", 0) > 40 and counts.get("MPSFormatError", 0) > 20, counts
    assert counts.get("ok", 0) > 20, counts
