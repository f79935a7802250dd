"""Validating MP00 blob reader, written by hand (the flatc accessors do no bounds checks).

``read_blob(data)`` decodes one blob into the dataclasses of ``model.py`` and checks everything
the MPS delegate runtime relies on (docs/architecture.md format contract, docs/device-semantics.md §1-§4).
Any violation raises ``MPSFormatError`` naming what and where; no other exception escapes for
malformed input, and the work done is bounded by the blob size.

The flatbuffer decoder (``flatbuf.py``, shared with the PyTorch Mobile reader) is generic, driven
by ``schema_info``: vtable slot = field position, union fields take two slots (type tag, then
value). Absent fields get the schema default, except the vectors/strings the runtime dereferences
without a null check, which must be present.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .device_facts import (
    DEVICE_DATATYPES,
    IGNORED_IDS,
    NOT_DISPATCHED,
    NULLABLE,
    OPTIONAL_INPUT_ENTRIES,
    OPTIONAL_INPUTS,
    OUTPUT_FIELDS,
)
from .errors import MPSFormatError
from .flatbuf import Field, FlatBuffer, compile_schema
from .model import (
    ELEMENT_SIZE,
    HEADER_SIZE,
    MAGIC,
    SCHEMA,
    SEGMENT_ALIGN,
    UNION_MEMBERS,
    UNION_NAMES,
    Blob,
    DataType,
    Graph,
    Header,
    Node,
    OpType,
    Tensor,
    expected_nbytes,
)

# ----------------------------------------------------------------------------------------------
# Schema-driven field layouts (computed once from the literal schema; immutable afterwards)

_MP00 = compile_schema(SCHEMA)
_LAYOUTS: Mapping[str, tuple[Field, ...]] = _MP00.tables

#: a value's byte size (element count times element size) must be below this: the runtime computes
#: both as int64 (NSInteger / executorch's ssize_t), so a larger one wraps; the device model's own,
#: much smaller, per-tensor budget is checked when a blob is run (runtime/core.py)
MAX_VALUE_BYTES = 1 << 63

# ----------------------------------------------------------------------------------------------
# Runtime facts the graph checks rely on: serialization/device_facts.py

# ----------------------------------------------------------------------------------------------
# Bounds-checked flatbuffer access


class _FlatBuffer(FlatBuffer):
    """Bounds-checked reads from one MP00 flatbuffer (``flatbuf.FlatBuffer`` with the MP00 schema);
    violations raise MPSFormatError."""

    def __init__(self, buf: memoryview, where: str) -> None:
        super().__init__(buf, where, _MP00, MPSFormatError)


# ----------------------------------------------------------------------------------------------
# Blob decoding


def read_header(data: bytes | bytearray | memoryview) -> Header:
    """Check the 24-byte header, the flatbuffer identifier and the segment placement."""
    n = len(data)
    if n < HEADER_SIZE + 8:
        raise MPSFormatError(f"blob is {n} bytes, too short for the {HEADER_SIZE}-byte header and a flatbuffer")
    if bytes(data[0:4]) != b"\0\0\0\0":
        raise MPSFormatError(f"header bytes 0-3 are {bytes(data[0:4]).hex()}, expected zeros")
    header = Header.from_bytes(data)  # checks the magic at bytes 4-7
    ident = bytes(data[HEADER_SIZE + 4 : HEADER_SIZE + 8])
    if ident != MAGIC:
        raise MPSFormatError(f"flatbuffer identifier at bytes 28-31 is {ident!r}, expected {MAGIC!r}")
    off, size = header.segment_offset, header.segment_size
    if not HEADER_SIZE + 8 <= off <= n:
        raise MPSFormatError(
            f"header: segment offset {off} outside the flatbuffer area [{HEADER_SIZE + 8}, {n}] of the {n}-byte blob"
        )
    if off % SEGMENT_ALIGN:
        raise MPSFormatError(f"header: segment offset {off} is not {SEGMENT_ALIGN}-byte aligned")
    if off + size != n:
        raise MPSFormatError(f"header: segment [{off}, {off}+{size}) does not end the {n}-byte blob")
    return header


def _read_tensor(fb: _FlatBuffer, pos: int, vid: int) -> Tensor:
    where = f"value {vid}"
    t = fb.table(pos, "MPSTensor", where)
    try:
        datatype = DataType(t["datatype"])
    except ValueError:
        raise MPSFormatError(f"{where}: datatype {t['datatype']} is not an MPSDataType") from None
    num_dims, dims = t["num_dims"], t["dims"]
    if num_dims < 0:
        raise MPSFormatError(f"{where}: num_dims {num_dims} is negative")
    if dims is None:
        if num_dims:
            raise MPSFormatError(f"{where}: num_dims {num_dims} but no dims vector")
        dims = []
    if len(dims) < num_dims:
        raise MPSFormatError(f"{where}: num_dims {num_dims} but only {len(dims)} dims")
    dims = dims[:num_dims]  # the device uses the first num_dims entries
    if any(d < 0 for d in dims):
        raise MPSFormatError(f"{where}: negative dimension in dims {dims}")
    nbytes = math.prod(dims) * ELEMENT_SIZE.get(datatype, 1)
    if nbytes >= MAX_VALUE_BYTES:
        raise MPSFormatError(
            f"{where}: {datatype.name} {dims} is {nbytes} bytes, not below 2**63 (the runtime's int64 "
            "element counts and byte sizes would overflow)"
        )
    if t["constant_buffer"] is not None:  # deprecated inline storage: never read, bounds-checked
        fb.table(t["constant_buffer"], "Buffer", f"{where} constant_buffer")
    return Tensor(datatype, dims, t["constant_buffer_size"], t["segment_offset"])


def _read_node(fb: _FlatBuffer, pos: int, index: int) -> Node:
    raw = fb.table(pos, "MPSNode", f"node {index}")
    tag, body = raw["mpsnode_union"]
    op = UNION_NAMES.get(tag)
    if op is None:
        kind = "NONE" if tag == 0 else "unknown"
        raise MPSFormatError(f"node {index}: union type {tag} ({kind}) is not an MPSNodeUnion member")
    where = f"node {index} ({op})"
    if op in NOT_DISPATCHED:
        raise MPSFormatError(f"{where}: the runtime has no kernel for {op} (NotImplemented at init)")
    if body is None:
        raise MPSFormatError(f"{where}: union value missing")
    table = UNION_MEMBERS[op]
    fields = fb.table(body, table, where)
    for f in _LAYOUTS[table]:
        if fields[f.name] is None and f.kind in ("string", "scalar_vector") and (op, f.name) not in NULLABLE:
            raise MPSFormatError(f"{where}: {f.name} missing (the runtime reads it without a null check)")
        if fields[f.name] is None and (op, f.name) in NULLABLE and f.kind == "scalar_vector":
            fields[f.name] = []
    min_max = None
    if raw["min_max"] is not None:
        mm = fb.table(raw["min_max"], "MPSMinMax", f"{where} min_max")
        min_max = (mm["min_value"], mm["max_value"])
    return Node(op, fields, min_max)


def _required(value: Any, what: str) -> Any:
    if value is None:
        raise MPSFormatError(f"graph: {what} missing (the runtime reads it without a null check)")
    return value


def _decode(data: bytes | bytearray | memoryview) -> tuple[Blob, list[str]]:
    # a memoryview (of a memory-mapped file, say) is read in place: constants are not copied
    raw = data.cast("B") if isinstance(data, memoryview) else bytes(data)
    header = read_header(raw)
    fb = _FlatBuffer(memoryview(raw)[HEADER_SIZE : header.segment_offset], "flatbuffer")
    root = fb.deref(0, "root offset")
    if root < 8:
        raise MPSFormatError(f"flatbuffer: root table offset {root} overlaps the root offset/identifier")
    g = fb.table(root, "MPSGraph", "graph")
    if g["graph_type"] != OpType.mps_graph:
        name = "metal_kernel" if g["graph_type"] == OpType.metal_kernel else "unknown"
        raise MPSFormatError(
            f"graph: graph_type {g['graph_type']} ({name}); only mps_graph (0) runs (every metal_kernel graph aborts at init)"
        )
    values = [_read_tensor(fb, p, i) for i, p in enumerate(_required(g["mps_values"], "mps_values"))]
    nodes = [_read_node(fb, p, i) for i, p in enumerate(_required(g["mps_nodes"], "mps_nodes"))]
    segment = (0, 0)
    if g["constant_segment"] is not None:  # never read by the runtime
        s = fb.table(g["constant_segment"], "DataSegment", "graph constant_segment")
        segment = (s["offset"], s["size"])
    graph = Graph(
        nodes=nodes,
        values=values,
        input_ids=_required(g["input_ids"], "input_ids"),
        output_ids=_required(g["output_ids"], "output_ids"),
        constant_ids=_required(g["constant_ids"], "constant_ids"),
        graph_type=g["graph_type"],
        version=g["version"],
        constant_segment=segment,
    )
    validate_graph(graph, header)
    return Blob(header, graph, raw), fb.absent


def read_blob(data: bytes | bytearray | memoryview) -> Blob:
    """Decode and validate one MP00 blob; raises MPSFormatError on any violation."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"read_blob expects bytes, bytearray or memoryview, not {type(data).__name__}")
    return _decode(data)[0]


