"""MP00 blob writer: flatbuffer built in-process with the generated bindings, no JSON, no flatc.

Layout (design.md, format contract 1-2):
    [0:4] zero | [4:8] b"MP00" | [8:16] u64 segment offset | [16:24] u64 segment size
    [24:...] flatbuffer (identifier MP00) | zero padding to 16 | constant segment
Every constant starts on a 16-byte boundary of the segment; the segment is padded to a
multiple of 16 and ends the blob. Constant bytes are copied exactly once, from the caller's
buffers (e.g. a tensor's memory) into the output.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping

import flatbuffers
import numpy as np

from .model import (CONSTANT_ALIGN, HEADER_SIZE, MAGIC, SEGMENT_ALIGN, UNION_MEMBERS, UNION_TAGS,
                    Graph, Header, Node, table_fields)

_GEN = "mps_backend.serialization.generated.mpsgraph."
_INT_VECTOR = np.dtype("<i4")


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def _bytes_of(buf: Any) -> memoryview:
    """A flat byte view of ``buf`` (bytes, bytearray, memoryview, numpy array, torch tensor)."""
    if hasattr(buf, "untyped_storage") and hasattr(buf, "view"):  # torch.Tensor, without importing torch
        t = buf if buf.is_contiguous() else buf.contiguous()
        if t.dim() == 0:
            t = t.reshape(1)
        import torch  # noqa: PLC0415  (only reached with a tensor in hand)

        return memoryview(t.view(torch.uint8).numpy()).cast("B")
    if isinstance(buf, np.ndarray):
        return memoryview(np.ascontiguousarray(buf)).cast("B")
    return memoryview(buf).cast("B")


class _FlatWriter:
    """Per-call state: the flatbuffers builder and the binding modules it uses."""

    def __init__(self) -> None:
        self.b = flatbuffers.Builder(4096)
        self.b.ForceDefaults(True)  # every scalar field is written, default or not
        self._mods: dict[str, Any] = {}

    def mod(self, table: str) -> Any:
        m = self._mods.get(table)
        if m is None:
            m = self._mods[table] = importlib.import_module(_GEN + table)
        return m

    def int_vector(self, values) -> int:
        return self.b.CreateNumpyVector(np.asarray(list(values), dtype=_INT_VECTOR))

    def offset_vector(self, offsets: list[int]) -> int:
        self.b.StartVector(4, len(offsets), 4)
        for off in reversed(offsets):
            self.b.PrependUOffsetTRelative(off)
        return self.b.EndVector()

    def table(self, table: str, values: Mapping[str, Any], where: str) -> int:
        """Write one table; non-scalar fields are created first, then every field is added."""
        mod = self.mod(table)
        prepared: list[tuple[str, Any]] = []
        for f in table_fields(table):
            name, ftype = f["name"], f["type"]
            if f["deprecated"]:
                continue
            if name not in values:
                raise ValueError(f"{where}: field {table}.{name} missing (every field is written explicitly)")
            v = values[name]
            if v is None:
                if ftype == "string":
                    continue  # an explicitly absent string (MPSDiv rounding_mode: no mode)
                raise ValueError(f"{where}: field {table}.{name} is None")
            if ftype == "string":
                v = self.b.CreateString(str(v))
            elif ftype == "[int]":
                v = self.int_vector(v)
            # other vectors and sub-tables arrive as offsets the caller already wrote
            prepared.append((name, v))
        mod.Start(self.b)
        for name, v in prepared:
            getattr(mod, "Add" + _camel(name))(self.b, v)
        return mod.End(self.b)


def _node(w: _FlatWriter, node: Node, index: int) -> int:
    where = f"node {index} ({node.op})"
    table = UNION_MEMBERS.get(node.op)
    if table is None:
        raise ValueError(f"{where}: {node.op!r} is not a member of MPSNodeUnion")
    extra = set(node.fields) - {f["name"] for f in table_fields(table)}
    if extra:
        raise ValueError(f"{where}: unknown fields {sorted(extra)} for table {table}")
    body = w.table(table, node.fields, where)
    min_max = None
    if node.min_max is not None:
        lo, hi = node.min_max
        min_max = w.table("MPSMinMax", {"min_value": float(lo), "max_value": float(hi)}, where)
    mod = w.mod("MPSNode")
    mod.Start(w.b)
    mod.AddMpsnodeUnionType(w.b, UNION_TAGS[node.op])
    mod.AddMpsnodeUnion(w.b, body)
    if min_max is not None:
        mod.AddMinMax(w.b, min_max)
    return mod.End(w.b)


def layout_constants(graph: Graph, sizes: Mapping[int, int]) -> int:
    """Assign ``segment_offset``/``constant_buffer_size`` to each constant; return the segment size."""
    offset = 0
    for vid in graph.constant_ids:
        size = sizes[vid]
        if size <= 0:
            raise ValueError(f"constant value {vid} has {size} bytes; the device aborts on empty constants")
        t = graph.values[vid]
        t.segment_offset = offset
        t.constant_buffer_size = size
        offset = _align(offset + size, CONSTANT_ALIGN)
    return _align(offset, SEGMENT_ALIGN)


def build_flatbuffer(graph: Graph) -> bytes:
    """The MPSGraph flatbuffer (identifier MP00) of ``graph`` as it stands."""
    w = _FlatWriter()
    b = w.b
    nodes = [_node(w, n, i) for i, n in enumerate(graph.nodes)]
    buf_mod = w.mod("Buffer")
    empty_storage = b.CreateNumpyVector(np.zeros(0, dtype=np.uint8))
    buf_mod.Start(b)
    buf_mod.AddStorage(b, empty_storage)
    empty_buffer = buf_mod.End(b)
    values = []
    for vid, t in enumerate(graph.values):
        values.append(w.table("MPSTensor", {
            "datatype": int(t.datatype), "num_dims": len(t.dims), "dims": t.dims,
            "constant_buffer_size": t.constant_buffer_size, "constant_buffer": empty_buffer,
            "segment_offset": t.segment_offset}, f"value {vid}"))
    seg = w.table("DataSegment", {"offset": graph.constant_segment[0], "size": graph.constant_segment[1]},
                  "constant_segment")
    root = w.table("MPSGraph", {
        "version": graph.version,
        "mps_nodes": w.offset_vector(nodes),
        "mps_values": w.offset_vector(values),
        "input_ids": graph.input_ids,
        "output_ids": graph.output_ids,
        "constant_ids": graph.constant_ids,
        "graph_type": int(graph.graph_type),
        "constant_segment": seg}, "graph")
    b.Finish(root, file_identifier=MAGIC)
    return bytes(b.Output())


def write_blob(graph: Graph, constants: Mapping[int, Any]) -> bytes:
    """Serialize ``graph`` with ``constants`` (value id -> bytes-like or tensor) into one MP00 blob.

    Fills in each constant's ``segment_offset``/``constant_buffer_size`` and the graph's
    ``constant_segment``. Each constant's bytes are copied once, into the returned blob.
    """
    missing = [vid for vid in graph.constant_ids if vid not in constants]
    if missing:
        raise ValueError(f"no data for constant value ids {missing}")
    views = {vid: _bytes_of(constants[vid]) for vid in graph.constant_ids}
    segment_size = layout_constants(graph, {vid: v.nbytes for vid, v in views.items()})
    graph.constant_segment = (0, segment_size)
    fb = build_flatbuffer(graph)
    segment_offset = _align(HEADER_SIZE + len(fb), SEGMENT_ALIGN)
    parts: list[Any] = [Header(segment_offset, segment_size).to_bytes(), fb,
                        bytes(segment_offset - HEADER_SIZE - len(fb))]
    pos = 0
    for vid in graph.constant_ids:
        t = graph.values[vid]
        if t.segment_offset > pos:
            parts.append(bytes(t.segment_offset - pos))
        parts.append(views[vid])
        pos = t.segment_offset + t.constant_buffer_size
    parts.append(bytes(segment_size - pos))
    return b"".join(parts)
