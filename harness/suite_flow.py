"""pytest plugin: the ``mps`` flows of ExecuTorch's backend test suite.

    pytest -p harness.suite_flow -m flow_mps \\
        <site-packages>/executorch/backends/test/suite/operators

How it plugs in. The suite (``executorch.backends.test.suite``) has no flow registry: its
``conftest.py`` parametrizes the ``test_runner`` fixture, at import time, over
``executorch.backends.test.suite.flow.all_flows()``, a function that lists the flows of the
backends built into executorch. It also adds a ``flow_<name>`` and a ``backend_<backend>`` marker
per flow, which is how a run selects flows (``-m flow_mps``). This plugin wraps ``all_flows`` so
that it also returns the flows below; it does so in ``pytest_load_initial_conftests``, which
pytest runs for ``-p`` plugins before it imports any conftest, so the suite's own conftest sees
the MPS flows like any built-in one. Nothing in site-packages is modified.

The flows:

* ``mps``      -- ``MPSPartitioner(use_fp16=False)``: the delegate computes in float32.
* ``mps_fp16`` -- ``MPSPartitioner(use_fp16=True)`` (the partitioner's default precision).

Both use the suite's standard stages (Export -> ToEdgeTransformAndLower -> ToExecutorch ->
Serialize) and its standard run stage: ``Serialize.run_artifact`` loads the .pte with the
executorch pybindings and runs ``forward``. Before that, :func:`load_emulator` registers an
``MPSBackend`` in the pybindings' runtime, so ExecuTorch itself executes the program and hands
each MPS delegate call to the device model (``faithful`` mode: what the device computes).
The only addition to the run stage is error reporting: when a delegate fails, the runtime only
says "delegate execute failed", so the device model's own exception is re-raised (chained).

Tolerances. ``run_test`` compares with ``atol=0.1, rtol=0.04`` for every flow; ``mps`` keeps
them. ``mps_fp16`` rounds every intermediate result to float16 (relative step 2**-11), so an
output that is a sum of many terms (conv, linear, mean) carries an error proportional to the
magnitude of its partial sums -- i.e. to the output's scale -- not to the element itself.
The fp16 tester therefore also accepts an absolute error up to ``FP16_SCALE_TOLERANCE`` times
the largest reference magnitude; that is the bound ``mps-backend export --verify`` uses for fp16
(:data:`mps_backend.export.TOLERANCE`): ~60 float16 steps of the output scale, while a wrong
lowering is off by O(1) of the scale.

Reporting. With ``--mps-suite-report PATH`` the plugin appends one JSON line when each test
starts (``{"event": "start"}``) and one when it ends (``{"event": "result"}``: pytest outcome
and, per subtest, the metadata the suite's conftest produces for pytest-json-report plus the
MPS-specific fields below). A process that dies mid-test leaves a start without a result,
which :mod:`harness.run_suite` records as a crash.

Per-subtest MPS fields: ``Failure Class`` (see :data:`FAILURE_CLASSES`), ``Root Error`` (the
innermost relevant exception, untruncated up to 600 characters) and ``CPU Nodes`` (each node
the partitioner left on CPU, with its reason).

``--mps-seed N`` makes each test's random weights and inputs a function of N and the test id
only (the suite otherwise draws a random run seed, and the test bodies build their models and
inputs from whatever state the global RNG is in), so a subset sees the same values as a full run.
With ``ET_TEST_ENABLED_BACKENDS=mps`` (the suite's own backend filter) only the MPS flows are
listed and the other backends' flow modules are not imported.

If pytest-timeout is not installed, the suite's ``timeout`` markers (120 s per operator test)
are enforced here with SIGALRM; a timed-out test fails with :class:`SuiteTimeout`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import signal
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from executorch.backends.test.harness import Tester
from executorch.backends.test.harness.stages import Serialize, StageType, ToEdgeTransformAndLower
from executorch.backends.test.suite.flow import TestFlow

from harness.run_suite import CLASS_TEXT
from mps_backend.errors import MPSBackendError
from mps_backend.export import TOLERANCE as _EXPORT_TOLERANCE
from mps_backend.partitioner import MPSPartitioner

__all__ = [
    "BACKEND",
    "FAILURE_CLASSES",
    "FP16_SCALE_TOLERANCE",
    "MPS_FP16_TEST_FLOW",
    "MPS_TEST_FLOW",
    "MPSDelegateError",
    "MPSTester",
    "SuiteTimeout",
    "classify",
    "mps_flows",
    "register",
]

BACKEND = "mps"

#: fp16 only: accepted |device - eager| as a fraction of max |eager| (see the module docstring)
FP16_SCALE_TOLERANCE = _EXPORT_TOLERANCE[True]

#: Failure Class values, in report order, with what each means (defined with the runner, which
#: reads results without importing torch)
FAILURE_CLASSES = CLASS_TEXT


class MPSDelegateError(MPSBackendError, RuntimeError):
    """An MPS delegate failed while ExecuTorch ran the program (the device model raised)."""


class SuiteTimeout(MPSBackendError):
    """A suite test ran longer than its timeout marker allows."""


# --------------------------------------------------------------------------------------
# Facts about the current test, filled in by the stages and read by the report hooks


class _Capture:
    """MPS-specific facts of the running test, per subtest index."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.subtests: dict[int, dict[str, Any]] = {}

    def reset(self, runner: Any) -> None:
        self.runner, self.subtests = runner, {}

    def current(self) -> dict[str, Any]:
        # The suite's TestRunner counts its subtests in ``_subtest`` (incremented after each).
        index = getattr(self.runner, "_subtest", 0) if self.runner is not None else 0
        return self.subtests.setdefault(int(index), {})


