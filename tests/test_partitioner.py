"""MPSPartitioner / MPSBackend end to end on the demo model and small programs."""

from __future__ import annotations

import collections

import pytest
import torch
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.lowered_backend_module import get_lowered_submodules

from mps_backend import MPSBackend, MPSPartitioner
from mps_backend.precision import Precision
from mps_backend.serialization import DataType, read_blob
from mps_backend.serialization.device_facts import IGNORED_IDS, node_value_ids
from mps_backend.tools.demo import demo_model


def lower(model, inputs, partitioner=None, via="transform_and_lower"):
    partitioner = partitioner or MPSPartitioner()
    ep = torch.export.export(model.eval(), tuple(inputs))
    if via == "to_backend":
        edge = to_edge(ep).to_backend(partitioner)
    else:
        edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    blobs = [
        m.processed_bytes
        for _, m, _ in get_lowered_submodules(edge.exported_program().graph_module)
        if m.backend_id == "MPSBackend"
    ]
    return edge, partitioner, blobs


@pytest.fixture(scope="module")
def demo():
    return demo_model()


@pytest.mark.parametrize("use_fp16", [False, True])
def test_demo_is_one_delegate_with_nothing_on_cpu(demo, use_fp16):
    edge, part, blobs = lower(*demo, MPSPartitioner(use_fp16=use_fp16))
    report = part.report()
    assert len(blobs) == 1 and report.partitions == 1
    assert report.on_cpu == [], str(report)
    assert len(report.delegated) > 40
    cpu_ops = [
        n
        for n in edge.exported_program().graph.nodes
        if n.op == "call_function" and "executorch_call_delegate" not in str(n.target) and n.target.__name__ != "getitem"
    ]
    assert cpu_ops == []


def test_to_backend_path_and_compile_specs(demo):
    spec_part = MPSPartitioner(compile_specs=[CompileSpec("use_fp16", bytes([0]))])
    assert spec_part.use_fp16 is False
    _, _, blobs = lower(*demo, spec_part, via="to_backend")
    graph = read_blob(blobs[0]).graph
    assert all(v.datatype != DataType.float16 for v in graph.values)
    with pytest.raises(ValueError, match="unknown MPS compile spec 'fast_math'"):
        MPSPartitioner(compile_specs=[CompileSpec("fast_math", bytes([1]))])
    with pytest.raises(ValueError, match="one byte"):
        MPSPartitioner(compile_specs=[CompileSpec("use_fp16", bytes([7]))])
    assert MPSPartitioner().use_fp16 is True


def test_inputs_are_ids_0_to_n_in_forward_order():
    class ThreeInputs(torch.nn.Module):
        def forward(self, a, b, c):
            return (c * 2 + a) - b

    shapes = [(2, 3), (1, 3), (2, 1)]
    _, _, blobs = lower(ThreeInputs(), [torch.randn(s) for s in shapes], MPSPartitioner(use_fp16=False))
    g = read_blob(blobs[0]).graph
    assert g.input_ids == [0, 1, 2]
    assert [list(g.values[i].dims) for i in g.input_ids] == [list(s) for s in shapes]


def test_fp16_graph_mixes_dtypes_only_through_casts(demo):
    """Precision.FP16: float32 islands (layer norm statistics, softmax, the residual stream before
    them) inside the float16 graph; every node but MPSCast reads float operands of one dtype, and a
    float32 constant is read only where float32 is computed."""
    _, _, blobs = lower(*demo, MPSPartitioner(use_fp16=True))
    g = read_blob(blobs[0]).graph
    kinds = collections.Counter(g.values[n["output_id"]].datatype for n in g.nodes if "output_id" in n.fields)
    assert kinds[DataType.float32] and kinds[DataType.float16], kinds
    floats = (DataType.float16, DataType.float32)
    for n in g.nodes:
        if n.op == "MPSCast":
            continue
        read = {k: v for k, v in n.fields.items() if (n.op, k) not in IGNORED_IDS}  # MPSReLU's input2_id ...
        ins = {g.values[v].datatype for v in node_value_ids(read, outputs=False)} & set(floats)
        assert len(ins) <= 1, (n.op, ins)
        if DataType.float32 in ins:
            outs = {g.values[v].datatype for v in node_value_ids(n.fields, outputs=True)}
            assert DataType.float16 not in outs, n.op


