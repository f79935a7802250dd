"""The tables of a bundled program (``.bpte``) this project reads, with its bounded reader.

A partial ``bundled_program_schema.fbs`` (identifier ``BP08``): the program bytes and the test suites
(method name, test cases of input and expected-output values), decoded by ``flatbuf.FlatBuffer`` (every
offset checked, work bounded by the size). It replaces executorch's Python deserializer, which shells out
to ``flatc`` (a crash of that tool on a mutated file became a traceback), and it checks what executorch's
bundled loader trusts: every test case has its inputs and expected outputs, each tensor's sizes are
non-negative and its data holds exactly what its sizes and dtype need.
"""

from __future__ import annotations

from typing import Any

from mps_backend.runtime.program_check import check_program, method_arity
from mps_backend.serialization.flatbuf import FlatBuffer, compile_schema


def _f(name: str, ftype: str, default: str | None = None) -> dict:
    return {"name": name, "type": ftype, "default": default, "deprecated": False}


_SCHEMA = {
    "enums": {},
    "unions": {"ValueUnion": {}},
    "structs": {},
    "tables": {
        "BundledProgram": [_f("version", "uint"), _f("method_test_suites", "[BundledMethodTestSuite]"), _f("program", "[ubyte]")],
        "BundledMethodTestSuite": [_f("method_name", "string"), _f("test_cases", "[BundledMethodTestCase]")],
        "BundledMethodTestCase": [_f("inputs", "[Value]"), _f("expected_outputs", "[Value]")],
        "Value": [_f("val", "ValueUnion")],
        "Tensor": [_f("scalar_type", "byte"), _f("sizes", "[int]"), _f("data", "[ubyte]"), _f("dim_order", "[ubyte]")],
    },
}
LAYOUTS = compile_schema(_SCHEMA)
TENSOR, INT, BOOL, DOUBLE = 1, 2, 3, 4  # union ValueUnion type tags
#: executorch ScalarType -> bytes per element (the types a bundled tensor may hold)
_ELEMENT_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2}


def read_bundled(data: bytes | bytearray | memoryview, error: type[Exception]) -> tuple[memoryview, dict[str, int]]:
    """(the program inside the bundled program ``data``: a slice, not a copy; method name -> its number
    of test cases), after checking the test suites; ``error`` is raised on any violation, its message
    naming what and where."""
    program, arity = _read_suites(data, error)
    return program, {name: len(cases) for name, cases in arity.items()}


def check_bundle(data: bytes | bytearray | memoryview, error: type[Exception]) -> tuple[memoryview, dict[str, int]]:
    """:func:`read_bundled`, then the program inside checked as any ``.pte`` is (``check_program``) and
    each test case against its method: a method the program has, as many inputs and expected outputs as
    the method takes and returns. executorch's bundled check sets only the inputs a case holds and
    executes: a case with no inputs for a method that takes one ran on an unset input (SIGSEGV)."""
    program, arity = _read_suites(data, error)
    check_program(program)
    methods = method_arity(program)
    for name, cases in arity.items():
        if name not in methods:
            raise error(f"test suite of method {name!r}, which the program does not have ({', '.join(sorted(methods))})")
        want = methods[name]
        for c, got in enumerate(cases):
            if got != want:
                raise error(
                    f"method {name!r} test case {c}: {got[0]} inputs and {got[1]} expected outputs, the method takes "
                    f"{want[0]} inputs and returns {want[1]} outputs"
                )
    return program, {name: len(cases) for name, cases in arity.items()}


def _read_suites(data: bytes | bytearray | memoryview, error: type[Exception]) -> tuple[memoryview, dict[str, list]]:
    """(the program, method name -> (inputs, expected outputs) of each of its test cases)."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if len(view) < 8 or bytes(view[4:8]) != b"BP08":
        raise error("not a bundled program (no 'BP08' flatbuffer identifier at bytes 4-7)")
    fb = FlatBuffer(view, "bundled program", LAYOUTS, error)
    root = fb.table(fb.deref(0, "root offset"), "BundledProgram", "bundled program")
    if root["program"] is None or len(root["program"]) == 0:
        raise error("bundled program: no program")
    cases: dict[str, list] = {}
    for s, s_pos in enumerate(root["method_test_suites"] or ()):
        suite = fb.table(s_pos, "BundledMethodTestSuite", f"method_test_suites[{s}]")
        name = suite["method_name"]
        if name is None or any(ord(c) < 32 or c == "\x7f" for c in name):
            raise error(f"method_test_suites[{s}]: method name {name!r} is missing or has control characters")
        tests = suite["test_cases"] or ()
        for c, c_pos in enumerate(tests):
            where = f"method {name!r} test case {c}"
            case = fb.table(c_pos, "BundledMethodTestCase", where)
            for field in ("inputs", "expected_outputs"):
                if case[field] is None:
                    raise error(f"{where}: no {field}")
                for v, v_pos in enumerate(case[field]):
                    _check_value(fb, v_pos, f"{where} {field}[{v}]", error)
            cases.setdefault(name, []).append((len(case["inputs"]), len(case["expected_outputs"])))
        cases.setdefault(name, [])
    return memoryview(root["program"]), cases


def _check_value(fb: FlatBuffer, pos: int, where: str, error: type[Exception]) -> None:
    tag, body = fb.table(pos, "Value", where)["val"]
    if tag not in (TENSOR, INT, BOOL, DOUBLE) or body is None:
        raise error(f"{where}: value of type tag {tag} (not a Tensor, Int, Bool or Double)")
    if tag != TENSOR:
        return  # scalars: their tables are read by executorch with defaults
    tensor: dict[str, Any] = fb.table(body, "Tensor", where)
    size = _ELEMENT_BYTES.get(tensor["scalar_type"])
    if size is None:
        raise error(f"{where}: tensor of scalar type {tensor['scalar_type']} (not one a bundled tensor holds)")
    sizes = list(tensor["sizes"] or ())
    if any(d < 0 for d in sizes):
        raise error(f"{where}: negative tensor size in {sizes}")
    nbytes = size
    for d in sizes:
        nbytes *= d
    data = tensor["data"]
    have = 0 if data is None else len(data)
    if nbytes != have:
        raise error(f"{where}: tensor of sizes {sizes} needs {nbytes} bytes, its data holds {have}")
    order = tensor["dim_order"]
    if order is not None and len(order) and sorted(order) != list(range(len(sizes))):
        raise error(f"{where}: dim_order {list(order)} is not a permutation of the {len(sizes)} dimensions")