_CAPTURE = _Capture()


# --------------------------------------------------------------------------------------
# Tester and stages


class MPSToEdgeTransformAndLower(ToEdgeTransformAndLower):
    """The suite's lowering stage with an ``MPSPartitioner``; records what stayed on CPU."""

    def __init__(self, partitioners=None, edge_compile_config=None, *, use_fp16: bool = False):
        super().__init__(
            default_partitioner_cls=functools.partial(MPSPartitioner, use_fp16=use_fp16),
            partitioners=partitioners,
            edge_compile_config=edge_compile_config,
        )
        self.use_fp16 = use_fp16

    def run(self, artifact, inputs=None, generate_etrecord: bool = False) -> None:
        whole = _whole_program_input(artifact) if os.environ.get(WHOLE_PROGRAM_ENV) else None
        try:
            super().run(artifact, inputs=inputs, generate_etrecord=generate_etrecord)
        finally:
            cpu_nodes = []
            for partitioner in self.partitioners:
                if isinstance(partitioner, MPSPartitioner):
                    cpu_nodes += [f"{n.target}: {n.reason}" for n in partitioner.report().on_cpu]
            _CAPTURE.current()["CPU Nodes"] = cpu_nodes
            if whole is not None:
                _CAPTURE.current()["Whole Program"] = whole_program(whole, self.use_fp16)


#: set (to anything) to also lower every case as a whole program, the way old export scripts do
#: (``to_backend("MPSBackend", to_edge(ep).exported_program(), compile_specs)``); recorded per case as
#: ``Whole Program``: ``lowered``, ``refused`` (the backend named what the device cannot run) or
#: ``crash: ...`` (preprocess failed on a node its support check accepted), ``not ours: ...`` (to_edge failed)
WHOLE_PROGRAM_ENV = "MPS_SUITE_WHOLE_PROGRAM"


def _whole_program_input(artifact: Any) -> Any:
    import copy  # noqa: PLC0415

    try:
        return copy.deepcopy(artifact)  # the partitioner path below consumes the exported program
    except Exception as e:  # noqa: BLE001 - recorded, the suite's own path goes on
        return e


