"""Tiny GGUF files written byte by byte (no ``gguf.GGUFWriter``: every field, offsets and types included, is
the caller's to set), for the hostile-input tests and the GGUF fuzzer (``harness.fuzz_checkpoint``).

    metadata, tensors = tiny_llama(layers=2)
    write_gguf(path, metadata, tensors)

:func:`tiny_llama` gives a small llama (float32 weights, a byte-level BPE vocabulary and merges) as a list of
metadata ``(key, type, value)`` and a list of :class:`Tensor` entries; :func:`write_gguf` lays them out as
llama.cpp's writer does (the tensor table's offsets each tensor's place in the data, padded to the alignment)
unless an entry carries its own ``offset``.
"""

from __future__ import annotations

import pathlib
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

#: GGUF metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FORMATS = dict(
    zip(
        (U8, I8, U16, I16, U32, I32, F32, BOOL, U64, I64, F64), ("<B", "<b", "<H", "<h", "<I", "<i", "<f", "<?", "<Q", "<q", "<d")
    )
)
#: ggml type ids used here
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8


@dataclass
class Tensor:
    name: str
    dims: tuple[int, ...]  # ggml order: the row length first
    ggml_type: int
    data: bytes
    offset: int | None = None  # None: where the writer puts it


def _string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def _value(kind: int, value: Any) -> bytes:
    if kind == STRING:
        return _string(value)
    if kind == ARRAY:
        sub, items = value
        out = struct.pack("<IQ", sub, len(items))
        return out + b"".join(_value(sub, v) for v in items)
    return struct.pack(_FORMATS[kind], value)


def write_gguf(path: pathlib.Path, metadata: list[tuple[str, int, Any]], tensors: list[Tensor], alignment: int = 32) -> None:
    """A GGUF v3 file of ``metadata`` and ``tensors`` (each tensor's data padded to ``alignment``)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    head += b"".join(_string(k) + struct.pack("<I", kind) + _value(kind, v) for k, kind, v in metadata)
    table, data, at = b"", b"", 0
    for t in tensors:
        offset = at if t.offset is None else t.offset
        table += _string(t.name) + struct.pack("<I", len(t.dims)) + struct.pack(f"<{len(t.dims)}Q", *t.dims)
        table += struct.pack("<IQ", t.ggml_type, offset)
        padded = t.data + bytes(-len(t.data) % alignment)
        data += padded
        at += len(padded)
    head += table
    path.write_bytes(head + bytes(-len(head) % alignment) + data)


def f32(name: str, values: np.ndarray) -> Tensor:
    """A float32 tensor (numpy shape in torch order: the last dimension is ggml's first)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    return Tensor(name, tuple(reversed(values.shape)), GGML_F32, values.tobytes())


#: the byte-level vocabulary of the tiny files: single letters, their merges, the special tokens
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
MERGES = ["t h", "th e", "q u", "i c", "ic k"]


def vocabulary(size: int | None = None) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a byte-level BPE tokenizer: ``<s>``, ``</s>``, the letters, the merges'
    results; ``size`` pads it with tokens ``t0 ...`` (a large vocabulary)."""
    tokens = ["<s>", "</s>", *LETTERS, "Ġ", *("".join(m.split()) for m in MERGES)]
    if size is not None:
        tokens += [f"t{i}" for i in range(size - len(tokens))]
    types = [3, 3] + [1] * (len(tokens) - 2)
    return tokens, types, list(MERGES)


def tiny_llama(
    layers: int = 2,
    *,
    hidden: int = 16,
    ff: int = 32,
    heads: int = 2,
    kv_heads: int = 1,
    declared_layers: int | None = None,
    declared_hidden: int | None = None,
    vocab: int | None = None,
    seed: int = 0,
) -> tuple[list[tuple[str, int, Any]], list[Tensor]]:
    """A small llama's metadata and float32 tensors; ``declared_*``: the metadata says more than the tensors hold."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = vocabulary(vocab)
    v = len(tokens)
    metadata = [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "tiny"),
        ("llama.block_count", U32, declared_layers if declared_layers is not None else layers),
        ("llama.context_length", U32, 64),
        ("llama.embedding_length", U32, declared_hidden or hidden),
        ("llama.feed_forward_length", U32, ff),
        ("llama.attention.head_count", U32, heads),
        ("llama.attention.head_count_kv", U32, kv_heads),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.rope.freq_base", F32, 10000.0),
        ("llama.rope.dimension_count", U32, hidden // heads),
        ("llama.vocab_size", U32, v),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
        ("tokenizer.ggml.bos_token_id", U32, 0),
        ("tokenizer.ggml.eos_token_id", U32, 1),
    ]
    head_dim = hidden // heads

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    tensors = [f32("token_embd.weight", w(v, hidden)), f32("output_norm.weight", 1 + w(hidden))]
    tensors.append(f32("output.weight", w(v, hidden)))
    for i in range(layers):
        tensors += [
            f32(f"blk.{i}.attn_norm.weight", 1 + w(hidden)),
            f32(f"blk.{i}.attn_q.weight", w(hidden, hidden)),
            f32(f"blk.{i}.attn_k.weight", w(kv_heads * head_dim, hidden)),
            f32(f"blk.{i}.attn_v.weight", w(kv_heads * head_dim, hidden)),
            f32(f"blk.{i}.attn_output.weight", w(hidden, hidden)),
            f32(f"blk.{i}.ffn_norm.weight", 1 + w(hidden)),
            f32(f"blk.{i}.ffn_gate.weight", w(ff, hidden)),
            f32(f"blk.{i}.ffn_up.weight", w(ff, hidden)),
            f32(f"blk.{i}.ffn_down.weight", w(hidden, ff)),
        ]
    return metadata, tensors
