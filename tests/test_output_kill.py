"""Output files under SIGKILL and concurrency (#26): ``kill -9`` at random points of an ``export`` and of a
bundled-program ``export --bundled`` leaves the old file or a complete new one (never a truncated or mixed
file; the killed writer's temporary file is removed by the next write), and 4 processes exporting to one
path end with one complete program, byte-equal to what one of them wrote.

The exports run in processes forked from one server that imported the project once and computed nothing
(fork is safe before torch starts its thread pools), so each costs an export, not an interpreter start."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from harness import child_env

MODELS = """
import torch

def _linear(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024)).eval(), (torch.randn(1, 512),)

def m0(): return _linear(0)
def m1(): return _linear(1)
def m2(): return _linear(2)
def m3(): return _linear(3)
"""

# reads "ARGV_JSON" lines; forks a child that runs the CLI with them; answers "pid" then, when it
# ends, its wait status. The children run at the lowest priority: on a loaded machine (the suite's two workers)
# the test's poll then gets the CPU when it wakes, and a child's write of milliseconds is stretched over the
# slices it gets, so that a polled kill can land inside the write (at normal priority 0 of 12 polls did, once)
SERVER = textwrap.dedent(
    """
    import json, os, sys
    from mps_backend.tools.cli import main
    import mps_backend.export, mps_backend.llm.export, executorch.exir  # noqa: F401 - imported once, before fork
    print("ready", flush=True)
    for line in sys.stdin:
        argvs = json.loads(line)
        pids = []
        for argv in argvs:
            pid = os.fork()
            if pid == 0:
                os.nice(19)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1); os.dup2(devnull, 2)
                os._exit(main(argv))
            pids.append(pid)
        print(json.dumps(pids), flush=True)
        print(json.dumps([os.waitpid(p, 0)[1] for p in pids]), flush=True)
    """
)


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env()
    )
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)


def _start(server, argvs):
    server.stdin.write(json.dumps(argvs) + "\n")
    server.stdin.flush()
    return json.loads(server.stdout.readline())


def _finish(server):
    return json.loads(server.stdout.readline())


def _complete(path) -> bool:
    from mps_backend.export import is_bundled, unbundle
    from mps_backend.runtime.program_check import check_program

    data = path.read_bytes()
    check_program(unbundle(data) if is_bundled(data[:8]) else data)
    return True


@pytest.mark.parametrize("bundled", [False, True], ids=["pte", "bpte"])
def test_kill_9_during_an_export_leaves_the_old_or_the_new_file(server, tmp_path, bundled):
    (tmp_path / "models.py").write_text(MODELS)
    out = tmp_path / ("m.bpte" if bundled else "m.pte")
    extra = ["--bundled"] if bundled else []

    def argv(model):
        return ["export", "--model", f"{tmp_path / 'models.py'}:{model}", "-o", str(out), *extra]

    started = time.monotonic()
    _start(server, [argv("m0")])
    assert _finish(server) == [0]
    duration = time.monotonic() - started
    old = out.read_bytes()
    assert _complete(out)
    rng = random.Random(26)
    outcomes = {"old": 0, "new": 0, "mid-write": 0}
    # at least 3 kills; more polled ones (at most 12 kills in all) until one lands inside the write: the
    # write of these small programs lasts milliseconds and a poll can miss it on a loaded machine
    for k in range(12):
        if k >= 3 and outcomes["mid-write"]:
            break
        (pid,) = _start(server, [argv("m1")])
        if k == 1:  # at a random point of the export
            time.sleep(rng.uniform(0, duration))
        else:  # while its temporary file exists (the write), polled
            deadline, before = time.monotonic() + 4 * duration + 10, out.stat()
            while not list(tmp_path.glob(f".{out.name}.*.partial")) and time.monotonic() < deadline:
                now = out.stat()
                if (now.st_ino, now.st_mtime_ns) != (before.st_ino, before.st_mtime_ns):
                    break  # written before the poll saw its temporary file
                time.sleep(0.0005)
            outcomes["mid-write"] += bool(list(tmp_path.glob(f".{out.name}.*.partial")))
        try:
            import os

            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _finish(server)
        data = out.read_bytes()
        if data == old:
            outcomes["old"] += 1
        else:
            assert _complete(out), k
            outcomes["new"] += 1
            old = data
    assert outcomes["mid-write"] >= 1, outcomes  # the write itself was interrupted at least once
    # the next export removes what the killed ones left, and writes a complete file
    _start(server, [argv("m2")])
    assert _finish(server) == [0] and _complete(out)
    assert list(tmp_path.glob("*.partial")) == [] and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["models.py", out.name, "__pycache__"][: 3 if (tmp_path / "__pycache__").exists() else 2]
    ), list(tmp_path.iterdir())


def test_four_processes_exporting_to_one_path(server, tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    out = tmp_path / "same.pte"
    argvs = [["export", "--model", f"{tmp_path / 'models.py'}:m{i}", "-o", str(out)] for i in range(4)]
    _start(server, argvs)
    assert _finish(server) == [0, 0, 0, 0]
    final = out.read_bytes()
    assert _complete(out)
    # one writer's whole program: the (float16, transposed) weights of exactly one of the four models, none of the others
    import torch

    weights = []
    for i in range(4):
        torch.manual_seed(i)
        weights.append(torch.nn.Linear(512, 1024).weight.detach().t().contiguous().half().numpy().tobytes())
    assert sum(w in final for w in weights) == 1
    assert list(tmp_path.glob("*.partial")) == []
