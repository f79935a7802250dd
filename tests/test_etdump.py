"""Per-node debugging with executorch's devtools: the emulated runtime logs one ETDump event per MPS node
(profiling time marked as emulated, the node's output as intermediate output) under the delegate debug
identifiers the ahead-of-time side maps to source nodes, so the Inspector's ``calculate_numeric_gap``
gives one row per operator inside the delegate."""

from __future__ import annotations

import torch
from executorch.devtools import Inspector
from torch import nn

from mps_backend.export import export_model
from mps_backend.runtime.emulator import EMULATED_EVENT_METADATA, run_with_etdump
from mps_backend.runtime.interpreter import Interpreter
from mps_backend.serialization.pte import delegate_blobs
from mps_backend.tools.cli import main


class _Cancels(nn.Module):
    """(h + 1000) - 1000: float16's step at 1000 is 0.5, so h loses its low bits at the add."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.a(x)
        return torch.tanh(self.b(nn.functional.hardswish((h + 1000.0) - 1000.0)))


def _inspect(tmp_path, model, inputs, use_fp16):
    result = export_model(model, inputs, use_fp16=use_fp16, etrecord=True)
    pte, record = tmp_path / "m.pte", tmp_path / "etrecord.bin"
    pte.write_bytes(result.pte)
    result.etrecord.save(str(record))
    etdump, debug = tmp_path / "m.etdp", tmp_path / "m.debug.bin"
    outputs = run_with_etdump(pte, inputs, etdump, debug)
    inspector = Inspector(etdump_path=str(etdump), etrecord=str(record), debug_buffer_path=str(debug))
    return result, outputs, inspector


def _gaps(inspector) -> dict[str, float]:
    frame = inspector.calculate_numeric_gap("MSE")
    return {"+".join(ops): max(float(g) for g in gap) for ops, gap in zip(frame["aot_ops"], frame["gap"])}


def test_one_event_per_mps_node_with_emulated_time_and_output(tmp_path):
    torch.manual_seed(0)
    model = _Cancels().eval()
    x = torch.randn(2, 16) * 0.1
    result, outputs, inspector = _inspect(tmp_path, model, [x], use_fp16=False)
    torch.testing.assert_close(outputs[0], model(x), rtol=1e-5, atol=1e-6)
    (blob,) = [d.blob for d in delegate_blobs(result.pte)]
    n_nodes = len(Interpreter(blob).graph.nodes)
    inner = [e for block in inspector.event_blocks for e in block.events if e.is_delegated_op and e.name != "DELEGATE_CALL"]
    assert len(inner) == n_nodes  # every MPS node logged once, under its index
    assert sorted(int(e.delegate_debug_identifier) for e in inner) == list(range(n_nodes))
    assert all(e.delegate_debug_metadatas == [EMULATED_EVENT_METADATA] for e in inner)
    assert all(e.delegate_backend_name == "MPSBackend" for e in inner)
    assert all(e.debug_data for e in inner)  # each with its intermediate output
    # the source operators all have an event that carries their result
    mapped = {op for e in inner for op in e.op_types}
    assert {"aten.linear.default", "aten.add.Tensor", "aten.sub.Tensor", "aten.hardswish.default", "aten.tanh.default"} <= mapped


def test_numeric_gap_has_a_row_per_operator_inside_the_delegate(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 16) * 0.1
    _, _, inspector = _inspect(tmp_path, _Cancels().eval(), [x], use_fp16=False)
    gaps = _gaps(inspector)
    # one row per source operator, not one per delegate
    assert sorted(gaps) == ["add", "hardswish", "linear", "linear_1", "sub", "tanh"], gaps
    # fp32 on the device model equals eager; a multi-node lowering (hardswish) is compared at the node
    # that computes its result, not at an intermediate (x + 3 would be off by ~3)
    assert max(gaps.values()) < 1e-10, gaps


def test_float16_gap_points_at_the_op_that_loses_precision(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 16) * 0.1
    _, _, inspector = _inspect(tmp_path, _Cancels().eval(), [x], use_fp16=True)
    gaps = _gaps(inspector)
    first_linear = next(v for k, v in gaps.items() if k.startswith("linear"))
    cancel = max(v for k, v in gaps.items() if k.startswith(("add", "sub")))
    assert cancel > 1e-3 > first_linear * 100, gaps  # float16's step at 1000 is 0.5


def test_run_command_writes_etdump_and_prints_the_gap_table(tmp_path, capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    result = export_model(model, [torch.randn(1, 8)], use_fp16=False, etrecord=True)
    pte, record = tmp_path / "m.pte", tmp_path / "m_etrecord.bin"
    pte.write_bytes(result.pte)
    result.etrecord.save(str(record))
    etdump, debug = tmp_path / "out.etdp", tmp_path / "out.bin"
    assert main(["run", str(pte), "--etrecord", str(record), "--etdump", str(etdump), "--debug-buffer", str(debug)]) == 0
    out = capsys.readouterr().out
    assert etdump.stat().st_size > 0 and debug.stat().st_size > 0
    rows = [line.split() for line in out.splitlines() if line.startswith(("linear", "relu"))]
    assert [r[0].rstrip(",") for r in rows] == ["linear", "relu", "linear_1"], out
    assert all(float(r[-1]) < 1e-10 for r in rows), out


def test_interpreter_observer_sees_each_node_and_its_output():
    from mps_backend.serialization.model import DataType  # noqa: PLC0415
    from tests.runtime.helpers import GraphSpec  # noqa: PLC0415

    g = GraphSpec()
    x = torch.tensor([1.0, -2.0])
    a = g.input(x)
    b = g.value(DataType.float32, [2])
    c = g.value(DataType.float32, [2])
    g.node("MPSNeg", input1_id=a, output_id=b)
    g.node("MPSAbs", input1_id=b, output_id=c)
    g.output(c)
    seen = []

    class Observer:
        def begin(self, index, node):
            seen.append(("begin", index, node.op))

        def end(self, index, node, outputs):
            seen.append(("end", index, [o.tolist() for o in outputs]))

    (y,) = Interpreter(g.blob()).run_with_report([x], Observer())[0]
    assert y.tolist() == [1.0, 2.0]
    assert seen == [("begin", 0, "MPSNeg"), ("end", 0, [[-1.0, 2.0]]), ("begin", 1, "MPSAbs"), ("end", 1, [[1.0, 2.0]])]


def test_numeric_gap_pairs_multi_node_ops_and_multi_output_nodes(tmp_path, capsys):
    """The demo model has a layer norm (an MPS node whose main result is its second output field) and
    matmuls that edge decomposes into expand/view/bmm/view under one debug handle: each row compares the
    source op's result (it used to compare the first of those nodes, or the layer norm's mean, and the
    Inspector failed on the shape mismatch)."""
    from mps_backend.tools.demo import demo_model

    model, inputs = demo_model()
    result = export_model(model, list(inputs), use_fp16=False, etrecord=True)
    pte, record = tmp_path / "demo.pte", tmp_path / "demo_etrecord.bin"
    pte.write_bytes(result.pte)
    result.etrecord.save(str(record))
    assert main(["run", str(pte), "--etrecord", str(record), "--etdump", str(tmp_path / "d.etdp")]) == 0
    table = capsys.readouterr().out.split("\nops ", 1)[1].splitlines()[1:]
    rows = {line.split()[0].rstrip(","): float(line.split()[-1]) for line in table if line.strip()}
    assert {"layer_norm", "matmul", "matmul_1", "softmax", "linear_3"} <= set(rows), rows
    assert max(rows.values()) < 1e-10, rows
