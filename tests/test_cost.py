"""The device cost model (mps_backend/cost.py) on hand-built MPS graphs whose byte counts are worked out
by hand, and on one exported program with a mutable buffer (CPU kernel, state, floor, CLI)."""

from __future__ import annotations

import json

import pytest
import torch

from mps_backend.cost import cost_of_program, graph_cost
from mps_backend.serialization.model import DataType, Graph, Node, Tensor

F16, I64, I4 = DataType.float16, DataType.int64, DataType.int4


def graph(values, nodes, inputs, outputs, constants=()):
    return Graph(
        nodes=[Node(op, fields) for op, fields in nodes],
        values=[Tensor(dt, list(dims)) for dt, dims in values],
        input_ids=list(inputs),
        output_ids=list(outputs),
        constant_ids=list(constants),
    )


def roles(t):
    return {k: v for k, v in t.by_role.items() if v}


def test_linear_with_a_permuted_weight():
    # x [1,64] (128 B) @ permute(W [32,64] constant, 4096 B) -> [1,32] (64 B)
    g = graph(
        [(F16, (1, 64)), (F16, (32, 64)), (F16, (64, 32)), (F16, (1, 32))],
        [("MPSPermute", {"input1_id": 1, "output_id": 2}), ("MPSMatMul", {"input1_id": 0, "input2_id": 2, "output_id": 3})],
        inputs=[0],
        outputs=[3],
        constants=[1],
    )
    c = graph_cost(g)
    # naive: the permute reads and writes the weight (8192), the matmul reads x and it, writes y
    assert (c.naive.read, c.naive.written) == (4096 + 128 + 4096, 4096 + 64)
    assert roles(c.naive) == {"weights": 4096, "weight-derived": 8192, "activations": 192}
    # fused: the permute is folded into the matmul, which reads the weight itself
    assert (c.fused.read, c.fused.written) == (4096 + 128, 64)
    assert roles(c.fused) == {"weights": 4096, "activations": 192}
    assert [n.naive for n in c.nodes] == [8192, 4288] and [n.fused for n in c.nodes] == [0, 4288]
    assert (c.constants, c.state, c.rows) == (4096, 0, 0)
    assert c.nodes_by_kind == {"MPSPermute": 1, "MPSMatMul": 1}


def test_elementwise_chain_is_one_kernel_when_fused_and_reshapes_are_free():
    # a = x*x; b = sigmoid(a); c = a + b; out = view(c): x is 2048 bytes, so is every value
    g = graph(
        [(F16, (1024,))] * 4 + [(F16, (32, 32))],
        [
            ("MPSMul", {"input1_id": 0, "input2_id": 0, "output_id": 1}),
            ("MPSSigmoid", {"input1_id": 1, "output_id": 2}),
            ("MPSAdd", {"input1_id": 1, "input2_id": 2, "output_id": 3, "alpha": 1.0}),
            ("MPSView", {"input1_id": 3, "output_id": 4}),
        ],
        inputs=[0],
        outputs=[4],
    )
    c = graph_cost(g)
    assert [n.naive for n in c.nodes] == [4096, 4096, 6144, 0]  # x*x reads x once
    assert c.naive.total == 14336
    assert [n.fused for n in c.nodes] == [0, 0, 4096, 0]  # reads x once, writes c
    assert (c.fused.read, c.fused.written) == (2048, 2048)


def test_a_value_an_elementwise_chain_shares_with_a_matmul_is_written():
    # a = x*x feeds an add (elementwise) and a matmul: a stays materialized
    g = graph(
        [(F16, (8, 8))] * 4,
        [
            ("MPSMul", {"input1_id": 0, "input2_id": 0, "output_id": 1}),
            ("MPSAdd", {"input1_id": 1, "input2_id": 0, "output_id": 2, "alpha": 1.0}),
            ("MPSMatMul", {"input1_id": 1, "input2_id": 2, "output_id": 3}),
        ],
        inputs=[0],
        outputs=[3],
    )
    c = graph_cost(g)
    assert [n.fused for n in c.nodes] == [256, 384, 384]


