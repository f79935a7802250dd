"""MPSDequantizePerChannelGroup (semantics §5.17).

The interpreter has already unpacked the int4 constant (low nibble = even k) into int8 values -8..7.
"""

from __future__ import annotations

import torch

from mps_backend.dtypes import FLOAT_DTYPES
from mps_backend.serialization.model import DataType

from ..core import KernelContext


def dequantize_per_channel_group(ctx: KernelContext, node) -> None:
    qid = node["input1_id"]
    q, s = ctx.get(qid), ctx.get(node["scales_id"])
    if ctx.graph is not None and ctx.graph.values[qid].datatype != DataType.int4:
        ctx.fail("dequantize input is not an int4 tensor")
    if q.dtype != torch.int8 or q.dim() != 2 or s.dim() != 2 or s.dtype not in FLOAT_DTYPES:
        ctx.fail(f"dequantize of {q.dtype}{tuple(q.shape)} with scales {s.dtype}{tuple(s.shape)}")
    (n, k), g = q.shape, s.shape[1]
    if s.shape[0] != n or g == 0 or k % g:
        ctx.fail(f"scales {tuple(s.shape)} do not fit int4 weights {tuple(q.shape)}")
    out = q.reshape(n, g, k // g).float() * s.float().reshape(n, g, 1)  # zero points etc. are ignored
    ctx.set(node["output_id"], out.reshape(n, k).half())  # always float16


KERNELS = {"MPSDequantizePerChannelGroup": dequantize_per_channel_group}
