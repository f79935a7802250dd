"""Legacy PyTorch Mobile (lite interpreter) flatbuffer models: inspect them, migrate them to MPS.

Such files (``torch.jit.save_jit_module_to_flatbuffer``, ``module._save_for_lite_interpreter(path,
_use_flatbuffer=True)``) carry the identifier ``PTMF`` at bytes 4-7; ``serialization/mobile.py``
reads them.

* ``inspect_mobile(path)`` (``mps-backend inspect model.ff``): methods, operator histogram,
  parameters, and which operators the MPS lowering covers. Mobile files hold TorchScript-level,
  pre-decomposition operators (``aten::conv2d``, ``aten::linear``, ...) while the MPS registry
  holds the ATen overloads left after ``torch.export`` decomposition, so an operator is matched
  by its exact ``aten::name.overload`` name first, then by op name (other overloads), and
  composite operators (``CompositeImplicitAutograd``: export decomposes them) are only reported
  as such: whether their decomposition lowers shows in ``mps-backend export``'s report.

* ``load_legacy(path, input_shapes)`` (``mps-backend export --model model.ff --input-shape
  1,3,32,32 [--verify]``): ``torch.jit.load`` rebuilds the ScriptModule from the TorchScript
  source the file carries (``jit_sources``), ``TS2EPConverter(module, inputs).convert()`` turns its
  ``forward`` into an ExportedProgram, whose module is then lowered like any other model; the
  ``.pte`` is verified against the TorchScript module's own output (``reference_module``). Only
  ``forward`` is migrated; other exported methods are listed in a warning. Files without
  TorchScript source (saved from a lite-interpreter module) cannot be converted: a
  ``SystemExit`` says so and what to do instead.

Input shapes. The file has none. Give one ``--input-shape`` per ``forward`` input, in order:
``1,3,32,32`` (float32) or ``1,16:int64`` (any torch dtype name; integer and bool inputs are
zeros, floating ones seeded ``randn``). Or store them in the file when saving, as the extra file
``mps_backend/input_shapes.json`` (``INPUT_SHAPES_FILE``): a JSON list with one entry per input,
either a shape list ``[1, 3, 32, 32]`` or ``{"shape": [1, 16], "dtype": "int64"}``::

    torch.jit.save_jit_module_to_flatbuffer(scripted, "model.ff",
                                            _extra_files=input_shapes_extra_file([(1, 3, 32, 32)]))

``--input-shape`` wins over the extra file.
"""

from __future__ import annotations

import json
import pathlib
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from mps_backend.operators import default_registry
from mps_backend.serialization.mobile import IDENTIFIER, MobileFormatError, MobileModule, is_mobile_flatbuffer, read_mobile_module

#: extra file holding the forward inputs' shapes (see the module docstring)
INPUT_SHAPES_FILE = "mps_backend/input_shapes.json"
#: model-spec suffixes handled here (``mps-backend export --model``)
SUFFIXES = (".ff", ".ptl")
#: max |converted - TorchScript| / max|TorchScript| accepted for the conversion (both float32 CPU)
CONVERSION_TOLERANCE = 1e-5


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def is_mobile_file(path: str | pathlib.Path) -> bool:
    """True for an existing file with ``PTMF`` at bytes 4-7."""
    p = pathlib.Path(path)
    try:
        with p.open("rb") as f:
            return is_mobile_flatbuffer(f.read(8))
    except OSError:
        return False


def handles(spec: str) -> bool:
    """Whether a ``--model`` spec names a legacy mobile file: a ``.ff``/``.ptl`` path, or any
    file carrying the PTMF identifier."""
    return spec.lower().endswith(SUFFIXES) or is_mobile_file(spec)


# ----------------------------------------------------------------------------------------------
# MPS coverage of mobile operators


@dataclass(frozen=True)
class OpCoverage:
    name: str  # qualified mobile name, "aten::mean.dim"
    status: str  # lowered | inplace | other-overload | composite | builtin | none
    detail: str


def _registry_names() -> set[str]:
    return {t.name() for t in default_registry().targets if isinstance(t, torch._ops.OpOverload)}


