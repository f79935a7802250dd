"""Seeded fuzzing of the PyTorch Mobile reader: every mutant of a torch-saved module decodes or raises
MobileFormatError, and what decodes can be described (``mps-backend inspect``) without error.

Bases: a convnet (torch.jit.save_jit_module_to_flatbuffer), an MLP (_save_for_lite_interpreter with
_use_flatbuffer=True), a module whose attributes cover every IValue union member, a lite-interpreter-
only file (no TorchScript source), and a quantized convnet when torch has a quantized engine.
Mutations: byte flips, truncations, extensions, random/plausible u32 and u16 writes, and writes of
small values into union type tags and instruction opcodes (located with the flatc bindings). The
decoder has no timeouts: its work is bounded by the file size, checked here per mutant by counting
function calls (deterministic; a clock would measure the machine's load).
"""

from __future__ import annotations

import enum
import io
import random
import time
import warnings
from typing import Dict, List, Tuple

import pytest
import torch
from torch import nn

from mps_backend.serialization.mobile import (
    MobileFormatError,
    MobileModule,
    read_mobile_module,
)
from mps_backend.tools import legacy
from tests.work_count import CallCount

MUTANTS = 10_000
# function calls per byte of the file while decoding and describing a mutant; the valid bases need
# about 1.2, a decoder that revisits shared objects or loops on a bad offset needs far more
MAX_CALLS_PER_BYTE = 4
FIXED_CALLS = 1000  # setting up the reader, whatever the size
INTERESTING_U32 = (0, 1, 2, 4, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC, 0xFFFF, 0x10000)

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class Mode(enum.Enum):
    A = 1
    B = 2


class Attrs(nn.Module):
    def __init__(self):
        super().__init__()
        self.d: Dict[str, int] = {"a": 1}
        self.names: List[str] = ["x"]
        self.flags: List[bool] = [True, False]
        self.floats: List[float] = [0.5]
        self.ints: List[int] = [3, 4]
        self.pair: Tuple[int, str] = (7, "s")
        self.c = complex(1.0, 2.0)
        self.dev = torch.device("cpu")
        self.lin = nn.Linear(2, 2)

    def forward(self, x, mode: Mode = Mode.A):
        y = self.lin(x)
        if mode == Mode.B:
            y = y * 2.0
        return y + float(self.d["a"]) + len(self.names)

    @torch.jit.export
    def twice(self) -> complex:
        return self.c * 2


