"""MPSBackend: ``preprocess`` turns one delegated edge program into one MP00 blob."""

from __future__ import annotations

import copy
import warnings
from typing import Any, Iterable

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.utils import DelegateMappingBuilder
from torch.export import ExportedProgram

from mps_backend import compile_specs as specs
from mps_backend.builder import GraphBuilder
from mps_backend.errors import InternalError, MPSBackendError
from mps_backend.operators.registry import default_registry
from mps_backend.passes import Float16RangeWarning, fp16_overflow, run_lowering_passes
from mps_backend.passes._graph import constant_tensors
from mps_backend.precision import Precision
from mps_backend.serialization.device_facts import node_value_ids
from mps_backend.serialization.writer import write_blob
from mps_backend.simplify import simplify


class LoweringError(MPSBackendError, RuntimeError):
    """preprocess could not lower the program: a node the device cannot run (the whole program was
    handed to ``MPSBackend`` without a partitioner), or a lowering bug (:class:`LoweringBug`)."""


class LoweringBug(LoweringError, InternalError):
    """A node whose support check passed failed to lower: a bug of this project, never the input's fault."""


def _unsupported(ep: ExportedProgram, registry) -> list[str]:
    """Operator nodes the device cannot run, with the reason (what the partitioner would have said)."""
    return [
        f"{n.name} ({getattr(n.target, '__name__', n.target)}): {reason}"
        for n in ep.graph.nodes
        if n.op == "call_function" and (reason := registry.check(n)) is not None
    ]


def _flat_outputs(args) -> Iterable:
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat_outputs(a)
        else:
            yield a


def shared_weight_copy(ep: ExportedProgram) -> ExportedProgram:
    """A deep copy of ``ep``'s graph and signature that shares its weight tensors (the lowering passes
    rewrite the copy's graph and constant table, never a tensor's data)."""
    shared = [t for t in (*ep.state_dict.values(), *ep.constants.values()) if isinstance(t, torch.Tensor)]
    return copy.deepcopy(ep, {id(t): t for t in shared})


def build_graph(ep: ExportedProgram, precision: Precision | bool, *, copy_program: bool = True) -> GraphBuilder:
    """Lower ``ep`` into a GraphBuilder under ``precision`` (a :class:`Precision`, or the old
    ``use_fp16`` boolean): the support checks, the lowering passes
    (``mps_backend.passes.run_lowering_passes``, the precision pass last), then user inputs first (ids
    0..n-1), constants, nodes, outputs, in one pass over the graph; then ``simplify``. The passes
    rewrite a copy of ``ep`` unless ``copy_program`` is False (``preprocess``: executorch hands it a
    copy already); ``b.ids`` is keyed by the nodes of the graph that was lowered."""
    precision = Precision.of(precision)
    b = GraphBuilder(precision)
    registry = default_registry()
    unsupported = _unsupported(ep, registry)
    if unsupported:  # only without a partitioner: it keeps these on CPU
        raise LoweringError(
            f"MPSBackend was given {len(unsupported)} node(s) the device cannot run: "
            + "; ".join(unsupported[:10])
            + ("; ..." if len(unsupported) > 10 else "")
            + ". Lowering a whole program with "
            "to_backend('MPSBackend', program, compile_specs) needs every node supported; use "
            "to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner()]) to keep these on CPU"
            + (
                ", or export with static shapes (mps_backend.export.make_static)"
                if any("dynamic" in u or "symbolic" in u for u in unsupported)
                else ""
            )
        )
    if copy_program:
        ep = shared_weight_copy(ep)
    run_lowering_passes(ep, precision)
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    table = constant_tensors(ep)
    constants = {n: table.get(n.name) for n in placeholders}
    user_inputs = [n for n in placeholders if constants[n] is None]
    for n in user_inputs:  # value ids 0..n-1 in forward-argument order (format contract 3)
        val = n.meta["val"]
        b.ids[n] = b.new_value(val.dtype, val.shape)
    b.graph.input_ids = list(range(len(user_inputs)))
    for n in user_inputs:  # boundary casts into the device dtype
        if b.dtype(n) != n.meta["val"].dtype:
            b.current = n
            b.boundary_cast(n, b.dtype(n))
    for n in placeholders:
        if constants[n] is not None and n.users:
            if b.dtype(n) == torch.float16:  # preprocess cannot refuse a node the partitioner accepted: say it instead
                overflow = fp16_overflow(n.name, constants[n])
                if overflow:
                    warnings.warn(
                        Float16RangeWarning(
                            f"float16 mode: constant {overflow} becomes inf on the device; lower with "
                            "use_fp16=False or rescale it"
                        ),
                        stacklevel=2,
                    )
            b.ids[n] = b.constant(constants[n], b.dtype(n))
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        b.current = node
        low = registry.lowering(node.target)
        if low is None:
            raise LoweringBug(f"node {node.name} ({node.target}): no MPS lowering (a lowering bug: its check passed)")
        try:
            low.lower(node, b)
        except Exception as e:  # noqa: BLE001  (re-raised with the node named)
            raise LoweringBug(
                f"node {node.name} ({node.target}) failed to lower (a lowering bug: its support check accepted it): {e}"
            ) from e
    output = next(n for n in ep.graph.nodes if n.op == "output")
    b.current = output
    for arg in _flat_outputs(output.args[0]):
        vid = b.id(arg)
        declared = arg.meta["val"].dtype
        if b.dtype(arg) != declared:
            vid = b.cast(vid, declared)
        b.graph.output_ids.append(vid)
    simplify(b)
    return b


