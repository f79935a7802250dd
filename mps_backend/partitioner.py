"""MPSPartitioner: tags every node the device computes correctly, in as few partitions as the
graph allows, and remembers why each other node stays on CPU."""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch
from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from executorch.exir.dialects.edge._ops import EdgeOpOverload
from executorch.exir.graph_module import get_control_flow_submodules
from executorch.exir.program._program import _default_decomposition_table
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from mps_backend import compile_specs as specs
from mps_backend.backend import MPSBackend  # noqa: F401  (to_backend finds backends among BackendDetails subclasses)
from mps_backend.errors import MPSBackendWarning
from mps_backend.operators.registry import DYNAMIC, Registry, default_registry, op_key
from mps_backend.precision import Precision

BACKEND_ID = "MPSBackend"
#: why an in-place row write into a mutable buffer stays on CPU (see :func:`cache_writes`)
CACHE_WRITE_REASON = (
    "KV-cache write: index_put into a mutable buffer whose result is only the buffer's new value; left on "
    "CPU, where to_executorch(ExecutorchBackendConfig(run_reinplace_pass=True)) makes it index_put_, which "
    "writes only the rows (docs/llm.md)"
)


class DynamicShapeWarning(MPSBackendWarning):
    """Nodes stay on CPU because the program has dynamic shapes (the device has none)."""


@dataclass(frozen=True)
class CpuNode:
    name: str
    target: str
    reason: str


@dataclass
class PartitionReport:
    """What ``partition()`` decided: for one method, or (``methods``) for each method of a program,
    in the order executorch partitioned them, with the lists and counts summed over them."""

    delegated: list[str] = field(default_factory=list)
    on_cpu: list[CpuNode] = field(default_factory=list)
    partitions: int = 0
    #: delegated nodes whose results float16 may not represent (casts in fp16 mode), with why
    fp16_notes: list[str] = field(default_factory=list)
    #: one report per ``partition()`` call (per method) when there were several; empty otherwise
    methods: list[PartitionReport] = field(default_factory=list)

    @classmethod
    def combine(cls, reports: Sequence[PartitionReport]) -> PartitionReport:
        """The report of a program from the reports of its methods (one report: itself)."""
        if len(reports) == 1:
            return reports[0]
        return cls(
            delegated=[n for r in reports for n in r.delegated],
            on_cpu=[n for r in reports for n in r.on_cpu],
            partitions=sum(r.partitions for r in reports),
            fp16_notes=[n for r in reports for n in r.fp16_notes],
            methods=list(reports),
        )

    @property
    def total(self) -> int:
        return len(self.delegated) + len(self.on_cpu)

    @property
    def cpu_except_cache_writes(self) -> list[CpuNode]:
        """The CPU nodes other than the KV-cache row writes (:data:`CACHE_WRITE_REASON`)."""
        return [n for n in self.on_cpu if n.reason != CACHE_WRITE_REASON]

    @property
    def cpu_static(self) -> list[CpuNode]:
        """The CPU nodes other than the KV-cache row writes and the dynamic-shape nodes
        (:attr:`cpu_dynamic`): static work the device does not take."""
        return [n for n in self.cpu_except_cache_writes if DYNAMIC not in n.reason]

    @property
    def cpu_dynamic(self) -> list[CpuNode]:
        """The CPU nodes left there because their shapes or values are dynamic (symbolic sizes): in a
        chunked language model (docs/llm.md), the padding, positions and row slices around the delegate."""
        return [n for n in self.cpu_except_cache_writes if DYNAMIC in n.reason]

    def __str__(self) -> str:
        if self.methods:
            lines = [
                f"{len(self.delegated)}/{self.total} operator nodes delegated to MPS in {self.partitions} "
                f"partition(s) over {len(self.methods)} methods"
            ]
            for i, method in enumerate(self.methods, 1):
                lines.append(f"method {i} of {len(self.methods)} (in the order executorch lowered them):")
                lines += ["  " + line for line in str(method).splitlines()]
            return "\n".join(lines)
        lines = [f"{len(self.delegated)}/{self.total} operator nodes delegated to MPS in {self.partitions} partition(s)"]
        if self.on_cpu:
            lines.append("left on CPU:")
            dynamic = self.cpu_dynamic
            shown = self.cpu_except_cache_writes if len(dynamic) <= 4 else self.cpu_static + dynamic[:2]
            lines += [f"  {n.name} ({n.target}): {n.reason}" for n in shown]
            if len(shown) < len(self.cpu_except_cache_writes):
                kinds = sorted({n.target.rsplit("::", 1)[-1] for n in dynamic[2:]})
                lines.append(f"  {len(dynamic) - 2} more with a dynamic shape ({', '.join(kinds)})")
            writes = len(self.on_cpu) - len(self.cpu_except_cache_writes)
            if writes:
                lines.append(f"  {writes} x index_put: {CACHE_WRITE_REASON}")
        if self.fp16_notes:
            lines.append("float16 range (the device computes float32 values in float16, |x| <= 65504):")
            lines += [f"  {n}" for n in self.fp16_notes]
        return "\n".join(lines)


