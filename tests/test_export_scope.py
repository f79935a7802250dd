"""mps_backend.export_scope: while a lowering runs, torch's provenance records shared instead of deep-copied, its
census of composite-implicit operators kept while the dispatcher's registrations are unchanged, executorch's
second functionalization of a program a decomposition just made skipped, its dtype check of an edge graph done
once per graph, and its re-traces that would rewrite nothing skipped; the same records, the same census, the same
.pte bytes, and torch's and executorch's own code back afterwards (also on error)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.fx.traceback import NodeSource

from mps_backend.export_scope import (
    _MARK,
    export_scope,
    functional_once,
    graph_fingerprint,
    no_idle_retraces,
    remembered_cia_ops,
    shared_provenance,
    verified_once,
)


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


def _roots(record: dict) -> list:
    """The earliest sources of a record (what debug handles and the Inspector trace a node back to)."""
    return [r for source in record["from_node"] for r in _roots(source)] if record["from_node"] else [record["name"]]


@contextlib.contextmanager
def _copies_and_census():
    with shared_provenance(), remembered_cia_ops():
        yield


def _lowered(scope):
    from executorch.exir import to_edge_transform_and_lower

    from mps_backend import MPSPartitioner
    from mps_backend.partitioner import backend_config, edge_compile_config

    torch.manual_seed(0)
    ep = torch.export.export(Small().eval(), (torch.randn(3, 8),), strict=False)
    with scope():
        edge = to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner()], compile_config=edge_compile_config())
        records = [
            [_without_graph_ids(s.to_dict()) for s in n.meta.get("from_node", [])]
            for gm in [edge.exported_program().graph_module]
            + [m for m in edge.exported_program().graph_module.modules() if isinstance(m, torch.fx.GraphModule)]
            for n in gm.graph.nodes
        ]
        program = edge.to_executorch(backend_config(edge))
    return records, program.buffer


def test_same_records_and_bytes_as_torchs_own_code():
    """Shared records and a kept census: every node's provenance (names, targets, passes, actions, the whole chain)
    and the .pte are the same as with torch's deep copies and its census asked every time. The whole scope (the
    second functionalization skipped too): the same .pte, each record one functionalization shorter, traced back to
    the same sources."""
    records, pte = _lowered(contextlib.nullcontext)
    shared_records, shared_pte = _lowered(_copies_and_census)
    assert any(r and r[0]["from_node"] for r in records)  # chains of more than one pass are compared
    assert shared_records == records
    assert shared_pte == pte
    scoped_records, scoped_pte = _lowered(export_scope)
    assert scoped_pte == pte
    assert [[_roots(r) for r in node] for node in scoped_records] == [[_roots(r) for r in node] for node in records]


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


def test_exports_lower_inside_the_scope(monkeypatch, tmp_path):
    """export_model and export_llm lower inside the scope (what they call sees the replaced constructor, census and
    decomposition)."""
    import executorch.exir
    import torch.export.exported_program as torch_ep
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.verification import verifier

    import mps_backend.llm.export as llm_export
    from mps_backend.export import export_model

    seen = []
    own = executorch.exir.to_edge_transform_and_lower

    def spy(*args, **kwargs):
        seen.append(
            getattr(NodeSource.__dict__["__init__"], _MARK, False)
            and getattr(torch_ep._collect_all_valid_cia_ops, _MARK, False)
            and getattr(torch_ep.ExportedProgram.run_decompositions, _MARK, False)
            and getattr(verifier._check_tensor_args_matching_op_allowed_dtype, _MARK, False)
            and getattr(NormalizeTransposePass.call, _MARK, False)
        )
        return own(*args, **kwargs)

    monkeypatch.setattr(executorch.exir, "to_edge_transform_and_lower", spy)
    monkeypatch.setattr(llm_export, "to_edge_transform_and_lower", spy)
    export_model(Small().eval(), (torch.randn(3, 8),))
    from tests.llm_helpers import save_checkpoint

    folder = save_checkpoint(tmp_path / "ckpt", "llama", layers=1)
    llm_export.export_llm(f"hf:{folder}", tmp_path / "m.pte", prefill_chunk=1, dtype="fp32", max_seq_len=16)
    assert seen == [True, True]
    assert not getattr(NodeSource.__dict__["__init__"], _MARK, False)
    assert not getattr(torch_ep._collect_all_valid_cia_ops, _MARK, False)
    assert not getattr(torch_ep.ExportedProgram.run_decompositions, _MARK, False)
    assert not getattr(verifier._check_tensor_args_matching_op_allowed_dtype, _MARK, False)
    assert not getattr(NormalizeTransposePass.call, _MARK, False)


def test_census_kept_until_the_dispatcher_changes():
    """Inside the scope torch's census is asked once while nothing is registered, its answer equal to torch's
    own; an operator registered meanwhile with a CompositeImplicitAutograd kernel is in the next answer; each
    caller gets a set of its own; torch's census is back after, also on error."""
    import torch._export.utils as torch_utils
    import torch.export.decomp_utils as torch_decomp
    import torch.export.exported_program as torch_ep

    own = torch_utils._collect_all_valid_cia_ops
    truth = own()
    asked = []

    def counted():
        asked.append(1)
        return own()

    with pytest.MonkeyPatch.context() as mp:
        for m in (torch_ep, torch_decomp):
            mp.setattr(m, "_collect_all_valid_cia_ops", counted)
        with remembered_cia_ops() as on:
            assert on
            first, second = torch_ep._collect_all_valid_cia_ops(), torch_decomp._collect_all_valid_cia_ops()
            assert first == second == truth and first is not second and len(asked) == 1
            first.clear()  # a caller's change stays its own
            with remembered_cia_ops() as nested:  # replaced once
                assert not nested
            lib = torch.library.Library("mps_backend_census_test", "DEF")  # noqa: TOR901 - registered for the test
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda x: x + x, "CompositeImplicitAutograd")
            now = torch_ep._collect_all_valid_cia_ops()
            assert len(asked) == 2 and torch.ops.mps_backend_census_test.twice.default in now and now == own()
            assert torch_ep._collect_all_valid_cia_ops() == now and len(asked) == 2
            del lib
        assert not getattr(torch_ep._collect_all_valid_cia_ops, _MARK, False)
    assert torch_ep._collect_all_valid_cia_ops is own and torch_decomp._collect_all_valid_cia_ops is own
    with pytest.raises(RuntimeError), remembered_cia_ops():
        raise RuntimeError("a failed lowering")
    assert torch_ep._collect_all_valid_cia_ops is own