class Quant(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv = nn.Conv2d(3, 2, 3)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        return self.dequant(self.conv(self.quant(x)))


def _script(model: nn.Module) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.script(model.eval())


def bases(folder) -> dict[str, bytes]:
    import torch.jit.mobile  # noqa: PLC0415

    torch.manual_seed(0)
    out = {}
    buf = io.BytesIO()
    torch.jit.save_jit_module_to_flatbuffer(_script(Net()), buf)
    out["convnet"] = buf.getvalue()
    mlp = _script(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    mlp._save_for_lite_interpreter(str(folder / "mlp.ptl"), _use_flatbuffer=True)  # a path only
    out["mlp"] = (folder / "mlp.ptl").read_bytes()
    buf = io.BytesIO()
    torch.jit.save_jit_module_to_flatbuffer(_script(Attrs()), buf, _extra_files={"blob": b"\xff\x00"})
    out["attrs"] = buf.getvalue()
    lite = torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(mlp._save_to_buffer_for_lite_interpreter()))
    out["lite_only"] = bytes(torch._C._save_mobile_module_to_bytes(lite._c, {}))
    engines = torch.backends.quantized.supported_engines
    engine = next((e for e in ("fbgemm", "x86", "qnnpack") if e in engines), None)
    if engine:
        torch.backends.quantized.engine = engine
        model = Quant().eval()
        model.qconfig = torch.ao.quantization.get_default_qconfig(engine)
        prepared = torch.ao.quantization.prepare(model)
        prepared(torch.randn(2, 3, 6, 6))
        buf = io.BytesIO()
        torch.jit.save_jit_module_to_flatbuffer(_script(torch.ao.quantization.convert(prepared)), buf)
        out["quantized"] = buf.getvalue()
    return out


def small_value_positions(data: bytes) -> list[int]:
    """Positions of union type tags and instruction opcodes (flatc bindings)."""
    from mps_backend.serialization.generated.mobile.Function import Function  # noqa: PLC0415
    from mps_backend.serialization.generated.mobile.Module import Module  # noqa: PLC0415

    root = Module.GetRootAs(data, 0)
    out = []
    for i in range(root.IvaluesLength()):
        iv = root.Ivalues(i)
        if iv._tab.Offset(4):
            out.append(iv._tab.Pos + iv._tab.Offset(4))
        if iv.ValType() == 16:  # Function
            fn = Function()
            fn.Init(iv.Val().Bytes, iv.Val().Pos)
            out += [fn.Instructions(k)._tab.Pos for k in range(fn.InstructionsLength())]
    return out


def mutate(rng: random.Random, data: bytes, tags: list[int]) -> tuple[str, bytes]:
    b = bytearray(data)
    kind = rng.randrange(8)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= rng.randint(1, 255)
        return "flip", bytes(b)
    if kind == 1:
        return "truncate", bytes(b[: rng.randrange(len(b))])
    if kind == 2:
        return "extend", bytes(b + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))
    if kind in (3, 4):
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(0, len(b) - 3) & ~3
            value = rng.choice(INTERESTING_U32) if rng.random() < 0.5 else rng.randrange(2**32)
            if rng.random() < 0.3:  # a plausible in-buffer offset
                value = rng.randrange(len(b))
            b[pos : pos + 4] = value.to_bytes(4, "little")
        return "u32 write", bytes(b)
    if kind == 5:
        pos = rng.randrange(0, len(b) - 1) & ~1
        b[pos : pos + 2] = rng.randrange(2**16).to_bytes(2, "little")
        return "u16 write", bytes(b)
    if kind == 6 and tags:
        for _ in range(rng.randint(1, 2)):
            b[rng.choice(tags)] = rng.randrange(0, 24)
        return "tag/opcode write", bytes(b)
    pos = rng.randrange(len(b))
    b[pos] = rng.choice((0, 1, 2, 0x7F, 0x80, 0xFF))
    return "byte write", bytes(b)


def _use(module: MobileModule, registry: set[str]) -> None:
    """What `mps-backend inspect` does with a decoded module; must work on anything that validated."""
    module.named_tensors()
    module.operator_histogram()
    legacy.describe(module, "mutant", registry)


@pytest.mark.long
def test_fuzz_mobile_reader(tmp_path):
    base = bases(tmp_path)
    registry = {"aten::relu", "aten::linear", "aten::mean.dim"}
    for data in base.values():
        _use(read_mobile_module(data), registry)
    items = [(name, data, small_value_positions(data)) for name, data in base.items()]
    rng = random.Random(20240611)
    outcome = {"valid": 0, "MobileFormatError": 0}
    start_all = time.perf_counter()
    worst = 0.0
    for i in range(MUTANTS):
        name, data, tags = rng.choice(items)
        kind, mutant = mutate(rng, data, tags)
        work = CallCount()
        try:
            with work:
                module = read_mobile_module(mutant)
        except MobileFormatError as e:
            assert str(e), "a MobileFormatError must say what is wrong"
            outcome["MobileFormatError"] += 1
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"mutant {i} of {name} ({kind}, {len(mutant)} bytes): {type(e).__name__}: {e}\nhex: {mutant.hex()}")
        else:
            outcome["valid"] += 1
            try:
                with work:
                    _use(module, registry)
            except Exception as e:  # noqa: BLE001
                pytest.fail(
                    f"mutant {i} of {name} ({kind}) decoded but describing it failed: "
                    f"{type(e).__name__}: {e}\nhex: {mutant.hex()}"
                )
        assert work.calls <= FIXED_CALLS + MAX_CALLS_PER_BYTE * len(mutant), (
            f"mutant {i} of {name} ({kind}, {len(mutant)} bytes) made {work.calls} calls"
        )
        worst = max(worst, work.calls / max(len(mutant), 1))
    total = time.perf_counter() - start_all
    # not vacuous: many mutants rejected, some (e.g. in tensor bytes or source text) still valid
    assert outcome["MobileFormatError"] > MUTANTS // 4 and outcome["valid"] > MUTANTS // 100, outcome
    print(f"{MUTANTS} mutants of {len(base)} modules in {total:.1f}s: {outcome}, at most {worst:.2f} calls per byte")
