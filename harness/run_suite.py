"""Run ExecuTorch's backend operator test suite for the MPS flows and report the results.

    python -m harness.run_suite                       # all operator files, flow mps
    python -m harness.run_suite --subset add conv2d   # operators/test_add.py, test_conv2d.py
    python -m harness.run_suite --flow mps --flow mps_fp16 --report docs/operator-suite.md

The tests run in a pytest subprocess on the suite's ``operators`` directory inside the installed
executorch wheel, with the plugin :mod:`harness.suite_flow` (``-p``) and the suite's
own flow selection (``-m flow_<name>``). The plugin writes one JSON line per test start and
result; if the subprocess dies (a native crash) or stops making progress, the runner records
the unfinished test as crashed and restarts pytest with every finished test deselected, so one
crash costs one case, not the run.

Outputs: the markdown report (``--report``), and with ``--json`` the results in the format of
pytest-json-report (``{"tests": [{"nodeid", "outcome", "metadata": {"subtests": [...]}}]}``),
which the suite's own ``generate_markdown_summary_json.py`` reads; the report's summary counts
come from that script's ``aggregate_results``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from harness import ROOT, child_env

PLUGIN = "harness.suite_flow"
FLOWS = ("mps", "mps_fp16")
DEFAULT_SEED = 0
#: the runner kills pytest when no test starts or ends for this long (a hang the in-process
#: SIGALRM timeout cannot interrupt, e.g. inside native code); the suite's per-test limit is 120 s
STALL_SECONDS = 420

#: Failure Class -> what it means, in report order (suite_flow.classify assigns them; defined
#: here so that reading results does not import torch/executorch)
CLASS_TEXT = {
    "pass": "passed, delegated to MPS and compared with eager",
    "pass_cpu": "passed, nothing delegated (every node left on CPU; the suite does not run it)",
    "skip": "suite skip: eager/export failed, or an op left on CPU has no portable kernel",
    "preprocess_crash": "BUG: MPSBackend.preprocess raised on a node the partitioner accepted",
    "partitioner_crash": "BUG: MPSPartitioner raised",
    "lowering_error": "to_edge_transform_and_lower failed outside the MPS code",
    "invalid_blob": "BUG: preprocess wrote an MP00 blob the device runtime rejects (format error)",
    "device_error": "the device model failed running a delegate (device abort / unsupported)",
    "runtime_error": "ExecuTorch failed to load or run the program",
    "mismatch": "device-model output differs from eager beyond the tolerance",
    "emit_error": "to_executorch / serialize failed",
    "timeout": "the test exceeded its timeout (or hung: no progress, killed by the runner)",
    "crash": "the test process died (native crash)",
    "error": "the test failed outside the suite's run_test (fixture / harness error)",
}
PASS_CLASSES = ("pass", "pass_cpu")


def suite_dir() -> Path:
    """``executorch/backends/test/suite`` of the installed executorch (found without importing it)."""
    spec = importlib.util.find_spec("executorch.backends.test.suite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("executorch.backends.test.suite is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def operator_files(subset: Sequence[str] | None = None) -> list[Path]:
    """The suite's operator test files, all or those named in ``subset`` (``add``, ``test_add``,
    ``test_add.py``)."""
    root = suite_dir() / "operators"
    files = sorted(root.glob("test_*.py"))
    if not subset:
        return files
    by_name = {f.stem.removeprefix("test_"): f for f in files}
    chosen = []
    for name in subset:
        key = Path(name).stem.removeprefix("test_")
        if key not in by_name:
            raise SystemExit(f"no operator test file for {name!r}; known: {', '.join(sorted(by_name))}")
        chosen.append(by_name[key])
    return chosen


# --------------------------------------------------------------------------------------
# Running pytest


@dataclass
class SuiteRun:
    """The results of one run: one record per test (see suite_flow's ``--mps-suite-report``)."""

    tests: list[dict]
    flows: tuple[str, ...]
    seed: int | None
    seconds: float
    restarts: int = 0
    files: list[str] = field(default_factory=list)
    #: when the run started (UTC) and the source tree it ran (HEAD, "+dirty" for uncommitted changes)
    started: str = ""
    tree: str = ""

    def subtests(self) -> Iterable[tuple[dict, dict]]:
        """(test record, subtest metadata) for every case."""
        for test in self.tests:
            for sub in test["metadata"]["subtests"]:
                yield test, sub

    def case_classes(self) -> dict[str, str]:
        """``file::Test ID`` (with subtest index when > 0) -> Failure Class."""
        out = {}
        for test, sub in self.subtests():
            key = case_id(test, sub)
            out[key] = sub.get("Failure Class", "error")
        return out

    def to_json(self) -> dict:
        """pytest-json-report layout (what generate_markdown_summary_json reads), plus run info."""
        return {
            "tests": self.tests,
            "mps_run": {
                "flows": list(self.flows),
                "seed": self.seed,
                "seconds": round(self.seconds, 1),
                "restarts": self.restarts,
                "files": self.files,
                "started": self.started,
                "tree": self.tree,
            },
        }

    @classmethod
    def from_json(cls, data: dict) -> "SuiteRun":
        info = data.get("mps_run", {})
        for test in data["tests"]:
            for sub in test["metadata"]["subtests"]:
                # results of plugin versions without the invalid_blob class
                if sub.get("Failure Class") == "device_error" and str(sub.get("Root Error", "")).startswith("MPSFormatError"):
                    sub["Failure Class"] = "invalid_blob"
        return cls(
            tests=data["tests"],
            flows=tuple(info.get("flows", FLOWS[:1])),
            seed=info.get("seed"),
            seconds=info.get("seconds", 0.0),
            restarts=info.get("restarts", 0),
            files=info.get("files", []),
            started=info.get("started", ""),
            tree=info.get("tree", ""),
        )


def source_tree() -> str:
    """HEAD of the git checkout mps_backend is imported from, "+dirty" if it has local changes."""
    root = ROOT
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def case_id(test: dict, sub: dict) -> str:
    name = f"{test['file']}::{sub.get('Test ID') or test['nodeid'].split('::')[-1]}"
    index = int(sub.get("Subtest") or 0)
    return name if index == 0 else f"{name}#{index}"


def _flow_of(nodeid: str) -> str | None:
    m = re.search(r"\[([^\]-]+)", nodeid)
    return m.group(1) if m else None


def _synthetic(nodeid: str, cls: str, message: str, outcome: str) -> dict:
    """A record for a test that produced no result line (crash, hang, collection error)."""
    test_id = nodeid.split("::")[-1]
    return {
        "event": "result",
        "nodeid": nodeid,
        "file": Path(nodeid.split("::")[0]).name,
        "flow": _flow_of(nodeid),
        "outcome": outcome,
        "message": message,
        "duration": None,
        "metadata": {
            "subtests": [
                {
                    "Test ID": test_id,
                    "Test Case": test_id.split("[")[0],
                    "Subtest": 0,
                    "Flow": _flow_of(nodeid),
                    "Result": "Fail",
                    "Result Detail": "Process Crash",
                    "Error": message,
                    "Delegated": "False",
                    "Failure Class": cls,
                    "Root Error": message,
                    "CPU Nodes": [],
                }
            ]
        },
    }


def _ensure_case(record: dict) -> None:
    """Give a test that ran no case (it skipped or failed before lower_and_run_model) one
    synthetic case, so that every collected test is counted."""
    if record["metadata"]["subtests"]:
        return
    outcome = record.get("outcome")
    cls = "skip" if outcome in ("skipped", "xfailed") else "error"
    synthetic = _synthetic(record["nodeid"], cls, record.get("message") or outcome or "", outcome)
    sub = synthetic["metadata"]["subtests"][0]
    sub["Result"] = "Skip" if cls == "skip" else "Fail"
    sub["Result Detail"] = "" if cls == "skip" else "Test Error"
    del sub["Delegated"]
    record["metadata"]["subtests"] = [sub]


def _read_jsonl(path: Path) -> tuple[list[str], dict[str, dict]]:
    starts, results = [], {}
    if not path.exists():
        return starts, results
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if rec.get("event") == "start":
            starts.append(rec["nodeid"])
        elif rec.get("event") == "result":
            results[rec["nodeid"]] = rec
    return starts, results


def _pytest_command(
    files: Sequence[Path], flows: Sequence[str], jsonl: Path, seed: int | None, deselect: Iterable[str], extra: Sequence[str]
) -> list[str]:
    root = suite_dir()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *map(str, files),
        "-p",
        PLUGIN,
        "-p",
        "no:cacheprovider",
        # the suite's directory is the rootdir; no ini file (ours would apply otherwise,
        # since the venv lives inside this repository)
        "-c",
        os.devnull,
        "--rootdir",
        str(root),
        "--confcutdir",
        str(root),
        "-m",
        " or ".join(f"flow_{f}" for f in flows),
        "--mps-suite-report",
        str(jsonl),
        "-q",
        "-p",
        "no:warnings",
        "--tb=no",
        "-rN",
        # the suite's modules import its TestFlow dataclass, which pytest tries to collect
        "-W",
        "ignore::pytest.PytestCollectionWarning",
    ]
    if seed is not None:
        cmd += ["--mps-seed", str(seed)]
    cmd += [f"--deselect={n}" for n in deselect]
    return cmd + list(extra)


