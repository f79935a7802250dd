"""PyTorch Mobile flatbuffer modules (PTMF): generated bindings, the validating reader cross-checked
against torch on modules saved here, `mps-backend inspect`, and the migration to MPS."""

from __future__ import annotations

import enum
import hashlib
import io
import json
import pathlib
import struct
import warnings
import zipfile
from dataclasses import dataclass
from typing import Dict, List, Tuple

import pytest
import torch
from torch import nn

from mps_backend.serialization import mobile
from mps_backend.serialization.generated import schema_info
from mps_backend.serialization.mobile import MobileFormatError, read_mobile_module
from mps_backend.tools import cli, legacy

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERATED = ROOT / "serialization" / "generated" / "mobile"

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")

# ----------------------------------------------------------------------------------------------
# Modules saved by the tests


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        return self.fc(torch.relu(self.conv2(x)).mean((2, 3)))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class MultiMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(8, 16)
        self.dec = nn.Linear(16, 4)
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x):
        return self.dec(torch.tanh(self.enc(x))) + self.offset

    @torch.jit.export
    def encode(self, x):
        return self.enc(x)

    @torch.jit.export
    def scale(self, x, k: float):
        return x * k


class QuantNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        x = torch.relu(self.conv(self.quant(x)))
        return self.dequant(self.fc(x.flatten(1)))


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Rich(nn.Module):
    """Attributes of every IValue kind torch writes (dict, lists, tuple, complex, device, enum...)."""

    def __init__(self):
        super().__init__()
        self.d: Dict[str, int] = {"a": 1, "b": 2}
        self.names: List[str] = ["x", "y"]
        self.flags: List[bool] = [True, False, True]
        self.floats: List[float] = [1.5, -2.0]
        self.ints: List[int] = [3, 4, 5]
        self.pair: Tuple[int, str] = (7, "seven")
        self.c = complex(1.0, -2.0)
        self.f = 0.25
        self.dev = torch.device("cpu")
        self.tensors: List[torch.Tensor] = [torch.ones(2), torch.zeros(3)]
        self.lin = nn.Linear(3, 3)

    def forward(self, x, color: Color = Color.RED):
        y = self.lin(x) * self.f
        if color == Color.GREEN:
            y = y + 1
        return y + self.tensors[0].sum() + float(self.d["a"]) + len(self.names)

    @torch.jit.export
    def twice(self) -> complex:
        return self.c * 2


def _quantized_engine() -> str | None:
    engines = torch.backends.quantized.supported_engines
    return next((e for e in ("fbgemm", "x86", "qnnpack") if e in engines), None)


def _static_quantized() -> nn.Module:
    engine = _quantized_engine()
    torch.backends.quantized.engine = engine
    model = QuantNet().eval()
    model.qconfig = torch.ao.quantization.get_default_qconfig(engine)
    prepared = torch.ao.quantization.prepare(model)
    prepared(torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1)))
    return torch.ao.quantization.convert(prepared)


@dataclass
class Saved:
    path: pathlib.Path
    data: bytes
    scripted: torch.jit.ScriptModule
    eager: nn.Module
    shapes: list[tuple[int, ...]]


def _save(
    folder: pathlib.Path, name: str, eager: nn.Module, shapes, how: str = "flatbuffer", record_shapes: bool = False
) -> Saved:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(eager.eval())
    extra = legacy.input_shapes_extra_file(shapes) if record_shapes else {}
    if how == "flatbuffer":
        path = folder / f"{name}.ff"
        torch.jit.save_jit_module_to_flatbuffer(scripted, str(path), _extra_files=extra)
    else:  # the lite-interpreter saver with the flatbuffer format
        path = folder / f"{name}.ptl"
        scripted._save_for_lite_interpreter(str(path), _extra_files=extra, _use_flatbuffer=True)
    return Saved(path, path.read_bytes(), scripted, eager, list(shapes))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Saved]:
    folder = tmp_path_factory.mktemp("mobile")
    torch.manual_seed(0)
    out = {
        "convnet": _save(folder, "convnet", ConvNet(), [(1, 3, 16, 16)]),
        "mlp": _save(folder, "mlp", MLP(), [(2, 16)], how="lite"),
        "multi": _save(folder, "multi", MultiMethod(), [(2, 8)], record_shapes=True),
        "rich": _save(folder, "rich", Rich(), [(1, 3)]),
    }
    if _quantized_engine():
        out["quantized"] = _save(folder, "quantized", _static_quantized(), [(1, 3, 8, 8)])
    return out


