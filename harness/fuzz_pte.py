"""Seeded fuzzing of the entry points that take a ``.pte``, each mutant in a worker process under an
address-space limit, so a crash, an abort or a memory bomb ends one worker instead of the caller.

    python -m harness.fuzz_pte --cases 100000 [--seed 1] [--crash-dir tests/fixtures/fuzz-crashes]

Bases: small programs exported here (a CNN in fp16, an MLP in fp32 with a CPU island, an int4 MLP). Each
mutant (byte writes, u32/u64 writes, truncations, extensions, writes into names) goes through what a
user's file goes through: ``program_check.check_program``, ``program_input_specs``, ``inspect``'s
delegate listing with ``read_blob`` on every MPS payload, and ``run_pte`` on random inputs. Allowed
outcomes: success or one of the project's typed errors. Anything else fails the campaign: another
exception type (reported with the mutant), or the worker dying (a signal, an abort, the memory limit),
whose mutant is written to ``--crash-dir`` as a regression file.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import child_env

ADDRESS_SPACE_LIMIT = 24 << 30  # torch reserves much virtual memory at import; a memory bomb exceeds this
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
    """Read case file names from stdin, run each, answer one JSON line per case."""
    import warnings  # noqa: PLC0415

    warnings.simplefilter("ignore")
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
    def __init__(self, folder: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.fuzz_pte", "--worker", str(folder)],
            stdin=subprocess.PIPE,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=_limit,
        )

    def run(self, path: Path) -> str | None:
        """The case's result, or None if the worker died on it."""
        try:
            self.proc.stdin.write(f"{path}\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.proc.wait()
            return None
        return json.loads(line)["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def campaign(cases: int, seed: int, crash_dir: Path | None = None, progress: bool = False) -> dict:
    """Run ``cases`` mutants; returns counts and the failures (untyped errors and worker deaths)."""
    base = bases()
    names = sorted(base)
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    failures: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        w = _Worker(folder)
        try:
            for i in range(cases):
                name = rng.choice(names)
                kind, mutant = mutate(rng, base[name])
                path = folder / f"case-{i}.pte"
                path.write_bytes(mutant)
                result = w.run(path)
                if result is None:  # the worker died: a signal, an abort or the address-space limit
                    code = w.proc.returncode
                    result = f"CRASH (exit {code})"
                    if crash_dir is not None:
                        crash_dir.mkdir(parents=True, exist_ok=True)
                        (crash_dir / f"seed{seed}-case{i}-{name}.pte").write_bytes(mutant)
                    w = _Worker(folder)
                if result.startswith(("UNTYPED", "CRASH")):
                    failures.append({"case": i, "base": name, "kind": kind, "result": result})
                key = result.split(":")[0]
                counts[key] = counts.get(key, 0) + 1
                path.unlink()
                if progress and (i + 1) % 100 == 0:
                    print(f"{i + 1}/{cases} {counts}", file=sys.stderr, flush=True)
        finally:
            w.close()
    return {"cases": cases, "seed": seed, "counts": counts, "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--crash-dir", type=Path, default=None, help="write mutants that killed a worker here")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    report = campaign(args.cases, args.seed, args.crash_dir, progress=True)
    print(json.dumps(report, indent=1))
    sys.exit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
