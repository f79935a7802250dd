"""Validating reader of PyTorch Mobile (lite interpreter) flatbuffer modules.

Files written by ``torch.jit.save_jit_module_to_flatbuffer`` or
``module._save_for_lite_interpreter(path, _use_flatbuffer=True)`` are one flatbuffer of schema
``mobile_bytecode.fbs`` (namespace ``torch.jit.mobile.serialization``) with file identifier
``PTMF`` at bytes 4-7. ``read_mobile_module(data)`` decodes one into the plain dataclasses below
and checks what torch's flatbuffer loader relies on (it dereferences most vectors and strings
without a null check and indexes the ivalue, type and storage tables unchecked). Any violation
raises ``MobileFormatError`` naming what and where; no other exception escapes for malformed input
and the work done is bounded by the file size (decoding goes through the bounds-checked,
budgeted ``flatbuf.FlatBuffer`` shared with the MP00 reader).

Fields beyond the schema: torch >= 1.13 writes four more ``Module`` fields than the schema in
serialization/mobile_bytecode.fbs declares (upstream appended them to the table later):
``jit_sources:[ExtraFile]`` (TorchScript source of the classes, what ``torch.jit.load`` needs to
rebuild a ScriptModule), ``jit_constants:[uint]``, ``operator_version:uint`` and
``mobile_ivalue_size:uint``. They are read when the vtable has their slots (``MODULE_EXTENSIONS``)
and are ``None`` otherwise.

Opcodes and scalar types are not in the schema: they are torch's ``OpCode`` enum
(torch/csrc/jit/runtime/instruction.h, FORALL_OPCODES) and ``c10::ScalarType``, copied below.
"""

from __future__ import annotations

import collections
import copy
from dataclasses import dataclass
from typing import Any

from mps_backend.errors import MPSBackendError

from .flatbuf import FlatBuffer, compile_schema
from .generated.schema_info import MOBILE

IDENTIFIER = b"PTMF"


class MobileFormatError(MPSBackendError, ValueError):
    """A PyTorch Mobile flatbuffer module is malformed; the message names what and where."""


#: ``Module`` fields torch writes after the schema's last one (see the module docstring)
MODULE_EXTENSIONS = (
    {"name": "jit_sources", "type": "[ExtraFile]", "default": None, "deprecated": False},
    {"name": "jit_constants", "type": "[uint]", "default": None, "deprecated": False},
    {"name": "operator_version", "type": "uint", "default": None, "deprecated": False},
    {"name": "mobile_ivalue_size", "type": "uint", "default": None, "deprecated": False},
)


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = copy.deepcopy(MOBILE)
    schema["tables"]["Module"] = schema["tables"]["Module"] + [dict(f) for f in MODULE_EXTENSIONS]
    return schema


_SCHEMA = _schema()
_LAYOUTS = compile_schema(_SCHEMA)
#: IValueUnion tag -> member name (tag 0 is NONE)
UNION_MEMBERS = {tag: member for tag, (member, _) in enumerate(_SCHEMA["unions"]["IValueUnion"], start=1)}
_STRUCTS = frozenset(_SCHEMA["structs"])
TYPE_TYPES = {v: k for k, v in _SCHEMA["enums"]["TypeType"]["values"].items()}
#: strings that may hold binary data (extra files are arbitrary bytes)
_RAW_STRINGS = frozenset({"ExtraFile.content"})

#: torch/csrc/jit/runtime/instruction.h FORALL_OPCODES, in enum order
OPCODES = (
    "OP",
    "OPN",
    "LOAD",
    "MOVE",
    "STOREN",
    "STORE",
    "DROP",
    "DROPR",
    "LOADC",
    "JF",
    "JMP",
    "LOOP",
    "RET",
    "WAIT",
    "CALL",
    "GUARD",
    "TYPECHECK",
    "FAIL_GUARD",
    "PROFILE_OP",
    "TAIL_CALL",
    "INTERFACE_CALL",
    "GET_ATTR",
    "SET_ATTR",
    "LIST_UNPACK",
    "TUPLE_CONSTRUCT",
    "NAMED_TUPLE_CONSTRUCT",
    "LIST_CONSTRUCT",
    "DICT_CONSTRUCT",
    "CREATE_OBJECT",
    "ISINSTANCE",
    "TUPLE_SLICE",
    "TUPLE_INDEX",
    "RAISE_EXCEPTION",
    "DICT_INDEX",
    "UNCHECKED_CAST",
    "__IS__",
    "UN_INITIALIZED",
    "__ISNOT__",
    "FORMAT",
    "DEVICE",
    "DTYPE",
    "DIM",
    "__NOT__",
    "TO_LIST",
    "NUM_TO_TENSOR",
    "IS_CUDA",
    "FORK",
    "WARN",
    "ENTER",
    "EXIT",
    "AWAITABLE",
)
#: opcodes whose X indexes the function's type table (ISINSTANCE: types[X:X+N])
_TYPE_OPERANDS = frozenset({"NAMED_TUPLE_CONSTRUCT", "LIST_CONSTRUCT", "DICT_CONSTRUCT", "CREATE_OBJECT", "ISINSTANCE"})