def test_a_decomposed_program_is_not_functionalized_again():
    """Inside the scope, run_decompositions({}) of a program a run_decompositions of the scope returned is that
    program; of any other program (torch.export's own), or with a non-empty table, torch traces as always. The
    second call's graph would be the same (compared); torch's method is back after, also on error."""
    from torch.export import ExportedProgram

    own = ExportedProgram.__dict__["run_decompositions"]
    ep = torch.export.export(Small().eval(), (torch.randn(3, 8),), strict=False)
    outside = ep.run_decompositions({})
    with functional_once() as on:
        assert on
        with functional_once() as nested:  # replaced once
            assert not nested
        made = ep.run_decompositions({})
        assert made is not ep  # torch.export's program: traced
        assert made.run_decompositions({}) is made  # functional already: itself
        assert made.run_decompositions() is not made  # a table to apply: traced
        assert str(made.graph_module.code) == str(outside.run_decompositions({}).graph_module.code)
    assert ExportedProgram.__dict__["run_decompositions"] is own
    again = outside.run_decompositions({})
    assert again is not outside
    with pytest.raises(RuntimeError), functional_once():
        raise RuntimeError("a failed lowering")
    assert ExportedProgram.__dict__["run_decompositions"] is own


def _edge_graph():
    from executorch.exir import to_edge

    torch.manual_seed(0)
    return to_edge(torch.export.export(Small().eval(), (torch.randn(3, 8),), strict=False)).exported_program().graph_module


