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
from mps_backend.llm.verify import BUDGET_ENV, INT4_TOLERANCE, TOLERANCE, truncated_copy
from mps_backend.tools.cli import main
from tests.llm_helpers import save_checkpoint, save_llama_checkpoint, train_tokenizer


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
    return main(["export", "--model", f"hf:{folder}", "--dtype", "fp32", "--max-seq-len", "16", "-o", str(out), *extra])


def test_export_verifies_itself_and_fails_on_a_wrong_program(tmp_path, folder, capsys, monkeypatch):
    assert _export(folder, tmp_path / "ok.pte") == 0
    out = capsys.readouterr().out
    assert "4 decode steps on the emulated runtime vs eager transformers float32" in out
    assert "greedy tokens agree 4/4: ok" in out and "(tolerance 1e-05)" in out
    # a program that computes 1% off: exit 1, the gap printed (tokens still agree: argmax is scale-free)
    real = llm_export.decoder_for
    monkeypatch.setattr(llm_export, "decoder_for", lambda lm, n: _OnePercentOff(real(lm, n)))
    assert _export(folder, tmp_path / "bad.pte", "--verify-steps", "2") == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "max |logit diff|" in x)
    rel = float(line.split(" = ")[1].split(" of")[0])
    assert 0.009 < rel < 0.011 and "FAILED" in line and "greedy tokens agree 2/2" in line, line
    assert (tmp_path / "bad.pte").is_file()  # written: the check runs the file the user gets
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


def test_truncated_llama_copy(tmp_path):
    ckpt, params, p = save_llama_checkpoint(tmp_path)
    (tmp_path / "t").mkdir()
    spec, tparams, old = truncated_copy("llama", ckpt, params, tmp_path / "t", 1)
    assert old == p["n_layers"] == 2 and spec == f"llama:{tmp_path / 't' / 'consolidated.pth'}"
    assert json.loads(tparams.read_text()) == p | {"n_layers": 1}
    kept = torch.load(tmp_path / "t" / "consolidated.pth")
    full = torch.load(ckpt)
    assert set(kept) == {k for k in full if not k.startswith("layers.1.")} and any(k.startswith("layers.0.") for k in kept)


def test_help_states_the_tolerances(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for dtype, tol in TOLERANCE.items():
        assert f"{tol:g} ({dtype})" in text
    assert f"{INT4_TOLERANCE:g} with int4" in text and "--no-verify" in text