#: c10::ScalarType in enum order: (name, bytes per element)
SCALAR_TYPES = (
    ("Byte", 1),
    ("Char", 1),
    ("Short", 2),
    ("Int", 4),
    ("Long", 8),
    ("Half", 2),
    ("Float", 4),
    ("Double", 8),
    ("ComplexHalf", 4),
    ("ComplexFloat", 8),
    ("ComplexDouble", 16),
    ("Bool", 1),
    ("QInt8", 1),
    ("QUInt8", 1),
    ("QInt32", 4),
    ("BFloat16", 2),
    ("QUInt4x2", 1),
    ("QUInt2x4", 1),
    ("Bits1x8", 1),
    ("Bits2x4", 1),
    ("Bits4x2", 1),
    ("Bits8", 1),
    ("Bits16", 2),
    ("Float8_e5m2", 1),
    ("Float8_e4m3fn", 1),
    ("Float8_e5m2fnuz", 1),
    ("Float8_e4m3fnuz", 1),
    ("UInt16", 2),
    ("UInt32", 4),
    ("UInt64", 8),
    ("UInt1", 1),
    ("UInt2", 1),
    ("UInt3", 1),
    ("UInt4", 1),
    ("UInt5", 1),
    ("UInt6", 1),
    ("UInt7", 1),
    ("Int1", 1),
    ("Int2", 1),
    ("Int3", 1),
    ("Int4", 1),
    ("Int5", 1),
    ("Int6", 1),
    ("Int7", 1),
    ("Float8_e8m0fnu", 1),
    ("Float4_e2m1fn_x2", 1),
    ("BComplex32", 4),
)
#: c10::QScheme in enum order
QSCHEMES = (
    "per_tensor_affine",
    "per_channel_affine",
    "per_tensor_symmetric",
    "per_channel_symmetric",
    "per_channel_affine_float_qparams",
)
_PER_TENSOR = frozenset({0, 2})


# ----------------------------------------------------------------------------------------------
# The decoded module


@dataclass(frozen=True)
class Instruction:
    op: str  # OpCode name, e.g. "OP", "LOADC"
    n: int
    x: int


@dataclass(frozen=True)
class Operator:
    name: str  # "aten::conv2d"
    overload_name: str  # "" or e.g. "dim"
    num_args_serialized: int  # -1: not recorded

    @property
    def qualified_name(self) -> str:
        """``aten::mean.dim``, as torch's ``opname_to_num_args`` spells it."""
        return f"{self.name}.{self.overload_name}" if self.overload_name else self.name


@dataclass(frozen=True)
class Arg:
    name: str
    type: str
    default_value: int  # index into ivalues


@dataclass(frozen=True)
class Schema:
    arguments: list[Arg]
    returns: list[Arg]


@dataclass
class Function:
    qualified_name: str
    instructions: list[Instruction]
    operators: list[Operator]
    constants: list[int]  # indices into ivalues
    type_annotations: list[str]
    register_size: int
    schema: Schema | None
    debug_handles: list[int] | None
    class_type: int  # index into object_types

    @property
    def name(self) -> str:
        return self.qualified_name.rsplit(".", 1)[-1]


@dataclass
class QuantizedSchema:
    qscheme: str  # c10::QScheme name
    scale: float
    zero_point: int
    scales: TensorMetadata | None
    zero_points: TensorMetadata | None
    axis: int


