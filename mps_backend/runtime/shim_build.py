"""Building the C++ shim of the emulator (the lowest of its three layers: ``shim_build`` compiles the
shim, :mod:`~mps_backend.runtime.shim_bridge` loads it and serves its callback,
:mod:`~mps_backend.runtime.emulator` runs programs).

The shim (``shim/mps_emulator.cpp``) is compiled on first use against the headers shipped in the
executorch wheel and linked to the library of the wheel that holds the runtime's backend registry.
Which library that is differs between releases (1.5: ``lib/libexecutorch.so`` beside the ``_C``
pybindings, ``lib/libexecutorch.dylib`` on macOS; 1.3-1.4: ``backends/qualcomm/libqnn_executorch_backend.so``,
which their Linux ``_portable_lib`` pybindings link, and ``_portable_lib`` itself on macOS; 1.0:
``_portable_lib`` itself): it is found at run time as the library that defines
``executorch::runtime::register_backend`` for the loaded pybindings (``dladdr``).

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
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from mps_backend.config import env_path
from mps_backend.errors import MPSBackendError, MPSBackendWarning

__all__ = ["EmulatorBuildError", "EmulatorError", "build_shim", "pybindings", "shim_path"]

_SHIM_SOURCE = Path(__file__).with_name("shim") / "mps_emulator.cpp"
_BUILD_TIMEOUT_S = 600


class EmulatorError(MPSBackendError, RuntimeError):
    """The emulator could not be set up, or a program could not be loaded or run."""


class EmulatorBuildError(EmulatorError):
    """The C++ shim could not be compiled (no compiler, or the compiler failed)."""


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
