"""Check a ``.pte`` before executorch's runtime sees it.

executorch's runtime trusts parts of a program that its verification does not cover: it logs names from
the file (backend ids, operator and method names) through a Python log redirection that aborts the
process on bytes that are not UTF-8, dereferences compile-spec values without checking them, and allocates
whatever its memory plan asks for. :func:`check_program` reads the program flatbuffer with the project's
bounded reader (``serialization/flatbuf.py``: every offset checked, work bounded by the size) and refuses,
with :class:`ProgramFormatError` naming what and where:

- a file that is not an executorch program (identifier ``ET`` and two digits: the runtime logs it as text
  when it is not its own), a truncated extended header;
- names that are not UTF-8 or contain control characters (method, operator, backend id, compile-spec key);
- an execution plan without its values, inputs, outputs, chains or memory plan (the runtime asserts on them), inputs or
  outputs outside the value table;
- a delegate whose payload reference points outside the program's inline data or segments, a compile spec
  without its value, a segment that reaches past the end of the file;
- a kernel call whose operator or argument values are out of range, that passes fewer arguments than the
  operator's schema has, or whose argument holds another kind of value than the schema's type (executorch's
  kernel wrappers unbox them unchecked: ``EValue::toInt`` of a Tensor aborts the process);
- a tensor value that is neither constant, planned (``allocation_info``), external nor a method input or
  output (executorch leaves it a null pointer: the first kernel touching it crashes);
- a memory plan (``non_const_buffer_sizes``) at or beyond the budget: ``MPS_BACKEND_MAX_PLAN_BYTES``,
  default 4 GiB per method, exclusive (the planned activations and mutable buffers the runtime allocates
  up front).

Only the program's tables are decoded (no weights, no delegate payloads): cheap also on multi-GB files.
The partial schema is ``serialization/program.py``.
"""

from __future__ import annotations

import re
from typing import Any

from mps_backend.config import env_bytes
from mps_backend.errors import MPSBackendError
from mps_backend.serialization import program as _program
from mps_backend.serialization.flatbuf import FlatBuffer, compile_schema
from mps_backend.serialization.program import EVALUE_KINDS, KERNEL_CALL, open_program

DEFAULT_MAX_PLAN_BYTES = 4 << 30
TENSOR_TAG = 5  # KernelTypes.Tensor


def _tensor_layouts() -> Any:
    """The program schema with the ``Tensor`` table (the memory-plan fields read here) added."""
    f = _program._f
    schema = {**_program._SCHEMA, "tables": dict(_program._SCHEMA["tables"])}
    # the Program fields executorch's loader reads beyond the partial schema's (its Minimal verification, as
    # the bundled-program loader uses, follows these offsets unchecked: one flipped byte of
    # constant_segment's offset was a SIGSEGV)
    schema["tables"]["Program"] = [
        *schema["tables"]["Program"],
        f("constant_segment", "SubsegmentOffsets"),
        f("mutable_data_segments", "[SubsegmentOffsets]"),
        f("named_data", "[NamedData]"),
    ]
    schema["tables"]["SubsegmentOffsets"] = [f("segment_index", "uint"), f("offsets", "[ulong]")]
    schema["tables"]["NamedData"] = [f("key", "string"), f("segment_index", "uint")]
    schema["tables"]["Tensor"] = [
        f("scalar_type", "byte"),
        f("storage_offset", "int"),
        f("sizes", "[int]"),
        f("dim_order", "[ubyte]"),
        f("requires_grad", "bool"),
        f("data_buffer_idx", "uint"),
        f("allocation_info", "Opaque"),
        f("layout", "byte"),
        f("shape_dynamism", "byte"),
        f("extra_tensor_info", "Opaque"),
    ]
    return compile_schema(schema)


_LAYOUTS = _tensor_layouts()


class ProgramFormatError(MPSBackendError, ValueError):
    """A ``.pte`` the runtime must not be given: the message says what is wrong and where."""


def max_plan_bytes() -> int:
    return env_bytes("MPS_BACKEND_MAX_PLAN_BYTES", DEFAULT_MAX_PLAN_BYTES)


