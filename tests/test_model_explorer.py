"""Model Explorer: through the .pte adapter's Python API (the JSON the server sends the browser), MPS
delegates expand into their MPS node graph with node kinds, shapes, dtypes, constants and source ops."""

from __future__ import annotations

import json

import torch
from model_explorer.utils import convert_adapter_response
from torch import nn

from mps_backend.export import export_model
from mps_backend.model_explorer import BACKEND_ID
from mps_backend.model_explorer.main import MPSPTEAdapter
from mps_backend.serialization import read_blob
from mps_backend.serialization.pte import delegate_blobs


def _model():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()


def _graphs(pte_path, settings=None) -> dict:
    """The adapter's response as the JSON Model Explorer's front end receives, by graph id."""
    response = json.loads(json.dumps(convert_adapter_response(MPSPTEAdapter().convert(str(pte_path), settings or {}))))
    return {g["id"]: g for c in response["graphCollections"] for g in c["graphs"]}


def _attrs(items) -> dict:
    return {kv["key"]: kv["value"] for kv in items}


def test_mps_delegate_expands_into_its_mps_graph(tmp_path):
    torch.manual_seed(0)
    result = export_model(_model(), [torch.randn(1, 3, 8, 8)], use_fp16=False)
    pte = tmp_path / "m.pte"
    pte.write_bytes(result.pte)
    graphs = _graphs(pte)
    (call,) = [n for n in graphs["forward"]["nodes"] if n["label"] == BACKEND_ID]
    (sub_id,) = call["subgraphIds"]
    sub = graphs[sub_id]
    (blob,) = [d.blob for d in delegate_blobs(result.pte)]
    g = read_blob(blob).graph
    by_id = {n["id"]: n for n in sub["nodes"]}
    # one graph node per MPS node, labelled with its kind, in blob order
    assert [by_id[str(i)]["label"] for i in range(len(g.nodes))] == [n.op for n in g.nodes]
    assert "MPSConv2D" in {n.op for n in g.nodes}
    conv_index = next(i for i, n in enumerate(g.nodes) if n.op == "MPSConv2D")
    conv, node = by_id[str(conv_index)], g.nodes[conv_index]
    assert _attrs(conv["attrs"])["stride_x"] == str(node["stride_x"])  # scalar fields as attributes
    out_meta = _attrs(conv["outputsMetadata"][0]["attrs"])
    assert out_meta["shape"] == str(list(g.values[node["output_id"]].dims)) == "[1, 4, 6, 6]"
    assert out_meta["dtype"] == "float32"
    # edges follow the data: the ReLU reads the convolution's output
    relu = next(n for n in sub["nodes"] if n["label"] == "MPSReLU")
    assert {e["sourceNodeId"] for e in relu["incomingEdges"]} == {str(conv_index)}
    # constants are nodes with their byte size in the blob, feeding the convolution
    constants = {n["id"]: n for n in sub["nodes"] if n["label"] == "constant"}
    assert len(constants) == len(g.constant_ids)
    assert {f"constant_{node['input2_id']}"} <= {e["sourceNodeId"] for e in conv["incomingEdges"]}
    weight = _attrs(constants[f"constant_{node['input2_id']}"]["attrs"])
    assert weight["shape"] == "[4, 3, 3, 3]" and weight["constant_bytes"] == str(4 * 3 * 3 * 3 * 4)
    # the graph outputs come from the last node
    (outputs,) = [n for n in sub["nodes"] if n["id"] == "GraphOutputs"]
    assert [e["sourceNodeId"] for e in outputs["incomingEdges"]] == [str(len(g.nodes) - 1)]


def test_source_operators_from_the_etrecord(tmp_path):
    torch.manual_seed(0)
    result = export_model(_model(), [torch.randn(1, 3, 8, 8)], use_fp16=True, etrecord=True)
    pte, record = tmp_path / "m.pte", tmp_path / "m_etrecord.bin"
    pte.write_bytes(result.pte)
    result.etrecord.save(str(record))
    graphs = _graphs(pte, {"etrecord": str(record)})
    sub = next(g for gid, g in graphs.items() if gid != "forward")
    sources = {n["label"]: _attrs(n["attrs"]).get("source") for n in sub["nodes"] if n["label"].startswith("MPS")}
    assert "conv" in sources["MPSConv2D"] or "convolution" in sources["MPSConv2D"], sources
    assert "relu" in sources["MPSReLU"], sources
    assert "linear" in sources["MPSAddmm"] or "addmm" in sources["MPSAddmm"], sources
