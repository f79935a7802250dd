"""Fuzzing the .pte entry points (check, inspect's listing, program_input_specs, run_pte) with every
mutant in a worker process under an address-space limit: only success or a typed error of the project;
a worker that dies (signal, abort, memory limit) or an untyped exception fails. `make fuzz` runs 100,000."""

from __future__ import annotations

from pathlib import Path

from harness.fuzz_pte import _Worker, campaign

REGRESSIONS = Path(__file__).parent / "fixtures" / "fuzz-regressions"


def test_regression_files_end_in_typed_errors():
    files = sorted(REGRESSIONS.glob("*.pte"))
    assert len(files) >= 3
    worker = _Worker(REGRESSIONS)
    try:
        results = {f.name: worker.run(f) for f in files}
    finally:
        worker.close()
    # backend-id-not-utf8.pte aborted the process (executorch's log redirection); the others raised
    # ValueError / IndexError out of run_pte and program_input_specs
    assert all(r is not None and not r.startswith("UNTYPED") for r in results.values()), results
    assert results["backend-id-not-utf8.pte"] == "ProgramFormatError"


def test_seeded_campaign(tmp_path):
    report = campaign(400, seed=3, crash_dir=tmp_path)
    assert report["failures"] == [], report
    counts = report["counts"]
    # not vacuous: mutants rejected by each layer, and some still run
    assert counts.get("ProgramFormatError", 0) > 40 and counts.get("MPSFormatError", 0) > 20, counts
    assert counts.get("ok", 0) > 20, counts
