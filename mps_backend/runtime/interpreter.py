"""Execute an MP00 blob on the CPU as the MPS delegate runtime would (semantics §1, §2, §4, §7).

    outputs = execute(blob, inputs)                       # faithful: device bugs reproduced
    outputs = execute(blob, inputs, mode="aten")          # torch semantics where the device differs
    outputs, report = execute(blob, inputs, return_report=True)

``Interpreter(blob, mode)`` decodes the blob and loads its constants once (zero-copy views of the
blob bytes); ``run`` / ``run_with_report`` execute it on one set of inputs. What depends on constants
only (a weight's transpose, dequantization or cast, and float16 weights widened for a matmul) is
computed on the first run and kept for the next ones when it fits ``$MPS_BACKEND_EMULATOR_MEMO_BYTES`` (0: off)
(:class:`Memo`): the same kernels on the same values, so the same results, once instead of per call. ``report`` has one
``OutputInfo`` per output: its ``reinterpreted`` flag is true where the device writes another dtype
or element count than the declared output tensor holds (ExecuTorch would see reinterpreted bytes).

Device failures (abort, MPSGraph build error, NotImplemented, unset output) raise ``DeviceError``
naming the node; caller mistakes (input count, shape or dtype) raise ``ValueError``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import torch

from mps_backend.config import env_bytes
from mps_backend.serialization import read_blob
from mps_backend.serialization.device_facts import IGNORED_IDS, OUTPUT_FIELDS, node_value_ids
from mps_backend.serialization.model import Blob, DataType, Node, OpType

from .core import DeviceError, KernelContext, device_dtype, max_tensor_bytes
from .kernels import KERNELS

MODES = ("faithful", "aten")

#: declared dtype -> dtype of the ExecuTorch tensor that holds it (what the device writes into)
DECLARED_DTYPE: dict[DataType, torch.dtype] = {
    DataType.float16: torch.float16,
    DataType.float32: torch.float32,
    DataType.float64: torch.float64,
    DataType.bfloat16: torch.bfloat16,
    DataType.int8: torch.int8,
    DataType.int16: torch.int16,
    DataType.int32: torch.int32,
    DataType.int64: torch.int64,
    DataType.uint8: torch.uint8,
    DataType.bool: torch.bool,
}

_ITEMSIZE = {
    DataType.float16: 2,
    DataType.bfloat16: 2,
    DataType.float32: 4,
    DataType.float64: 8,
    DataType.int8: 1,
    DataType.uint8: 1,
    DataType.int16: 2,
    DataType.int32: 4,
    DataType.int64: 8,
    DataType.bool: 1,
    DataType.int4: 1,
}

_NUMPY_DTYPE = {
    torch.float16: "<f2",
    torch.float32: "<f4",
    torch.int8: "i1",
    torch.int16: "<i2",
    torch.int32: "<i4",
    torch.int64: "<i8",
    torch.bool: "u1",
}


@dataclass(frozen=True)
class OutputInfo:
    """One graph output: what the file declares and what the device produced."""

    value_id: int
    declared_dtype: DataType
    declared_shape: tuple[int, ...]
    device_dtype: torch.dtype
    device_shape: tuple[int, ...]

    @property
    def reinterpreted(self) -> bool:
        """True where the device's bytes do not match the declared output (dtype or element count)."""
        return DECLARED_DTYPE.get(self.declared_dtype) != self.device_dtype or math.prod(self.declared_shape) != math.prod(
            self.device_shape
        )


