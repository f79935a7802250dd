"""#24: an LLM export that verifies itself (mps_backend.llm.verify, `mps-backend export --verify-steps`):
the written .pte's first decode steps on the emulated runtime against eager float32 on the same
tokens, exit 1 above the tolerance, --no-verify, and the layer-truncated copy of a model too large
to run eagerly. Tiny random checkpoints; the export that computes wrong is made by wrapping the
decode step so its logits are 1% off (argmax unchanged: only the gap can catch it)."""

from __future__ import annotations

import json

import pytest
import torch

from mps_backend.llm import export as llm_export
from mps_backend.llm import verify
from mps_backend.llm.causal import CausalLM
from mps_backend.llm.verify import BUDGET_ENV, INT4_TOLERANCE, TOLERANCE, float32_on_use, truncated_copy
from mps_backend.tools.cli import main
from tests.llm_helpers import eager_model, save_checkpoint, save_llama_checkpoint, train_tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", "llama", tokenizer=train_tokenizer(), layers=3)


class _OnePercentOff(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, tokens, input_pos):
        return self.inner(tokens, input_pos) * 1.01


def _export(folder, out, *extra):
    argv = ["export", "--model", f"hf:{folder}", "--dtype", "fp32", "--max-seq-len", "16", "-o", str(out), "--prefill-chunk", "1"]
    return main([*argv, *extra])  # the one-token step: the self-check teacher-forces every prompt position


def test_export_verifies_itself_and_fails_on_a_wrong_program(tmp_path, folder, capsys, monkeypatch):
    assert _export(folder, tmp_path / "ok.pte") == 0
    out = capsys.readouterr().out
    assert "4 decode steps on the emulated runtime vs eager transformers float32" in out
    # the checkpoint's tokenizer reads a real English prompt first (--max-seq-len 16 leaves 12 tokens for it)
    assert "after a 12-token English prompt (tokenizer.json), teacher-forced: top tokens agree 12/12" in out, out
    assert "greedy tokens agree 4/4: ok" in out and "(tolerance 1e-05)" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.pte"]
    # a program that computes 1% off: exit 1, the gap printed (tokens still agree: argmax is scale-free);
    # the output path keeps what was there, the program is kept beside it as NAME.failed.pte
    (tmp_path / "bad.pte").write_bytes(b"an earlier program")
    real = CausalLM.decoder
    monkeypatch.setattr(CausalLM, "decoder", lambda self, *args: _OnePercentOff(real(self, *args)))
    assert _export(folder, tmp_path / "bad.pte", "--verify-steps", "2") == 1
    captured = capsys.readouterr()
    line = next(x for x in captured.out.splitlines() if "max |logit diff|" in x)
    rel = float(line.split(" = ")[1].split(" of")[0])
    assert 0.009 < rel < 0.011 and "FAILED" in line and "greedy tokens agree 2/2" in line, line
    assert (tmp_path / "bad.pte").read_bytes() == b"an earlier program"
    assert f"{tmp_path / 'bad.pte'} was not written" in captured.err and "bad.failed.pte" in captured.err, captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.failed.pte", "bad.pte", "ok.pte"]
    assert (tmp_path / "bad.failed.pte").read_bytes()[4:8] == b"ET12"  # the failed program, for inspection
    # --no-verify: the same wrong program exports without the check
    assert _export(folder, tmp_path / "unchecked.pte", "--no-verify") == 0
    assert "verify" not in capsys.readouterr().out


def test_too_large_model_verified_on_a_truncated_copy(tmp_path, folder, capsys, monkeypatch):
    monkeypatch.setenv(BUDGET_ENV, "1000")
    assert _export(folder, tmp_path / "m.pte", "--verify-steps", "3") == 0
    out = capsys.readouterr().out
    assert "on a copy truncated to the first 2 of 3 layers, exported separately" in out, out
    assert "above the bound 0.00 MiB" in out and "greedy tokens agree 3/3: ok" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pte"]  # the copy and its .pte are gone