def _get(saved, name) -> Saved:
    if name not in saved:
        pytest.skip(f"torch {torch.__version__} has no quantized engine here ({torch.backends.quantized.supported_engines})")
    return saved[name]


# ----------------------------------------------------------------------------------------------
# Schema copy and generated bindings


#: SHA-256 of PyTorch's mobile_bytecode.fbs (the reference schema), taken when it was copied here
UPSTREAM_SCHEMA_SHA256 = "3c51c1b04efef151ff61e275a3a5fd79913e817f19ed406c1dfe6fe6137de6f1"


def test_schema_copy_adds_only_the_identifier():
    ours = (ROOT / "serialization" / "mobile_bytecode.fbs").read_text().splitlines()
    assert ours[0] == "namespace torch.jit.mobile.serialization;"
    assert ours[1] == 'file_identifier "PTMF";'
    # without the added line, the copy is the reference schema byte for byte
    assert hashlib.sha256("\n".join([ours[0], *ours[2:]]).encode()).hexdigest() == UPSTREAM_SCHEMA_SHA256


def test_schema_info_describes_the_real_schema():
    info = schema_info.MOBILE
    assert info["namespace"] == "torch.jit.mobile.serialization"
    assert info["file_identifier"] == "PTMF" and info["root_type"] == "Module"
    members = [m for m, _ in info["unions"]["IValueUnion"]]
    assert members[:5] == ["Int", "Bool", "Double", "ComplexDouble", "TensorMetadata"]
    # struct members stay structs (the placeholder table only exists in the text given to flatc)
    assert all(t == m for m, t in info["unions"]["IValueUnion"])
    assert "GeneratedUnionStructPlaceholder" not in repr(info)
    ops = {f["name"]: f for f in info["tables"]["Operator"]}
    assert ops["num_args_serialized"]["default"] == "-1"
    storage = info["tables"]["StorageData"][0]
    assert storage["attributes"] == {"force_align": 16}
    assert "attributes" not in repr(schema_info.MPSGRAPH)  # the MP00 literal is unchanged


def test_generated_bindings_match_schema_info():
    from mps_backend.serialization.generated.mobile import IValueUnion  # noqa: PLC0415

    assert not (GENERATED / "GeneratedUnionStructPlaceholder.py").exists()
    for tag, (member, _) in enumerate(schema_info.MOBILE["unions"]["IValueUnion"], start=1):
        assert getattr(IValueUnion.IValueUnion, member) == tag
    for name, layout in schema_info.MOBILE["structs"].items():
        module = __import__(f"mps_backend.serialization.generated.mobile.{name}", fromlist=[name])
        assert getattr(module, name).SizeOf() == layout["size"], name


def test_generated_bindings_read_a_torch_file(saved):
    """The flatc bindings (generated through the union workaround) decode struct union members."""
    from mps_backend.serialization.generated.mobile.Int import Int  # noqa: PLC0415
    from mps_backend.serialization.generated.mobile.IValueUnion import IValueUnion  # noqa: PLC0415
    from mps_backend.serialization.generated.mobile.Module import Module  # noqa: PLC0415

    data = saved["convnet"].data
    assert Module.ModuleBufferHasIdentifier(data, 0)
    fb = Module.GetRootAs(data, 0)
    ours = read_mobile_module(data)
    assert fb.Version() == ours.bytecode_version
    assert fb.IvaluesLength() == len(ours.ivalues)
    ints = 0
    for i in range(fb.IvaluesLength()):
        iv = fb.Ivalues(i)
        if iv.ValType() == IValueUnion.Int:
            tab = iv.Val()
            value = Int()
            value.Init(tab.Bytes, tab.Pos)
            assert ours.ivalues[i] == mobile.IValue("Int", value.IntVal())
            ints += 1
    assert ints > 0


