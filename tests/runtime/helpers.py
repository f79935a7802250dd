"""Build small MP00 graphs with the writer (no lowering code) and run them through the device model.

    out = run_graph("MPSAdd", [a, b], alpha=2.0)                    # one node, inputs -> ids 0..n-1
    g = GraphSpec(); x = g.input(t); y = g.value(DataType.float16, [2]); g.node("MPSCast", ...)
    outs = g.output(y).run([t])

``run_graph`` fills omitted ``input{k}_id`` fields in order from the inputs then the constants, and
omitted ``output_id`` / ``output{k}_id`` fields from fresh output values; every other field is given
by the caller (the writer refuses missing fields).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import torch

from mps_backend.runtime.interpreter import Interpreter
from mps_backend.serialization.model import Blob, DataType, Graph, Header, Node, Tensor, member_fields
from mps_backend.serialization.writer import write_blob

TORCH_TO_DATATYPE = {
    torch.float16: DataType.float16,
    torch.float32: DataType.float32,
    torch.float64: DataType.float64,
    torch.int8: DataType.int8,
    torch.int16: DataType.int16,
    torch.int32: DataType.int32,
    torch.int64: DataType.int64,
    torch.bool: DataType.bool,
    torch.uint8: DataType.uint8,
    torch.bfloat16: DataType.bfloat16,
}


def datatype(t: torch.Tensor) -> DataType:
    return TORCH_TO_DATATYPE[t.dtype]


class GraphSpec:
    """A Graph under construction plus the constant data and the tensors declared as inputs."""

    def __init__(self) -> None:
        self.graph = Graph()
        self.constants: dict[int, Any] = {}

    def value(self, dtype: DataType = DataType.float32, dims: Sequence[int] = (1,)) -> int:
        self.graph.values.append(Tensor(DataType(dtype), list(dims)))
        return len(self.graph.values) - 1

    def input(self, t: torch.Tensor, dtype: DataType | None = None) -> int:
        vid = self.value(dtype if dtype is not None else datatype(t), t.shape)
        self.graph.input_ids.append(vid)
        return vid

    def constant(self, data: torch.Tensor, dtype: DataType | None = None, dims: Sequence[int] | None = None) -> int:
        """A constant holding ``data``'s bytes, declared as ``dtype``/``dims`` (default: data's own)."""
        vid = self.value(dtype if dtype is not None else datatype(data), data.shape if dims is None else dims)
        self.graph.constant_ids.append(vid)
        self.constants[vid] = data.contiguous()
        return vid

    def node(self, op: str, min_max: tuple[float, float] | None = None, **fields) -> "GraphSpec":
        self.graph.nodes.append(Node(op, fields, min_max))
        return self

    def output(self, *vids: int) -> "GraphSpec":
        self.graph.output_ids.extend(vids)
        return self

    def to_bytes(self) -> bytes:
        return write_blob(self.graph, self.constants)

    def blob(self) -> Blob:
        """The written blob paired with this graph (no reader involved)."""
        data = self.to_bytes()
        return Blob(Header.from_bytes(data), self.graph, data)

    def run(self, inputs: Sequence[torch.Tensor], mode: str = "faithful", report: bool = False, decode: bool = False):
        """Execute; ``decode=True`` goes through the bytes and ``read_blob`` instead of the Graph."""
        interp = Interpreter(self.to_bytes() if decode else self.blob(), mode)
        outs, rep = interp.run_with_report(inputs)
        return (outs, rep) if report else outs


_INPUT = re.compile(r"input\d_id$")
_OUTPUT = re.compile(r"output(\d)?_id$")


def one_node(
    op: str,
    inputs: Sequence[torch.Tensor],
    *,
    constants: Sequence[torch.Tensor] = (),
    out_dtype: DataType | None = None,
    out_dims: Sequence[int] | None = None,
    min_max: tuple[float, float] | None = None,
    **fields,
) -> GraphSpec:
    """A one-node graph: inputs are ids 0..n-1, constants follow, then the node's outputs."""
    g = GraphSpec()
    sources = [g.input(t) for t in inputs] + [g.constant(c) for c in constants]
    ref = inputs[0] if inputs else (constants[0] if constants else None)
    dtype = out_dtype if out_dtype is not None else (datatype(ref) if ref is not None else DataType.float32)
    dims = out_dims if out_dims is not None else (tuple(ref.shape) if ref is not None else (1,))
    outs = []
    for name in member_fields(op):
        if name in fields:
            continue
        if _INPUT.match(name) and sources:
            fields[name] = sources.pop(0)
        elif _OUTPUT.match(name):
            fields[name] = g.value(dtype, dims)
            outs.append(fields[name])
    g.node(op, min_max, **fields)
    return g.output(*outs)


def run_graph(
    op: str, inputs: Sequence[torch.Tensor], *, mode: str = "faithful", report: bool = False, decode: bool = False, **kwargs
):
    """Run a one-node graph (see ``one_node``); returns the single output, or the list of outputs when
    the node has several (``(outputs, report)`` with ``report=True``)."""
    g = one_node(op, inputs, **kwargs)
    result = g.run(list(inputs), mode=mode, report=report, decode=decode)
    outs = result[0] if report else result
    single = outs[0] if len(outs) == 1 else outs
    return (single, result[1]) if report else single