def _run_once(cmd: list[str], jsonl: Path, log, stall_seconds: float) -> tuple[int, bool, list[str]]:
    """Run pytest; returns (returncode, stalled, last output lines)."""
    # ET_TEST_ENABLED_BACKENDS: the suite's backend filter; the plugin then skips loading the
    # other backends' flows (they would be deselected by -m anyway)
    env = child_env(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", ET_TEST_ENABLED_BACKENDS="mps")
    tail: collections.deque[str] = collections.deque(maxlen=40)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)

    def pump():
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if log is not None:
                log.write(line)
                log.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    stalled = False
    last_size, last_change = -1, time.monotonic()
    while proc.poll() is None:
        time.sleep(2.0)
        size = jsonl.stat().st_size if jsonl.exists() else 0
        if size != last_size:
            last_size, last_change = size, time.monotonic()
        elif time.monotonic() - last_change > stall_seconds:
            stalled = True
            os.killpg(proc.pid, signal.SIGKILL)  # our own child's process group
            proc.wait()
    reader.join(timeout=10)
    return proc.returncode, stalled, list(tail)


def run(
    files: Sequence[Path] | None = None,
    flows: Sequence[str] = ("mps",),
    *,
    seed: int | None = DEFAULT_SEED,
    log=sys.stdout,
    max_restarts: int = 20,
    stall_seconds: float = STALL_SECONDS,
    extra_pytest_args: Sequence[str] = (),
    jsonl_path: Path | None = None,
) -> SuiteRun:
    """Run the suite's tests in ``files`` for ``flows``; survive crashes (see module docstring)."""
    files = list(files) if files else operator_files()
    for f in flows:
        if f not in FLOWS:
            raise ValueError(f"unknown flow {f!r}; the MPS flows are {FLOWS}")
    tmp = None
    if jsonl_path is None:
        tmp = tempfile.TemporaryDirectory(prefix="mps-suite-")
        jsonl_path = Path(tmp.name) / "results.jsonl"
    jsonl_path.unlink(missing_ok=True)
    crashed: dict[str, dict] = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    tree = source_tree()
    t0 = time.monotonic()
    restarts = 0
    try:
        while True:
            _, done = _read_jsonl(jsonl_path)
            cmd = _pytest_command(files, flows, jsonl_path, seed, [*done, *crashed], extra_pytest_args)
            code, stalled, tail = _run_once(cmd, jsonl_path, log, stall_seconds)
            starts, results = _read_jsonl(jsonl_path)
            unfinished = [n for n in starts if n not in results and n not in crashed]
            if unfinished:
                nodeid = unfinished[-1]
                if stalled:
                    why = f"no progress for {stall_seconds:g} s; killed"
                elif code < 0:
                    why = f"process killed by {signal.Signals(-code).name}"
                else:
                    why = f"process exited with code {code} mid-test"
                detail = " | ".join(line for line in tail[-6:] if line.strip())
                crashed[nodeid] = _synthetic(
                    nodeid, "timeout" if stalled else "crash", f"{why}; last output: {detail}"[:600], "crashed"
                )
                if restarts >= max_restarts:
                    break
                restarts += 1
                continue
            if code not in (0, 1, 5):  # 2 interrupted, 3 internal error, 4 usage error
                raise RuntimeError(f"pytest failed (exit code {code}):\n" + "\n".join(tail))
            break
        _, results = _read_jsonl(jsonl_path)
        for record in results.values():
            _ensure_case(record)
    finally:
        if tmp is not None:
            tmp.cleanup()
    tests = list(results.values()) + list(crashed.values())
    tests.sort(key=lambda t: (t["file"], t["nodeid"]))
    return SuiteRun(
        tests=tests,
        flows=tuple(flows),
        seed=seed,
        seconds=time.monotonic() - t0,
        restarts=restarts,
        files=[f.name for f in files],
        started=started,
        tree=tree,
    )