# ----------------------------------------------------------------------------------------------
# The reader cross-checked against torch


@pytest.mark.parametrize("name", ["convnet", "mlp", "multi", "rich", "quantized"])
def test_module_info_matches_torch(saved, name):
    s = _get(saved, name)
    info = torch.jit._serialization.get_flatbuffer_module_info(str(s.path))
    assert info == torch._C._get_module_info_from_flatbuffer(s.data)
    m = read_mobile_module(s.data)
    assert m.bytecode_version == info["bytecode_version"]
    assert m.operator_version == info["operator_version"]
    assert m.function_names == info["function_names"]
    assert m.operator_names() == info["opname_to_num_args"]
    assert m.jit_sources and m.mobile_ivalue_size == len(m.ivalues)


@pytest.mark.parametrize("name", ["convnet", "mlp", "multi", "quantized"])
def test_lite_interpreter_loads_what_we_read(saved, name):
    import torch.jit.mobile  # noqa: PLC0415

    s = _get(saved, name)
    lite = torch.jit.mobile._load_for_lite_interpreter(str(s.path))
    m = read_mobile_module(s.data)
    assert torch.jit.mobile._export_operator_list(lite) == {
        op.name if not op.overload_name else op.qualified_name for op in _all_ops(m)
    }
    for fn in m.method_functions:
        if not fn.name.startswith("__"):
            assert lite.find_method(fn.name), fn.name
    x = torch.randn(*s.shapes[0])
    torch.testing.assert_close(lite(x), s.scripted(x))


def _all_ops(m):
    return [op for fn in m.functions for op in fn.operators]


def _zip_bytecode(scripted) -> dict[str, dict]:
    """Functions of the zip-format lite-interpreter file of the same module (bytecode.pkl spells
    instructions with their names)."""
    from torch.utils.show_pickle import DumpUnpickler  # noqa: PLC0415

    z = zipfile.ZipFile(io.BytesIO(scripted._save_to_buffer_for_lite_interpreter()))
    name = next(n for n in z.namelist() if n.endswith("/bytecode.pkl"))
    obj = DumpUnpickler(io.BytesIO(z.read(name)), catch_invalid_utf8=True).load()
    return {entry[0]: dict(entry[1]) for entry in obj[1:]}


def _plain(value):
    return value if value is None or isinstance(value, (bool, int, float, str)) else ...


@pytest.mark.parametrize("name", ["convnet", "mlp", "multi", "quantized"])
def test_bytecode_matches_the_zip_format(saved, name):
    """Instructions (op names from torch's OpCode enum), operators, types, registers and scalar
    constants equal what torch writes into the zip format's bytecode.pkl for the same module."""
    s = _get(saved, name)
    zipped = _zip_bytecode(s.scripted)
    m = read_mobile_module(s.data)
    assert set(zipped) == m.function_names
    for fn in m.functions:
        z = zipped[fn.qualified_name]
        assert [(i.op, i.x, i.n) for i in fn.instructions] == [tuple(t) for t in z["instructions"]]
        assert [(o.name, o.overload_name, o.num_args_serialized) for o in fn.operators] == [tuple(t) for t in z["operators"]]
        assert fn.type_annotations == list(z["types"])
        assert fn.register_size == z["register_size"]
        assert len(fn.constants) == len(z["constants"])
        for index, expected in zip(fn.constants, z["constants"]):
            if _plain(expected) is not ...:
                assert m.ivalues[index].value == expected


_TORCH_DTYPES = {
    "Float": torch.float32,
    "Long": torch.int64,
    "Double": torch.float64,
    "Half": torch.float16,
    "QInt8": torch.qint8,
    "QUInt8": torch.quint8,
    "Bool": torch.bool,
    "Int": torch.int32,
}


