"""Language models at real scale: Llama-3.2-1B-, 3B- and Llama-3.1-8B-shaped random checkpoints on
disk -> .pte with the CLI.

Shapes (random normal weights written by a separate process one tensor at a time, in shards of
~2 GiB with a model.safetensors.index.json; nothing is downloaded); ``make bench`` runs 1b and 3b
(``--sizes 1b`` or ``--sizes 3b`` for one), ``make bench-8b`` (``--sizes 8b``) the 8B shape:
- 1b: dim 2048, 16 layers, 32 heads, 8 KV heads, hidden 8192, vocab 128256, untied lm_head
  (1.50 B parameters), from a float32 and a float16 checkpoint, and from a bfloat16 one with
  ``--quantize int4``;
- 3b: the Llama-3.2-3B shape, dim 3072, 28 layers, 24 heads, 8 KV heads, hidden 8192, tied
  embeddings (3.21 B parameters), from a float16 checkpoint, and from a bfloat16 one with
  ``--quantize int4``;
- 8b: the Llama-3.1-8B shape, dim 4096, 32 layers, 32 heads, 8 KV heads, hidden 14336, vocab
  128256, untied lm_head (8.03 B parameters), from a bfloat16 checkpoint with ``--quantize int4``.
``--runs bfloat16-int4`` (or ``float16``, ...) keeps only those exports of each shape; ``--workdir
DIR`` keeps the checkpoints there and reuses them. ``--sizes tiny`` (dim 64, 2 layers) runs the
same steps in seconds to check the script itself; its ratios are printed, not held to the targets
(the process's own ~0.8 GiB dwarfs its weights). ``MPS_BENCH_STAGES=1`` prints each export stage's
end with the peak RSS so far.

Measured, each export in a fresh process (``mps-backend export --model hf:DIR --max-seq-len 2048``,
float16 on the device, the CLI's default 4-step self-check), its peak RSS taken from ``os.wait4``'s
rusage of that child (and, for int4, from its /proc VmHWM when the self-check starts):
(a) 1b, float32 checkpoint: peak RSS / the checkpoint's tensor bytes — target <= 1.6;
(b) 1b, float16 checkpoint: peak RSS / the checkpoint's tensor bytes — target <= 2.0;
(c) .pte size / the unique float16 weight bytes — target <= 1.002 (every unquantized export);
(d) lowering time: in one process, the same 1b ``torch.export`` program (float16 weights) lowered with
    ``to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner()])`` + ``to_executorch()``, then
    with executorch's ``XnnpackPartitioner()`` + ``to_executorch()``: the ratio MPS / XNNPACK —
    target <= 0.5;
(e) 3b, float16 checkpoint: the export succeeds, peak RSS / 24 GiB (the machine the issue names) —
    target < 1;
(f) 3b and 8b, bfloat16 checkpoint, ``--quantize int4``: the export's peak RSS (before its
    self-check) / the checkpoint's tensor bytes — target <= 0.6 (#24); the 1b int4 run is printed
    without a target (the process's own ~0.8 GiB is a large part of its 2.8 GiB);
(g) the same 3b and 8b int4 commands whole, self-check included: peak RSS / the checkpoint's tensor
    bytes — target <= 1.0 (#35).
Every child runs under a memory cap (``--memory-cap``, default 85% of the memory available when the
benchmark starts): its resident memory (with its own children's) is read every 0.2 s and the child is
killed above the cap, a failed export (this machine has no swap: a process that outgrows it stalls
everything).
The yardsticks (checkpoint bytes, XNNPACK's time, the 24 GiB budget) are fixed or measured in the same
run. Exit status 1 when a target is missed.

Resources (last measured): see docs/llm.md, Memory and size. Disk: the checkpoint, the export's
scratch files (up to the checkpoint's weights in float16: ~16 GB for 8B, beside the .pte) and the
.pte (~4.6 GB for 8B int4); removed at the end (where the temporary folder is a tmpfs, that counts
as memory too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time


def _llama3(hidden: int, layers: int, heads: int, ffn: int, tied: bool) -> dict:
    """A Llama-3 shape: 8 KV heads, vocabulary 128256."""
    return dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        intermediate_size=ffn,
        vocab_size=128256,
        tie_word_embeddings=tied,
    )


SHAPES = {
    "1b": _llama3(2048, 16, 32, 8192, tied=False),
    "3b": _llama3(3072, 28, 24, 8192, tied=True),
    "8b": _llama3(4096, 32, 32, 14336, tied=False),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
    ),
}
# the Llama-3.2-1B shape as released: tied embeddings (benchmarks/device_cost.py)
SHAPES["1b-tied"] = SHAPES["1b"] | {"tie_word_embeddings": True}
#: the exports of each shape: (checkpoint dtype, --quantize or None)
RUNS = {
    "1b": (("float32", None), ("float16", None), ("bfloat16", "int4")),
    "3b": (("float16", None), ("bfloat16", "int4")),
    "8b": (("bfloat16", "int4"),),
    "1b-tied": (("float16", None),),
    "tiny": (("float32", None), ("float16", None), ("bfloat16", "int4")),
}
TARGET_FP32, TARGET_FP16, TARGET_SIZE, TARGET_TIME = 1.6, 2.0, 1.002, 0.5
#: (f): an int4 export's peak RSS / its bfloat16 checkpoint's bytes
TARGET_INT4 = 0.6
#: (g): the whole int4 command's peak RSS, self-check included / the checkpoint's bytes
TARGET_INT4_CHECKED = 1.0
#: seconds between two reads of a child's resident memory (the memory cap)
CAP_POLL_SECONDS = 0.2
#: checkpoint shards are cut at about this many bytes (model.safetensors.index.json names them)
SHARD_BYTES = 2 * 2**30
#: (e): the 3B shape exports within this machine's memory
MEMORY_BUDGET = 24 * 2**30
MAX_SEQ_LEN = 2048
#: print each export stage's end with the child's peak RSS so far ($MPS_BENCH_STAGES=1)
STAGES = os.environ.get("MPS_BENCH_STAGES") == "1"


def make_checkpoint(folder: pathlib.Path, shape: str, dtype: str) -> None:
    """(child) a random checkpoint of ``shape`` in ``dtype``, one tensor generated at a time."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    config = LlamaConfig(
        **{"bos_token_id": 128000, "eos_token_id": 128001, **SHAPES[shape]},
        max_position_embeddings=131072,
        rope_theta=500000.0,
        dtype=dtype,
    )
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # only the parameters' names and shapes are used
        model = AutoModelForCausalLM.from_config(config)
    gen = torch.Generator().manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    params = list(model.named_parameters())
    shards: list[dict] = [{}]
    for name, p in params:  # shards of about SHARD_BYTES, in parameter order
        if shards[-1] and sum(q.numel() for q in shards[-1].values()) * p.element_size() >= SHARD_BYTES:
            shards.append({})
        shards[-1][name] = p
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    if len(shards) == 1:
        names = ["model.safetensors"]
    weight_map = {}
    for file, shard in zip(names, shards):
        state = {}
        for name, p in shard.items():  # generated one tensor at a time; only one shard held at once
            scale, base = (0.02, 0.0) if p.dim() > 1 else (0.1, 1.0)
            state[name] = (base + scale * torch.randn(p.shape, generator=gen)).to(getattr(torch, dtype))
            weight_map[name] = file
        save_file(state, str(folder / file), metadata={"format": "pt"})
        del state
    if len(names) > 1:
        total = sum(p.numel() * getattr(torch, dtype).itemsize for _, p in params)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(folder)


