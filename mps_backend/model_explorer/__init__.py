"""Model Explorer: MPS delegates expand into their MPS node graph.

executorch's ``.pte`` adapter for Google's Model Explorer (``pte-adapter-model-explorer``) draws each
delegate call as one node and expands it into a subgraph when it has a handler for the delegate's backend
id (its ``DELEGATE_HANDLERS``, keyed by id: XNNPACK, Ethos-U, VGF). :func:`register` adds ``MPSBackend``
there; importing ``mps_backend.model_explorer.main`` (what ``model-explorer --extensions=mps_backend.model_explorer``
does) registers it and adds an adapter for ``.pte`` files. Install with the optional extra::

    pip install 'mps_backend[model-explorer]'
    model-explorer --extensions=mps_backend.model_explorer model.pte

Each MPS node becomes a graph node labelled with its kind (``MPSConv2D``, ``MPSAdd``, ...) and its
scalar fields as attributes; edges carry the value ids, with shape and dtype on every input and output.
Graph inputs, outputs and constants (shape, dtype, bytes in the blob) are nodes of their own. With an
ETRecord (``settings["etrecord"]`` or the environment variable ``MPS_BACKEND_ETRECORD``), each MPS node
that computes a source operator's result also shows that operator (``source`` attribute).
"""

from __future__ import annotations

import os
from typing import Any

from mps_backend.config import env_path
from mps_backend.serialization import read_blob
from mps_backend.serialization.device_facts import is_value_field, node_value_ids
from mps_backend.serialization.model import Blob, Tensor

BACKEND_ID = "MPSBackend"
GRAPH_INPUTS = "GraphInputs"  # node ids the .pte adapter also uses for its delegate graphs
GRAPH_OUTPUTS = "GraphOutputs"


def _tensor_attrs(gb: Any, t: Tensor, vid: int) -> list:
    attrs = [gb.KeyValue("value_id", str(vid)), gb.KeyValue("shape", str(list(t.dims))), gb.KeyValue("dtype", t.datatype.name)]
    if t.constant_buffer_size:
        attrs.append(gb.KeyValue("constant_bytes", str(t.constant_buffer_size)))
    return attrs


def delegate_graph(
    blob: bytes, settings: dict | None = None, *, graph_id: str = BACKEND_ID, sources: dict[int, list[str]] | None = None
) -> Any:
    """The Model Explorer graph (``model_explorer.graph_builder.Graph``) of one MP00 blob.

    ``sources``: MPS node index -> names of the source operators whose result it computes (from an
    ETRecord); without it, read from the ETRecord the settings or environment name, if any."""
    from model_explorer import graph_builder as gb  # noqa: PLC0415 - optional extra

    decoded: Blob = read_blob(blob)
    g = decoded.graph
    if sources is None:
        sources = {}
    producer: dict[int, str] = {}
    nodes = []
    meta = lambda vid: gb.MetadataItem(id=str(vid), attrs=_tensor_attrs(gb, g.values[vid], vid))  # noqa: E731
    for vid in g.input_ids:
        producer[vid] = GRAPH_INPUTS
    nodes.append(
        gb.GraphNode(
            id=GRAPH_INPUTS, label="Graph Inputs", namespace=GRAPH_INPUTS, outputsMetadata=[meta(v) for v in g.input_ids]
        )
    )
    for vid in g.constant_ids:
        node_id = f"constant_{vid}"
        producer[vid] = node_id
        nodes.append(
            gb.GraphNode(
                id=node_id,
                label="constant",
                namespace="constants",
                attrs=_tensor_attrs(gb, g.values[vid], vid),
                outputsMetadata=[meta(vid)],
            )
        )
    for index, node in enumerate(g.nodes):
        node_id = str(index)
        inputs = node_value_ids(node.fields, outputs=False)
        outputs = node_value_ids(node.fields, outputs=True)
        attrs = [gb.KeyValue(name, str(value)) for name, value in node.fields.items() if not is_value_field(name)]
        if node.min_max is not None:
            attrs.append(gb.KeyValue("min_max", str(list(node.min_max))))
        if index in sources:
            attrs.append(gb.KeyValue("source", ", ".join(sources[index])))
        edges = [
            gb.IncomingEdge(sourceNodeId=producer.get(v, GRAPH_INPUTS), sourceNodeOutputId=str(v), targetNodeInputId=str(v))
            for v in inputs
            if 0 <= v < len(g.values)
        ]
        nodes.append(
            gb.GraphNode(
                id=node_id,
                label=node.op,
                namespace="",
                attrs=attrs,
                incomingEdges=edges,
                inputsMetadata=[meta(v) for v in inputs if 0 <= v < len(g.values)],
                outputsMetadata=[meta(v) for v in outputs if 0 <= v < len(g.values)],
            )
        )
        for v in outputs:
            producer[v] = node_id
    nodes.append(
        gb.GraphNode(
            id=GRAPH_OUTPUTS,
            label="Graph Outputs",
            namespace=GRAPH_OUTPUTS,
            incomingEdges=[
                gb.IncomingEdge(sourceNodeId=producer.get(v, GRAPH_INPUTS), sourceNodeOutputId=str(v), targetNodeInputId=str(v))
                for v in g.output_ids
            ],
            inputsMetadata=[meta(v) for v in g.output_ids],
        )
    )
    return gb.Graph(id=graph_id, nodes=nodes)


def etrecord_sources(etrecord: str | os.PathLike) -> list[dict[int, list[str]]]:
    """For each MPS delegate of an ETRecord's program, in program order: MPS node index -> names of the
    source nodes whose result it computes (the delegate debug map ``MPSBackend.preprocess`` wrote)."""
    from executorch.devtools.etrecord import parse_etrecord  # noqa: PLC0415

    record = parse_etrecord(os.fspath(etrecord))
    names = {}
    if record.edge_dialect_program is not None:
        for node in record.edge_dialect_program.graph.nodes:
            handle = node.meta.get("debug_handle")
            if isinstance(handle, int):
                names[handle] = node.name
    out = []
    for per_instruction in (record._delegate_map or {}).values():  # noqa: SLF001 - no public accessor
        for entry in per_instruction.values():
            if entry.get("name") != BACKEND_ID:
                continue
            out.append({int(k): [names.get(h, str(h)) for h in handles] for k, handles in entry.get("delegate_map", {}).items()})
    return out


def _handler(blob: bytes, settings: dict) -> Any:
    """The .pte adapter's handler signature: blob and settings in, graph out (one call per delegate)."""
    etrecord = settings.get("etrecord") or env_path("MPS_BACKEND_ETRECORD")
    sources = None
    if etrecord:
        per_delegate = etrecord_sources(etrecord)
        call = settings.get("delegate_call_count", 0)  # how many MPS delegates the adapter built before
        sources = per_delegate[call] if call < len(per_delegate) else None
    return delegate_graph(blob, settings, sources=sources)


def register() -> None:
    """Add the MPSBackend handler to the .pte adapter's delegate handler registry (idempotent)."""
    from pte_adapter_model_explorer.builder import delegate  # noqa: PLC0415 - optional extra

    delegate.DELEGATE_HANDLERS[BACKEND_ID] = _handler