def _tensor(m: mobile.MobileModule, meta: mobile.TensorMetadata) -> torch.Tensor:
    storage = m.tensor_storage(meta)
    dtype = _TORCH_DTYPES[meta.dtype]
    raw_dtype = {torch.qint8: torch.int8, torch.quint8: torch.uint8}.get(dtype, dtype)
    flat = torch.frombuffer(bytearray(storage), dtype=raw_dtype) if len(storage) else torch.empty(0, dtype=raw_dtype)
    return flat.as_strided(meta.sizes, meta.strides, meta.storage_offset)


@pytest.mark.parametrize("name", ["convnet", "mlp", "multi"])
def test_tensors_equal_the_state_dict(saved, name):
    s = _get(saved, name)
    m = read_mobile_module(s.data)
    tensors = m.named_tensors()
    state = s.eager.state_dict()
    params = dict(s.eager.named_parameters())
    assert set(tensors) == set(state)
    for key, expected in state.items():
        meta = tensors[key]
        assert _TORCH_DTYPES[meta.dtype] == expected.dtype, key
        assert meta.sizes == list(expected.shape) and meta.strides == list(expected.stride()), key
        got = _tensor(m, meta)
        assert got.numpy().tobytes() == expected.detach().numpy().tobytes(), key
        assert meta.requires_grad == (key in params and params[key].requires_grad), key


def test_quantized_tensors(saved):
    s = _get(saved, "quantized")
    m = read_mobile_module(s.data)
    weights = {tuple(t.sizes): t for t in m.named_tensors().values() if t.quantized_schema is not None}
    conv_w = s.eager.conv.weight()
    fc_w = s.eager.fc.weight()
    for expected in (conv_w, fc_w):
        meta = weights[tuple(expected.shape)]
        q = meta.quantized_schema
        assert meta.dtype == "QInt8" and q.qscheme == str(expected.qscheme()).removeprefix("torch.")
        assert q.axis == expected.q_per_channel_axis()
        scales = _tensor(m, q.scales)
        zero_points = _tensor(m, q.zero_points)
        torch.testing.assert_close(scales, expected.q_per_channel_scales(), rtol=0, atol=0)
        assert torch.equal(zero_points, expected.q_per_channel_zero_points())
        assert _tensor(m, meta).numpy().tobytes() == expected.int_repr().numpy().tobytes()
    kinds = {ot.type for ot in m.object_types}
    assert {"CLASS_WITH_FIELD", "CLASS_WITH_SETSTATE", "CUSTOM_CLASS"} <= kinds


def test_every_ivalue_kind_decodes(saved):
    s = saved["rich"]
    m = read_mobile_module(s.data)
    kinds = {iv.kind for iv in m.ivalues}
    expected = {member for member, _ in schema_info.MOBILE["unions"]["IValueUnion"]} | {"None"}
    assert kinds == expected  # all 16 members plus NONE
    root = m.ivalues[m.state_obj].value
    attrs = dict(zip(m.object_types[root.type_index].attr_names, root.attrs))

    def value(name):
        return m.ivalues[attrs[name]]

    d = value("d").value
    assert value("d").kind == "Dict" and d.annotation == "Dict[str, int]"
    assert {m.ivalues[k].value: m.ivalues[v].value for k, v in zip(d.keys, d.values)} == {"a": 1, "b": 2}
    names = value("names").value
    assert [m.ivalues[i].value for i in names.items] == ["x", "y"] and names.annotation == "List[str]"
    assert value("flags") == mobile.IValue("BoolList", [True, False, True])
    assert value("floats") == mobile.IValue("DoubleList", [1.5, -2.0])
    assert value("ints") == mobile.IValue("IntList", [3, 4, 5])
    assert [m.ivalues[i].value for i in value("pair").value] == [7, "seven"]
    assert value("c") == mobile.IValue("ComplexDouble", complex(1.0, -2.0))
    assert value("f") == mobile.IValue("Double", 0.25)
    assert value("dev") == mobile.IValue("Device", "cpu")
    enums = [iv.value for iv in m.ivalues if iv.kind == "EnumValue"]
    assert sorted(m.ivalues[e.value].value for e in enums) == [1, 2]
    assert all(e.type_name.endswith("Color") for e in enums)
    assert {"tensors.0", "tensors.1", "lin.weight", "lin.bias"} == set(m.named_tensors())
    fns = {fn.name: fn for fn in m.method_functions}
    assert [(a.name, a.type) for a in fns["forward"].schema.arguments][1:] == [
        ("x", "Tensor"),
        ("color", fns["forward"].schema.arguments[2].type),
    ]
    default = m.ivalues[fns["forward"].schema.arguments[2].default_value]
    assert default.kind == "EnumValue" and m.ivalues[default.value.value].value == Color.RED.value