def whole_program(ep: Any, use_fp16: bool) -> str:
    """Lower ``ep`` whole with ``to_backend("MPSBackend", ...)``: what happened, as a short string."""
    from executorch.exir import to_edge  # noqa: PLC0415
    from executorch.exir.backend.backend_api import to_backend  # noqa: PLC0415

    from mps_backend.backend import LoweringBug, LoweringError  # noqa: PLC0415
    from mps_backend.compile_specs import fp16_spec  # noqa: PLC0415
    from mps_backend.partitioner import edge_compile_config  # noqa: PLC0415

    if isinstance(ep, BaseException):
        return f"not ours: copying the exported program: {type(ep).__name__}: {ep}"[:300]
    try:
        edge = to_edge(ep, compile_config=edge_compile_config())
    except Exception as e:  # noqa: BLE001
        return f"not ours: to_edge: {type(e).__name__}: {e}"[:300]
    try:
        to_backend("MPSBackend", edge.exported_program(), [fp16_spec(use_fp16)])
    except LoweringBug as e:  # preprocess failed on a node its support check accepted
        return f"crash: {e}"[:600]
    except LoweringError:
        return "refused"  # the up-front check named what the device cannot run
    except Exception as e:  # noqa: BLE001 - anything else out of preprocess is a lowering bug
        return f"crash: {type(e).__name__}: {e}"[:600]
    return "lowered"


class MPSSerialize(Serialize):
    """The suite's Serialize stage; runs the program with ExecuTorch's pybindings (unchanged),
    after registering the emulated ``MPSBackend`` with them."""

    def run_artifact(self, inputs):
        from mps_backend.runtime.emulator import load_emulator  # noqa: PLC0415

        emulator = load_emulator()
        with emulator.session("faithful") as state:
            try:
                return super().run_artifact(inputs)
            except Exception:
                cause, state.error = state.error, None
                if cause is None:
                    raise
                raise MPSDelegateError(f"MPS delegate failed: {type(cause).__name__}: {cause}") from cause


def _max_abs(outputs: Any) -> float:
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    elif isinstance(outputs, dict):
        outputs = tuple(outputs.values())
    scale = 0.0
    for t in outputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            finite = t.detach().float()
            finite = finite[torch.isfinite(finite)]
            if finite.numel():
                scale = max(scale, finite.abs().max().item())
    return scale


class MPSTester(Tester):
    """``Tester`` whose lowering uses ``MPSPartitioner`` and whose run stage uses the emulator."""

    def __init__(self, module: torch.nn.Module, example_inputs, dynamic_shapes=None, *, use_fp16: bool = False):
        self.use_fp16 = use_fp16
        stage_classes = Tester.default_stage_classes() | {
            StageType.TO_EDGE_TRANSFORM_AND_LOWER: functools.partial(MPSToEdgeTransformAndLower, use_fp16=use_fp16),
            StageType.SERIALIZE: MPSSerialize,
        }
        super().__init__(module, example_inputs, stage_classes=stage_classes, dynamic_shapes=dynamic_shapes)

    def _compare_outputs(
        self, reference_output, stage_output, quantization_scale=None, atol=1e-03, rtol=1e-03, qtol=0, statistics_callback=None
    ):
        if self.use_fp16:
            atol = max(atol, FP16_SCALE_TOLERANCE * _max_abs(reference_output))
        Tester._compare_outputs(reference_output, stage_output, quantization_scale, atol, rtol, qtol, statistics_callback)


def _create_flow(name: str, use_fp16: bool) -> TestFlow:
    return TestFlow(name, backend=BACKEND, tester_factory=functools.partial(MPSTester, use_fp16=use_fp16))


MPS_TEST_FLOW = _create_flow("mps", use_fp16=False)
MPS_FP16_TEST_FLOW = _create_flow("mps_fp16", use_fp16=True)


def mps_flows() -> dict[str, TestFlow]:
    return {f.name: f for f in (MPS_TEST_FLOW, MPS_FP16_TEST_FLOW)}


# --------------------------------------------------------------------------------------
# Registration with the suite