def test_embedding_reads_only_the_rows_it_gathers():
    # table [100,16] (3200 B), 3 int64 indices (24 B) -> [1,3,16] (96 B)
    g = graph(
        [(F16, (100, 16)), (I64, (1, 3)), (F16, (1, 3, 16))],
        [("MPSEmbedding", {"input1_id": 0, "input2_id": 1, "output_id": 2})],
        inputs=[1],
        outputs=[2],
        constants=[0],
    )
    c = graph_cost(g)
    assert c.naive.total == c.fused.total == 96 + 24 + 96
    assert roles(c.naive) == {"weights": 96, "activations": 120}
    assert c.constants == 96  # the floor reads the rows taken, not the table
    g.nodes.append(Node("MPSMatMul", {"input1_id": 2, "input2_id": 0, "output_id": 2}))  # a tied lm_head
    assert graph_cost(g).constants == 3200


def test_kv_cache_update_expand_and_transpose():
    # new = index_put(cache [1,2,8,4] (128 B, state), [pos] (8 B), rows [1,2,1,4] (16 B)); also an output;
    # kt = permute(expand(new -> [1,4,8,4], 256 B)); out = q [1,4,1,4] (32 B) @ kt -> [1,4,1,8] (64 B)
    g = graph(
        [
            (F16, (1, 2, 8, 4)),
            (I64, (1,)),
            (F16, (1, 2, 1, 4)),
            (F16, (1, 4, 1, 4)),
            (F16, (1, 2, 8, 4)),
            (F16, (1, 4, 8, 4)),
            (F16, (1, 4, 4, 8)),
            (F16, (1, 4, 1, 8)),
        ],
        [
            (
                "MPSIndexPut",
                {"input1_id": 0, "indices_id": [-1, -1, 1], "values_shape": [1, 2, 1, 4], "values_id": 2, "output_id": 4},
            ),
            ("MPSExpand", {"input1_id": 4, "output_id": 5}),
            ("MPSPermute", {"input1_id": 5, "output_id": 6}),
            ("MPSMatMul", {"input1_id": 3, "input2_id": 6, "output_id": 7}),
        ],
        inputs=[0, 1, 2, 3],
        outputs=[4, 7],
    )
    c = graph_cost(g, state=[0])
    assert [n.naive for n in c.nodes] == [280, 384, 512, 352]
    assert roles(c.naive) == {"state": 128, "state copies": 1280, "activations": 120}
    # fused: expand and permute folded, the matmul reads the 128-byte new cache
    assert [n.fused for n in c.nodes] == [280, 0, 0, 224]
    assert (c.state, c.rows, c.constants) == (128, 16, 0)


def test_int4_dequantize_folds_into_its_matmul_through_a_permute():
    # W int4 [32,64] (1024 B), scales [32,2] (128 B) -> dequantized [32,64] (4096 B) -> permute -> matmul
    g = graph(
        [(F16, (1, 64)), (I4, (32, 64)), (F16, (32, 2)), (F16, (32, 64)), (F16, (64, 32)), (F16, (1, 32))],
        [
            ("MPSDequantizePerChannelGroup", {"input1_id": 1, "scales_id": 2, "zero_points_id": 2, "output_id": 3}),
            ("MPSPermute", {"input1_id": 3, "output_id": 4}),
            ("MPSMatMul", {"input1_id": 0, "input2_id": 4, "output_id": 5}),
        ],
        inputs=[0],
        outputs=[5],
        constants=[1, 2],
    )
    c = graph_cost(g)
    assert [n.naive for n in c.nodes] == [1152 + 4096, 8192, 128 + 4096 + 64]
    assert roles(c.naive)["weight-derived"] == 4096 * 4
    assert [n.fused for n in c.nodes] == [0, 0, 128 + 1024 + 128 + 64]
    assert c.constants == 1152
    # a dequantized weight also read by something else than a matmul stays materialized (here an add
    # whose result is a graph output; before #43 the add wrote over the matmul's operand, which now
    # counts as a weight chain into the matmul)
    g.values.append(Tensor(F16, [32, 64]))
    g.output_ids.append(6)
    g.nodes.append(Node("MPSAdd", {"input1_id": 3, "input2_id": 3, "output_id": 6, "alpha": 1.0}))
    assert graph_cost(g).nodes[0].fused == 1152 + 4096


