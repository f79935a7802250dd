"""Bytes a Whisper decode step and its encoder move on the device, from the device cost model (#37).

A random checkpoint of each named Whisper shape (nothing downloaded: ``WhisperConfig`` at the released
sizes, random weights, the LLM tests' tokenizer standing in for Whisper's 51865-token one, whose size
only the config's ``vocab_size`` matters for) is exported with ``mps-backend export --model hf:DIR --dtype
fp16 --no-verify`` (the decoder's cache: 448 positions, ``max_target_positions``); ``mps-backend cost``
then counts what one ``text_decoder`` call (one token) and one ``encoder`` call (one 30-second window)
move, against the floor (weights once, the KV cache once, the rows written, the inputs read once: for
the decoder the cross-attention K/V the encoder made, and the outputs). A model with listed
assumptions (docs/device-cost.md), not a device measurement. Targets: the float16 decode step's fused bytes
<= 1.03x its floor (the language models' bound), a quantized one's <= 1.05x (its dequantized weights folded
into their matmuls: 3.82x for int8 before the cost model folded an int8 weight's cast, scale and offset).
Exit status 1 when missed.

    python benchmarks/whisper_cost.py --shapes tiny base    # ~2 minutes, < 2 GiB each
    python benchmarks/whisper_cost.py --shapes tiny --quantize int8 int4    # the decoder quantized (#45)
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent
TARGET = 1.03
#: the quantized decode steps' bound (their floor is smaller, the activations above it the same)
QUANTIZED_TARGET = 1.05
#: the released Whisper sizes (openai/whisper-*: d_model, layers per stack, heads, MLP width)
SHAPES = {
    "tiny": {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "heads": 6, "ffn": 1536},
    "base": {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "heads": 8, "ffn": 2048},
    "small": {"d_model": 768, "encoder_layers": 12, "decoder_layers": 12, "heads": 12, "ffn": 3072},
}


def checkpoint(folder: pathlib.Path, shape: str) -> pathlib.Path:
    sys.path.insert(0, str(ROOT))
    from tests.llm_helpers import train_tokenizer  # noqa: PLC0415
    from tests.whisper_helpers import save_whisper  # noqa: PLC0415

    s = SHAPES[shape]
    config = {
        "d_model": s["d_model"],
        "encoder_layers": s["encoder_layers"],
        "decoder_layers": s["decoder_layers"],
        "encoder_attention_heads": s["heads"],
        "decoder_attention_heads": s["heads"],
        "encoder_ffn_dim": s["ffn"],
        "decoder_ffn_dim": s["ffn"],
        "max_target_positions": 448,
        "vocab_size": 51865,
        "tie_word_embeddings": True,
    }
    return save_whisper(folder, train_tokenizer(), config=config)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["tiny", "base"], choices=sorted(SHAPES))
    parser.add_argument("--quantize", nargs="*", default=[], choices=["int8", "int4"], help="also these (the decoder quantized)")
    args = parser.parse_args()
    from mps_backend.cost import cost_of_program  # noqa: PLC0415

    ok = True
    with tempfile.TemporaryDirectory(prefix="whisper-cost-") as tmp:
        for shape in args.shapes:
            folder = checkpoint(pathlib.Path(tmp) / shape, shape)
            for scheme in ["fp16", *args.quantize]:
                pte = pathlib.Path(tmp) / f"{shape}-{scheme}.pte"
                cli = [sys.executable, "-m", "mps_backend.tools.cli", "export", "--model", f"hf:{folder}", "--dtype", "fp16"]
                flags = [] if scheme == "fp16" else ["--quantize", scheme]
                run = subprocess.run([*cli, *flags, "--no-verify", "-o", str(pte)], capture_output=True, text=True)
                if run.returncode:
                    print(run.stderr[-2000:])
                    return 1
                for method in ("text_decoder", "encoder"):
                    c = cost_of_program(pte, method)
                    parts = ", ".join(f"{k} {v / 2**20:.2f}" for k, v in c.floor_parts.items())
                    print(
                        f"whisper-{shape} {scheme} {method:12s} floor {c.floor / 2**20:8.2f} MiB ({parts}); "
                        f"naive {c.naive_ratio:.3f}x, fused {c.fused_ratio:.3f}x the floor ({c.fused.total / 2**20:.2f} MiB)"
                    )
                    target = TARGET if scheme == "fp16" else QUANTIZED_TARGET
                    if method == "text_decoder" and c.fused_ratio > target:
                        print(f"  fused above the {target}x target")
                        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