def test_a_graph_that_passed_the_dtype_check_is_not_checked_again():
    """Inside the scope executorch's dtype check runs once per graph that passes it: the same graph (or a copy of
    it) again is not interpreted again; a changed argument, placeholder dtype or attribute tensor is a new graph,
    checked; a graph that fails fails every time; executorch's check is back after, also on error."""
    import copy

    from executorch.exir.verification import verifier

    gm = _edge_graph()
    checked = []
    real = verifier._check_tensor_args_matching_op_allowed_dtype

    def counted(graph):
        checked.append(graph)
        if getattr(graph, "bad", False):
            raise RuntimeError("mismatched dtypes")
        return real(graph)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verifier, "_check_tensor_args_matching_op_allowed_dtype", counted)
        with verified_once() as on:
            assert on
            with verified_once() as nested:  # replaced once
                assert not nested
            check = verifier._check_tensor_args_matching_op_allowed_dtype
            check(gm)
            check(gm)
            check(copy.deepcopy(gm))
            assert len(checked) == 1
            changed = copy.deepcopy(gm)
            node = next(n for n in changed.graph.nodes if n.op == "call_function" and "softmax" in str(n.target))
            node.args = (node.args[0], 0, *node.args[2:])  # another dim
            check(changed)
            assert len(checked) == 2
            retyped = copy.deepcopy(gm)
            x = next(n for n in retyped.graph.nodes if n.op == "placeholder" and n.users and "val" in n.meta)
            x.meta["val"] = x.meta["val"].to(torch.float16)
            assert graph_fingerprint(retyped) != graph_fingerprint(gm)
            bad = copy.deepcopy(gm)
            bad.graph.placeholder("extra")  # another graph, that fails
            bad.bad = True
            for _ in range(2):
                with pytest.raises(RuntimeError, match="mismatched"):
                    check(bad)
            assert len(checked) == 4
        assert verifier._check_tensor_args_matching_op_allowed_dtype is counted
    assert verifier._check_tensor_args_matching_op_allowed_dtype is real
    with pytest.raises(RuntimeError), verified_once():
        raise RuntimeError("a failed lowering")
    assert verifier._check_tensor_args_matching_op_allowed_dtype is real


