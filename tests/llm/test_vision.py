"""Vision-language models for executorch's MultimodalRunner (#37 item 2, mps_backend.llm.vision,
`mps-backend generate --image`): tiny random Gemma 3, SmolVLM and LLaVA checkpoints with their
transformers processors (tests/vlm_helpers.py), exported through the real loading code, run on the
emulated runtime by the MultimodalRunner's loop (mps_backend.llm.multimodal) and by executorch's own
C++ MultimodalRunner (the 1.5.1 wheel's binding, MPS delegates emulated in this process).

- float32: the prompt's logits within the LLM tolerance of transformers' eager forward (Gemma 3's
  bidirectional image block included), 32 greedy tokens equal transformers' own ``generate`` (its
  dynamic cache, its masks); executorch's MultimodalRunner writes the same text;
- float16: the logits of 32 steps within the language models' FP16 tolerance of eager float32;
- a Gemma 3 checkpoint with planted outliers (hidden channels at 1e4..2e5, checked on eager float32);
- the program: the runner's methods and metadata, one MPS delegate for the image and one for the text
  decoder, the embedding gather on CPU, the costs per image and per decode step.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from mps_backend.llm.multimodal import ImageGeneration, generate_ids, generate_with_executorch_runner, prompt_inputs
from mps_backend.llm.verify import TOLERANCE
from mps_backend.llm.vision import eager_reference
from mps_backend.tools.cli import main
from tests.vlm_helpers import (
    FAMILIES,
    OUTLIER_CHANNELS,
    OUTLIER_RANGE,
    OUTLIER_WORDS,
    PROMPT,
    eager,
    eager_generate,
    picture,
    processor_inputs,
    save_vlm,
)

STEPS = 32
#: the KV cache: the SmolVLM prompt (5 images of 16 rows and their text, 95 rows) and 32 tokens fit
MAX_SEQ_LEN = 160


def _run(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _export(folder, out, dtype: str, *check) -> tuple:
    code, stdout, err = _run(
        "export", "--model", f"hf:{folder}", "--dtype", dtype, "--max-seq-len", MAX_SEQ_LEN, "-o", out, *check
    )
    assert out.is_file(), err
    return out, code, stdout


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    return save_vlm(tmp_path_factory.mktemp(request.param) / request.param, request.param)


@pytest.fixture(scope="module")
def fp32_pte(checkpoint, tmp_path_factory):
    """``mps-backend export --model hf:DIR --dtype fp32`` with its self-check: (path, exit status, stdout)."""
    return _export(checkpoint, tmp_path_factory.mktemp("pte") / "fp32.pte", "fp32")


@pytest.fixture(scope="module")
def fp16_pte(checkpoint, tmp_path_factory):
    return _export(checkpoint, tmp_path_factory.mktemp("pte") / "fp16.pte", "fp16", "--no-verify")


def _run_python(pte, folder, steps=STEPS, *, stop_at_eos=True) -> ImageGeneration:
    result = ImageGeneration(logits=[])
    generate_ids(pte, prompt_inputs(pte, folder, PROMPT, picture()), steps, result=result, stop_at_eos=stop_at_eos)
    return result


def test_fp32_logits_and_tokens_equal_transformers(checkpoint, fp32_pte):
    pte, code, stdout = fp32_pte
    assert code == 0, stdout
    assert "greedy tokens agree 4/4: ok" in stdout  # the export's self-check
    run = _run_python(pte, checkpoint)
    want = eager_generate(checkpoint, STEPS)
    assert run.tokens == want
    assert len(set(want)) >= 3  # the comparison is of a sequence that varies
    batch = processor_inputs(checkpoint)
    with torch.no_grad():
        ref = eager(checkpoint)(**batch).logits[0, -1]
    err = ((run.logits[0] - ref).abs().max() / ref.abs().max()).item()
    assert err <= TOLERANCE["fp32"], f"prompt logits off by {err:.3g} of their scale"
    if checkpoint.name == "gemma3":  # the image block's bidirectional attention is what made them equal
        causal = {k: v for k, v in batch.items() if k != "token_type_ids"}
        with torch.no_grad():
            alt = eager(checkpoint)(**causal).logits[0, -1]
        assert (alt - ref).abs().max() > 10 * TOLERANCE["fp32"] * ref.abs().max()


def test_executorch_multimodal_runner_writes_the_same_text(checkpoint, fp32_pte):
    """executorch's C++ MultimodalRunner (extension/llm/runner) on the same inputs, the MPS delegates emulated."""
    from mps_backend.llm.multimodal import load_processor

    pte, _, _ = fp32_pte
    text = generate_with_executorch_runner(pte, checkpoint, prompt_inputs(pte, checkpoint, PROMPT, picture()), STEPS)
    want = eager_generate(checkpoint, STEPS)
    assert text == load_processor(checkpoint).tokenizer.decode(want)