def _is_composite(qualified: str) -> bool | None:
    """True/False for a dispatcher operator; None when it is not one (a TorchScript builtin such as
    ``aten::size`` or ``prim::TupleUnpack``, which only the JIT interpreter knows)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CompositeImplicitAutograd")
    except (RuntimeError, ValueError):  # "operator ... does not exist" (a ValueError if torch's message
        return None  # cuts a multi-byte character of an odd name)


def op_coverage(names: Sequence[str], registry: set[str] | None = None) -> dict[str, OpCoverage]:
    """Classify mobile operator names against the MPS registry (``aten::name.overload`` spelling;
    the default overload is spelled without suffix, as both torch and OpOverload.name() do)."""
    registry = _registry_names() if registry is None else registry
    by_op: dict[str, list[str]] = {}
    for r in registry:
        by_op.setdefault(r.split(".", 1)[0], []).append(r)
    out = {}
    for name in names:
        op, dot, overload = name.partition(".")
        functional = op[:-1] + dot + overload if op.endswith("_") and not op.endswith("__") else None
        composite = _is_composite(name)
        if name in registry:
            out[name] = OpCoverage(name, "lowered", "MPS lowering")
        elif composite is None:
            out[name] = OpCoverage(
                name, "builtin", "TorchScript builtin (not an ATen kernel): the converter turns it into graph structure or Python"
            )
        elif functional in registry:
            out[name] = OpCoverage(
                name, "inplace", f"in-place: torch.export functionalizes it to {functional}, which has an MPS lowering"
            )
        elif composite:
            out[name] = OpCoverage(
                name,
                "composite",
                "composite: torch.export decomposes it; the MPS coverage of its decomposition shows in `mps-backend export`",
            )
        elif op in by_op:
            out[name] = OpCoverage(name, "other-overload", "MPS lowering for other overload(s): " + ", ".join(sorted(by_op[op])))
        else:
            out[name] = OpCoverage(name, "none", "no MPS lowering (stays on CPU if ExecuTorch has a kernel)")
    return out


# ----------------------------------------------------------------------------------------------
# inspect


def _signature(module: MobileModule, fn) -> str:
    if fn.schema is None:
        return f"{fn.name}(...)"
    args = [f"{a.name}: {a.type}" for a in fn.schema.arguments[1:]]  # [0] is self
    rets = [a.type for a in fn.schema.returns]
    ret = rets[0] if len(rets) == 1 else f"({', '.join(rets)})"
    return f"{fn.name}({', '.join(args)}) -> {ret}"


def describe(module: MobileModule, label: str, registry: set[str] | None = None) -> str:
    """The ``mps-backend inspect`` report of one mobile module."""
    m = module
    lines = [
        f"{label}: PyTorch Mobile flatbuffer module ({IDENTIFIER.decode()}), {m.size:,} bytes",
        f"   bytecode version {m.bytecode_version}, operator version "
        f"{'-' if m.operator_version is None else m.operator_version}, root type {m.root_type}, "
        f"{len(m.ivalues)} ivalues, {len(m.object_types)} object types, {len(m.storages)} storages",
    ]
    if m.jit_sources:
        lines.append(
            f"   TorchScript source: {len(m.jit_sources)} file(s): migratable with "
            f"`mps-backend export --model {label} --input-shape ...`"
        )
    else:
        lines.append(
            "   TorchScript source: none (lite-interpreter-only file): inspectable, not convertible to an ExportedProgram"
        )
    if m.extra_files:
        files = sorted(m.extra_files.items())
        lines.append("   extra files: " + ", ".join(f"{k} ({len(v):,} bytes)" for k, v in files))
    methods = m.method_functions
    lines.append(f"\n== methods ({len(methods)})")
    for fn in methods:
        lines.append(f"   {_signature(m, fn)}")
        lines.append(
            f"      {fn.qualified_name}: {len(fn.instructions)} instructions, "
            f"{len(fn.operators)} operators, {fn.register_size} registers"
        )
    others = [f for f in m.functions if f not in methods]
    if others:
        lines.append("   other functions: " + ", ".join(f.qualified_name for f in others))

    hist = m.operator_histogram()
    for fn in m.functions:  # operators listed but never called still count as present
        for op in fn.operators:
            hist.setdefault(op.qualified_name, 0)
    coverage = op_coverage(sorted(hist), registry)
    counts = {
        s: sum(1 for c in coverage.values() if c.status == s)
        for s in ("lowered", "inplace", "other-overload", "composite", "builtin", "none")
    }
    lines.append(
        f"\n== operators ({len(hist)} kinds, {sum(hist.values())} call sites; "
        f"{counts['lowered']} with an MPS lowering, {counts['inplace']} in-place of one, "
        f"{counts['composite']} composite, {counts['other-overload']} other overload, "
        f"{counts['builtin']} TorchScript builtins, {counts['none']} without)"
    )
    width = max((len(n) for n in hist), default=0)
    for name, n in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"   {n:5d}  {name:<{width}}  {coverage[name].detail}")

    tensors = m.named_tensors()
    numel = sum(t.numel for t in tensors.values())
    nbytes = sum(t.numel * t.itemsize for t in tensors.values())
    lines.append(f"\n== parameters and buffers ({len(tensors)} tensors, {numel:,} elements, {nbytes:,} bytes)")
    width = max((len(n) for n in tensors), default=0)
    for name, t in tensors.items():
        quant = f"  quantized {t.quantized_schema.qscheme}" if t.quantized_schema else ""
        lines.append(f"   {name:<{width}}  {t.dtype}{list(t.sizes)}{quant}")
    return "\n".join(lines)


def inspect_mobile(path: str | pathlib.Path, out: Callable[[str], None] = print) -> int:
    """Print the report of a mobile file; 0 when it reads, 2 when it is malformed."""
    data = pathlib.Path(path).read_bytes()
    try:
        module = read_mobile_module(data)
    except MobileFormatError as e:
        print(f"{path}: malformed PyTorch Mobile flatbuffer: {e}", file=sys.stderr)
        return 2
    out(describe(module, str(path)))
    return 0


# ----------------------------------------------------------------------------------------------
# migration


def parse_input_shape(text: str) -> tuple[tuple[int, ...], torch.dtype]:
    """``"1,3,32,32"`` -> ((1, 3, 32, 32), float32); ``"1,16:int64"`` -> ((1, 16), int64); ``""``
    or ``"scalar"`` is a 0-d tensor."""
    shape_text, _, dtype_text = text.partition(":")
    dtype = torch.float32
    if dtype_text:
        dtype = getattr(torch, dtype_text.strip(), None)
        if not isinstance(dtype, torch.dtype):
            raise SystemExit(f"--input-shape {text!r}: {dtype_text!r} is not a torch dtype (e.g. float32, int64)")
    shape_text = shape_text.strip()
    if shape_text in ("", "scalar"):
        return (), dtype
    try:
        shape = tuple(int(s) for s in shape_text.replace("x", ",").split(","))
    except ValueError:
        raise SystemExit(f"--input-shape {text!r}: expected comma-separated sizes like 1,3,32,32") from None
    if any(s < 0 for s in shape):
        raise SystemExit(f"--input-shape {text!r}: negative size")
    return shape, dtype


def input_shapes_extra_file(shapes: Sequence[Sequence[int] | tuple[Sequence[int], torch.dtype]]) -> dict[str, str]:
    """``_extra_files`` entry recording the forward inputs' shapes (and dtypes) in a saved file."""
    entries = []
    for s in shapes:
        if len(s) == 2 and isinstance(s[1], torch.dtype):
            entries.append({"shape": [int(d) for d in s[0]], "dtype": str(s[1]).removeprefix("torch.")})
        else:
            entries.append([int(d) for d in s])
    return {INPUT_SHAPES_FILE: json.dumps(entries)}