def _name(fb: FlatBuffer, value: Any, what: str) -> str:
    if value is None:
        raise fb.fail(f"{what} is missing")
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        raise fb.fail(f"{what} {value!r} contains control characters")
    return value


#: EValue kinds a kernel argument of a schema type may hold (executorch's unboxing asserts on any other:
#: ``EValue::toInt`` of a Bool aborts the process); a ``T?`` argument may also be Null. Types not listed
#: are not checked.
_ACCEPTS = {
    "Tensor": {"Tensor"},
    "int": {"Int"},
    "SymInt": {"Int"},
    "ScalarType": {"Int"},
    "MemoryFormat": {"Int"},
    "Layout": {"Int"},
    "bool": {"Bool"},
    "float": {"Double"},
    "Scalar": {"Int", "Double", "Bool"},
    "str": {"String"},
    "int[]": {"IntList"},
    "SymInt[]": {"IntList"},
    "float[]": {"DoubleList"},
    "bool[]": {"BoolList"},
    "Tensor[]": {"TensorList"},
    "Tensor?[]": {"OptionalTensorList"},
}


def _argument_kinds(name: str, overload: str) -> list[tuple[str, set[str]]] | None:
    """(argument name, EValue kinds it accepts) per schema argument of operator ``name.overload``; None
    for an operator torch does not know here (its arguments are then not checked)."""
    import torch  # noqa: PLC0415

    try:
        schema = torch._C._get_schema(name, overload)
    except RuntimeError:
        return None
    kinds = []
    for arg in schema.arguments:
        text = re.sub(r"\[\d+\]", "[]", str(arg.type))  # int[2] -> int[]
        optional = text.endswith("?") and not text.endswith("?[]")
        accepted = _ACCEPTS.get(text[:-1] if optional else text)
        kinds.append((arg.name, (accepted | {"Null"}) if accepted and optional else accepted or set()))
    return kinds


def _check_kernel_calls(fb: FlatBuffer, plan: dict, operators: list[tuple[str, str]], where: str) -> None:
    """Every kernel call names an operator of the plan and values of the plan, and each argument holds
    the kind of value the operator's schema declares (the runtime unboxes them unchecked)."""
    values = plan["values"]
    kinds: dict[int, str] = {}

    def kind(v: int) -> str:
        if v not in kinds:
            tag, _ = fb.table(values[v], "EValue", f"{where} values[{v}]")["val"]
            kinds[v] = EVALUE_KINDS[tag] if tag < len(EVALUE_KINDS) else f"type tag {tag}"
        return kinds[v]

    schemas: dict[int, list | None] = {}
    for c, chain_pos in enumerate(plan["chains"]):
        chain = fb.table(chain_pos, "Chain", f"{where} chains[{c}]")
        for k, instr_pos in enumerate(chain["instructions"] or ()):
            tag, body = fb.table(instr_pos, "Instruction", f"{where} chains[{c}].instructions[{k}]")["instr_args"]
            if tag != KERNEL_CALL or body is None:
                continue
            at = f"{where} instruction {k} (kernel call)"
            call = fb.table(body, "KernelCall", at)
            op, args = call["op_index"], list(call["args"] or ())
            if not 0 <= op < len(operators):
                raise fb.fail(f"{at}: operator index {op} outside the {len(operators)} operators")
            bad = [a for a in args if not 0 <= a < len(values)]
            if bad:
                raise fb.fail(f"{at}: argument value(s) {bad} outside the {len(values)} values")
            if op not in schemas:
                schemas[op] = _argument_kinds(*operators[op])
            expected = schemas[op]
            if expected is None:
                continue
            name = f"{operators[op][0]}.{operators[op][1] or 'default'}"
            if len(args) < len(expected):
                raise fb.fail(f"{at}: {name} takes {len(expected)} arguments, the call passes {len(args)}")
            for (arg_name, accepted), v in zip(expected, args):
                if accepted and kind(v) not in accepted:
                    raise fb.fail(
                        f"{at}: {name} argument {arg_name!r} is value {v}, a {kind(v)} (the kernel "
                        f"reads {' or '.join(sorted(accepted))})"
                    )


