"""The emulator: whole .pte files with MPSBackend delegates through ExecuTorch's own runtime.

Plumbing tests replace ``shim_bridge._execute_delegate`` (the one place that calls the
interpreter) with a stand-in; the fixture tests at the end run the real interpreter.
The shim is compiled once per machine into the user cache (about a second with g++ 12);
``test_build_*`` compile a second copy into a temporary cache directory.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from mps_backend.runtime import (
    EmulatorBuildError,
    EmulatorError,
    InputMismatchError,
    emulator,
    load_emulator,
    run_pte,
    shim_bridge,
    shim_build,
)
from mps_backend.runtime.program_check import ProgramFormatError

FIXTURES = ["cnn_fp32", "cnn_fp16", "conv1d_fp32", "conv1d_fp16", "mlp_fp32", "mlp_fp16", "ops_fp32", "ops_fp16"]


# ------------------------------------------------------------------ helpers


def _deserialize(pte: bytes):
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(pte)


def _serialize(pte_file) -> bytes:
    from executorch.exir._serialize._program import serialize_pte_binary

    return bytes(serialize_pte_binary(pte_file))


def _delegate_payloads(pte: bytes) -> list[tuple[str, bytes]]:
    """(backend id, processed bytes) of every delegate of the first execution plan."""
    from executorch.exir.schema import DataLocation

    program = _deserialize(pte).program
    out = []
    for d in program.execution_plan[0].delegates:
        assert d.processed.location == DataLocation.INLINE
        out.append((d.id, bytes(program.backend_delegate_data[d.processed.index].data)))
    return out


def _io(upstream_pte_dir, name: str) -> tuple[list[torch.Tensor], list[np.ndarray]]:
    manifest = json.loads((upstream_pte_dir / "manifest.json").read_text())
    data = np.load(upstream_pte_dir / manifest[f"{name}.pte"]["inputs"])

    def number(k: str) -> int:
        return int(k.removeprefix("input").removeprefix("output").lstrip("_"))

    keys = sorted(data.files, key=lambda k: (k.rstrip("0123456789"), number(k)))
    inputs = [torch.from_numpy(data[k].copy()) for k in keys if k.startswith("input")]
    outputs = [data[k] for k in keys if k.startswith("output")]
    return inputs, outputs


class Recorder:
    """Stand-in for the interpreter: records each call and returns canned outputs."""

    def __init__(self, outputs=None, fn=None):
        self.calls: list[tuple[bytes, list[torch.Tensor], str]] = []
        self.kinds: list[type] = []  # what the blob was handed as
        self.outputs, self.fn = outputs, fn

    def __call__(self, blob, inputs, mode, observer=None, loaded=None, handle_id=0):
        # copied: a loaded method's delegate gets a view of its handle's blob, valid while the handle is
        self.calls.append((bytes(blob), [t.clone() for t in inputs], mode))
        self.kinds.append(type(blob))
        if self.fn is not None:
            return self.fn(blob, inputs, mode)
        return [torch.as_tensor(o).clone() for o in self.outputs]


@pytest.fixture
def standin(monkeypatch):
    def install(outputs=None, fn=None) -> Recorder:
        rec = Recorder(outputs, fn)
        monkeypatch.setattr(shim_bridge, "_execute_delegate", rec)
        return rec

    return install


@pytest.fixture(scope="module")
def ops_pte(upstream_pte_dir) -> bytes:
    return (upstream_pte_dir / "ops_fp32.pte").read_bytes()


def _ops_inputs():
    return [torch.randn(3, 8), torch.tensor([0, 7, 3, 1])]


def _ops_outputs():
    return [torch.arange(12.0).reshape(3, 4), torch.full((8, 3), -1.5), torch.linspace(0, 1, 24).reshape(12, 2)]


# ------------------------------------------------------------------ build and registration


def test_build_caches_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("MPS_BACKEND_CACHE_DIR", str(tmp_path))
    path = shim_build.build_shim()
    assert path.parent == tmp_path and path.name.startswith("emulator-")
    assert path.suffix == (".dylib" if sys.platform == "darwin" else ".so")
    assert shim_build._executorch_version().replace("+", "_") in path.name
    assert sorted(tmp_path.iterdir()) == [path, path.with_name(path.name + ".sha256")]  # no temporary left
    mtime = path.stat().st_mtime_ns
    assert shim_build.build_shim() == path and path.stat().st_mtime_ns == mtime  # cached


def test_build_without_compiler_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("MPS_BACKEND_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    hint = r"xcode-select --install" if sys.platform == "darwin" else r"apt-get install g\+\+"
    with pytest.raises(EmulatorBuildError, match=hint):
        shim_build.build_shim(force=True)


def test_build_failure_reports_command(tmp_path, monkeypatch):
    monkeypatch.setenv("MPS_BACKEND_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(EmulatorBuildError, match="exit code 1"):
        shim_build.build_shim(force=True)
    assert not any(tmp_path.iterdir())


def test_shim_links_the_library_that_holds_the_backend_registry():
    library = shim_build._runtime_library()
    et = shim_build._executorch_dir()
    assert library.is_file() and et in library.parents
    # the dynamic symbol table of that library defines register_backend (not only refers to it); Mach-O
    # names carry one more leading underscore, so the ELF name is a substring of nm's line there too
    import subprocess

    nm = ["nm", "-gU"] if sys.platform == "darwin" else ["nm", "-D", "--defined-only"]
    symbols = subprocess.run([*nm, str(library)], capture_output=True, text=True, check=True)
    assert shim_build._REGISTER_BACKEND in symbols.stdout
    command = shim_build._compile_command("c++", Path("s.cpp"), Path("s.so"))
    if sys.platform == "darwin":
        assert str(library) in command and f"-Wl,-rpath,{library.parent}" in command
    else:
        assert f"-l:{library.name}" in command and f"-L{library.parent}" in command
    assert command[command.index("-isystem") + 1] == str(et / "include")  # the wheel's headers come first


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """An executorch package folder with complete headers and the given runtime library, so that the
    build command of any platform can be made on this machine: returns a function of the library name."""
    et = tmp_path / "site-packages" / "executorch"
    _header_tree(et / "include" / "executorch")
    monkeypatch.setattr(shim_build, "_executorch_dir", lambda: et)

    def with_library(name: str) -> Path:
        library = et / "lib" / name
        monkeypatch.setattr(shim_build, "_runtime_library", lambda: library)
        return library

    return with_library


def test_compile_command_on_linux_is_unchanged(fake_wheel):
    library = fake_wheel("libexecutorch.so")
    include = library.parents[1] / "include"
    command = shim_build._compile_command("g++", Path("shim.cpp"), Path("out.so"), platform="linux")
    assert command == [
        "g++",
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        "-DC10_USING_CUSTOM_GENERATED_MACROS",
        "-DET_EVENT_TRACER_ENABLED",
        "-isystem",
        str(include),
        "-isystem",
        str(include / "executorch" / "runtime" / "core" / "portable_type" / "c10"),
        "shim.cpp",
        "-o",
        "out.so",
        f"-L{library.parent}",
        "-l:libexecutorch.so",
        f"-Wl,-rpath,{library.parent}",
        "-Wl,--no-undefined",
    ]


def test_compile_command_on_macos_links_the_dylib_by_path(fake_wheel):
    library = fake_wheel("libexecutorch.dylib")
    include = library.parents[1] / "include"
    command = shim_build._compile_command("clang++", Path("shim.cpp"), Path("out.dylib"), platform="darwin")
    assert command[0] == "clang++" and "-std=c++17" in command and "-fvisibility=hidden" in command
    assert "-dynamiclib" in command or "-shared" in command
    # libc++, ld64: none of the GNU flags
    assert not [flag for flag in command if flag.startswith(("-D_GLIBCXX", "-l:", "-L"))]
    assert "-Wl,--no-undefined" not in command
    # the runtime library by its full path, found at load time through an rpath to its folder
    assert str(library) in command
    assert f"-Wl,-rpath,{library.parent}" in command
    assert "-Wl,-undefined,error" in command
    assert "-Wl,-install_name,@rpath/out.dylib" in command
    # the same headers and macros as on Linux, the wheel's first
    assert command[command.index("-isystem") + 1] == str(include)
    assert {"-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED"} <= set(command)
    assert command[command.index("-o") + 1] == "out.dylib" and "shim.cpp" in command
    # the library comes after the source: ld64 then resolves the shim's references against it
    assert command.index(str(library)) > command.index("shim.cpp")


@pytest.mark.parametrize("platform", ["win32", "cygwin", "freebsd14", "emscripten"])
def test_compile_command_refuses_other_platforms(fake_wheel, platform):
    fake_wheel("libexecutorch.so")
    with pytest.raises(EmulatorBuildError, match=rf"'{platform}'.*Linux and macOS are supported"):
        shim_build._compile_command("c++", Path("shim.cpp"), Path("out.so"), platform=platform)
    with pytest.raises(EmulatorBuildError, match="Linux and macOS are supported"):
        shim_build.shim_path(platform=platform)


def test_shim_file_suffix_per_platform(fake_wheel, tmp_path, monkeypatch):
    monkeypatch.setenv("MPS_BACKEND_CACHE_DIR", str(tmp_path / "cache"))
    fake_wheel("libexecutorch.dylib")
    mac = shim_build.shim_path(platform="darwin")
    fake_wheel("libexecutorch.so")
    linux = shim_build.shim_path(platform="linux")
    assert mac.suffix == ".dylib" and linux.suffix == ".so"
    assert mac.parent == linux.parent == tmp_path / "cache"
    assert mac.stem != linux.stem  # different commands and platforms: different cache keys
    assert shim_build._digest_path(mac).name == mac.name + ".sha256"
    assert shim_build.shim_path() == shim_build.shim_path(platform=sys.platform)


def _fake_compilers(folder: Path, *names: str) -> None:
    folder.mkdir(exist_ok=True)
    for name in names:
        tool = folder / name
        tool.write_text("#!/bin/sh\nexit 1\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def test_compiler_order_per_platform(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    _fake_compilers(bin_dir, "c++", "g++", "clang++")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CXX", raising=False)
    assert shim_build._find_compiler(platform="darwin") == str(bin_dir / "clang++")  # Apple's clang first
    assert shim_build._find_compiler(platform="linux") == str(bin_dir / "c++")  # as before
    (bin_dir / "clang++").unlink()
    assert shim_build._find_compiler(platform="darwin") == str(bin_dir / "c++")
    (bin_dir / "c++").unlink()
    assert shim_build._find_compiler(platform="darwin") == str(bin_dir / "g++")
    assert shim_build._find_compiler(platform="linux") == str(bin_dir / "g++")
    monkeypatch.setenv("CXX", "g++")  # $CXX wins on both
    _fake_compilers(bin_dir, "clang++")
    assert shim_build._find_compiler(platform="darwin") == str(bin_dir / "g++")
    monkeypatch.delenv("CXX")
    for name in ("clang++", "g++"):
        (bin_dir / name).unlink()
    with pytest.raises(EmulatorBuildError, match=r"looked for \$CXX, clang\+\+, c\+\+, g\+\+.*xcode-select --install"):
        shim_build._find_compiler(platform="darwin")
    with pytest.raises(EmulatorBuildError, match=r"looked for \$CXX, c\+\+, g\+\+, clang\+\+.*apt-get install g\+\+"):
        shim_build._find_compiler(platform="linux")


def _header_tree(root: Path) -> Path:
    (root / "runtime" / "backend").mkdir(parents=True)
    (root / "runtime" / "backend" / "interface.h").write_text("// stand-in\n")
    return root


def test_headers_a_wheel_lacks_come_from_MPS_BACKEND_ET_HEADERS(tmp_path, monkeypatch):
    monkeypatch.setenv("MPS_BACKEND_CACHE_DIR", str(tmp_path / "cache"))
    bare = tmp_path / "wheel-include"
    bare.mkdir()
    monkeypatch.delenv("MPS_BACKEND_ET_HEADERS", raising=False)
    with pytest.raises(EmulatorBuildError, match=r"MPS_BACKEND_ET_HEADERS.*--branch v"):
        shim_build._extra_headers(bare)
    monkeypatch.setenv("MPS_BACKEND_ET_HEADERS", str(tmp_path))
    assert shim_build._extra_headers(shim_build._executorch_dir() / "include") == []  # 1.5.1 ships them
    # a checkout named executorch: its parent is the include folder
    checkout = _header_tree(tmp_path / "src" / "executorch")
    monkeypatch.setenv("MPS_BACKEND_ET_HEADERS", str(checkout))
    assert shim_build._extra_headers(bare) == [checkout.parent.resolve()]
    monkeypatch.setenv("MPS_BACKEND_ET_HEADERS", str(checkout.parent))
    assert shim_build._extra_headers(bare) == [checkout.parent.resolve()]
    # a checkout with another name: reached through a link named executorch in the cache
    other = _header_tree(tmp_path / "et-v1.0.1")
    monkeypatch.setenv("MPS_BACKEND_ET_HEADERS", str(other))
    (folder,) = shim_build._extra_headers(bare)
    assert (folder / "executorch" / "runtime" / "backend" / "interface.h").read_text() == "// stand-in\n"
    assert shim_build._extra_headers(bare) == [folder]  # the link is reused
    monkeypatch.setenv("MPS_BACKEND_ET_HEADERS", str(tmp_path / "nothing-here"))
    with pytest.raises(EmulatorBuildError, match="no executorch/runtime/backend/interface.h there"):
        shim_build._extra_headers(bare)


def test_backend_registered_in_the_pybindings_registry():
    emu = load_emulator()
    assert load_emulator() is emu  # once per process
    from executorch.extension.pybindings import _C

    assert "MPSBackend" in _C._get_registered_backend_names()
    assert _C._is_available("MPSBackend")
    assert emu.lib.mps_emu_install(emu.c_callback) == 0  # idempotent


def test_lazy_package_exports():
    import mps_backend.runtime as rt

    assert rt.run_pte is emulator.run_pte
    with pytest.raises(AttributeError):
        rt.no_such_name  # noqa: B018


# ------------------------------------------------------------------ plumbing with a stand-in


@pytest.mark.parametrize("name", FIXTURES)
def test_callback_gets_blob_and_inputs_outputs_come_back(upstream_pte_dir, standin, name):
    pte = (upstream_pte_dir / f"{name}.pte").read_bytes()
    ((backend_id, payload),) = _delegate_payloads(pte)
    assert backend_id == "MPSBackend"
    inputs, recorded = _io(upstream_pte_dir, name)
    rec = standin(outputs=[torch.from_numpy(o) + 1.0 for o in recorded])
    out = run_pte(pte, inputs)
    assert len(rec.calls) == 1
    blob, got_inputs, mode = rec.calls[0]
    assert blob == payload and rec.kinds == [memoryview]  # the handle's blob, not a copy per call
    assert mode == "faithful"
    assert [(t.dtype, t.shape) for t in got_inputs] == [(t.dtype, t.shape) for t in inputs]
    assert all(torch.equal(a, b) for a, b in zip(got_inputs, inputs))
    assert len(out) == len(recorded)
    for o, r in zip(out, recorded):
        assert torch.equal(o, torch.from_numpy(r) + 1.0)


def test_path_input_and_mode_passthrough(upstream_pte_dir, standin):
    rec = standin(outputs=_ops_outputs())
    out = run_pte(upstream_pte_dir / "ops_fp32.pte", _ops_inputs(), mode="aten")
    assert rec.calls[0][2] == "aten"
    assert torch.equal(out[0], _ops_outputs()[0])
    run_pte(str(upstream_pte_dir / "ops_fp32.pte"), _ops_inputs())
    assert rec.calls[1][2] == "faithful"


def test_output_dtype_mismatch_reinterpreted_when_faithful(ops_pte, standin):
    ints = torch.arange(12, dtype=torch.int32).reshape(3, 4)  # same nbytes as the f32 output
    standin(outputs=[ints, *_ops_outputs()[1:]])
    faithful = run_pte(ops_pte, _ops_inputs())[0]
    assert torch.equal(faithful, ints.view(torch.float32))  # the device blits its own bytes
    converted = run_pte(ops_pte, _ops_inputs(), mode="aten")[0]
    assert torch.equal(converted, ints.float())


class _Mixed(torch.nn.Module):
    def forward(self, x, y):
        b = torch.sin(x) + y
        return torch.cos(b), b * 2


@pytest.fixture(scope="module")
def mixed_pte() -> bytes:
    """sin (CPU) -> add (one MPSBackend delegate, hand-written MP00 blob) -> cos, mul (CPU)."""
    from executorch.exir import to_edge
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
    from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
    from executorch.exir.dialects._ops import ops as exir_ops

    from mps_backend.serialization.model import DataType, Graph, Node, Tensor
    from mps_backend.serialization.writer import write_blob

    def add_blob(shape) -> bytes:
        graph = Graph(
            nodes=[Node("MPSAdd", {"input1_id": 0, "input2_id": 1, "output_id": 2, "alpha": 1.0})],
            values=[Tensor(DataType.float32, list(shape)) for _ in range(3)],
            input_ids=[0, 1],
            output_ids=[2],
        )
        return write_blob(graph, {})

    class EmulatorTestAddBackend(BackendDetails):
        @staticmethod
        def preprocess(edge_program, compile_specs):
            shape = next(n.meta["val"].shape for n in edge_program.graph.nodes if n.op == "placeholder")
            return PreprocessResult(processed_bytes=add_blob(shape))

    class AddPartitioner(Partitioner):
        def __init__(self):
            super().__init__()
            self.delegation_spec = DelegationSpec("EmulatorTestAddBackend", [])

        def partition(self, ep):
            tags = {}
            for n in ep.graph_module.graph.nodes:
                if n.op == "call_function" and n.target == exir_ops.edge.aten.add.Tensor:
                    n.meta["delegation_tag"] = "add"
                    tags["add"] = self.delegation_spec
            return PartitionResult(tagged_exported_program=ep, partition_tags=tags)

    example = (torch.randn(2, 3), torch.randn(2, 3))
    program = to_edge(torch.export.export(_Mixed(), example)).to_backend(AddPartitioner()).to_executorch()
    pte_file = _deserialize(program.buffer)
    for d in pte_file.program.execution_plan[0].delegates:
        d.id = "MPSBackend"  # the test backend's name is only used ahead of time
    return _serialize(pte_file)


def test_mixed_program_cpu_ops_around_delegate(mixed_pte, standin):
    ((backend_id, payload),) = _delegate_payloads(mixed_pte)
    assert backend_id == "MPSBackend"
    rec = standin(fn=lambda blob, ins, mode: [ins[0] + ins[1]])
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    out = run_pte(mixed_pte, [x, y])
    assert rec.calls[0][0] == payload
    torch.testing.assert_close(rec.calls[0][1][0], torch.sin(x))  # ExecuTorch's portable sin
    expected = _Mixed()(x, y)
    torch.testing.assert_close(out[0], expected[0])
    torch.testing.assert_close(out[1], expected[1])


def test_mixed_program_with_interpreter(mixed_pte):
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    out = run_pte(mixed_pte, [x, y])
    expected = _Mixed()(x, y)
    torch.testing.assert_close(out[0], expected[0])
    torch.testing.assert_close(out[1], expected[1])


def test_program_without_mps_delegate_runs():
    from executorch.exir import to_edge

    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x @ y) + 1.0

    x, y = torch.randn(3, 4), torch.randn(4, 2)
    pte = to_edge(torch.export.export(M(), (x, y))).to_executorch().buffer
    assert _delegate_payloads(pte) == []
    out = run_pte(pte, [x, y])
    torch.testing.assert_close(out[0], M()(x, y))


def test_executorch_runtime_api_uses_the_emulator(ops_pte, standin):
    """After load_emulator(), ExecuTorch's own Python Runtime API runs MPS programs too."""
    import warnings

    load_emulator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from executorch.runtime import Runtime

    standin(outputs=_ops_outputs())
    method = Runtime.get().load_program(ops_pte).load_method("forward")
    out = method.execute(_ops_inputs())
    assert torch.equal(out[2], _ops_outputs()[2])


