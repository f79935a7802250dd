"""Reductions: mean.dim -> MPSMean with explicit dims (empty dims means no reduction on the
device, semantics §6 #20, so reduce-all is written as every axis)."""
from __future__ import annotations

import torch
from torch.fx import Node

from ._util import arg, is_float, norm_dim, rank, val
from .registry import Lowering

aten = torch.ops.aten


def _mean_check(node: Node):
    if not is_float(node.args[0]):
        return "mean of a non-float tensor"
    dtype = node.kwargs.get("dtype")
    if dtype is not None and dtype != val(node.args[0]).dtype:
        return f"mean with dtype={dtype} (accumulation dtype change)"
    return None


def _mean(node: Node, b) -> None:
    x = node.args[0]
    r = rank(x)
    dims = arg(node, 1, "dim", None)
    dims = list(range(max(r, 1))) if not dims else sorted({norm_dim(d, r) for d in dims})
    b.emit("MPSMean", input1_id=b.id(x), output_id=b.out(node), num_dims=len(dims), dims=dims,
           keep_dims=bool(arg(node, 2, "keepdim", False)))


LOWERINGS = [Lowering((aten.mean.dim, aten.mean.default), _mean, _mean_check)]
