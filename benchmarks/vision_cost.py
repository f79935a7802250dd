"""Bytes and FLOPs a vision-language program's decode step and image encoder take on the device, from the
device cost model (#37 item 2).

A random checkpoint of SmolVLM-256M's shape (nothing downloaded: ``SmolVLMConfig`` at the released sizes,
SigLIP-B/16 at 512 pixels, SmolLM2-135M's language model, 64 embeddings per image; random weights, the
vision tests' tokenizer standing in, only the config's ``vocab_size`` matters) is exported with
``mps-backend export --model hf:DIR --dtype fp16 --no-verify --max-seq-len 2048``; the same language
model alone (``LlamaForCausalLM``, the static one-row decode step) beside it. ``mps-backend cost`` then
counts what one ``text_decoder`` call of a decode step moves and computes (the device computes
``get_max_seq_len`` = 64 rows for the one token), one ``vision_encoder`` call (one image), and the
one-row step of the text-only program, with the roofline's decode tokens/s on an M2 and an M4 Max; then
the same VLM with ``--quantize int4`` (the text decoder's weights int4, the vision encoder in float16). A
model with listed assumptions (docs/device-cost.md), not a device measurement.

    python benchmarks/vision_cost.py     # ~5 minutes, < 4 GiB
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent
TEXT = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49280,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 512,
    "patch_size": 16,
}
DEVICES = ("M2", "M4 Max")


def checkpoints(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    sys.path.insert(0, str(ROOT))
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    from tests.vlm_helpers import build  # noqa: PLC0415

    _, processor = build("smolvlm")
    cfg = transformers.SmolVLMConfig(
        vision_config=transformers.SmolVLMVisionConfig(**VISION),
        text_config=transformers.LlamaConfig(**TEXT),
        scale_factor=4,
        image_token_id=processor.image_token_id,
    )
    torch.manual_seed(0)
    vlm = transformers.SmolVLMForConditionalGeneration(cfg).to(torch.float16).eval()
    vlm.save_pretrained(folder / "smolvlm")
    text = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TEXT)).to(torch.float16).eval()
    text.save_pretrained(folder / "text")
    return folder / "smolvlm", folder / "text"


def export(folder: pathlib.Path, pte: pathlib.Path, *extra: str) -> None:
    cli = [sys.executable, "-m", "mps_backend.tools.cli", "export", "--model", f"hf:{folder}", "--dtype", "fp16", *extra]
    run = subprocess.run([*cli, "--no-verify", "--max-seq-len", "2048", "-o", str(pte)], capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(run.stderr[-2000:])


def line(name: str, c) -> str:
    rates = {r.device: r for r in c.roofline()}
    speeds = ", ".join(f"{d} {rates[d].decode_tokens_per_s:.0f}/s" for d in DEVICES if d in rates)
    return (
        f"{name:34s} floor {c.floor / 2**20:8.2f} MiB, naive {c.naive_ratio:.3f}x, fused {c.fused_ratio:.3f}x; "
        f"{c.flops / 1e9:7.2f} GFLOP; roofline {speeds}"
    )


def main() -> int:
    from mps_backend.cost import cost_of_program  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="vision-cost-") as tmp:
        vlm, text = checkpoints(pathlib.Path(tmp))
        export(vlm, pathlib.Path(tmp) / "vlm.pte")
        export(text, pathlib.Path(tmp) / "text.pte")
        print(line("smolvlm-256m text_decoder (1 token)", cost_of_program(pathlib.Path(tmp) / "vlm.pte", "text_decoder")))
        print(line("smolvlm-256m vision_encoder (image)", cost_of_program(pathlib.Path(tmp) / "vlm.pte", "vision_encoder")))
        print(line("smollm2-135m forward (1-row step)", cost_of_program(pathlib.Path(tmp) / "text.pte", "forward")))
        export(vlm, pathlib.Path(tmp) / "vlm-int4.pte", "--quantize", "int4")
        q = pathlib.Path(tmp) / "vlm-int4.pte"
        print(line("smolvlm-256m int4 text_decoder", cost_of_program(q, "text_decoder")))
        print(line("smolvlm-256m int4 vision_encoder", cost_of_program(q, "vision_encoder")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