# --------------------------------------------------------------------------------------
# Statistics


def _delegation(sub: dict) -> str | None:
    """'full', 'partial', 'none', or None when the case never got through lowering."""
    d, u = sub.get("Delegated Nodes"), sub.get("Undelegated Nodes")
    if d is None or u is None:
        return None
    d, u = int(d), int(u)
    if d and not u:
        return "full"
    if d:
        return "partial"
    return "none"


@dataclass
class Counts:
    cases: int = 0
    full: int = 0
    partial: int = 0
    none: int = 0
    passed: int = 0
    passed_delegated: int = 0
    failed: int = 0
    skipped: int = 0
    nodes_delegated: int = 0
    nodes_total: int = 0
    reasons: collections.Counter = field(default_factory=collections.Counter)

    def add(self, sub: dict) -> None:
        self.cases += 1
        cls = sub.get("Failure Class", "error")
        deleg = _delegation(sub)
        if deleg is not None:
            setattr(self, deleg, getattr(self, deleg) + 1)
            self.nodes_delegated += int(sub["Delegated Nodes"])
            self.nodes_total += int(sub["Delegated Nodes"]) + int(sub["Undelegated Nodes"])
        if cls in PASS_CLASSES:
            self.passed += 1
            self.passed_delegated += cls == "pass"
        elif cls == "skip":
            self.skipped += 1
        else:
            self.failed += 1
            self.reasons[(cls, short_reason(sub))] += 1

    @property
    def pass_rate(self) -> float:
        run = self.passed + self.failed
        return self.passed / run if run else 0.0

    @property
    def delegation_rate(self) -> float:
        lowered = self.full + self.partial + self.none
        return (self.full + self.partial) / lowered if lowered else 0.0


