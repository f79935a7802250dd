"""A representative subset of ExecuTorch's backend operator test suite, on the ``mps`` flow.

The suite lives in the executorch wheel (``executorch/backends/test/suite/operators``); the flow
is added by the pytest plugin ``harness.suite_flow`` and the run is driven by
``harness.run_suite`` in a pytest subprocess (a native crash costs one case, not
this process). Full-suite results: docs/operator-suite.md.

Regression guard: tests/data/operator_suite_expected_pass.txt lists every case that passed
*delegated* (lowered to MPS, run by ExecuTorch with the device model, compared with eager) in
the full fp32 run that produced docs/operator-suite.md. Each listed case of the subset must
still pass delegated -- a case that starts failing, or silently falls back to CPU, fails here.
Inputs and weights depend only on the seed and the test id (``--mps-seed``), so the subset sees
the same values as the full run. Regenerate the list with::

    python -m harness.run_suite --write-expected-pass tests/data/operator_suite_expected_pass.txt
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from harness import run_suite

#: operator files of the subset: elementwise binary, activations, conv, matmul, concat, layout
SUBSET = ("add", "relu", "sigmoid", "conv2d", "linear", "cat", "permute", "view")
EXPECTED_PASS = Path(__file__).parent / "data" / "operator_suite_expected_pass.txt"
#: Failing cases of the subset in the recorded run, each a reported bug (docs/operator-suite.md):
#: case -> Failure Class. A failure not listed here fails test_every_failure_is_a_known_bug.
#: (Empty: the one failure measured in the subset, test_linear_feature_sizes[mps]#2, a preprocess
#: crash on a [1, K] linear weight, was fixed in 5d64eba.)
KNOWN_FAILURES: dict[str, str] = {}
#: Measured on the subset (fp32, seed 0): 78 cases, 72 passed (all delegated and compared with
#: eager), 0 failed, 6 suite skips (5 test models that fail in eager, 1 in-place activation).
#: Any failure is a regression, so the floor is the measured rate, 1.0, not a round number below
#: it. The per-case list guards the cases delegated today; the rate also catches cases kept on
#: CPU today (they "pass" without running) that a new, wrong lowering starts delegating.
MIN_PASS_RATE = 1.0

pytestmark = pytest.mark.skipif(
    not (run_suite.suite_dir() / "operators").is_dir(), reason="the executorch wheel has no backends/test/suite/operators"
)


@pytest.fixture(scope="session")  # made once per worker, even if another file's tests run between its users
def subset_run() -> run_suite.SuiteRun:
    from harness.suite_flow import WHOLE_PROGRAM_ENV

    previous = os.environ.get(WHOLE_PROGRAM_ENV)
    os.environ[WHOLE_PROGRAM_ENV] = "1"  # every case also lowered whole, as old export scripts do
    try:
        return run_suite.run(run_suite.operator_files(SUBSET), ("mps",), seed=run_suite.DEFAULT_SEED, log=None)
    finally:
        if previous is None:
            del os.environ[WHOLE_PROGRAM_ENV]
        else:
            os.environ[WHOLE_PROGRAM_ENV] = previous


def test_every_case_also_lowers_as_a_whole_program(subset_run):
    """The old-script entry point, ``to_backend("MPSBackend", to_edge(ep).exported_program(), specs)``:
    a case the partitioner delegates whole lowers whole; one with CPU nodes is refused with the nodes
    named; preprocess never fails on a node its check accepted."""
    outcomes = {}
    for test, sub in subset_run.subtests():
        if "Whole Program" in sub:
            outcomes[run_suite.case_id(test, sub)] = (sub["Whole Program"], bool(sub.get("CPU Nodes")))
    assert len(outcomes) > 50, outcomes
    bad = {case: o for case, (o, _) in outcomes.items() if not o.startswith(("lowered", "refused"))}
    assert not bad, bad
    refused_whole = {case for case, (o, cpu) in outcomes.items() if o == "refused" and not cpu}
    assert not refused_whole, refused_whole


def _expected_pass() -> list[str]:
    lines = EXPECTED_PASS.read_text().splitlines()
    files = {f"test_{name}.py" for name in SUBSET}
    cases = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return [c for c in cases if c.split("::")[0] in files]


def test_mps_flows_register_with_the_suite(monkeypatch):
    from executorch.backends.test.suite import flow as flow_module

    from harness import suite_flow

    monkeypatch.setattr(flow_module, "all_flows", flow_module.all_flows)  # restored afterwards
    monkeypatch.setenv("ET_TEST_ENABLED_BACKENDS", "mps")
    suite_flow.register()
    suite_flow.register()  # idempotent
    flows = flow_module.all_flows()
    assert set(flows) == {"mps", "mps_fp16"}
    assert flows["mps"].backend == "mps" and flows["mps"].is_delegated
    assert flows["mps"].tester_factory.keywords == {"use_fp16": False}
    assert flows["mps_fp16"].tester_factory.keywords == {"use_fp16": True}


def test_mps_flow_is_selected(subset_run):
    assert subset_run.tests, "no suite test ran"
    assert {t["flow"] for t in subset_run.tests} == {"mps"}
    ran = {t["file"] for t in subset_run.tests}
    assert ran == {f"test_{name}.py" for name in SUBSET}


def test_no_case_took_the_process_down(subset_run):
    crashed = [run_suite.case_id(t, s) for t, s in subset_run.subtests() if s.get("Failure Class") in ("crash", "timeout")]
    assert not crashed and subset_run.restarts == 0, crashed


def test_every_case_passes_or_fails_with_a_reason(subset_run):
    known = set(run_suite.CLASS_TEXT)
    for test, sub in subset_run.subtests():
        cls = sub.get("Failure Class")
        assert cls in known, (run_suite.case_id(test, sub), cls)
        if cls not in run_suite.PASS_CLASSES:
            reason = sub.get("Root Error") or sub.get("Error") or test.get("message")
            assert reason and reason.strip(), f"{run_suite.case_id(test, sub)} ({cls}) has no reason"


def test_expected_cases_still_pass_delegated(subset_run):
    expected = _expected_pass()
    assert expected, f"{EXPECTED_PASS} lists no case of the subset"
    classes = subset_run.case_classes()
    regressed = {case: classes.get(case, "not run") for case in expected if classes.get(case) != "pass"}
    assert not regressed, f"cases that passed delegated in the recorded run no longer do: {regressed}"


def test_every_failure_is_a_known_bug(subset_run):
    failures = {
        run_suite.case_id(t, s): s.get("Failure Class")
        for t, s in subset_run.subtests()
        if s.get("Failure Class") not in (*run_suite.PASS_CLASSES, "skip")
    }
    new = {case: cls for case, cls in failures.items() if KNOWN_FAILURES.get(case) != cls}
    assert not new, f"new failures (not in KNOWN_FAILURES): {new}"


def test_pass_rate(subset_run):
    total = run_suite.totals(subset_run, "mps")
    assert total.pass_rate >= MIN_PASS_RATE, (
        f"pass rate {total.pass_rate:.3f} < {MIN_PASS_RATE} ({total.passed}/{total.passed + total.failed}); "
        f"failures: {dict(total.reasons)}"
    )


class _Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def _run_case(name: str):
    """One suite case in this process, through the suite's own run_test."""
    from executorch.backends.test.suite.runner import run_test

    from harness import suite_flow

    inputs = (torch.randn(2, 10), torch.randn(2, 10))
    record = run_test(_Add(), inputs, suite_flow.MPS_TEST_FLOW, name, name, 0, None, generate_random_test_inputs=False)
    return suite_flow.classify(record.result, record.error), record