def test_fp16_logits_close_to_eager(checkpoint, fp16_pte):
    pte, _, _ = fp16_pte
    run = _run_python(pte, checkpoint, stop_at_eos=False)
    ref = eager_reference(checkpoint, processor_inputs(checkpoint), run.tokens)
    dev = torch.stack(run.logits)
    assert dev.shape == ref.shape and dev.shape[0] == STEPS
    err = ((dev - ref).abs().max() / ref.abs().max()).item()
    assert err <= TOLERANCE["fp16"], f"fp16 logits off by {err:.3g} of their scale"


def test_program_is_what_the_multimodal_runner_calls(checkpoint, fp32_pte):
    """The runner's methods (extension/llm/runner/constants.h:23-26 at v1.0.0) with the shapes it passes,
    its metadata (get_llm_metadata), one MPS delegate for the image and one for the text decoder, the
    embedding gather on CPU (its bounded dynamic token count), a decode step's and an image's cost."""
    from mps_backend.cost import cost_of_program
    from mps_backend.runtime import constant_method_values
    from mps_backend.runtime.emulator import program_input_specs

    pte, _, stdout = fp32_pte
    data = pte.read_bytes()
    meta = constant_method_values(data)
    model = eager(checkpoint)
    n = {"gemma3": 16, "smolvlm": 16, "llava": 16}[checkpoint.name]  # 32-pixel images: the tokens of one
    assert meta["get_max_seq_len"] == n and meta["get_max_context_len"] == MAX_SEQ_LEN
    assert meta["use_kv_cache"] is True and meta["get_eos_ids"] in ([1], 1)
    assert meta.get("image_block_rows") == (n if checkpoint.name == "gemma3" else None)
    assert program_input_specs(data, method="vision_encoder") == [((1, 3, 32, 32), torch.float32)]
    assert program_input_specs(data, method="token_embedding") == [((1, n), torch.long)]  # the upper bound
    assert program_input_specs(data, method="text_decoder") == [((1, n, 64), torch.float32), ((1,), torch.long)]
    assert "MPS delegates    2 (text_decoder 1, token_embedding 0, vision_encoder 1)" in stdout
    step = cost_of_program(pte, "text_decoder")
    assert step.cpu_kernels.get("aten::index_put_.default") == 2 * model.config.get_text_config().num_hidden_layers
    # every call computes P = n rows, a decode step too (the padded step: docs/speech-vision.md, the cost)
    text = model.model.language_model if hasattr(model.model, "language_model") else model.model.text_model
    layer_params = sum(p.numel() for name, p in text.named_parameters() if name.startswith("layers."))
    assert step.flops >= 2 * n * layer_params, (step.flops, layer_params)
    image = cost_of_program(pte, "vision_encoder")
    assert image.floor > 0 and image.flops > 0 and not image.cpu_kernels


def test_cli_generate_image_prints_transformers_text(checkpoint, fp32_pte, tmp_path):
    """`mps-backend generate FILE.pte --tokenizer DIR --image FILE.png`: the text of transformers' generate on
    the same picture read from the file; errors are one line."""
    from mps_backend.llm.multimodal import load_processor

    pte, _, _ = fp32_pte
    png = tmp_path / "p.png"
    picture().save(png)
    want = load_processor(checkpoint).tokenizer.decode(eager_generate(checkpoint, 8), skip_special_tokens=True)
    code, out, err = _run("generate", pte, "--tokenizer", checkpoint, "--image", png, "--prompt", PROMPT, "--max-new-tokens", 8)
    assert code == 0, err
    assert out == want + "\n" and "emulated on this CPU" in err
    for args, says in (
        (("--image", tmp_path / "none.png"), "no such image file"),
        (("--image", pte), "not an image file"),
    ):
        code, _, err = _run("generate", pte, "--tokenizer", checkpoint, "--prompt", PROMPT, *args)
        assert code == 2 and says in err and err.count("\n") == 1, err
    text_only = tmp_path / "text.pte"  # the text runner's metadata, a forward method only
    text_only.write_bytes(_text_program())
    code, _, err = _run("generate", text_only, "--tokenizer", checkpoint, "--prompt", PROMPT, "--image", png)
    assert code == 2 and "not a vision-language program" in err and err.count("\n") == 1, err


def _text_program() -> bytes:
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(torch.nn.Linear(2, 2).eval(), (torch.zeros(1, 2),))
    return (
        to_edge_transform_and_lower(ep, constant_methods={"get_max_seq_len": 8, "get_max_context_len": 8}).to_executorch().buffer
    )


@pytest.fixture(scope="module")
def outliers(tmp_path_factory):
    """The planted-outlier checkpoint of a family, made once on first use."""
    made = {}

    def get(family: str):
        if family not in made:
            made[family] = save_vlm(tmp_path_factory.mktemp("outliers") / family, family, outliers=True)
        return made[family]

    return get


