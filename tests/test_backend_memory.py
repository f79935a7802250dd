"""MPSBackend hands preprocess a copy of the partition's program that shares its weight tensors
(no second float32 copy of the weights during lowering), and preprocess never writes into them."""

from __future__ import annotations

import torch
from executorch.exir import to_edge

from mps_backend import MPSPartitioner
from mps_backend.backend import MPSBackend


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)
        self.register_buffer("shift", torch.randn(8))
        self.conv = torch.nn.Conv2d(3, 4, 3)  # batch norm folded into the conv: new constants, originals read
        self.bn = torch.nn.BatchNorm2d(4)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x, img):
        return torch.relu(self.b(torch.relu(self.a(x)))) + self.shift, self.bn(self.conv(img))


def _edge():
    ep = torch.export.export(_Net().eval(), (torch.randn(4, 16), torch.randn(1, 3, 5, 5)))
    return to_edge(ep)


def test_copy_for_preprocess_shares_weights_not_graph():
    ep = _edge().exported_program()
    copied = MPSBackend.copy_exported_program_for_preprocess(ep, [])
    assert copied.graph_module is not ep.graph_module
    assert copied.graph_signature is not ep.graph_signature
    assert ep.state_dict and all(copied.state_dict[k] is t for k, t in ep.state_dict.items())
    assert all(copied.constants[k] is t for k, t in ep.constants.items())
    # the graph is a real copy: editing it leaves the original alone
    n_before = len(ep.graph.nodes)
    node = next(n for n in copied.graph.nodes if n.op == "call_function")
    with copied.graph.inserting_after(node):
        copied.graph.call_function(torch.ops.aten.relu.default, (node,))
    assert len(ep.graph.nodes) == n_before


def _lower_and_capture(use_fp16: bool):
    edge = _edge()
    seen = []
    original = MPSBackend.preprocess

    def spy(edge_program, compile_specs):
        seen.append(edge_program)
        return original(edge_program, compile_specs)

    MPSBackend.preprocess = staticmethod(spy)
    try:
        before = {k: t.detach().clone() for k, t in edge.exported_program().state_dict.items()}
        owner_tensors = dict(edge.exported_program().state_dict)
        edge.to_backend(MPSPartitioner(use_fp16=use_fp16))
    finally:
        MPSBackend.preprocess = staticmethod(original)
    return seen, before, owner_tensors


def test_preprocess_reads_shared_weights_and_leaves_them_unchanged():
    for use_fp16 in (False, True):
        seen, before, owner = _lower_and_capture(use_fp16)
        assert len(seen) == 1
        shared = seen[0].state_dict
        # the program preprocess saw holds the very tensors of the partitioned program
        assert {k: id(t) for k, t in shared.items()} == {k: id(owner[k]) for k in shared}
        # and preprocess (transposed linear weights, batch norm folding, fp16 conversion) wrote nothing into them
        for k, t in before.items():
            assert torch.equal(owner[k], t), k
            assert owner[k].dtype == t.dtype, k  # (float32 weights stay float32 in fp16 mode)


def test_nothing_of_an_export_outlives_it():
    """Two process-wide caches (torch's fake-tensor dispatch cache, executorch's is_same_node
    lru_cache) kept an export's graphs, so its delegate blob and the model's weights, alive after it
    ended: 2.8 GiB after a 3B LLM export, beside its self-check (mps_backend.export.release_export_caches)."""
    import gc
    import weakref

    from mps_backend.export import export_model

    net = _Net().eval()
    weight = weakref.ref(net.a.weight)
    result = export_model(net, (torch.randn(4, 16), torch.randn(1, 3, 5, 5)))
    assert result.delegates == 1
    del net, result
    gc.collect()
    assert weight() is None