def test_check_prefills_a_chunked_program_as_the_runner_does(tmp_path, folder, capsys):
    """#36: a program taking [1, n] tokens (--prefill-chunk 4) is checked as executorch's runner reads
    it: the prompt in pieces of get_max_seq_len (4), compared at each piece's last row, then one token a
    call. 16 positions, 2 steps: BOS + 14 prompt tokens in pieces ending at 3, 7, 11 and 14."""
    assert _export(folder, tmp_path / "c.pte", "--prefill-chunk", "4", "--verify-steps", "2") == 0
    out = capsys.readouterr().out
    assert "after a 14-token English prompt (tokenizer.json), teacher-forced: top tokens agree 3/3" in out, out
    assert "greedy tokens agree 2/2: ok" in out


def test_check_reads_from_bos_alone_without_a_tokenizer(tmp_path):
    """No tokenizer in the folder: the check starts from BOS and says so; a tokenizer whose ids pass
    the model's vocabulary is not used either."""
    bare = save_checkpoint(tmp_path / "bare", "llama", layers=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    out = tmp_path / "bare.pte"
    result = llm_export.export_llm(f"hf:{bare}", out, prefill_chunk=1, dtype="fp32", max_seq_len=8, verify_steps=2)
    v = result.verification
    assert v.ok and v.prompt_tokens == 0 and "no tokenizer.json or tokenizer.model" in v.prompt_source, v
    assert "from BOS alone: no tokenizer.json" in str(v) and result.path == out and out.is_file()
    tokens, source = verify.prompt_tokens("hf", folder_with_tokenizer(tmp_path), vocab=3, room=8)
    assert tokens == [] and "beyond the model's vocabulary of 3" in source, source


def folder_with_tokenizer(tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    train_tokenizer().save(str(d / "tokenizer.json"))
    return d


def test_truncated_llama_copy(tmp_path):
    ckpt, params, p = save_llama_checkpoint(tmp_path)
    (tmp_path / "t").mkdir()
    spec, tparams, old = truncated_copy("llama", ckpt, params, tmp_path / "t", 1)
    assert old == p["n_layers"] == 2 and spec == f"llama:{tmp_path / 't' / 'consolidated.pth'}"
    assert json.loads(tparams.read_text()) == p | {"n_layers": 1}
    kept = torch.load(tmp_path / "t" / "consolidated.pth")
    full = torch.load(ckpt)
    assert set(kept) == {k for k in full if not k.startswith("layers.1.")} and any(k.startswith("layers.0.") for k in kept)


def test_reference_widens_one_weight_at_a_time(folder, monkeypatch):
    """The self-check's eager reference keeps 16-bit weights 16-bit: a linear widens its weight a
    block of rows at a time, an embedding the rows it gathers, other modules (norms) their weight
    while they run. The logits are the float32 model's, bit for bit, and no whole weight is float32
    but the one module's that runs (an 8B head and embedding in float32 are 2 GiB each)."""
    from tests.llm_helpers import eager_model

    ids = torch.tensor([[0, 5, 9, 3, 7]])
    with torch.no_grad():
        want = eager_model(folder, torch.float16).float()(input_ids=ids).logits
        model = eager_model(folder, torch.float16)
        float32_on_use(model, min_numel=0)
        held = [m for m in model.modules() if m._parameters.get("weight") is not None]
        wide = []
        for m in held:  # registered after float32_on_use's: runs once a weight would be widened
            m.register_forward_pre_hook(lambda mod, args: wide.append([h for h in held if h.weight.dtype == torch.float32]))
        assert torch.equal(model(input_ids=ids).logits, want)
        kinds = {type(m) for m in held}
        assert torch.nn.Linear in kinds and torch.nn.Embedding in kinds and len(kinds) > 2, kinds
        assert len(wide) >= len(held) and all(
            len(w) <= 1 and all(type(h) not in (torch.nn.Linear, torch.nn.Embedding) for h in w) for w in wide
        ), wide
        assert {m.weight.dtype for m in held} == {torch.float16}
        # a linear's weight widened in blocks of rows (two rows a block here): the same logits, up to
        # float32 rounding (BLAS blocks the products of a narrower matrix differently)
        monkeypatch.setattr(verify, "ON_USE_CHUNK_BYTES", 2 * 4 * model.lm_head.weight.shape[1])
        torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=1e-6, atol=1e-6)


def test_help_states_the_tolerances(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for dtype, tol in TOLERANCE.items():
        assert f"{tol:g} ({dtype})" in text
    assert f"{INT4_TOLERANCE:g} with int4" in text and "--no-verify" in text


@pytest.mark.parametrize(("scheme", "group"), [("int4", 128), ("int8", 64)])
def test_cli_group_size_and_quantized_embedding(tmp_path, scheme, group, capsys, monkeypatch):
    """#24: `--quantize int4|int8 --group-size G --quantize-embedding`: every linear stored at its width
    with one float16 scale and one float16 offset per G columns (#43), the output head int8 in
    symmetric groups of 32 (#43: --quantize-head's default), the embedding table int8 with one scale
    per row, gathered (two MPSEmbedding lookups: the int8 row and its scale) and dequantized after the
    gather, never the whole table; the export verifies itself against eager quantized alike."""
    import collections

    from mps_backend.serialization import read_blob
    from mps_backend.serialization.pte import delegate_blobs
    from tests.llm_helpers import eager_model

    shape = {"vocab_size": 256, "hidden_size": 128, "intermediate_size": 256}
    folder = save_checkpoint(tmp_path / "q", "qwen2", tokenizer=train_tokenizer(), config=shape)
    out = tmp_path / "q.pte"
    args = ["export", "--model", f"hf:{folder}", "--max-seq-len", "16", "-o", str(out), "--verify-steps", "2"]
    monkeypatch.setattr(verify, "ON_USE_NUMEL", 0)  # the reference holds every weight in float16, as at LLM scale
    assert main([*args, "--quantize", scheme, "--group-size", str(group), "--quantize-embedding"]) == 0
    stdout = capsys.readouterr().out
    assert "int8 embedding (a scale per row)" in stdout and "greedy tokens agree 2/2: ok" in stdout, stdout
    graph = read_blob(delegate_blobs(out.read_bytes())[0].blob).graph
    stored: collections.Counter = collections.Counter()
    for c in graph.constant_ids:
        stored[graph.values[c].datatype.name] += graph.values[c].constant_buffer_size
    model = eager_model(folder, torch.float32)
    head = model.lm_head.weight
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.lm_head]
    n_linear = sum(w.numel() for w in linears)
    table = model.model.embed_tokens.weight
    assert table is not head  # qwen2: untied
    n_other = sum(p.numel() for p in model.parameters()) - n_linear - table.numel() - head.numel()
    ops = collections.Counter(n.op for n in graph.nodes)
    assert ops["MPSEmbedding"] == 2
    width = {"int4": 0.5, "int8": 1}[scheme]
    int8 = table.numel() + head.numel() + (n_linear if scheme == "int8" else 0)
    assert stored["int8"] == int8, stored
    if scheme == "int4":
        assert stored["int4"] == n_linear * width and ops["MPSDequantizePerChannelGroup"] == len(linears)
    # float16: norms, biases, one scale per row of the table, a scale and an offset per G columns of each
    # linear, a scale per 32 columns of the head, and RoPE's cos/sin tables (16 positions each, computed
    # in float32 at export)
    scales = table.shape[0] + 2 * n_linear // group + head.numel() // 32
    rope = 2 * 16 * (model.config.hidden_size // model.config.num_attention_heads)
    n = n_other + scales + rope
    assert n * 2 <= stored["float16"] <= n * 2 + 64, (stored, n_other, scales, rope)


@pytest.mark.parametrize("arch", ["gemma2", "phi3"])
def test_generate_and_runner_metadata(tmp_path, arch, capsys):
    """#24 item 6 on a sample of tests/llm_helpers.py's ARCHS (llama: tests/llm/test_export.py): the runner's
    metadata (BOS, an EOS list, vocab) and `mps-backend generate --bos` printing the prompt and the
    eager greedy continuation, stopped at the first EOS id of the list."""
    from mps_backend.runtime import constant_method_values
    from tests.llm_helpers import eager_greedy

    tok = train_tokenizer()
    folder = save_checkpoint(tmp_path / arch, arch, tokenizer=tok)
    prompt = "the quick brown fox"
    ids = [0, *tok.encode(prompt).ids]
    greedy = eager_greedy(folder, ids, 12)
    eos = [1, greedy[5]]  # a token the model does emit: generation must stop there
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(gen | {"eos_token_id": eos}))
    out = tmp_path / "m.pte"
    assert _export(folder, out, "--verify-steps", "2") == 0
    meta = constant_method_values(out)
    assert meta["get_eos_ids"] == eos and meta["get_bos_id"] == 0 and meta["get_vocab_size"] == tok.get_vocab_size()
    capsys.readouterr()
    assert main(["generate", str(out), "--tokenizer", str(folder), "--prompt", prompt, "--max-new-tokens", "12", "--bos"]) == 0
    stop = next(i for i, t in enumerate(greedy) if t in eos)
    captured = capsys.readouterr()
    assert captured.out.rstrip("\n") == prompt + tok.decode(greedy[: stop + 1], skip_special_tokens=False)
    assert f"{stop + 1} generated (EOS)" in captured.err
    if arch == "phi3":  # #26: a prompt beyond max_seq_len is one line with either runner (executorch's: a traceback)
        long = " ".join([prompt] * 200)
        for runner in ("python", "executorch"):
            assert main(["generate", str(out), "--tokenizer", str(folder), "--prompt", long, "--runner", runner]) == 2
            err = capsys.readouterr().err
            assert "does not fit max_seq_len" in err and "Traceback" not in err, err


def test_quantized_export_prints_the_price_of_its_quantization(tmp_path, folder, capsys, monkeypatch):
    """#43 item 6: a --quantize export's self-check also compares the quantized eager model with the float
    one on its tokens (top-1 agreement over every position, perplexity ratio): the figures printed are
    those of the two eager models, recomputed here; an unquantized export prints no such line."""
    from mps_backend.llm.quality import perplexity
    from mps_backend.quantize import quantize_dequantized

    seen = []
    real = verify._pte_logits

    def recording(*args, **kwargs):
        got = real(*args, **kwargs)
        seen.append(got[0])  # every token read or chosen
        return got

    monkeypatch.setattr(verify, "_pte_logits", recording)
    assert _export(folder, tmp_path / "q.pte", "--quantize", "int4", "--verify-steps", "3") == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "the quantization's price" in x)
    tokens = seen[-1]
    ids = tokens[:-1]
    with torch.no_grad():
        floating = eager_model(folder, torch.float32)(input_ids=torch.tensor([ids])).logits[0]
        quantized = quantize_dequantized(eager_model(folder, torch.float32), "int4", 32)(input_ids=torch.tensor([ids])).logits[0]
    agree = int((floating.argmax(-1) == quantized.argmax(-1)).sum())
    ppl_q, ppl_f = perplexity(quantized, tokens), perplexity(floating, tokens)
    assert f"top tokens agree {agree}/{len(ids)}, perplexity {ppl_q:.4g} vs {ppl_f:.4g} = {ppl_q / ppl_f:.4f}x" in line, (
        line,
        agree,
        ppl_q,
        ppl_f,
    )
    assert ppl_q != ppl_f  # the quantized model is not the float one
    assert _export(folder, tmp_path / "f.pte", "--verify-steps", "2") == 0
    assert "the quantization's price" not in capsys.readouterr().out