def register() -> None:
    """Make ``executorch.backends.test.suite.flow.all_flows()`` also return the MPS flows.

    Idempotent. Must run before the suite's conftest is imported (it binds ``all_flows`` and
    parametrizes its fixture at import); as a ``-p`` plugin this happens automatically.
    """
    from executorch.backends.test.suite import flow as flow_module  # noqa: PLC0415

    builtin = flow_module.all_flows
    if getattr(builtin, "_with_mps_flows", False):
        return

    @functools.wraps(builtin)
    def all_flows() -> dict[str, TestFlow]:
        # ET_TEST_ENABLED_BACKENDS is the suite's own backend filter (suite/__init__.py applies
        # it to the unittest runner). Honour it here too: with only "mps" enabled, the other
        # backends' flow modules (coremltools, vulkan, ...; ~5 s of imports) are not loaded.
        enabled = os.environ.get("ET_TEST_ENABLED_BACKENDS")
        backends = set(enabled.split(",")) if enabled is not None else None
        if backends is None:
            flows = builtin()
        elif backends <= {BACKEND}:
            flows = {}
        else:
            flows = {n: f for n, f in builtin().items() if f.backend in backends}
        if backends is not None and BACKEND not in backends:
            return flows
        for name, f in mps_flows().items():
            if name in flows and flows[name] is not f:
                raise RuntimeError(f"executorch already defines a test flow named {name!r}")
            flows[name] = f
        return flows

    all_flows._with_mps_flows = True  # type: ignore[attr-defined]
    flow_module.all_flows = all_flows


def _suite_conftest(config: pytest.Config) -> Any | None:
    suffix = os.path.join("backends", "test", "suite", "conftest.py")
    for plugin in config.pluginmanager.get_plugins():
        if str(getattr(plugin, "__file__", "") or "").endswith(suffix):
            return plugin
    return None


# --------------------------------------------------------------------------------------
# Classification of a subtest result


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _raised_in(exc: BaseException, filename_suffix: str, functions: tuple[str, ...]) -> bool:
    for e in _chain(exc):
        for frame in traceback.extract_tb(e.__traceback__):
            if frame.name in functions and frame.filename.replace(os.sep, "/").endswith(filename_suffix):
                return True
    return False


def _root_error(exc: BaseException | None) -> str:
    """The most informative exception of the chain: ours if any, else the innermost."""
    if exc is None:
        return ""
    from mps_backend.backend import LoweringError  # noqa: PLC0415
    from mps_backend.runtime.core import DeviceError  # noqa: PLC0415
    from mps_backend.serialization.errors import MPSFormatError  # noqa: PLC0415

    chain = list(_chain(exc))
    ours = [e for e in chain if isinstance(e, (LoweringError, DeviceError, MPSFormatError, SuiteTimeout))]
    pick = ours[0] if ours else chain[-1]
    text = f"{type(pick).__name__}: {pick}".strip()
    return text if len(text) <= 600 else text[:600] + " [...]"


def _skip_reason(record: Any) -> str:
    """Why run_test skipped a case without an exception: ops it cannot run on CPU."""
    from executorch.backends.test.suite.reporting import TestResult  # noqa: PLC0415

    if record.result != TestResult.SKIPPED or record.error is not None:
        return ""
    try:
        from executorch.backends.test.suite.runner import UNSUPPORTED_PORTABLE_OPS  # noqa: PLC0415
    except ImportError:
        UNSUPPORTED_PORTABLE_OPS = set()  # noqa: N806
    left = sorted(op for op in (record.undelegated_op_counts or {}) if op in UNSUPPORTED_PORTABLE_OPS)
    if left:
        return "left on CPU, and the suite skips ops ExecuTorch's portable kernels lack: " + ", ".join(left)
    return (
        "the suite skips every program with a convolution on a rank-5 input (checked before partitioning, "
        "so also when the convolution is delegated)"
    )