def _shapes_from_extra_file(module: MobileModule, label: str) -> list[tuple[tuple[int, ...], torch.dtype]] | None:
    raw = module.extra_files.get(INPUT_SHAPES_FILE)
    if raw is None:
        return None
    try:
        entries = json.loads(raw)
        out = []
        for e in entries:
            if isinstance(e, dict):
                shape, dtype = e["shape"], e.get("dtype", "float32")
            else:
                shape, dtype = e, "float32"
            out.append(parse_input_shape(",".join(str(int(d)) for d in shape) + f":{dtype}"))
        return out
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise SystemExit(
            f"{label}: extra file {INPUT_SHAPES_FILE} is not a JSON list of shapes "
            f'([[1, 3, 32, 32]] or [{{"shape": [1, 16], "dtype": "int64"}}]): {e}'
        ) from None


def make_inputs(specs: Sequence[tuple[tuple[int, ...], torch.dtype]], seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(shape, generator=gen).to(dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
        for shape, dtype in specs
    )


class MigratedModule(torch.nn.Module):
    """The ExportedProgram converted from a TorchScript module, as an eager module ``torch.export``
    can export again. ``reference_module`` (not a registered submodule) is the TorchScript module
    whose own outputs the ``.pte`` is verified against."""

    def __init__(self, program: torch.fx.GraphModule, reference: torch.jit.ScriptModule, source: str) -> None:
        super().__init__()
        # a plain GraphModule copy: ExportedProgram.module() refuses .eval()/.train()
        self.program = torch.fx.GraphModule(program, program.graph)
        object.__setattr__(self, "reference_module", reference)
        self.source = source

    def forward(self, *args):
        return self.program(*args)


def _forward_inputs(module: MobileModule) -> list[str]:
    for fn in module.method_functions:
        if fn.name == "forward" and fn.schema is not None:
            return [f"{a.name}: {a.type}" for a in fn.schema.arguments[1:]]
    return []


def load_legacy(
    path: str, input_shapes: Sequence[str] | None = None, progress: Callable[[str], None] = _say
) -> tuple[MigratedModule, tuple[torch.Tensor, ...]]:
    """(model, example_inputs) for ``mps-backend export --model path`` on a mobile flatbuffer file."""
    from torch._export.converter import TS2EPConverter  # noqa: PLC0415

    file = pathlib.Path(path)
    if not file.is_file():
        raise SystemExit(f"model file {file} does not exist")
    data = file.read_bytes()
    if not is_mobile_flatbuffer(data):
        kind = "a zip archive (zip-format lite-interpreter or TorchScript file)" if data[:2] == b"PK" else "not"
        raise SystemExit(
            f"{file}: bytes 4-7 are {data[4:8]!r}, not {IDENTIFIER!r}: {kind} a PyTorch Mobile "
            "flatbuffer; re-save it with torch.jit.save_jit_module_to_flatbuffer or export the "
            "original model (--model file.py:factory)"
        )
    try:
        module = read_mobile_module(data)
    except MobileFormatError as e:
        raise SystemExit(f"{file}: malformed PyTorch Mobile flatbuffer: {e}") from None
    if not module.jit_sources:
        raise SystemExit(
            f"{file}: the file has no TorchScript source (it was saved from a lite-interpreter module), so "
            "torch.jit.load cannot rebuild a ScriptModule and TS2EPConverter cannot convert it. Instead: "
            "export the original model (--model path/file.py:factory), or re-save its ScriptModule with "
            "torch.jit.save_jit_module_to_flatbuffer(scripted, path) (which keeps the source). "
            f"`mps-backend inspect {file}` still lists its operators and parameters."
        )
    wanted = _forward_inputs(module)
    if input_shapes:
        specs = [parse_input_shape(s) for s in input_shapes]
    else:
        specs = _shapes_from_extra_file(module, str(file))
        if specs is None:
            raise SystemExit(
                f"{file}: no input shapes: the file does not record them. Pass one --input-shape per "
                f"forward input ({', '.join(wanted) or 'see `mps-backend inspect`'}), e.g. "
                f"--input-shape 1,3,32,32, or save them in the extra file {INPUT_SHAPES_FILE}"
            )
    if wanted and len(specs) != len(wanted):
        raise SystemExit(f"{file}: forward takes {len(wanted)} input(s) ({', '.join(wanted)}), {len(specs)} shape(s) given")
    others = [fn.name for fn in module.method_functions if fn.name != "forward" and not fn.name.startswith("__")]
    if others:
        progress(f"[legacy] note: only forward is migrated; other exported methods not converted: {', '.join(others)}")

    progress(f"[legacy] torch.jit.load {file} (TorchScript from {len(module.jit_sources)} source file(s))")
    try:
        with warnings.catch_warnings():  # "torch.jit.load is deprecated": loading old files is the point
            warnings.simplefilter("ignore", FutureWarning)
            scripted = torch.jit.load(str(file))
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError and others with a message
        raise SystemExit(f"{file}: torch.jit.load failed: {type(e).__name__}: {str(e).strip()}") from None
    scripted.eval()
    inputs = make_inputs(specs)
    progress("[legacy] TS2EPConverter: TorchScript -> ExportedProgram")
    try:
        with torch.no_grad():
            expected = scripted(*inputs)
        program = TS2EPConverter(scripted, inputs).convert()
    except Exception as e:  # noqa: BLE001 - the converter raises many types; the message is the point
        raise SystemExit(
            f"{file}: TS2EPConverter could not convert the TorchScript module: {type(e).__name__}: {str(e).strip()[:500]}"
        ) from None
    model = MigratedModule(program.module(), scripted, str(file)).eval()
    _check_conversion(model, expected, inputs, file)
    return model, inputs


def _outputs(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    from torch.utils import _pytree  # noqa: PLC0415

    return [t for t in _pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _check_conversion(model: MigratedModule, expected, inputs, file) -> None:
    with torch.no_grad():
        got = model(*inputs)
    e_list, g_list = _outputs(expected), _outputs(got)
    if len(e_list) != len(g_list):
        raise SystemExit(f"{file}: the converted program returns {len(g_list)} tensors, TorchScript {len(e_list)}")
    for k, (g, e) in enumerate(zip(g_list, e_list)):
        if g.shape != e.shape:
            raise SystemExit(f"{file}: converted output {k} has shape {list(g.shape)}, TorchScript {list(e.shape)}")
        if e.dtype.is_floating_point:
            scale = e.abs().max().item() if e.numel() else 0.0
            err = (g.float() - e.float()).abs().max().item() if e.numel() else 0.0
            if not err <= CONVERSION_TOLERANCE * max(scale, 1e-12):
                raise SystemExit(
                    f"{file}: the converted program differs from TorchScript on output {k} "
                    f"(max abs error {err:.3g}, output scale {scale:.3g})"
                )
        elif not torch.equal(g, e):
            raise SystemExit(f"{file}: the converted program differs from TorchScript on output {k}")
