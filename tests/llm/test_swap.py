"""Every replacement the export makes of transformers' or executorch's code is scoped and undone (#44 item 5):
a method's module is built from the model as loaded, whatever was built before it, and an export leaves
nothing of itself in the process.

- building every method of each family (a causal LM with a chunk: the head's pre-hook, rotary tables,
  grouped attention; one with latent attention: ``expand_kv``; executorch's llama: ``kv_cache`` and
  ``SDPA``; a vision-language model; Whisper) changes the model, and undoing the method's
  :class:`~mps_backend.llm.swap.Replacements` gives it back as loaded, transformers' attention registry
  included;
- three families exported in one process, in two orders, give ``.pte`` files byte-identical to each
  exported in a fresh process.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

from mps_backend.llm import export as llm_export
from mps_backend.llm.options import ExportOptions
from mps_backend.llm.spec import parse_model_spec
from mps_backend.llm.swap import Replacements
from mps_backend.precision import Precision
from tests.llm_helpers import MLA, save_checkpoint, save_llama_checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _state(model: torch.nn.Module) -> tuple:
    """What a replacement could leave behind: every submodule's class, its hooks, the callables set on it
    (an ``expand_kv``), every config's attention implementation, transformers' attention registry."""
    from transformers import AttentionInterface

    from mps_backend.llm.swap import _configs

    modules = [
        (
            name,
            type(m).__name__,
            len(m._forward_pre_hooks),
            len(m._forward_hooks),
            sorted(k for k, v in vars(m).items() if callable(v) and not k.startswith("_")),
        )
        for name, m in model.named_modules()
    ]
    configs = [getattr(c, "_attn_implementation_internal", None) for c in _configs(model)]
    return modules, configs, sorted(AttentionInterface._global_mapping)


def _built_and_undone(spec: str, max_seq_len: int, chunk: int | None = None, params=None) -> None:
    options = ExportOptions(precision=Precision.FP32, max_seq_len=max_seq_len, prefill_chunk=chunk, params=params)
    family = llm_export.family_for(parse_model_spec(spec))
    lm = family.load(parse_model_spec(spec), options)
    before = _state(lm.model)
    for method in family.methods(lm, max_seq_len, family.rows(lm, options, max_seq_len)):
        name = method.name
        with Replacements() as changes:
            method.build(changes)
            assert len(changes) > 0 or name in ("vision_encoder", "token_embedding", "encoder"), name
            if len(changes):  # the test can fail: the model is changed while the method is built
                assert _state(lm.model) != before, name
        assert _state(lm.model) == before, f"{spec}: {name} left its replacements behind"


def test_building_a_method_changes_the_model_and_undoing_gives_it_back(tmp_path, tokenizer):
    from tests.vlm_helpers import save_vlm
    from tests.whisper_helpers import save_whisper

    causal = save_checkpoint(tmp_path / "qwen3", "qwen3", tokenizer=tokenizer, layers=1)
    _built_and_undone(f"hf:{causal}", 16, chunk=4)  # the head's pre-hook, rotary tables, grouped attention
    latent = save_checkpoint(tmp_path / "mla", "minicpm3", tokenizer=tokenizer, layers=1, config=MLA)
    _built_and_undone(f"hf:{latent}", 16)  # expand_kv and the absorbed latent attention
    ckpt, params, _ = save_llama_checkpoint(tmp_path)
    _built_and_undone(f"llama:{ckpt}", 16, params=str(params))  # executorch llama's kv_cache and SDPA
    _built_and_undone(f"hf:{save_vlm(tmp_path / 'smolvlm', 'smolvlm')}", 48)
    _built_and_undone(f"hf:{save_whisper(tmp_path / 'whisper', tokenizer)}", 16)


#: a child process exporting the given (name, spec, max_seq_len) in order, printing {name: sha256}
_CHILD = """
import hashlib, json, pathlib, sys
from mps_backend.llm import export_llm
out = {}
for name, spec, seq in json.loads(sys.argv[1]):
    path = pathlib.Path(sys.argv[2]) / f"{name}-{len(out)}.pte"
    export_llm(spec, path, dtype="fp32", max_seq_len=seq)
    out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
print("HASHES " + json.dumps(out))
"""


def _exported(cases: list, where: pathlib.Path) -> dict[str, str]:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(cases), str(where)], capture_output=True, text=True, cwd=ROOT, timeout=1800
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("HASHES ")), None)
    assert line is not None, done.stderr[-3000:]
    return json.loads(line[len("HASHES ") :])


@pytest.mark.long
def test_three_families_in_one_process_in_either_order_equal_fresh_processes(tmp_path, tokenizer):
    from tests.vlm_helpers import save_vlm
    from tests.whisper_helpers import save_whisper

    cases = [
        ("causal", f"hf:{save_checkpoint(tmp_path / 'qwen3', 'qwen3', tokenizer=tokenizer, layers=1)}", 16),
        ("vision", f"hf:{save_vlm(tmp_path / 'smolvlm', 'smolvlm')}", 48),
        ("speech", f"hf:{save_whisper(tmp_path / 'whisper', tokenizer)}", 16),
    ]
    forward = _exported(cases, tmp_path / "forward")  # causal first: as in a fresh process
    backward = _exported(cases[::-1], tmp_path / "backward")  # speech first: as in a fresh process
    fresh = {"causal": forward["causal"], "speech": backward["speech"], **_exported(cases[1:2], tmp_path / "fresh")}
    assert forward == backward == fresh
    assert len(set(fresh.values())) == 3  # three different programs
