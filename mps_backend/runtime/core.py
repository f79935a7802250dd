"""Shared pieces of the device model: errors, dtype mapping, and the per-run kernel context.

Kernels live in ``kernels/<family>.py``; each module exports ``KERNELS``, a mapping from
union member name to ``fn(ctx: KernelContext, node: Node) -> None``. A kernel reads its
inputs with ``ctx.get(id)``, computes with torch CPU ops following
``docs/device-semantics.md`` (not our lowerings), and binds results with
``ctx.set(id, tensor)``. Where MPSGraph would refuse to build or the runtime would abort,
the kernel calls ``ctx.fail(reason)`` (raises DeviceError naming the node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mps_backend.config import env_bytes
from mps_backend.errors import MPSBackendError
from mps_backend.serialization.model import DataType, Node

#: serialized dtype -> device torch dtype (semantics §3.1); absent = the runtime aborts
DEVICE_DTYPE: dict[DataType, torch.dtype] = {
    DataType.float16: torch.float16,
    DataType.float32: torch.float32,
    DataType.float64: torch.float32,  # float64 is F32 on device
    DataType.int8: torch.int8,
    DataType.int16: torch.int16,
    DataType.int32: torch.int32,
    DataType.int64: torch.int64,
    DataType.bool: torch.bool,
    DataType.int4: torch.int8,  # int4 constants are unpacked to int8 values in [-8, 7]
}

#: device dtypes that the binary helpers accept (semantics §3.1, last paragraph)
BINARY_DTYPES = (torch.float16, torch.float32, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)


#: the device model refuses any single tensor larger than this (bytes; $MPS_BACKEND_MAX_TENSOR_BYTES
#: overrides): a damaged or hostile blob (a padding of 2**30, a fill of 65536 x 65536) must end in a
#: DeviceError, not in the machine's memory running out. 4 GiB is above every tensor of a 3B-parameter
#: language model (its largest, the embedding table, is 0.8 GB in float16).
DEFAULT_MAX_TENSOR_BYTES = 4 << 30


def max_tensor_bytes() -> int:
    return env_bytes("MPS_BACKEND_MAX_TENSOR_BYTES", DEFAULT_MAX_TENSOR_BYTES)


class DeviceError(MPSBackendError, RuntimeError):
    """What the device would do is abort, refuse to build the graph, or return NotImplemented."""

    def __init__(self, reason: str, node_index: int | None = None, op: str | None = None):
        self.reason, self.node_index, self.op = reason, node_index, op
        where = "" if node_index is None else f"node {node_index} ({op}): "
        super().__init__(where + reason)


def device_dtype(dt: int) -> torch.dtype:
    """Device dtype of a serialized dtype; raises DeviceError where the runtime aborts."""
    try:
        return DEVICE_DTYPE[DataType(dt)]
    except (KeyError, ValueError):
        name = DataType(dt).name if dt in DataType._value2member_map_ else str(dt)
        raise DeviceError(f"Invalid MPS data type {name} (the runtime aborts in getMPSDataType)") from None


@dataclass
class KernelContext:
    """Per-execution state handed to kernels. ``mode`` is 'faithful' (device bugs kept) or 'aten'."""

    values: dict[int, torch.Tensor] = field(default_factory=dict)
    mode: str = "faithful"
    node_index: int | None = None
    op: str | None = None
    graph: Any = None  # serialization.model.Graph
    #: float16 values (depending on constants only) that the interpreter keeps widened to float32 across
    #: runs, by value id (``interpreter.Memo``): filled the first time a kernel widens one
    widened: dict[int, torch.Tensor] | None = None
    widen_ids: frozenset[int] = frozenset()
    #: :func:`max_tensor_bytes`, read once a run (every operand of every node is checked against it)
    limit: int = field(default_factory=lambda: max_tensor_bytes())

    def fail(self, reason: str) -> None:
        raise DeviceError(reason, self.node_index, self.op)

    def reserve(self, numel: int, itemsize: int, what: str) -> None:
        """Refuse (DeviceError) to allocate a tensor of ``numel`` elements of ``itemsize`` bytes
        beyond :func:`max_tensor_bytes`: called by kernels before they allocate from node fields."""
        limit = self.limit
        if numel * itemsize > limit:
            self.fail(
                f"{what} needs {numel * itemsize / 2**30:.3g} GiB ({numel} elements), beyond the device "
                f"model's {limit / 2**30:.3g} GiB per tensor (MPS_BACKEND_MAX_TENSOR_BYTES)"
            )

    def get(self, vid: int) -> torch.Tensor:
        if vid == -1:
            self.fail("value id -1 used where a tensor is required (the runtime indexes its table with -1)")
        t = self.values.get(vid)
        if t is None:
            self.fail(f"value {vid} is read before it is set (nil tensor in MPSGraph)")
        return t

    def set(self, vid: int, t: torch.Tensor) -> None:
        if t.dtype not in (torch.float16, torch.float32, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool):
            self.fail(f"kernel produced unsupported device dtype {t.dtype} for value {vid}")
        if t.dim() == 0:
            t = t.reshape(1)  # no rank 0 on device
        self.values[vid] = t

    def get_computed(self, vid: int) -> torch.Tensor:
        """``compute(get(vid))``: the value widened to float32 when float16, for an operand the
        interpreter keeps widened (``widen_ids``) taken from, or put into, its cache."""
        t = self.get(vid)
        if self.widened is None or vid not in self.widen_ids or t.dtype != torch.float16:
            return compute(t)
        wide = self.widened.get(vid)
        if wide is None:
            wide = self.widened[vid] = compute(t)
        return wide

    @property
    def faithful(self) -> bool:
        return self.mode == "faithful"


def compute(t: torch.Tensor) -> torch.Tensor:
    """Operand for computing: f16 is widened to f32 (results are rounded back with ``to``)."""
    return t.float() if t.dtype == torch.float16 else t


def to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round/cast a computed result to the device dtype of the op's output."""
    return t if t.dtype == dtype else t.to(dtype)


