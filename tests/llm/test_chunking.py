"""The prompt chunk chosen for the user's device (issue #46 item 1, :mod:`mps_backend.llm.chunking`).

The chooser's estimate of a call's bytes and FLOPs is held to ``mps-backend cost`` of exported programs (a
dense decoder, int4, a mixture of experts, at chunks across grouped_attention's two forms); the choice obeys its
rule on every device (the smallest chunk meeting both targets for a named device, the best worst case for
``any``); an export without ``--prefill-chunk`` writes the chosen chunk's program, says so, and its prompts and
decode steps equal eager; ``--device`` is checked before anything is read; docs/llm.md's table is the chooser's.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from mps_backend.cost import DEVICES, cost_of_program
from mps_backend.errors import CheckpointError
from mps_backend.llm import export_llm
from mps_backend.llm.chunking import (
    ANY,
    CANDIDATES,
    DEVICE_CHOICES,
    choose,
    device_named,
    device_slug,
    estimate,
    model_shape,
)
from mps_backend.quantize import Quantization
from mps_backend.runtime import constant_method_values
from tests.llm_helpers import eager_greedy, eager_model, save_checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16}
#: hybrid models with their published head sizes (128-column key and value heads; Mamba-2 heads of 64, a state of
#: 128) at a width of 256: one recurrent layer and one attention layer
WIDE = {"hidden_size": 256, "intermediate_size": 768}
GATED_DELTA = WIDE | {
    "layer_types": ["linear_attention", "full_attention"],
    "head_dim": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
}
MAMBA2 = WIDE | {
    "layer_types": ["mamba", "attention"],
    "num_local_experts": 0,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "mamba_n_heads": 8,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
}


@pytest.mark.parametrize(
    "arch,config,quantize",
    [
        ("llama", {}, None),
        ("llama", {"intermediate_size": 512}, "int4"),
        ("qwen3_moe", MOE, None),
        ("qwen3_5_text", GATED_DELTA, None),
        ("granitemoehybrid", MAMBA2, None),
    ],
    ids=["llama-fp16", "llama-int4", "qwen3_moe-fp16", "qwen3_5-gated-delta-fp16", "granite4-mamba2-fp16"],
)
def test_the_estimate_holds_to_the_cost_model(tmp_path, tokenizer, arch, config, quantize):
    """A call's bytes within 10 % and FLOPs within 5 % of the cost model's of the exported program, at a
    chunk of 1 (masked scores joined) and 16 (the new keys joined to the cache's); for a hybrid model, its
    recurrent layer's scan too (the one-row update, the chunked scan over 16 rows): without it, the estimate
    was 0.54x-0.66x of these programs' bytes (0.55x and 0.54x at chunk 16) and 0.89x-0.93x of their FLOPs at
    chunk 16."""
    folder = save_checkpoint(tmp_path / "ckpt", arch, tokenizer=tokenizer, config=config, dtype=torch.float16)
    q = Quantization(quantize) if quantize else None
    shape = model_shape(eager_model(folder, torch.float16), cache=128, layers=2, element_bytes=2, quantization=q)
    for chunk in (1, 16):
        result = export_llm(f"hf:{folder}", tmp_path / f"c{chunk}.pte", max_seq_len=128, prefill_chunk=chunk, quantize=quantize)
        cost = cost_of_program(result.path)
        assert shape.call_bytes(chunk) == pytest.approx(cost.fused.total, rel=0.10), chunk
        assert shape.call_flops(chunk) == pytest.approx(cost.flops, rel=0.05), chunk


def _shape_1b(quantization=None):
    import transformers

    from scripts.chunk_table import SHAPES

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPES["Llama-3.2-1B"]))
    return model_shape(model, cache=2048, layers=16, element_bytes=2, quantization=quantization)


@pytest.mark.parametrize("quantization", [None, Quantization("int4")], ids=["fp16", "int4"])
def test_the_choice_follows_its_rule(quantization):
    """For each device: the smallest candidate meeting both targets (every smaller one misses one), and it
    meets both at the 1B shape; for ``any``: no candidate has a better worst case over the table."""
    shape = _shape_1b(quantization)
    met = 0
    for device in DEVICES:
        choice = choose(shape, device_slug(device.name))
        assert choice.device == device.name and len(choice.estimates) == 1
        misses = {c: estimate(shape, c, device).miss for c in CANDIDATES}
        if choice.meets:
            assert choice.worst.ttft_ratio <= 3 and choice.worst.decode_share <= 0.5
            assert all(misses[c] > 1 for c in CANDIDATES if c < choice.chunk), device.name
        else:  # no chunk meets both: the one missing by the least
            assert min(misses.values()) > 1 and misses[choice.chunk] == min(misses.values()), device.name
        met += choice.meets
    # float16 at the 1B shape: every device has a chunk meeting both; int4 (a quarter of the bytes a call) most
    assert met == len(DEVICES) if quantization is None else met >= len(DEVICES) // 2, met
    best = choose(shape, ANY)
    worst = max(estimate(shape, best.chunk, d).miss for d in DEVICES)
    assert len(best.estimates) == len(DEVICES) and best.worst.miss == pytest.approx(worst)
    for c in CANDIDATES:
        assert max(estimate(shape, c, d).miss for d in DEVICES) >= worst, c
    # the one-row step: prompts 27x and more above their floor at this shape (why the default is a chunk)
    assert min(estimate(shape, 1, d).ttft_ratio for d in DEVICES) > 8


def test_device_names():
    assert device_slug("M3 Pro") == device_slug("m3_pro") == "m3-pro" and "a17-pro" in DEVICE_CHOICES
    assert device_named("any") is None and device_named("M2").name == "M2"
    with pytest.raises(ValueError, match="unknown device 'm9'.*m3-pro"):
        device_named("m9")
    with pytest.raises(CheckpointError, match="--device: unknown device"):
        export_llm("hf:/nonexistent", "/tmp/never.pte", device="m9")


def test_an_export_without_a_chunk_takes_the_chosen_one(tmp_path, tokenizer):
    """No ``prefill_chunk``: the program has the chunk chosen for the device (its metadata what executorch's
    runner reads for a chunked prefill), the summary says which and why, and greedy tokens after a prompt of
    several calls equal eager transformers'; a given chunk is taken as given."""
    from mps_backend.llm import generate_ids

    folder = save_checkpoint(tmp_path / "ckpt", "llama", tokenizer=tokenizer)
    shape = model_shape(eager_model(folder, torch.float32), cache=40, layers=2, element_bytes=4)
    result = export_llm(f"hf:{folder}", tmp_path / "m.pte", dtype="fp32", max_seq_len=40, device="m2", verify_steps=2)
    assert result.verification.ok and result.verification.steps == 2, result.summary()  # the self-check, in calls of C
    want = choose(shape, "m2").chunk
    assert result.prefill_chunk == want == result.chunk_choice.chunk > 1
    meta = constant_method_values(result.path)
    assert meta["get_max_seq_len"] == want and meta["get_max_context_len"] == 40 and meta["enable_dynamic_shape"]
    assert f"prompt chunk {want} rows a call, chosen for M2" in result.summary()
    prompt = [0, *range(5, 5 + want + 2)]  # two calls (a tiny model's chunk: 32, the largest candidate it holds)
    got = generate_ids(result.path, prompt, 4)  # ends at EOS, as the runner does
    assert got and got == eager_greedy(folder, prompt, 4)[: len(got)]
    given = export_llm(f"hf:{folder}", tmp_path / "g.pte", dtype="fp32", max_seq_len=40, prefill_chunk=2, device="m2")
    assert given.prefill_chunk == 2 and given.chunk_choice is None and "prompt chunk" not in given.summary()
    assert "--device m2: not used: --prefill-chunk gave them (2 rows a call)" in given.summary()


def test_cli_device(tmp_path, tokenizer, capsys):
    from mps_backend.tools.cli import main

    folder = save_checkpoint(tmp_path / "ckpt", "llama", tokenizer=tokenizer)
    out = tmp_path / "m.pte"
    argv = ["export", "--model", f"hf:{folder}", "-o", str(out), "--max-seq-len", "24", "--no-verify", "--fp32"]
    assert main([*argv, "--device", "A17 Pro"]) == 0
    assert "chosen for A17 Pro" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main([*argv, "--device", "m9"])
    assert e.value.code == 2 and "invalid choice: 'm9'" in capsys.readouterr().err


def test_docs_table_is_the_choosers():
    from scripts.chunk_table import table

    assert table() in (ROOT / "docs" / "llm.md").read_text()


def _every_text_model_type():
    """(id, model type, config overrides, layers) of every text decoder the LLM tests export: the decoder table's
    (refusals too: their model is loaded before the export refuses it), the families of test_export, and the
    recurrent and hybrid configs of test_prefill."""
    from tests.llm import test_decoder, test_prefill
    from tests.llm_helpers import ARCHS

    rows = {case: (mt, cfg, layers) for case, (mt, cfg, layers, _) in test_decoder.TABLE.items()}
    prefill = test_prefill.CASES.items()
    rows |= {f"prefill-{case}": (mt, cfg, layers) for case, (mt, cfg, layers, _, _) in prefill if mt != "llama:"}
    rows |= {arch: (arch, {}, 2) for arch in ARCHS}
    rows["gpt2"] = ("gpt2", {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 256}, 2)  # Conv1D, not nn.Linear
    return sorted(rows.items())


def test_every_model_type_gets_a_chunk():
    """The chooser reads every architecture the exports take (on the meta device: no weights): the matmul
    weights it finds are every 2-d weight but the embedding tables' (an MoE's stacked experts too), its attention
    shape is the config's, and it chooses a chunk the cache holds. A model it could not read would fail the
    default export (the chunk is chosen before the export)."""
    import transformers

    from tests.llm_helpers import tiny_config

    for case, (model_type, overrides, layers) in _every_text_model_type():
        config = tiny_config(model_type, 96, layers=layers, config=overrides)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        shape = model_shape(model, cache=64, layers=layers, element_bytes=2)
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - {
            id(getattr(model.get_output_embeddings(), "weight", None))
        }
        matmul = sum(p.numel() for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings and p.dim() < 4)
        assert 0.9 * matmul <= shape.weight_params <= matmul, (case, shape.weight_params, matmul)
        assert shape.heads >= 1 and shape.kv_heads >= 1 and shape.head_dim >= 1 and 1 <= shape.attention_layers <= layers, case
        assert shape.call_bytes(1) > 0 and shape.call_flops(1) > 0, case
        assert choose(shape).chunk in CANDIDATES and choose(shape).chunk <= 64, case


def test_a_llama_checkpoint_takes_the_chosen_chunk(tmp_path):
    """``llama:`` (executorch's example llama, its ModelArgs rather than a transformers config): the default
    export reads its shape, takes the chosen chunk, and its greedy tokens after a prompt of two calls are those
    of the one-token program of the same checkpoint."""
    from mps_backend.llm import generate_ids
    from tests.llm_helpers import save_llama_checkpoint

    ckpt, params, _ = save_llama_checkpoint(tmp_path)
    chosen = export_llm(f"llama:{ckpt}", tmp_path / "c.pte", dtype="fp32", max_seq_len=40, params=params, device="m3")
    one = export_llm(f"llama:{ckpt}", tmp_path / "1.pte", dtype="fp32", max_seq_len=40, params=params, prefill_chunk=1)
    shape = chosen.chunk_choice
    assert chosen.prefill_chunk == shape.chunk > 1 and shape.device == "M3" and one.prefill_chunk == 1
    prompt = [1, *range(5, 5 + chosen.prefill_chunk + 2)]
    assert generate_ids(chosen.path, prompt, 3) == generate_ids(one.path, prompt, 3)
