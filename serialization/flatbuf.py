"""Bounds-checked, schema-driven flatbuffer decoding shared by the validating readers
(``reader.py`` for MP00 blobs, ``mobile.py`` for PyTorch Mobile ``PTMF`` modules).

The flatc Python accessors do no bounds checks; this decoder does, driven by a schema literal of
``generated/schema_info.py``: vtable slot = field position, union fields take two slots (type tag,
then value). Malformed input raises the error class the reader passes in, with a message naming
what and where; the work done is bounded by the buffer size (see ``FlatBuffer.spend``).
"""

from __future__ import annotations

import struct
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple

SCALAR_FORMATS = {
    "bool": "<B",
    "byte": "<b",
    "ubyte": "<B",
    "int8": "<b",
    "uint8": "<B",
    "short": "<h",
    "ushort": "<H",
    "int16": "<h",
    "uint16": "<H",
    "int": "<i",
    "uint": "<I",
    "int32": "<i",
    "uint32": "<I",
    "float": "<f",
    "float32": "<f",
    "long": "<q",
    "ulong": "<Q",
    "int64": "<q",
    "uint64": "<Q",
    "double": "<d",
    "float64": "<d",
}
FLOAT_TYPES = frozenset({"float", "float32", "double", "float64"})


class Field(NamedTuple):
    name: str
    #: scalar | bool | string | scalar_vector | string_vector | table_vector | table | union | struct
    #: | struct_vector
    kind: str
    slot: int  # vtable slot (a union's type tag; its value is in slot + 1)
    fmt: str = ""  # struct format of a scalar ("<i") or of a scalar vector's elements ("i"; "?" for bool)
    default: Any = None
    type: str = ""  # the struct of a struct / struct_vector field
    align: int = 1  # required alignment of a vector's elements (``force_align``, struct alignment)


class StructLayout(NamedTuple):
    """A struct's fixed layout (computed by scripts/generate_bindings.py) as one ``struct.Struct``
    with explicit padding, e.g. Instruction ``<bxHi`` (8 bytes, 4-aligned)."""

    name: str
    size: int
    align: int
    codec: struct.Struct
    names: tuple[str, ...]
    bools: frozenset[str]


class Layouts(NamedTuple):
    """Decoding recipes of every table and struct of one schema literal."""

    tables: Mapping[str, tuple[Field, ...]]
    structs: Mapping[str, StructLayout]


def _default(base: str, text: str | None, enum: Mapping[str, int] | None) -> Any:
    if base == "bool":
        return text == "true"
    if enum is not None:
        return enum[text] if text is not None and text in enum else int(text or 0)
    if base in FLOAT_TYPES:
        return float(text or 0.0)
    return int(text or 0)


def _struct_layout(name: str, spec: Mapping[str, Any], enums: Mapping[str, Any]) -> StructLayout:
    fmt, pos, names, bools = "<", 0, [], set()
    for f in spec["fields"]:
        base = enums[f["type"]]["base"] if f["type"] in enums else f["type"]
        if base not in SCALAR_FORMATS:
            raise ValueError(f"struct {name}: nested struct field {f['name']} is not supported")
        fmt += "x" * (f["offset"] - pos) + SCALAR_FORMATS[base][1]
        pos = f["offset"] + struct.calcsize("<" + SCALAR_FORMATS[base][1])
        names.append(f["name"])
        if base == "bool":
            bools.add(f["name"])
    fmt += "x" * (spec["size"] - pos)
    codec = struct.Struct(fmt)
    assert codec.size == spec["size"], (name, fmt)
    return StructLayout(name, spec["size"], spec["align"], codec, tuple(names), frozenset(bools))


def _table_layout(fields: list[dict], schema: Mapping[str, Any]) -> tuple[Field, ...]:
    """Decoding recipe of one table: its fields with kind, vtable slot, format and default."""
    enums, tables, unions = schema["enums"], schema["tables"], schema["unions"]
    structs = schema.get("structs", {})
    out, slot = [], 0
    for f in fields:
        name, ftype = f["name"], f["type"]
        force_align = int(f.get("attributes", {}).get("force_align", 1))
        if ftype in unions:
            out.append(Field(name, "union", slot, "<B"))
            slot += 2
            continue
        if ftype == "string":
            out.append(Field(name, "string", slot))
        elif ftype.startswith("[") and ftype[1:-1] in tables:
            out.append(Field(name, "table_vector", slot))
        elif ftype == "[string]":
            out.append(Field(name, "string_vector", slot))
        elif ftype.startswith("[") and ftype[1:-1] in structs:
            elem = ftype[1:-1]
            out.append(Field(name, "struct_vector", slot, type=elem, align=max(force_align, structs[elem]["align"])))
        elif ftype.startswith("["):
            elem = ftype[1:-1]
            base = enums[elem]["base"] if elem in enums else elem
            fmt = "?" if base == "bool" else SCALAR_FORMATS[base][1:]
            out.append(Field(name, "scalar_vector", slot, fmt, align=force_align))
        elif ftype in tables:
            out.append(Field(name, "table", slot))
        elif ftype in structs:
            out.append(Field(name, "struct", slot, type=ftype, align=structs[ftype]["align"]))
        else:
            enum = enums.get(ftype)
            base = enum["base"] if enum else ftype
            default = _default(base, f["default"], enum["values"] if enum else None)
            kind = "bool" if base == "bool" else "scalar"
            out.append(Field(name, kind, slot, SCALAR_FORMATS[base], default))
        slot += 1
    return tuple(out)


