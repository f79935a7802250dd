"""Check a ``.pte`` before executorch's runtime sees it.

executorch's runtime trusts parts of a program that its verification does not cover: it logs names from
the file (backend ids, operator and method names) through a Python log redirection that aborts the
process on bytes that are not UTF-8, dereferences compile-spec values without checking them, and allocates
whatever its memory plan asks for. :func:`check_program` reads the program flatbuffer with the project's
bounded reader (``serialization/flatbuf.py``: every offset checked, work bounded by the size) and refuses,
with :class:`ProgramFormatError` naming what and where:

- a file that is not an executorch program (identifier ``ET..``), a truncated extended header;
- names that are not UTF-8 or contain control characters (method, operator, backend id, compile-spec key);
- an execution plan without its values, inputs, outputs or chains (the runtime asserts on them), inputs or
  outputs outside the value table;
- a delegate whose payload reference points outside the program's inline data or segments, a compile spec
  without its value, a segment that reaches past the end of the file;
- a memory plan (``non_const_buffer_sizes``) beyond the budget: ``MPS_BACKEND_MAX_PLAN_BYTES``, default
  4 GiB per method (the planned activations and mutable buffers the runtime allocates up front).

Only the program's tables are decoded (no weights, no delegate payloads): cheap also on multi-GB files.
The partial schema below lists the ``program.fbs`` fields in their vtable order (unchanged from
executorch 1.0 to 1.5; later fields are not read).
"""
from __future__ import annotations

import os
import struct
from typing import Any

from mps_backend.serialization.flatbuf import FlatBuffer, compile_schema

DEFAULT_MAX_PLAN_BYTES = 4 << 30
_EXTENDED_HEADER_MAGIC = b"eh00"


class ProgramFormatError(ValueError):
    """A ``.pte`` the runtime must not be given: the message says what is wrong and where."""


def _f(name: str, ftype: str, default: str | None = None) -> dict:
    return {"name": name, "type": ftype, "default": default, "deprecated": False}


_SCHEMA = {
    "enums": {"DataLocation": {"base": "byte", "values": {"INLINE": 0, "SEGMENT": 1}}},
    "unions": {},
    "structs": {},
    "tables": {
        "Program": [_f("version", "uint"), _f("execution_plan", "[ExecutionPlan]"), _f("constant_buffer", "[Opaque]"),
                    _f("backend_delegate_data", "[Opaque]"), _f("segments", "[DataSegment]")],
        "ExecutionPlan": [_f("name", "string"), _f("container_meta_type", "Opaque"), _f("values", "[Opaque]"),
                          _f("inputs", "[int]"), _f("outputs", "[int]"), _f("chains", "[Opaque]"),
                          _f("operators", "[Operator]"), _f("delegates", "[BackendDelegate]"),
                          _f("non_const_buffer_sizes", "[long]")],
        "Operator": [_f("name", "string"), _f("overload", "string")],
        "BackendDelegate": [_f("id", "string"), _f("processed", "BackendDelegateDataReference"),
                            _f("compile_specs", "[CompileSpec]")],
        "BackendDelegateDataReference": [_f("location", "DataLocation", "INLINE"), _f("index", "uint")],
        "CompileSpec": [_f("key", "string"), _f("value", "[ubyte]")],
        "DataSegment": [_f("offset", "ulong"), _f("size", "ulong")],
        "Opaque": [],  # tables the check does not look into
    },
}
_LAYOUTS = compile_schema(_SCHEMA)


def max_plan_bytes() -> int:
    value = os.environ.get("MPS_BACKEND_MAX_PLAN_BYTES")
    return int(value) if value else DEFAULT_MAX_PLAN_BYTES


def _name(fb: FlatBuffer, value: Any, what: str) -> str:
    if value is None:
        raise fb.fail(f"{what} is missing")
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        raise fb.fail(f"{what} {value!r} contains control characters")
    return value


