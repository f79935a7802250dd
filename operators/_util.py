"""Small helpers shared by the op families (argument access, dims, scalars)."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.dtypes import FLOAT_DTYPES


def arg(node: Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``name`` of ``node``, given positionally at ``index`` or by keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def val(x: Any) -> Any:
    """meta['val'] of an fx node (a FakeTensor, or a tuple of them)."""
    return x.meta.get("val") if isinstance(x, Node) else x


def shape(x: Node) -> list[int]:
    return [int(d) for d in val(x).shape]


def rank(x: Node) -> int:
    return val(x).dim()


def norm_dim(d: int, r: int) -> int:
    """A dim in [0, r) (``r`` = rank; a rank-0 tensor counts as rank 1 on the device)."""
    r = max(r, 1)
    if not -r <= d < r:
        raise ValueError(f"dim {d} out of range for rank {r}")
    return d % r


def is_float(x: Node) -> bool:
    return val(x).dtype in FLOAT_DTYPES


def scalar_dtype(tensor: Node, scalar: Any) -> torch.dtype:
    """torch's result dtype of ``tensor (op) scalar`` (type promotion with a Python scalar)."""
    t = val(tensor).dtype
    if isinstance(scalar, bool):
        return t
    if isinstance(scalar, int):
        return torch.int64 if t == torch.bool else t
    return t if t.is_floating_point else torch.get_default_dtype()


def operand(b: GraphBuilder, node: Node, x: Any, dtype: torch.dtype) -> int:
    """Value id of a tensor argument, or a scalar constant of device dtype ``dtype``."""
    if isinstance(x, Node):
        return b.id(x)
    return b.scalar(x, b.result_dtype(node, dtype))


def clamp_index(i, size: int, default: int) -> int:
    """A slice bound as torch normalises it: None -> default, negative counts from the end, then
    clamped into [0, size]."""
    if i is None:
        return default
    i = int(i)
    if i < 0:
        i += size
    return min(max(i, 0), size)


def per_dim(values: Any, n: int) -> list[int] | None:
    """An int-list argument that the schema takes as one value per dim or one value for all ``n``
    dims (convolution's stride, padding, dilation, output_padding: a length-1 list means that value
    for every spatial dim, as ATen's ``expand_param_if_needed``), as ``n`` ints; None for any other
    length or a non-constant entry."""
    values = [values] if isinstance(values, int) else list(values)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    if len(values) == 1:
        return values * n
    return values if len(values) == n else None