def test_extra_files_are_bytes(tmp_path):
    scripted = torch.jit.script(nn.Linear(2, 2))
    path = tmp_path / "extra.ff"
    torch.jit.save_jit_module_to_flatbuffer(scripted, str(path), _extra_files={"blob": b"\xff\x00\x01", "text": "héllo"})
    m = read_mobile_module(path.read_bytes())
    assert m.extra_files == {"blob": b"\xff\x00\x01", "text": "héllo".encode()}


def _lite_only(tmp_path) -> pathlib.Path:
    """A flatbuffer saved from a lite-interpreter module: no TorchScript source in it."""
    import torch.jit.mobile  # noqa: PLC0415

    scripted = torch.jit.script(MLP().eval())
    lite = torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(scripted._save_to_buffer_for_lite_interpreter()))
    path = tmp_path / "lite_only.ff"
    torch._C._save_mobile_module(lite._c, str(path), {})
    return path


def test_lite_only_file_reads_without_sources(tmp_path):
    path = _lite_only(tmp_path)
    m = read_mobile_module(path.read_bytes())
    assert not m.jit_sources
    assert set(m.named_tensors()) == set(MLP().state_dict())
    assert m.operator_names() == torch._C._get_module_info_from_flatbuffer(path.read_bytes())["opname_to_num_args"]


# ----------------------------------------------------------------------------------------------
# Validation: targeted corruptions, located with the flatc bindings


def _function_table(data: bytes):
    from mps_backend.serialization.generated.mobile.Function import Function  # noqa: PLC0415
    from mps_backend.serialization.generated.mobile.IValueUnion import IValueUnion  # noqa: PLC0415
    from mps_backend.serialization.generated.mobile.Module import Module  # noqa: PLC0415

    root = Module.GetRootAs(data, 0)
    for i in range(root.IvaluesLength()):
        iv = root.Ivalues(i)
        if iv.ValType() == IValueUnion.Function:
            fn = Function()
            fn.Init(iv.Val().Bytes, iv.Val().Pos)
            return root, fn
    raise AssertionError("no function")


def _tensor_table(data: bytes):
    from mps_backend.serialization.generated.mobile.IValueUnion import IValueUnion  # noqa: PLC0415
    from mps_backend.serialization.generated.mobile.Module import Module  # noqa: PLC0415
    from mps_backend.serialization.generated.mobile.TensorMetadata import TensorMetadata  # noqa: PLC0415

    root = Module.GetRootAs(data, 0)
    for i in range(root.IvaluesLength()):
        iv = root.Ivalues(i)
        if iv.ValType() == IValueUnion.TensorMetadata:
            t = TensorMetadata()
            t.Init(iv.Val().Bytes, iv.Val().Pos)
            if t._tab.Offset(4):  # storage_location_index written (not the default 0)
                return t
    raise AssertionError("no tensor")