@dataclass
class TensorMetadata:
    storage_location_index: int
    scalar_type: int
    storage_offset: int
    sizes: list[int]
    strides: list[int]
    requires_grad: bool
    quantized_schema: QuantizedSchema | None

    @property
    def dtype(self) -> str:
        """c10 ScalarType name: Float, Half, Long, QInt8, ..."""
        return SCALAR_TYPES[self.scalar_type][0]

    @property
    def itemsize(self) -> int:
        return SCALAR_TYPES[self.scalar_type][1]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    def extent(self) -> int:
        """Bytes of storage the tensor reaches (0 when it has no elements)."""
        if self.numel == 0:
            return 0
        last = self.storage_offset + sum((s - 1) * st for s, st in zip(self.sizes, self.strides))
        return (last + 1) * self.itemsize


@dataclass(frozen=True)
class ObjectType:
    type_name: str
    type: str  # TypeType name: CLASS_WITH_FIELD, CUSTOM_CLASS, CLASS_WITH_SETSTATE
    attr_names: list[str]


@dataclass(frozen=True)
class Object:
    type_index: int  # into object_types
    state: int  # ivalue index (CLASS_WITH_SETSTATE, CUSTOM_CLASS)
    attrs: list[int] | None  # ivalue indices, one per attr name (CLASS_WITH_FIELD; else usually None)
    setstate_func: int  # ivalue index of the __setstate__ Function (CLASS_WITH_SETSTATE)


@dataclass(frozen=True)
class ListValue:
    items: list[int]  # ivalue indices
    annotation: str  # "List[Tensor]"


@dataclass(frozen=True)
class DictValue:
    keys: list[int]
    values: list[int]
    annotation: str


@dataclass(frozen=True)
class EnumValue:
    type_name: str
    value: int  # ivalue index


@dataclass
class IValue:
    """One entry of the module's ivalue table. ``kind`` is the IValueUnion member (or "None"):

    Int/Bool/Double/ComplexDouble/String -> int/bool/float/complex/str, Device -> str,
    TensorMetadata -> TensorMetadata, List -> ListValue, Tuple -> tuple of ivalue indices,
    Dict -> DictValue, Object -> Object, IntList/DoubleList/BoolList -> list, EnumValue ->
    EnumValue, Function -> Function.
    """

    kind: str
    value: Any


@dataclass
class MobileModule:
    bytecode_version: int
    extra_files: dict[str, bytes]
    methods: list[int]  # ivalue indices of the module's method Functions
    state_obj: int  # ivalue index of the module Object
    ivalues: list[IValue]
    storage_data_size: int
    storages: list[memoryview]  # raw bytes of each storage
    object_types: list[ObjectType]
    jit_sources: dict[str, str] | None = None
    jit_constants: list[int] | None = None
    operator_version: int | None = None
    mobile_ivalue_size: int | None = None
    size: int = 0  # bytes of the file

    @property
    def functions(self) -> list[Function]:
        """Every Function of the ivalue table (methods, __setstate__, ...), in table order."""
        return [iv.value for iv in self.ivalues if iv.kind == "Function"]

    @property
    def method_functions(self) -> list[Function]:
        return [self.ivalues[i].value for i in self.methods]

    @property
    def function_names(self) -> set[str]:
        return {f.qualified_name for f in self.functions}

    def operator_names(self) -> dict[str, int]:
        """Qualified operator name -> num_args_serialized over all functions (what torch's
        ``get_flatbuffer_module_info`` calls ``opname_to_num_args``)."""
        return {op.qualified_name: op.num_args_serialized for f in self.functions for op in f.operators}

    def operator_histogram(self) -> collections.Counter:
        """Qualified operator name -> number of OP/OPN instructions calling it (all functions)."""
        counts: collections.Counter = collections.Counter()
        for f in self.functions:
            for inst in f.instructions:
                if inst.op in ("OP", "OPN"):
                    counts[f.operators[inst.x].qualified_name] += 1
        return counts

    @property
    def root_type(self) -> str:
        obj = self.ivalues[self.state_obj].value
        return self.object_types[obj.type_index].type_name

    def named_tensors(self) -> dict[str, TensorMetadata]:
        """Tensors reachable from the module object, named by attribute path like a state_dict
        ("conv.weight"); tensors inside __getstate__ states, tuples, lists or dicts get an index
        ("conv.__state__.0"). Each tensor ivalue is listed once, under its first path."""
        out: dict[str, TensorMetadata] = {}
        seen: set[int] = set()
        stack: list[tuple[int, str]] = [(self.state_obj, "")]
        while stack:
            index, path = stack.pop()
            if index in seen:
                continue
            seen.add(index)
            iv = self.ivalues[index]
            children: list[tuple[int, str]] = []
            if iv.kind == "TensorMetadata":
                out[path] = iv.value
            elif iv.kind == "Object":
                obj: Object = iv.value
                otype = self.object_types[obj.type_index]
                if otype.type == "CLASS_WITH_FIELD":
                    assert obj.attrs is not None  # the reader refuses a CLASS_WITH_FIELD object without attrs
                    children = list(zip(obj.attrs, otype.attr_names))
                else:
                    children = [(obj.state, "__state__")]
            elif iv.kind == "Tuple":
                children = [(item, str(k)) for k, item in enumerate(iv.value)]
            elif iv.kind == "List":
                children = [(item, str(k)) for k, item in enumerate(iv.value.items)]
            elif iv.kind == "Dict":
                children = [(v, str(k)) for k, v in enumerate(iv.value.values)]
            for child, name in reversed(children):
                stack.append((child, f"{path}.{name}" if path else name))
        return out

    def tensor_storage(self, meta: TensorMetadata) -> memoryview:
        """The raw bytes of the storage ``meta`` views (offset/strides apply on top)."""
        return self.storages[meta.storage_location_index]


