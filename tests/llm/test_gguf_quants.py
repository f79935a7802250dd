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
    "Q4_K": (4, 32, 154 / 144),  # 144 / 256 -> int4, a float16 scale and an int8 minimum per 32, -dmin per 256
    "Q5_0": (8, 32, (1 + 2 / 32) / (22 / 32)),  # 5-bit values: int8
    "Q5_1": (8, 32, (1 + 4 / 32) / (24 / 32)),
    "Q5_K": (8, 32, 282 / 176),  # 176 / 256 -> int8, a float16 scale and an int8 minimum per 32, -dmin per 256
    "Q6_K": (8, 16, (1 + 2 / 16) / (210 / 256)),
}


def _bound(w: GroupQuantizedTensor) -> torch.Tensor:
    """Float16 rounding of the stored scale and offset, and of the device's float16 product (int4):
    ``2**-10 |q scale| + 2**-11 |offset|`` per value. A K-quant's offset is computed in float32 from the
    stored (rounded) scale and the file's exact minimums, ``shift scale - dmin m``: no rounding of its own,
    the scale's rounding times the file's value ``q + shift`` instead, ``2**-11 |(q + shift) scale| +
    2**-11 |q scale|`` (Q5_K, shift 0: ``2**-10 |q scale|``), and float32's rounding of the offset and the sum."""
    n, k = w.qdata.shape
    g = w.group_size
    q, scale = w.qdata.float().reshape(n, -1, g), w.scale.float().unsqueeze(-1)
    if w.minimums is not None:
        per = w.scale.shape[1] // w.minimum_scale.shape[1]
        offset = w.shift * scale + (w.minimums.float() * w.minimum_scale.float().repeat_interleave(per, 1)).unsqueeze(-1)
        rounding = (2.0**-11) * ((q + w.shift) * scale).abs() + (2.0**-11) * (q * scale).abs()
        return (rounding + (2.0**-22) * (offset.abs() + (q * scale).abs()) + 1e-12).reshape(n, k)
    offset = w.offset.float().abs().unsqueeze(-1) if w.offset is not None else torch.zeros(1)
    return ((2.0**-10) * (q * scale).abs() + (2.0**-11) * offset + 1e-12).reshape(n, k)


def _stored(w: GroupQuantizedTensor) -> int:
    """Bytes of a kept weight as the program stores them: its values (packed int4: two a byte), scales,
    and offsets or minimums and their scales."""
    groups = (w.scale, w.offset, w.minimums, w.minimum_scale)
    return w.qdata.numel() // (2 if w.packed else 1) + sum(t.numel() * t.element_size() for t in groups if t is not None)