def _check_planned_tensors(fb: FlatBuffer, plan: dict, where: str) -> None:
    """Every tensor the method computes has its memory: a constant (``data_buffer_idx``), planned
    (``allocation_info``) or external (``extra_tensor_info``). Only the method's inputs and outputs may
    have none (the caller provides them); executorch leaves any other one a null pointer and the first
    kernel to touch it crashes."""
    fb.layouts = _LAYOUTS
    boundary = set(plan["inputs"]) | set(plan["outputs"])
    for v, pos in enumerate(plan["values"]):
        if v in boundary:
            continue
        tag, body = fb.table(pos, "EValue", f"{where} values[{v}]")["val"]
        if tag != TENSOR_TAG or body is None:
            continue
        t = fb.table(body, "Tensor", f"{where} values[{v}]")
        numel = 1
        for d in t["sizes"] or ():
            numel *= d
        if t["data_buffer_idx"] == 0 and t["allocation_info"] is None and t["extra_tensor_info"] is None and numel:
            raise fb.fail(
                f"{where}: tensor value {v} (sizes {list(t['sizes'] or ())}) is neither a constant nor planned "
                "(no allocation_info) nor an input or output of the method"
            )


def _check_data_segments(fb: FlatBuffer, segments: list[dict]) -> None:
    """The constant segment, the mutable data segments and the named data: tables within the file, each
    naming a segment the program has, the constant offsets within their segment."""
    fb.layouts = _LAYOUTS
    program = fb.table(fb.deref(0, "root offset"), "Program", "program")
    subsegments = [("constant_segment", program["constant_segment"])] if program["constant_segment"] is not None else []
    subsegments += [(f"mutable_data_segments[{i}]", p) for i, p in enumerate(program["mutable_data_segments"] or ())]
    for what, pos in subsegments:
        sub = fb.table(pos, "SubsegmentOffsets", what)
        offsets = list(sub["offsets"] or ())
        if not offsets:
            continue
        if sub["segment_index"] >= len(segments):
            raise fb.fail(f"{what}: segment {sub['segment_index']}, but the program has {len(segments)} segments")
        size = segments[sub["segment_index"]]["size"]
        bad = [o for o in offsets if o > size]
        if bad:
            raise fb.fail(f"{what}: offset {bad[0]} beyond its segment's {size} bytes")
    for i, pos in enumerate(program["named_data"] or ()):
        named = fb.table(pos, "NamedData", f"named_data[{i}]")
        _name(fb, named["key"], f"named_data[{i}].key")
        if named["segment_index"] >= len(segments):
            raise fb.fail(f"named_data[{i}]: segment {named['segment_index']}, but the program has {len(segments)} segments")


def method_arity(data: bytes | bytearray | memoryview) -> dict[str, tuple[int, int]]:
    """Method name -> (its number of inputs, its number of outputs), read with the bounded reader."""
    tables = open_program(data, ProgramFormatError)
    fb, arity = tables.fb, {}
    for p, pos in enumerate(tables.program["execution_plan"] or ()):
        plan = fb.table(pos, "ExecutionPlan", f"execution_plan[{p}]")
        arity[_name(fb, plan["name"], f"execution_plan[{p}].name")] = (len(plan["inputs"] or ()), len(plan["outputs"] or ()))
    return arity


def _operators(fb: FlatBuffer, plan: dict, where: str) -> list[tuple[str, str]]:
    operators = []
    for i, op_pos in enumerate(plan["operators"] or ()):
        op = fb.table(op_pos, "Operator", f"{where} operators[{i}]")
        name = _name(fb, op["name"], f"{where} operators[{i}].name")
        overload = _name(fb, op["overload"], f"{where} operators[{i}].overload") if op["overload"] is not None else ""
        operators.append((name, overload))
    return operators


