"""Bytes and FLOPs a decode step and a prompt take on the device at the Llama-3.2-1B shape (cost model).

A random checkpoint of the Llama-3.2-1B shape (dim 2048, 16 layers, 32 heads, 8 KV heads, hidden 8192,
vocab 128256, tied embeddings; written by ``llm_scale.py``'s checkpoint maker, nothing downloaded) is
exported with ``mps-backend export --model hf:DIR --max-seq-len 2048`` in float16 and with
``--quantize int4``; ``mps_backend.cost.cost_of_program`` then counts the bytes one ``forward`` (one
decode step, CPU kernels included) moves, against the floor (weights once + KV cache once + the rows
written). Targets (issue #23): fp16 naive <= 1.10x the floor and fused <= 1.03x; int4 fused <= 1.10x.
This is a model with listed assumptions (docs/device-cost.md), not a device measurement. Exit status 1
when a target is missed.

``--archs``: instead, every architecture tests/llm/test_export.py exports (tests/llm_helpers.py's ``ARCHS``)
and the ``llama:`` checkpoint path, each as a random float16 checkpoint at a shape where the weights
dominate as in real models (``ARCH_SHAPES``: hidden 1024, 4 layers, vocab 32000, the family's heads, KV
heads and head size; sliding windows of 512), exported with ``mps-backend export --max-seq-len 1024
--dtype fp16``; naive and fused ratios per architecture, target fused <= 1.15x for each (issue #23).
About 30 s and < 2 GiB per architecture.

``--pte-dir DIR``: cost ``DIR/fp16.pte`` and ``DIR/int4.pte`` when they exist instead of exporting
(and keep the exports there). ``--shape tiny``: the same steps on a tiny shape in seconds (ratios
printed, targets not applied). Resources: ~2.5 GiB checkpoint and ~3.1 GiB of .pte files in the
temporary folder, peak RSS ~4 GiB per export, ~15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).parent
#: (program, model, target): fused/naive ratio targets to the floor
TARGETS = {("fp16", "naive"): 1.10, ("fp16", "fused"): 1.03, ("int4", "fused"): 1.10}
#: the programs: the token-by-token step (--prefill-chunk 1) and chunked programs at the
#: chunk issue #36's FLOP targets point to (fp16 16, int4 4: docs/llm.md, The chunk)
EXPORT_FLAGS = {
    "fp16": ["--prefill-chunk", "1"],
    "int4": ["--quantize", "int4", "--prefill-chunk", "1"],
    "fp16-chunk": ["--prefill-chunk", "16"],
    "int4-chunk": ["--quantize", "int4", "--prefill-chunk", "4"],
}
#: issue #36, on every device of mps_backend.cost.DEVICES, for the chunked programs: a decode step's
#: compute time at most this share of its memory time, and a 512-token prompt's time to first token at
#: most this many times its compute floor
DECODE_FLOP_SHARE, TTFT_RATIO = 0.5, 3.0
BANDWIDTHS = (100e9, 120e9)
ARCH_TARGET = 1.15  # fused, every architecture of --archs
#: --archs: common shape, then per family (transformers config overrides; heads, KV heads and head size
#: like the family's small models: Llama-3.2-1B 32/8, Qwen2.5-0.5B 14/2, Qwen3-0.6B 16/8 head 128,
#: Mistral-7B 32/8, Phi-3-mini 32/32, Gemma-2-2B 8/4 head 256, Gemma-3-1B 4/1 head 256)
ARCH_COMMON = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "vocab_size": 32000}
ARCH_SHAPES = {
    "llama": {"num_attention_heads": 16, "num_key_value_heads": 4},
    "smollm": {"num_attention_heads": 16, "num_key_value_heads": 4},
    "qwen2": {"num_attention_heads": 16, "num_key_value_heads": 2},
    "qwen3": {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "mistral": {"num_attention_heads": 16, "num_key_value_heads": 4, "sliding_window": 512},
    "phi3": {"num_attention_heads": 16, "num_key_value_heads": 16, "sliding_window": 512},
    "gemma2": {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 512},
    "gemma3": {"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512},
}
#: the llama: path (executorch's example llama, Meta's params.json), the same shape
LLAMA_PARAMS = {
    "dim": 1024,
    "n_layers": 4,
    "n_heads": 16,
    "n_kv_heads": 4,
    "vocab_size": 32000,
    "multiple_of": 256,
    "rope_theta": 500000.0,
}
ARCH_MAX_SEQ_LEN = 1024


def arch_checkpoint(folder: pathlib.Path, arch: str) -> list[str]:
    """Write ``arch``'s random float16 checkpoint into ``folder``; the export flags naming it."""
    import torch

    from tests import llm_helpers

    folder.mkdir(parents=True, exist_ok=True)
    if arch == "llama:":
        ckpt, params, _ = llm_helpers.save_llama_checkpoint(folder, params=LLAMA_PARAMS, dtype=torch.float16)
        return ["--model", f"llama:{ckpt}", "--params", str(params)]
    import transformers

    transformers.utils.logging.disable_progress_bar()
    config = ARCH_COMMON | ARCH_SHAPES[arch]
    if arch != "llama":  # llama keeps its Llama-3 rope's 131072
        config["max_position_embeddings"] = 4096
    llm_helpers.save_checkpoint(folder, arch, dtype=torch.float16, layers=ARCH_COMMON["num_hidden_layers"], config=config)
    return ["--model", f"hf:{folder}"]