class _Support(OperatorSupportBase):
    def __init__(self, registry: Registry, reasons: dict[Node, str], on_cpu: frozenset[Node] = frozenset()):
        super().__init__()
        self.registry, self.reasons, self.on_cpu = registry, reasons, on_cpu

    def is_node_supported(self, submodules, node: Node) -> bool:
        reason = CACHE_WRITE_REASON if node in self.on_cpu else self.registry.check(node)
        if reason is not None:
            self.reasons[node] = reason
        return reason is None


def is_row_write(node: Node) -> bool:
    """An ``index_put(dest, indices, values)`` executorch's portable ``index_put_`` computes in place
    (executorch 1.0-1.5 kernels/portable/cpu/op_index_put.cpp, its special case): no accumulate, exactly
    one index, a 1-D int64/int32 tensor, on any dim (the other entries None), and ``values`` of
    ``dest``'s dtype and shape but for that dim, whose length is the index's."""
    if _target_name(node.target) != "aten::index_put" or len(node.args) < 3:
        return False
    dest, indices, values = node.args[:3]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    given = [(i, x) for i, x in enumerate(indices or ()) if x is not None]
    if accumulate or len(given) != 1 or not isinstance(given[0][1], Node):
        return False
    dim, index = given[0]
    d, v, ix = (n.meta.get("val") for n in (dest, values, index))
    if not all(isinstance(t, torch.Tensor) for t in (d, v, ix)):
        return False
    if ix.dim() != 1 or ix.dtype not in (torch.int64, torch.int32) or d.dtype != v.dtype or dim >= d.dim():
        return False
    expected = list(d.shape)
    expected[dim] = ix.shape[0]
    return list(v.shape) == expected and d.is_contiguous() and v.is_contiguous()


def cache_writes(ep: ExportedProgram) -> frozenset[Node]:
    """The in-place row writes into mutable buffers (:func:`is_row_write`) whose only use is the buffer's
    mutation: a KV-cache update deferred after attention (mps_backend.llm.decoder). Left on CPU and
    reinplaced by executorch, each writes only its rows; the delegate then never writes, nor
    executorch copies back, a whole cache per step."""
    sig = ep.graph_signature
    mutated_outputs, buffers = sig.buffers_to_mutate, sig.inputs_to_buffers  # output/input name -> buffer
    out = next((n for n in ep.graph.nodes if n.op == "output"), None)
    found = set()
    for node in ep.graph.nodes:
        if node.op != "call_function" or not is_row_write(node) or list(node.users) != [out]:
            continue
        dest = node.args[0]
        buffer = buffers.get(dest.name) if dest.op == "placeholder" else None
        if buffer is not None and mutated_outputs.get(node.name) == buffer:
            found.add(node)
    return frozenset(found)


