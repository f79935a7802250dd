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
The partial schema is ``serialization/program.py``.
"""
from __future__ import annotations

import os
from typing import Any

from mps_backend.serialization.flatbuf import FlatBuffer
from mps_backend.serialization.program import open_program

DEFAULT_MAX_PLAN_BYTES = 4 << 30


class ProgramFormatError(ValueError):
    """A ``.pte`` the runtime must not be given: the message says what is wrong and where."""


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
    tables = open_program(data, ProgramFormatError)
    fb, program = tables.fb, tables.program
    inline = len(program["backend_delegate_data"] or ())
    segments = [fb.table(p, "DataSegment", f"segments[{i}]") for i, p in enumerate(program["segments"] or ())]
    available = tables.segment_bytes
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
