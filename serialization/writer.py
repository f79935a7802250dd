"""MP00 blob writer: flatbuffer built in-process with the generated bindings, no JSON, no flatc.

Layout (docs/architecture.md, format contract 1-2):
    [0:4] zero | [4:8] b"MP00" | [8:16] u64 segment offset | [16:24] u64 segment size
    [24:...] flatbuffer (identifier MP00) | zero padding to 16 | constant segment
Every constant starts on a 16-byte boundary of the segment; the segment is padded to a
multiple of 16 and ends the blob. Constant bytes are copied exactly once, from the caller's
buffers (e.g. a tensor's memory) into the output.

The output is one ``bytes`` object allocated once at its final size and filled in place (the C API's
``PyBytes_FromStringAndSize(NULL, n)`` idiom, through ctypes): no list of parts and no second copy.
(No transparent-huge-page advice: with the kernel's "madvise" defrag mode a fault may stall seconds in
direct compaction on a busy machine; 4 KiB page faults cost the same as for any fresh bytes object.) A constant may
also be a deferred source with ``nbytes`` and ``write_into(memoryview)``
(e.g. the builder's float32 -> float16 conversion, done straight into the blob); a constants mapping
with a ``release(vid)`` method has each entry released once its bytes are in the blob, so a caller's
temporary copies are freed while the blob fills.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
from typing import Any, Callable, Mapping

import flatbuffers
import numpy as np

from .model import CONSTANT_ALIGN, HEADER_SIZE, MAGIC, SEGMENT_ALIGN, UNION_MEMBERS, UNION_TAGS, Graph, Header, Node, table_fields

_GEN = "mps_backend.serialization.generated.mpsgraph."
_INT_VECTOR = np.dtype("<i4")


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def _bytes_of(buf: Any) -> memoryview:
    """A flat byte view of ``buf`` (bytes, bytearray, memoryview, numpy array, torch tensor)."""
    if hasattr(buf, "untyped_storage") and hasattr(buf, "view"):  # torch.Tensor, without importing torch
        # flat first: a "contiguous" tensor may still carry a non-unit stride on a size-1 dim
        # (e.g. the transpose of a [1, K] weight), which view(uint8) refuses
        t = (buf if buf.is_contiguous() else buf.contiguous()).reshape(-1)
        import torch  # noqa: PLC0415  (only reached with a tensor in hand)

        return memoryview(t.view(torch.uint8).numpy()).cast("B")
    if isinstance(buf, np.ndarray):
        return np.ascontiguousarray(buf).data.cast("B")  # .data: the array's buffer, as memoryview(array)
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
        values.append(
            w.table(
                "MPSTensor",
                {
                    "datatype": int(t.datatype),
                    "num_dims": len(t.dims),
                    "dims": t.dims,
                    "constant_buffer_size": t.constant_buffer_size,
                    "constant_buffer": empty_buffer,
                    "segment_offset": t.segment_offset,
                },
                f"value {vid}",
            )
        )
    seg = w.table("DataSegment", {"offset": graph.constant_segment[0], "size": graph.constant_segment[1]}, "constant_segment")
    root = w.table(
        "MPSGraph",
        {
            "version": graph.version,
            "mps_nodes": w.offset_vector(nodes),
            "mps_values": w.offset_vector(values),
            "input_ids": graph.input_ids,
            "output_ids": graph.output_ids,
            "constant_ids": graph.constant_ids,
            "graph_type": int(graph.graph_type),
            "constant_segment": seg,
        },
        "graph",
    )
    b.Finish(root, file_identifier=MAGIC)
    return bytes(b.Output())


def _nbytes(src: Any) -> int:
    """Bytes a constant source occupies in the blob, without materializing it."""
    if hasattr(src, "write_into"):  # deferred source
        return int(src.nbytes)
    if hasattr(src, "untyped_storage") and hasattr(src, "element_size"):  # torch.Tensor
        return int(src.numel()) * int(src.element_size())
    if isinstance(src, np.ndarray):
        return int(src.nbytes)
    return memoryview(src).nbytes


#: below this the plain bytes(bytearray) path is as fast and simpler
_IN_PLACE_MIN = 1 << 20


@functools.cache
def _bytes_api() -> tuple[Callable, Callable] | None:
    """ctypes handles of PyBytes_FromStringAndSize / PyBytes_AsString, or None where the CPython C API
    is not available."""
    try:
        new = ctypes.pythonapi.PyBytes_FromStringAndSize
        addr = ctypes.pythonapi.PyBytes_AsString
    except AttributeError:  # not CPython
        return None
    new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t)
    addr.restype, addr.argtypes = ctypes.c_void_p, (ctypes.py_object,)
    return new, addr


class _Output:
    """The blob under construction: a fresh ``bytes`` of its final size, written once through a view.

    ``PyBytes_FromStringAndSize(NULL, n)`` returns an uninitialized bytes object that its creator may
    fill before anyone else sees it (the C API's documented idiom); every byte is written below
    (padding explicitly zeroed). Without the C API: a bytearray, converted to bytes at the end.
    """

    def __init__(self, size: int):
        api = _bytes_api() if size >= _IN_PLACE_MIN else None
        if api is None:
            self._obj, self._buf = None, bytearray(size)
            self.view = memoryview(self._buf)
            return
        new, addr_of = api
        self._obj = new(None, size)
        self.view = memoryview((ctypes.c_char * size).from_address(addr_of(self._obj))).cast("B")

    def finish(self) -> bytes:
        self.view.release()
        return self._obj if self._obj is not None else bytes(self._buf)


#: bytes of a constant copied into the blob at once when the table can hand back parts of its source
COPY_PART_BYTES = 64 << 20


def write_blob(graph: Graph, constants: Mapping[int, Any]) -> bytes:
    """Serialize ``graph`` with ``constants`` (value id -> bytes-like, tensor or deferred source) into
    one MP00 blob.

    Fills in each constant's ``segment_offset``/``constant_buffer_size`` and the graph's
    ``constant_segment``. Each constant's bytes are copied once, into the returned blob.
    """
    missing = [vid for vid in graph.constant_ids if vid not in constants]
    if missing:
        raise ValueError(f"no data for constant value ids {missing}")
    source = getattr(constants, "source", None) or constants.__getitem__
    release = getattr(constants, "release", None)
    release_part = getattr(constants, "release_part", None)
    segment_size = layout_constants(graph, {vid: _nbytes(source(vid)) for vid in graph.constant_ids})
    graph.constant_segment = (0, segment_size)
    fb = build_flatbuffer(graph)
    segment_offset = _align(HEADER_SIZE + len(fb), SEGMENT_ALIGN)
    out = _Output(segment_offset + segment_size)
    view = out.view
    view[:HEADER_SIZE] = Header(segment_offset, segment_size).to_bytes()
    view[HEADER_SIZE : HEADER_SIZE + len(fb)] = fb
    zero = HEADER_SIZE + len(fb)  # first byte not yet written
    for vid in graph.constant_ids:
        t = graph.values[vid]
        start = segment_offset + t.segment_offset
        end = start + t.constant_buffer_size
        view[zero:start] = bytes(start - zero)
        src = source(vid)
        if hasattr(src, "write_into"):
            src.write_into(view[start:end])
        else:
            data = _bytes_of(src)
            if data.nbytes != t.constant_buffer_size:
                raise ValueError(f"constant value {vid}: {data.nbytes} bytes, laid out for {t.constant_buffer_size}")
            # a large constant a part at a time, each part's source pages handed back once copied (a
            # weight mapped from a file is then never resident as a whole, e.g. an embedding table)
            step = COPY_PART_BYTES if release_part is not None else max(1, data.nbytes)
            for lo in range(0, data.nbytes, step):
                hi = min(lo + step, data.nbytes)
                view[start + lo : start + hi] = data[lo:hi]
                if release_part is not None:
                    release_part(src, lo, hi)
            del data
        del src
        if release is not None:
            release(vid)
        zero = end
    view[zero:] = bytes(len(view) - zero)
    return out.finish()