def unpack_int4(raw, shape: Sequence[int]) -> torch.Tensor:
    """int4 constant bytes -> int8 values in [-8, 7] (§5.17: low nibble = even k, signed)."""
    numel = math.prod(shape)
    if shape[-1] % 2:
        raise DeviceError(f"int4 constant of shape {list(shape)}: the last dimension must be even")
    b = np.frombuffer(raw, dtype=np.uint8, count=numel // 2)
    nibbles = np.stack([b & 0xF, b >> 4], axis=-1).astype(np.int8)
    return torch.from_numpy(((nibbles ^ 8) - 8).reshape(tuple(shape)))


def load_constant(blob: Blob, vid: int, packed: bool = False) -> torch.Tensor:
    """A constant as the device sees it (§1): the segment bytes in the declared dtype and shape.
    ``packed``: an int4 constant as its bytes, uint8 ``[..., last / 2]`` (a view of the blob; the
    dequantize kernel unpacks a block of rows at a time)."""
    t = blob.graph.values[vid]
    shape, numel, size = t.device_shape, math.prod(t.device_shape), t.constant_buffer_size
    where = f"constant value {vid} ({t.datatype.name} {list(t.dims)})"
    if size <= 0:
        raise DeviceError(f"{where}: constant_buffer_size is 0 (the runtime aborts)")
    raw = blob.constant_bytes(vid)
    if len(raw) < size:
        raise DeviceError(f"{where}: {size} bytes declared, only {len(raw)} left in the blob")
    if t.datatype == DataType.int4:
        if size != (numel + 1) // 2:
            raise DeviceError(f"{where}: {size} bytes, int4 needs {(numel + 1) // 2}")
        if packed and shape[-1] % 2 == 0:  # (an odd last dimension: unpack_int4's error)
            return _read_only(np.frombuffer(raw, dtype=np.uint8, count=numel // 2).reshape(*shape[:-1], shape[-1] // 2))
        return unpack_int4(raw, shape)
    dt = device_dtype(t.datatype)
    want = numel * torch.empty((), dtype=dt).element_size()
    if size != want:
        note = " (float64 constants must already hold float32 bytes)" if t.datatype == DataType.float64 else ""
        raise DeviceError(f"{where}: {size} bytes, the device reads {want}{note}")
    arr = np.frombuffer(raw, dtype=_NUMPY_DTYPE[dt], count=numel).reshape(shape)
    if dt == torch.bool:
        return torch.from_numpy(arr != 0)
    return _read_only(arr)


def _read_only(arr: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # read-only view of the blob: kernels never write in place
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


def _decode(blob) -> Blob:
    if isinstance(blob, Blob):
        return blob
    if isinstance(blob, (bytes, bytearray, memoryview)):
        return read_blob(blob)
    raise TypeError(f"expected MP00 bytes or a decoded Blob, got {type(blob).__name__}")


def _check_ids(graph) -> None:
    """Every id a node names is -1 or inside the value table (else the runtime corrupts memory)."""
    n = len(graph.values)
    for i, node in enumerate(graph.nodes):
        for name, v in node.fields.items():
            if name.endswith("_id") or name.endswith("_ids"):
                for vid in v if isinstance(v, (list, tuple)) else [v]:
                    if not -1 <= vid < n:
                        raise DeviceError(f"{name} {vid} is outside the value table ({n} values)", i, node.op)


class NodeObserver(Protocol):
    """Watches a run node by node (the emulated runtime's per-node ETDump events)."""

    def begin(self, index: int, node: Node) -> None: ...

    def end(self, index: int, node: Node, outputs: list[torch.Tensor]) -> None: ...


def node_outputs(node: Node) -> list[int]:
    """Value ids a node defines (its output fields, without those the runtime never writes)."""
    fields = {k: v for k, v in node.fields.items() if (node.op, k) not in IGNORED_IDS}
    return node_value_ids(fields, outputs=True)


class Interpreter:
    """A decoded blob with its constants loaded, ready to run many times."""

    def __init__(self, blob: bytes | bytearray | memoryview | Blob, mode: str = "faithful"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.mode = mode
        self.blob = _decode(blob)
        g = self.graph = self.blob.graph
        if g.graph_type != OpType.mps_graph:
            raise DeviceError(
                f"graph_type {g.graph_type} is not mps_graph: every metal_kernel graph "
                "aborts at init ('Metal kernel path not yet implemented')"
            )
        n = len(g.values)
        for what, ids in (("input_ids", g.input_ids), ("constant_ids", g.constant_ids), ("output_ids", g.output_ids)):
            bad = [v for v in ids if not 0 <= v < n]
            if bad:
                raise DeviceError(f"{what} {bad} outside the value table ({n} values)")
        _check_ids(g)
        self._inputs = [(vid, g.values[vid]) for vid in g.input_ids]
        for vid, t in self._inputs:
            if t.datatype == DataType.int4:
                raise DeviceError(f"input value {vid} is int4: not supported by the device model")
            device_dtype(t.datatype)  # raises where the runtime aborts
        limit = max_tensor_bytes()
        for vid, t in enumerate(g.values):  # declared sizes first: nothing is allocated for them yet
            nbytes = _declared_bytes(t)
            if nbytes > limit:
                raise DeviceError(
                    f"value {vid} is declared {t.datatype.name}{list(t.dims)}: {nbytes / 2**30:.3g} GiB, "
                    f"beyond the device model's {limit / 2**30:.3g} GiB per tensor "
                    "(MPS_BACKEND_MAX_TENSOR_BYTES)"
                )
        self._packed = _dequantized_only(g)
        self._constants = {vid: load_constant(self.blob, vid, vid in self._packed) for vid in g.constant_ids}
        self._plan = [(i, node, KERNELS.get(node.op)) for i, node in enumerate(g.nodes)]
        self._operands = [_operands(node) for node in g.nodes]
        self._dead_after = _dead_after(g)
        budget = memo_bytes()
        self.memo = Memo.plan(g, budget) if budget else None  # 0: off

    # --------------------------------------------------------------------------------------------

    def _bind_inputs(self, inputs: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
        if len(inputs) != len(self._inputs):
            raise ValueError(f"the graph has {len(self._inputs)} inputs, {len(inputs)} tensors given")
        values: dict[int, torch.Tensor] = {}
        for vid, decl in self._inputs:
            if vid >= len(inputs):
                raise ValueError(
                    f"input value id {vid} has no input buffer (the runtime binds buffer i "
                    f"to value id i; {len(inputs)} inputs given)"
                )
            x = inputs[vid]
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"input {vid} is a {type(x).__name__}, not a torch.Tensor")
            want = device_dtype(decl.datatype)
            if x.dtype != want:
                raise ValueError(
                    f"input {vid} is {x.dtype} but the device reads {want} "
                    f"(declared {decl.datatype.name}); it would reinterpret the bytes"
                )
            if tuple(x.shape) not in (tuple(decl.dims), decl.device_shape):
                raise ValueError(
                    f"input {vid} has shape {list(x.shape)} but the static placeholder is "
                    f"{list(decl.dims)} (the device reads exactly that many elements)"
                )
            values[vid] = x.reshape(decl.device_shape)
        return values

    def run_with_report(
        self, inputs: Sequence[torch.Tensor], observer: NodeObserver | None = None
    ) -> tuple[list[torch.Tensor], list[OutputInfo]]:
        """Execute once; returns fresh output tensors (device dtype and shape) and their report.
        ``observer`` (optional) is told when each node starts and what it produced."""
        values = self._bind_inputs(inputs)
        values.update(self._constants)  # constants are built after the placeholders
        # an observer (ETDump, the debugger) is told about every node: nothing is skipped for it
        memo = self.memo if observer is None else None
        ctx = KernelContext(values=values, mode=self.mode, graph=self.graph)
        if memo is not None:
            ctx.widened, ctx.widen_ids = memo.widened, memo.widen
        with torch.no_grad():
            self._run_nodes(ctx, observer, release=True, memo=memo)
        outputs, report = [], []
        for vid in self.graph.output_ids:
            t = values.get(vid)
            if t is None:
                raise DeviceError(f"output value {vid} is never set (InvalidState: 'Failed to deserialize the model')")
            decl = self.graph.values[vid]
            outputs.append(t.clone(memory_format=torch.contiguous_format))
            report.append(OutputInfo(vid, decl.datatype, tuple(decl.dims), t.dtype, tuple(t.shape)))
        return outputs, report

    def _run_nodes(
        self, ctx: KernelContext, observer: NodeObserver | None = None, release: bool = False, memo: Memo | None = None
    ) -> None:
        """Run every node; with ``release``, each value is dropped after the last node that reads it
        (as MPSGraph frees its intermediates), so a run holds only the live ones. With ``memo``, the
        nodes that read constants only run on the first call; later calls bind their kept results."""
        skip = frozenset()
        if memo is not None and memo.filled:
            skip = memo.nodes
            ctx.values.update(memo.values)
        for i, node, fn in self._plan:
            if i in skip:
                continue
            ctx.node_index, ctx.op = i, node.op
            if fn is None:
                ctx.fail(f"{node.op} has no dispatch case in the runtime (NotImplemented)")
            if observer is not None:
                observer.begin(i, node)
            _reserve_operands(ctx, self._operands[i])
            try:
                fn(ctx, node)
            except DeviceError as e:
                if e.node_index is None:
                    raise DeviceError(e.reason, i, node.op) from e
                raise
            except (RuntimeError, IndexError) as e:  # torch refusing the op = MPSGraph build failure
                raise DeviceError(f"MPSGraph would fail to build: {e}", i, node.op) from e
            except MemoryError as e:  # a tensor within the budget that this host cannot allocate
                raise DeviceError(f"the device model ran out of host memory ({e or 'MemoryError'})", i, node.op) from e
            if observer is not None:
                observer.end(i, node, [ctx.values[v] for v in node_outputs(node) if v in ctx.values])
            if memo is not None and not memo.filled:
                memo.values.update((v, ctx.values[v]) for v in memo.keep_after.get(i, ()) if v in ctx.values)
            if release:
                for vid in self._dead_after[i]:
                    ctx.values.pop(vid, None)
        if memo is not None:
            memo.filled = True

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return self.run_with_report(inputs)[0]

    def run_values(self, inputs: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
        """Execute once and return every value the graph computed, by value id (inputs and
        constants included, int4 ones as their values): the intermediate results a debugger compares."""
        values = self._bind_inputs(inputs)
        values.update(self._constants)
        with torch.no_grad():
            self._run_nodes(KernelContext(values=values, mode=self.mode, graph=self.graph))
        values.update({vid: load_constant(self.blob, vid) for vid in self._packed})
        return values


#: bytes an interpreter may keep of what depends on constants only (:class:`Memo`); the default holds a
#: 135M-parameter model's float16 weights widened to float32 with room to spare, and nothing of a 1B one
DEFAULT_MEMO_BYTES = 1 << 30


def memo_bytes() -> int:
    """``$MPS_BACKEND_EMULATOR_MEMO_BYTES`` (0: nothing is kept)."""
    return env_bytes("MPS_BACKEND_EMULATOR_MEMO_BYTES", DEFAULT_MEMO_BYTES)


#: (op, operand field) of the matmuls, whose float16 operands the kernels widen to float32
_MATMUL_OPERANDS = frozenset(
    {("MPSMatMul", "input1_id"), ("MPSMatMul", "input2_id"), ("MPSAddmm", "input2_id"), ("MPSAddmm", "input3_id")}
)


@dataclass
class Memo:
    """What one interpreter keeps across runs of values that depend on constants only.

    ``nodes``: the nodes every input of which is a constant or such a node's result (a weight's
    MPSPermute, its dequantization, a cast): the same kernel on the same values gives the same result
    each run, so they run once. ``keep``: their results that another node reads (or the graph
    outputs), bound on later runs in their place; ``keep_after`` says which node defines each.
    ``widen``: float16 values of that kind (constants included) that a matmul reads, kept widened to
    float32 (``widened``; the kernels widen float16 operands exactly, so the same numbers). The plan
    is made from the declared shapes before anything runs: ``keep`` when its bytes fit the budget,
    then ``widen`` when the rest fits too; a model beyond it runs as before, nothing kept."""

    nodes: frozenset[int]
    keep_after: dict[int, tuple[int, ...]]
    widen: frozenset[int]
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    widened: dict[int, torch.Tensor] = field(default_factory=dict)
    filled: bool = False

    @classmethod
    def plan(cls, graph, budget: int) -> Memo | None:
        static = set(graph.constant_ids) - set(graph.input_ids)
        # a value defined twice, or a constant or input a node writes over: not memoized (a kept result
        # bound at the start of a run would shadow what the first part of the run reads)
        defined: dict[int, int] = {}
        for node in graph.nodes:
            for vid in node_outputs(node):
                defined[vid] = defined.get(vid, 0) + 1
        redefined = {v for v, n in defined.items() if n > 1} | set(graph.constant_ids) | set(graph.input_ids)
        nodes: list[int] = []
        reads_of: list[list[tuple[str, int]]] = []
        for i, node in enumerate(graph.nodes):
            reads = [
                (name, vid)
                for name, value in node.fields.items()
                if (node.op, name) not in IGNORED_IDS
                for vid in node_value_ids({name: value}, outputs=False)
                if vid >= 0
            ]
            reads_of.append(reads)
            outs = node_outputs(node)
            if all(vid in static for _, vid in reads) and not redefined.intersection(outs):
                nodes.append(i)
                static.update(outs)
        node_set = frozenset(nodes)
        needed = set(graph.output_ids)
        widen: set[int] = set()
        for i, node in enumerate(graph.nodes):
            for name, vid in reads_of[i]:
                if vid in static and (node.op, name) in _MATMUL_OPERANDS and graph.values[vid].datatype == DataType.float16:
                    widen.add(vid)
                if i not in node_set:
                    needed.add(vid)
        keep_after = {i: tuple(v for v in node_outputs(graph.nodes[i]) if v in needed) for i in nodes}
        keep_after = {i: vs for i, vs in keep_after.items() if vs}
        keep_bytes = sum(_declared_bytes(graph.values[v]) for vs in keep_after.values() for v in vs)
        if keep_bytes > budget:
            return None
        widen_bytes = sum(2 * _declared_bytes(graph.values[v]) for v in widen)
        return cls(node_set, keep_after, frozenset(widen) if keep_bytes + widen_bytes <= budget else frozenset())


def _declared_bytes(t) -> int:
    return math.prod(max(int(d), 0) for d in t.dims) * _ITEMSIZE.get(t.datatype, 8)


def _dequantized_only(graph) -> set[int]:
    """int4 constants read by nothing but the weight input of MPSDequantizePerChannelGroup nodes: kept
    packed (two values a byte, a view of the blob) instead of one int8 per value."""
    readers: dict[int, set[tuple[str, str]]] = {}
    for node in graph.nodes:
        for name, value in node.fields.items():
            if name.endswith(("_id", "_ids")) and name not in OUTPUT_FIELDS:
                for vid in value if isinstance(value, list) else (value,):
                    readers.setdefault(vid, set()).add((node.op, name))
    only = {("MPSDequantizePerChannelGroup", "input1_id")}
    return {
        vid
        for vid in graph.constant_ids
        if graph.values[vid].datatype == DataType.int4
        and readers.get(vid) == only
        and len(graph.values[vid].device_shape) == 2
        and vid not in graph.output_ids
    }


def _operands(node: Node) -> tuple[tuple[str, int], ...]:
    """(field, value id) of each operand a node reads: its ``input*`` fields holding one id."""
    return tuple((name, vid) for name, vid in node.fields.items() if name.startswith("input") and isinstance(vid, int))


def _reserve_operands(ctx: KernelContext, operands: tuple[tuple[str, int], ...]) -> None:
    """Refuse a node whose operands (:func:`_operands`) are beyond the per-tensor budget: a broadcast
    view is cheap, what reads it is not (a function of its own, so no operand outlives the check)."""
    values, limit = ctx.values, ctx.limit
    for name, vid in operands:
        t = values.get(vid)
        if t is not None and t.numel() * t.element_size() > limit:  # (the message only for a refusal)
            ctx.reserve(t.numel(), t.element_size(), f"operand {name} (value {vid}, shape {list(t.shape)})")


def _dead_after(graph) -> list[list[int]]:
    """Per node, the value ids no later node reads and that are not graph outputs: a value defined
    or read last by node i is dead after it (constants stay loaded in the interpreter)."""
    last: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for vid in node_value_ids(node.fields, outputs=False) + node_value_ids(node.fields, outputs=True):
            if vid >= 0:
                last[vid] = i
    keep = set(graph.output_ids)
    dead: list[list[int]] = [[] for _ in graph.nodes]
    for vid, i in last.items():
        if vid not in keep:
            dead[i].append(vid)
    return dead


def execute(
    blob: bytes | bytearray | memoryview | Blob,
    inputs: Sequence[torch.Tensor],
    mode: str = "faithful",
    *,
    return_report: bool = False,
):
    """Run ``blob`` (MP00 bytes, decoded with ``read_blob``, or a ``Blob``) on ``inputs``.

    Returns the outputs in ``output_ids`` order, each in the device dtype and shape; with
    ``return_report=True`` returns ``(outputs, [OutputInfo, ...])``.
    """
    outputs, report = Interpreter(blob, mode).run_with_report(inputs)
    return (outputs, report) if return_report else outputs


__all__ = ["DECLARED_DTYPE", "MODES", "Interpreter", "Memo", "OutputInfo", "execute", "load_constant", "unpack_int4"]
