"""pytest plugin: CPU seconds per test, per fixture set-up and per xdist group, robust to a busy machine.

    python -m pytest -p scripts.cpu_durations --cpu-durations=30 [--cpu-durations-log=FILE] tests/...

Wall-clock durations (``--durations``) grow with every other process on the cores; CPU time does not. A test's
CPU is the process's ``time.process_time()`` (all its threads) plus the CPU of the child processes it waited
for (``resource.getrusage(RUSAGE_CHILDREN)``), summed over its set-up, call and teardown. A fixture's set-up is
counted once, in the test that triggers it, and also on its own (its own CPU, without the fixtures it
requests), so a shared export shows as one fixture line. Under pytest-xdist the workers measure and the numbers
travel to the controller in the test reports (``user_properties``), which prints the summary: the slowest tests
and fixtures, per-file totals, per-xdist-group totals, and the total. With ``--cpu-durations-log`` every process
also appends one JSON line per test (and per fixture set-up) to FILE, for tables over several runs.

Run with ``OMP_NUM_THREADS`` set as ``make test``'s workers run (1 thread each on 2 cores): idle OpenMP
threads spin and count as CPU.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import defaultdict

import pytest

_KEY = "cpu_seconds"
_FIXTURES_KEY = "cpu_fixture_seconds"
#: fixture set-ups shorter than this (CPU seconds) are not reported one by one
_FIXTURE_MIN = 0.2


def _cpu() -> float:
    """CPU seconds of this process (every thread) and of the children it waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def pytest_addoption(parser):
    group = parser.getgroup("cpu-durations")
    group.addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="print the N tests and fixture set-ups with the most CPU seconds, per-file and per-xdist-group totals",
    )
    group.addoption(
        "--cpu-durations-log",
        default=None,
        metavar="FILE",
        help="append one JSON line per test and per fixture set-up (CPU seconds) to FILE",
    )


def _group(item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark is not None and mark.args else ""


class _Recorder:
    """Measures in the process that runs the tests (an xdist worker, or pytest without -n)."""

    def __init__(self, log: str | None):
        self.log = log
        self.phases: dict[str, float] = {}
        self.fixtures: dict[str, float] = {}
        self.stack: list[float] = []  # CPU of the nested fixture set-ups, per open fixture set-up
        self.item = None

    def pytest_sessionfinish(self, session):
        self._write({"process": os.getpid(), "worker": os.environ.get("PYTEST_XDIST_WORKER", ""), "cpu": round(_cpu(), 3)})

    def _write(self, record: dict) -> None:
        if self.log:
            with open(self.log, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = _cpu()
        self.stack.append(0.0)
        try:
            yield
        finally:
            nested = self.stack.pop()
            total = _cpu() - start
            if self.stack:
                self.stack[-1] += total
            own = total - nested
            if own >= _FIXTURE_MIN:
                name = fixturedef.argname
                if fixturedef.params:
                    name += f"[{getattr(request, 'param_index', '?')}]"
                where = os.path.relpath(fixturedef.func.__code__.co_filename) if hasattr(fixturedef.func, "__code__") else "?"
                key = f"{where}::{name} ({fixturedef.scope})"
                self.fixtures[key] = self.fixtures.get(key, 0.0) + own

    def _phase(self, item, phase: str):
        if phase == "setup":
            self.item, self.phases, self.fixtures = item.nodeid, {}, {}
        start = _cpu()
        yield
        self.phases[phase] = _cpu() - start

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._phase(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._phase(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        yield from self._phase(item, "teardown")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if call.when != "teardown":
            return
        seconds = sum(self.phases.values())
        report.user_properties.append((_KEY, {"seconds": seconds, "group": _group(item), **self.phases}))
        report.user_properties.append((_FIXTURES_KEY, dict(self.fixtures)))
        self._write(
            {
                "test": item.nodeid,
                "group": _group(item),
                "cpu": round(seconds, 3),
                **{k: round(v, 3) for k, v in self.phases.items()},
            }
        )
        for name, secs in self.fixtures.items():
            self._write({"fixture": name, "test": item.nodeid, "cpu": round(secs, 3)})


class _Summary:
    """Collects the reports (of this process, or of the xdist workers) and prints the tables."""

    def __init__(self, top: int):
        self.top = top
        self.tests: dict[str, tuple[float, str]] = {}
        self.fixtures: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        if report.when != "teardown":
            return
        props = dict(report.user_properties)
        if _KEY in props:
            self.tests[report.nodeid] = (props[_KEY]["seconds"], props[_KEY]["group"])
        for name, secs in props.get(_FIXTURES_KEY, {}).items():
            self.fixtures[name] += secs

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        if not self.tests:
            return
        total = sum(s for s, _ in self.tests.values())
        tr.write_sep("=", f"CPU seconds: {len(self.tests)} tests, {total:.1f} s (÷2 workers: {total / 120:.1f} min)")
        tr.write_line("slowest tests and fixture set-ups (a fixture's CPU is also in the test that set it up):")
        rows = [(s, "test", n) for n, (s, _) in self.tests.items()] + [(s, "fixture", n) for n, s in self.fixtures.items()]
        for secs, kind, name in sorted(rows, reverse=True)[: self.top]:
            tr.write_line(f"{secs:9.1f}s {kind:7} {name}")
        files: dict[str, list[float]] = defaultdict(list)
        groups: dict[str, list[float]] = defaultdict(list)
        for name, (secs, group) in self.tests.items():
            files[name.split("::")[0]].append(secs)
            if group:
                groups[group].append(secs)
        tr.write_line("per file:")
        for name, secs in sorted(files.items(), key=lambda kv: -sum(kv[1]))[: self.top]:
            tr.write_line(f"{sum(secs):9.1f}s {len(secs):5} tests  {name}")
        tr.write_line("per xdist group (a group runs on one worker):")
        for name, secs in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[: min(self.top, 10)]:
            tr.write_line(f"{sum(secs):9.1f}s {len(secs):5} tests  {name}")


def pytest_configure(config):
    top = config.getoption("cpu_durations")
    log = config.getoption("cpu_durations_log")
    if top is None and log is None:
        return
    config.pluginmanager.register(_Recorder(log), "cpu-durations-recorder")  # idle on an xdist controller
    if top is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Summary(top), "cpu-durations-summary")
