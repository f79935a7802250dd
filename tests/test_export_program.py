"""export_program and the partitioner drop constants no node reads (they would stay in the .pte as
CPU constants), and constants with equal contents are stored once: through mps_backend's helpers and
through executorch's own calls alike."""

from __future__ import annotations

import pytest
import torch

from mps_backend.export import drop_unused_constants, export_model, export_program


class _Rope(torch.nn.Module):
    def __init__(self, table):
        super().__init__()
        self.register_buffer("freqs", table)  # an alias of the parent's table, never read


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        table = torch.randn(64, 64)
        self.register_buffer("freqs", table)
        self.inner = _Rope(table)
        self.unused_weight = torch.nn.Parameter(torch.randn(32, 32))
        self.register_buffer("unused_plain", torch.randn(16), persistent=False)
        self.register_buffer("count", torch.zeros(1))
        self.lin = torch.nn.Linear(64, 8)

    def forward(self, x):
        self.count.add_(1)  # mutated: kept
        return self.lin(x @ self.freqs)


def test_unread_constants_leave_the_program():
    model, x = _Model().eval(), torch.randn(2, 64)
    full = torch.export.export(model, (x,), strict=False)
    before = {s.target for s in full.graph_signature.input_specs}
    assert {"inner.freqs", "unused_weight", "unused_plain"} <= before
    ep = drop_unused_constants(full)
    after = {s.target for s in ep.graph_signature.input_specs if s.target}
    # of the two names of the table, the one the graph reads stays (torch picks which)
    dropped = before - after - {None}
    assert {"unused_weight", "unused_plain"} < dropped and len(dropped & {"freqs", "inner.freqs"}) == 1
    assert len(dropped) == 3 and {"count", "lin.weight", "lin.bias"} <= after
    assert not dropped & set(ep.state_dict) and "count" in ep.state_dict
    assert all(n.users for n in ep.graph.nodes if n.op == "placeholder" and not n.name.startswith("b_count"))
    ep.validate() if hasattr(ep, "validate") else ep._validate()
    fresh = _Model()
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(ep.module()(x), fresh(x))


def test_export_model_pte_holds_no_unread_table():
    model, x = _Model().eval(), torch.randn(2, 64)
    res = export_model(model, [x], use_fp16=False)
    # the 64x64 float32 table once (delegated) + linear; the unread alias and weight would add 16 + 4 KiB
    weights = (64 * 64 + 8 * 64 + 8) * 4
    assert res.constant_bytes >= weights
    assert len(res.pte) < weights + 4 * 32 * 32 + 12 * 1024, len(res.pte)
    assert export_program(model, [x]).graph_signature.input_specs  # still a program


def test_nothing_to_drop_returns_the_program_unchanged():
    lin = torch.nn.Linear(4, 4).eval()
    ep = torch.export.export(lin, (torch.randn(1, 4),))
    specs = list(ep.graph_signature.input_specs)
    assert drop_unused_constants(ep) is ep and ep.graph_signature.input_specs == specs


class _KVCache(torch.nn.Module):
    """A user model with trainable (requires_grad) weights and a cache buffer updated in place."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("cache", torch.zeros(16, 8))

    def forward(self, x, pos):
        self.cache.index_put_([pos], self.lin(x))
        return self.cache.sum(0, keepdim=True) * 2


def test_kv_cache_model_with_grad_requiring_weights_exports_and_verifies():
    from mps_backend.export import verify  # noqa: PLC0415

    model = _KVCache().eval()
    inputs = [torch.randn(1, 8), torch.tensor([3])]
    res = export_model(model, inputs, use_fp16=False)
    assert res.delegates == 1 and not res.report.on_cpu, res.report.on_cpu
    assert all(p.requires_grad for p in model.parameters())  # the user's model is left as it was
    check = verify(res.pte, _fresh(model), inputs, use_fp16=False)  # a fresh copy: the cache starts at zero
    assert check.ok, check


def _fresh(model):
    copy = _KVCache().eval()
    copy.load_state_dict(model.state_dict())
    return copy


def _plain_pte(model, inputs, entry, fp16=False):
    """A .pte through the plain executorch calls (no mps_backend.export helper)."""
    from executorch.exir import to_edge, to_edge_transform_and_lower

    from mps_backend import MPSPartitioner

    ep = torch.export.export(model, tuple(inputs))
    if entry == "to_edge_transform_and_lower":
        edge = to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner(use_fp16=fp16)])
    else:
        edge = to_edge(ep).to_backend(MPSPartitioner(use_fp16=fp16))
    return edge.to_executorch().buffer


@pytest.mark.parametrize("entry", ["to_edge_transform_and_lower", "to_backend"])
def test_plain_path_pte_holds_no_unread_constants(entry):
    """The partitioner drops parameters and buffers no node reads: through executorch's own calls too."""
    model, x = _Model().eval(), torch.randn(2, 64)
    pte = _plain_pte(model, [x], entry)
    weights = (64 * 64 + 8 * 64 + 8) * 4
    # an unread 32x32 float32 parameter (4 KiB) and the table's 16 KiB alias would show up here
    assert weights <= len(pte) < weights + 12 * 1024, len(pte)
    from mps_backend.runtime import run_pte

    fresh = _Model()
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(run_pte(pte, [x])[0], fresh(x))


