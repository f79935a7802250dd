"""mps_backend.provenance: torch's provenance records shared instead of deep-copied while a lowering runs, with
the same records and the same .pte bytes, and torch's own constructor back afterwards (also on error)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.fx.traceback import NodeSource

from mps_backend.provenance import shared_provenance


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.softmax(self.b(torch.nn.functional.gelu(self.a(x))), dim=-1).mean(dim=0)


def _without_graph_ids(record: dict) -> dict:
    """A record as a dict, without the ids of the graphs (objects of one run)."""
    return {k: [_without_graph_ids(r) for r in v] if k == "from_node" else v for k, v in record.items() if k != "graph_id"}


def _lowered(shared: bool):
    from executorch.exir import to_edge_transform_and_lower

    from mps_backend import MPSPartitioner
    from mps_backend.partitioner import backend_config, edge_compile_config

    torch.manual_seed(0)
    ep = torch.export.export(Small().eval(), (torch.randn(3, 8),), strict=False)
    with shared_provenance() if shared else contextlib.nullcontext():
        edge = to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner()], compile_config=edge_compile_config())
        records = [
            [_without_graph_ids(s.to_dict()) for s in n.meta.get("from_node", [])]
            for gm in [edge.exported_program().graph_module]
            + [m for m in edge.exported_program().graph_module.modules() if isinstance(m, torch.fx.GraphModule)]
            for n in gm.graph.nodes
        ]
        program = edge.to_executorch(backend_config(edge))
    return records, program.buffer


def test_same_records_and_bytes_as_torchs_own_copies():
    """Every node's provenance (names, targets, passes, actions, the whole chain) and the .pte are the same as with
    torch's deep copies."""
    records, pte = _lowered(shared=False)
    shared_records, shared_pte = _lowered(shared=True)
    assert any(r and r[0]["from_node"] for r in records)  # chains of more than one pass are compared
    assert shared_records == records
    assert shared_pte == pte


def test_records_are_shared_inside_and_torchs_constructor_is_back_after():
    own = NodeSource.__dict__["__init__"]
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    node.meta["from_node"] = [NodeSource(None, "earlier")]
    with shared_provenance() as on:
        assert on and NodeSource.__dict__["__init__"] is not own
        with shared_provenance() as nested:  # replaced once, put back once
            assert not nested
        record = NodeSource(node, "pass")
        assert record.from_node[0] is node.meta["from_node"][0]  # the same record, not a copy
        assert record.from_node is not node.meta["from_node"]  # a new list: appending to the node's leaves it
        assert (record.name, record.pass_name, record.graph_id) == ("x", "pass", id(graph))
    assert NodeSource.__dict__["__init__"] is own
    assert NodeSource(node, "pass").from_node[0] is not node.meta["from_node"][0]  # torch's deep copy again
    with pytest.raises(RuntimeError), shared_provenance():
        raise RuntimeError("a failed lowering")
    assert NodeSource.__dict__["__init__"] is own


def test_exports_lower_with_shared_records(monkeypatch, tmp_path):
    """export_model and export_llm lower inside the scope (what they call sees the replaced constructor)."""
    import executorch.exir

    import mps_backend.llm.export as llm_export
    from mps_backend.export import export_model

    seen = []
    own = executorch.exir.to_edge_transform_and_lower

    def spy(*args, **kwargs):
        seen.append(getattr(NodeSource.__dict__["__init__"], "__wrapped__", None) is not None)
        return own(*args, **kwargs)

    monkeypatch.setattr(executorch.exir, "to_edge_transform_and_lower", spy)
    monkeypatch.setattr(llm_export, "to_edge_transform_and_lower", spy)
    export_model(Small().eval(), (torch.randn(3, 8),))
    from tests.llm_helpers import save_checkpoint

    folder = save_checkpoint(tmp_path / "ckpt", "llama", layers=1)
    llm_export.export_llm(f"hf:{folder}", tmp_path / "m.pte", dtype="fp32", max_seq_len=16)
    assert seen == [True, True]
    assert getattr(NodeSource.__dict__["__init__"], "__wrapped__", None) is None