@pytest.mark.parametrize("family", ["gemma3", "llava"])
def test_outlier_variant_reaches_the_planted_magnitudes(outliers, family):
    """Eager float32 hidden states of the planted words reach 1e4..2e5 in the planted channels (beyond
    float16's range), at those positions only."""
    from mps_backend.llm.multimodal import load_processor

    folder = outliers(family)
    batch = processor_inputs(folder)
    ids = batch["input_ids"][0].tolist()
    tok = load_processor(folder).tokenizer
    planted = {t for w in OUTLIER_WORDS for t in tok.encode(w, add_special_tokens=False)}
    where = [i for i, t in enumerate(ids) if t in planted]
    assert where
    with torch.no_grad():
        states = eager(folder)(**batch, output_hidden_states=True).hidden_states
    layer0 = states[1][0]  # the residual stream after layer 0
    values = layer0[where][:, list(OUTLIER_CHANNELS)].abs()
    low, high = OUTLIER_RANGE
    assert values.min() >= low and values.max() <= high and values.max() > 65504, values
    others = layer0.abs().clone()
    others[where] = 0
    assert others.max() < 1e3, others.max()


@pytest.mark.parametrize(
    "family, dtype",
    [
        ("gemma3", "fp32"),
        ("gemma3", "fp16"),  # the embeddings float32 between the methods: the scaled 1.6e5 reaches the float32 residual
        ("llava", "fp32"),
        ("llava", "fp16"),  # the amplification is inside the delegate, whose residual the precision policy keeps float32
    ],
)
def test_outlier_variant(outliers, tmp_path, family, dtype):
    folder = outliers(family)
    pte, _, _ = _export(folder, tmp_path / f"{dtype}.pte", dtype, "--no-verify")
    run = _run_python(pte, folder, stop_at_eos=dtype == "fp32")
    if dtype == "fp32":
        assert run.tokens == eager_generate(folder, STEPS)
    ref = eager_reference(folder, processor_inputs(folder), run.tokens)
    err = ((torch.stack(run.logits) - ref).abs().max() / ref.abs().max()).item()
    assert err <= TOLERANCE[dtype], f"{dtype} logits off by {err:.3g} of their scale"


@pytest.mark.parametrize("model_type", ["paligemma", "qwen2_vl"])
def test_other_vision_language_models_refused(tmp_path, model_type):
    """transformers' default config of the family, saved as a checkpoint folder: one line naming what is missing."""
    import transformers

    transformers.CONFIG_MAPPING[model_type]().save_pretrained(tmp_path)
    code, _, err = _run("export", "--model", f"hf:{tmp_path}", "-o", tmp_path / "x.pte")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1, err
    assert f"model type {model_type!r} is a vision-language model" in errors[0] and "Missing:" in errors[0]


@pytest.mark.parametrize(
    "args, says",
    [
        (("--quantize-embedding",), "--quantize-embedding: not done for vision-language models (llava)"),
        (("--prefill-chunk", "8"), "its rows per call must be at least 16"),
        (("--max-seq-len", "16"), "the cache must hold more than the 16 rows of one call"),
    ],
)
def test_export_refusals_are_one_line(tmp_path, args, says):
    folder = save_vlm(tmp_path / "llava", "llava")
    code, _, err = _run("export", "--model", f"hf:{folder}", *args, "-o", tmp_path / "x.pte")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and says in errors[0], err
    assert not (tmp_path / "x.pte").exists()


@pytest.mark.parametrize("family, scheme", [("gemma3", "int4"), ("smolvlm", "int4"), ("llava", "int4"), ("llava", "int8")])
def test_quantized_text_decoder_passes_its_self_check(tmp_path, family, scheme):
    """``--quantize`` quantizes the text decoder and its head (what every decode step reads); the vision
    encoder runs once an image and stays in float16. The self-check compares with eager float32 with the
    same quantized text weights (it exits 1 on a wrong program)."""
    import collections

    from mps_backend.llm.vision import text_part
    from mps_backend.serialization import read_blob
    from mps_backend.serialization.pte import delegate_blobs

    folder = save_vlm(tmp_path / family, family)
    out = tmp_path / f"{scheme}.pte"
    code, stdout, err = _run("export", "--model", f"hf:{folder}", "--quantize", scheme, "--max-seq-len", MAX_SEQ_LEN, "-o", out)
    assert code == 0 and "greedy tokens agree 4/4: ok" in stdout, stdout + err
    assert f"{scheme} weight-only" in stdout and "the vision encoder stays in float" in stdout
    assert "quantized alike" in stdout  # the reference has the same quantized weights
    text = text_part(eager(folder))
    linears = [m for m in text.modules() if isinstance(m, torch.nn.Linear)]
    graphs = [read_blob(d.blob).graph for d in delegate_blobs(out.read_bytes())]
    dequantized = {}
    for graph in graphs:
        image = any(list(graph.values[i].dims) == [1, 3, 32, 32] for i in graph.input_ids)  # the pixels
        ops = collections.Counter(n.op for n in graph.nodes)
        dequantized["vision_encoder" if image else "text_decoder"] = ops["MPSDequantizePerChannelGroup"]
    if scheme == "int4":  # the int4 layout takes every text linear but a head of another width
        assert dequantized["vision_encoder"] == 0 and len(linears) - 1 <= dequantized["text_decoder"] <= len(linears)
    else:  # int8 is stored as int8 values: no int4 dequantize node, and no quantized vision weight either
        assert dequantized == {"vision_encoder": 0, "text_decoder": 0}