def test_dequantize_with_offsets_folds_into_its_matmul():
    """#43: an int4 weight, its float16 scales and its per-group offsets (``MPSAdd`` of a ``[N, G, 1]``
    constant over a ``[N, G, K/G]`` view, the float32 program's casts between): the matmul reads the
    packed weight, the scales and the offsets, and nothing weight-sized is written; the floor counts
    the offsets. An offset add whose result also goes elsewhere than to matmuls is written."""
    F32 = DataType.float32
    # 0 x [1,64] f32; 1 W int4 [32,64] (1024 B); 2 scales [32,2] (128 B); 3 offsets [32,2] f16 (128 B);
    # 4 dequantized f16 [32,64]; 5 cast f32; 6 view [32,2,32]; 7 offsets cast f32; 8 view [32,2,1];
    # 9 add [32,2,32] f32; 10 view [32,64]; 11 permute [64,32]; 12 out [1,32] f32
    values = [(F32, (1, 64)), (I4, (32, 64)), (F16, (32, 2)), (F16, (32, 2)), (F16, (32, 64)), (F32, (32, 64))]
    values += [(F32, (32, 2, 32)), (F32, (32, 2)), (F32, (32, 2, 1)), (F32, (32, 2, 32)), (F32, (32, 64)), (F32, (64, 32))]
    values += [(F32, (1, 32))]
    nodes = [
        ("MPSDequantizePerChannelGroup", {"input1_id": 1, "scales_id": 2, "zero_points_id": -1, "output_id": 4}),
        ("MPSCast", {"input1_id": 4, "output_id": 5}),
        ("MPSView", {"input1_id": 5, "output_id": 6}),
        ("MPSCast", {"input1_id": 3, "output_id": 7}),
        ("MPSView", {"input1_id": 7, "output_id": 8}),
        ("MPSAdd", {"input1_id": 6, "input2_id": 8, "output_id": 9, "alpha": 1.0}),
        ("MPSView", {"input1_id": 9, "output_id": 10}),
        ("MPSPermute", {"input1_id": 10, "output_id": 11}),
        ("MPSMatMul", {"input1_id": 0, "input2_id": 11, "output_id": 12}),
    ]
    g = graph(values, nodes, inputs=[0], outputs=[12], constants=[1, 2, 3])
    c = graph_cost(g)
    assert [n.fused for n in c.nodes] == [0] * 8 + [256 + 1024 + 128 + 128 + 128]
    assert c.constants == 1024 + 128 + 128 and roles(c.fused) == {"weights": 1280, "activations": 384}
    assert c.fused.total == 1024 + 128 + 128 + 256 + 128  # the floor's constants, x and the output
    # the offset add's result also a graph output: written (and the dequantize with it)
    g.output_ids.append(9)
    assert graph_cost(g).nodes[5].fused > 0 and graph_cost(g).nodes[0].fused > 0


def test_int8_cast_scale_and_offset_fold_into_their_matmul():
    """An int8 weight (``--quantize int8``: a 1-byte constant, ``MPSCast``, ``MPSMul`` by its per-row scale,
    ``MPSAdd`` of its per-row offset, then a permute into the matmul): the matmul reads the int8 weight,
    the scales and the offsets; nothing weight-sized is written. Before #43 item 5 the add's result was
    written and read as a float16 activation (Whisper-tiny's int8 decode step: 147.8 MiB fused, 3.81x its
    floor, now 40.3 MiB, 1.04x)."""
    I8 = DataType.int8
    # 0 x [1,64] f16; 1 W int8 [32,64] (2048 B); 2 scales [32,1] f16 (64 B); 3 offsets [32,1] f16 (64 B);
    # 4 cast f16 [32,64]; 5 mul; 6 add; 7 permute [64,32]; 8 out [1,32]
    values = [(F16, (1, 64)), (I8, (32, 64)), (F16, (32, 1)), (F16, (32, 1)), (F16, (32, 64)), (F16, (32, 64))]
    values += [(F16, (32, 64)), (F16, (64, 32)), (F16, (1, 32))]
    nodes = [
        ("MPSCast", {"input1_id": 1, "output_id": 4}),
        ("MPSMul", {"input1_id": 4, "input2_id": 2, "output_id": 5}),
        ("MPSAdd", {"input1_id": 5, "input2_id": 3, "output_id": 6, "alpha": 1.0}),
        ("MPSPermute", {"input1_id": 6, "output_id": 7}),
        ("MPSMatMul", {"input1_id": 0, "input2_id": 7, "output_id": 8}),
    ]
    g = graph(values, nodes, inputs=[0], outputs=[8], constants=[1, 2, 3])
    c = graph_cost(g)
    assert [n.fused for n in c.nodes] == [0, 0, 0, 0, 128 + 2048 + 64 + 64 + 64]
    assert roles(c.fused) == {"weights": 2048 + 64 + 64, "activations": 128 + 64}
    assert c.fused.total == c.constants + 128 + 64  # at the floor: the constants once, x and the output
    # naive: the cast, the scale, the offset and the permute each write a float16 copy of the weight (4096 B)
    # that the next node reads
    assert roles(c.naive)["weight-derived"] == 4 * 4096 * 2
    # the scaled weight also a graph output: the chain up to it is written
    g.output_ids.append(5)
    assert graph_cost(g).nodes[1].fused > 0