def test_fp16_uniform_graph_has_no_float32_inside_except_boundary_casts(demo):
    """Precision.FP16_UNIFORM (the upstream use_fp16): every float value float16 but the boundary casts."""
    _, _, blobs = lower(*demo, MPSPartitioner(precision=Precision.FP16_UNIFORM))
    g = read_blob(blobs[0]).graph
    f32 = {i for i, v in enumerate(g.values) if v.datatype == DataType.float32}
    boundary = set(g.input_ids)
    casts = [n for n in g.nodes if n.op == "MPSCast"]
    boundary |= {n["output_id"] for n in casts if n["dtype"] == DataType.float32}
    assert f32 == boundary
    assert set(g.output_ids) <= boundary
    assert all(g.values[c].datatype != DataType.float32 for c in g.constant_ids)
    for n in g.nodes:  # the only consumers of the f32 inputs are the boundary casts
        for k, v in n.fields.items():
            if k.startswith("input") and k != "input_ids" and v in g.input_ids:
                assert n.op == "MPSCast", n


def test_lifted_tensor_constants_are_blob_constants_not_inputs():
    class WithConstant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.offset = torch.arange(6.0).reshape(2, 3)  # plain attribute: a lifted tensor constant

        def forward(self, x):
            return x + self.offset

    x = torch.randn(2, 3)
    edge, _, blobs = lower(WithConstant(), [x], MPSPartitioner(use_fp16=False))
    blob = read_blob(blobs[0])
    g = blob.graph
    assert g.input_ids == [0] and len(g.constant_ids) == 1
    data = torch.frombuffer(bytearray(blob.constant_bytes(g.constant_ids[0])), dtype=torch.float32)
    assert torch.equal(data.reshape(2, 3), torch.arange(6.0).reshape(2, 3))
    sig = edge.exported_program().graph_signature
    assert len(sig.user_inputs) == 1


def test_two_lowerings_share_no_state(demo):
    class Scaled(torch.nn.Module):
        def forward(self, x):
            return x * 2.0 + 1.0

    x = torch.randn(4)
    first = lower(Scaled(), [x], MPSPartitioner(use_fp16=True))[2][0]
    lower(*demo, MPSPartitioner(use_fp16=False))  # different model and precision in between
    lower(Scaled(), [x.long()], MPSPartitioner(use_fp16=False))  # same scalars, other dtype
    again = lower(Scaled(), [x], MPSPartitioner(use_fp16=True))[2][0]
    assert first == again
    g = read_blob(again).graph
    assert all(g.values[c].datatype == DataType.float16 for c in g.constant_ids)


def test_same_model_gives_byte_identical_pte(demo):
    def pte():
        return lower(*demo, MPSPartitioner())[0].to_executorch().buffer

    assert pte() == pte()


def test_report_names_cpu_nodes_with_reasons():
    class Mixed(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x.relu()).values.double()

    _, part, _ = lower(Mixed(), [torch.randn(5)])
    text = str(part.report())
    on_cpu = {n.target: n.reason for n in part.report().on_cpu}
    assert any("sort" in t for t in on_cpu), text
    assert any("float64" in r for r in on_cpu.values()), text
    assert "left on CPU" in text


def test_report_of_a_program_with_several_methods_covers_each_method():
    class Relu(torch.nn.Module):
        def forward(self, x):
            return x.relu() * 3

    class Sorts(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x * 2).values

    x = torch.randn(6)
    part = MPSPartitioner()
    programs = {"plain": torch.export.export(Relu(), (x,)), "sorts": torch.export.export(Sorts(), (x,))}
    to_edge_transform_and_lower(programs, partitioner=[part])
    report = part.report()
    assert len(report.methods) == 2, str(report)
    first, second = report.methods
    assert first.on_cpu == [] and {"aten_relu_default", "aten_mul_tensor"} <= set(first.delegated)
    assert [n.target for n in second.on_cpu] == ["aten::sort"] and "aten_mul_tensor" in second.delegated
    assert report.delegated == first.delegated + second.delegated and report.on_cpu == second.on_cpu
    assert report.partitions == first.partitions + second.partitions == 2
    text = str(report)
    assert "over 2 methods" in text and "method 2 of 2" in text and "sort" in text
    # one method: one report, no per-method list
    single = MPSPartitioner()
    to_edge_transform_and_lower(programs["plain"], partitioner=[single])
    assert single.report().methods == [] and single.report().delegated == first.delegated


def test_debug_handle_map_points_mps_nodes_at_source_nodes(demo):
    ep = torch.export.export(demo[0], demo[1])
    edge = to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner()])
    lowered = [m for _, m, _ in get_lowered_submodules(edge.exported_program().graph_module)][0]
    handle_map = lowered.meta.get("debug_handle_map")
    assert handle_map, "preprocess returned no debug_handle_map"
    n_nodes = len(read_blob(lowered.processed_bytes).graph.nodes)
    assert all(0 <= k < n_nodes for k in handle_map)
    assert all(isinstance(v, tuple) and v for v in handle_map.values())