class _SameMasks(torch.nn.Module):
    """Per-layer buffers with identical contents (executorch's llama: one causal mask per layer)."""

    def __init__(self, layers=4, n=64):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(n, n) for _ in range(layers))
        for i in range(layers):
            self.register_buffer(f"mask_{i}", torch.triu(torch.full((n, n), -1e4), 1))  # equal, not shared

    def forward(self, x):
        for i, lin in enumerate(self.layers):
            x = torch.softmax(lin(x) + getattr(self, f"mask_{i}"), -1)
        return x


#: the precision policy's rescale factors (2**-5, 2**5: one-element constants, each stored once)
SCALARS = 16


def _mask_and_linear_bytes(fp16: bool) -> tuple[int, int]:
    """The mask's bytes (float32 in both modes: in float16 its add feeds the softmax, a float32 island, so
    the precision policy keeps it float32) and the four linears' (float16 in fp16 mode)."""
    return 64 * 64 * 4, 4 * (64 * 64 + 64) * (2 if fp16 else 4)


@pytest.mark.parametrize("fp16", [False, True])
def test_equal_constants_are_stored_once(fp16):
    model, x = _SameMasks().eval(), torch.randn(64, 64)
    res = export_model(model, [x], use_fp16=fp16)
    mask, linears = _mask_and_linear_bytes(fp16)
    # + the rescale factors (fp16) and their segment alignment; a second copy of the mask would add 16 KiB
    assert linears + mask <= res.constant_bytes <= linears + mask + 4 * SCALARS, res.constant_bytes
    from mps_backend.export import verify

    assert verify(res.pte, model, [x], use_fp16=fp16).ok


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("entry", ["to_edge_transform_and_lower", "to_backend"])
def test_plain_path_stores_equal_constants_once(entry, fp16):
    """Content-identical buffers (four equal masks) through executorch's own calls, no mps_backend
    helper: the delegate blob holds the mask once, and the .pte is weights + one mask."""
    from mps_backend.export import verify
    from mps_backend.serialization import read_blob
    from mps_backend.serialization.pte import delegate_blobs

    model, x = _SameMasks().eval(), torch.randn(64, 64)
    pte = _plain_pte(model, [x], entry, fp16=fp16)
    mask, linears = _mask_and_linear_bytes(fp16)
    blobs = delegate_blobs(pte)
    assert len(blobs) == 1
    graph = read_blob(blobs[0].blob).graph
    sizes = [graph.values[c].constant_buffer_size for c in graph.constant_ids]
    assert sum(s for s in sizes if s > SCALARS) == linears + mask and sum(s for s in sizes if s <= SCALARS) <= SCALARS
    # each further copy of the mask would add a whole mask (8 or 16 KiB); the rest is a few KiB of program
    assert linears + mask <= len(pte) < linears + 2 * mask, len(pte)
    assert verify(pte, model, [x], use_fp16=fp16).ok


def test_dynamic_shapes_warn_and_make_static_gives_one_partition():
    from executorch.exir import to_edge_transform_and_lower

    from mps_backend import MPSPartitioner
    from mps_backend.export import make_static
    from mps_backend.partitioner import DynamicShapeWarning

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    x = torch.randn(3, 8)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch", max=16)},))
    part = MPSPartitioner(use_fp16=False)
    with pytest.warns(DynamicShapeWarning, match="dynamic"):
        to_edge_transform_and_lower(ep, partitioner=[part])
    assert part.report().on_cpu
    with pytest.warns(UserWarning, match="made static: inputs \\[3, 8\\]"):
        static = make_static(ep, (x,))
    part = MPSPartitioner(use_fp16=False)
    edge = to_edge_transform_and_lower(static, partitioner=[part])
    assert part.report().partitions == 1 and not part.report().on_cpu
    from mps_backend.runtime import run_pte

    torch.testing.assert_close(run_pte(edge.to_executorch().buffer, [x])[0], model(x))
