"""GGUF's quantized blocks as the groups the device reads (:class:`mps_backend.quant_tensor.GroupQuantizedTensor`),
value for value.

Each kept type's blocks are decoded into integer values, a scale per group and (where the type has one)
an offset per group, so that ``q * scale + offset`` is the block's value as the ``gguf`` package's
``dequantize`` computes it (float32 products of float16 fields), up to float16 rounding of the scale and
offset the program stores (llama.cpp's block layouts; ``gguf/quants.py`` of the gguf package 0.19). The
K-quants' offsets are not stored: their 6-bit minimums ``m_j`` are kept as int8, one per group, with
``-dmin`` as a float16 per 256-column super-block, and the program computes ``offset = shift * scale -
dmin m_j`` from them (:class:`~mps_backend.quant_tensor.GroupQuantizedTensor`'s ``minimums``,
``minimum_scale``, ``shift``). Bytes per 256 values, file -> kept (a weight only matmuls read):

| type | block | value | kept as (groups: a scale each) | bytes |
|---|---|---|---|---|
| Q4_0 | 32: d, 16 bytes of nibbles | ``d (q - 8)`` | int4, 32, scale d | 144 -> 144 |
| Q4_1 | 32: d, m, nibbles | ``d q + m`` | int4, 32, scale d, offset ``m + 8 d`` | 160 -> 160 |
| Q5_0 | 32: d, 32 high bits, nibbles | ``d (q - 16)`` | int8, 32, scale d | 176 -> 272 |
| Q5_1 | 32: d, m, high bits, nibbles | ``d q + m`` | int8, 32, scale d, offset m | 192 -> 288 |
| Q8_0 | 32: d, 32 int8 | ``d q`` | int8, 32, scale d | 272 -> 272 |
| Q4_K | 256: d, dmin, 6-bit sc, m, q | ``d sc_j q - dmin m_j`` | int4, 32, ``d sc_j``, ``m_j``, ``-dmin``, shift 8 | 144 -> 154 |
| Q5_K | 256: as Q4_K and 256 high bits | ``d sc_j q - dmin m_j`` | int8, 32, ``d sc_j``, ``m_j``, ``-dmin`` | 176 -> 282 |
| Q6_K | 256: 4+2-bit q, 16 int8 sc, d | ``d sc_j (q - 32)`` | int8, 16, scale ``d sc_j`` | 210 -> 288 |

4-bit values are shifted into [-8, 7] (the device's int4), the shift folded into the offset. 5- and
6-bit values go to int8 groups (1 byte a weight). Every other type (Q2_K, Q3_K, the IQ and TQ types,
MXFP4, ...) is dequantized by the ``gguf`` package to the export precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

QK_K = 256

#: (q, scale, offset or None, minimum or None, minimum scale or None) of blocks (:class:`Layout`)
Decoded = tuple[np.ndarray, np.ndarray, Optional[np.ndarray], Optional[np.ndarray], Optional[np.ndarray]]


@dataclass(frozen=True)
class Layout:
    """How one ggml type's blocks are kept: ``bits`` of the values (4: int4, 8: int8), ``group`` columns a
    scale, ``decode(blocks [B, type_size] uint8) -> (q int8 [B, block], scale f32 [B, block / group],
    offset f32 [B, block / group] or None, minimum int8 [B, block / group] or None, minimum scale f32 [B, 1]
    or None)``; with a minimum the offset is ``shift * scale + minimum * minimum scale``."""

    bits: int
    group: int
    decode: Callable[[np.ndarray], Decoded]
    shift: int = 0


def _half(b: np.ndarray) -> np.ndarray:
    """Little-endian float16 fields ``[B, 2]`` (bytes) -> float32 ``[B, 1]``."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[B, 16]`` bytes -> the 32 values of a block: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """``[B, 4]`` bytes (a little-endian uint32) -> bit j of it for value j, ``[B, 32]``."""
    bits = np.ascontiguousarray(qh).view(np.uint32) >> np.arange(32, dtype=np.uint32)
    return (bits & 1).astype(np.uint8)


def _q4_0(b: np.ndarray) -> Decoded:
    return _nibbles(b[:, 2:18]).astype(np.int8) - np.int8(8), _half(b[:, 0:2]), None, None, None


def _q4_1(b: np.ndarray) -> Decoded:
    d, m = _half(b[:, 0:2]), _half(b[:, 2:4])
    return _nibbles(b[:, 4:20]).astype(np.int8) - np.int8(8), d, m + 8 * d, None, None


def _q5_0(b: np.ndarray) -> Decoded:
    q = _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4)
    return q.astype(np.int8) - np.int8(16), _half(b[:, 0:2]), None, None, None


def _q5_1(b: np.ndarray) -> Decoded:
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return q.astype(np.int8), _half(b[:, 0:2]), _half(b[:, 2:4]), None, None


def _q8_0(b: np.ndarray) -> Decoded:
    return np.ascontiguousarray(b[:, 2:34]).view(np.int8), _half(b[:, 0:2]), None, None, None


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's 12 bytes -> the 8 six-bit scales (float32) and minimums (int8) of a block,
    ``[B, 8]`` each: bytes 0-3 hold scales 0-3 (low 6 bits) and the top bits of scales 4-7, bytes 4-7 the
    minimums 0-3 and the top bits of minimums 4-7, bytes 8-11 the low 4 bits of scales 4-7 and of
    minimums 4-7."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.int8)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K's and Q5_K's 128 bytes -> ``[B, 8, 32]``: four runs of 32 bytes, each the low nibbles of one
    sub-block and the high nibbles of the next."""
    qs = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (qs & 0x0F).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray) -> Decoded:
    d, dmin = _half(b[:, 0:2]), _half(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    q = _k_nibbles(b[:, 16:144]).astype(np.int8) - np.int8(8)
    return q.reshape(-1, QK_K), d * sc, None, mn, -dmin


def _q5_k(b: np.ndarray) -> Decoded:
    d, dmin = _half(b[:, 0:2]), _half(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    high = (b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = _k_nibbles(b[:, 48:176]) | (high << 4)
    return q.astype(np.int8).reshape(-1, QK_K), d * sc, None, mn, -dmin


def _q6_k(b: np.ndarray) -> Decoded:
    low = (b[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = low.reshape(-1, 8, 32) | (high.reshape(-1, 8, 32) << 4)
    scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    return (q.astype(np.int8) - np.int8(32)).reshape(-1, QK_K), _half(b[:, 208:210]) * scales, None, None, None


#: ggml type name -> how its blocks are kept
LAYOUTS = {
    "Q4_0": Layout(4, 32, _q4_0),
    "Q4_1": Layout(4, 32, _q4_1),
    "Q5_0": Layout(8, 32, _q5_0),
    "Q5_1": Layout(8, 32, _q5_1),
    "Q8_0": Layout(8, 32, _q8_0),
    "Q4_K": Layout(4, 32, _q4_k, shift=8),
    "Q5_K": Layout(8, 32, _q5_k),
    "Q6_K": Layout(8, 16, _q6_k),
}


def decode_rows(raw: np.ndarray, kind: str, columns: int) -> Decoded:
    """Rows of a tensor of ggml type ``kind`` as stored (``raw`` uint8 ``[rows, row bytes]``) -> ``(q int8
    [rows, columns], scale float32 [rows, G], offset float32 [rows, G] or None, minimum int8 [rows, G] or
    None, minimum scale float32 [rows, blocks] or None)`` (:class:`Layout`)."""
    import gguf  # noqa: PLC0415

    layout = LAYOUTS[kind]
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    rows = raw.shape[0]
    q, *groups = layout.decode(np.ascontiguousarray(raw).reshape(-1, size))
    scale, offset, minimum, minimum_scale = (None if t is None else t.reshape(rows, -1) for t in groups)
    assert scale is not None and scale.shape[1] == columns // layout.group
    return q.reshape(rows, columns), scale, offset, minimum, minimum_scale