# ----------------------------------------------------------------------------------------------
# Decoding


def is_mobile_flatbuffer(data: bytes | bytearray | memoryview) -> bool:
    """True when ``data`` carries the PyTorch Mobile flatbuffer identifier at bytes 4-7."""
    return len(data) >= 8 and bytes(data[4:8]) == IDENTIFIER


class _Decoder:
    def __init__(self, data: bytes) -> None:
        self.fb = FlatBuffer(memoryview(data), "flatbuffer", _LAYOUTS, MobileFormatError, _RAW_STRINGS, align_empty_vectors=False)
        self.n_ivalues = 0
        self.n_types = 0

    def fail(self, msg: str) -> MobileFormatError:
        return MobileFormatError(msg)

    def table(self, pos: int | None, name: str, where: str) -> dict[str, Any]:
        if pos is None:
            raise self.fail(f"{where}: {name} missing")
        return self.fb.table(pos, name, where)

    @staticmethod
    def required(value: Any, where: str) -> Any:
        if value is None:
            raise MobileFormatError(f"{where} missing (torch's loader reads it without a null check)")
        return value

    def index(self, value: int, where: str) -> int:
        if not 0 <= value < self.n_ivalues:
            raise self.fail(f"{where}: ivalue index {value} out of range ({self.n_ivalues} ivalues)")
        return value

    # -- pieces ---------------------------------------------------------------------------------

    def extra_files(self, positions: list[int], where: str, binary: bool) -> dict:
        out = {}
        for k, p in enumerate(positions):
            w = f"{where}[{k}]"
            t = self.table(p, "ExtraFile", w)
            name = self.required(t["name"], f"{w} name")
            content = self.required(t["content"], f"{w} ({name}) content")
            if not binary:
                try:
                    content = content.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise self.fail(f"{w} ({name}): source not UTF-8 ({e.reason} at byte {e.start})") from None
            out[name] = content
        return out

    def tensor(self, pos: int | None, where: str, quantized_ok: bool = True) -> TensorMetadata:
        t = self.table(pos, "TensorMetadata", where)
        st = t["scalar_type"]
        if not 0 <= st < len(SCALAR_TYPES):
            raise self.fail(f"{where}: scalar_type {st} is not a c10::ScalarType")
        sizes = self.required(t["sizes"], f"{where} sizes")
        strides = self.required(t["strides"], f"{where} strides")
        if len(strides) != len(sizes):
            raise self.fail(f"{where}: {len(sizes)} sizes but {len(strides)} strides")
        if any(s < 0 for s in sizes) or any(s < 0 for s in strides):
            raise self.fail(f"{where}: negative size or stride (sizes {sizes}, strides {strides})")
        if t["storage_offset"] < 0:
            raise self.fail(f"{where}: negative storage_offset {t['storage_offset']}")
        quant = None
        if t["quantized_schema"] is not None:
            if not quantized_ok:
                raise self.fail(f"{where}: a quantization parameter tensor is itself quantized")
            q = self.table(t["quantized_schema"], "QuantizedSchema", f"{where} quantized_schema")
            if not 0 <= q["qscheme"] < len(QSCHEMES):
                raise self.fail(f"{where}: qscheme {q['qscheme']} is not a c10::QScheme")
            scales = zero_points = None
            if q["qscheme"] not in _PER_TENSOR:  # per channel: torch parses both tensors
                scales = self.tensor(q["scales"], f"{where} scales", quantized_ok=False)
                zero_points = self.tensor(q["zero_points"], f"{where} zero_points", quantized_ok=False)
            quant = QuantizedSchema(QSCHEMES[q["qscheme"]], q["scale"], q["zero_point"], scales, zero_points, q["axis"])
        return TensorMetadata(t["storage_location_index"], st, t["storage_offset"], sizes, strides, t["requires_grad"], quant)

    def function(self, pos: int, where: str) -> Function:
        t = self.fb.table(pos, "Function", where)
        qn = self.required(t["qn"], f"{where} qn")
        where = f"{where} ({qn})"
        raw_insts = self.required(t["instructions"], f"{where} instructions")
        operators = []
        for k, p in enumerate(self.required(t["operators"], f"{where} operators")):
            w = f"{where} operator {k}"
            o = self.table(p, "Operator", w)
            if o["num_args_serialized"] < -1:
                raise self.fail(f"{w}: num_args_serialized {o['num_args_serialized']} < -1")
            operators.append(
                Operator(
                    self.required(o["name"], f"{w} name"),
                    self.required(o["overload_name"], f"{w} overload_name"),
                    o["num_args_serialized"],
                )
            )
        constants = [
            self.index(c, f"{where} constant {k}") for k, c in enumerate(self.required(t["constants"], f"{where} constants"))
        ]
        types = self.required(t["type_annotations"], f"{where} type_annotations")
        instructions = []
        for k, inst in enumerate(raw_insts):
            op, x, n = inst["op"], inst["x"], inst["n"]
            if not 0 <= op < len(OPCODES):
                raise self.fail(f"{where} instruction {k}: opcode {op} is not a torch OpCode")
            name = OPCODES[op]
            if name in ("OP", "OPN") and not 0 <= x < len(operators):
                raise self.fail(f"{where} instruction {k} ({name}): operator {x} out of range ({len(operators)} operators)")
            if name == "LOADC" and not 0 <= x < len(constants):
                raise self.fail(f"{where} instruction {k} (LOADC): constant {x} out of range ({len(constants)} constants)")
            if name in _TYPE_OPERANDS and not (0 <= x and x + (n if name == "ISINSTANCE" else 1) <= len(types)):
                raise self.fail(f"{where} instruction {k} ({name}): type {x} out of range ({len(types)} type annotations)")
            instructions.append(Instruction(name, n, x))
        if t["register_size"] < 0:
            raise self.fail(f"{where}: negative register_size {t['register_size']}")
        schema = None
        if t["schema"] is not None:
            s = self.fb.table(t["schema"], "Schema", f"{where} schema")
            lists = []
            for part in ("arguments", "returns"):
                args = []
                for k, p in enumerate(self.required(s[part], f"{where} schema {part}")):
                    w = f"{where} schema {part}[{k}]"
                    a = self.table(p, "Arg", w)
                    args.append(
                        Arg(
                            self.required(a["name"], f"{w} name"),
                            self.required(a["type"], f"{w} type"),
                            self.index(a["default_value"], f"{w} default_value"),
                        )
                    )
                lists.append(args)
            schema = Schema(*lists)
        debug = None
        if t["debug_info"] is not None:
            debug = self.fb.table(t["debug_info"], "DebugInfo", f"{where} debug_info")["debug_handle"]
        if not 0 <= t["class_type"] < self.n_types:
            raise self.fail(f"{where}: class_type {t['class_type']} out of range ({self.n_types} object types)")
        return Function(qn, instructions, operators, constants, types, t["register_size"], schema, debug, t["class_type"])

    def ivalue(self, pos: int, i: int) -> IValue:
        where = f"ivalue {i}"
        tag, body = self.fb.table(pos, "IValue", where)["val"]
        if tag == 0:
            return IValue("None", None)
        kind = UNION_MEMBERS.get(tag)
        if kind is None:
            raise self.fail(f"{where}: union type {tag} is not an IValueUnion member")
        where = f"{where} ({kind})"
        if body is None:
            raise self.fail(f"{where}: union value missing")
        if kind in _STRUCTS:
            s = self.fb.struct(body, kind, where)
            value: Any = {
                "Int": lambda: s["int_val"],
                "Bool": lambda: s["bool_val"],
                "Double": lambda: s["double_val"],
                "ComplexDouble": lambda: complex(s["real"], s["imag"]),
            }[kind]()
            return IValue(kind, value)
        if kind == "TensorMetadata":
            return IValue(kind, self.tensor(body, where))
        if kind == "Function":
            return IValue(kind, self.function(body, where))
        t = self.fb.table(body, kind, where)
        if kind == "String":
            value = self.required(t["data"], f"{where} data")
        elif kind == "Device":
            value = self.required(t["str"], f"{where} str")
        elif kind in ("IntList", "DoubleList", "BoolList"):
            value = self.required(t["items"], f"{where} items")
        elif kind == "Tuple":
            value = tuple(self.index(v, f"{where} item {k}") for k, v in enumerate(self.required(t["items"], f"{where} items")))
        elif kind == "List":
            value = ListValue(
                [self.index(v, f"{where} item {k}") for k, v in enumerate(self.required(t["items"], f"{where} items"))],
                self.required(t["annotation_str"], f"{where} annotation_str"),
            )
        elif kind == "Dict":
            keys = self.required(t["keys"], f"{where} keys")
            values = self.required(t["values"], f"{where} values")
            if len(keys) != len(values):
                raise self.fail(f"{where}: {len(keys)} keys but {len(values)} values")
            value = DictValue(
                [self.index(v, f"{where} key {k}") for k, v in enumerate(keys)],
                [self.index(v, f"{where} value {k}") for k, v in enumerate(values)],
                self.required(t["annotation_str"], f"{where} annotation_str"),
            )
        elif kind == "Object":
            value = Object(t["type_index"], t["state"], t["attrs"], t["setstate_func"])
        elif kind == "EnumValue":
            value = EnumValue(self.required(t["type_name"], f"{where} type_name"), self.index(t["value"], f"{where} value"))
        else:  # pragma: no cover - every union member is handled above
            raise self.fail(f"{where}: unhandled member")
        return IValue(kind, value)

    # -- cross-references -----------------------------------------------------------------------

    def check_object(self, m: MobileModule, i: int, obj: Object) -> None:
        where = f"ivalue {i} (Object)"
        if not 0 <= obj.type_index < len(m.object_types):
            raise self.fail(f"{where}: type_index {obj.type_index} out of range ({len(m.object_types)} object types)")
        otype = m.object_types[obj.type_index]
        where = f"{where} of type {otype.type_name}"
        if otype.type == "CLASS_WITH_FIELD":
            if obj.attrs is None:
                raise self.fail(f"{where}: attrs missing (torch's loader reads it without a null check)")
            if len(obj.attrs) > len(otype.attr_names):
                raise self.fail(f"{where}: {len(obj.attrs)} attrs but the type names {len(otype.attr_names)}")
            for k, a in enumerate(obj.attrs):
                self.index(a, f"{where} attr {k}")
        elif otype.type in ("CLASS_WITH_SETSTATE", "CUSTOM_CLASS"):
            self.index(obj.state, f"{where} state")
            if otype.type == "CLASS_WITH_SETSTATE":
                f = self.index(obj.setstate_func, f"{where} setstate_func")
                if m.ivalues[f].kind != "Function":
                    raise self.fail(f"{where}: setstate_func {f} is a {m.ivalues[f].kind}, not a Function")
        else:
            raise self.fail(f"{where}: type kind {otype.type} cannot be instantiated (need an object kind)")

    def check_tensor(self, m: MobileModule, meta: TensorMetadata, where: str) -> None:
        k = meta.storage_location_index
        if not k < min(m.storage_data_size, len(m.storages)):
            raise self.fail(
                f"{where}: storage_location_index {k} out of range ({len(m.storages)} "
                f"storages, storage_data_size {m.storage_data_size})"
            )
        need, have = meta.extent(), len(m.storages[k])
        if need > have:
            raise self.fail(
                f"{where}: {meta.dtype}{meta.sizes} (strides {meta.strides}, offset "
                f"{meta.storage_offset}) reaches {need} bytes of the {have}-byte storage {k}"
            )
        q = meta.quantized_schema
        if q is not None:
            for label, t in (("scales", q.scales), ("zero_points", q.zero_points)):
                if t is not None:
                    self.check_tensor(m, t, f"{where} {label}")

    def module(self) -> MobileModule:
        fb = self.fb
        if fb.size < 8:
            raise self.fail(f"file is {fb.size} bytes, too short for a flatbuffer")
        ident = bytes(fb.buf[4:8])
        if ident != IDENTIFIER:
            raise self.fail(
                f"flatbuffer identifier at bytes 4-7 is {ident!r}, expected {IDENTIFIER!r} "
                "(not a PyTorch Mobile flatbuffer module)"
            )
        root = fb.deref(0, "root offset")
        if root < 8:
            raise self.fail(f"root table offset {root} overlaps the root offset/identifier")
        t = fb.table(root, "Module", "module")
        ivalue_pos = self.required(t["ivalues"], "module ivalues")
        types_pos = self.required(t["object_types"], "module object_types")
        self.n_ivalues, self.n_types = len(ivalue_pos), len(types_pos)
        object_types = []
        for k, p in enumerate(types_pos):
            ot = fb.table(p, "ObjectType", f"object type {k}")
            name = self.required(ot["type_name"], f"object type {k} type_name")
            kind = TYPE_TYPES.get(ot["type"])
            if kind is None:
                raise self.fail(f"object type {k} ({name}): type kind {ot['type']} is not a TypeType")
            object_types.append(ObjectType(name, kind, ot["attr_names"] or []))
        storages = []
        for k, p in enumerate(t["storage_data"] or []):
            sd = fb.table(p, "StorageData", f"storage {k}")
            storages.append(self.required(sd["data"], f"storage {k} data"))
        if t["storage_data_size"] < 0:
            raise self.fail(f"module: negative storage_data_size {t['storage_data_size']}")
        ivalues = [self.ivalue(p, i) for i, p in enumerate(ivalue_pos)]
        jit_sources = None
        if t["jit_sources"] is not None:
            jit_sources = self.extra_files(t["jit_sources"], "jit source", binary=False)
        m = MobileModule(
            bytecode_version=t["version"],
            extra_files=self.extra_files(self.required(t["extra_files"], "module extra_files"), "extra file", binary=True),
            methods=[self.index(v, f"module method {k}") for k, v in enumerate(self.required(t["methods"], "module methods"))],
            state_obj=self.index(t["state_obj"], "module state_obj"),
            ivalues=ivalues,
            storage_data_size=t["storage_data_size"],
            storages=storages,
            object_types=object_types,
            jit_sources=jit_sources,
            jit_constants=None
            if t["jit_constants"] is None
            else [self.index(v, f"jit constant {k}") for k, v in enumerate(t["jit_constants"])],
            operator_version=t["operator_version"],
            mobile_ivalue_size=t["mobile_ivalue_size"],
            size=fb.size,
        )
        if m.mobile_ivalue_size is not None and m.mobile_ivalue_size > len(ivalues):
            raise self.fail(f"module: mobile_ivalue_size {m.mobile_ivalue_size} exceeds the {len(ivalues)} ivalues")
        for k, i in enumerate(m.methods):
            if ivalues[i].kind != "Function":
                raise self.fail(f"module method {k}: ivalue {i} is a {ivalues[i].kind}, not a Function")
        if ivalues[m.state_obj].kind != "Object":
            raise self.fail(f"module state_obj: ivalue {m.state_obj} is a {ivalues[m.state_obj].kind}, not an Object")
        for i, iv in enumerate(ivalues):
            if iv.kind == "Object":
                self.check_object(m, i, iv.value)
            elif iv.kind == "TensorMetadata":
                self.check_tensor(m, iv.value, f"ivalue {i} (TensorMetadata)")
        return m


def read_mobile_module(data: bytes | bytearray | memoryview) -> MobileModule:
    """Decode and validate one PyTorch Mobile flatbuffer module; raises MobileFormatError on any
    violation."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"read_mobile_module expects bytes, bytearray or memoryview, not {type(data).__name__}")
    return _Decoder(bytes(data)).module()


__all__ = [
    "IDENTIFIER",
    "Arg",
    "DictValue",
    "EnumValue",
    "Function",
    "IValue",
    "Instruction",
    "ListValue",
    "MobileFormatError",
    "MobileModule",
    "Object",
    "ObjectType",
    "Operator",
    "QuantizedSchema",
    "Schema",
    "TensorMetadata",
    "is_mobile_flatbuffer",
    "read_mobile_module",
]
