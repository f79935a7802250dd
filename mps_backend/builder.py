"""GraphBuilder: all per-lowering state of one ``preprocess`` call.

It owns the value table, the constants (kept as tensors until the writer copies them once
into the blob), the node list and the map from fx nodes to value ids. Lowerings in
``mps_backend.operators`` only talk to a builder:

    x = b.id(node.args[0])                      # value id of an fx argument
    out = b.out(node)                           # new value id for the node's result
    b.emit("MPSReLU", input1_id=x, input2_id=-1, output_id=out)

In fp16 mode the graph computes in float16: float32 constants are converted, user inputs
and outputs get one boundary cast each, and every internal float value is float16.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch.fx import Node as FxNode

from mps_backend.dtypes import mps_dtype
from mps_backend.serialization.model import Graph, Node, Tensor


def fx_val(node: FxNode) -> Any:
    return node.meta.get("val")


class GraphBuilder:
    def __init__(self, use_fp16: bool):
        self.use_fp16 = use_fp16
        self.graph = Graph()
        self.constants: dict[int, torch.Tensor] = {}
        self.ids: dict[FxNode, Any] = {}  # fx node -> value id, or tuple of ids for multi-output nodes
        self._scalars: dict[tuple, int] = {}
        self.current: FxNode | None = None  # the fx node being lowered, for error messages
        self.node_origin: list[FxNode | None] = []  # fx node that emitted each MPS node

    # ---- dtypes -------------------------------------------------------------------------
    def compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The device dtype a value of torch dtype ``dtype`` has inside this graph."""
        if dtype == torch.float32 and self.use_fp16:
            return torch.float16
        return dtype

    def dtype(self, arg: FxNode) -> torch.dtype:
        """Device dtype of an fx tensor argument."""
        return self.compute_dtype(fx_val(arg).dtype)

    # ---- values -------------------------------------------------------------------------
    def new_value(self, dtype: torch.dtype, shape: Iterable[int]) -> int:
        vid = len(self.graph.values)
        self.graph.values.append(Tensor(mps_dtype(dtype), [int(d) for d in shape]))
        return vid

    def id(self, arg: Any) -> int:
        """Value id bound to an fx node argument."""
        vid = self.ids.get(arg)
        if vid is None or isinstance(vid, tuple):
            raise KeyError(f"{arg} has no single value id (lowering {self.current})")
        return vid

    def out(self, node: FxNode | None = None, dtype: torch.dtype | None = None) -> int:
        """A new value id for ``node``'s (single tensor) result, bound to the node."""
        node = node if node is not None else self.current
        val = fx_val(node)
        vid = self.new_value(dtype or self.compute_dtype(val.dtype), val.shape)
        self.ids[node] = vid
        return vid

    def outs(self, node: FxNode, dtypes: Iterable[torch.dtype | None] | None = None) -> tuple[int, ...]:
        """New value ids for each tensor of a multi-output node (read by getitem)."""
        vals = fx_val(node)
        dtypes = list(dtypes) if dtypes is not None else [None] * len(vals)
        ids = tuple(self.new_value(dt or self.compute_dtype(v.dtype), v.shape) for v, dt in zip(vals, dtypes))
        self.ids[node] = ids
        return ids

    def alias(self, node: FxNode, vid: int) -> None:
        """Bind ``node`` to an existing value (ops that are identities on the device)."""
        self.ids[node] = vid

    def constant(self, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
        """A constant of the blob holding ``tensor`` (converted to ``dtype`` or the compute dtype)."""
        target = dtype or self.compute_dtype(tensor.dtype)
        if tensor.dtype != target:
            tensor = tensor.to(target)
        vid = self.new_value(target, tensor.shape)
        self.graph.constant_ids.append(vid)
        self.constants[vid] = tensor.detach()
        return vid

    def scalar(self, value: float | int | bool, dtype: torch.dtype) -> int:
        """A one-element constant of exactly ``dtype`` (bytes and declared dtype agree)."""
        key = (dtype, type(value), value)
        vid = self._scalars.get(key)
        if vid is None:
            vid = self._scalars[key] = self.constant(torch.tensor([value], dtype=dtype), dtype=dtype)
        return vid

    # ---- nodes --------------------------------------------------------------------------
    def emit(self, op: str, min_max: tuple[float, float] | None = None, **fields: Any) -> None:
        self.graph.nodes.append(Node(op, fields, min_max))
        self.node_origin.append(self.current)

    def cast(self, vid: int, dtype: torch.dtype) -> int:
        """A new value holding ``vid`` cast to ``dtype`` (MPSCast writes a fresh id)."""
        t = self.graph.values[vid]
        out = self.new_value(dtype, t.dims)
        self.emit("MPSCast", input1_id=vid, output_id=out, dtype=int(mps_dtype(dtype)))
        return out