def test_delegate_handles_destroyed(ops_pte, standin):
    standin(outputs=_ops_outputs())
    lib = load_emulator().lib
    before = lib.mps_emu_live_handles()
    run_pte(ops_pte, _ops_inputs())
    assert lib.mps_emu_live_handles() == before


def test_a_loaded_method_decodes_each_delegate_once(upstream_pte_dir, monkeypatch):
    """As the device runtime builds its graph at init: a LoadedMethod's calls reuse the interpreter its
    first call decoded (same outputs as a fresh run), and close() releases it."""
    from mps_backend.runtime import interpreter

    decoded = []
    real = interpreter.Interpreter

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            decoded.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(interpreter, "Interpreter", Counting)
    inputs, _ = _io(upstream_pte_dir, "mlp_fp32")
    pte = (upstream_pte_dir / "mlp_fp32.pte").read_bytes()
    with emulator.LoadedMethod(pte) as step:
        runs = [step(inputs)[0] for _ in range(3)]
        assert len(decoded) == 1 and len(step._delegates) == 1
    assert not step._delegates
    fresh = run_pte(pte, inputs)[0]
    assert len(decoded) == 2  # run_pte loads the program again: a new delegate handle, decoded again
    assert all(torch.equal(r, fresh) for r in runs)


def test_threads_keep_their_own_mode(ops_pte, standin):
    modes: dict[str, str] = {}

    def fn(blob, ins, mode):
        modes[threading.current_thread().name] = mode
        return _ops_outputs()

    standin(fn=fn)
    threads = [threading.Thread(target=run_pte, args=(ops_pte, _ops_inputs(), m), name=m) for m in ("faithful", "aten")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert modes == {"faithful": "faithful", "aten": "aten"}


def test_calls_into_the_runtime_are_serialized(ops_pte, standin):
    """executorch's runtime is not thread-safe: every call into it from the emulator holds one lock,
    so two threads' executions never overlap."""
    inside, overlaps = [0], []

    def fn(blob, ins, mode):
        inside[0] += 1
        overlaps.append(inside[0])
        threading.Event().wait(0.01)
        inside[0] -= 1
        return _ops_outputs()

    standin(fn=fn)
    threads = [threading.Thread(target=lambda: [run_pte(ops_pte, _ops_inputs()) for _ in range(5)]) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlaps) == 15 and max(overlaps) == 1


# ------------------------------------------------------------------ errors: clear exception, process survives


@pytest.mark.parametrize(
    "inputs, match",
    [
        ([torch.randn(3, 8)], "takes 2 inputs, got 1"),
        ([torch.randn(3, 8).double(), torch.arange(4)], "dtype torch.float32, got torch.float64"),
        ([torch.randn(3, 9), torch.arange(4)], r"must have shape \[3, 8\].*, got \[3, 9\]"),
        ([torch.randn(3, 8, 1), torch.arange(4)], r"shape \[3, 8\].*, got \[3, 8, 1\]"),
        ([torch.randn(3, 8), 4], "must be a tensor"),
        ([torch.randn(2, 8), torch.arange(4)], r"rejected the inputs .*\[3, 8\]"),  # smaller, but static
    ],
)
def test_bad_inputs(ops_pte, standin, inputs, match):
    rec = standin(outputs=_ops_outputs())
    with pytest.raises(InputMismatchError, match=match):
        run_pte(ops_pte, inputs)
    assert rec.calls == []
    assert torch.equal(run_pte(ops_pte, _ops_inputs())[1], _ops_outputs()[1])  # still usable


def test_inputs_within_a_dynamic_dimension_run():
    """A program exported with a dynamic batch dimension declares its upper bound; executorch runs any
    batch up to it, and so does run_pte."""
    from executorch.exir import to_edge_transform_and_lower

    model = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
    ep = torch.export.export(model, (torch.randn(3, 8),), dynamic_shapes=({0: torch.export.Dim("b", max=16)},))
    pte = to_edge_transform_and_lower(ep).to_executorch().buffer
    for batch in (1, 5, 16):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(run_pte(pte, [x])[0], model(x))
    with pytest.raises(InputMismatchError, match="at most"):
        run_pte(pte, [torch.randn(17, 8)])


def test_noncontiguous_and_grad_inputs_accepted(ops_pte, standin):
    rec = standin(outputs=_ops_outputs())
    x = torch.randn(8, 3, requires_grad=True)
    run_pte(ops_pte, [x.t(), torch.arange(4)])
    assert torch.equal(rec.calls[0][1][0], x.detach().t())


def test_interpreter_exception_is_reraised(ops_pte, standin):
    class Boom(Exception):
        pass

    def fail(blob, ins, mode):
        raise Boom("device says no")

    standin(fn=fail)
    with pytest.raises(Boom, match="device says no") as info:
        run_pte(ops_pte, _ops_inputs())
    assert isinstance(info.value.__cause__, RuntimeError)  # the ExecuTorch failure
    standin(outputs=_ops_outputs())
    assert torch.equal(run_pte(ops_pte, _ops_inputs())[0], _ops_outputs()[0])


@pytest.mark.parametrize(
    "outputs, match",
    [
        (lambda: [torch.zeros(3, 5), *_ops_outputs()[1:]], "needs 48 bytes"),
        (lambda: _ops_outputs()[:2], "returned 2 outputs, the delegate call has 3"),
        (lambda: [1.0, *_ops_outputs()[1:]], "float, not a tensor"),
    ],
)
def test_bad_interpreter_outputs(ops_pte, standin, outputs, match):
    standin(fn=lambda blob, ins, mode: outputs())
    with pytest.raises(EmulatorError, match=match):
        run_pte(ops_pte, _ops_inputs())


def test_payload_that_is_not_mp00_fails_at_load(ops_pte, standin):
    pte_file = _deserialize(ops_pte)
    data = bytearray(pte_file.program.backend_delegate_data[0].data)
    data[4:8] = b"XX00"
    pte_file.program.backend_delegate_data[0].data = bytes(data)
    rec = standin(outputs=_ops_outputs())
    with pytest.raises(EmulatorError, match="could not load method 'forward'"):
        run_pte(_serialize(pte_file), _ops_inputs())
    assert rec.calls == []


def test_unknown_method_and_garbage_program(ops_pte):
    with pytest.raises(EmulatorError, match="no method 'backward'"):
        run_pte(ops_pte, _ops_inputs(), method="backward")
    with pytest.raises(ProgramFormatError, match="not an executorch program"):  # checked before executorch sees it
        run_pte(b"\0" * 64, [])
    with pytest.raises(TypeError):
        run_pte(12, [])


# ------------------------------------------------------------------ the real interpreter


@pytest.mark.parametrize("name", FIXTURES)
def test_upstream_fixture_reproduces_recorded_outputs(upstream_pte_dir, name):
    inputs, recorded = _io(upstream_pte_dir, name)
    out = run_pte(upstream_pte_dir / f"{name}.pte", inputs)
    assert len(out) == len(recorded)
    for o, r in zip(out, recorded):
        expected = torch.from_numpy(r)
        assert o.dtype == expected.dtype and o.shape == expected.shape
        if name.endswith("fp16"):
            # observed max error ~1e-3 of the output range
            scale = float(expected.abs().max())
            torch.testing.assert_close(o, expected, rtol=1e-2, atol=1e-2 * scale)
        else:
            torch.testing.assert_close(o, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("damage", ["truncate", "foreign"])
def test_a_damaged_cached_shim_is_rebuilt(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("MPS_BACKEND_CACHE_DIR", str(tmp_path))
    path = shim_build.build_shim()
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 3] if damage == "truncate" else b"\x7fELF" + bytes(4000))
    assert shim_build.build_shim() == path and path.read_bytes() == good  # rebuilt, never loaded broken


@pytest.mark.parametrize("obstacle", ["read-only", "file"])
def test_an_unusable_cache_falls_back_to_a_temporary_folder(tmp_path, monkeypatch, obstacle):
    cache = tmp_path / "cache"
    if obstacle == "file":
        cache.write_text("not a folder")
    else:
        cache.mkdir()
        cache.chmod(0o500)
        if os.access(cache, os.W_OK):  # root ignores permissions: use a file in a file's place instead
            cache.chmod(0o700)
            cache.rmdir()
            cache.write_text("not a folder")
    monkeypatch.setenv("MPS_BACKEND_CACHE_DIR", str(cache))
    monkeypatch.setattr(shim_build, "_fallback_cache_dir", lambda: tmp_path / "fallback")
    with pytest.warns(UserWarning, match="not usable"):
        path = shim_build.build_shim()
    assert path.parent == tmp_path / "fallback" and shim_build._intact(path)


def test_empty_home_does_not_write_to_the_root(monkeypatch):
    monkeypatch.delenv("MPS_BACKEND_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "")
    assert shim_build._cache_dir() == shim_build._fallback_cache_dir()


def test_cache_dir_defaults_to_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("MPS_BACKEND_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert shim_build.shim_path().parent == tmp_path / "mps_backend"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert shim_build.shim_path().parent == Path.home() / ".cache" / "mps_backend"
