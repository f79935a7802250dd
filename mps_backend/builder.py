"""GraphBuilder: all per-lowering state of one ``preprocess`` call.

It owns the value table, the constants (kept as tensors until the writer copies them once
into the blob), the node list and the map from fx nodes to value ids. Lowerings in
``mps_backend.operators`` only talk to a builder:

    x = b.id(node.args[0])                      # value id of an fx argument
    out = b.out(node)                           # new value id for the node's result
    b.emit(N.MPSReLU(input1_id=x, input2_id=-1, output_id=out))  # N: serialization.generated.nodes

Each value's device dtype follows the precision policy (:mod:`mps_backend.precision`): the
precision pass (``mps_backend.passes.precision``) records a device dtype on every float fx node
(``node.meta[DEVICE_DTYPE]``), and ``b.dtype(arg)`` / ``b.out(node)`` declare values in it. A value
without one (a policy that keeps what was traced, or a scalar a lowering makes) gets
``Precision.default_dtype``: float32 -> float16 in float16 mode. User inputs and outputs get one
boundary cast each where their device dtype differs from the declared one.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from typing import Any, Iterable, Iterator

import torch
from torch.fx import Node as FxNode

from mps_backend.dtypes import mps_dtype, torch_dtype
from mps_backend.errors import InternalError
from mps_backend.pages import PageReleaser
from mps_backend.precision import DEVICE_DTYPE, Precision
from mps_backend.serialization.device_facts import NOT_DISPATCHED
from mps_backend.serialization.generated import nodes as N
from mps_backend.serialization.model import DataType, Graph, Node, NodeFields, Tensor


def fx_val(node: FxNode) -> Any:
    return node.meta.get("val")


class _Cast:
    """A constant the blob holds in ``dtype``, kept as its source tensor until needed (fp16 mode)."""

    __slots__ = ("tensor", "dtype")

    def __init__(self, tensor: torch.Tensor, dtype: torch.dtype):
        self.tensor, self.dtype = tensor, dtype

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.dtype.itemsize

    def materialize(self) -> torch.Tensor:
        return self.tensor.to(self.dtype).contiguous()  # .to keeps a strided view's strides

    def write_into(self, out: memoryview) -> None:
        """Convert straight into the blob's bytes (the writer's deferred-source protocol)."""
        dst = torch.frombuffer(out, dtype=self.dtype, count=self.tensor.numel())
        dst.view(self.tensor.shape).copy_(self.tensor)  # any strides, one pass


class _Scaled(_Cast):
    """``tensor * scale`` in ``dtype``, ``scale`` one factor per index of dim 0 (e.g. a batch norm
    folded into a convolution's output channels), computed when read or written: like ``_Cast``, the
    result never exists next to the blob as a whole-model copy. The product is taken in ``scale``'s
    dtype (float64) and rounded once to ``dtype``."""

    __slots__ = ("scale",)

    def __init__(self, tensor: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        super().__init__(tensor, dtype)
        self.scale = scale.reshape(-1, *[1] * (tensor.dim() - 1))

    def materialize(self) -> torch.Tensor:
        return (self.tensor * self.scale).to(self.dtype)

    def write_into(self, out: memoryview) -> None:
        dst = torch.frombuffer(out, dtype=self.dtype, count=self.tensor.numel())
        dst.view(self.tensor.shape).copy_(self.tensor * self.scale)  # one tensor's temporary at a time


class _Relaid(_Cast):
    """``fn(tensor)`` in ``dtype``, where ``fn`` re-lays the tensor out (reshapes, permutes, flips:
    the same elements in another order, result shape ``shape``), computed when read or written: a
    weight the device needs in another layout (a transposed convolution's kernel, flipped with its
    channel axes swapped) goes straight from the model's tensor into the blob, without a re-laid-out
    copy of every weight held next to the blob."""

    __slots__ = ("fn", "shape")

    def __init__(self, tensor: torch.Tensor, dtype: torch.dtype, fn: Any, shape: Iterable[int]):
        super().__init__(tensor, dtype)
        self.fn, self.shape = fn, tuple(int(d) for d in shape)

    def materialize(self) -> torch.Tensor:
        return self.fn(self.tensor).reshape(self.shape).to(self.dtype).contiguous()

    def write_into(self, out: memoryview) -> None:
        dst = torch.frombuffer(out, dtype=self.dtype, count=self.tensor.numel())
        dst.view(self.shape).copy_(self.fn(self.tensor).reshape(self.shape))  # one tensor's temporary at a time


#: a constant released from the table at least this large hands the allocator's freed memory back
#: (PageReleaser.trim): the packed int4 weights, freed one by one as the blob fills
TRIM_BYTES = 1 << 20


class ConstantTable(MutableMapping):
    """Value id -> data of a blob constant, in the dtype the blob declares.

    fp16 mode defers the float32 -> float16 conversion of parameters: the table keeps a reference to
    the source tensor; a lowering reading an entry (``table[vid]``) gets the converted tensor, and the
    writer converts straight into the blob (``source``), so no float16 copy of all the weights is ever
    held next to the blob. The writer ``release``s each entry once it is in the blob: a GraphBuilder
    writes one blob. Releasing also hands the pages of a weight mapped from a file back to the kernel
    (:mod:`mps_backend.pages`): a checkpoint mapped instead of read is never resident as a whole next
    to the blob.
    """

    def __init__(self) -> None:
        self._data: dict[int, Any] = {}
        self.pages = PageReleaser()

    def __getitem__(self, vid: int) -> torch.Tensor:
        v = self._data[vid]
        return v.materialize() if isinstance(v, _Cast) else v

    def __setitem__(self, vid: int, value: Any) -> None:
        self._data[vid] = value

    def __delitem__(self, vid: int) -> None:
        del self._data[vid]

    def __contains__(self, vid: object) -> bool:  # Mapping's default would convert the entry to answer
        return vid in self._data

    def __iter__(self) -> Iterator[int]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def original(self, vid: int) -> torch.Tensor | None:
        """The data of a plain or converted entry in its source precision (float32 before an fp16
        conversion), or None when ``vid`` is not such an entry (a computed one, int4 bytes, ...)."""
        v = self._data.get(vid)
        if type(v) is _Cast:
            return v.tensor
        return v if isinstance(v, torch.Tensor) else None

    def source(self, vid: int) -> Any:
        """The stored entry: a tensor, or a deferred conversion (``nbytes``, ``write_into``)."""
        return self._data[vid]

    def release_part(self, source: Any, lo: int, hi: int) -> None:
        """Hand back the file pages of bytes ``[lo, hi)`` of a contiguous source tensor once the blob
        writer copied them (serialization.writer.write_blob copies a large constant part by part)."""
        if isinstance(source, torch.Tensor) and source.is_contiguous() and source.numel():
            self.pages.release(source.reshape(-1).view(torch.uint8)[lo:hi])

    def release(self, vid: int) -> None:
        v = self._data.pop(vid, None)
        self.pages.release(v.tensor if isinstance(v, _Cast) else v)
        if isinstance(v, torch.Tensor) and v.nbytes >= TRIM_BYTES:
            del v  # e.g. a packed int4 weight now in the blob, its last reference: its memory goes back
            self.pages.trim()


class GraphBuilder:
    def __init__(self, precision: Precision | bool | None = None, *, use_fp16: bool | None = None):
        #: the precision policy (``use_fp16``, the old boolean: True is Precision.FP16)
        if (precision is None) == (use_fp16 is None):
            raise TypeError("GraphBuilder takes a precision (or the old use_fp16 boolean), exactly one")
        self.precision = Precision.of(precision if precision is not None else use_fp16)
        self.graph = Graph()
        self.constants = ConstantTable()  # vid -> data (read with b.constants.get(vid))
        self.ids: dict[FxNode, Any] = {}  # fx node -> value id, or tuple of ids for multi-output nodes
        self._scalars: dict[tuple, int] = {}
        self.current: FxNode | None = None  # the fx node being lowered, for error messages
        #: fx node that emitted each MPS node (a tuple for a fused one: conv + batch norm), None for casts
        self.node_origin: list[Any] = []
        self._memo: dict[Any, Any] = {}  # results of memo(key, make): one per key per graph
        #: fp16 mode: user inputs given as float32 -> their float32 value id before the boundary cast
        self._float32_inputs: dict[FxNode, int] = {}

    # ---- dtypes -------------------------------------------------------------------------
    @property
    def use_fp16(self) -> bool:
        """float32 values default to float16 (the policy's float16 mode)."""
        return self.precision.float16

    def compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The device dtype a value of torch dtype ``dtype`` gets when no node says otherwise
        (a lowering's own temporaries and scalars)."""
        return self.precision.default_dtype(dtype)

    def result_dtype(self, node: FxNode, traced: torch.dtype) -> torch.dtype:
        """Device dtype of a result of ``node`` whose traced dtype is ``traced``: a float result takes
        the device dtype the precision pass gave the node, anything else its default."""
        device = node.meta.get(DEVICE_DTYPE) if isinstance(node, FxNode) else None
        if device is not None and traced.is_floating_point:
            return device
        return self.compute_dtype(traced)

    def dtype(self, arg: FxNode) -> torch.dtype:
        """Device dtype of an fx tensor argument."""
        return self.result_dtype(arg, fx_val(arg).dtype)

    # ---- values -------------------------------------------------------------------------
    def new_value(self, dtype: torch.dtype, shape: Iterable[int]) -> int:
        shape = list(shape)
        if any(isinstance(d, torch.SymInt) for d in shape):  # int() would freeze its example value
            where = f" (node {self.current.name}, {self.current.target})" if isinstance(self.current, FxNode) else ""
            raise InternalError(
                f"a value of symbolic shape {shape} reached the MPS graph{where}: the device compiles static "
                "shapes only and the partitioner keeps such nodes on CPU"
            )
        vid = len(self.graph.values)
        self.graph.values.append(Tensor(mps_dtype(dtype), [int(d) for d in shape]))
        return vid

    def id(self, arg: Any) -> int:
        """Value id bound to an fx node argument."""
        vid = self.ids.get(arg)
        if vid is None or isinstance(vid, tuple):
            raise KeyError(f"{arg} has no single value id (lowering {self.current})")
        return vid

    def out(self, node: FxNode | None = None, dtype: torch.dtype | None = None) -> int:
        """A new value id for ``node``'s (single tensor) result, bound to the node."""
        node = node if node is not None else self.current
        val = fx_val(node)
        vid = self.new_value(dtype or self.result_dtype(node, val.dtype), val.shape)
        self.ids[node] = vid
        return vid

    def outs(self, node: FxNode, dtypes: Iterable[torch.dtype | None] | None = None) -> tuple[int, ...]:
        """New value ids for each tensor of a multi-output node (read by getitem)."""
        vals = fx_val(node)
        dtypes = list(dtypes) if dtypes is not None else [None] * len(vals)
        ids = tuple(self.new_value(dt or self.result_dtype(node, v.dtype), v.shape) for v, dt in zip(vals, dtypes))
        self.ids[node] = ids
        return ids

    def alias(self, node: FxNode, vid: int) -> None:
        """Bind ``node`` to an existing value (ops that are identities on the device)."""
        self.ids[node] = vid

    def constant(self, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
        """A constant of the blob holding ``tensor`` (converted to ``dtype`` or the compute dtype)."""
        target = dtype or self.compute_dtype(tensor.dtype)
        vid = self.new_value(target, tensor.shape)
        self.graph.constant_ids.append(vid)
        tensor = tensor.detach()
        if tensor.dtype == target and tensor.is_contiguous():
            self.constants[vid] = tensor
        elif tensor.is_floating_point() and target.is_floating_point:
            # converted (or, for a strided view such as a weight stored transposed, re-laid out) when
            # read or written: no second copy of the weight is held next to the blob
            self.constants[vid] = _Cast(tensor, target)
        else:
            self.constants[vid] = tensor.to(target)
        return vid

    def scaled_constant(self, vid: int, scale: torch.Tensor) -> int | None:
        """A new constant: constant ``vid``'s source data times ``scale`` (one factor per index of
        dim 0), in ``vid``'s device dtype, computed straight into the blob. None when ``vid`` has no
        float source data (not a constant, or a computed entry)."""
        data = self.constants.original(vid)
        if data is None or not data.is_floating_point():
            return None
        t = self.graph.values[vid]
        dtype = torch_dtype(t.datatype)  # the dtype the blob holds constant ``vid`` in
        out = self.new_value(dtype, t.dims)
        self.graph.constant_ids.append(out)
        self.constants[out] = _Scaled(data.detach(), scale.to(torch.float64), dtype)
        return out

    def scalar(self, value: float | int | bool, dtype: torch.dtype) -> int:
        """A one-element constant of exactly ``dtype`` (bytes and declared dtype agree)."""
        key = (dtype, type(value), value)
        vid = self._scalars.get(key)
        if vid is None:
            vid = self._scalars[key] = self.constant(torch.tensor([value], dtype=dtype), dtype=dtype)
        return vid

    def relaid_constant(self, vid: int, fn: Any, shape: Iterable[int]) -> int | None:
        """A new constant holding ``fn(data)`` of constant ``vid``, where ``fn`` only re-lays the data
        out (reshapes, permutes, flips; ``shape`` = the result's shape, same element count), in
        ``vid``'s device dtype, written straight into the blob (no re-laid-out copy is kept). None
        when ``vid`` has no plain source tensor (not a constant, or a computed entry)."""
        data = self.constants.original(vid)
        shape = [int(d) for d in shape]
        if data is None:
            return None
        if math.prod(shape) != data.numel():
            raise ValueError(f"re-layout of constant {vid} {list(data.shape)} to {shape} changes its size")
        entry = self.constants.source(vid)
        dtype = entry.dtype if isinstance(entry, _Cast) else data.dtype
        out = self.new_value(dtype, shape)
        self.graph.constant_ids.append(out)
        self.constants[out] = _Relaid(data.detach(), dtype, fn, shape)
        return out

    def int4_constant(self, packed: torch.Tensor, shape: Iterable[int]) -> int:
        """An int4 constant of ``shape`` ``[N, K]`` from its device bytes (uint8 ``[N, K/2]``,
        layout of semantics §5.17, e.g. ``operators.quant.pack_int4``)."""
        dims = [int(d) for d in shape]
        if packed.dtype != torch.uint8 or len(dims) != 2 or dims[1] % 2 or packed.numel() * 2 != dims[0] * dims[1]:
            raise ValueError(f"int4 constant {dims} needs uint8 bytes [N, K/2], got {packed.dtype}{list(packed.shape)}")
        vid = len(self.graph.values)
        self.graph.values.append(Tensor(DataType.int4, dims))
        self.graph.constant_ids.append(vid)
        self.constants[vid] = packed.contiguous()
        return vid

    def drop_constant(self, vid: int) -> None:
        """Leave constant ``vid`` out of the blob: a lowering replaced every read of it (e.g. by a
        packed copy). Its value entry stays, unused; no node may read it. Its data's file pages are
        handed back as the blob writer's are (:meth:`ConstantTable.release`)."""
        if vid in self._scalars.values():
            raise ValueError(f"value {vid} is a shared scalar constant")
        self.graph.constant_ids.remove(vid)
        self.constants.release(vid)  # a weight mapped from a file (e.g. int8 data packed to int4): its pages go

    def forget_constant(self, vid: int) -> None:
        """Leave constant ``vid`` out of the blob once no node reads it (``simplify``), shared
        scalars included; the value entry stays, unused."""
        self.graph.constant_ids.remove(vid)
        del self.constants[vid]
        for key in [k for k, v in self._scalars.items() if v == vid]:
            del self._scalars[key]

    def memo(self, key: Any, make: Any) -> Any:
        """``make()`` once per ``key`` in this graph (e.g. a packed weight shared by the nodes that
        read it); later calls with the same key return the first result."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    # ---- nodes --------------------------------------------------------------------------
    def emit(self, node: NodeFields, min_max: tuple[float, float] | None = None) -> int:
        """Append one MPS node: an instance of its typed kind (``serialization.generated.nodes``, e.g.
        ``N.MPSAdd(input1_id=x, input2_id=y, output_id=out)``), which checked its fields when it was
        built (every field given except those with a neutral value, ``device_facts.NEUTRAL_FIELDS``:
        alpha, rounding_mode; each of the schema's type). A node kind the runtime has no dispatch
        case for (``device_facts.NOT_DISPATCHED``) is refused here. Returns the node's ``output_id`` (-1
        for a kind without one), so a node writing a fresh value reads
        ``y = b.emit(N.MPSExp(input1_id=x, output_id=b.new_value(dtype, shape)))``."""
        op = node.KIND
        if op in NOT_DISPATCHED:
            raise ValueError(
                f"{op} is never dispatched by the MPS runtime (the graph would fail to build); "
                "decompose it (docs/device-semantics.md §2.7)"
            )
        self.graph.nodes.append(Node(op, node.fields(), min_max))
        self.node_origin.append(self.current)
        return getattr(node, "output_id", -1)

    def boundary_cast(self, node: FxNode, dtype: torch.dtype) -> int:
        """Bind user input ``node`` to its value cast to ``dtype`` (fp16 mode: float32 -> float16),
        remembering the uncast value for :meth:`float32_input`."""
        self._float32_inputs[node] = self.ids[node]
        self.ids[node] = self.cast(self.ids[node], dtype)
        return self.ids[node]

    def float32_input(self, arg: Any) -> int | None:
        """In fp16 mode, the float32 value of a user input before its boundary cast (None for anything
        else). Single nodes whose result jumps on a tiny change of the input (floor, ceil; max pools
        whose indices are read) read it, so that float16 rounding of the input cannot flip their
        result; their result is cast to float16 at once (no float32 value reaches a float16 one)."""
        return self._float32_inputs.get(arg) if isinstance(arg, FxNode) else None

    def cast(self, vid: int, dtype: torch.dtype) -> int:
        """A new value holding ``vid`` cast to ``dtype`` (MPSCast writes a fresh id)."""
        t = self.graph.values[vid]
        out = self.new_value(dtype, t.dims)
        self.emit(N.MPSCast(input1_id=vid, output_id=out, dtype=int(mps_dtype(dtype))))
        return out
