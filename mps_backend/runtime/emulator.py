"""Run whole ``.pte`` files with ``MPSBackend`` delegates on Linux and macOS.

ExecuTorch's own runtime (the pybindings of the installed executorch wheel) loads and
runs the program: CPU kernels, memory planning, delegate calls. A small C++ shim
(``shim/mps_emulator.cpp``), compiled on first use against the headers shipped in the
wheel and linked to the library of the wheel that holds the runtime's backend registry,
registers a backend named ``MPSBackend`` in that registry. Which library that is differs
between releases (1.5: ``lib/libexecutorch.so`` beside the ``_C`` pybindings, ``lib/libexecutorch.dylib``
on macOS; 1.3-1.4: ``backends/qualcomm/libqnn_executorch_backend.so``, which their Linux ``_portable_lib``
pybindings link, and ``_portable_lib`` itself on macOS; 1.0: ``_portable_lib`` itself): it is found at run
time as the library that defines
``executorch::runtime::register_backend`` for the loaded pybindings (``dladdr``). Its ``execute()`` hands every tensor
argument of the delegate call to a ctypes callback in this module, which splits them
into inputs and outputs as the device runtime does (semantics §4: the first
``len(input_ids)`` tensors are inputs, the next ``len(output_ids)`` outputs), runs the
device-model interpreter (:func:`mps_backend.runtime.interpreter.execute`) and writes
the results into the output buffers.

Wheels before 1.3 lack part of the runtime headers: ``MPS_BACKEND_ET_HEADERS`` names the
executorch source tree of the same release (see :func:`_extra_headers`).

Build cache: ``$MPS_BACKEND_CACHE_DIR``, else ``$XDG_CACHE_HOME/mps_backend``, else
``~/.cache/mps_backend``; file ``emulator-<executorch version>-<hash>.so`` (``.dylib`` on macOS)
where the hash covers the shim source, the compiler command, the wheel location, the platform and
the machine. The compiler is ``$CXX``, else from ``PATH``: ``c++``, ``g++`` or ``clang++`` on Linux,
``clang++``, ``c++`` or ``g++`` on macOS (see :func:`_compile_command` for the flags of each).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from mps_backend.config import env_path
from mps_backend.errors import MPSBackendError, MPSBackendWarning

__all__ = [
    "EmulatorBuildError",
    "EmulatorError",
    "InputMismatchError",
    "build_shim",
    "LoadedMethod",
    "constant_method_values",
    "verify_bundled",
    "load_emulator",
    "run_pte",
]

#: must match kAbiVersion in shim/mps_emulator.cpp
_ABI_VERSION = 2
_SHIM_SOURCE = Path(__file__).with_name("shim") / "mps_emulator.cpp"
_BUILD_TIMEOUT_S = 600


class EmulatorError(MPSBackendError, RuntimeError):
    """The emulator could not be set up, or a program could not be loaded or run."""


class EmulatorBuildError(EmulatorError):
    """The C++ shim could not be compiled (no compiler, or the compiler failed)."""


class InputMismatchError(EmulatorError, ValueError):
    """The inputs given to :func:`run_pte` do not match what the method expects."""


# --------------------------------------------------------------------------------------
# ABI shared with the shim


class _Arg(ctypes.Structure):
    """Mirror of ``struct MpsEmuArg`` in shim/mps_emulator.cpp."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_int64),
        ("sizes", ctypes.POINTER(ctypes.c_int32)),
        ("dim_order", ctypes.POINTER(ctypes.c_uint8)),
        ("dim", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("arg_index", ctypes.c_int32),
        ("list_index", ctypes.c_int32),
    ]


_Callback = ctypes.CFUNCTYPE(
    ctypes.c_int32,  # 0 = ok
    ctypes.c_int64,  # handle id (one per delegate instance)
    ctypes.c_void_p,  # blob
    ctypes.c_uint64,  # blob length
    ctypes.c_int32,  # number of tensor args
    ctypes.POINTER(_Arg),
    ctypes.c_int32,  # number of EValues in the delegate call
    ctypes.c_char_p,  # method name
    ctypes.c_void_p,  # MpsEmuTrace* (None: the runtime has no event tracer)
)

#: delegate metadata of every per-node ETDump event: the times are the emulator's, not a device's
EMULATED_EVENT_METADATA = b"emulated on CPU (mps_backend device model)"

#: executorch ScalarType code (same numbering as c10) -> torch dtype
_SCALAR_TYPES: MappingProxyType[int, torch.dtype] = MappingProxyType(
    {
        0: torch.uint8,
        1: torch.int8,
        2: torch.int16,
        3: torch.int32,
        4: torch.int64,
        5: torch.float16,
        6: torch.float32,
        7: torch.float64,
        9: torch.complex64,
        10: torch.complex128,
        11: torch.bool,
        15: torch.bfloat16,
        27: torch.uint16,
        28: torch.uint32,
        29: torch.uint64,
    }
)


def _torch_dtype(code: int) -> torch.dtype:
    try:
        return _SCALAR_TYPES[code]
    except KeyError:
        raise EmulatorError(f"unsupported executorch ScalarType code {code}") from None


# --------------------------------------------------------------------------------------
# Building the shim