def classify(result: Any, error: BaseException | None) -> str:
    """Failure Class of one subtest from its suite ``TestResult`` and exception."""
    from executorch.backends.test.suite.reporting import TestResult  # noqa: PLC0415

    from mps_backend.runtime.core import DeviceError  # noqa: PLC0415
    from mps_backend.serialization.errors import MPSFormatError  # noqa: PLC0415

    if error is not None and any(isinstance(e, SuiteTimeout) for e in _chain(error)):
        return "timeout"
    if result == TestResult.SUCCESS:
        return "pass"
    if result == TestResult.SUCCESS_UNDELEGATED:
        return "pass_cpu"
    if result == TestResult.SKIPPED:
        return "skip"
    if result == TestResult.LOWER_FAIL:
        if error is not None and _raised_in(error, "mps_backend/backend.py", ("preprocess",)):
            return "preprocess_crash"
        if error is not None and (
            _raised_in(error, "mps_backend/partitioner.py", ("partition", "ops_to_not_decompose", "is_node_supported"))
        ):
            return "partitioner_crash"
        return "lowering_error"
    if result == TestResult.PTE_RUN_FAIL:
        if error is not None and any(isinstance(e, MPSFormatError) for e in _chain(error)):
            return "invalid_blob"
        if error is not None and any(isinstance(e, (DeviceError, MPSDelegateError)) for e in _chain(error)):
            return "device_error"
        return "runtime_error"
    if result == TestResult.PTE_LOAD_FAIL:
        return "runtime_error"
    if result == TestResult.OUTPUT_MISMATCH_FAIL:
        return "mismatch"
    return "emit_error"


# --------------------------------------------------------------------------------------
# pytest hooks