@pytest.mark.parametrize("kind", sorted(KEPT))
def test_kept_values_equal_the_gguf_dequantize(tmp_path, kind):
    """Every linear and embedding weight of the file is a GroupQuantizedTensor whose values equal the
    ``gguf`` package's dequantize of the same tensor (rows in transformers' order: q/k permuted) within
    float16 rounding of its scales and offsets; int4 packed for the matmuls' weights, unpacked for the
    table the lookup reads; the weight bytes those of the table above (Q4_0, Q4_1, Q8_0: the file's; Q4_K
    at most 1.1x the file's: its minimums int8 and -dmin per 256 columns, not a float16 offset per 32)."""
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
            stored += _stored(w)
    import gguf

    reader = gguf.GGUFReader(path)
    file = sum(int(t.n_bytes) for t in reader.tensors if t.tensor_type.name == kind and t.name != "token_embd.weight")
    assert stored / file == pytest.approx(ratio, rel=1e-9), (stored, file)
    note = next(n for n in kept.notes if n.startswith("GGUF tensors kept quantized"))
    assert f"{kind} (16) as int{bits} groups of {group}, {ratio:.2f}x their bytes" in note, note
    if bits == 4 or kind == "Q8_0":
        assert stored / file <= 1.1  # issue #43: at most 1.1x the file's bytes where the values fit their width
    if kind in ("Q4_K", "Q5_K"):  # the minimums as the file has them: 6-bit integers, -dmin a float16 per 256
        w = quantized["model.layers.0.mlp.down_proj.weight"]
        assert w.offset is None and w.minimums.dtype == torch.int8 and w.minimum_scale.dtype == torch.float16
        assert (w.minimums.shape, w.minimum_scale.shape[1]) == (w.scale.shape, w.qdata.shape[1] // 256)


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
    assert "Q4_K (15) as int4 groups of 32, 1.07x their bytes" in note, note
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
    result = export_llm(f"gguf:{path}", out, prefill_chunk=1, dtype="fp32", max_seq_len=16, verify_steps=3)
    assert result.verification.ok and result.delegates == 1, result.summary()
    assert "as kept, dequantized" in result.verification.reference and f"{kind} (16) as int" in result.notes[0]
    blob = read_blob(delegate_blobs(out.read_bytes())[0].blob)
    graph = blob.graph
    kinds = collections.Counter(graph.values[c].datatype.name for c in graph.constant_ids)
    bits = KEPT[kind][0]
    minimums = 16 if kind == "Q4_K" else 0  # int8, one per group of each kept weight (the table's too)
    assert kinds["int4"] == (15 if bits == 4 else 0) and kinds["int8"] == (1 if bits == 4 else 16) + minimums, kinds
    model = load_gguf(path, torch.float32, keep_quantized=True).model
    if bits == 4:
        packed = {bytes(blob.constant_bytes(c)) for c in graph.constant_ids if graph.values[c].datatype.name == "int4"}
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                assert pack_int4(m.weight.qdata).numpy().tobytes() in packed
    # the program stores the kept weights' bytes and nothing more: no offsets computed on the host, no copies
    kept = {id(p): p for p in model.parameters() if isinstance(p, GroupQuantizedTensor)}.values()
    quantized = sum(
        graph.values[c].constant_buffer_size for c in graph.constant_ids if graph.values[c].datatype.name != "float32"
    )
    assert quantized == sum(_stored(w) for w in kept), (quantized, [_stored(w) for w in kept])
    requantized = export_llm(f"gguf:{path}", tmp_path / "q.pte", prefill_chunk=1, dtype="fp32", quantize="int4", max_seq_len=16)
    assert any("dequantized to float32 (--quantize re-quantizes the model)" in n for n in requantized.notes), requantized.notes
    summary = next(n for n in requantized.notes if n.startswith("quantized "))
    assert summary.startswith("quantized 14 of 15 linear layers (int4, group 32") and "output head int8" in summary, summary


def test_k_quant_offsets_from_minimums_read_every_way(tmp_path):
    """A Q4_K weight's offsets are computed from its int8 minimums (``shift scale - dmin m``): a lookup of
    rows (the table) gives the rows of the whole dequantized weight, the transpose the transposed weight,
    another dtype the same values up to float16 rounding; the same dequantization with the minimums swapped between two
    super-blocks is not (the minimums are read where they belong)."""
    from mps_backend.quant_tensor import GroupQuantizedTensor, transposed

    path = write_tiny_gguf(tmp_path / "q4k.gguf", "Q4_K")
    model = load_gguf(path, torch.float16, keep_quantized=True).model
    table, w = model.model.embed_tokens.weight, model.model.layers[0].mlp.down_proj.weight
    index = torch.tensor([[3, 0, 511], [7, 7, 100]])
    assert torch.equal(torch.nn.functional.embedding(index, table), table.dequantize()[index])
    assert torch.equal(transposed(w).dequantize(), w.dequantize().t()) and transposed(transposed(w)).minimums is w.minimums
    wide, narrow = w.to(torch.float32).dequantize(), w.dequantize().float()  # float16: the offset and the sum rounded
    product = (w.qdata.float().view(*w.scale.shape, -1) * w.scale.float().unsqueeze(-1)).view_as(wide).abs()
    assert wide.dtype == torch.float32 and ((wide - narrow).abs() <= 2.0**-10 * (wide.abs() + product) + 2.0**-24).all()
    swapped = w.minimums.clone()
    swapped[:, :8], swapped[:, 8:16] = w.minimums[:, 8:16], w.minimums[:, :8]
    other = GroupQuantizedTensor(w.qdata, w.scale, w.bits, w.packed, w.dtype, None, swapped, w.minimum_scale, w.shift)
    assert not torch.equal(other.dequantize()[:, :512], w.dequantize()[:, :512])


def test_metadata_read_once_per_file_inside_the_scope(tmp_path):
    """``one_metadata_read``: transformers' metadata read of a GGUF (what its config and tokenizer start from)
    is done once per file while the scope is open (the self-check asks twice), each caller getting its own copy
    equal to transformers' answer; a rewritten file is read again; any other read is transformers' own; its
    function is back after, also on error."""
    import transformers
    from transformers import modeling_gguf_pytorch_utils as utils

    from mps_backend.llm.gguf import one_metadata_read

    path = write_tiny_gguf(tmp_path / "t.gguf", "Q8_0")
    real = utils.load_gguf_checkpoint
    want = transformers.AutoConfig.from_pretrained(tmp_path, gguf_file=path.name).to_dict()
    calls = []

    def counted(p, return_tensors=False, model_to_load=None, **kwargs):
        calls.append(return_tensors)
        return real(p, return_tensors=return_tensors, model_to_load=model_to_load, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(utils, "load_gguf_checkpoint", counted)
        with one_metadata_read():
            configs = [transformers.AutoConfig.from_pretrained(tmp_path, gguf_file=path.name).to_dict() for _ in range(2)]
            assert configs == [want, want] and calls == [False]
            utils.load_gguf_checkpoint(str(path))["config"]["vocab_size"] = -1  # a caller's change stays its own
            assert utils.load_gguf_checkpoint(str(path))["config"]["vocab_size"] == want["vocab_size"]
            assert calls == [False]
            write_tiny_gguf(path, "Q8_0", seed=1)  # rewritten: read again
            utils.load_gguf_checkpoint(str(path))
            assert calls == [False, False]
            utils.load_gguf_checkpoint(str(path), torch_dtype=torch.float32)  # another read: transformers' own, each time
            assert calls == [False, False, False]
        assert utils.load_gguf_checkpoint is counted
        with pytest.raises(RuntimeError), one_metadata_read():
            raise RuntimeError("a failed self-check")
        assert utils.load_gguf_checkpoint is counted
    assert utils.load_gguf_checkpoint is real
