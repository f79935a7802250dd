"""Seeded fuzzing of the entry points that take a ``.pte``, each mutant in a worker process under an
address-space limit, so a crash, an abort or a memory bomb ends one worker instead of the caller.

    python -m harness.fuzz_pte --cases 100000 [--seed 1] [--jobs N] [--crash-dir tests/fixtures/fuzz-crashes]

Bases: small programs exported here (a CNN in fp16, an MLP in fp32 with a CPU island, an int4 MLP). Each
mutant (byte writes, u32/u64 writes, truncations, extensions, writes into names) goes through what a
user's file goes through: ``program_check.check_program``, ``program_input_specs``, ``inspect``'s
delegate listing with ``read_blob`` on every MPS payload, and ``run_pte`` on random inputs. Allowed
outcomes: success or one of the project's typed errors. Anything else fails the campaign: another
exception type (``UNTYPED``, reported with the case), the worker dying (``CRASH``: a signal, an abort, the
memory limit) or not answering within ``CASE_SECONDS`` (``HANG``, the worker then killed); a crashing or
hanging mutant is written to ``--crash-dir`` as a regression file. The workers run with 64 MiB tensor and
memory-plan budgets (``WORKER_BUDGET_BYTES``). ``--jobs N`` spreads the cases over N workers; the mutants
are made in case order in the parent from the seed, so they are the same for any N.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import child_env

ADDRESS_SPACE_LIMIT = 24 << 30  # torch reserves much virtual memory at import; a memory bomb exceeds this
CASE_SECONDS = 60.0  # a case takes well under a second; beyond this is a hang
#: the device model's per-tensor and the program check's memory-plan budgets in the workers (the defaults are
#: 4 GiB): the bases' tensors and plans are under 1 MiB, so a mutant that inflates one meets the same budget
#: checks at 64 MiB in milliseconds instead of allocating up to 4 GiB a tensor (a padding of 14,417,921 on the
#: CNN's convolution, within the default budget, ran 65 s at an 11 GiB peak on this shared machine)
WORKER_BUDGET_BYTES = 64 << 20
STARTUP_SECONDS = 300.0  # a worker's imports (torch, executorch) on this shared machine
ALLOWED = ("ProgramFormatError", "EmulatorError", "InputMismatchError", "MPSFormatError", "DeviceError")


def bases() -> dict[str, bytes]:
    """The programs the mutants are made from (deterministic)."""
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    from mps_backend.export import export_model  # noqa: PLC0415
    from mps_backend.quantize import quantize_model  # noqa: PLC0415

    class Island(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x, grid):
            y = torch.relu(self.a(x)).reshape(1, 2, 2, 2)
            return self.b(nn.functional.grid_sample(y, grid, align_corners=False).reshape(1, 8))

    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5)).eval()
    mlp4 = quantize_model(nn.Sequential(nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 8)).eval(), "int4", 32)
    return {
        "cnn_fp16": export_model(cnn, [torch.randn(1, 3, 8, 8)]).pte,
        "island_fp32": export_model(
            Island().eval(), [torch.randn(1, 8), torch.rand(1, 2, 2, 2) * 2 - 1], use_fp16=False, target_runtime="1.1"
        ).pte,
        "int4_mlp": export_model(mlp4, [torch.randn(1, 32)]).pte,
    }


def mutate(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    b = bytearray(data)
    kind = rng.randrange(7)
    head = min(len(b), 4096)  # the program tables and headers live near the start of these small files
    if kind == 0:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(head)] = rng.randrange(256)
        return "byte write", bytes(b)
    if kind == 1:
        return "truncate", bytes(b[: rng.randrange(len(b))])
    if kind == 2:
        return "extend", bytes(b + bytes(rng.randrange(256) for _ in range(rng.randint(1, 256))))
    if kind in (3, 4):
        pos = rng.randrange(0, head - 8) & ~3
        size = 8 if kind == 4 else 4
        value = rng.choice((0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 1 << 31, 1 << 33, rng.randrange(1 << (8 * size))))
        b[pos : pos + size] = (value % (1 << (8 * size))).to_bytes(size, "little")
        return f"u{8 * size} write", bytes(b)
    if kind == 5:  # a name the runtime logs: backend id, method, operator, compile-spec key
        names = [n for n in (b"MPSBackend", b"forward", b"use_fp16", b"aten::") if n in b]
        if names:
            name = rng.choice(names)
            pos = b.index(name) + rng.randrange(len(name))
            b[pos] = rng.choice((0x00, 0x1B, 0x80, 0xC3, 0xFF))
            return "name byte", bytes(b)
    pos = rng.randrange(len(b))  # anywhere (delegate payloads, weights)
    b[pos] = rng.randrange(256)
    return "payload byte", bytes(b)


def _run_case(data: bytes) -> str:
    """What a user's file goes through; returns 'ok' or the typed error's class name."""
    import torch  # noqa: PLC0415

    from mps_backend.runtime.emulator import program_input_specs, run_pte  # noqa: PLC0415
    from mps_backend.runtime.program_check import check_program  # noqa: PLC0415
    from mps_backend.serialization import read_blob  # noqa: PLC0415
    from mps_backend.serialization.pte import delegate_blobs  # noqa: PLC0415

    try:
        check_program(data)
        for d in delegate_blobs(data, backend_id=None):
            if d.backend_id == "MPSBackend":
                read_blob(d.blob)
        gen = torch.Generator().manual_seed(0)
        inputs = [
            torch.randn(shape, generator=gen).to(dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
            for shape, dtype in program_input_specs(data)
        ]
        run_pte(data, inputs)
        return "ok"
    except Exception as e:  # noqa: BLE001 - classified by the caller
        name = type(e).__name__
        if name in ALLOWED:
            return name
        return f"UNTYPED {name}: {str(e)[:300]}"


def worker(folder: Path) -> None:
    """Import what the cases use, answer a ready line, then read case file names from stdin and answer one
    JSON line per case."""
    import warnings  # noqa: PLC0415

    import mps_backend.runtime.emulator  # noqa: F401, PLC0415 - the imports: not counted in a case's time

    warnings.simplefilter("ignore")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        path = Path(line.strip())
        result = _run_case(path.read_bytes())
        print(json.dumps({"case": path.name, "result": result}), flush=True)


def _limit() -> None:
    try:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))
    except (ValueError, OSError):  # macOS does not enforce RLIMIT_AS and may refuse to set it
        if sys.platform != "darwin":
            raise
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _Worker:
    """One worker process; a case is sent, then its answer is collected (``CRASH`` if the worker died on it,
    ``HANG`` past the time limit, the worker then killed)."""

    def __init__(self, folder: Path, *, wait: bool = True):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.fuzz_pte", "--worker", str(folder)],
            stdin=subprocess.PIPE,
            env=child_env(
                MPS_BACKEND_MAX_TENSOR_BYTES=str(WORKER_BUDGET_BYTES), MPS_BACKEND_MAX_PLAN_BYTES=str(WORKER_BUDGET_BYTES)
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=_limit,
        )
        self.buffer = b""
        self.eof = False
        self.deadline = time.monotonic() + STARTUP_SECONDS
        if wait:
            self.started()

    def started(self) -> _Worker:
        """Wait for the worker's ready line (its imports; each case's time limit starts after them)."""
        if self.wait() is not None:
            raise RuntimeError(f"the fuzz worker did not start within {STARTUP_SECONDS:.0f} s")
        return self

    def fileno(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def send(self, path: Path, seconds: float = CASE_SECONDS) -> None:
        assert self.proc.stdin is not None
        self.deadline = time.monotonic() + seconds
        try:
            self.proc.stdin.write(f"{path}\n".encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def read(self) -> None:
        """Take what the worker wrote (call when its output is readable)."""
        chunk = os.read(self.fileno(), 65536)
        self.buffer += chunk
        self.eof = not chunk

    def answer(self) -> str | None:
        """The case's result if there is one now (its ``result``, ``CRASH (exit N)`` or ``HANG``), else None."""
        if b"\n" in self.buffer:
            line, _, self.buffer = self.buffer.partition(b"\n")
            return str(json.loads(line).get("result", "ready"))
        if self.eof:
            self.proc.wait()
            return f"CRASH (exit {self.proc.returncode})"
        if time.monotonic() >= self.deadline:
            self.proc.kill()
            self.proc.wait()
            return "HANG"
        return None

    def wait(self) -> str | None:
        """Block until the answer; None for the ready line."""
        while (result := self.answer()) is None:
            if select.select([self], [], [], max(0.0, self.deadline - time.monotonic()))[0]:
                self.read()
        return None if result == "ready" else result

    def run(self, path: Path, seconds: float = CASE_SECONDS) -> str | None:
        """One case's result (see :meth:`answer`)."""
        self.send(path, seconds)
        return self.wait()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def campaign(
    cases: int,
    seed: int,
    crash_dir: Path | None = None,
    progress: bool = False,
    jobs: int = 1,
    base: dict[str, bytes] | None = None,
) -> dict:
    """Run ``cases`` mutants on ``jobs`` workers; returns counts, the failures (untyped errors, worker deaths,
    hangs) and the time taken. The mutants are made in case order from one generator in this process, so a
    seed gives the same mutants, and the same results, whatever ``jobs`` is. ``base``: :func:`bases`' result,
    if the caller has it already (it is made otherwise)."""
    start = time.monotonic()
    base = bases() if base is None else base
    names = sorted(base)
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    failures: list[dict] = []
    results: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="fuzz-pte-") as tmp:
        folder = Path(tmp)
        idle = [w.started() for w in [_Worker(folder, wait=False) for _ in range(jobs)]]  # importing at once
        busy: dict[_Worker, tuple[int, str, str, bytes]] = {}
        sent = done = 0
        try:
            while done < cases:
                while idle and sent < cases:
                    name = rng.choice(names)
                    kind, mutant = mutate(rng, base[name])
                    path = folder / f"case-{sent}.pte"
                    path.write_bytes(mutant)
                    w = idle.pop()
                    w.send(path)
                    busy[w] = (sent, name, kind, mutant)
                    sent += 1
                wait = max(0.0, min(w.deadline for w in busy) - time.monotonic())
                for w in select.select(list(busy), [], [], wait)[0]:
                    w.read()
                for w in list(busy):
                    result = w.answer()
                    if result is None:
                        continue
                    i, name, kind, mutant = busy.pop(w)
                    (folder / f"case-{i}.pte").unlink()
                    if result.startswith(("UNTYPED", "CRASH", "HANG")):
                        failures.append({"case": i, "base": name, "kind": kind, "result": result})
                        if crash_dir is not None and not result.startswith("UNTYPED"):
                            crash_dir.mkdir(parents=True, exist_ok=True)
                            (crash_dir / f"seed{seed}-case{i}-{name}.pte").write_bytes(mutant)
                    idle.append(w if w.alive() else _Worker(folder))
                    key = result.split(":")[0]
                    counts[key] = counts.get(key, 0) + 1
                    results[i] = key
                    done += 1
                    if progress and done % 500 == 0:
                        print(f"{done}/{cases} {time.monotonic() - start:.0f}s {counts}", file=sys.stderr, flush=True)
        finally:
            for w in [*idle, *busy]:
                w.close()
    return {
        "cases": cases,
        "seed": seed,
        "jobs": jobs,
        "seconds": round(time.monotonic() - start, 1),
        "counts": dict(sorted(counts.items())),
        "failures": sorted(failures, key=lambda f: f["case"]),
        # each case's outcome in case order: equal digests, equal per-case results (whatever ``jobs`` was)
        "digest": hashlib.sha256("\n".join(results[i] for i in range(cases)).encode()).hexdigest()[:16],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--crash-dir", type=Path, default=None, help="write mutants that killed a worker here")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (the same mutants for any N)")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    report = campaign(args.cases, args.seed, args.crash_dir, progress=True, jobs=args.jobs)
    print(json.dumps(report, indent=1))
    sys.exit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