def absent_fields(data: bytes | bytearray | memoryview) -> list[str]:
    """Validate ``data`` like ``read_blob`` and list the fields it leaves out (they decode to the
    schema default), e.g. ``"node 4 (MPSMaxPool2DWithIndices): MPSPooling2D.ceil_mode"``.
    Sub-tables (``min_max``, ``constant_segment``, ``constant_buffer``) are optional and not listed."""
    return _decode(data)[1]


# ----------------------------------------------------------------------------------------------
# Graph checks


def _check_ids(ids: list[int], n: int, what: str) -> None:
    for k, v in enumerate(ids):
        if not 0 <= v < n:
            raise MPSFormatError(f"graph: {what}[{k}] = {v} out of range ({n} values)")


def _check_constants(graph: Graph, header: Header) -> None:
    for vid in graph.constant_ids:
        t = graph.values[vid]
        where = f"constant value {vid}"
        if t.datatype not in DEVICE_DATATYPES:
            raise MPSFormatError(f"{where}: dtype {t.datatype.name} is not supported on the device")
        size, off = t.constant_buffer_size, t.segment_offset
        if size <= 0:
            raise MPSFormatError(f"{where}: constant_buffer_size is 0 (the device aborts)")
        if off + size > header.segment_size:
            raise MPSFormatError(f"{where}: bytes [{off}, {off + size}) outside the {header.segment_size}-byte constant segment")
        want = expected_nbytes(t.datatype, t.dims)
        if size != want:
            raise MPSFormatError(f"{where}: constant_buffer_size {size} but {t.datatype.name} {t.dims} takes {want} bytes")


