"""A GGUF's quantized tensors kept as they are (issue #43 item 3; mps_backend/llm/gguf_quants.py): tiny llama
GGUFs of each kept type, written with the ``gguf`` package's own quantizer where it has one (Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0; for the K-quants it only dequantizes: random blocks of their layout), compared value by
value with the ``gguf`` package's ``dequantize`` (transformers' row order), their bytes against the file's,
and exported end to end; a type no layout keeps is dequantized with a note, never refused."""

from __future__ import annotations

import pytest
import torch

from mps_backend.llm.gguf import load_gguf
from mps_backend.quant_tensor import GroupQuantizedTensor
from tests.llm_helpers import TINY_GGUF, write_tiny_gguf

#: kept type -> (bits, group, stored bytes / file bytes of a weight only matmuls read)
KEPT = {
    "Q4_0": (4, 32, 1.0),  # 18 bytes / 32: 16 of int4 + a float16 scale
    "Q4_1": (4, 32, 1.0),  # 20 / 32: + a float16 offset
    "Q8_0": (8, 32, 1.0),  # 34 / 32
    "Q4_K": (4, 32, 0.625 / 0.5625),  # 144 / 256 -> int4 + scale and offset per 32
    "Q5_0": (8, 32, (1 + 2 / 32) / (22 / 32)),  # 5-bit values: int8
    "Q5_1": (8, 32, (1 + 4 / 32) / (24 / 32)),
    "Q5_K": (8, 32, (1 + 4 / 32) / (176 / 256)),
    "Q6_K": (8, 16, (1 + 2 / 16) / (210 / 256)),
}


def _bound(w: GroupQuantizedTensor) -> torch.Tensor:
    """Float16 rounding of the stored scale and offset, and of the device's float16 product (int4):
    ``2**-10 |q scale| + 2**-11 |offset|`` per value."""
    n, k = w.qdata.shape
    g = w.group_size
    product = (w.qdata.float().reshape(n, -1, g) * w.scale.float().unsqueeze(-1)).abs()
    offset = w.offset.float().abs().unsqueeze(-1) if w.offset is not None else torch.zeros(1)
    return ((2.0**-10) * product + (2.0**-11) * offset + 1e-12).reshape(n, k)


@pytest.mark.parametrize("kind", sorted(KEPT))
def test_kept_values_equal_the_gguf_dequantize(tmp_path, kind):
    """Every linear and embedding weight of the file is a GroupQuantizedTensor whose values equal the
    ``gguf`` package's dequantize of the same tensor (rows in transformers' order: q/k permuted) within
    float16 rounding of its scales and offsets; int4 packed for the matmuls' weights, unpacked for the
    table the lookup reads; the weight bytes those of the table above (Q4_0, Q4_1, Q8_0: the file's)."""
    path = write_tiny_gguf(tmp_path / f"{kind}.gguf", kind)
    kept = load_gguf(path, torch.float32, keep_quantized=True)
    floating = dict(load_gguf(path, torch.float32).model.named_parameters())  # gguf.dequantize, transformers' order
    bits, group, ratio = KEPT[kind]
    quantized = {n: p for n, p in kept.model.named_parameters() if isinstance(p, GroupQuantizedTensor)}
    assert len(quantized) == 1 + 1 + 7 * TINY_GGUF["layers"], sorted(quantized)  # table, head, 7 linears a layer
    stored = 0
    for name, w in quantized.items():
        lookup = name == "model.embed_tokens.weight"
        assert (w.bits, w.group_size, w.packed) == (bits, group, bits == 4 and not lookup), name
        got, want = w.dequantize(), floating[name]
        assert ((got - want).abs() <= _bound(w)).all(), (name, float((got - want).abs().max()))
        if not lookup:
            stored += w.qdata.numel() // (2 if w.packed else 1) + sum(t.numel() * 2 for t in (w.scale, w.offset) if t is not None)
    import gguf

    reader = gguf.GGUFReader(path)
    file = sum(int(t.n_bytes) for t in reader.tensors if t.tensor_type.name == kind and t.name != "token_embd.weight")
    assert stored / file == pytest.approx(ratio, rel=1e-9), (stored, file)
    note = next(n for n in kept.notes if n.startswith("GGUF tensors kept quantized"))
    assert f"{kind} (16) as int{bits} groups of {group}, {ratio:.2f}x their bytes" in note, note
    if bits == 4 or kind == "Q8_0":
        assert ratio <= 1.112  # issue #43: at most ~1.1x the file's bytes where the values fit their width