def archs_main(pte_dir: pathlib.Path | None) -> int:
    """``--archs``: the naive and fused ratios of every architecture (module docstring)."""
    from mps_backend.cost import cost_of_program
    from tests.llm_helpers import ARCHS

    rows, missed = [], []
    with tempfile.TemporaryDirectory(prefix="mps_cost_archs_") as tmp:
        folder = pte_dir or pathlib.Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for arch in [*sorted(ARCHS), "llama:"]:
            name = arch.rstrip(":") + ("-meta" if arch.endswith(":") else "")
            pte = folder / f"arch-{name}.pte"
            if not pte.is_file():
                flags = arch_checkpoint(pathlib.Path(tmp) / f"ckpt-{name}", arch)
                cmd = [sys.executable, "-m", "mps_backend.tools.cli", "export", *flags]
                cmd += ["--max-seq-len", str(ARCH_MAX_SEQ_LEN), "--dtype", "fp16", "-o", str(pte)]
                r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                if r.returncode:
                    print(f"{arch}: export FAILED (exit {r.returncode})\n{r.stderr[-3000:]}", flush=True)
                    missed.append(f"{arch} export")
                    continue
            cost = cost_of_program(pte, "forward", top=5)
            ok = cost.fused_ratio <= ARCH_TARGET
            if not ok:
                missed.append(f"{arch} fused {cost.fused_ratio:.3f}x")
                print(cost.format())
            rows.append((arch, cost))
            print(
                f"{arch:8s} nodes {sum(cost.nodes_by_kind.values()):5d}  floor {cost.floor / 2**20:8.1f} MiB  "
                f"naive {cost.naive_ratio:.3f}x  fused {cost.fused_ratio:.3f}x "
                f"(target <= {ARCH_TARGET}: {'met' if ok else 'MISSED'})",
                flush=True,
            )
    print("(a model with listed assumptions, docs/device-cost.md, not a device measurement)")
    print("targets missed: " + (", ".join(missed) if missed else "none"))
    return 1 if missed else 0  # bytes/s: the tokens/s each ratio implies at these bandwidths


