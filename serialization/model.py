"""Plain dataclasses for an MP00 blob: what the writer takes and the reader returns.

A node is its union member name plus *all* fields of that member's table (the writer
refuses a node with a missing field: schema defaults are traps, see docs/architecture.md, format contract 4).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import MPSFormatError
from .generated.schema_info import MPSGRAPH

#: the MP00 schema as a literal (``generated/schema_info.py``): nested dicts/lists of str, int, bool, None
SCHEMA: dict[str, Any] = MPSGRAPH
MAGIC = SCHEMA["file_identifier"].encode()  # b"MP00"
HEADER_SIZE = 24
SEGMENT_ALIGN = 16
CONSTANT_ALIGN = 16


class DataType(enum.IntEnum):
    """MPSDataType of schema.fbs (names without the mps_data_type_ prefix)."""

    invalid = 0
    float16 = 1
    float32 = 2
    float64 = 3
    bfloat16 = 4
    int4 = 5
    int8 = 6
    int16 = 7
    int32 = 8
    int64 = 9
    uint4 = 10
    uint8 = 11
    uint16 = 12
    uint32 = 13
    uint64 = 14
    bool = 15
    complex_float16 = 16
    complex_float32 = 17


class OpType(enum.IntEnum):
    """OpType of schema.fbs (the graph_type of an MPSGraph)."""

    mps_graph = 0
    metal_kernel = 1


def _check_against_schema(cls: type[enum.IntEnum], schema_enum: str, prefix: str = "") -> None:
    """The enums are spelled out for the type checker; the schema stays the authority."""
    expected = {k.removeprefix(prefix): v for k, v in SCHEMA["enums"][schema_enum]["values"].items()}
    if {m.name: m.value for m in cls} != expected:
        raise RuntimeError(
            f"serialization/model.py: {cls.__name__} differs from enum {schema_enum} of schema.fbs "
            f"{expected}; update it with the schema"
        )


_check_against_schema(DataType, "MPSDataType", "mps_data_type_")
_check_against_schema(OpType, "OpType")

#: union member name -> table name, in union order (type tag = index + 1)
UNION_MEMBERS: dict[str, str] = dict(SCHEMA["unions"]["MPSNodeUnion"])
UNION_TAGS: dict[str, int] = {name: i + 1 for i, name in enumerate(UNION_MEMBERS)}
UNION_NAMES: dict[int, str] = {v: k for k, v in UNION_TAGS.items()}


def table_fields(table: str) -> list[dict]:
    """The fields of a schema table in slot order (dicts with name, type, default, deprecated)."""
    return SCHEMA["tables"][table]


def member_fields(op: str) -> list[str]:
    """Field names of the table of union member ``op`` (e.g. 'MPSAdd' -> input1_id, ..., alpha)."""
    return [f["name"] for f in SCHEMA["tables"][UNION_MEMBERS[op]] if not f["deprecated"]]


#: bytes per element of each dtype on the wire (int4 is handled separately: two per byte)
ELEMENT_SIZE: dict[DataType, int] = {
    DataType.float16: 2,
    DataType.float32: 4,
    DataType.float64: 8,
    DataType.bfloat16: 2,
    DataType.int8: 1,
    DataType.int16: 2,
    DataType.int32: 4,
    DataType.int64: 8,
    DataType.uint8: 1,
    DataType.uint16: 2,
    DataType.uint32: 4,
    DataType.uint64: 8,
    DataType.bool: 1,
    DataType.complex_float16: 4,
    DataType.complex_float32: 8,
}


def expected_nbytes(datatype: DataType, dims: list[int] | tuple[int, ...]) -> int | None:
    """Bytes a dense constant of this dtype and shape occupies, None when the dtype has no size."""
    numel = 1
    for d in dims:
        numel *= d
    if datatype in (DataType.int4, DataType.uint4):
        return (numel + 1) // 2
    size = ELEMENT_SIZE.get(datatype)
    return None if size is None else numel * size


@dataclass
class Tensor:
    """One entry of ``mps_values``. ``num_dims`` is written as ``len(dims)``."""

    datatype: DataType
    dims: list[int]
    constant_buffer_size: int = 0
    segment_offset: int = 0

    @property
    def num_dims(self) -> int:
        return len(self.dims)

    @property
    def device_shape(self) -> tuple[int, ...]:
        """Shape on the device: rank 0 becomes [1] (semantics §3.2)."""
        return tuple(self.dims) if self.dims else (1,)


def _field_ok(check: str, v: Any) -> bool:
    if check == "int":
        return isinstance(v, int)
    if check == "float":
        return isinstance(v, (int, float))
    if check == "bool":
        return isinstance(v, bool)
    if check == "[int]":
        return type(v) is list and all(isinstance(e, int) for e in v)
    return isinstance(v, str) or (v is None and check == "str?")


_CHECK_NAMES = {"int": "int", "float": "float", "bool": "bool", "[int]": "a list of int", "str": "str", "str?": "str or None"}


class NodeFields:
    """Base of the typed node kinds (``generated/nodes.py``, one class per union member): an instance
    is one node's fields, built with keyword arguments, so a missing or unknown field is a TypeError
    naming the member and the field where the node is built; each field's value is checked against
    the schema type here (``int`` for ids, ``list`` of int for vectors, ...)."""

    __slots__ = ()
    #: the union member (empty on the table classes, which are not node kinds)
    KIND: ClassVar[str] = ""
    TABLE: ClassVar[str] = ""
    #: (field name, check) in slot order; check is int, float, bool, [int], str or str? (str or None)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __post_init__(self) -> None:
        if not self.KIND:
            raise TypeError(f"{type(self).__name__} is the table {self.TABLE}, not a node kind: build one of its members")
        for name, check in self.FIELDS:
            v = getattr(self, name)
            if not _field_ok(check, v):
                raise TypeError(f"{self.KIND}.{name} must be {_CHECK_NAMES[check]}, got {type(v).__name__} {v!r}")

    def fields(self) -> dict[str, Any]:
        """The fields in slot order (what :class:`Node` holds)."""
        return {name: getattr(self, name) for name, _ in self.FIELDS}


@dataclass
class Node:
    """One ``MPSNode``: union member name, every field of its table, optional clamp bounds."""

    op: str
    fields: dict[str, Any]
    min_max: tuple[float, float] | None = None

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


@dataclass
class Graph:
    """The ``MPSGraph`` root table."""

    nodes: list[Node] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    constant_ids: list[int] = field(default_factory=list)
    graph_type: int = 0
    version: str = "1"
    constant_segment: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Header:
    """The 24-byte extended header in front of the flatbuffer (docs/architecture.md, format contract 1)."""

    segment_offset: int
    segment_size: int

    SIZE = HEADER_SIZE

    def to_bytes(self) -> bytes:
        return b"\0\0\0\0" + MAGIC + self.segment_offset.to_bytes(8, "little") + self.segment_size.to_bytes(8, "little")

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> "Header":
        if len(data) < HEADER_SIZE:
            raise MPSFormatError(f"blob is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
        if bytes(data[4:8]) != MAGIC:
            raise MPSFormatError(f"header magic at bytes 4-7 is {bytes(data[4:8])!r}, expected {MAGIC!r}")
        return cls(int.from_bytes(data[8:16], "little"), int.from_bytes(data[16:24], "little"))


@dataclass
class Blob:
    """A decoded blob: header, graph, and the raw bytes the constants live in (``bytes``, or the
    ``memoryview`` it was read from)."""

    header: Header
    graph: Graph
    data: bytes | memoryview

    def constant_bytes(self, value_id: int) -> memoryview:
        t = self.graph.values[value_id]
        start = self.header.segment_offset + t.segment_offset
        return memoryview(self.data)[start : start + t.constant_buffer_size]
