"""The ctypes bridge between executorch's runtime and the device model (the middle layer of the
emulator: :mod:`~mps_backend.runtime.shim_build` compiles the shim, this module loads it and serves its
callback, :mod:`~mps_backend.runtime.emulator` runs programs).

Loading the shim registers a backend named ``MPSBackend`` in the runtime's backend registry. Its
``execute()`` hands every tensor argument of the delegate call to a ctypes callback here, which splits
them into inputs and outputs as the device runtime does (semantics §4: the first ``len(input_ids)``
tensors are inputs, the next ``len(output_ids)`` outputs), runs the device-model interpreter
(:class:`mps_backend.runtime.interpreter.Interpreter`) and writes the results into the output buffers.
Within a :class:`~mps_backend.runtime.emulator.LoadedMethod` each delegate's blob is decoded at its
first call and kept for the next ones (the device runtime builds its graph once, at init).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from mps_backend.runtime.shim_build import EmulatorError, build_shim, pybindings

__all__ = ["EMULATED_EVENT_METADATA", "load_emulator"]

#: must match kAbiVersion in shim/mps_emulator.cpp
_ABI_VERSION = 2


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
# The callback: one delegate call


def _execute_delegate(
    blob: bytes,
    inputs: list[torch.Tensor],
    mode: str,
    observer: Any = None,
    loaded: dict[tuple[int, str], Any] | None = None,
    handle_id: int = 0,
) -> list[torch.Tensor]:
    """Run one MP00 blob with the device-model interpreter (imported at call time). ``loaded`` (a
    loaded method's, see :meth:`_Emulator.session`): the interpreter of each delegate handle, decoded
    at its first call and kept for the next ones, as the device runtime builds its graph once at init."""
    from mps_backend.runtime import interpreter  # noqa: PLC0415

    key = (handle_id, mode)
    program = loaded.get(key) if loaded is not None else None
    if program is None:
        program = interpreter.Interpreter(blob, mode)
        if loaded is not None:
            loaded[key] = program
    return list(program.run_with_report(inputs, observer)[0])


def _delegate_blob(blob_ptr: int, blob_len: int, cached: bool) -> bytes | memoryview:
    """The delegate's MP00 bytes. Decoded once per handle and kept by a loaded method (``cached``),
    they are a view of the handle's own copy, which lives as long as the handle, and that is as
    long as the method's interpreters (:meth:`LoadedMethod.close` drops them first): no copy of the
    blob, which holds every weight of an LLM. A one-off call copies them
    (not ``ctypes.string_at``: its size is a C int, negative for a blob of 2 GiB or more)."""
    view = (ctypes.c_char * blob_len).from_address(blob_ptr)
    return memoryview(view).cast("B") if cached else bytes(view)


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
    def session(self, mode: str, loaded: dict[tuple[int, str], Any] | None = None) -> Iterator[threading.local]:
        """Delegate calls in this block run in ``mode``; with ``loaded`` (a dict the caller keeps while
        its program is loaded: delegate handle ids are never reused) each delegate's decoded blob is
        kept there across calls."""
        state = self.state
        previous = getattr(state, "mode", None), getattr(state, "loaded", None)
        state.mode, state.loaded, state.error = mode, loaded, None
        try:
            yield state
        finally:
            state.mode, state.loaded = previous

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
            blob = _delegate_blob(blob_ptr, blob_len, getattr(self.state, "loaded", None) is not None)
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
                outputs = _execute_delegate(blob, inputs, mode, observer, getattr(self.state, "loaded", None), handle_id)
            except ValueError as exc:  # a malformed blob, or the interpreter refusing the bound tensors
                from mps_backend.config import ConfigError  # noqa: PLC0415
                from mps_backend.serialization import MPSFormatError  # noqa: PLC0415

                if isinstance(exc, ConfigError):  # a setting of the environment, not the program: said as such
                    raise

                what = "malformed blob" if isinstance(exc, MPSFormatError) else "the program's tensors do not match its blob"
                raise EmulatorError(f"MPS delegate (handle {handle_id}): {what}: {exc}") from exc
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