_ADDR = re.compile(r"0x[0-9a-fA-F]+")


def short_reason(sub: dict, limit: int = 140) -> str:
    """One line naming why a case failed (for grouping): node/op and the first line of the error."""
    text = sub.get("Root Error") or sub.get("Error") or sub.get("Result Detail") or ""
    cls = sub.get("Failure Class")
    if cls == "mismatch":
        m = sub.get("Output 0 Error Max")
        return f"max abs error {m}" if m is not None else "output mismatch"
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = _ADDR.sub("0x…", first)
    first = re.sub(r"\b(aten_\w+?)_\d+\b", r"\1", first)  # node names: aten_add_tensor_3 -> aten_add_tensor
    first = re.sub(r"\b(node|value|_id|_ids) \d+", r"\1 N", first)  # blob positions: node 42 -> node N
    first = re.sub(r"(_id) \d+", r"\1 N", first)
    return first if len(first) <= limit else first[:limit] + "…"


def per_file(run_: SuiteRun) -> dict[tuple[str, str], Counts]:
    out: dict[tuple[str, str], Counts] = collections.defaultdict(Counts)
    for test, sub in run_.subtests():
        out[(test.get("flow") or sub.get("Flow") or "?", test["file"])].add(sub)
    return dict(sorted(out.items()))


def totals(run_: SuiteRun, flow: str) -> Counts:
    total = Counts()
    for test, sub in run_.subtests():
        if (test.get("flow") or sub.get("Flow")) == flow:
            total.add(sub)
    return total


def suite_summary(run_: SuiteRun, flow: str):
    """Counts from the suite's own generate_markdown_summary_json.aggregate_results."""
    # Loaded from its file: importing it as executorch.backends.test.suite.* would run the
    # suite package's __init__ (torch, exir: ~10 s) for a script that needs only json.
    path = suite_dir() / "generate_markdown_summary_json.py"
    spec = importlib.util.spec_from_file_location("_et_suite_generate_markdown_summary_json", path)
    if spec is None or spec.loader is None or not path.exists():
        return None
    gms = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(gms)
    except Exception:  # noqa: BLE001  (optional: the script differs in other wheels)
        return None
    tests = []
    for t in run_.tests:
        subs = [s for s in t["metadata"]["subtests"] if (t.get("flow") or s.get("Flow")) == flow]
        if subs:
            tests.append({"nodeid": t["nodeid"], "metadata": {"subtests": subs}})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"tests": tests}, f, default=str)
        path = f.name
    try:
        return gms.aggregate_results(path)
    finally:
        os.unlink(path)


