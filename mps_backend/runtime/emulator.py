"""Run whole ``.pte`` files with ``MPSBackend`` delegates on Linux and macOS: the program API of the
emulator (its top layer: :mod:`~mps_backend.runtime.shim_build` compiles the C++ shim,
:mod:`~mps_backend.runtime.shim_bridge` loads it into executorch's runtime and serves its callback, this
module loads and runs programs).

ExecuTorch's own runtime (the pybindings of the installed executorch wheel) loads and runs the program:
CPU kernels, memory planning, delegate calls; the shim registers a backend named ``MPSBackend`` whose
calls the device-model interpreter (:func:`mps_backend.runtime.interpreter.execute`) computes.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mps_backend.runtime.bundled_check import check_bundle
from mps_backend.runtime.core import max_tensor_bytes
from mps_backend.runtime.program_check import ProgramFormatError, check_program, method_operators
from mps_backend.runtime.shim_bridge import _SCALAR_TYPES, EMULATED_EVENT_METADATA, _torch_dtype, load_emulator
from mps_backend.runtime.shim_build import EmulatorBuildError, EmulatorError, build_shim, pybindings, shim_path
from mps_backend.serialization import read_blob
from mps_backend.serialization.pte import delegate_blobs

__all__ = [
    "EMULATED_EVENT_METADATA",
    "EmulatorBuildError",
    "EmulatorError",
    "InputMismatchError",
    "LoadedMethod",
    "build_shim",
    "constant_method_values",
    "load_emulator",
    "program_input_specs",
    "pybindings",
    "run_pte",
    "run_with_etdump",
    "shim_path",
    "verify_bundled",
]


class InputMismatchError(EmulatorError, ValueError):
    """The inputs given to :func:`run_pte` do not match what the method expects."""


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
        try:
            check_program(data)
        except ProgramFormatError as exc:
            if isinstance(pte, (str, os.PathLike)):
                raise ProgramFormatError(f"{os.fspath(pte)}: {exc}") from None
            raise
    return data


def _checked_file(path: str | os.PathLike) -> str:
    """``path``, once :func:`~mps_backend.runtime.program_check.check_program` has passed the file,
    read through a read-only mapping (not a copy: an LLM's ``.pte`` is gigabytes)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            _read_program(path)  # the empty file's error
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # closed when collected (views may be alive)

    try:
        check_program(view)
    except ProgramFormatError as exc:
        raise ProgramFormatError(f"{path}: {exc}") from None
    return path


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
        # a file is mapped by executorch (its delegates' blobs are then read from the page cache, not
        # from a copy of the file); bytes are kept alive here, as the program points into them
        self._path = _checked_file(pte) if isinstance(pte, (str, os.PathLike)) else None
        self._data = None if self._path else _read_program(pte)
        #: the device-model interpreter of each delegate, decoded at its first call (shim_bridge.session)
        self._delegates: dict[tuple[int, str], Any] = {}
        emulator = load_emulator()
        with emulator.lock:
            self._load(emulator, method)
        self._emulator = emulator

    def _load(self, emulator: Any, method: str) -> None:
        _C = emulator.pybindings
        try:
            if self._path is not None:
                self._program = _C._load_program(self._path, program_verification=_C.Verification.InternalConsistency)
            else:
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
            _refuse_missing_kernels(_C, self._data if self._path is None else Path(self._path).read_bytes(), method, exc)
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
            self._delegates.clear()  # first: the interpreters view the delegate handles' blobs
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
        with self._emulator.session(self.mode, self._delegates) as state:
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
    try:
        _, cases = check_bundle(data, ProgramFormatError)  # the program too, and each case against its method
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