def promote(ctx: KernelContext, a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    """Binary-family promotion (semantics §3.3): PyTorch's promoteTypes of the two device dtypes."""
    for t in (a, b):
        if t.dtype not in BINARY_DTYPES:
            ctx.fail(f"binary op on unsupported dtype {t.dtype}")
    return torch.promote_types(a.dtype, b.dtype)


def same_dtype(ctx: KernelContext, *ts: torch.Tensor, what: str = "inputs") -> torch.dtype:
    """Non-promoting ops: all operands must share a dtype, else MPSGraph fails to compile."""
    dts = {t.dtype for t in ts}
    if len(dts) != 1:
        ctx.fail(f"{what} have mixed dtypes {sorted(str(d) for d in dts)}; MPSGraph does not promote here")
    return ts[0].dtype


def elementwise(ctx: KernelContext, fn, *ts: torch.Tensor, out_dtype: torch.dtype | None = None):
    """Apply ``fn`` in f32 for f16 operands and round to ``out_dtype`` (default: first operand's)."""
    out_dtype = out_dtype or ts[0].dtype
    return to(fn(*(compute(t) for t in ts)), out_dtype)


def node_field(node: Node, name: str):
    return node.fields[name]


def wrap_dim(ctx: KernelContext, dim: int, rank: int, what: str = "dim") -> int:
    """Axis in [-rank, rank) made non-negative (MPSGraph wraps negative axes); else the build fails."""
    if not -rank <= dim < rank:
        ctx.fail(f"{what} {dim} out of range for rank {rank}")
    return dim + rank if dim < 0 else dim


def checked(ctx: KernelContext, what: str, fn, *args, **kwargs):
    """Run a torch op whose shape/argument errors correspond to an MPSGraph build failure."""
    try:
        return fn(*args, **kwargs)
    except DeviceError:
        raise
    except (RuntimeError, IndexError, ValueError) as e:
        ctx.fail(f"{what}: {e}")


def f32(v: float) -> float:
    """A float field as the device sees it: schema ``float`` fields are float32."""
    return float(np.float32(v))


def scalar_const(value: float, dtype: torch.dtype) -> torch.Tensor:
    """MPSGraph ``constantWithScalar:(double) shape:@[@1] dataType:``: ``value`` converted to ``dtype``
    (rounded for f16, truncated toward zero for integers, non-zero => true for Bool), shape [1]."""
    return torch.tensor([value], dtype=torch.float64).to(dtype)


def round_to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round an intermediate computed in f32 to the device dtype f16 and keep computing in f32
    (for multi-op members whose intermediates are separate f16 tensors on the device)."""
    return t.to(torch.float16).float() if dtype == torch.float16 and t.dtype == torch.float32 else t