def test_a_retrace_that_would_rewrite_nothing_is_skipped():
    """Inside the scope NormalizeTransposePass, ReplaceBrokenOpsWithFunctionalOpsPass and SymToTensorPass return a
    graph holding nothing they rewrite as it is; a graph with an aten.t, a view operator or a symbolic size is
    re-traced and rewritten as executorch does; their own methods are back after, also on error."""
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import ReplaceBrokenOpsWithFunctionalOpsPass
    from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass

    classes = (NormalizeTransposePass, ReplaceBrokenOpsWithFunctionalOpsPass, SymToTensorPass)
    owns = [vars(cls).get("call") for cls in classes]

    class Transposed(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.t.default(x) * 2

    class Viewed(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.view.default(x, [-1]) + 1

    class Sized(torch.nn.Module):
        def forward(self, x):
            return x + torch.ops.aten.sym_size.int(x, 0)

    plain = torch.export.export(Small().eval(), (torch.randn(3, 8),), strict=False).run_decompositions().graph_module
    transposed = torch.export.export(Transposed(), (torch.randn(3, 4),), strict=False).graph_module
    viewed = torch.export.export(Viewed(), (torch.randn(3, 4),), strict=False).graph_module
    batch = torch.export.Dim("batch", min=2, max=8)
    sized = torch.export.export(Sized(), (torch.randn(3, 4),), dynamic_shapes=({0: batch},), strict=False).graph_module
    arithmetic = torch.export.export(Sized(), (torch.randn(3, 4),), strict=False).graph_module  # no view, no symbol
    with no_idle_retraces() as on:
        assert on
        with no_idle_retraces() as nested:  # replaced once
            assert not nested
        normalized = NormalizeTransposePass()(plain)
        assert normalized.graph_module is plain and not normalized.modified
        assert ReplaceBrokenOpsWithFunctionalOpsPass()(arithmetic).graph_module is arithmetic
        rewritten = NormalizeTransposePass()(transposed).graph_module
        assert rewritten is not transposed
        assert torch.ops.aten.t_copy.default in {n.target for n in rewritten.graph.nodes}
        copied = ReplaceBrokenOpsWithFunctionalOpsPass()(viewed).graph_module
        assert torch.ops.aten.view_copy.default in {n.target for n in copied.graph.nodes}
        assert SymToTensorPass()(sized).graph_module is not sized  # a symbolic size: re-traced
        assert SymToTensorPass()(arithmetic).graph_module is arithmetic
    assert [vars(cls).get("call") for cls in classes] == owns
    with pytest.raises(RuntimeError), no_idle_retraces():
        raise RuntimeError("a failed lowering")
    assert [vars(cls).get("call") for cls in classes] == owns


def test_mixed_types_layouts_and_memory_formats_skipped_only_when_nothing_to_rewrite():
    """RemoveMixedTypeOperators, MemoryFormatOpsPass and LegalizePortableDimOrderPass inside the scope: a graph
    with nothing for them is returned as it is; a float16 tensor added to a float32 one, a python number given to
    a multiplication, an integer division, a clone (memory format) and a mean over a channels-last input are
    rewritten as executorch does (compared with the pass outside the scope)."""
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes.scalar_to_tensor_pass import ScalarToTensorPass

    class Same(torch.nn.Module):
        def forward(self, x, y):
            return torch.where(x > 0, x, y) + y

    class Mixed(torch.nn.Module):
        def forward(self, x, y):
            return x + y.half()

    class Number(torch.nn.Module):
        def forward(self, x, y):
            return torch.ops.aten.mul.Tensor(x, 2) + y

    class Integer(torch.nn.Module):
        def forward(self, x, y):
            return torch.ops.aten.div.Tensor(x.long(), y.long())

    class Clone(torch.nn.Module):
        def forward(self, x, y):
            return x.clone() + y

    def aten(cls):
        return torch.export.export(cls(), (torch.randn(3, 4), torch.randn(3, 4)), strict=False).graph_module

    def edge(cls, **config):  # _skip_dim_order: memory formats left for MemoryFormatOpsPass
        ep = torch.export.export(cls(), (torch.randn(3, 4), torch.randn(3, 4)), strict=False)
        return to_edge(ep, compile_config=EdgeCompileConfig(**config)).exported_program().graph_module

    def targets(gm):
        return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    def mean_channels_last():
        gm = (
            to_edge(torch.export.export(torch.nn.AdaptiveAvgPool2d(1), (torch.randn(1, 3, 4, 4),)))
            .exported_program()
            .graph_module
        )
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        x.meta["val"] = x.meta["val"].to(memory_format=torch.channels_last)
        return gm

    rewritten = {
        # the number made a tensor first, as executorch's passes do before this one
        RemoveMixedTypeOperators: [aten(Mixed), ScalarToTensorPass()(aten(Number)).graph_module, aten(Integer)],
        MemoryFormatOpsPass: [edge(Clone, _skip_dim_order=True)],
        LegalizePortableDimOrderPass: [mean_channels_last()],
    }
    idle = {RemoveMixedTypeOperators: aten(Same), MemoryFormatOpsPass: edge(Same), LegalizePortableDimOrderPass: edge(Same)}
    want = {cls: [targets(cls()(gm).graph_module) for gm in gms] for cls, gms in rewritten.items()}
    assert all(w != targets(gm) for cls, gms in rewritten.items() for w, gm in zip(want[cls], gms))  # each rewrites
    with no_idle_retraces():
        for cls, gm in idle.items():
            result = cls()(gm)
            assert result.graph_module is gm and not result.modified, cls.__name__
        for cls, gms in rewritten.items():
            got = [cls()(gm).graph_module for gm in gms]
            assert all(g is not gm for g, gm in zip(got, gms)), cls.__name__
            assert [targets(g) for g in got] == want[cls], cls.__name__