@pytest.fixture(scope="module")
def buffer_pte(tmp_path_factory):
    from mps_backend.export import export_model

    class Accumulate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("acc", torch.zeros(4, 8))

        def forward(self, x):
            self.acc.add_(x)
            return self.acc * 2

    path = tmp_path_factory.mktemp("cost") / "acc.pte"
    path.write_bytes(export_model(Accumulate().eval(), [torch.randn(4, 8)], use_fp16=False).pte)
    return path


def test_program_with_a_mutable_buffer(buffer_pte):
    c = cost_of_program(buffer_pte)
    # the buffer (4x8 float32) is state: the delegate returns its new value, aten::copy_ writes it back
    assert c.cpu_kernels == {"aten::copy_.default": 1}
    assert (c.cpu.read, c.cpu.written) == (128, 128)
    assert c.floor_parts["state"] == 128 and c.floor_parts["outputs"] == 128
    assert c.floor == sum(c.floor_parts.values())
    add = next(n for n in c.worst if n.kind == "MPSAdd")
    assert add.naive == add.fused == 128 * 3  # reads the buffer and x, writes the new buffer
    assert c.naive.total == sum(n.naive for n in c.worst) and c.fused.total == sum(n.fused for n in c.worst)
    assert c.naive.by_role["state"] == 128 + 128  # the add reads it, copy_ writes it
    assert "not a device measurement" in c.format()


def test_cli(buffer_pte, capsys):
    from mps_backend.tools.cli import main

    assert main(["cost", str(buffer_pte), "--json", "--top", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["method"] == "forward" and len(d["worst"]) == 2
    assert d["naive_ratio"] == pytest.approx(d["naive"]["total"] / d["floor"], abs=1e-4)
    assert "not a device measurement" in d["note"]
    assert main(["cost", str(buffer_pte)]) == 0
    assert "x the floor" in capsys.readouterr().out
    assert main(["cost", str(buffer_pte), "--method", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the program has no method 'nope'") and err.count("\n") == 1


def test_zoo_result_has_the_cost_ratios():
    from harness import zoo

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    r = zoo.check("tiny", False, (model, (torch.randn(2, 8),)), run=False)
    assert 1 <= r.fused_ratio <= r.naive_ratio < 10


def test_cpu_kv_cache_row_write_counts_only_the_rows(tmp_path):
    """#23: a cache read by the delegate and written after it (the decode step's KV-cache write): the
    index_put stays on CPU and becomes index_put_ (no aten::copy_), which reads its rows and index and
    writes only the rows, never the whole 256-byte cache."""
    from mps_backend.export import export_model
    from mps_backend.partitioner import CACHE_WRITE_REASON

    class RowWrite(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(1, 2, 8, 4))  # float32: 256 B

        def forward(self, x, pos):
            out = self.cache.sum(2, keepdim=True) + x  # reads the old cache: [1, 2, 1, 4]
            torch.ops.aten.index_put_(self.cache, [None, None, pos], x * 3)  # rows [1, 2, 1, 4]: 32 B
            return out

    res = export_model(RowWrite().eval(), [torch.randn(1, 2, 1, 4), torch.tensor([5])], use_fp16=False)
    assert [n.reason for n in res.report.on_cpu] == [CACHE_WRITE_REASON], res.report
    c = cost_of_program(res.pte)
    assert c.cpu_kernels == {"aten::index_put_.default": 1}
    # reads the rows (32 B) and the int64 index (8 B); writes the rows into the cache (state)
    assert (c.cpu.read, c.cpu.written) == (32 + 8, 32)
    assert c.cpu.by_role["state"] == 32
    assert c.floor_parts["rows written"] == 32 and c.floor_parts["state"] == 256
    from mps_backend.runtime import LoadedMethod

    step, model = LoadedMethod(res.pte), RowWrite().eval()
    for pos in (5, 2, 5):  # each step sees the rows the earlier steps wrote (the last one overwrites)
        x = torch.randn(1, 2, 1, 4)
        torch.testing.assert_close(step([x, torch.tensor([pos])])[0], model(x, torch.tensor([pos])))