def test_backend_class_identity():
    from executorch.exir.backend.backend_details import BackendDetails

    assert MPSBackend.__name__ == "MPSBackend" and BackendDetails in MPSBackend.__bases__


def test_numerical_debugger_taps_are_not_reported_as_cpu_nodes():
    from executorch.devtools.intermediate_output_tap import strip_taps_, tap_intermediate_outputs_
    from executorch.exir import to_edge_transform_and_lower

    from mps_backend import MPSPartitioner

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    ep = torch.export.export(model, (torch.randn(2, 8),))
    tapped, specs = tap_intermediate_outputs_(ep)
    assert specs
    part = MPSPartitioner(use_fp16=False)
    edge = to_edge_transform_and_lower(tapped, partitioner=[part])
    assert part.report().on_cpu == [] and part.report().delegated
    strip_taps_(edge)
    edge.to_executorch()


class _Big(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        with torch.no_grad():
            self.lin.weight[0, 0] = scale

    def forward(self, x):
        return self.lin(x).masked_fill(x < -10, -1e9)  # a one-element -1e9 fill stays allowed


def test_fp16_constants_beyond_the_range_are_an_error_naming_them():
    from executorch.exir import to_edge_transform_and_lower

    from mps_backend import MPSPartitioner
    from mps_backend.export import export_model
    from mps_backend.passes import Float16RangeError, Float16RangeWarning

    x = torch.randn(2, 4)
    with pytest.raises(Float16RangeError, match=r"lin\.weight \(1 of 16 values, largest \|x\| 1e\+05\).*float32"):
        export_model(_Big(1e5).eval(), [x])
    assert export_model(_Big(1e5).eval(), [x], use_fp16=False).delegates == 1  # float32 keeps the value
    assert export_model(_Big(6e4).eval(), [x]).delegates == 1  # in range (and the -1e9 fill) is fine
    # the plain executorch path cannot stop in preprocess: it warns, naming the constant
    ep = torch.export.export(_Big(1e5).eval(), (x,))
    with pytest.warns(Float16RangeWarning, match=r"lin_weight \(1 of 16 values"):
        to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner()])


class _Casts(torch.nn.Module):
    def forward(self, x, i):
        return x.to(torch.int32) * 2, i.to(torch.float32) + 1, i.to(torch.int8).to(torch.float32) * 3


def test_fp16_casts_the_device_may_not_represent_are_named():
    from executorch.exir import to_edge_transform_and_lower

    from mps_backend import MPSPartitioner

    ep = torch.export.export(_Casts().eval(), (torch.randn(3), torch.arange(3, dtype=torch.int32)))
    part = MPSPartitioner()
    to_edge_transform_and_lower(ep, partitioner=[part])
    notes = part.report().fp16_notes
    assert any("torch.int32 -> float32" in n and "65504" in n for n in notes), notes
    assert any("float32 -> torch.int32" in n and "integer minimum" in n for n in notes), notes
    assert not any("torch.int8 -> float32" in n for n in notes), notes  # int8 values are exact in float16
    assert "float16 range" in str(part.report())
    part32 = MPSPartitioner(use_fp16=False)
    to_edge_transform_and_lower(
        torch.export.export(_Casts().eval(), (torch.randn(3), torch.arange(3, dtype=torch.int32))), partitioner=[part32]
    )
    assert part32.report().fp16_notes == []


def test_whole_program_to_backend_names_what_the_device_cannot_run():
    """to_backend('MPSBackend', program) (old scripts) has no partitioner: a dynamic size or an op without
    a lowering is refused with the node, the reason and what to do, never lowered with a baked-in shape."""
    from executorch.exir import to_edge
    from executorch.exir.backend.backend_api import to_backend

    from mps_backend.backend import LoweringError, MPSBackend  # noqa: F401 - registers the backend id

    class Scale(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    x = torch.randn(3, 4)
    dynamic = torch.export.export(Scale(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("b", min=1, max=8)}})
    with pytest.raises(LoweringError) as err:
        to_backend("MPSBackend", to_edge(dynamic).exported_program(), [])
    msg = str(err.value)
    assert "aten_relu_default" in msg and "dynamic shape" in msg and "make_static" in msg and "MPSPartitioner" in msg
    assert "partitioner bug" not in msg

    class Grid(torch.nn.Module):
        def forward(self, x, g):
            return torch.nn.functional.grid_sample(x, g, align_corners=False)

    ep = torch.export.export(Grid(), (torch.randn(1, 2, 4, 4), torch.rand(1, 2, 2, 2)))
    with pytest.raises(LoweringError, match="aten_grid_sampler_2d_default .*no MPS lowering"):
        to_backend("MPSBackend", to_edge(ep).exported_program(), [])
    static = torch.export.export(Scale(), (x,))
    assert to_backend("MPSBackend", to_edge(static).exported_program(), []).processed_bytes[4:8] == b"MP00"