def _bounds_defined(node: Node) -> bool:
    """MPSClamp sets its output only when min_max has a finite bound (semantics §5.8)."""
    if node.min_max is None:
        return False
    lo, hi = node.min_max
    return lo != -math.inf or hi != math.inf


_POOLS = ("MPSMaxPool2DWithIndices", "MPSAvgPool2D")
_CONVS = ("MPSConv2D", "MPSDepthwiseConv2D")


def _check_window(graph: Graph, node: Node, where: str) -> None:
    """Static bounds of a pooling or convolution node's parameters (semantics §5.12, §5.14), so that a
    hostile value is refused here rather than by the device model at run time:

    - strides and dilations >= 1, paddings >= 0, pooling kernels >= 1 (the device divides by the
      stride; the device model refuses anything else when it runs);
    - a pooling padding at most ``span * stride`` on each side (``span = dilation * (kernel - 1) + 1``,
      the window's extent): the most any writer emits (torch accepts a padding of at most ``span / 2``;
      a ceil-mode writer puts ``padding * stride`` at the bottom and right, ours the ceil tail, below
      the stride, after the padding); beyond it whole windows lie in the padding, with nothing to take
      a maximum or mean of (a max-pool padding of 2**30 on a 4 x 4 input was a 24 GiB tensor);
    - a window (a pooling's kernel, a 4-D convolution's weight, dilated) no larger than the padded input
      (torch refuses it at export; the device model's floor/ceil rule needs it). A convolution's padding
      has no static bound (torch accepts any): the device model's per-tensor budget applies when it runs;
    - the padded input's byte size below :data:`MAX_VALUE_BYTES` (int64 sizes), like any value."""
    f = node.fields
    if node.op in _POOLS:
        k = (f["kernel_height"], f["kernel_width"])
        s = (f["stride_height"], f["stride_width"])
        d = (f["dilation_height"], f["dilation_width"])
    else:  # the kernel is the weight's (checked against the padded input below when both are 4-D)
        k, s, d = (1, 1), (f["stride_y"], f["stride_x"]), (f["dilation_y"], f["dilation_x"])
    pads = {p: f[f"padding_{p}"] for p in ("top", "bottom", "left", "right")}
    if min(k + s + d) < 1 or min(pads.values()) < 0:
        kernel = f"kernel {list(k)}, " if node.op in _POOLS else ""
        raise MPSFormatError(
            f"{where}: {kernel}stride {list(s)}, dilation {list(d)}, padding {pads}: strides, dilations"
            + (" and kernels" if kernel else "")
            + " must be at least 1, paddings at least 0"
        )
    src = f.get("input1_id")
    dims = list(graph.values[src].dims) if isinstance(src, int) and 0 <= src < len(graph.values) else []
    weight = f.get("input2_id") if node.op in _CONVS else None
    if isinstance(weight, int) and 0 <= weight < len(graph.values) and len(graph.values[weight].dims) == 4:
        wd = graph.values[weight].dims
        k = (wd[2], wd[3])
    span = [d[i] * (k[i] - 1) + 1 for i in (0, 1)]
    for axis, names in ((0, ("top", "bottom")), (1, ("left", "right"))):
        for name in names if node.op in _POOLS else ():
            if pads[name] > span[axis] * s[axis]:
                raise MPSFormatError(
                    f"{where}: padding_{name} {pads[name]} beyond the window's span {span[axis]} times the stride "
                    f"{s[axis]} (whole windows in the padding: no writer emits it)"
                )
        if len(dims) == 4 and span[axis] > dims[2 + axis] + pads[names[0]] + pads[names[1]]:
            raise MPSFormatError(
                f"{where}: a window of span {span[axis]} on an axis of {dims[2 + axis]} padded by "
                f"{pads[names[0]]} + {pads[names[1]]}"
            )
    if len(dims) >= 2 and isinstance(src, int):
        padded = [*dims[:-2], dims[-2] + pads["top"] + pads["bottom"], dims[-1] + pads["left"] + pads["right"]]
        nbytes = math.prod(padded) * ELEMENT_SIZE.get(graph.values[src].datatype, 8)
        if nbytes >= MAX_VALUE_BYTES:
            raise MPSFormatError(f"{where}: its input padded to {padded} takes {nbytes} bytes, beyond int64 sizes")