_REPORT_KEY = pytest.StashKey[dict]()  # config: {"path": Path | None}
_SUBTESTS_KEY = pytest.StashKey[list]()  # item: subtest metadata of its run
_REPORTS_KEY = pytest.StashKey[list]()  # item: its TestReports (setup, call, teardown)
_SESSION_KEY = pytest.StashKey[bool]()  # config: True if we opened the suite's test session
_SCOPE_KEY = pytest.StashKey[contextlib.ExitStack]()  # config: the run's mps_backend.export_scope


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mps", "MPS flows of the ExecuTorch backend test suite")
    group.addoption(
        "--mps-suite-report", default=None, metavar="PATH", help="append one JSON line per test start and per test result to PATH"
    )
    group.addoption(
        "--mps-seed",
        default=None,
        type=int,
        metavar="N",
        help="make every test's random weights and inputs a function of N and the "
        "test id only (default: the suite's behaviour, a random seed per test)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    register()


def pytest_configure(config: pytest.Config) -> None:
    register()
    bound = getattr(_suite_conftest(config), "all_flows", None)
    if bound is not None and not getattr(bound, "_with_mps_flows", False):
        raise pytest.UsageError(
            "the ExecuTorch suite's conftest was imported before "
            "harness.suite_flow registered the MPS flows; "
            "load it with `-p harness.suite_flow`"
        )
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line(
            "markers",
            "timeout(seconds): per-test timeout (enforced by harness.suite_flow when pytest-timeout is absent)",
        )
    path = config.getoption("--mps-suite-report")
    config.stash[_REPORT_KEY] = {"path": Path(path) if path else None}
    # every lowering of the run inside mps_backend.export_scope, as export_model's: torch's census of
    # composite-implicit operators kept (asked again when an operator library is registered; six censuses per
    # lowering otherwise), the dtype check once per graph, executorch's idle re-traces skipped: the same programs
    from mps_backend.export_scope import export_scope  # noqa: PLC0415

    scope = contextlib.ExitStack()
    scope.enter_context(export_scope())
    config.stash[_SCOPE_KEY] = scope
    seed = config.getoption("--mps-seed")
    if seed is not None:
        from executorch.backends.test.suite import reporting  # noqa: PLC0415

        # run_test seeds torch with hash(test name) + the active session's seed; without a
        # session that seed is random. The suite's pytest path never opens a session.
        if reporting.get_active_test_session() is None:
            reporting.begin_test_session(None, seed=seed)
            config.stash[_SESSION_KEY] = True


def pytest_unconfigure(config: pytest.Config) -> None:
    scope = config.stash.get(_SCOPE_KEY, None)
    if scope is not None:
        scope.close()
    if config.stash.get(_SESSION_KEY, False):
        from executorch.backends.test.suite import reporting  # noqa: PLC0415

        reporting.complete_test_session()


def _write(config: pytest.Config, record: dict) -> None:
    path = config.stash.get(_REPORT_KEY, {}).get("path")
    if path is None:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def _alarm(seconds: float | None) -> Iterator[None]:
    usable = seconds and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise SuiteTimeout(f"test exceeded its timeout of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _subtest_metadata(item: pytest.Item, runner: Any) -> list[dict]:
    results = list(getattr(runner, "_results", []) or [])
    conftest = _suite_conftest(item.config)
    builder = getattr(conftest, "pytest_json_runtest_metadata", None)
    subtests = list(builder(item, None)["subtests"]) if builder is not None else []
    if len(subtests) != len(results):  # no suite conftest: the essentials only
        subtests = [
            {
                "Test ID": r.name,
                "Test Case": r.base_name,
                "Subtest": r.subtest_index,
                "Flow": r.flow,
                "Result": r.result.to_short_str(),
                "Result Detail": r.result.to_detail_str(),
                "Error": str(r.error) if r.error is not None else "",
                "Delegated": "True" if r.is_delegated() else "False",
            }
            for r in results
        ]
    for meta, record in zip(subtests, results):
        captured = _CAPTURE.subtests.get(record.subtest_index, {})
        meta["Failure Class"] = classify(record.result, record.error)
        meta["Root Error"] = _root_error(record.error) or _skip_reason(record)
        meta["CPU Nodes"] = captured.get("CPU Nodes", [])
        if "Whole Program" in captured:
            meta["Whole Program"] = captured["Whole Program"]
    return subtests


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    funcargs = getattr(item, "funcargs", None) or {}
    runner = funcargs.get("test_runner")
    _CAPTURE.reset(runner)
    seed = item.config.getoption("--mps-seed")
    if seed is not None:
        # The test body builds its model and inputs before run_test seeds torch: make them
        # independent of which tests ran before in this process.
        digest = hashlib.md5(item.nodeid.encode()).digest()
        torch.manual_seed((int.from_bytes(digest[:6], "little") + seed) % (2**63))
        random.seed(seed ^ int.from_bytes(digest[6:12], "little"))
    timeout = None
    if not item.config.pluginmanager.hasplugin("timeout"):
        marker = item.get_closest_marker("timeout")
        if marker is not None and marker.args:
            timeout = float(marker.args[0])
    try:
        with _alarm(timeout):
            return (yield)
    finally:
        if runner is not None and item.config.stash.get(_REPORT_KEY, {}).get("path") is not None:
            item.stash[_SUBTESTS_KEY] = _subtest_metadata(item, runner)
        _CAPTURE.reset(None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    _write(item.config, {"event": "start", "nodeid": item.nodeid})
    reports: list[pytest.TestReport] = []
    item.stash[_REPORTS_KEY] = reports
    try:
        return (yield)
    finally:
        _write(item.config, _result_record(item, reports))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    reports = item.stash.get(_REPORTS_KEY, None)
    if reports is not None:
        reports.append(report)
    return report


def _short(text: str, limit: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " [...]"


def _result_record(item: pytest.Item, reports: list) -> dict:
    outcome, message = "passed", ""
    for rep in reports:
        if hasattr(rep, "wasxfail"):
            outcome = "xfailed" if rep.skipped else "xpassed"
            message = str(rep.wasxfail)
            break
        if rep.failed:
            outcome = "failed" if rep.when == "call" else "error"
            crash = getattr(rep.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(rep.longrepr)
            break
        if rep.skipped:
            outcome = "skipped"
            longrepr = rep.longrepr
            message = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    callspec = getattr(item, "callspec", None)
    flow = callspec.params.get("test_runner") if callspec is not None else None
    return {
        "event": "result",
        "nodeid": item.nodeid,
        "file": item.path.name,
        "flow": getattr(flow, "name", None),
        "outcome": outcome,
        "message": _short(message),
        "duration": round(sum(getattr(r, "duration", 0.0) for r in reports), 3),
        "metadata": {"subtests": item.stash.get(_SUBTESTS_KEY, [])},
    }