def test_failures_are_classified(monkeypatch):
    """The failure classes the report relies on, provoked on a one-add program."""
    from mps_backend import backend
    from mps_backend.runtime import interpreter
    from mps_backend.runtime.core import DeviceError

    assert _run_case("ok")[0] == "pass"

    with monkeypatch.context() as m:
        m.setattr(backend, "write_blob", lambda *a: (_ for _ in ()).throw(ValueError("boom")))
        cls, record = _run_case("preprocess")
    assert cls == "preprocess_crash", record.error

    with monkeypatch.context() as m:

        def abort(self, inputs, *args, **kw):  # what the emulated delegate runs (shim_bridge._execute_delegate)
            raise DeviceError("unsupported", 0, "add")

        m.setattr(interpreter.Interpreter, "run_with_report", abort)
        cls, record = _run_case("device")
    assert cls == "device_error", record.error
    assert "DeviceError" in str(record.error)  # the device model's error, not "delegate failed"

    with monkeypatch.context() as m:
        real = interpreter.Interpreter.run_with_report

        def off_by_one(self, inputs, *args, **kw):
            outputs, report = real(self, inputs, *args, **kw)
            return [t + 1 for t in outputs], report

        m.setattr(interpreter.Interpreter, "run_with_report", off_by_one)
        cls, record = _run_case("mismatch")
    assert cls == "mismatch", record.error


_CRASHER = """
import os


def pytest_runtest_call(item):
    if item.nodeid.endswith("::test_view_dtype[mps-float32]"):
        os.abort()
"""


@pytest.mark.long
def test_runner_survives_a_native_crash(tmp_path, monkeypatch):
    (tmp_path / "mps_suite_crasher.py").write_text(_CRASHER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    result = run_suite.run(
        run_suite.operator_files(["view"]),
        ("mps",),
        log=None,
        extra_pytest_args=["-p", "mps_suite_crasher", "-k", "test_view_dtype or test_view_inferred"],
    )
    classes = result.case_classes()
    assert classes.pop("test_view.py::test_view_dtype[mps-float32]") == "crash"
    assert result.restarts == 1  # pytest restarted once, without the crashed test ...
    assert classes and set(classes.values()) == {"pass"}, classes  # ... and went on
    assert all(case.startswith("test_view.py::test_view_inferred_dimension[mps]") for case in classes)
    crash = next(s for t, s in result.subtests() if s.get("Failure Class") == "crash")
    assert "SIGABRT" in crash["Root Error"]
