"""MPSDequantizePerChannelGroup (semantics §5.17).

The weights are int8 values -8..7, or an int4 constant as the interpreter keeps it when only
dequantize nodes read it: its bytes, two values a byte (low nibble = even k), unpacked here a block of
rows at a time.
"""

from __future__ import annotations

import torch

from mps_backend.dtypes import FLOAT_DTYPES
from mps_backend.serialization.model import DataType

from ..core import KernelContext

#: float32 bytes a dequantize computes at once (an LLM head's weights would be gigabytes)
CHUNK_BYTES = 64 << 20


def dequantize_per_channel_group(ctx: KernelContext, node) -> None:
    qid = node["input1_id"]
    q, s = ctx.get(qid), ctx.get(node["scales_id"])
    if ctx.graph is not None and ctx.graph.values[qid].datatype != DataType.int4:
        ctx.fail("dequantize input is not an int4 tensor")
    # int8 values -8..7, or the interpreter's packed int4 constant: uint8, two values a byte
    packed = q.dtype == torch.uint8
    if q.dtype not in (torch.int8, torch.uint8) or q.dim() != 2 or s.dim() != 2 or s.dtype not in FLOAT_DTYPES:
        ctx.fail(f"dequantize of {q.dtype}{tuple(q.shape)} with scales {s.dtype}{tuple(s.shape)}")
    (n, k), g = (q.shape[0], q.shape[1] * 2 if packed else q.shape[1]), s.shape[1]
    if s.shape[0] != n or g == 0 or k % g:
        ctx.fail(f"scales {tuple(s.shape)} do not fit int4 weights {(n, k)}")
    out = torch.empty((n, k), dtype=torch.float16)  # always float16
    rows = max(1, CHUNK_BYTES // (4 * k))  # computed a block of rows at a time: elementwise, same values
    for r in range(0, n, rows):
        block = unpack_rows(q[r : r + rows]) if packed else q[r : r + rows]
        block = block.reshape(-1, g, k // g).float() * s[r : r + rows].float().reshape(-1, g, 1)
        out[r : r + rows] = block.reshape(-1, k)  # zero points etc. are ignored
    ctx.set(node["output_id"], out)


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[n, k / 2]`` int4 bytes -> int8 ``[n, k]`` values -8..7 (§5.17: low nibble = even k, signed)."""
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1).to(torch.int8)
    return ((nibbles ^ 8) - 8).reshape(packed.shape[0], -1)


KERNELS = {"MPSDequantizePerChannelGroup": dequantize_per_channel_group}