# --------------------------------------------------------------------------------------
# Markdown


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


ANALYSIS_BEGIN = "<!-- analysis: hand-written, kept when the report is regenerated -->"
ANALYSIS_END = "<!-- /analysis -->"


def kept_analysis(report: str) -> str | None:
    """The hand-written analysis block of an existing report (between the markers), if any."""
    start, end = report.find(ANALYSIS_BEGIN), report.find(ANALYSIS_END)
    if start < 0 or end < start:
        return None
    return report[start + len(ANALYSIS_BEGIN) : end].strip("\n")


def render_markdown(
    run_: SuiteRun, *, title: str = "ExecuTorch operator test suite: MPS flows", analysis: str | None = None
) -> str:
    lines = [f"# {title}", ""]
    lines += [
        "Generated by `python -m harness.run_suite` (ExecuTorch's backend test suite, "
        "`executorch/backends/test/suite/operators`, run with the `mps` flows of "
        "`harness.suite_flow`; programs executed by ExecuTorch's runtime with the "
        "MPS delegates on the device model, `faithful` mode).",
        "",
        f"Flows: {', '.join(f'`{f}`' for f in run_.flows)} · seed {run_.seed} · "
        + (f"tree {run_.tree} · started {run_.started} · " if run_.tree else "")
        + f"{len(run_.files)} operator files · {run_.seconds / 60:.1f} min wall time (all runs)"
        + (f" · {run_.restarts} pytest restart(s) after crashes" if run_.restarts else ""),
        "",
        "How to read: a *case* is one `lower_and_run_model` call; a pytest test may run several "
        "(`#1`, `#2`, ... in case ids), and the suite ends a test at its first failing case, so "
        "the cases after it do not run. *Delegated*: full = every operator node in an MPS delegate, partial = some, "
        "none = the partitioner kept all on CPU (the suite then does not run the program and counts "
        "the case as passed: `pass_cpu`). *Pass rate* = passed / (passed + failed); skips are the "
        "suite's non-backend skips. *Delegation rate* = cases with at least one delegated node / "
        "cases that got through lowering.",
        "",
    ]
    if analysis:
        lines += [ANALYSIS_BEGIN, analysis.strip("\n"), ANALYSIS_END, ""]
    files = per_file(run_)
    for flow in run_.flows:
        t = totals(run_, flow)
        lines += [f"## Flow `{flow}`", ""]
        lines += [
            f"- **Cases**: {t.cases}",
            f"- **Passed**: {t.passed} ({t.passed_delegated} delegated and compared, "
            f"{t.passed - t.passed_delegated} not delegated)",
            f"- **Failed**: {t.failed}",
            f"- **Skipped** (suite, non-backend): {t.skipped}",
            f"- **Pass rate**: {_pct(t.pass_rate)} ({t.passed}/{t.passed + t.failed})",
            f"- **Delegation rate**: {_pct(t.delegation_rate)} of cases "
            f"(full {t.full}, partial {t.partial}, none {t.none}); "
            f"{t.nodes_delegated}/{t.nodes_total} operator nodes "
            f"({_pct(t.nodes_delegated / t.nodes_total if t.nodes_total else 0)})",
        ]
        agg = suite_summary(run_, flow)
        if agg is not None:
            c = agg.counts
            detail = ", ".join(f"{k} {v}" for k, v in sorted(c.by_detail.items())) or "none"
            lines.append(
                f"- Suite's own summary (`generate_markdown_summary_json.aggregate_results`): "
                f"Pass {c.passes}, Fail {c.fails}, Skip {c.skips}; failure details: {detail}"
            )
        classes = collections.Counter(
            sub.get("Failure Class", "error") for test, sub in run_.subtests() if (test.get("flow") or sub.get("Flow")) == flow
        )
        lines += ["", "| Result class | Cases | Meaning |", "|---|---:|---|"]
        for cls, text in CLASS_TEXT.items():
            if classes.get(cls):
                lines.append(f"| `{cls}` | {classes[cls]} | {text} |")
        lines += [
            "",
            f"### Per operator file (`{flow}`)",
            "",
            "| File | Cases | Delegated full / partial / none | Passed | Failed | Skipped | Failures |",
            "|---|---:|---|---:|---:|---:|---|",
        ]
        for (f_flow, name), c in files.items():
            if f_flow != flow:
                continue
            reasons = "<br>".join(f"{n}× `{cls}`: {_md(r)}" for (cls, r), n in c.reasons.most_common())
            lines.append(
                f"| {name.removesuffix('.py')} | {c.cases} | {c.full} / {c.partial} / {c.none} | "
                f"{c.passed} | {c.failed} | {c.skipped} | {reasons} |"
            )
        lines += [
            f"| **total** | **{t.cases}** | **{t.full} / {t.partial} / {t.none}** | "
            f"**{t.passed}** | **{t.failed}** | **{t.skipped}** | pass rate {_pct(t.pass_rate)}, "
            f"delegation rate {_pct(t.delegation_rate)} |",
            "",
        ]
        lines += _failure_section(run_, flow)
        lines += _cpu_section(run_, flow)
        lines += _whole_program_section(run_, flow)
        lines += _skip_section(run_, flow)
    return "\n".join(lines).rstrip() + "\n"


