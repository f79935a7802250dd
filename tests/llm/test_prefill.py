"""Prompts prefilled in chunks (issue #36): ``forward(tokens [1, n], input_pos [1])``, ``1 <= n <= C``,
one static C-row MPS delegate per call (docs/llm.md, The program).

Per architecture (every family of tests/llm/test_export.py, NoPE layers, sliding windows shorter and longer
than the chunk, a mixture of experts, attention sinks, Falcon's eager attention, the ``llama:`` path;
tiny random checkpoints, float32): the logits after a prompt of every length 1 .. 2C+1 (cut into calls
of C tokens as executorch's ``TextPrefiller`` cuts them: chunk and call boundaries crossed) equal eager
transformers' within the self-check's float32 tolerance (1e-5 of their scale), and so do those of
decode steps after a longer prompt. Then: float16 within 1e-2; the last positions of the cache work
(a chunk ending there: its padding rows would fall past the cache if they were written) and a
position past it is an error of executorch's runtime, before the delegate runs; every node the
delegate does not take has a dynamic shape (the CPU's padding, positions and row slices) or is a
cache-row write; no symbolic size reaches the delegate; executorch's own C++ runner gives the text it
gives with the token-by-token program.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from mps_backend.llm import export_llm, generate_ids
from mps_backend.runtime import LoadedMethod, constant_method_values
from tests.llm_helpers import (
    GRANITE_HYBRID_CONFIG,
    LFM2_CONFIG,
    QWEN3_NEXT_CONFIG,
    eager_model,
    save_checkpoint,
    save_llama_checkpoint,
)

FP32_TOL, FP16_TOL = 1e-5, 1e-2  # the self-check's tolerances (mps_backend.llm.verify)
#: case -> (model type or "llama:", config overrides, layers, chunk, cache length). Chunks of 2 (every
#: length 1 .. 5 crosses chunk and call boundaries); sliding windows of 8, shorter than the decode
#: check's prompt; mistral's window of 3 is shorter than its chunk of 4 (cut inside a chunk).
CASES = {
    "llama": ("llama", {}, 2, 2, 24),
    "smollm": ("smollm", {}, 2, 2, 24),
    "qwen2": ("qwen2", {}, 2, 2, 24),
    "qwen3": ("qwen3", {}, 2, 2, 24),
    "mistral": ("mistral", {"sliding_window": 3}, 2, 4, 24),
    "phi3": ("phi3", {}, 2, 2, 24),
    "gemma2": ("gemma2", {}, 2, 2, 24),
    "gemma3": ("gemma3", {}, 2, 2, 24),
    "smollm3-nope": ("smollm3", {"no_rope_layers": [1, 0]}, 2, 2, 24),
    "cohere2-sliding-nope": ("cohere2", {"sliding_window": 8}, 2, 2, 24),
    "qwen3_moe": (
        "qwen3_moe",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16},
        1,
        2,
        24,
    ),
    "gpt_oss-sinks": (
        "gpt_oss",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16, "sliding_window": 8},
        2,
        2,
        24,
    ),
    "falcon-eager": ("falcon", {}, 1, 2, 24),
    # short convolutions (a state of the last 3 inputs, kept across chunks from the prompt rows only)
    "lfm2-conv": ("lfm2", LFM2_CONFIG, 2, 2, 24),
    "lfm2-conv-chunk4": ("lfm2", LFM2_CONFIG, 2, 4, 24),
    # linear attention (gated delta rule) and Mamba-2: a chunk's padding rows leave the state alone
    "qwen3_next-gated-delta": ("qwen3_next", QWEN3_NEXT_CONFIG, 2, 2, 24),
    "granitemoehybrid-mamba2": ("granitemoehybrid", GRANITE_HYBRID_CONFIG, 2, 4, 24),
    "llama-meta": ("llama:", {}, 2, 2, 24),
    # chunks of 8 rows (2 query heads a KV head of 16 columns): the new keys join the cache's before one matmul
    # (grouped_attention's other form, 2 bytes x 16 < 4 x 2 x 8), with soft-capping and a sliding window
    # shorter than the chunk (Gemma 2), attention sinks (gpt-oss), executorch's llama
    "llama-chunk8": ("llama", {}, 2, 8, 24),
    "gemma2-chunk8": ("gemma2", {"sliding_window": 3}, 2, 8, 24),
    "gpt_oss-sinks-chunk8": (
        "gpt_oss",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16, "sliding_window": 8},
        2,
        8,
        24,
    ),
    "llama-meta-chunk8": ("llama:", {}, 2, 8, 24),
}
#: cases whose modeling code computes a constant mask in uint8 (left on CPU, static)
UINT8_MASKS = {"qwen3_next-gated-delta"}
LONG = 16  # the decode check: a prompt of 10 tokens (5 calls of 2), then 5 decode steps


def _export(tmp_path: pathlib.Path, case: str, dtype: str = "fp32", tokenizer=None, chunk: int | None = None):
    model_type, overrides, layers, case_chunk, cache = CASES[case]
    chunk = chunk or case_chunk
    if model_type == "llama:":
        ckpt, params, _ = save_llama_checkpoint(tmp_path)
        spec, kw = f"llama:{ckpt}", {"params": params}
        reference = _llama_reference(ckpt, params, cache)
    else:
        folder = save_checkpoint(tmp_path / "ckpt", model_type, layers=layers, config=overrides, tokenizer=tokenizer)
        spec, kw = f"hf:{folder}", {}
        model = eager_model(folder, torch.float32)

        def reference(ids: list[int]) -> torch.Tensor:
            with torch.no_grad():
                return model(input_ids=torch.tensor([ids])).logits[0].float()

    result = export_llm(spec, tmp_path / "m.pte", dtype=dtype, max_seq_len=cache, prefill_chunk=chunk, **kw)
    return result, reference, chunk, cache


def _llama_reference(ckpt, params, cache: int):
    """executorch's example llama in eager float32 over a whole sequence (its own causal mask)."""
    import json

    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    args = ModelArgs(**json.loads(pathlib.Path(params).read_text()), max_seq_len=cache, generate_full_logits=True)
    model = construct_transformer(args).eval()
    model.load_state_dict(torch.load(ckpt), strict=False)

    def reference(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).reshape(len(ids), -1).float()

    return reference


