"""Recurrent layers (issue #39 item 2, mps_backend.llm.recurrent): their states are mutable buffers of the
decode step beside the KV cache. tests/llm/test_decoder.py runs the six families (LFM2, Qwen3-Next, Qwen3.5,
OLMo hybrid, Granite 4 hybrid, Falcon-H1) against transformers' own generate, in float32 and with planted
outliers in float16; here what is particular to a state:

- a new prompt at position 0 in the same loaded program starts from zero states (the runner does so
  after a reset; a state, unlike the cache's rows, is not masked by position);
- a layer that keeps a state and no attention gets no KV cache; the cost model's floor counts every
  state once;
- chunks (tests/llm/test_prefill.py) need the scan that updates a state for several rows to leave it alone
  on a chunk's padding rows: a model whose scan the export does not know is refused in one line.
"""

from __future__ import annotations

import pytest
import torch

from mps_backend.llm import CheckpointError, export_llm
from mps_backend.runtime import LoadedMethod
from tests.llm_helpers import LFM2_CONFIG, QWEN3_NEXT_CONFIG, save_checkpoint

LFM2 = ("lfm2", LFM2_CONFIG)
GATED_DELTA = ("qwen3_next", QWEN3_NEXT_CONFIG)
MAX_SEQ_LEN = 32


def _logits(step: LoadedMethod, tokens: list[int]) -> torch.Tensor:
    rows = [step([torch.tensor([[t]]), torch.tensor([pos])])[0].reshape(-1) for pos, t in enumerate(tokens)]
    return torch.stack(rows)


@pytest.mark.parametrize("family", [LFM2, GATED_DELTA], ids=["lfm2", "qwen3_next"])
def test_a_new_prompt_at_position_zero_starts_from_zero_states(tmp_path, tokenizer, family, monkeypatch):
    model_type, config = family
    folder = save_checkpoint(tmp_path / "ckpt", model_type, tokenizer=tokenizer, layers=2, config=config)
    pte = export_llm(f"hf:{folder}", tmp_path / "m.pte", prefill_chunk=1, dtype="fp32", max_seq_len=MAX_SEQ_LEN).path
    first, second = [5, 17, 9, 40, 3, 22], [8, 30, 12, 4]
    step = LoadedMethod(pte)
    _logits(step, first)
    again = _logits(step, second)  # the same loaded program: its states hold the first prompt
    fresh = _logits(LoadedMethod(pte), second)
    assert torch.equal(again, fresh)
    # the control: without the restart, the first prompt's states leak into the second
    from mps_backend.llm import decoder

    monkeypatch.setattr(decoder, "restart_at_zero", lambda *args: None)
    leaky = export_llm(f"hf:{folder}", tmp_path / "leaky.pte", prefill_chunk=1, dtype="fp32", max_seq_len=MAX_SEQ_LEN).path
    step = LoadedMethod(leaky)
    _logits(step, first)
    assert not torch.allclose(_logits(step, second), fresh, atol=1e-4)


def test_states_are_buffers_beside_a_kv_cache_only_where_layers_attend(tmp_path, tokenizer):
    from mps_backend.cost import cost_of_program
    from mps_backend.llm.checkpoint import load_hf
    from mps_backend.llm.decoder import HFDecoder

    model_type, config = LFM2
    folder = save_checkpoint(tmp_path / "ckpt", model_type, tokenizer=tokenizer, layers=2, config=config)
    decoder = HFDecoder(load_hf(folder, torch.float32).model, MAX_SEQ_LEN)
    buffers = dict(decoder.named_buffers())
    # layer 0 a short convolution (its last 3 inputs of the 64 channels), layer 1 attention
    assert buffers["conv_state_0_0"].shape == (1, 64, 3)
    assert "k_cache_0" not in buffers and "v_cache_0" not in buffers and "k_cache_1" in buffers
    state_bytes = sum(
        b.numel() * b.element_size() for n, b in buffers.items() if n.startswith(("conv_state", "k_cache", "v_cache"))
    )
    result = export_llm(f"hf:{folder}", tmp_path / "m.pte", prefill_chunk=1, dtype="fp32", max_seq_len=MAX_SEQ_LEN)
    assert result.delegates == 1 and not result.report.cpu_except_cache_writes, result.summary()
    cost = cost_of_program(result.path)
    assert cost.floor_parts["state"] == state_bytes  # every state once: the KV cache and the convolution's
    # the state's write-back is executorch's copy of the mutated buffer (the state is its own size: its floor)
    assert cost.cpu_kernels.get("aten::copy_.default") == 1


def test_a_state_updated_by_an_unknown_scan_refuses_chunks_in_one_line(tmp_path, tokenizer, monkeypatch):
    """Chunks need the scan that updates a recurrent state for several rows to leave it alone on padding
    rows (mps_backend.llm.recurrent.CHUNK_SCANS); a model whose scan the export does not know is refused,
    naming the model type and the scans it knows."""
    from mps_backend.llm import recurrent

    model_type, config = GATED_DELTA
    folder = save_checkpoint(tmp_path / "ckpt", model_type, tokenizer=tokenizer, layers=2, config=config)
    monkeypatch.setattr(recurrent, "CHUNK_SCANS", {"mamba2_chunk_scan": recurrent.CHUNK_SCANS["mamba2_chunk_scan"]})
    with pytest.raises(CheckpointError) as e:
        export_llm(f"hf:{folder}", tmp_path / "m.pte", dtype="fp32", max_seq_len=MAX_SEQ_LEN, prefill_chunk=4)
    message = str(e.value)
    assert "\n" not in message and model_type in message and "known: mamba2_chunk_scan)" in message, message
    assert not (tmp_path / "m.pte").exists()


def test_a_state_a_previous_prompt_left_inf_or_nan_is_cleared_at_position_zero(tmp_path, tokenizer):
    """The restart selects zeros rather than multiplying by zero: ``nan * 0`` is NaN."""
    from mps_backend.llm.checkpoint import load_hf
    from mps_backend.llm.decoder import HFDecoder

    model_type, config = LFM2
    folder = save_checkpoint(tmp_path / "ckpt", model_type, tokenizer=tokenizer, layers=2, config=config)
    decoder = HFDecoder(load_hf(folder, torch.float32).model, MAX_SEQ_LEN)
    step = (torch.tensor([[5]]), torch.tensor([0]))
    with torch.no_grad():
        clean = decoder(*step)
        decoder.conv_state_0_0.fill_(float("nan"))
        again = decoder(*step)
    assert torch.isfinite(again).all() and torch.equal(again, clean)
