"""Model families behind a registry (#44 item 1): every registration names a module whose ``FAMILY`` is a
:class:`~mps_backend.llm.family.Family` of that name, the export loop names no family, and a family added as
one module and one registration is exported by the loop as it is (docs/adding-models.md)."""

from __future__ import annotations

import ast
import importlib
import inspect

from mps_backend.llm import export as llm_export
from mps_backend.llm import registry
from mps_backend.llm.causal import CausalLM
from mps_backend.llm.family import Family
from mps_backend.llm.spec import parse_model_spec
from mps_backend.runtime import constant_method_values
from tests.llm_helpers import save_checkpoint


def test_every_registration_names_its_family():
    names = [reg.name for reg in registry.FAMILIES]
    assert names == ["speech", "vision-language", "llama", "causal-lm"]
    for reg in registry.FAMILIES:
        family = importlib.import_module(reg.module).FAMILY
        assert isinstance(family, Family) and family.name == reg.name, reg
    typed = [t for reg in registry.FAMILIES for t in reg.model_types]
    assert len(typed) == len(set(typed)), typed  # no model type in two families
    # every kind has a fallback, last: the causal LMs take every hf:/gguf: model type no family before them takes
    assert registry.registration("hf", "qwen3").name == "causal-lm" and registry.registration("gguf", None).name == "causal-lm"
    assert registry.registration("hf", "whisper").name == "speech" and registry.registration("llama", "llama").name == "llama"
    assert registry.registration("hf", "smolvlm").name == "vision-language"


def test_the_export_loop_names_no_family():
    """The loop asks the family for everything: no model type, family module or family class in its code."""
    tree = ast.parse(inspect.getsource(llm_export))
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    doc = ast.get_docstring(tree)
    typed = {t for reg in registry.FAMILIES for t in reg.model_types}
    assert not (strings - {doc}) & typed, (strings - {doc}) & typed
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {reg.module for reg in registry.FAMILIES}, imported


class _Tagged(CausalLM):
    """A family of this test: the causal LMs' program with one more constant method."""

    name = "tagged"

    def metadata(self, lm, max_seq_len, rows):
        return {**super().metadata(lm, max_seq_len, rows), "get_family_tag": 44}


FAMILY = _Tagged()


def test_a_family_is_one_module_and_one_registration(tmp_path, tokenizer, monkeypatch):
    folder = save_checkpoint(tmp_path / "qwen3", "qwen3", tokenizer=tokenizer, layers=1)
    tagged = registry.Registration("tagged", __name__, ("hf",), ("qwen3",), "MODEL_FOR_CAUSAL_LM_MAPPING")
    monkeypatch.setattr(registry, "FAMILIES", (tagged, *registry.FAMILIES))
    assert llm_export.family_for(parse_model_spec(f"hf:{folder}")) is FAMILY
    result = llm_export.export_llm(f"hf:{folder}", tmp_path / "m.pte", prefill_chunk=1, dtype="fp32", max_seq_len=16)
    assert result.family == "tagged" and constant_method_values(result.path)["get_family_tag"] == 44


def test_the_tested_model_types_are_those_the_tests_export():
    """The note on an untested model type names the types the tests export (it listed 11 of about 45)."""
    import transformers

    from tests.llm.test_decoder import TABLE
    from tests.llm.test_prefill import CASES
    from tests.llm_helpers import ARCHS

    def model_type(arch: str) -> str:  # tests/llm_helpers.py's names for the config classes they use
        return getattr(transformers, ARCHS[arch][0]).model_type if arch in ARCHS else arch

    exported = {model_type(a) for a in ARCHS} | {row[0] for row in TABLE.values() if row[3] is None}
    exported |= {model_type(c[0]) for c in CASES.values() if c[0] != "llama:"}
    exported |= set(registry.VISION_LANGUAGE_TYPES) | set(registry.ENCODER_DECODER_TYPES)
    assert set(registry.TESTED_MODEL_TYPES) == exported, set(registry.TESTED_MODEL_TYPES) ^ exported
