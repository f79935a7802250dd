"""The table of docs/llm.md, "The chunk for your device": the prompt chunk ``mps-backend export`` chooses
without ``--prefill-chunk`` for each ``--device``, at three model shapes (transformers configs built on the
meta device: no weights) in float16 and ``--quantize int4``, a 2048-row cache.

    python -m scripts.chunk_table    # print the table (tests/llm/test_chunking.py checks docs/llm.md holds it)
"""

from __future__ import annotations

import torch

from benchmarks.llm_scale import SHAPES as SCALE_SHAPES

#: name -> LlamaConfig fields (the published shapes; their own configs name them so): the 1B and 8B are
#: benchmarks/llm_scale.py's (the shapes its exports are measured at)
SHAPES = {
    "SmolLM2-135M": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "Llama-3.2-1B": SCALE_SHAPES["1b-tied"],
    "Llama-3.1-8B": SCALE_SHAPES["8b"],
}
CACHE = 2048


def shapes():
    """(name, precision label, :class:`mps_backend.llm.chunking.ModelShape`) of every row of the table."""
    import transformers  # noqa: PLC0415

    from mps_backend.llm.chunking import model_shape  # noqa: PLC0415
    from mps_backend.quantize import Quantization  # noqa: PLC0415

    for name, fields in SHAPES.items():
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
        for label, quantization in (("fp16", None), ("int4", Quantization("int4"))):
            yield (
                name,
                label,
                model_shape(model, cache=CACHE, layers=fields["num_hidden_layers"], element_bytes=2, quantization=quantization),
            )


def table() -> str:
    """The markdown table: a row per shape and precision, a column per ``--device`` (``any`` first)."""
    from mps_backend.llm.chunking import DEVICE_CHOICES, choose  # noqa: PLC0415

    lines = [
        "| model shape | weights | " + " | ".join(DEVICE_CHOICES) + " |",
        "|---|---|" + "---|" * len(DEVICE_CHOICES),
    ]
    for name, label, shape in shapes():
        lines.append(f"| {name} | {label} | " + " | ".join(str(choose(shape, d).chunk) for d in DEVICE_CHOICES) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
