"""The tables of an ExecuTorch program (``.pte``) that this project reads, with its bounded reader.

A partial ``program.fbs``: only the fields read here, in their vtable order (unchanged from executorch
1.0 to 1.5; later fields are not read), decoded by ``flatbuf.FlatBuffer`` (every offset checked, work
bounded by the size). Nothing is copied: weights and delegate payloads stay slices of the caller's buffer,
so a multi-GB file mapped into memory is read only where its tables are.

File layout: the program flatbuffer (identifier ``ET..`` at bytes 4-7), optionally an extended header at
bytes 8.. (``eh00``, its length, the program size, the offset where segment data starts), then the
segments (``Program.segments``: offset and size relative to that base).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from .flatbuf import FlatBuffer, compile_schema

EXTENDED_HEADER_MAGIC = b"eh00"
INLINE, SEGMENT = 0, 1  # DataLocation
#: union KernelTypes: the EValue kinds by type tag (0 is NONE)
EVALUE_KINDS = (
    "NONE",
    "Null",
    "Int",
    "Bool",
    "Double",
    "Tensor",
    "String",
    "IntList",
    "DoubleList",
    "BoolList",
    "TensorList",
    "OptionalTensorList",
)
KERNEL_CALL = 1  # union InstructionArguments: KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall


def _f(name: str, ftype: str, default: str | None = None) -> dict:
    return {"name": name, "type": ftype, "default": default, "deprecated": False}


_SCHEMA = {
    "enums": {"DataLocation": {"base": "byte", "values": {"INLINE": INLINE, "SEGMENT": SEGMENT}}},
    "unions": {"KernelTypes": {}, "InstructionArguments": {}},
    "structs": {},
    "tables": {
        "Program": [
            _f("version", "uint"),
            _f("execution_plan", "[ExecutionPlan]"),
            _f("constant_buffer", "[Opaque]"),
            _f("backend_delegate_data", "[BackendDelegateInlineData]"),
            _f("segments", "[DataSegment]"),
        ],
        "ExecutionPlan": [
            _f("name", "string"),
            _f("container_meta_type", "Opaque"),
            _f("values", "[EValue]"),
            _f("inputs", "[int]"),
            _f("outputs", "[int]"),
            _f("chains", "[Chain]"),
            _f("operators", "[Operator]"),
            _f("delegates", "[BackendDelegate]"),
            _f("non_const_buffer_sizes", "[long]"),
        ],
        "EValue": [_f("val", "KernelTypes")],
        "Chain": [
            _f("inputs", "[int]"),
            _f("outputs", "[int]"),
            _f("instructions", "[Instruction]"),
            _f("stacktrace", "[Opaque]"),
        ],
        "Instruction": [_f("instr_args", "InstructionArguments")],
        "KernelCall": [_f("op_index", "int"), _f("args", "[int]")],
        "Operator": [_f("name", "string"), _f("overload", "string")],
        "BackendDelegate": [
            _f("id", "string"),
            _f("processed", "BackendDelegateDataReference"),
            _f("compile_specs", "[CompileSpec]"),
        ],
        "BackendDelegateDataReference": [_f("location", "DataLocation", "INLINE"), _f("index", "uint")],
        "BackendDelegateInlineData": [_f("data", "[ubyte]")],
        "CompileSpec": [_f("key", "string"), _f("value", "[ubyte]")],
        "DataSegment": [_f("offset", "ulong"), _f("size", "ulong")],
        "Opaque": [],  # tables not looked into
    },
}
LAYOUTS = compile_schema(_SCHEMA)


@dataclass
class ProgramTables:
    """The decoded root of a program: ``fb`` reads further tables, ``program`` is the ``Program`` table."""

    view: memoryview
    fb: FlatBuffer
    program: dict[str, Any]
    segment_base: int | None  # where segment data starts in the file (extended header), None without one

    @property
    def segment_bytes(self) -> int:
        return len(self.view) - self.segment_base if self.segment_base else 0

    def segment(self, index: int, what: str, error: type[Exception]) -> memoryview:
        """The bytes of segment ``index`` (a slice of the file, not a copy)."""
        segments = self.program["segments"] or ()
        if not 0 <= index < len(segments):
            raise error(f"{what}: segment {index} but the program has {len(segments)} segments")
        seg = self.fb.table(segments[index], "DataSegment", f"segments[{index}]")
        if self.segment_base is None or seg["offset"] + seg["size"] > self.segment_bytes:
            raise error(
                f"{what}: segment {index} ({seg['offset']} + {seg['size']} bytes) reaches past the "
                f"{self.segment_bytes} bytes of segment data in the file"
            )
        start = self.segment_base + seg["offset"]
        return self.view[start : start + seg["size"]]


def open_program(data: bytes | bytearray | memoryview, error: type[Exception]) -> ProgramTables:
    """Check the identifier and extended header and decode the root table; ``error`` is raised on any
    violation (its message says what and where)."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if len(view) < 8 or bytes(view[4:6]) != b"ET":
        raise error("not an executorch program (no 'ET..' flatbuffer identifier at bytes 4-7)")
    if not bytes(view[6:8]).isdigit():  # the runtime logs all four bytes when they are not its own 'ET12'
        raise error(
            f"not an executorch program: flatbuffer identifier {bytes(view[4:8])!r} at bytes 4-7 is not "
            "'ET' and a two-digit schema version"
        )
    program_size, segment_base = len(view), None
    if bytes(view[8:12]) == EXTENDED_HEADER_MAGIC:
        if len(view) < 32:  # magic, length, program size, segment base (+ segment data size)
            raise error("extended header truncated")
        header_len, program_size, segment_base = struct.unpack_from("<IQQ", view, 12)
        if header_len < 24 or not 8 <= program_size <= len(view):
            raise error(f"extended header: program size {program_size} outside the {len(view)}-byte file")
        if segment_base and segment_base > len(view):
            raise error(f"extended header: segments start at {segment_base}, past the end of the file ({len(view)} bytes)")
    fb = FlatBuffer(view[:program_size], "program", LAYOUTS, error)
    program = fb.table(fb.deref(0, "root offset"), "Program", "program")
    return ProgramTables(view, fb, program, segment_base or None)