def _high_water(pid: int) -> int:
    """The peak RSS so far (VmHWM) of a running process, in bytes (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _bytes(text: str, parser: argparse.ArgumentParser) -> int:
    """``18G``, ``512M``, ``4096K`` or a number of bytes."""
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = float(number) * scale
    except ValueError:
        value = 0
    if value <= 0:
        parser.error(f"--memory-cap {text!r}: not a size (e.g. 18G)")
    return int(value)


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants now (VmRSS; 0 for one that is gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return total


def _cap(proc: subprocess.Popen, limit: int, killed: list[int]) -> None:
    """(thread) kill ``proc`` when its tree's resident memory passes ``limit`` bytes."""
    while proc.poll() is None:
        rss = _tree_rss(proc.pid)
        if rss > limit:
            killed.append(rss)
            proc.kill()
            return
        time.sleep(CAP_POLL_SECONDS)


def run_measured(cmd: list[str], memory_cap: int) -> tuple[int, float, int, int]:
    """(exit status, seconds, peak RSS in bytes, peak RSS before the self-check began) of a child
    process: the export CLI prints each stage's start on stderr (``[verify 4 steps] ...``); the
    peak so far is read from /proc when the self-check starts (0 when the child has none). The child
    is killed when its resident memory passes ``memory_cap`` bytes (reported, exit status -9)."""
    import threading

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    killed: list[int] = []
    threading.Thread(target=_cap, args=(proc, memory_cap, killed), daemon=True).start()
    err, before_verify = [], 0
    for line in proc.stderr:
        if line.startswith("[verify") and line.rstrip().endswith("..."):
            before_verify = _high_water(proc.pid)
        if STAGES and line.startswith("[") and "] done in " in line:
            print(f"    {line.strip()}: peak RSS so far {_high_water(proc.pid) / 2**30:.2f} GiB", flush=True)
        err.append(line)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # (reaped here: the cap thread's poll sees it)
    if killed:
        print(
            f"    killed at the memory cap: resident {killed[0] / 2**30:.2f} GiB > {memory_cap / 2**30:.2f} GiB",
            file=sys.stderr,
            flush=True,
        )
    elif status:
        print("".join(err)[-3000:], file=sys.stderr)
    return os.waitstatus_to_exitcode(status), time.perf_counter() - t0, usage.ru_maxrss * 1024, before_verify