def backend_config(edge, unplanned_inputs: Sequence[str] = ()) -> ExecutorchBackendConfig:
    """The ``ExecutorchBackendConfig`` for ``edge.to_executorch``: executorch's reinplace pass on
    (index_put -> index_put_ on mutable buffers: the KV-cache writes of :func:`cache_writes` write
    their rows, and no ``aten::copy_`` writes a whole buffer back) when every index_put left outside
    the delegates is one the portable ``index_put_`` computes (:func:`is_row_write`).
    ``unplanned_inputs``: methods whose inputs get no memory in the program's plan, so that
    executorch's ``Method::set_input`` points them at the caller's tensor instead of copying it in
    (Whisper's ``text_decoder``: the encoder's output, every step)."""
    names = edge.methods if hasattr(edge, "methods") else ["forward"]
    safe = all(
        is_row_write(n)
        for name in names
        for n in edge.exported_program(name).graph.nodes
        if n.op == "call_function" and _target_name(n.target) == "aten::index_put"
    )
    if not unplanned_inputs:
        return ExecutorchBackendConfig(run_reinplace_pass=safe)
    from executorch.exir.passes import MemoryPlanningPass  # noqa: PLC0415

    planning = {name: MemoryPlanningPass(alloc_graph_input=name not in unplanned_inputs) for name in names}
    return ExecutorchBackendConfig(run_reinplace_pass=safe, memory_planning_pass=planning)


def _absorb_unread_constants(ep: ExportedProgram, tag: str) -> None:
    """Give parameters, buffers and lifted constants that no node reads a delegation tag: they move
    into that delegate, which stores nothing for a value no node reads (a partitioner may not remove
    graph inputs itself; left untagged they would be stored in the program as CPU constants)."""
    sig = ep.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    constant_inputs = {
        s.arg.name
        for s in sig.input_specs
        if s.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR) and s.target not in mutated
    }
    for node in ep.graph.nodes:
        if node.op == "placeholder" and not node.users and node.name in constant_inputs and "delegation_tag" not in node.meta:
            node.meta["delegation_tag"] = tag


def _fp16_cast_note(node: Node) -> str | None:
    """A note for a delegated dtype cast whose result float16 may not hold (fp16 mode)."""
    name = str(getattr(node.target, "__name__", node.target))
    if "_to_copy" not in name and "_to_dim_order_copy" not in name and "to.dtype" not in name:
        return None
    src, out = node.args[0].meta.get("val") if node.args else None, node.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    narrow = (torch.bool, torch.int8, torch.uint8)  # every value exact in float16 (|x| <= 255 < 2048)
    if not src.dtype.is_floating_point and src.dtype not in narrow and out.dtype == torch.float32:
        return (
            f"{node.name}: {src.dtype} -> float32 is float16 on the device: integers beyond ±65504 "
            "become inf (and above 2048 lose their last bits)"
        )
    if src.dtype == torch.float32 and not out.dtype.is_floating_point and out.dtype != torch.bool:
        return (
            f"{node.name}: float32 -> {out.dtype} reads a float16 value on the device: inputs beyond "
            "±65504 are already inf there and convert to the integer minimum"
        )
    return None


def _is_debug_tap(node: Node) -> bool:
    """A tap of executorch's intermediate-output debugger (``executorch_devtools.tap.Tensor``)."""
    return "executorch_devtools.tap." in str(node.target)


#: ops the default decomposition table lists that no decomposition splits (a symbolic size or stride read
#: off a tensor: the dynamic-size work of a chunked prefill program): decomposing leaves them as they are
_SHAPE_QUERIES = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int})


def _decompositions_but(keep: Iterable[torch._ops.OpOverload]) -> dict:
    """executorch's default decomposition table without the ops in ``keep``."""
    table = _default_decomposition_table()
    for op in keep:
        table.pop(op, None)
    return table


def _call_nodes(ep: ExportedProgram) -> list[Node]:
    """The operator nodes of ``ep``, control-flow branches included."""
    graphs = [ep.graph_module] + [m for _, m, _ in get_control_flow_submodules(ep.graph_module)]
    return [n for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]


#: why an operator inside a control-flow body (``torch.cond``, ``map``, ``scan``, ``while_loop``) stays on CPU
BODY_REASON = (
    "inside a control-flow body ({op}): a delegate there would take the weights it reads as inputs on every "
    "call, which the MPS runtime of executorch 1.0-1.4 cannot take safely (docs/device-cost.md, One delegate "
    "in a loop)"
)