def validate_graph(graph: Graph, header: Header) -> None:
    """The graph-level checks of ``read_blob`` (ids, constants, define-before-use)."""
    n = len(graph.values)
    _check_ids(graph.input_ids, n, "input_ids")
    _check_ids(graph.output_ids, n, "output_ids")
    _check_ids(graph.constant_ids, n, "constant_ids")
    if graph.input_ids != list(range(len(graph.input_ids))):
        raise MPSFormatError(
            f"graph: input_ids {graph.input_ids} are not 0..n-1 (the runtime binds input buffer i to value id i)"
        )
    for vid in graph.input_ids:
        dt = graph.values[vid].datatype
        if dt not in DEVICE_DATATYPES:
            raise MPSFormatError(f"input value {vid}: dtype {dt.name} is not supported on the device")
    _check_constants(graph, header)

    defined = set(graph.input_ids) | set(graph.constant_ids)
    empty: set[int] = set()  # ids bound to "no tensor" (zero-element MPSFull, semantics §5.7)
    for i, node in enumerate(graph.nodes):
        where = f"node {i} ({node.op})"
        outputs: list[int] = []
        for name, value in node.fields.items():
            if not (name.endswith("_id") or name.endswith("_ids")):
                continue
            entries = value if isinstance(value, list) else [value]
            for k, v in enumerate(entries):
                label = f"{name}[{k}]" if isinstance(value, list) else name
                if (node.op, name) in IGNORED_IDS:
                    if v != -1 and not 0 <= v < n:
                        raise MPSFormatError(f"{where}: {label} {v} out of range ({n} values)")
                    continue
                if v == -1 and ((node.op, name) in OPTIONAL_INPUTS or (node.op, name) in OPTIONAL_INPUT_ENTRIES):
                    continue
                if not 0 <= v < n:
                    raise MPSFormatError(f"{where}: {label} {v} out of range ({n} values)")
                if name in OUTPUT_FIELDS:
                    outputs.append(v)
                elif v not in defined and not (v in empty and node.op == "MPSCat"):
                    state = "has no tensor (zero-element MPSFull)" if v in empty else "is used before it is defined"
                    raise MPSFormatError(f"{where}: {label} {v} {state}")
        if node.op in _POOLS or node.op in _CONVS:
            _check_window(graph, node, where)
        if node.op == "MPSClamp" and not _bounds_defined(node):
            outputs = []  # neither bound: the runtime never sets the output
        if node.op == "MPSFull" and 0 in node.fields["shape"]:
            empty.update(outputs)
            defined.difference_update(outputs)
        else:
            defined.update(outputs)
            empty.difference_update(outputs)
    for k, vid in enumerate(graph.output_ids):
        if vid not in defined:
            raise MPSFormatError(f"graph: output_ids[{k}] = {vid} is never defined")