def _failure_section(run_: SuiteRun, flow: str) -> list[str]:
    rows = [
        (test, sub)
        for test, sub in run_.subtests()
        if (test.get("flow") or sub.get("Flow")) == flow and sub.get("Failure Class") not in (*PASS_CLASSES, "skip")
    ]
    if not rows:
        return [f"### Failed cases (`{flow}`)", "", "None.", ""]
    out = [f"### Failed cases (`{flow}`)", "", "| Case | Class | Error |", "|---|---|---|"]
    order = {c: i for i, c in enumerate(CLASS_TEXT)}
    rows.sort(key=lambda r: (order.get(r[1].get("Failure Class"), 99), case_id(*r)))
    for test, sub in rows:
        cls = sub.get("Failure Class")
        err = sub.get("Root Error") or sub.get("Error") or ""
        if cls == "mismatch":
            err = (
                f"max abs error {sub.get('Output 0 Error Max')}, MAE {sub.get('Output 0 Error MAE')}, "
                f"SNR {sub.get('Output 0 SNR')} dB; " + err.splitlines()[0]
                if err
                else ""
            )
        err = err if len(err) <= 400 else err[:400] + " […]"
        out.append(f"| `{case_id(test, sub)}` | `{cls}` | {_md(err)} |")
    return out + [""]


def _whole_program_section(run_: SuiteRun, flow: str) -> list[str]:
    """Cases also lowered whole (``MPS_SUITE_WHOLE_PROGRAM``): how each ended; nothing when not run."""
    results: collections.Counter = collections.Counter()
    crashes = []
    for test, sub in run_.subtests():
        if (test.get("flow") or sub.get("Flow")) != flow or "Whole Program" not in sub:
            continue
        outcome = sub["Whole Program"]
        results[outcome.split(":")[0]] += 1
        if not outcome.startswith(("lowered", "refused")):
            crashes.append(f"| `{case_id(test, sub)}` | {_md(outcome)} |")
    if not results:
        return []
    out = [
        f'### Whole-program `to_backend("MPSBackend", ...)` (`{flow}`)',
        "",
        "Every case also lowered the way old export scripts do (`to_edge`, then the whole program to the "
        "backend; `MPS_SUITE_WHOLE_PROGRAM=1`): "
        + ", ".join(f"{k} {n}" for k, n in results.most_common())
        + " (*refused*: the backend named the nodes the device cannot run, as it must).",
        "",
    ]
    return out + (["| Case | Outcome |", "|---|---|", *crashes, ""] if crashes else [])


def _cpu_section(run_: SuiteRun, flow: str) -> list[str]:
    reasons: collections.Counter = collections.Counter()
    for test, sub in run_.subtests():
        if (test.get("flow") or sub.get("Flow")) != flow:
            continue
        for entry in set(sub.get("CPU Nodes") or []):
            reasons[entry] += 1
    out = [f"### Nodes left on CPU by the partitioner (`{flow}`)", ""]
    if not reasons:
        return out + ["None.", ""]
    out += [
        "Expected CPU fallback: the partitioner's reason, and how many cases have such a node "
        "(these cases pass or fail on their own merits; CPU nodes run on ExecuTorch's portable "
        "kernels).",
        "",
        "| Cases | Node target: reason |",
        "|---:|---|",
    ]
    for entry, n in reasons.most_common():
        out.append(f"| {n} | {_md(entry)} |")
    return out + [""]


