"""sha256 of the ``.pte`` (or MP00 blobs) of every program the tests export, to show a refactoring changes
no byte (issue #44 item 6).

    python scripts/pte_hashes.py --group llm --out before.json        # one fresh process per case
    python scripts/pte_hashes.py --group llm --out after.json
    python scripts/pte_hashes.py --compare before.json after.json     # exit 1 on a difference

Groups (``--group``, repeatable; default ``llm``):

- ``llm``: every language-model export path the tests take, on the tests' own tiny checkpoints
  (``tests/llm_helpers.py``, ``tests/vlm_helpers.py``, ``tests/whisper_helpers.py``, fixed seeds): the
  families of tests/llm/test_export.py in float32 and float16, every exported row of tests/llm/test_decoder.py's
  table, every chunked-prefill case of tests/llm/test_prefill.py, ``llama:`` checkpoints, int4/int8 weights
  and the int8 embedding, a one-layer copy of the SmolLM2 GGUF the real-model tests read (``gguf:``), the
  three vision-language families (float32, float16, quantized) and Whisper;
- ``zoo``: the zoo models tests/test_zoo.py exports by default (``export_model``, fp32 and fp16);
- ``ops``: the MP00 blobs of every op-table row (tests/ops, each precision), lowered as the op table does.

Each ``llm`` and ``zoo`` case runs in a fresh process (``--in-process``: all in this one), so that what one
export leaves behind cannot change the next; an ``ops`` row's blobs are hashed in one process per group.
The fresh processes run with ``PYTHONHASHSEED=0`` (``--hash-seed`` for another value): modeling
code that iterates a set of strings traces its nodes in the order of Python's string hashes, random per
process otherwise. transformers' Gemma 3 computes its RoPE per layer type ``for layer_type in
set(config.layer_types)``; the export's RoPE tables gather every type's rows in sorted order whichever is
asked first (``mps_backend.llm.attention.RopeTable``), so its programs are the same bytes under every seed
(the 8 Gemma 3 cases, seeds 0 and 1: 8 identical; before, 4 differed by swapped value ids).
A case that fails records its error (one line) instead of a hash: a comparison shows it too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the tests' helpers and the harness are imported from the checkout
    sys.path.insert(0, str(ROOT))

#: case name -> (group, function writing the program into a temporary folder and returning its path or bytes)
CASES: dict[str, tuple[str, Callable]] = {}


def case(name: str, group: str = "llm"):
    def register(fn: Callable) -> Callable:
        CASES[name] = (group, fn)
        return fn

    return register


def _tokenizer():
    from tests.llm_helpers import train_tokenizer

    return train_tokenizer()


def _export(spec: str, out: pathlib.Path, **options) -> pathlib.Path:
    from mps_backend.llm import export_llm

    return export_llm(spec, out, **options).path


def _hf(arch: str, dtype: str, *, layers: int = 2, config: dict | None = None, seq: int = 48, ckpt_dtype=None, **options):
    def build(tmp: pathlib.Path) -> pathlib.Path:
        import torch

        from tests.llm_helpers import save_checkpoint

        folder = save_checkpoint(
            tmp / "ckpt", arch, layers=layers, config=config, tokenizer=_tokenizer(), dtype=ckpt_dtype or torch.float32
        )
        return _export(f"hf:{folder}", tmp / "m.pte", dtype=dtype, max_seq_len=seq, **options)

    return build


def _llama(dtype: str, *, seq: int = 48, ckpt_dtype=None, **options):
    def build(tmp: pathlib.Path) -> pathlib.Path:
        import torch

        from tests.llm_helpers import save_llama_checkpoint

        ckpt, params, _ = save_llama_checkpoint(tmp, dtype=ckpt_dtype or torch.float32)
        return _export(f"llama:{ckpt}", tmp / "m.pte", dtype=dtype, max_seq_len=seq, params=str(params), **options)

    return build


def _register_llm() -> None:
    from tests.llm_helpers import ARCHS

    # tests/llm/test_export.py: every family in float32 and float16 (the precision policy's casts and rescalings)
    for arch in sorted(ARCHS):
        for dtype in ("fp32", "fp16"):
            case(f"hf-{arch}-{dtype}")(_hf(arch, dtype))
    # tests/llm/test_decoder.py: every model type the table exports
    from tests.llm.test_decoder import TABLE

    for name, (model_type, config, layers, refusal) in sorted(TABLE.items()):
        if refusal is None:
            case(f"archs-{name}-fp32")(_hf(model_type, "fp32", layers=layers, config=config))
    # tests/llm/test_prefill.py: every chunked-prefill case (chunk rows per call, dynamic prompt length)
    from tests.llm.test_prefill import CASES as PREFILL

    for name, (model_type, config, layers, chunk, cache) in sorted(PREFILL.items()):
        if model_type == "llama:":
            case(f"prefill-{name}-fp32")(_llama("fp32", seq=cache, prefill_chunk=chunk))
        else:
            case(f"prefill-{name}-fp32")(_hf(model_type, "fp32", layers=layers, config=config, seq=cache, prefill_chunk=chunk))
    case("prefill-gemma3-fp16")(_hf("gemma3", "fp16", seq=24, prefill_chunk=2))
    # llama: checkpoints (executorch's example llama)
    case("llama-fp32")(_llama("fp32"))
    case("llama-fp16")(_llama("fp16"))
    case("llama-int8-fp32")(_llama("fp32", quantize="int8"))
    # weight-only quantization (tests/llm/test_export.py, tests/llm/test_verify.py)
    case("hf-qwen3-int8-fp32")(_hf("qwen3", "fp32", quantize="int8"))
    case("hf-qwen3-int4-fp32")(_hf("qwen3", "fp32", quantize="int4"))
    case("hf-llama-bf16-int4-fp16")(_hf("llama", "fp16", quantize="int4", ckpt_dtype=_bfloat16()))
    shape = {"vocab_size": 256, "hidden_size": 128, "intermediate_size": 256}
    case("hf-qwen2-int4-g128-embedding-fp16")(
        _hf("qwen2", "fp16", config=shape, seq=16, quantize="int4", group_size=128, quantize_embedding=True)
    )
    case("hf-qwen2-int8-g64-embedding-fp16")(
        _hf("qwen2", "fp16", config=shape, seq=16, quantize="int8", group_size=64, quantize_embedding=True)
    )
    case("hf-qwen2-bf16-fp16")(_hf("qwen2", "fp16", ckpt_dtype=_bfloat16()))
    case("hf-smollm-tied-fp16")(_hf("smollm", "fp16", config={"vocab_size": 1024}))
    # gguf: a one-layer copy of the real SmolLM2 GGUF (its own blocks, Q4_1), as the self-check truncates it
    for dtype, quantize in (("fp16", None), ("fp32", None), ("fp16", "int8"), ("fp16", "int4")):
        case(f"gguf-smollm2-1layer-{quantize or 'float'}-{dtype}")(_gguf(dtype, quantize))
    # vision-language (tests/llm/test_vision.py): the MultimodalRunner's three methods
    for family in ("gemma3", "smolvlm", "llava"):
        for dtype in ("fp32", "fp16"):
            case(f"vlm-{family}-{dtype}")(_vlm(family, dtype))
        case(f"vlm-{family}-int4-fp16")(_vlm(family, "fp16", quantize="int4"))
    case("vlm-llava-int8-fp16")(_vlm("llava", "fp16", quantize="int8"))
    case("vlm-gemma3-rows24-fp32")(_vlm("gemma3", "fp32", prefill_chunk=24))
    # Whisper (tests/llm/test_whisper.py): the ASR runner's encoder and text_decoder
    for variant in ("plain", "outliers"):
        for dtype in ("fp32", "fp16"):
            case(f"whisper-{variant}-{dtype}")(_whisper(variant, dtype))
    case("whisper-plain-int8-fp32")(_whisper("plain", "fp32", quantize="int8"))


def _bfloat16():
    import torch

    return torch.bfloat16


def _gguf(dtype: str, quantize: str | None):
    def build(tmp: pathlib.Path) -> pathlib.Path:
        from mps_backend.llm.gguf import truncated_gguf
        from tests.llm_helpers import smollm2_gguf

        file, _ = truncated_gguf(smollm2_gguf(), tmp, 1)
        return _export(f"gguf:{file}", tmp / "m.pte", dtype=dtype, max_seq_len=64, quantize=quantize)

    return build


def _vlm(family: str, dtype: str, **options):
    def build(tmp: pathlib.Path) -> pathlib.Path:
        from tests.vlm_helpers import save_vlm

        folder = save_vlm(tmp / family, family)
        return _export(f"hf:{folder}", tmp / "m.pte", dtype=dtype, max_seq_len=160, **options)

    return build


def _whisper(variant: str, dtype: str, **options):
    def build(tmp: pathlib.Path) -> pathlib.Path:
        from tests.whisper_helpers import save_whisper

        folder = save_whisper(tmp / variant, _tokenizer(), outliers=variant == "outliers")
        return _export(f"hf:{folder}", tmp / "m.pte", dtype=dtype, max_seq_len=40, **options)

    return build


def _register_zoo() -> None:
    from tests.test_zoo import CASES as ZOO

    for name in sorted(ZOO):
        for precision in ("fp32", "fp16"):
            case(f"zoo-{name}-{precision}", "zoo")(_zoo(name, precision))


def _zoo(name: str, precision: str):
    def build(tmp: pathlib.Path) -> bytes:
        import torch

        from mps_backend.export import export_model
        from mps_backend.tools import models
        from tests.test_zoo import CASES as ZOO

        spec, factory = ZOO[name]
        torch.manual_seed(0)
        model, inputs = factory() if factory else models.load(spec)
        return export_model(model.eval(), inputs, use_fp16=precision == "fp16").pte

    return build


def _op_rows() -> dict[str, str]:
    """``row-precision`` -> sha256 of the row's MP00 blobs (in order), lowered as the op table does; a CPU
    row -> sha256 of its program in each precision."""
    import importlib

    import torch

    from tests.ops import harness

    files = sorted(p.stem for p in (ROOT / "tests" / "ops").glob("rows_*.py"))
    rows = [r for name in files for r in importlib.import_module(f"tests.ops.{name}").ROWS]
    out = {}
    for r in rows:
        for precision in r.precisions:
            key = f"ops-{r.id}-{precision}"
            try:
                torch.manual_seed(0)
                harness.prepared.cache_clear()  # the row's module and inputs made again under the seed
                harness.lower.cache_clear()
                blobs = harness.lower(r, precision).blobs
                digest = hashlib.sha256()
                for b in blobs:
                    digest.update(len(b).to_bytes(8, "little"))
                    digest.update(bytes(b))
                out[key] = {"sha256": digest.hexdigest(), "bytes": sum(len(b) for b in blobs), "blobs": len(blobs)}
            except Exception as e:  # noqa: BLE001 - recorded, as a case's failure
                out[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    return out


def run_case(name: str) -> dict:
    """Build case ``name`` in a temporary folder: {"sha256", "bytes", "seconds"} or {"error"}."""
    _, build = CASES[name]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pte-hash-") as tmp:
        try:
            made = build(pathlib.Path(tmp))
            data = made if isinstance(made, bytes) else pathlib.Path(made).read_bytes()
        except Exception as e:  # noqa: BLE001 - recorded: a case that stops exporting is a difference too
            return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "seconds": round(time.perf_counter() - t0, 1)}


def register(groups) -> None:
    if "llm" in groups:
        _register_llm()
    if "zoo" in groups:
        _register_zoo()


def compare(a: dict, b: dict) -> int:
    """Print every case whose hash (or error) differs or that only one file has; 1 if any."""
    differ = 0
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        strip = ("seconds",)
        x2 = {k: v for k, v in (x or {}).items() if k not in strip}
        y2 = {k: v for k, v in (y or {}).items() if k not in strip}
        if x is None or y is None or x2 != y2:
            differ += 1
            print(f"DIFFERS {name}: {x2 or 'absent'} -> {y2 or 'absent'}")
    same = len(set(a) & set(b)) - sum(1 for n in set(a) & set(b) if {**a[n], "seconds": 0} != {**b[n], "seconds": 0})
    print(f"{same} identical, {differ} differ")
    return 1 if differ else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--group", action="append", choices=("llm", "zoo", "ops"))
    p.add_argument("--out", type=pathlib.Path, help="JSON file of name -> hash (written as cases finish)")
    p.add_argument("-k", default="", help="only the cases whose name contains this")
    p.add_argument("--in-process", action="store_true", help="every case in this process (default: a fresh one each)")
    p.add_argument("--hash-seed", type=int, default=0, help="PYTHONHASHSEED of the fresh processes (default 0)")
    p.add_argument("--list", action="store_true")
    p.add_argument("--resume", action="store_true", help="skip the cases --out holds a hash of already")
    p.add_argument("--compare", nargs=2, type=pathlib.Path, metavar=("A", "B"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compare:
        return compare(*(json.loads(f.read_text()) for f in args.compare))
    groups = args.group or ["llm"]
    if args.child:
        register(("llm", "zoo"))
        print("PTE-HASH " + json.dumps(run_case(args.child)), flush=True)
        return 0
    register(groups)
    names = [n for n, (g, _) in CASES.items() if g in groups and args.k in n]
    if args.list:
        print("\n".join(names))
        return 0
    results: dict = json.loads(args.out.read_text()) if args.out and args.out.exists() else {}

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(dict(sorted(results.items())), indent=1) + "\n")

    for name in names:
        if args.resume and "sha256" in results.get(name, {}):
            continue
        if args.in_process:
            results[name] = run_case(name)
        else:
            done = subprocess.run(
                [sys.executable, __file__, "--child", name],
                capture_output=True,
                text=True,
                cwd=ROOT,
                check=False,
                env={**os.environ, "PYTHONHASHSEED": str(args.hash_seed)},
            )
            line = next((x for x in done.stdout.splitlines() if x.startswith("PTE-HASH ")), None)
            tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:300]
            results[name] = json.loads(line[len("PTE-HASH ") :]) if line else {"error": f"child died: {tail}"}
        print(name, results[name], flush=True)
        save()
    if "ops" in groups:
        results.update(_op_rows())
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