def check_program(data: bytes | bytearray | memoryview) -> None:
    """Raise :class:`ProgramFormatError` if ``data`` is not a program the runtime can be given safely."""
    view = memoryview(data)
    if len(view) < 8 or bytes(view[4:6]) != b"ET":
        raise ProgramFormatError("not an executorch program (no 'ET..' flatbuffer identifier at bytes 4-7)")
    program_size, segment_base = len(view), None
    if bytes(view[8:12]) == _EXTENDED_HEADER_MAGIC:
        if len(view) < 32:  # magic, length, program size, segment base (+ segment data size)
            raise ProgramFormatError("extended header truncated")
        header_len, program_size, segment_base = struct.unpack_from("<IQQ", view, 12)
        if header_len < 24 or not 8 <= program_size <= len(view):
            raise ProgramFormatError(f"extended header: program size {program_size} outside the {len(view)}-byte file")
        if segment_base and segment_base > len(view):
            raise ProgramFormatError(f"extended header: segments start at {segment_base}, past the end of the file "
                                     f"({len(view)} bytes)")
    fb = FlatBuffer(view[:program_size], "program", _LAYOUTS, ProgramFormatError)
    program = fb.table(fb.deref(0, "root offset"), "Program", "program")
    inline = len(program["backend_delegate_data"] or ())
    segments = [fb.table(p, "DataSegment", f"segments[{i}]") for i, p in enumerate(program["segments"] or ())]
    available = len(view) - segment_base if segment_base else 0
    for i, seg in enumerate(segments):
        if seg["offset"] + seg["size"] > available:
            raise ProgramFormatError(f"segments[{i}] ({seg['offset']} + {seg['size']} bytes) reaches past the "
                                     f"{available} bytes of segment data in the file")
    budget = max_plan_bytes()
    for p, pos in enumerate(program["execution_plan"] or ()):
        plan = fb.table(pos, "ExecutionPlan", f"execution_plan[{p}]")
        method = _name(fb, plan["name"], f"execution_plan[{p}].name")
        where = f"method {method!r}"
        for field in ("values", "inputs", "outputs", "chains"):  # executorch asserts (aborts) on a missing one
            if plan[field] is None:
                raise fb.fail(f"{where}: the execution plan has no {field} field")
        n_values = len(plan["values"])
        for field in ("inputs", "outputs"):
            bad = [i for i in plan[field] if not 0 <= i < n_values]
            if bad:
                raise fb.fail(f"{where}: {field} {bad} outside the {n_values} values")
        for i, op_pos in enumerate(plan["operators"] or ()):
            op = fb.table(op_pos, "Operator", f"{where} operators[{i}]")
            _name(fb, op["name"], f"{where} operators[{i}].name")
            if op["overload"] is not None:
                _name(fb, op["overload"], f"{where} operators[{i}].overload")
        for d, d_pos in enumerate(plan["delegates"] or ()):
            delegate = fb.table(d_pos, "BackendDelegate", f"{where} delegates[{d}]")
            backend = _name(fb, delegate["id"], f"{where} delegates[{d}].id")
            if delegate["processed"] is None:
                raise fb.fail(f"{where} delegate {d} ({backend}) has no payload reference")
            ref = fb.table(delegate["processed"], "BackendDelegateDataReference", f"{where} delegates[{d}].processed")
            count = inline if ref["location"] == 0 else len(segments) if ref["location"] == 1 else None
            if count is None:
                raise fb.fail(f"{where} delegate {d} ({backend}): data location {ref['location']} is neither "
                              "INLINE nor SEGMENT")
            if ref["index"] >= count:
                kind = "inline data" if ref["location"] == 0 else "segments"
                raise fb.fail(f"{where} delegate {d} ({backend}): payload index {ref['index']} but the program "
                              f"has {count} {kind}")
            for s, s_pos in enumerate(delegate["compile_specs"] or ()):
                spec = fb.table(s_pos, "CompileSpec", f"{where} delegates[{d}].compile_specs[{s}]")
                key = _name(fb, spec["key"], f"{where} delegate {d} ({backend}) compile_specs[{s}].key")
                if spec["value"] is None:
                    raise fb.fail(f"{where} delegate {d} ({backend}): compile spec {key!r} has no value")
        sizes = plan["non_const_buffer_sizes"] or ()
        if any(s < 0 for s in sizes):
            raise fb.fail(f"{where}: negative memory-plan buffer size in {list(sizes)}")
        total = sum(sizes)
        if total > budget:
            raise ProgramFormatError(
                f"{where}: its memory plan asks for {total / 2**30:.3g} GiB ({list(sizes)} bytes), beyond the "
                f"{budget / 2**30:.3g} GiB budget (MPS_BACKEND_MAX_PLAN_BYTES)")