def _skip_section(run_: SuiteRun, flow: str) -> list[str]:
    rows = collections.Counter()
    for test, sub in run_.subtests():
        if (test.get("flow") or sub.get("Flow")) == flow and sub.get("Failure Class") == "skip":
            why = sub.get("Root Error") or test.get("message") or "unsupported portable op left on CPU"
            rows[(test["file"].removesuffix(".py"), _ADDR.sub("0x…", why.splitlines()[0])[:160])] += 1
    if not rows:
        return []
    out = [f"### Suite skips (`{flow}`)", "", "| File | Cases | Reason |", "|---|---:|---|"]
    for (name, why), n in sorted(rows.items()):
        out.append(f"| {name} | {n} | {_md(why)} |")
    return out + [""]


# --------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.run_suite", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--subset", nargs="+", metavar="NAME", help="operator test files to run (add, conv2d, test_cat.py, ...); default all"
    )
    parser.add_argument(
        "--flow",
        action="append",
        choices=FLOWS,
        help="flow(s) to run (repeatable; default mps); with --from-json, the flows whose cases --write-expected-pass lists",
    )
    parser.add_argument("--report", type=Path, default=None, help="write the markdown report here (e.g. docs/operator-suite.md)")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON (pytest-json-report layout) here")
    parser.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        default=None,
        help="do not run anything: merge these --json outputs (a test in several: the later file wins) and write the report",
    )
    parser.add_argument(
        "--analysis", type=Path, default=None, help="markdown file inserted at the top of the report (hand-written analysis)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"seed for weights and inputs (default {DEFAULT_SEED}; -1: random, as the suite)",
    )
    parser.add_argument("--jsonl", type=Path, default=None, help="keep the plugin's raw per-test JSON lines here")
    parser.add_argument(
        "--write-expected-pass",
        type=Path,
        default=None,
        help="write the ids of the cases that passed delegated (one per line) here",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    if args.from_json:
        runs = [SuiteRun.from_json(json.loads(p.read_text())) for p in args.from_json]
        # a test in several files: the later file's result supersedes (e.g. a rerun after a fix)
        latest = {t["nodeid"]: t for r in runs for t in r.tests}
        result = SuiteRun(
            tests=sorted(latest.values(), key=lambda t: (t["file"], t["nodeid"])),
            flows=tuple(dict.fromkeys(f for r in runs for f in r.flows)),
            seed=runs[0].seed,
            seconds=sum(r.seconds for r in runs),
            restarts=sum(r.restarts for r in runs),
            files=sorted({f for r in runs for f in r.files}),
            started=", ".join(dict.fromkeys(r.started for r in runs if r.started)),
            tree=", ".join(dict.fromkeys(r.tree for r in runs if r.tree)),
        )
    else:
        flows = tuple(args.flow or ("mps",))
        result = run(
            operator_files(args.subset),
            flows,
            seed=None if args.seed < 0 else args.seed,
            extra_pytest_args=args.pytest_args,
            jsonl_path=args.jsonl,
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    if args.write_expected_pass:
        # with --from-json, --flow picks the flows whose cases are listed (default: all)
        listed = tuple(args.flow or result.flows)
        passing = sorted(k for k, v in result.case_classes().items() if v == "pass" and _flow_of(k) in listed)
        header = [
            "# Cases of ExecuTorch's operator test suite that passed *delegated* (lowered to MPS, run",
            "# by ExecuTorch with the device model, compared with eager) on flow(s) "
            + ", ".join(listed)
            + f", seed {result.seed}.",
            "# One `file::test id[#subtest]` per line. Written by",
            "#   python -m harness.run_suite --write-expected-pass <this file>",
        ]
        args.write_expected_pass.write_text("\n".join(header + passing) + "\n")
    analysis = args.analysis.read_text() if args.analysis else None
    if analysis is None and args.report and args.report.exists():
        analysis = kept_analysis(args.report.read_text())
    text = render_markdown(result, analysis=analysis)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    for flow in result.flows:
        t = totals(result, flow)
        print(
            f"[{flow}] cases {t.cases}, delegated {t.full + t.partial} (full {t.full}, partial "
            f"{t.partial}, none {t.none}), passed {t.passed}, failed {t.failed}, skipped {t.skipped}; "
            f"pass rate {_pct(t.pass_rate)}, delegation rate {_pct(t.delegation_rate)} "
            f"({result.seconds / 60:.1f} min)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