def main() -> int:
    parser = argparse.ArgumentParser(description="the device cost of a 1B-shaped decode step (module docstring)")
    parser.add_argument("--pte-dir", type=pathlib.Path, default=None, help="reuse/keep the exports here")
    parser.add_argument("--shape", choices=("1b-tied", "tiny"), default="1b-tied")
    parser.add_argument("--archs", action="store_true", help="every architecture of tests/llm/test_export.py instead")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    if args.archs:
        return archs_main(args.pte_dir)
    from mps_backend.cost import ROLES, cost_of_program

    missed = []
    with tempfile.TemporaryDirectory(prefix="mps_cost_bench_") as tmp:
        folder = args.pte_dir or pathlib.Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        ckpt = pathlib.Path(tmp) / "ckpt"
        for kind, flags in EXPORT_FLAGS.items():
            pte = folder / (f"{kind}.pte" if args.shape != "tiny" else f"tiny-{kind}.pte")
            if not pte.is_file():
                if not ckpt.is_dir():
                    make = [sys.executable, str(HERE / "llm_scale.py"), "--child", "make", str(ckpt), f"{args.shape},float16"]
                    subprocess.run(make, check=True)
                cmd = [sys.executable, "-m", "mps_backend.tools.cli", "export", "--model", f"hf:{ckpt}"]
                cmd += ["--max-seq-len", "2048", "--dtype", "fp16", "--no-verify", *flags, "-o", str(pte)]
                r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                if r.returncode:
                    print(f"{kind}: export FAILED (exit {r.returncode})\n{r.stderr[-3000:]}")
                    missed.append(f"{kind} export")
                    continue
            cost = cost_of_program(pte, "forward", top=5)
            print(f"== {args.shape} {kind}: {pte.stat().st_size / 2**30:.3f} GiB .pte")
            print(cost.format())
            for model in ("naive", "fused"):
                ratio = cost.naive_ratio if model == "naive" else cost.fused_ratio
                step = getattr(cost, model).total
                tps = ", ".join(f"{bw / step:.1f} tokens/s at {bw / 1e9:.0f} GB/s" for bw in BANDWIDTHS)
                target = TARGETS.get((kind, model))
                verdict = (
                    ""
                    if target is None or args.shape == "tiny"
                    else f" (target <= {target}: {'met' if ratio <= target else 'MISSED'})"
                )
                print(f"{kind} {model}: {ratio:.3f}x the floor{verdict}; model: {tps}")
                if target is not None and args.shape != "tiny" and ratio > target:
                    missed.append(f"{kind} {model} {ratio:.2f}x")
            print(
                f"{kind} floor: {cost.floor / 2**30:.3f} GiB; model at the floor: "
                + ", ".join(f"{bw / cost.floor:.1f} tokens/s at {bw / 1e9:.0f} GB/s" for bw in BANDWIDTHS)
            )
            print(f"{kind} by role, fused (GiB): " + ", ".join(f"{r} {cost.fused.by_role[r] / 2**30:.3f}" for r in ROLES))
            if kind.endswith("-chunk") and args.shape != "tiny":
                for r in cost.roofline():
                    if r.flop_share > DECODE_FLOP_SHARE:
                        missed.append(f"{kind} decode on {r.device}: FLOPs {r.flop_share:.2f} of memory time")
                    if r.ttft_ratio > TTFT_RATIO:
                        missed.append(f"{kind} TTFT 512 on {r.device}: {r.ttft_ratio:.2f}x the compute floor")
                worst = max(cost.roofline(), key=lambda r: r.ttft_ratio)
                share = max(cost.roofline(), key=lambda r: r.flop_share)
                print(
                    f"{kind}: decode FLOPs at most {share.flop_share:.2f} of the memory time ({share.device}; target "
                    f"<= {DECODE_FLOP_SHARE}), TTFT 512 at most {worst.ttft_ratio:.2f}x the compute floor "
                    f"({worst.device}; target <= {TTFT_RATIO})"
                )
    print("(a model with listed assumptions, docs/device-cost.md, not a device measurement)")
    print("targets missed: " + (", ".join(missed) if missed else "none"))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