def _body_nodes(ep: ExportedProgram) -> list[tuple[Node, str]]:
    """The operator nodes of ``ep``'s control-flow bodies, each with its control-flow op's name (executorch's
    ``get_control_flow_submodules``: the bodies of the top graph's cond, map and scan nodes)."""
    out = []
    for _, body, node in get_control_flow_submodules(ep.graph_module):
        op = getattr(node.target, "__name__", str(node.target))
        out += [(n, op) for n in body.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    return out


def _target_name(target) -> str:
    return str(getattr(op_key(target), "_name", None) or getattr(target, "__name__", target))


def edge_compile_config(**overrides) -> EdgeCompileConfig:
    """The ``EdgeCompileConfig`` for lowering with :class:`MPSPartitioner`: the defaults, plus the ops we
    lower whole that are not core ATen in the exception list of the edge verifier. executorch keeps an op
    the partitioner asks to preserve out of the verifier's way only when the default decompositions
    have an entry for it; ops without one (``adaptive_max_pool2d``/``3d``) stay in the graph either way
    and fail verification ("not in Core ATen opset") before the partitioner can take them."""
    table = _default_decomposition_table()
    survivors = [
        t
        for t in default_registry().targets  # non-core ops no decomposition removes
        if isinstance(t, torch._ops.OpOverload) and torch.Tag.core not in t.tags and t not in table
    ]
    overrides.setdefault("_core_aten_ops_exception_list", sorted(survivors, key=str))
    return EdgeCompileConfig(**overrides)


class MPSPartitioner(Partitioner):
    """Partition for the ExecuTorch MPS delegate.

    ``MPSPartitioner()`` lowers in float16 (``Precision.FP16``, the upstream default: float16 weights
    and compute, the model's float32 parts, norm statistics, softmax and the residual stream in
    float32); ``use_fp16=False`` keeps every value as traced (``Precision.FP32``); ``precision=`` takes
    any :class:`~mps_backend.precision.Precision`; upstream-style
    ``compile_specs=[CompileSpec("use_fp16", bytes([0|1]))]`` work too.
    """

    def __init__(
        self,
        compile_specs: Sequence[CompileSpec] | None = None,
        *,
        use_fp16: bool | None = None,
        precision: Precision | None = None,
        dynamic_ok: bool = False,
    ):
        policy = specs.parse(compile_specs)
        for given in (use_fp16, precision):
            if given is None:
                continue
            given = Precision.of(given)
            if compile_specs and given != policy:
                raise ValueError(f"the compile specs ({policy}) and use_fp16/precision ({given}) disagree")
            if use_fp16 is not None and precision is not None and precision.float16 != use_fp16:
                raise ValueError(f"use_fp16={use_fp16} and precision={precision} disagree")
        if precision is not None:
            policy = precision
        elif use_fp16 is not None:
            policy = Precision.of(use_fp16)
        self.precision = policy
        #: the program's dynamic-shape nodes are meant for CPU (a chunked language model): no warning
        self.dynamic_ok = dynamic_ok
        self.delegation_spec = DelegationSpec(BACKEND_ID, specs.precision_specs(policy))
        self._reports: list[PartitionReport] = []
        super().__init__()

    @property
    def use_fp16(self) -> bool:
        return self.precision.float16

    def report(self) -> PartitionReport:
        """What this partitioner decided: for a program with several methods (executorch calls
        ``partition()`` once per method), every method's report in ``methods`` and their sums. Use one
        partitioner per program, as executorch's own flows do: a reused one reports all it partitioned."""
        return PartitionReport.combine(self._reports) if self._reports else PartitionReport()

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        registry = default_registry()
        reasons: dict[Node, str] = {}
        gm = exported_program.graph_module
        proposed = CapabilityBasedPartitioner(
            gm, _Support(registry, reasons, cache_writes(exported_program)), allows_single_node_partition=True
        ).propose_partitions()
        tags: dict[str, DelegationSpec] = {}
        delegated: set[Node] = set()
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        for p in sorted(proposed, key=lambda p: min(order[n] for n in p.nodes)):
            tag = f"mps_{len(tags)}"
            tags[tag] = self.delegation_spec
            for node in p.nodes:
                node.meta["delegation_tag"] = tag
                delegated.add(node)
        tag_constant_data(exported_program)
        if tags:
            _absorb_unread_constants(exported_program, next(iter(tags)))
        report = PartitionReport(partitions=len(tags))
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target is operator.getitem:
                continue  # getitem only unpacks its producer's outputs: counted with the producer
            if _is_debug_tap(node):
                continue  # executorch's numerical-debugger taps: stripped before to_executorch, not CPU work
            if node in delegated:
                report.delegated.append(node.name)
            else:
                reason = reasons.get(node) or registry.check(node) or "not connected to a supported region"
                report.on_cpu.append(CpuNode(node.name, _target_name(node.target), reason))
        for node, op in _body_nodes(exported_program):  # on CPU, said (executorch runs them there)
            report.on_cpu.append(CpuNode(node.name, _target_name(node.target), BODY_REASON.format(op=op)))
        if self.use_fp16:
            report.fp16_notes = [note for n in gm.graph.nodes if n in delegated for note in [_fp16_cast_note(n)] if note]
        self._reports.append(report)
        dynamic = report.cpu_dynamic
        if dynamic and not self.dynamic_ok:
            warnings.warn(
                DynamicShapeWarning(
                    f"{len(dynamic)} operator node(s) stay on CPU because their shapes are dynamic (first: "
                    f"{dynamic[0].name}: {dynamic[0].reason}); the MPS delegate compiles static shapes only. "
                    "Export with static shapes (torch.export.export without dynamic_shapes), or make an "
                    "exported program static: mps_backend.export.make_static(ep, example_inputs)"
                ),
                stacklevel=2,
            )
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        """Decompose everything but the preserved ops before executorch asks what to preserve, so that
        :meth:`ops_to_not_decompose` sees the final nodes and needs no per-node filter when it can lower
        every preserved one: ``to_edge_transform_and_lower`` then runs two ``run_decompositions`` per
        method instead of three, for the same program (see :meth:`ops_to_not_decompose`). Not when a
        preserved node is already one we cannot lower: executorch's filter path decomposes it anyway."""
        registry = default_registry()
        keep = set(registry.preserved)
        top = exported_program.graph_module.graph
        if any(n.target in keep and (n.graph is not top or registry.check(n) is not None) for n in _call_nodes(exported_program)):
            return exported_program
        return exported_program.run_decompositions(_decompositions_but(keep))

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[torch._ops.OpOverload], Callable[[Node], bool] | None]:
        """Keep whole the ops we lower directly that the default decompositions would split
        (lowerings marked ``preserve``); the filter keeps only instances we can lower.

        No filter when it would keep every instance of an ATen program that holds nothing else the
        default decompositions split (:meth:`transform_for_pre_decomposition` ran them): executorch
        then takes its path without a filter (``_can_skip_using_EDGE_DO_NOT_DECOMP``), which decomposes
        only what is left, nothing. With a filter it decomposes with the preserved ops kept, renames
        the instances the filter accepts, decomposes again with the full table (splitting the ones it
        rejects) and renames them back: the same program when the filter accepts them all, for one more
        pass over the graph. A dynamic program's shape reads (``sym_size``: listed by the table, split by
        no decomposition) are returned among the kept ops, so they take no such pass either (a chunked
        prefill export: 4 -> 2 passes, 10.0 -> 4.8 CPU s for a 2-layer llama, the same .pte). An edge
        program (executorch's check after lowering) gets the filter."""
        registry = default_registry()
        keep = registry.preserved
        if not keep:
            return keep, None

        top = ep.graph_module.graph

        def check(node: Node) -> bool:
            # a control-flow body's nodes stay on CPU (BODY_REASON): decomposed as executorch's table says
            return node.graph is top and registry.check(node) is None

        nodes = _call_nodes(ep)
        wanted = set(keep)
        lowered_or_edge = ep.dialect == "EDGE" or any(isinstance(n.target, EdgeOpOverload) for n in nodes)
        if lowered_or_edge or any(n.target in wanted and not check(n) for n in nodes):
            return keep, check
        table = _decompositions_but(keep)
        left = {n.target for n in nodes if isinstance(n.target, torch._ops.OpOverload) and n.target in table}
        if left - _SHAPE_QUERIES:
            return keep, check
        # a dynamic program's shape queries are in the table but no decomposition splits them: kept as they
        # are, so executorch finds nothing left to decompose and runs no pass over the graph for them
        return [*keep, *sorted(left, key=str)], None