def _patch(data: bytes, pos: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def _field_pos(tab, vtable_offset: int) -> int:
    off = tab.Offset(vtable_offset)
    assert off, "field absent"
    return tab.Pos + off


def _corruptions(data: bytes) -> dict[str, tuple[bytes, str]]:
    _, fn = _function_table(data)
    inst0 = fn.Instructions(0)._tab.Pos
    tensor = _tensor_table(data)
    sizes = tensor._tab.Vector(tensor._tab.Offset(10))
    op_slot = next(k for k in range(fn.InstructionsLength()) if fn.Instructions(k).Op() == 0)
    return {
        "bad opcode": (_patch(data, inst0, "<b", 99), "opcode 99 is not a torch OpCode"),
        "operator index": (_patch(data, fn.Instructions(op_slot)._tab.Pos + 4, "<i", 1000), "operator 1000 out of range"),
        "tensor extent": (_patch(data, sizes, "<i", 10_000), "reaches"),
        "storage index": (_patch(data, _field_pos(tensor._tab, 4), "<I", 77), "storage_location_index 77"),
        "scalar type": (_patch(data, _field_pos(tensor._tab, 6), "<b", 120), "scalar_type 120"),
        "identifier": (data[:4] + b"XXXX" + data[8:], "identifier"),
        "truncated": (data[: len(data) // 2], "outside the flatbuffer"),
        "empty": (b"", "too short"),
    }


@pytest.mark.parametrize(
    "case", ["bad opcode", "operator index", "tensor extent", "storage index", "scalar type", "identifier", "truncated", "empty"]
)
def test_targeted_corruptions_raise_typed_errors(saved, case):
    data, message = _corruptions(saved["convnet"].data)[case]
    with pytest.raises(MobileFormatError, match=message):
        read_mobile_module(data)
    assert issubclass(MobileFormatError, ValueError)


def test_reader_rejects_non_bytes():
    with pytest.raises(TypeError):
        read_mobile_module("not bytes")


# ----------------------------------------------------------------------------------------------
# mps-backend inspect


def test_op_coverage_classification():
    registry = {"aten::relu", "aten::mean.dim", "aten::add.Tensor", "aten::convolution"}
    cov = legacy.op_coverage(
        [
            "aten::relu",
            "aten::mean.dim",
            "aten::conv2d",
            "aten::add.Scalar",
            "aten::relu_",
            "aten::add_.Tensor",
            "aten::size",
            "aten::sub.int",
            "prim::TupleUnpack",
            "quantized::linear",
        ],
        registry,
    )
    assert {k: v.status for k, v in cov.items()} == {
        "aten::relu": "lowered",
        "aten::mean.dim": "lowered",
        "aten::conv2d": "composite",
        "aten::relu_": "inplace",
        "aten::add_.Tensor": "inplace",
        "aten::add.Scalar": "other-overload",
        "aten::size": "builtin",
        "aten::sub.int": "builtin",
        "prim::TupleUnpack": "builtin",
        "quantized::linear": "none",
    }
    assert "aten::add.Tensor" in cov["aten::add.Scalar"].detail


def test_inspect_cli(saved, capsys):
    s = saved["convnet"]
    assert cli.main(["inspect", str(s.path)]) == 0
    out = capsys.readouterr().out
    assert "PyTorch Mobile flatbuffer module (PTMF)" in out
    assert "forward(x: Tensor) -> Tensor" in out
    assert "aten::conv2d" in out and "composite" in out
    assert "aten::relu" in out and "MPS lowering" in out
    lines = dict(line.split(None, 1) for line in out.split("== parameters")[1].splitlines()[1:])
    assert lines == {
        key: f"Float{list(t.shape)}" if t.dtype == torch.float32 else f"Long{list(t.shape)}"
        for key, t in s.eager.state_dict().items()
    }


def test_inspect_cli_ptl_multi_method_and_malformed(saved, tmp_path, capsys):
    assert cli.main(["inspect", str(saved["mlp"].path)]) == 0
    assert "net.0.weight" in capsys.readouterr().out
    assert cli.main(["inspect", str(saved["multi"].path)]) == 0
    out = capsys.readouterr().out
    assert "encode(x: Tensor) -> Tensor" in out and "scale(x: Tensor, k: float) -> Tensor" in out
    assert legacy.INPUT_SHAPES_FILE in out
    bad = tmp_path / "bad.ff"
    bad.write_bytes(saved["convnet"].data[:200])
    assert cli.main(["inspect", str(bad)]) == 2
    assert "malformed PyTorch Mobile flatbuffer" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# Migration: mps-backend export --model legacy.ff


def test_parse_input_shape():
    assert legacy.parse_input_shape("1,3,32,32") == ((1, 3, 32, 32), torch.float32)
    assert legacy.parse_input_shape("2x16:int64") == ((2, 16), torch.int64)
    assert legacy.parse_input_shape("scalar") == ((), torch.float32)
    with pytest.raises(SystemExit, match="not a torch dtype"):
        legacy.parse_input_shape("1,2:floaty")
    with pytest.raises(SystemExit, match="comma-separated"):
        legacy.parse_input_shape("a,b")
    extra = legacy.input_shapes_extra_file([(1, 2), ((3,), torch.int64)])
    assert json.loads(extra[legacy.INPUT_SHAPES_FILE]) == [[1, 2], {"shape": [3], "dtype": "int64"}]


@pytest.mark.parametrize(
    "name,args",
    [
        ("convnet", ["--input-shape", "1,3,16,16"]),
        ("mlp", ["--input-shape", "2,16", "--fp32"]),
        ("multi", []),  # shapes from the extra file
        ("quantized", ["--input-shape", "1,3,8,8", "--fp32"]),
    ],
)
def test_export_migrates_and_verifies(saved, tmp_path, capsys, name, args):
    s = _get(saved, name)
    out = tmp_path / f"{name}.pte"
    status = cli.main(["export", "--model", str(s.path), *args, "--verify", "-o", str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.out + captured.err
    assert "verify:" in captured.out and "OK" in captured.out
    assert out.read_bytes()[4:8] == b"ET12"
    if name == "multi":
        assert "not converted: encode, scale" in captured.err


def test_load_legacy_checks_against_torchscript(saved):
    s = saved["convnet"]
    model, inputs = legacy.load_legacy(str(s.path), ["1,3,16,16"], progress=lambda msg: None)
    assert isinstance(model.reference_module, torch.jit.ScriptModule)
    assert "reference_module" not in dict(model.named_modules())
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs), s.eager(*inputs))


def test_export_errors(saved, tmp_path):
    quiet = {"progress": lambda msg: None}
    with pytest.raises(SystemExit, match="no input shapes.*--input-shape.*x: Tensor"):
        legacy.load_legacy(str(saved["convnet"].path), None, **quiet)
    with pytest.raises(SystemExit, match="forward takes 1 input"):
        legacy.load_legacy(str(saved["convnet"].path), ["1,3,16,16", "1"], **quiet)
    with pytest.raises(SystemExit, match="no TorchScript source.*lite-interpreter"):
        legacy.load_legacy(str(_lite_only(tmp_path)), ["2,16"], **quiet)
    zipped = tmp_path / "zipped.ptl"
    saved["mlp"].scripted._save_for_lite_interpreter(str(zipped))
    with pytest.raises(SystemExit, match="zip archive"):
        legacy.load_legacy(str(zipped), ["2,16"], **quiet)
    with pytest.raises(SystemExit, match="does not exist"):
        legacy.load_legacy(str(tmp_path / "missing.ff"), ["2,16"], **quiet)
    with pytest.raises(SystemExit, match="--input-shape applies"):
        cli.main(["export", "--model", "demo", "--input-shape", "1,2"])


def test_export_error_when_the_converter_fails(tmp_path):
    if not _quantized_engine():
        pytest.skip("no quantized engine")
    dynamic = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(8, 4)).eval(), {nn.Linear}, dtype=torch.qint8)
    path = tmp_path / "dynamic.ff"
    torch.jit.save_jit_module_to_flatbuffer(torch.jit.script(dynamic), str(path))
    with pytest.raises(SystemExit, match="TS2EPConverter could not convert"):
        legacy.load_legacy(str(path), ["1,8"], progress=lambda msg: None)