def timing_child(folder: pathlib.Path) -> None:
    """(child) MPS vs XNNPACK lowering of the same exported program; prints JSON."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from mps_backend import MPSPartitioner
    from mps_backend.llm.causal import FAMILY as causal
    from mps_backend.llm.decoder import example_inputs
    from mps_backend.llm.export import load_checkpoint
    from mps_backend.llm.swap import Replacements
    from mps_backend.passes import drop_unused_constants

    lm = load_checkpoint(f"hf:{folder}", "fp16")
    decoder = causal.decoder(lm, MAX_SEQ_LEN, 1, Replacements())
    with torch.no_grad():
        ep = drop_unused_constants(torch.export.export(decoder, example_inputs(), strict=False))
        seconds = {}
        for name, partitioner in (("mps", MPSPartitioner()), ("xnnpack", XnnpackPartitioner())):
            t0 = time.perf_counter()
            program = to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch()
            seconds[name] = time.perf_counter() - t0
            del program
    print(json.dumps(seconds))


def weight_bytes(folder: pathlib.Path) -> tuple[int, int]:
    """(tensor bytes in the checkpoint, their float16 bytes)."""
    from mps_backend.llm.formats import read_safetensors_header

    entries = {}
    for f in sorted(folder.glob("*.safetensors")):
        entries.update(read_safetensors_header(f))
    total = sum(end - start for _, _, start, end in entries.values())
    numel = 0
    for _dtype, shape, _, _ in entries.values():
        n = 1
        for d in shape:
            n *= d
        numel += n
    return total, numel * 2


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Llama-3.2-shaped random checkpoints -> .pte: peak memory, "
        ".pte size and lowering time as ratios (see the module docstring)"
    )
    parser.add_argument(
        "--sizes", default="1b,3b", help=f"comma-separated shapes among {', '.join(SHAPES)} (default: %(default)s)"
    )
    parser.add_argument(
        "--runs",
        default="",
        help="only these exports of each shape, e.g. bfloat16-int4 or float16 (default: all of RUNS)",
    )
    parser.add_argument(
        "--workdir",
        default="",
        help="keep the checkpoints in this folder and reuse them in later runs (default: a temporary folder, removed)",
    )
    parser.add_argument(
        "--memory-cap",
        default="",
        help="kill an export whose resident memory passes this (e.g. 18G; default: 85%% of the memory available now)",
    )
    parser.add_argument("--child", nargs=3, metavar=("KIND", "FOLDER", "ARG"))
    args = parser.parse_args()
    if args.child:
        kind, folder, arg = args.child
        if kind == "make":
            shape, dtype = arg.split(",")
            make_checkpoint(pathlib.Path(folder), shape, dtype)
        else:
            timing_child(pathlib.Path(folder))
        return 0
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown size {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    missed = []
    cli = [sys.executable, "-m", "mps_backend.tools.cli"]
    from mps_backend.llm.verify import available_memory

    memory_cap = _bytes(args.memory_cap, parser) if args.memory_cap else int(0.85 * available_memory())
    print(f"memory cap per export: {memory_cap / 2**30:.2f} GiB", flush=True)
    with contextlib.ExitStack() as stack:
        if args.workdir:
            tmp = pathlib.Path(args.workdir)
            tmp.mkdir(parents=True, exist_ok=True)
        else:
            tmp = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mps_llm_bench_")))
        for size in sizes:
            for dtype, quantize in RUNS[size]:
                label = dtype + (f"-{quantize}" if quantize else "")
                if args.runs and label not in args.runs.split(","):
                    continue
                ckpt = tmp / f"{size}-{dtype}"
                t0 = time.perf_counter()
                made = "reused"
                if not (ckpt / "config.json").is_file():  # written last: a complete checkpoint of --workdir
                    subprocess.run([sys.executable, __file__, "--child", "make", str(ckpt), f"{size},{dtype}"], check=True)
                    made = f"written in {time.perf_counter() - t0:.0f}s"
                total, fp16_bytes = weight_bytes(ckpt)
                out = tmp / f"{size}-{label}.pte"
                cmd = [*cli, "export", "--model", f"hf:{ckpt}", "--max-seq-len", str(MAX_SEQ_LEN), "-o", str(out)]
                status, seconds, peak, before_verify = run_measured(
                    cmd + (["--quantize", quantize] if quantize else []), memory_cap
                )
                if status:
                    print(
                        f"{size} {label} checkpoint: export FAILED (exit {status}"
                        + (", killed at the memory cap)" if status == -9 else ")")
                    )
                    missed.append(f"{size}-{label} export")
                    continue
                ratio = peak / total
                size_ratio = out.stat().st_size / fp16_bytes
                head = f"{size} {dtype} checkpoint ({total / 2**30:.2f} GiB, {made})"
                if quantize:
                    export_peak = before_verify or peak
                    print(
                        f"{head} --quantize {quantize}: export + self-check {seconds:.0f}s; peak RSS "
                        f"{export_peak / 2**30:.2f} GiB = {export_peak / total:.2f}x the checkpoint before the self-check"
                        + (f" (target <= {TARGET_INT4})" if size in ("3b", "8b") else "")
                        + f", {peak / 2**30:.2f} GiB = {ratio:.2f}x with it"
                        + (f" (target <= {TARGET_INT4_CHECKED})" if size in ("3b", "8b") else "")
                        + f"; .pte {out.stat().st_size / 2**30:.3f} GiB = {size_ratio:.4f}x the float16 weights",
                        flush=True,
                    )
                    if size in ("3b", "8b") and export_peak / total > TARGET_INT4:
                        missed.append(f"{size}-{label} peak RSS {export_peak / total:.2f}")
                    if size in ("3b", "8b") and ratio > TARGET_INT4_CHECKED:
                        missed.append(f"{size}-{label} peak RSS with the self-check {ratio:.2f}")
                else:
                    target = TARGET_FP32 if dtype == "float32" else TARGET_FP16
                    print(
                        f"{head}: export {seconds:.0f}s, peak RSS "
                        f"{peak / 2**30:.2f} GiB = {ratio:.2f}x the checkpoint"
                        + (f" (target <= {target})" if size == "1b" else "")
                        + (f" = {peak / MEMORY_BUDGET:.2f}x {MEMORY_BUDGET / 2**30:.0f} GiB (target < 1)" if size == "3b" else "")
                        + f"; .pte {out.stat().st_size / 2**30:.3f} GiB = {size_ratio:.4f}x the float16 weights"
                        + (f" (target <= {TARGET_SIZE})" if size != "tiny" else " (tiny: targets not applied)"),
                        flush=True,
                    )
                    if size == "1b" and ratio > target:
                        missed.append(f"{size}-{dtype} peak RSS {ratio:.2f}")
                    if size == "3b" and peak >= MEMORY_BUDGET:
                        missed.append(f"{size}-{dtype} peak RSS {peak / 2**30:.1f} GiB")
                    if size != "tiny" and size_ratio > TARGET_SIZE:
                        missed.append(f"{size}-{dtype} .pte size {size_ratio:.4f}")
                out.unlink()
                if size in ("1b", "tiny") and dtype == "float16" and not quantize:
                    r = subprocess.run(
                        [sys.executable, __file__, "--child", "time", str(ckpt), "-"], capture_output=True, text=True
                    )
                    if r.returncode:
                        print(r.stderr[-3000:])
                        missed.append(f"{size} lowering time (failed)")
                    else:
                        secs = json.loads(r.stdout.strip().splitlines()[-1])
                        t = secs["mps"] / secs["xnnpack"]
                        print(
                            f"{size} lowering + to_executorch: MPS {secs['mps']:.0f}s, XNNPACK {secs['xnnpack']:.0f}s: "
                            f"{t:.2f}x" + (f" (target <= {TARGET_TIME})" if size == "1b" else ""),
                            flush=True,
                        )
                        if size == "1b" and t > TARGET_TIME:
                            missed.append(f"lowering time {t:.2f}")
                if not args.workdir:
                    for f in ckpt.iterdir():
                        f.unlink()
    print("targets missed: " + (", ".join(missed) if missed else "none"))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