class _Preserved(torch.nn.Module):
    """Every kind of op the partitioner asks executorch to keep whole (lowerings marked ``preserve``)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):  # x: (1, 4, 4, 8)
        y = torch.nn.functional.hardswish(self.fc(x)) + torch.nn.functional.softplus(x)
        y = torch.nn.functional.pixel_shuffle(y.reshape(1, 8, 2, 8), 2)
        y = torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest")
        y = torch.nn.functional.pad(y, (1, 1, 1, 1), mode="reflect")
        return torch.roll(y, 1, 2)


class _FilterPath(MPSPartitioner):
    """MPSPartitioner without its early decomposition: executorch's per-node filter path (three passes)."""

    def transform_for_pre_decomposition(self, exported_program):
        return exported_program


def _count_decompositions(monkeypatch) -> list:
    calls = []
    original = torch.export.ExportedProgram.run_decompositions

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    return calls


def test_preserved_ops_the_device_lowers_cost_two_decompositions_and_give_the_same_pte(monkeypatch):
    """Early decomposition (``transform_for_pre_decomposition``) lets executorch skip its per-node
    filter path: two ``run_decompositions`` instead of three, and the same .pte byte for byte."""
    model, x = _Preserved().eval(), torch.randn(1, 4, 4, 8)
    ptes, passes = [], []
    for cls in (MPSPartitioner, _FilterPath):
        ep = torch.export.export(model, (x,))
        calls = _count_decompositions(monkeypatch)
        edge = to_edge_transform_and_lower(ep, partitioner=[cls(use_fp16=False)])
        monkeypatch.undo()
        passes.append(len(calls))
        assert [n.name for n in edge.exported_program().graph.nodes if n.op == "call_function"] == [
            "executorch_call_delegate",
            "getitem",
        ]
        ptes.append(edge.to_executorch().buffer)
    assert passes == [2, 3]
    assert ptes[0] == ptes[1]


def test_preserved_op_the_device_cannot_lower_is_still_decomposed(monkeypatch):
    """A float64 linear (no MPS lowering) is decomposed for the CPU as before: executorch's filter path,
    three passes (no early decomposition: the linear is visible before it)."""
    calls = _count_decompositions(monkeypatch)
    x = torch.randn(2, 4, dtype=torch.float64)
    edge, part, _ = lower(torch.nn.Linear(4, 3).double(), [x], MPSPartitioner(use_fp16=False))
    targets = [n.target.__name__ for n in edge.exported_program().graph.nodes if n.op == "call_function"]
    assert len(calls) == 3
    assert "aten.addmm.default" in targets and not any("linear" in t for t in targets)
    assert part.report().on_cpu


class _StaticLinearDynamicRows(torch.nn.Module):
    """A static linear (a preserved op the device lowers) beside work on a dynamic number of rows (a
    chunked prefill program's shape: its ``sym_size`` reads are in the default decomposition table)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x, rows):
        return self.lin(x), torch.arange(rows.shape[0]) * 2 + rows.sum()


def test_a_dynamic_programs_shape_reads_cost_no_decomposition(monkeypatch):
    """``sym_size`` (listed by the default decompositions, split by none of them) does not send a dynamic
    program down executorch's filter path: two ``run_decompositions`` instead of four, the same .pte."""
    from torch.export import Dim

    import mps_backend.partitioner as partitioner_module

    model = _StaticLinearDynamicRows().eval()
    args = (torch.randn(1, 8), torch.randn(5, 3))
    ptes, passes = [], []
    for queries in (partitioner_module._SHAPE_QUERIES, frozenset()):
        monkeypatch.setattr(partitioner_module, "_SHAPE_QUERIES", queries)
        ep = torch.export.export(model, args, dynamic_shapes={"x": None, "rows": {0: Dim("n", min=2, max=16)}})
        calls = _count_decompositions(monkeypatch)
        edge = to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner(use_fp16=False)])
        monkeypatch.undo()
        passes.append(len(calls))
        targets = [str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"]
        assert "executorch_call_delegate" in str(targets) and "aten.sym_size.int" in targets, targets
        ptes.append(edge.to_executorch().buffer)
    assert passes == [2, 4]
    assert ptes[0] == ptes[1]