def _cache_dir() -> Path:
    explicit = env_path("MPS_BACKEND_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "mps_backend"
    home = os.environ.get("HOME")
    if home is not None and not os.path.isabs(home):  # HOME="" would put the cache in /.cache or ./.cache
        return _fallback_cache_dir()
    return Path.home() / ".cache" / "mps_backend"


def _fallback_cache_dir() -> Path:
    """A per-user folder under the system's temporary directory, when the cache folder is unusable."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"mps_backend-{uid}"


_SUPPORTED_PLATFORMS = "Linux and macOS"


def _is_macos(platform: str) -> bool:
    return platform == "darwin"


def _check_platform(platform: str) -> None:
    if platform != "linux" and not _is_macos(platform):
        raise EmulatorBuildError(
            f"the MPS emulator cannot build its ExecuTorch backend shim on this platform "
            f"({platform!r}): {_SUPPORTED_PLATFORMS} are supported"
        )


def _compiler_names(platform: str) -> tuple[str, ...]:
    """Compilers tried from ``PATH`` when ``$CXX`` is not set, in order: on macOS Apple's clang first (the
    wheel's dylibs use libc++; ``c++`` is clang there too, ``g++`` usually a clang alias or Homebrew GCC)."""
    return ("clang++", "c++", "g++") if _is_macos(platform) else ("c++", "g++", "clang++")


def _find_compiler(platform: str | None = None) -> str:
    platform = sys.platform if platform is None else platform
    cxx = os.environ.get("CXX")
    if cxx:
        found = shutil.which(cxx)
        if found is None:
            raise EmulatorBuildError(f"$CXX is set to {cxx!r}, which is not an executable on PATH")
        return found
    names = _compiler_names(platform)
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    install = (
        "`xcode-select --install` (Xcode Command Line Tools)"
        if _is_macos(platform)
        else "`apt-get install g++` (Debian/Ubuntu) or `dnf install gcc-c++` (Fedora/RHEL)"
    )
    raise EmulatorBuildError(
        "the MPS emulator needs a C++17 compiler to build its ExecuTorch backend shim, and none "
        f"was found (looked for $CXX, {', '.join(names)}). Install one, e.g. {install}, or set CXX."
    )


def pybindings() -> Any:
    """The executorch runtime's Python module: ``_portable_lib`` up to executorch 1.4, ``_C`` since 1.5.

    ``_portable_lib`` is tried first: an older release's package put before a newer one on the path
    (``executorch`` is a namespace package) is the runtime meant, and 1.5 has no ``_portable_lib``.
    """
    try:
        from executorch.extension.pybindings import _portable_lib as _C  # noqa: PLC0415  (torch imported above)
    except ImportError:
        try:
            from executorch.extension.pybindings import _C  # noqa: PLC0415
        except ImportError as exc:
            raise EmulatorBuildError(f"the installed executorch has no runtime pybindings: {exc}") from exc
    return _C


def _executorch_dir() -> Path:
    """Root of the executorch package whose pybindings this process uses."""
    return Path(pybindings().__file__).resolve().parents[2]


# executorch::runtime::register_backend(executorch::runtime::Backend const&), Itanium C++ ABI
_REGISTER_BACKEND = "_ZN10executorch7runtime16register_backendERKNS0_7BackendE"


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _runtime_library() -> Path:
    """The shared library that defines the backend registry the loaded pybindings use: the one the
    shim must link so that its ``register_backend`` call lands in the same registry.

    The same calls hold on macOS (checked against the Mach-O files of the 1.3.1, 1.4.0 and 1.5.1
    macOS arm64 wheels, not run on a Mac): ``os.RTLD_NOLOAD`` exists there and ``dlopen`` with it
    returns the already-loaded image; ``dlsym`` on that handle searches the image and the libraries it
    depends on, and adds the leading underscore of Mach-O symbol names itself (the files define
    ``__ZN10executorch7runtime16register_backend...``; the name asked for stays ``_REGISTER_BACKEND``);
    ``dladdr`` is in libSystem, reached through ``CDLL(None)`` (the main program and its libraries),
    and its ``Dl_info`` has the same four fields. The result there: ``lib/libexecutorch.dylib`` (1.5)
    or the ``_portable_lib`` pybindings themselves (1.3-1.4), both Mach-O dylibs (not bundles), so the
    shim can link them."""
    module = pybindings()
    try:
        # the pybindings are loaded already: this handle only looks the symbol up through them and
        # their dependencies, the way the dynamic linker resolved it for them
        handle = ctypes.CDLL(module.__file__, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
        address = ctypes.cast(getattr(handle, _REGISTER_BACKEND), ctypes.c_void_p).value
        info = _DlInfo()
        libdl = ctypes.CDLL(None)  # glibc: dladdr in libc (libdl before 2.34); macOS: libSystem
        libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        if not libdl.dladdr(address, ctypes.byref(info)) or not info.dli_fname:
            raise OSError("dladdr found no library")
    except (OSError, AttributeError) as exc:
        raise EmulatorBuildError(
            f"cannot find the library that holds executorch's backend registry for {module.__file__}: {exc}"
        ) from exc
    return Path(os.fsdecode(info.dli_fname)).resolve()


def _executorch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("executorch")
    except PackageNotFoundError:
        from executorch.version import __version__  # noqa: PLC0415

        return __version__


_BACKEND_HEADER = Path("executorch", "runtime", "backend", "interface.h")


def _extra_headers(include: Path) -> list[Path]:
    """Header folders the wheel lacks. Wheels before 1.3 ship only part of the runtime's headers (no
    ``runtime/backend``): ``MPS_BACKEND_ET_HEADERS`` then names the folder that holds them (ignored for a
    wheel that has them), the
    executorch source tree at the wheel's release tag (its root, or a folder with an ``executorch``
    folder inside), e.g. ``git clone --branch v1.0.1 https://github.com/pytorch/executorch``."""
    if (include / _BACKEND_HEADER).is_file():
        return []  # a complete wheel (1.3 and later): its own headers only
    named = env_path("MPS_BACKEND_ET_HEADERS")
    if not named:
        raise EmulatorBuildError(
            f"this executorch wheel ({_executorch_version()}) ships no {_BACKEND_HEADER} under {include} "
            "(wheels before 1.3 carry only part of the runtime headers): set MPS_BACKEND_ET_HEADERS to the "
            "executorch source tree at the same release, e.g. `git clone --depth 1 --branch v"
            f"{_executorch_version().split('+')[0]} https://github.com/pytorch/executorch`"
        )
    root = Path(named).expanduser().resolve()
    if (root / _BACKEND_HEADER).is_file():
        return [root]
    if (root / _BACKEND_HEADER.relative_to("executorch")).is_file():
        if root.name == "executorch":
            return [root.parent]
        # headers are included as <executorch/...>: a link named executorch to the tree, in the cache
        link_parent = _cache_dir() / "headers" / hashlib.sha256(str(root).encode()).hexdigest()[:16]
        link = link_parent / "executorch"
        if not link.is_symlink():
            link_parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(root, target_is_directory=True)
        return [link_parent]
    raise EmulatorBuildError(
        f"MPS_BACKEND_ET_HEADERS={named}: no {_BACKEND_HEADER} there nor "
        f"{_BACKEND_HEADER.relative_to('executorch')} (the root of an executorch source tree)"
    )


def _compile_command(compiler: str, source: Path, output: Path, platform: str | None = None) -> list[str]:
    """The command that builds the shim ``output`` from ``source``, for ``platform`` (a ``sys.platform``
    value; default: this one). Linux (GNU ld or lld, libstdc++): the runtime library by its file name
    (``-l:``), every symbol resolved at link time. macOS (Apple clang, ld64, libc++): a dylib linking the
    runtime library by its full path (ld64 has no ``-l:``; the shim then records the library's install
    name, ``@rpath/libexecutorch.dylib`` in 1.5.1, which the ``-rpath`` resolves to the copy the
    pybindings loaded). Other platforms: :class:`EmulatorBuildError`."""
    platform = sys.platform if platform is None else platform
    _check_platform(platform)
    et = _executorch_dir()
    include = et / "include"
    runtime = _runtime_library()
    # the wheel's headers first: they match its binaries; the source tree only fills what is missing
    extra = [flag for folder in _extra_headers(include) for flag in ("-isystem", str(folder))]
    headers = [
        # what the wheel's executorch-config.cmake puts on its imported targets
        "-DC10_USING_CUSTOM_GENERATED_MACROS",
        "-DET_EVENT_TRACER_ENABLED",
        "-isystem",
        str(include),
        *extra,
        "-isystem",
        str(include / "executorch" / "runtime" / "core" / "portable_type" / "c10"),
    ]
    common = ["-std=c++17", "-O2", "-fPIC"]
    hidden = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"]
    if _is_macos(platform):
        return [
            compiler,
            *common,
            "-dynamiclib",
            *hidden,
            # no _GLIBCXX_USE_CXX11_ABI: the macOS wheel's libraries use libc++
            *headers,
            str(source),
            "-o",
            str(output),
            f"-Wl,-install_name,@rpath/{output.name}",
            str(runtime),
            f"-Wl,-rpath,{runtime.parent}",
            "-Wl,-undefined,error",  # ld64's spelling of --no-undefined (its default for dylibs, made explicit)
        ]
    return [
        compiler,
        *common,
        "-shared",
        *hidden,
        # the wheel's libraries use the new libstdc++ ABI (std::__cxx11 symbols)
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        *headers,
        str(source),
        "-o",
        str(output),
        f"-L{runtime.parent}",
        f"-l:{runtime.name}",
        f"-Wl,-rpath,{runtime.parent}",
        "-Wl,--no-undefined",
    ]


def _shim_suffix(platform: str) -> str:
    """File suffix of the built shim: ``.dylib`` on macOS (ctypes loads either there), ``.so`` elsewhere."""
    return ".dylib" if _is_macos(platform) else ".so"


def shim_path(*, platform: str | None = None) -> Path:
    """Where the shim for this executorch installation and shim source is (or will be) cached
    (``platform``: a ``sys.platform`` value, default this one; another is only useful to tests)."""
    platform = sys.platform if platform is None else platform
    source = _SHIM_SOURCE.read_bytes()
    placeholder = _compile_command("<cxx>", Path("<src>"), Path("<out>"), platform)
    digest = hashlib.sha256()
    digest.update(source)
    digest.update("\0".join(placeholder).encode())
    digest.update(platform.encode())
    digest.update(os.uname().machine.encode())
    version = _executorch_version().replace("+", "_").replace("/", "_")
    return _cache_dir() / f"emulator-{version}-{digest.hexdigest()[:16]}{_shim_suffix(platform)}"


def _digest_path(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _intact(library: Path) -> bool:
    """Whether ``library`` is the complete file this cache built: its SHA-256 matches the one recorded
    beside it at build time (a truncated or foreign file would crash the process when loaded)."""
    try:
        return hashlib.sha256(library.read_bytes()).hexdigest() == _digest_path(library).read_text().strip()
    except OSError:
        return False


def _build_into(target: Path, force: bool) -> Path:
    if not force and _intact(target):
        return target
    compiler = _find_compiler()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp" + target.suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    command = _compile_command(compiler, _SHIM_SOURCE, tmp)
    try:
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EmulatorBuildError(f"building the MPS emulator shim failed: {exc}") from exc
        if proc.returncode != 0:
            output = (proc.stderr or proc.stdout or "").strip()
            if len(output) > 8000:
                output = output[:8000] + "\n[...]"
            raise EmulatorBuildError(
                f"building the MPS emulator shim failed (exit code {proc.returncode}).\ncommand: {' '.join(command)}\n{output}"
            )
        os.chmod(tmp, 0o755)
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        os.replace(tmp, target)
        fd, tmp_digest = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.sha256", dir=target.parent)
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
        os.replace(tmp_digest, _digest_path(target))
    finally:
        tmp.unlink(missing_ok=True)
    return target


def build_shim(*, force: bool = False) -> Path:
    """Compile the shim unless an intact cached build exists; returns the path of the shared library.

    The build writes temporary files next to the target and renames them into place, so concurrent
    builds (several processes, pytest-xdist) never see a partial library; a cached library whose
    recorded SHA-256 does not match (truncated, replaced) is rebuilt. When the cache folder cannot be
    used (read-only, a file in its place), the build goes to a per-user temporary folder instead.
    """
    target = shim_path()
    try:
        return _build_into(target, force)
    except OSError as exc:
        fallback = _fallback_cache_dir() / target.name
        if fallback.parent == target.parent:
            raise EmulatorBuildError(
                f"cannot write the MPS emulator shim in {target.parent}: {exc}; set MPS_BACKEND_CACHE_DIR to a writable folder"
            ) from exc
        warnings.warn(
            f"the MPS emulator cache {target.parent} is not usable ({exc}); building in "
            f"{fallback.parent} (set MPS_BACKEND_CACHE_DIR to choose)",
            MPSBackendWarning,
            stacklevel=2,
        )
        try:
            return _build_into(fallback, force)
        except OSError as exc2:
            raise EmulatorBuildError(
                f"cannot write the MPS emulator shim in {target.parent} ({exc}) nor in "
                f"{fallback.parent} ({exc2}); set MPS_BACKEND_CACHE_DIR to a writable "
                "folder"
            ) from exc2


# --------------------------------------------------------------------------------------
# The callback: one delegate call


def _execute_delegate(blob: bytes, inputs: list[torch.Tensor], mode: str, observer: Any = None) -> list[torch.Tensor]:
    """Run one MP00 blob with the device-model interpreter (imported at call time)."""
    from mps_backend.runtime import interpreter  # noqa: PLC0415

    if observer is None:
        return list(interpreter.execute(blob, inputs, mode=mode))
    return list(interpreter.Interpreter(blob, mode).run_with_report(inputs, observer)[0])


_CODES = {dtype: code for code, dtype in _SCALAR_TYPES.items()}


class _NodeTracer:
    """Logs each interpreted MPS node to the runtime's event tracer through the shim: a profiling event
    (delegate debug identifier = the node's index in the MPS graph, the id the ahead-of-time debug
    handle map uses; metadata says the time is emulated) and the node's output as an intermediate
    output, which is what the Inspector compares per operator."""

    def __init__(self, lib: ctypes.CDLL, trace: int) -> None:
        self.lib, self.trace = lib, ctypes.c_void_p(trace)

    def begin(self, index: int, node: Any) -> None:
        self.lib.mps_emu_trace_begin(self.trace, index)

    def end(self, index: int, node: Any, outputs: list[torch.Tensor]) -> None:
        self.lib.mps_emu_trace_end(self.trace, EMULATED_EVENT_METADATA, len(EMULATED_EVENT_METADATA))
        for value in outputs[:1]:  # one intermediate output per event (multi-output nodes: the first)
            if value.dtype in (torch.float16, torch.bfloat16):
                value = value.float()  # exact; ETDump stores no float16 ("ScalarType 5 not supported")
            code = _CODES.get(value.dtype)
            if code is None:
                continue
            t = value.detach().contiguous()
            sizes = (ctypes.c_int32 * max(t.dim(), 1))(*t.shape)
            order = (ctypes.c_uint8 * max(t.dim(), 1))(*range(t.dim()))
            arg = _Arg(t.data_ptr(), t.numel() * t.element_size(), sizes, order, t.dim(), code, -1, -1)
            status = self.lib.mps_emu_trace_output(self.trace, index, ctypes.byref(arg))
            if status != 0:
                raise EmulatorError(
                    f"the event tracer refused the output of MPS node {index} ({node.op}): "
                    f"executorch error {status:#x} (a full debug buffer: pass a larger "
                    "debug_buffer_size)"
                )


def _io_counts(blob: bytes) -> tuple[int, int]:
    """``(len(input_ids), len(output_ids))`` of an MP00 blob (the executable's feeds/targets)."""
    from mps_backend.serialization.generated.mpsgraph.MPSGraph import MPSGraph  # noqa: PLC0415

    if len(blob) < 32 or blob[4:8] != b"MP00" or blob[28:32] != b"MP00":
        raise EmulatorError("delegate payload is not an MP00 blob")
    try:
        graph = MPSGraph.GetRootAs(blob, 24)
        return graph.InputIdsLength(), graph.OutputIdsLength()
    except Exception as exc:  # a corrupt flatbuffer raises whatever the bindings hit
        raise EmulatorError(f"cannot read input_ids/output_ids of the MP00 blob: {exc!r}") from exc


def _shape(arg: _Arg) -> tuple[int, ...]:
    return tuple(arg.sizes[i] for i in range(arg.dim))


def _dim_order(arg: _Arg) -> tuple[int, ...]:
    return tuple(arg.dim_order[i] for i in range(arg.dim))


def _describe(arg: _Arg) -> str:
    where = f"arg {arg.arg_index}" + ("" if arg.list_index < 0 else f"[{arg.list_index}]")
    dtype = _SCALAR_TYPES.get(arg.dtype, f"ScalarType({arg.dtype})")
    return f"{where} {dtype} {list(_shape(arg))} ({arg.nbytes} bytes)"


def _read_input(arg: _Arg, mode: str) -> torch.Tensor:
    """Copy a delegate input out of ExecuTorch memory.

    faithful: the device reads the bytes with the logical (static) shape whatever the dim
    order; other modes honour a non-default dim order.
    """
    dtype = _torch_dtype(arg.dtype)
    shape = _shape(arg)
    if arg.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if not arg.data:
        raise EmulatorError(f"delegate input {_describe(arg)} has no data")
    raw = torch.frombuffer((ctypes.c_uint8 * arg.nbytes).from_address(arg.data), dtype=torch.uint8)
    flat = raw.clone().view(dtype)
    order = _dim_order(arg)
    if mode == "faithful" or order == tuple(range(len(order))):
        return flat.reshape(shape)
    physical = flat.reshape([shape[d] for d in order])
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return physical.permute(inverse).contiguous()


def _write_output(arg: _Arg, value: Any, index: int, mode: str) -> None:
    """Copy one interpreter result into the ExecuTorch output buffer (semantics §4)."""
    if not isinstance(value, torch.Tensor):
        raise EmulatorError(f"interpreter output {index} is {type(value).__name__}, not a tensor")
    dtype = _torch_dtype(arg.dtype)
    value = value.detach().cpu()
    if value.dtype != dtype and mode != "faithful":
        # faithful: the device blits its own dtype's bytes (reinterpretation); else convert.
        value = value.to(dtype)
    order = _dim_order(arg)
    if mode != "faithful" and order != tuple(range(len(order))) and value.numel() == torch.Size(_shape(arg)).numel():
        value = value.reshape(_shape(arg)).permute(order)
    raw = value.contiguous().reshape(-1).view(torch.uint8)
    if raw.numel() != arg.nbytes:
        raise EmulatorError(
            f"interpreter output {index} is {value.dtype} {list(value.shape)} ({raw.numel()} bytes) but "
            f"the ExecuTorch output {_describe(arg)} needs {arg.nbytes} bytes"
        )
    if arg.nbytes:
        if not arg.data:
            raise EmulatorError(f"delegate output {_describe(arg)} has no data")
        ctypes.memmove(arg.data, raw.data_ptr(), arg.nbytes)


class _Emulator:
    """The loaded shim and its callback; one per process (see :func:`load_emulator`)."""

    def __init__(self, lib: ctypes.CDLL, pybindings: Any, path: Path) -> None:
        self.lib = lib
        self.pybindings = pybindings
        self.path = path
        self.state = threading.local()  # per-thread: mode of the current run, pending error
        #: executorch's runtime (its log redirection into Python included) is not thread-safe: calls
        #: into it from this module hold this lock, so threads take turns instead of crashing
        self.lock = threading.RLock()
        self.c_callback = _Callback(self._on_execute)  # kept alive as long as the process

    @contextmanager
    def session(self, mode: str) -> Iterator[threading.local]:
        state = self.state
        previous = getattr(state, "mode", None)
        state.mode, state.error = mode, None
        try:
            yield state
        finally:
            state.mode = previous

    def _on_execute(
        self,
        handle_id: int,
        blob_ptr: int,
        blob_len: int,
        n_args: int,
        args: Any,
        n_evalues: int,
        method_name: bytes | None,
        trace: int | None,
    ) -> int:
        # Nothing may escape: ctypes would print the exception and return 0 (= success).
        try:
            mode = getattr(self.state, "mode", None) or "faithful"
            # (not ctypes.string_at: its size is a C int, negative for a blob of 2 GiB or more)
            blob = bytes((ctypes.c_char * blob_len).from_address(blob_ptr))
            descs = [args[i] for i in range(n_args)]
            n_in, n_out = _io_counts(blob)
            if n_in + n_out != n_args:
                raise EmulatorError(
                    f"MPS delegate (handle {handle_id}) got {n_args} tensor arguments "
                    f"({n_evalues} EValues) but its blob has {n_in} input_ids and {n_out} "
                    f"output_ids; the runtime binds the first {n_in} tensors as inputs and the "
                    f"next {n_out} as outputs: " + ", ".join(_describe(d) for d in descs)
                )
            inputs = [_read_input(d, mode) for d in descs[:n_in]]
            observer = _NodeTracer(self.lib, trace) if trace else None
            try:
                outputs = _execute_delegate(blob, inputs, mode, observer)
            except ValueError as exc:  # the interpreter refusing the bound tensors: program and blob disagree
                raise EmulatorError(
                    f"MPS delegate (handle {handle_id}): the program's tensors do not match its blob: {exc}"
                ) from exc
            if len(outputs) != n_out:
                raise EmulatorError(f"interpreter returned {len(outputs)} outputs, the delegate call has {n_out}")
            for k, (desc, value) in enumerate(zip(descs[n_in:], outputs)):
                _write_output(desc, value, k, mode)
            return 0
        except BaseException as exc:  # noqa: BLE001  (re-raised by run_pte)
            try:
                self.state.error = exc
            except BaseException:  # noqa: BLE001
                pass
            return 1


@functools.cache
def load_emulator() -> _Emulator:
    """Build (first time on this machine) and load the shim, and register ``MPSBackend``.

    After this, any ExecuTorch program loaded through the executorch pybindings in this
    process (``executorch.runtime.Runtime`` included) runs its MPS delegates on the
    device model.
    """
    # The pybindings need torch loaded first; the shim must be loaded after them so
    # that its DT_NEEDED runtime library (libexecutorch.so in 1.5; on macOS its
    # LC_LOAD_DYLIB @rpath/libexecutorch.dylib) resolves to the already-loaded copy,
    # i.e. the same backend registry.
    _C = pybindings()

    path = build_shim()
    try:
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    except OSError as exc:
        raise EmulatorError(f"cannot load the MPS emulator shim {path}: {exc}; delete it to rebuild") from exc
    lib.mps_emu_abi_version.restype = ctypes.c_int32
    lib.mps_emu_arg_size.restype = ctypes.c_int32
    lib.mps_emu_install.argtypes = [_Callback]
    lib.mps_emu_install.restype = ctypes.c_int32
    lib.mps_emu_live_handles.restype = ctypes.c_int64
    if lib.mps_emu_abi_version() != _ABI_VERSION or lib.mps_emu_arg_size() != ctypes.sizeof(_Arg):
        raise EmulatorError(f"MPS emulator shim {path} has a different ABI; delete it to rebuild")
    lib.mps_emu_trace_begin.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.mps_emu_trace_begin.restype = None
    lib.mps_emu_trace_end.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64]
    lib.mps_emu_trace_end.restype = None
    lib.mps_emu_trace_output.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(_Arg)]
    lib.mps_emu_trace_output.restype = ctypes.c_int32
    emulator = _Emulator(lib, _C, path)
    status = lib.mps_emu_install(emulator.c_callback)
    if status != 0:
        raise EmulatorError(
            f"registering backend 'MPSBackend' with the ExecuTorch runtime failed (executorch "
            f"error {status:#x}); is another MPSBackend already registered in this process? "
            f"registered: {_C._get_registered_backend_names()}"
        )
    if "MPSBackend" not in _C._get_registered_backend_names():
        raise EmulatorError(
            f"the MPS emulator shim registered its backend in a different runtime library than the pybindings use ({_C.__file__})"
        )
    return emulator


# --------------------------------------------------------------------------------------
# Public entry point


def _read_program(pte: bytes | bytearray | memoryview | str | os.PathLike, *, check: bool = True) -> bytes:
    """The program's bytes; with ``check`` (every program handed to the runtime) first checked by
    :func:`~mps_backend.runtime.program_check.check_program` (raises ``ProgramFormatError``)."""
    if isinstance(pte, (bytes, bytearray, memoryview)):
        data = bytes(pte)
    elif isinstance(pte, (str, os.PathLike)):
        data = Path(pte).read_bytes()
    else:
        raise TypeError(f"pte must be bytes or a path, not {type(pte).__name__}")
    if check:
        from mps_backend.runtime.program_check import ProgramFormatError, check_program  # noqa: PLC0415

        try:
            check_program(data)
        except ProgramFormatError as exc:
            if isinstance(pte, (str, os.PathLike)):
                raise ProgramFormatError(f"{os.fspath(pte)}: {exc}") from None
            raise
    return data


def _check_inputs(meta: Any, inputs: Sequence[Any], method_name: str) -> None:
    expected = meta.num_inputs()
    if len(inputs) != expected:
        raise InputMismatchError(f"method {method_name!r} takes {expected} inputs, got {len(inputs)}")
    for i, value in enumerate(inputs):
        try:
            info = meta.input_tensor_meta(i)
        except Exception:  # noqa: BLE001  (not a tensor input)
            continue
        if not isinstance(value, torch.Tensor):
            raise InputMismatchError(
                f"input {i} of {method_name!r} must be a tensor ({_torch_dtype(info.dtype())} "
                f"{list(info.sizes())}), got {type(value).__name__}"
            )
        want = _SCALAR_TYPES.get(info.dtype())
        if value.dtype != want:
            raise InputMismatchError(f"input {i} of {method_name!r} must have dtype {want}, got {value.dtype}")
        declared = list(info.sizes())
        if list(value.shape) != declared and not _within_bounds(list(value.shape), declared):
            raise InputMismatchError(
                f"input {i} of {method_name!r} must have shape {declared} (at most, in dimensions exported "
                f"as dynamic), got {list(value.shape)}"
            )


def _within_bounds(shape: list[int], declared: list[int]) -> bool:
    """A program exported with dynamic dimensions declares their upper bounds, and executorch runs
    any shape of the same rank within them; whether a dimension is dynamic is executorch's to check
    (``set_inputs`` refuses to resize a static one: that error is an InputMismatchError too)."""
    return len(shape) == len(declared) and all(0 <= s <= d for s, d in zip(shape, declared))


def _prepare(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous()
    return value


class LoadedMethod:
    """One method of an ExecuTorch program, loaded once and run any number of times with its MPS
    delegates emulated. State the program keeps between calls (mutable buffers such as a KV cache)
    persists from one call to the next, as in an app that keeps its ``Module`` loaded::

        step = LoadedMethod(pte)              # "forward"
        logits = step([tokens, input_pos])[0]

    ``mode`` is passed to the device-model interpreter (``"faithful"`` reproduces what the device
    computes, bugs included). A malformed program raises
    :class:`~mps_backend.runtime.program_check.ProgramFormatError` before executorch reads it; wrong
    inputs raise :class:`InputMismatchError`; an exception raised
    while executing a delegate is re-raised as is; other runtime failures raise
    :class:`EmulatorError`.
    """

    def __init__(self, pte: bytes | str | os.PathLike, method: str = "forward", mode: str = "faithful"):
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a string, not {type(mode).__name__}")
        self.name, self.mode = method, mode
        self._data = _read_program(pte)  # the program may point into this buffer: keep it alive
        emulator = load_emulator()
        with emulator.lock:
            self._load(emulator, method)
        self._emulator = emulator

    def _load(self, emulator: Any, method: str) -> None:
        _C = emulator.pybindings
        try:
            self._program = _C._load_program_from_buffer(self._data, program_verification=_C.Verification.InternalConsistency)
        except RuntimeError as exc:
            raise EmulatorError(f"ExecuTorch could not load the program: {exc}") from exc
        names = {self._program.get_method_name(i) for i in range(self._program.num_methods())}
        if method not in names:
            raise EmulatorError(f"the program has no method {method!r} (methods: {sorted(names)})")
        self.meta = self._program.method_meta(method)
        try:
            self._method = self._program.load_method(method)
        except RuntimeError as exc:
            _refuse_missing_kernels(_C, self._data, method, exc)
            raise EmulatorError(
                f"ExecuTorch could not load method {method!r} (a delegate failed to initialise, "
                f"e.g. an MPSBackend payload that is not an MP00 blob, or a backend that is not "
                f"registered; registered: {_C._get_registered_backend_names()}): {exc}"
            ) from exc

    def __call__(self, inputs: Sequence[Any] = ()) -> list[Any]:
        inputs = [_prepare(v) for v in inputs]
        with self._emulator.lock:  # reading the method's metadata is a call into executorch too
            if getattr(self, "_method", None) is None:
                raise EmulatorError(f"method {self.name!r} was closed")
            _check_inputs(self.meta, inputs, self.name)
            return self._run(inputs)

    def close(self) -> None:
        """Free the loaded program now, holding the runtime's lock (its destructors run executorch
        code too: left to the garbage collector, they could run beside another thread's call)."""
        emulator = getattr(self, "_emulator", None)
        if emulator is None:
            return
        with emulator.lock:
            self._method = None
            self._program = None

    def __enter__(self) -> "LoadedMethod":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _run(self, inputs: list[Any]) -> list[Any]:
        loaded = self._method
        try:
            loaded.set_inputs(inputs)
        except RuntimeError as exc:
            meta = loaded.method_meta()
            wanted = []
            for i in range(meta.num_inputs()):
                try:
                    info = meta.input_tensor_meta(i)
                    wanted.append(f"{_SCALAR_TYPES.get(info.dtype())} {list(info.sizes())}")
                except Exception:  # noqa: BLE001
                    wanted.append("non-tensor")
            given = [f"{v.dtype} {list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__ for v in inputs]
            raise InputMismatchError(
                f"ExecuTorch rejected the inputs of {self.name!r} (a shape it cannot take: static dimensions "
                f"do not resize): expected {wanted}, got {given} ({exc})"
            ) from exc
        with self._emulator.session(self.mode) as state:
            try:
                loaded.execute()
            except RuntimeError as exc:
                error = state.error
                state.error = None
                if error is not None:
                    raise error from exc
                raise EmulatorError(f"ExecuTorch failed to execute {self.name!r}: {exc}") from exc
        return list(loaded.get_outputs(clone_outputs=True))


def _refuse_missing_kernels(_C: Any, data: bytes, method: str, exc: BaseException) -> None:
    """After executorch failed to load ``method``: if the program names CPU operators this runtime has
    no kernel for ("Missing operator"), raise an EmulatorError listing them (an export whose runtime
    check was skipped, ``--target-runtime none`` or ``--allow-missing-kernels``, can name such ones)."""
    from mps_backend.runtime.program_check import method_operators  # noqa: PLC0415

    registered = set(_C._get_operator_names())
    missing = [op for op in method_operators(data, method) if op not in registered]
    if missing:
        raise EmulatorError(
            f"ExecuTorch could not load method {method!r}: it runs {', '.join(missing)} on CPU and this "
            f"executorch runtime has no kernel for {'them' if len(missing) > 1 else 'it'} (export checks the "
            "target runtime's kernels unless --target-runtime none or --allow-missing-kernels)"
        ) from exc


def run_pte(
    pte: bytes | str | os.PathLike, inputs: Sequence[torch.Tensor], mode: str = "faithful", *, method: str = "forward"
) -> list[torch.Tensor]:
    """Run ``method`` of an ExecuTorch program once with ExecuTorch's runtime, MPS delegates
    emulated (a fresh load: mutable buffers start from their initial state). See
    :class:`LoadedMethod` for the errors, and to keep a program loaded across calls."""
    with LoadedMethod(pte, method, mode) as loaded:
        return loaded(inputs)


def _debug_buffer_estimate(data: bytes) -> int:
    """Bytes of debug buffer an ETDump of one run needs: every value of every MPS delegate (each
    node's output is logged once) plus the program's own tensors, with headroom."""
    from mps_backend.serialization import read_blob  # noqa: PLC0415
    from mps_backend.serialization.pte import delegate_blobs  # noqa: PLC0415

    total = len(data)
    for delegate in delegate_blobs(data):
        graph = read_blob(delegate.blob).graph
        total += sum(math.prod(max(int(d), 1) for d in v.dims) * 4 for v in graph.values)
    return 2 * total + (16 << 20)


def run_with_etdump(
    pte: bytes | str | os.PathLike,
    inputs: Sequence[torch.Tensor],
    etdump_path: str | os.PathLike,
    debug_buffer_path: str | os.PathLike | None = None,
    *,
    method: str = "forward",
    mode: str = "faithful",
    debug_buffer_size: int | None = None,
) -> list[Any]:
    """Run ``method`` once with ExecuTorch's event tracer on and write its ETDump (and, with
    ``debug_buffer_path``, the debug buffer holding the intermediate outputs).

    Each MPS delegate call logs one event per MPS node, under the delegate debug identifiers the
    ahead-of-time side recorded (the node's index), with the node's output as the intermediate
    output and ``EMULATED_EVENT_METADATA`` as the event's metadata: load the ETDump with
    ``executorch.devtools.Inspector`` and the program's ETRecord (``mps-backend export --etrecord``)
    to see one row per operator inside the delegate, e.g. ``calculate_numeric_gap``. The times
    are the emulator's on this CPU, not the device's.
    """
    data = _read_program(pte)
    inputs = [_prepare(v) for v in inputs]
    size = (
        debug_buffer_size
        if debug_buffer_size is not None
        else (_debug_buffer_estimate(data) if debug_buffer_path is not None else 0)
    )
    emulator = load_emulator()
    _C = emulator.pybindings
    with emulator.lock:
        try:
            module = _C._load_for_executorch_from_buffer(data, enable_etdump=True, debug_buffer_size=size)
        except RuntimeError as exc:
            raise EmulatorError(f"ExecuTorch could not load the program: {exc}") from exc
        try:
            with emulator.session(mode) as state:
                try:
                    outputs = module.run_method(method, tuple(inputs))
                except RuntimeError as exc:
                    error, state.error = state.error, None
                    if error is not None:
                        raise error from exc
                    _refuse_missing_kernels(_C, data, method, exc)
                    raise EmulatorError(f"ExecuTorch failed to execute {method!r}: {exc}") from exc
            module.write_etdump_result_to_file(
                os.fspath(etdump_path), None if debug_buffer_path is None else os.fspath(debug_buffer_path)
            )
        finally:
            del module
    return list(outputs)


def verify_bundled(
    bpte: bytes | str | os.PathLike, method: str = "forward", *, mode: str = "faithful", rtol: float = 1e-3, atol: float = 1e-3
) -> list[bool]:
    """Run each test case of a bundled program (``.bpte``) the way an app checks one on the device
    (executorch's bundled-program check: load the bundled inputs, execute, compare with the bundled
    expected outputs), with the MPS delegates emulated. One entry per test case: whether it matched."""
    data = _read_program(bpte, check=False)  # a bundled program: executorch's bundled loader reads it
    cases = _check_bundled(data, method, os.fspath(bpte) if isinstance(bpte, (str, os.PathLike)) else None)
    emulator = load_emulator()
    with emulator.lock:
        return _verify_bundled(emulator, data, cases, method, mode, rtol, atol)


def _check_bundled(data: bytes, method: str, name: str | None = None) -> int:
    """The number of test cases of ``method`` in the bundled program ``data``, after the bundle's own
    tables (bounded reader) and its inner program (:func:`check_program`, as for a ``.pte``) are
    checked: executorch's bundled loader trusts both."""
    from mps_backend.runtime.bundled_check import read_bundled  # noqa: PLC0415
    from mps_backend.runtime.program_check import ProgramFormatError, check_program  # noqa: PLC0415

    try:
        program, cases = read_bundled(data, ProgramFormatError)
        check_program(program)
    except ProgramFormatError as exc:
        raise ProgramFormatError(f"{name}: {exc}" if name else str(exc)) from None
    return cases.get(method, 0)


def _verify_bundled(emulator: Any, data: bytes, cases: int, method: str, mode: str, rtol: float, atol: float) -> list[bool]:
    try:
        bundle = emulator.pybindings._load_bundled_program_from_buffer(data)
    except RuntimeError as exc:
        raise EmulatorError(f"ExecuTorch could not load the bundled program: {exc}") from exc
    if not cases:
        raise EmulatorError(f"the bundled program has no test case for method {method!r}")
    results = []
    for index in range(cases):
        with emulator.session(mode) as state:
            try:
                bundle.verify_result_with_bundled_expected_output(method, index, rtol, atol)
                results.append(True)
            except RuntimeError as exc:
                error, state.error = state.error, None
                if error is not None:  # the emulated delegate failed: not a mismatch
                    raise error from exc
                results.append(False)
    return results


def constant_method_values(pte: bytes | str | os.PathLike) -> dict[str, Any]:
    """The values of a program's constant methods (methods without inputs that return a constant,
    like the LLM metadata ``get_max_seq_len``): name -> int, float, bool or list of them."""
    data = _read_program(pte)
    emulator = load_emulator()
    with emulator.lock:
        return _constant_method_values(emulator.pybindings, data)


def _constant_method_values(_C: Any, data: bytes) -> dict[str, Any]:
    try:
        program = _C._load_program_from_buffer(data, program_verification=_C.Verification.InternalConsistency)
    except RuntimeError as exc:
        raise EmulatorError(f"ExecuTorch could not load the program: {exc}") from exc
    values: dict[str, Any] = {}
    for i in range(program.num_methods()):
        name = program.get_method_name(i)
        meta = program.method_meta(name)
        if meta.num_inputs() != 0:
            continue
        method = program.load_method(name)
        method.set_inputs([])
        method.execute()
        outputs = list(method.get_outputs(clone_outputs=True))
        values[name] = outputs[0] if len(outputs) == 1 else outputs
    return values


def program_input_specs(pte: bytes | str | os.PathLike, *, method: str = "forward") -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each tensor input of ``method``, read from the program's metadata (the
    program is verified like :func:`run_pte` does first: a corrupt file is an EmulatorError)."""
    emulator = load_emulator()
    with emulator.lock:
        return _input_specs(emulator.pybindings, _read_program(pte), method)


def _input_specs(_C: Any, data: bytes, method: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    from mps_backend.runtime.core import max_tensor_bytes  # noqa: PLC0415

    try:
        program = _C._load_program_from_buffer(data, program_verification=_C.Verification.InternalConsistency)
        names = {program.get_method_name(i) for i in range(program.num_methods())}
        if method not in names:
            raise EmulatorError(f"the program has no method {method!r} (methods: {sorted(names)})")
        meta = program.method_meta(method)
        specs = []
        limit = max_tensor_bytes()
        for i in range(meta.num_inputs()):
            info = meta.input_tensor_meta(i)
            dtype = _SCALAR_TYPES.get(info.dtype())
            if dtype is None:
                raise EmulatorError(f"input {i} of {method!r} has an unsupported ScalarType code {info.dtype()}")
            sizes = tuple(info.sizes())
            nbytes = math.prod(max(int(d), 0) for d in sizes) * dtype.itemsize
            if nbytes > limit:  # a tensor this big is a corrupt program, not an input to make up
                raise EmulatorError(
                    f"input {i} of {method!r} is declared {list(sizes)} ({nbytes / 2**30:.3g} GiB), "
                    f"beyond the {limit / 2**30:.3g} GiB per-tensor budget (MPS_BACKEND_MAX_TENSOR_BYTES)"
                )
            specs.append((sizes, dtype))
    except (RuntimeError, IndexError) as exc:  # IndexError: an input that is not a tensor
        raise EmulatorError(f"ExecuTorch could not read the inputs of {method!r}: {exc}") from exc
    return specs