def _origin_nodes(origin) -> tuple:
    return tuple(n for n in (origin if isinstance(origin, tuple) else (origin,)) if n is not None)


def _result_nodes(b: GraphBuilder) -> list[int]:
    """Indices of the MPS nodes that compute a source node's result: of the nodes one source node (or
    fused group) lowered to, those whose output another group or the graph output reads (the
    others compute its intermediates, e.g. the ``x + 3`` of a hardswish). Only these carry the
    source node's debug handles, so executorch's Inspector pairs each operator with the MPS node
    whose output is that operator's output (it keeps the first event of a handle)."""
    graph = b.graph
    origin_of_value: dict[int, Any] = {}
    for index, node in enumerate(graph.nodes):
        for vid in node_value_ids(node.fields, outputs=True):
            origin_of_value[vid] = index
    read_elsewhere = set(graph.output_ids)
    for index, node in enumerate(graph.nodes):
        mine = _origin_nodes(b.node_origin[index])
        for vid in node_value_ids(node.fields, outputs=False):
            producer = origin_of_value.get(vid)
            if producer is not None and _origin_nodes(b.node_origin[producer]) != mine:
                read_elsewhere.add(vid)
    results, last_of_group = [], {}
    for index, node in enumerate(graph.nodes):
        group = _origin_nodes(b.node_origin[index])
        last_of_group[group] = index
        if any(v in read_elsewhere for v in node_value_ids(node.fields, outputs=True)):
            results.append(index)
    covered = {_origin_nodes(b.node_origin[i]) for i in results}
    results += [i for group, i in last_of_group.items() if group not in covered]  # nothing read it: keep the last
    return sorted(results)


def debug_handle_map(b: GraphBuilder) -> dict:
    """Delegate debug identifier (an MPS node's index; the emulated runtime logs its ETDump events under
    it) -> the debug handles of the source nodes whose result that MPS node computes."""
    mapping = DelegateMappingBuilder(generated_identifiers=False)
    last: dict[tuple, tuple[int, list]] = {}
    for index in _result_nodes(b):
        nodes = [n for n in _origin_nodes(b.node_origin[index]) if n.meta.get("debug_handle") is not None]
        if nodes:
            # several fx nodes may share a debug handle (one source op decomposed: matmul -> expand, view,
            # bmm, view); the Inspector compares the handle's first event with the source op's result,
            # the last of those nodes: only the MPS node computing that one carries the handle
            last[tuple(sorted({n.meta["debug_handle"] for n in nodes}))] = (index, nodes)
    for index, nodes in sorted(last.values(), key=lambda entry: entry[0]):
        mapping.insert_delegate_mapping_entry(nodes=nodes, identifier=index)
    return mapping.get_delegate_mapping()


class MPSBackend(BackendDetails):
    """The MPS delegate's ahead-of-time side; the id 'MPSBackend' is what the runtime looks up."""

    @classmethod
    def copy_exported_program_for_preprocess(
        cls, edge_program: ExportedProgram, compile_specs: list[CompileSpec]
    ) -> ExportedProgram:
        """The isolated program executorch hands to ``preprocess``: a deep copy of the graph and
        signature that shares the weight tensors instead of duplicating them (executorch's default
        deep-copies them too, ~2x the fp16 weight bytes of extra peak memory on a float32 model).
        Sharing is safe because preprocess only reads tensor data: the lowering passes, the builder and
        the writer never modify a parameter, buffer or constant in place (tests/test_backend_memory.py
        checks); the passes rewrite the copy's graph and constant table."""
        return shared_weight_copy(edge_program)

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        b = build_graph(edge_program, specs.parse(compile_specs), copy_program=False)
        blob = write_blob(b.graph, b.constants)
        return PreprocessResult(processed_bytes=blob, debug_handle_map=debug_handle_map(b))