def _prefill(step: LoadedMethod, ids: list[int], chunk: int, start: int = 0) -> torch.Tensor:
    """The runner's prefill: pieces of up to ``chunk`` tokens, one call each; the last call's logits."""
    for p in range(0, len(ids), chunk):
        logits = step([torch.tensor([ids[p : p + chunk]]), torch.tensor([start + p])])[0]
    return logits.reshape(-1).float()


def _gap(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_prompt_length_equals_eager(tmp_path, tokenizer, case):
    result, reference, chunk, cache = _export(tmp_path, case, tokenizer=tokenizer)
    assert result.delegates == 1 and result.report.partitions == 1, result.summary()
    # besides the cache-row writes, only the chunk's dynamic-size work stays on CPU; transformers' gated delta
    # rule builds its block's triangular mask from uint8 ranges, which the device cannot hold: computed on the
    # CPU before the delegate (static, its 64-row block's constants)
    static = [n for n in result.report.cpu_static if not (case in UINT8_MASKS and "uint8" in n.reason)]
    assert not static, result.summary()
    assert (case in UINT8_MASKS) == bool(result.report.cpu_static), result.summary()
    kinds = {n.target.rsplit("::", 1)[-1] for n in result.report.cpu_dynamic}
    assert kinds <= {
        "sym_size.int",
        "sub",
        "arange.start_step",
        "add.Tensor",
        "index_select",
        "slice_copy.Tensor",
        "constant_pad_nd",
    }, kinds
    meta = constant_method_values(result.path)
    assert meta["get_max_seq_len"] == chunk and meta["get_max_context_len"] == cache
    assert meta["enable_dynamic_shape"] is True and meta["use_kv_cache"] is True
    vocab = int(meta["get_vocab_size"])
    ids = torch.randint(2, vocab, (max(2 * chunk + 1, LONG),), generator=torch.Generator().manual_seed(3)).tolist()
    ref = reference(ids)
    step = LoadedMethod(result.path, "forward")
    gaps = [_gap(_prefill(step, ids[:n], chunk), ref[n - 1]) for n in range(1, 2 * chunk + 2)]
    assert max(gaps) <= FP32_TOL, [f"{g:.2g}" for g in gaps]
    # decode after a prompt of LONG tokens: one token per call through the same method
    prompt, new = ids[: LONG - 6], ids[LONG - 6 : LONG]
    dev = [_prefill(step, prompt, chunk)]
    dev += [step([torch.tensor([[t]]), torch.tensor([len(prompt) + i])])[0].reshape(-1).float() for i, t in enumerate(new[:-1])]
    assert _gap(torch.stack(dev), ref[len(prompt) - 1 : LONG - 1]) <= FP32_TOL


@pytest.mark.parametrize("case", ["llama", "gemma3", "llama-chunk8"])
def test_fp16_chunks_within_the_self_check_tolerance(tmp_path, tokenizer, case):
    result, reference, chunk, _ = _export(tmp_path, case, "fp16", tokenizer=tokenizer)
    vocab = int(constant_method_values(result.path)["get_vocab_size"])
    ids = torch.randint(2, vocab, (2 * chunk + 1,), generator=torch.Generator().manual_seed(4)).tolist()
    ref = reference(ids)
    step = LoadedMethod(result.path, "forward")
    gaps = [_gap(_prefill(step, ids[:n], chunk), ref[n - 1]) for n in range(1, 2 * chunk + 2)]
    assert max(gaps) <= FP16_TOL, [f"{g:.2g}" for g in gaps]


def test_last_positions_work_and_past_the_cache_is_an_error(tmp_path, tokenizer):
    """A chunk that ends at the cache's last position computes (its padding rows, which would fall past
    the cache, are never written: executorch's index_put_ would refuse them); a position past the cache
    is refused by executorch's portable index_select on CPU before the delegate reads anything, also
    when the runner skips its own capacity check (executorch 1.3/1.4 with max_seq_len < max_context_len)."""
    result, reference, chunk, cache = _export(tmp_path, "llama", tokenizer=tokenizer, chunk=4)
    vocab = int(constant_method_values(result.path)["get_vocab_size"])
    ids = torch.randint(2, vocab, (cache,), generator=torch.Generator().manual_seed(5)).tolist()
    ref = reference(ids)
    step = LoadedMethod(result.path, "forward")
    head = cache - 2  # the last call: 2 tokens at the cache's last 2 positions, 2 padding rows past it
    _prefill(step, ids[:head], chunk)
    last = step([torch.tensor([ids[head:]]), torch.tensor([head])])[0].reshape(-1)
    assert _gap(last, ref[-1]) <= FP32_TOL
    for tokens, pos in (([3, 4], cache - 1), ([3], cache), ([3], -1)):
        with pytest.raises(Exception, match="(?i)index|out of|range|failed|error"):
            step([torch.tensor([tokens]), torch.tensor([pos])])
    # the runner loop stops at the cache's end, not at get_max_seq_len (the chunk)
    got = generate_ids(result.path, ids[:5], cache)
    assert len(got) == cache - 5 + 1


def test_executorch_runner_crosses_call_boundaries(tmp_path, tokenizer):
    """executorch's own C++ TextLLMRunner (1.5.1 binding, MPS emulated) prefills a prompt longer than
    get_max_seq_len in pieces and decodes through the same method: the text it gives with the
    token-by-token program of the same checkpoint; the Python runner agrees between the two too."""
    from mps_backend.llm.generate import Tokenizer, generate, generate_with_executorch_runner

    folder = save_checkpoint(tmp_path / "ckpt", "llama", tokenizer=tokenizer)
    prompt = "once upon a time there was a tiny language model"
    assert len(Tokenizer(folder).encode(prompt)) > 2 * 4  # more than two calls of 4
    texts = []
    for chunk in (4, 1):
        pte = export_llm(f"hf:{folder}", tmp_path / f"m{chunk}.pte", dtype="fp32", max_seq_len=48, prefill_chunk=chunk).path
        runner = "".join(generate_with_executorch_runner(pte, folder / "tokenizer.json", prompt, 10))
        texts.append((runner, "".join(generate(pte, folder, prompt, 10, bos=True))))
    assert texts[0] == texts[1] and texts[0][0]


def test_prefill_chunk_one_is_the_token_step(tmp_path, tokenizer):
    """``prefill_chunk=1``: today's static program (tokens [1, 1], enable_dynamic_shape false, the cache
    length as get_max_seq_len), nothing dynamic on CPU; a chunk larger than the cache is refused."""
    from mps_backend.llm import CheckpointError

    folder = save_checkpoint(tmp_path / "ckpt", "llama", tokenizer=tokenizer)
    result = export_llm(f"hf:{folder}", tmp_path / "m.pte", dtype="fp32", max_seq_len=24, prefill_chunk=1)
    meta = constant_method_values(result.path)
    assert meta["get_max_seq_len"] == meta["get_max_context_len"] == 24 and meta["enable_dynamic_shape"] is False
    assert not result.report.cpu_except_cache_writes
    with pytest.raises(CheckpointError, match="--prefill-chunk"):
        export_llm(f"hf:{folder}", tmp_path / "x.pte", dtype="fp32", max_seq_len=24, prefill_chunk=25)
    assert not (tmp_path / "x.pte").exists()


def test_a_symbolic_size_never_reaches_a_delegate():
    """A node reading a symbolic size as a scalar (``x * n``, ``n`` a dynamic dimension) stays on CPU
    with the reason, rather than being lowered with its example value frozen; the program computes
    with every ``n`` of its range. Lowering such a node whole is an export-time error naming it."""
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from executorch.exir.backend.backend_api import to_backend

    from mps_backend import MPSPartitioner
    from mps_backend.runtime import run_pte

    class Scale(torch.nn.Module):
        def forward(self, x, tokens):
            return torch.relu(x) * tokens.shape[1]

    x, dims = torch.randn(4), {"x": None, "tokens": {1: torch.export.Dim("n", min=1, max=8)}}
    ep = torch.export.export(Scale(), (x, torch.zeros(1, 3, dtype=torch.long)), dynamic_shapes=dims)
    part = MPSPartitioner(use_fp16=False, dynamic_ok=True)
    pte = to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch().buffer
    report = part.report()
    assert report.partitions == 1 and any("symbolic size" in n.reason for n in report.cpu_dynamic), report
    for n in (1, 5, 8):
        (out,) = run_pte(pte, [x, torch.zeros(1, n, dtype=torch.long)])
        torch.testing.assert_close(out, torch.relu(x) * n)
    with pytest.raises(Exception, match="symbolic size"):
        to_backend("MPSBackend", to_edge(ep).exported_program(), [])


#: (config, chunk, bound): the bytes a chunk program's decode step moves (fused, `mps-backend cost`) over the
#: one-row step's, float16, a 256-row cache the scores of 8 rows span (issue #46 item 2). Measured: the new
#: keys joining the cache's (4 query heads a KV head of 8 columns) 4.28 before (#36's graph: the float32
#: scores concatenated with the new keys', then masked: about 8 passes over them a layer), 3.16 after; the
#: masked scores concatenated (16 heads of 32 columns, a KV head each) 2.435 before, 2.260 after
CHUNK_BYTES = [
    ({"num_attention_heads": 8, "num_key_value_heads": 2}, 8, 3.4),
    ({"num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 32}, 8, 2.33),
]


@pytest.mark.parametrize("config,chunk,bound", CHUNK_BYTES, ids=["new-keys-join-the-cache", "masked-scores-joined"])
def test_a_chunk_costs_decode_little(tmp_path, tokenizer, config, chunk, bound):
    """A decode step through a chunk program computes C rows against the whole cache: their attention scores
    are the bytes it adds. The cache's scores are masked in the elementwise chain that reads the matmul's
    result, and either the new keys join the cache's keys before one matmul (many query rows) or the masked
    scores meet the new keys' before the softmax (few): each score written and read about 4 times."""
    from mps_backend.cost import cost_of_program

    folder = save_checkpoint(tmp_path / "ckpt", "llama", tokenizer=tokenizer, dtype=torch.float16, config=config)
    cost = {}
    for c in (1, chunk):
        result = export_llm(f"hf:{folder}", tmp_path / f"c{c}.pte", dtype="fp16", max_seq_len=256, prefill_chunk=c)
        cost[c] = cost_of_program(result.path).fused.total
    assert cost[chunk] / cost[1] <= bound, cost


@pytest.mark.parametrize("case", ["qwen3_next-gated-delta", "granitemoehybrid-mamba2"])
def test_a_recurrent_chunk_computes_its_rows_not_a_padded_block(tmp_path, tokenizer, case):
    """transformers' chunked scans pad every call to a block: the gated delta rule (Qwen3-Next, Qwen3.5, OLMo
    hybrid) to 64 rows, substituted row by row inside it, Mamba-2 (Granite 4 hybrid, Falcon-H1) to the config's
    ``mamba_chunk_size`` (256 by default). A C-row chunk program's decode step computed that block whatever C
    was. The export passes the call's C rows as the block (both scans are exact for any block; every length
    equals eager above): the chunk step's bytes stay near the one-row step's. Measured (fused, float16, chunk 8
    over the one-row step): this Qwen3-Next (its MoE gathers 8 rows' experts) 42.5x and 1440 nodes against 476
    before, 4.81x and 649 after; this Granite 4 hybrid 24.5x before, 1.62x after; a 64-wide Qwen3.5 13.86 ->
    0.61 MiB (one row: 0.28); at 1024 wide with 16 value heads of 128, one row 168.05 MiB, chunk 8 376.69 ->
    176.87 MiB."""
    from mps_backend.cost import cost_of_program

    model_type, overrides, layers, _, _ = CASES[case]
    folder = save_checkpoint(tmp_path / "ckpt", model_type, layers=layers, config=overrides, tokenizer=tokenizer)
    cost, nodes = {}, {}
    for c in (1, 8):
        result = export_llm(f"hf:{folder}", tmp_path / f"c{c}.pte", dtype="fp16", max_seq_len=24, prefill_chunk=c)
        program = cost_of_program(result.path)
        cost[c], nodes[c] = program.fused.total, sum(program.nodes_by_kind.values())
    assert cost[8] / cost[1] <= 6.0 and nodes[8] <= 1.5 * nodes[1], (cost, nodes)