def method_operators(data: bytes | bytearray | memoryview, method: str) -> list[str]:
    """The operators (``"aten::sort.values"``) the execution plan ``method`` names, i.e. the CPU kernels
    the runtime resolves when it loads the method (read with the bounded reader; ``[]`` if no such
    method)."""
    tables = open_program(data, ProgramFormatError)
    fb = tables.fb
    for p, pos in enumerate(tables.program["execution_plan"] or ()):
        plan = fb.table(pos, "ExecutionPlan", f"execution_plan[{p}]")
        if _name(fb, plan["name"], f"execution_plan[{p}].name") == method:
            return [f"{n}.{o}" if o else n for n, o in _operators(fb, plan, f"method {method!r}")]
    return []


def check_program(data: bytes | bytearray | memoryview) -> None:
    """Raise :class:`ProgramFormatError` if ``data`` is not a program the runtime can be given safely."""
    tables = open_program(data, ProgramFormatError)
    fb, program = tables.fb, tables.program
    inline = len(program["backend_delegate_data"] or ())
    segments = [fb.table(p, "DataSegment", f"segments[{i}]") for i, p in enumerate(program["segments"] or ())]
    available = tables.segment_bytes
    for i, seg in enumerate(segments):
        if seg["offset"] + seg["size"] > available:
            raise ProgramFormatError(
                f"segments[{i}] ({seg['offset']} + {seg['size']} bytes) reaches past the "
                f"{available} bytes of segment data in the file"
            )
    _check_data_segments(fb, segments)
    budget = max_plan_bytes()
    for p, pos in enumerate(program["execution_plan"] or ()):
        plan = fb.table(pos, "ExecutionPlan", f"execution_plan[{p}]")
        method = _name(fb, plan["name"], f"execution_plan[{p}].name")
        where = f"method {method!r}"
        for field in ("values", "inputs", "outputs", "chains", "non_const_buffer_sizes"):  # executorch asserts on a missing one
            if plan[field] is None:
                raise fb.fail(f"{where}: the execution plan has no {field} field")
        n_values = len(plan["values"])
        for field in ("inputs", "outputs"):
            bad = [i for i in plan[field] if not 0 <= i < n_values]
            if bad:
                raise fb.fail(f"{where}: {field} {bad} outside the {n_values} values")
        operators = _operators(fb, plan, where)
        _check_kernel_calls(fb, plan, operators, where)
        _check_planned_tensors(fb, plan, where)
        for d, d_pos in enumerate(plan["delegates"] or ()):
            delegate = fb.table(d_pos, "BackendDelegate", f"{where} delegates[{d}]")
            backend = _name(fb, delegate["id"], f"{where} delegates[{d}].id")
            if delegate["processed"] is None:
                raise fb.fail(f"{where} delegate {d} ({backend}) has no payload reference")
            ref = fb.table(delegate["processed"], "BackendDelegateDataReference", f"{where} delegates[{d}].processed")
            count = inline if ref["location"] == 0 else len(segments) if ref["location"] == 1 else None
            if count is None:
                raise fb.fail(f"{where} delegate {d} ({backend}): data location {ref['location']} is neither INLINE nor SEGMENT")
            if ref["index"] >= count:
                kind = "inline data" if ref["location"] == 0 else "segments"
                raise fb.fail(
                    f"{where} delegate {d} ({backend}): payload index {ref['index']} but the program has {count} {kind}"
                )
            for s, s_pos in enumerate(delegate["compile_specs"] or ()):
                spec = fb.table(s_pos, "CompileSpec", f"{where} delegates[{d}].compile_specs[{s}]")
                key = _name(fb, spec["key"], f"{where} delegate {d} ({backend}) compile_specs[{s}].key")
                if spec["value"] is None:
                    raise fb.fail(f"{where} delegate {d} ({backend}): compile spec {key!r} has no value")
        sizes = plan["non_const_buffer_sizes"] or ()
        if any(s < 0 for s in sizes):
            raise fb.fail(f"{where}: negative memory-plan buffer size in {list(sizes)}")
        total = sum(sizes)
        if total >= budget:  # the bound is exclusive: a plan of exactly the budget is refused too
            raise ProgramFormatError(
                f"{where}: its memory plan asks for {total / 2**30:.3g} GiB ({list(sizes)} bytes), beyond the "
                f"{budget / 2**30:.3g} GiB budget (MPS_BACKEND_MAX_PLAN_BYTES)"
            )