def compile_schema(schema: Mapping[str, Any]) -> Layouts:
    """The (immutable) decoding recipes of a ``schema_info`` literal."""
    structs = {name: _struct_layout(name, spec, schema["enums"]) for name, spec in schema.get("structs", {}).items()}
    tables = {name: _table_layout(fields, schema) for name, fields in schema["tables"].items()}
    return Layouts(MappingProxyType(tables), MappingProxyType(structs))


class FlatBuffer:
    """Bounds-checked reads from one flatbuffer; positions are relative to its first byte.

    Every table, struct and vector element decoded costs one unit of a budget proportional to
    the buffer size, so shared sub-objects cannot make decoding super-linear.
    """

    def __init__(
        self,
        buf: memoryview,
        where: str,
        layouts: Layouts,
        error: type[Exception],
        raw_strings: frozenset[str] = frozenset(),
        align_empty_vectors: bool = True,
    ) -> None:
        self.buf = buf
        self.size = len(buf)
        self.where = where
        self.layouts = layouts
        self.error = error
        #: "Table.field" of strings returned as bytes, not decoded (they may hold binary data)
        self.raw_strings = raw_strings
        #: whether an empty vector's (absent) elements must be aligned too; torch's mobile writer
        #: leaves empty ``[long]`` vectors 4-aligned (flatbuffers' verifier only checks the length)
        self.align_empty_vectors = align_empty_vectors
        self.budget = self.size + 64
        self.absent: list[str] = []  # "<where>: <table>.<field>" of every field not in the buffer

    def fail(self, msg: str) -> Exception:
        return self.error(f"{self.where}: {msg}")

    def spend(self, units: int, what: str) -> None:
        self.budget -= units
        if self.budget < 0:
            raise self.fail(
                f"{what}: more objects referenced than the {self.size}-byte flatbuffer "
                "can hold (shared or overlapping references)"
            )

    def check(self, pos: int, nbytes: int, align: int, what: str) -> None:
        if pos < 0 or pos + nbytes > self.size:
            raise self.fail(f"{what} at offset {pos} (+{nbytes} bytes) outside the flatbuffer ({self.size} bytes)")
        if pos % align:
            raise self.fail(f"{what} at offset {pos} is not {align}-byte aligned")

    def scalar(self, fmt: str, pos: int, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.check(pos, n, n, what)
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def deref(self, pos: int, what: str) -> int:
        """Follow the uoffset stored at ``pos``."""
        return pos + self.scalar("<I", pos, what)

    def vector(self, pos: int, elem_size: int, what: str) -> tuple[int, int]:
        """(start of elements, length) of the vector at ``pos``."""
        length = self.scalar("<I", pos, f"{what} length")
        self.check(pos + 4, length * elem_size, 1, f"{what} ({length} elements)")
        return pos + 4, length

    def string(self, pos: int, what: str, raw: bool = False) -> str | bytes:
        start, length = self.vector(pos, 1, what)
        self.check(start + length, 1, 1, f"{what} terminator")
        if self.buf[start + length] != 0:
            raise self.fail(f"{what}: string of {length} bytes is not NUL-terminated")
        if raw:
            return bytes(self.buf[start : start + length])
        try:
            return bytes(self.buf[start : start + length]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what}: not UTF-8 ({e.reason} at byte {e.start})") from None

    def struct(self, pos: int, name: str, what: str) -> dict[str, Any]:
        """Decode the struct ``name`` stored at ``pos`` (inline or, for a union member, out of line)."""
        layout = self.layouts.structs[name]
        what = f"{what}: {name}"
        self.spend(1, what)
        self.check(pos, layout.size, layout.align, f"{what} struct")
        return self._struct_values(layout, layout.codec.unpack_from(self.buf, pos))

    @staticmethod
    def _struct_values(layout: StructLayout, values: tuple) -> dict[str, Any]:
        out = dict(zip(layout.names, values))
        for name in layout.bools:
            out[name] = bool(out[name])
        return out

    def table(self, pos: int, table: str, what: str) -> dict[str, Any]:
        """Decode the table at ``pos``: scalars (default when absent), strings, scalar vectors as
        lists (``[ubyte]`` as a memoryview), strings as str (bytes if listed in ``raw_strings``),
        string vectors as lists of str, structs as dicts, struct vectors as lists of dicts,
        sub-tables and table vectors as positions, unions as (tag, position); absent references
        are None."""
        what = f"{what}: {table}"
        self.spend(1, what)
        self.check(pos, 4, 4, f"{what} table")
        vt = pos - self.scalar("<i", pos, f"{what} vtable offset")
        self.check(vt, 4, 2, f"{what} vtable")
        vt_size, tbl_size = struct.unpack_from("<HH", self.buf, vt)
        if vt_size < 4 or vt_size % 2:
            raise self.fail(f"{what}: vtable size {vt_size} is invalid")
        self.check(vt, vt_size, 2, f"{what} vtable")
        if tbl_size < 4:
            raise self.fail(f"{what}: table size {tbl_size} is invalid")
        self.check(pos, tbl_size, 4, f"{what} table")
        n_slots = (vt_size - 4) // 2

        def field_pos(slot: int, nbytes: int, name: str) -> int | None:
            if slot >= n_slots:
                return None
            off = struct.unpack_from("<H", self.buf, vt + 4 + 2 * slot)[0]
            if off == 0:
                return None
            if off < 4 or off + nbytes > tbl_size:
                raise self.fail(f"{what}.{name}: field offset {off} outside the {tbl_size}-byte table")
            return pos + off

        out: dict[str, Any] = {}
        for f in self.layouts.tables[table]:
            fwhere = f"{what}.{f.name}"
            if f.kind in ("scalar", "bool"):
                p = field_pos(f.slot, struct.calcsize(f.fmt), f.name)
                if p is None:
                    self.absent.append(fwhere)
                    out[f.name] = f.default
                else:
                    v = self.scalar(f.fmt, p, fwhere)
                    out[f.name] = bool(v) if f.kind == "bool" else v
            elif f.kind == "union":
                p = field_pos(f.slot, 1, f.name)
                tag = 0 if p is None else self.scalar("<B", p, fwhere + " type")
                p = field_pos(f.slot + 1, 4, f.name)
                out[f.name] = (tag, None if p is None else self.deref(p, fwhere))
            elif f.kind == "struct":  # stored inline in the table
                p = field_pos(f.slot, self.layouts.structs[f.type].size, f.name)
                if p is None:
                    self.absent.append(fwhere)
                out[f.name] = None if p is None else self.struct(p, f.type, fwhere)
            else:
                p = field_pos(f.slot, 4, f.name)
                target = None if p is None else self.deref(p, fwhere)
                if target is None and f.kind != "table":  # an absent sub-table is just "none"
                    self.absent.append(fwhere)
                if target is None or f.kind == "table":
                    out[f.name] = target
                elif f.kind == "string":
                    out[f.name] = self.string(target, fwhere, f"{table}.{f.name}" in self.raw_strings)
                elif f.kind == "table_vector":
                    start, n = self.vector(target, 4, fwhere)
                    self.spend(n, fwhere)
                    out[f.name] = [self.deref(start + 4 * i, f"{fwhere}[{i}]") for i in range(n)]
                elif f.kind == "string_vector":
                    start, n = self.vector(target, 4, fwhere)
                    self.spend(n, fwhere)
                    out[f.name] = [self.string(self.deref(start + 4 * i, f"{fwhere}[{i}]"), f"{fwhere}[{i}]") for i in range(n)]
                elif f.kind == "struct_vector":
                    layout = self.layouts.structs[f.type]
                    start, n = self.vector(target, layout.size, fwhere)
                    if n or self.align_empty_vectors:
                        self.check(start, 0, f.align, fwhere)
                    self.spend(n, fwhere)
                    out[f.name] = [
                        self._struct_values(layout, v)
                        for v in layout.codec.iter_unpack(self.buf[start : start + n * layout.size])
                    ]
                else:  # scalar vector
                    size = struct.calcsize(f.fmt)
                    start, n = self.vector(target, size, fwhere)
                    if f.fmt == "B":  # byte storage: not unpacked (tensor data)
                        if f.align > 1 and (n or self.align_empty_vectors):
                            self.check(start, 0, f.align, fwhere)
                        out[f.name] = self.buf[start : start + n]
                    else:
                        if n or self.align_empty_vectors:
                            self.check(start, 0, size, fwhere)
                        self.spend(n, fwhere)
                        out[f.name] = list(struct.unpack_from(f"<{n}{f.fmt}", self.buf, start))
        return out
