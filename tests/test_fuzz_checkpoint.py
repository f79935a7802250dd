"""Fuzzing ``hf:`` checkpoint folders through the export's load-and-check step (harness.fuzz_checkpoint):
only a clean load or a typed one-line error of the project; an untyped exception, a worker that dies or
hangs fails. The 10,000-case run is recorded in docs/measurements.toml; CI keeps a seeded campaign and
the cases the fuzzer found."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from harness.fuzz_checkpoint import _Loaded, _save, campaign, run_case


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzzbase") / "llama"
    _save(folder, "LlamaConfig", torch.float16, None)
    return folder


def _edit_json(path, **values):
    obj = json.loads(path.read_text())
    obj.update(values)
    path.write_text(json.dumps(obj))


def _edit_header(path, name, **entry):
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header[name].update(entry)
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n :])


# what the first 200-case campaign found: each was an untyped exception (a traceback out of `export`)
FOUND = [
    ("config.json", {"model_type": ["llama"]}, "transformers could not read it: TypeError"),  # unhashable
    ("config.json", {"model_type": "no-such-model"}, "transformers could not read it: ValueError"),
    ("config.json", {"hidden_act": [1, 2]}, "StrictDataclassFieldValidationError: Validation error for field 'hidden_act'"),
    ("config.json", {"rope_parameters": "x"}, "field 'rope_parameters'"),
    ("config.json", {"tie_word_embeddings": 2}, "field 'tie_word_embeddings'"),
    ("config.json", {"pad_token_id": "bfloat16"}, "field 'pad_token_id'"),
    ("generation_config.json", {"bos_token_id": {"a": 1}}, "bos_token_id {'a': 1} is not a token id"),
    ("generation_config.json", {"eos_token_id": "bfloat16"}, "eos_token_id bfloat16 is not a token id"),
    ("generation_config.json", {"eos_token_id": [1, float("nan")]}, "eos_token_id [1, nan] is not a token id"),
    ("generation_config.json", {"bos_token_id": 32}, "not a token id (an integer in [0, 32))"),
    ("generation_config.json", {"bos_token_id": True}, "not a token id"),
    ("header", {"dtype": ["F16"]}, "unknown dtype \"['F16']\""),  # unhashable in the folder check
]


def test_found_cases_are_typed_one_line_errors(base, tmp_path, monkeypatch):
    import mps_backend.llm.export as llm_export
    from mps_backend.errors import CheckpointError
    from mps_backend.llm.checkpoint import load_hf

    def stop(*_args, **_kwargs):
        raise _Loaded

    monkeypatch.setattr(llm_export, "program_methods", stop)
    assert run_case(base, "fp16") == "ok"  # the base loads: each case below fails by its one change
    for i, (file, values, message) in enumerate(FOUND):
        folder = tmp_path / f"c{i}"
        shutil.copytree(base, folder)
        if file == "header":
            _edit_header(folder / "model.safetensors", "model.embed_tokens.weight", **values)
        else:
            _edit_json(folder / file, **values)
        assert run_case(folder, "fp32").startswith("typed "), (file, values)
        with pytest.raises(CheckpointError) as e:
            load_hf(folder, torch.float32)
        assert message in str(e.value) and "\n" not in str(e.value), (file, values, str(e.value))


@pytest.mark.long
def test_seeded_campaign(tmp_path):
    report = campaign(200, seed=3, crash_dir=tmp_path)
    assert report["failures"] == [], report["failures"]
    counts = report["counts"]
    # not vacuous: refused by the folder check, by the loader or transformers, and loaded cleanly
    assert counts.get("typed FolderError", 0) > 60 and counts.get("typed CheckpointError", 0) > 5, counts
    assert counts.get("ok", 0) > 15, counts
    kinds = set(report["mutations"])  # the hostile kinds of #38 ran (a CODE RAN case would be a failure above)
    assert {"auto_map", "implementation", "quantization block"} <= kinds, kinds
    assert any(k.startswith("retype") for k in kinds) and any(k.startswith("extra shard") for k in kinds), kinds
    assert any(k.startswith(("declared", "missing layer")) for k in kinds), kinds


#: (kind, the outcomes a seeded campaign of it must include, mutation names that must have run): #47's inputs
INPUT_KINDS = {
    "gguf": ({"typed GGUFError", "ok"}, ("metadata", "tensor", "truncated", "count field")),
    "templates": ({"typed ChatTemplateError", "ok"}, ("fragment", "template")),
    "processors": ({"typed ImageBoundError", "ok"}, ("processor size", "processor crop_size")),
    "images": ({"typed ImageBoundError", "ok"}, ("declares", "truncated")),
    "audio": (
        {"typed ValueError", "ok"},
        ("WAV rate", "WAV tag", " size ", "WAV extra", "WAV samples", "WAV truncated", "not a WAV"),
    ),
}


@pytest.mark.long
@pytest.mark.parametrize("kind", list(INPUT_KINDS))
def test_seeded_input_campaign(tmp_path, kind):
    """A seeded campaign of each input kind of #47 (GGUF files, chat templates, processor configs, images, WAV files):
    only clean runs and one-line typed errors; refusals, clean runs and the named mutations all happened."""
    outcomes, mutations = INPUT_KINDS[kind]
    report = campaign(48, seed=5, crash_dir=tmp_path, kind=kind)
    assert report["failures"] == [], report["failures"]
    assert outcomes <= set(report["counts"]), report["counts"]
    ran = " ".join(report["mutations"])
    assert all(m in ran for m in mutations), report["mutations"]


def test_audio_case_bounds_the_result(tmp_path):
    """The audio kind's case fails a result out of bounds, not only an exception: the float WAV ``make
    fuzz-checkpoint --kind audio`` found (a sample of 1e20, whose features were infinite) is a one-line
    ``ValueError`` now; a clean WAV is 'ok'."""
    import numpy as np

    from harness.fuzz_inputs import run_input_case, wav_chunks, wav_file

    wave = (0.1 * np.sin(np.arange(48000) / 10.0)).astype("<f4")
    path = tmp_path / "a.wav"
    path.write_bytes(wav_file(wav_chunks(rate=48000, channels=1, bits=32, tag=3, data=wave.tobytes())))
    assert run_input_case("audio", path, {}, _Loaded) == "ok"
    wave[1000] = 1e20
    path.write_bytes(wav_file(wav_chunks(rate=48000, channels=1, bits=32, tag=3, data=wave.tobytes())))
    assert run_input_case("audio", path, {}, _Loaded) == "typed ValueError"