def test_the_q_and_k_rows_are_permuted_with_their_scales(tmp_path):
    """transformers reorders the rows of q_proj/k_proj (llama.cpp interleaves the rotary halves): the kept
    rows and their scales and offsets move together (a mismatch would put one row's scales on another)."""
    path = write_tiny_gguf(tmp_path / "q4k.gguf", "Q4_K")
    kept = load_gguf(path, torch.float32, keep_quantized=True).model.model.layers[0].self_attn
    floating = load_gguf(path, torch.float32).model.model.layers[0].self_attn
    for proj in ("q_proj", "k_proj"):
        w, want = getattr(kept, proj).weight, getattr(floating, proj).weight
        assert ((w.dequantize() - want).abs() <= _bound(w)).all(), proj
        shifted = torch.roll(w.dequantize(), 1, dims=0)  # the values of a wrong row order are far off
        assert (shifted - want).abs().max() > 100 * _bound(w).max(), proj


def test_other_types_are_dequantized_with_a_note(tmp_path):
    """Q2_K (no int4/int8 layout keeps its 2-bit values with their 4-bit sub-block scales here) is
    dequantized to the export precision, named in one note; the file is not refused. A Q5_0 file (ggml
    type 6, which transformers' GGUF reader did not know) loads: the issue's Gemma 3 Q4_K_M refusal."""
    q2 = load_gguf(write_tiny_gguf(tmp_path / "q2k.gguf", "Q2_K"), torch.float16, keep_quantized=True)
    assert "GGUF tensors Q2_K (16) dequantized to float16 (no int4/int8 layout keeps them)" in q2.notes, q2.notes
    assert all(type(p) is torch.nn.Parameter for p in q2.model.parameters())
    mixed = load_gguf(write_tiny_gguf(tmp_path / "mix.gguf", "Q4_K", embedding="Q5_0"), torch.float16, keep_quantized=True)
    note = mixed.notes[0]
    assert "Q4_K (15) as int4 groups of 32, 1.11x their bytes" in note, note
    assert "Q5_0 (1) as int8 groups of 32, 1 read by a lookup: 1.55x" in note, note


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_K", "Q5_0", "Q6_K"])
def test_kept_gguf_exports_and_verifies(tmp_path, kind):
    """``gguf:`` keeps the file's quantized tensors by default: the .pte holds each int4 weight's packed
    values (byte for byte), the program passes its self-check in float32 against eager with the kept
    values (1e-5 of the logits' scale) and stays within float16 rounding of the scales of the float
    dequantization; ``--quantize int4`` on the same file re-quantizes from the dequantized values."""
    import collections

    from mps_backend.llm import export_llm
    from mps_backend.operators.quant import pack_int4
    from mps_backend.serialization import read_blob
    from mps_backend.serialization.pte import delegate_blobs

    path = write_tiny_gguf(tmp_path / f"{kind}.gguf", kind)
    out = tmp_path / "m.pte"
    result = export_llm(f"gguf:{path}", out, dtype="fp32", max_seq_len=16, verify_steps=3)
    assert result.verification.ok and result.delegates == 1, result.summary()
    assert "as kept, dequantized" in result.verification.reference and f"{kind} (16) as int" in result.notes[0]
    graph = read_blob(delegate_blobs(out.read_bytes())[0].blob).graph
    kinds = collections.Counter(graph.values[c].datatype.name for c in graph.constant_ids)
    bits = KEPT[kind][0]
    assert kinds["int4"] == (15 if bits == 4 else 0) and kinds["int8"] == (1 if bits == 4 else 16), kinds
    if bits == 4:
        blob = read_blob(delegate_blobs(out.read_bytes())[0].blob)
        packed = {bytes(blob.constant_bytes(c)) for c in graph.constant_ids if graph.values[c].datatype.name == "int4"}
        model = load_gguf(path, torch.float32, keep_quantized=True).model
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                assert pack_int4(m.weight.qdata).numpy().tobytes() in packed
    requantized = export_llm(f"gguf:{path}", tmp_path / "q.pte", dtype="fp32", quantize="int4", max_seq_len=16)
    assert any("dequantized to float32 (--quantize re-quantizes the model)" in n for n in requantized.notes), requantized.notes
    summary = next(n for n in requantized.notes if n.startswith("quantized "))
    assert summary.startswith("quantized 14 of 15 linear layers (int4, group 32") and "output head int8" in summary, summary