@dataclass(frozen=True)
class Delegate:
    index: int  # position in program order (plans in order, each plan's delegates in order), every backend
    backend_id: str
    payload: memoryview  # the processed bytes: a slice of the program's buffer
    compile_specs: dict[str, bytes]


def delegates(tables: ProgramTables, error: type[Exception]) -> list[Delegate]:
    """Every delegate of every execution plan, with its payload (inline or in a segment)."""
    fb, program = tables.fb, tables.program
    inline = program["backend_delegate_data"] or ()
    out: list[Delegate] = []
    for p, plan_pos in enumerate(program["execution_plan"] or ()):
        plan = fb.table(plan_pos, "ExecutionPlan", f"execution_plan[{p}]")
        for d_pos in plan["delegates"] or ():
            where = f"delegate {len(out)}"
            delegate = fb.table(d_pos, "BackendDelegate", where)
            backend = delegate["id"]
            if backend is None:
                raise error(f"{where}: no backend id")
            where = f"{where} ({backend})"
            if delegate["processed"] is None:
                raise error(f"{where}: processed data not found (no payload reference)")
            ref = fb.table(delegate["processed"], "BackendDelegateDataReference", f"{where} processed")
            if ref["location"] == INLINE:
                if not 0 <= ref["index"] < len(inline):
                    raise error(f"{where}: processed data index {ref['index']} out of range ({len(inline)} inline entries)")
                data = fb.table(inline[ref["index"]], "BackendDelegateInlineData", f"{where} inline data")["data"]
                if data is None:
                    raise error(f"{where}: processed data not found (inline entry {ref['index']} is empty)")
                payload = memoryview(data)
            elif ref["location"] == SEGMENT:
                payload = tables.segment(ref["index"], where, error)
            else:
                raise error(f"{where}: data location {ref['location']} is neither INLINE nor SEGMENT")
            specs = {}
            for s, s_pos in enumerate(delegate["compile_specs"] or ()):
                spec = fb.table(s_pos, "CompileSpec", f"{where} compile_specs[{s}]")
                if spec["key"] is None or spec["value"] is None:
                    raise error(f"{where}: compile spec {s} has no key or no value")
                specs[spec["key"]] = bytes(spec["value"])
            out.append(Delegate(len(out), backend, payload, specs))
    return out
