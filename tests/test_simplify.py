"""simplify: reshape chains collapse into one MPSView, dead nodes and unread constants leave the
graph, and the device model computes the same outputs before and after."""

from __future__ import annotations

import copy

import torch

from mps_backend.builder import GraphBuilder
from mps_backend.runtime.interpreter import execute
from mps_backend.serialization.reader import read_blob
from mps_backend.serialization.writer import write_blob
from mps_backend.simplify import simplify


def _graph():
    """x [2, 3, 4] -> unsqueeze -> view [6, 4] -> view [4, 6] -> + w; plus a dead branch and a view
    of a relu (not a reshape: stays)."""
    b = GraphBuilder(use_fp16=False)
    x = b.new_value(torch.float32, [2, 3, 4])
    b.graph.input_ids = [x]
    w = b.constant(torch.arange(24, dtype=torch.float32).reshape(4, 6))
    unused_w = b.constant(torch.ones(4, 6))
    b.current = "unsqueeze"
    u = b.emit_value("MPSUnsqueeze", torch.float32, [2, 1, 3, 4], input1_id=x, dim=1)
    b.current = "view1"
    v1 = b.emit_value("MPSView", torch.float32, [6, 4], input1_id=u, num_dims=2, shape=[6, 4])
    b.current = "view2"
    v2 = b.emit_value("MPSView", torch.float32, [4, 6], input1_id=v1, num_dims=2, shape=[4, 6])
    b.current = "add"
    y = b.emit_value("MPSAdd", torch.float32, [4, 6], input1_id=v2, input2_id=w, alpha=1.0)
    b.current = "dead"
    dead = b.emit_value("MPSMul", torch.float32, [4, 6], input1_id=y, input2_id=unused_w)
    b.emit_value("MPSExp", torch.float32, [4, 6], input1_id=dead)
    b.current = "relu"
    r = b.emit_value("MPSReLU", torch.float32, [2, 3, 4], input1_id=x, input2_id=-1)
    z = b.emit_value("MPSView", torch.float32, [24], input1_id=r, num_dims=1, shape=[24])
    b.graph.output_ids = [y, z]
    return b, unused_w


def test_reshape_chain_dead_nodes_and_unread_constants():
    b, unused_w = _graph()
    before = write_blob(copy.deepcopy(b.graph), dict(b.constants))
    stats = simplify(b)
    # v2<-v1<-u rewired; u, v1, mul, exp dead
    assert stats == {
        "permutes composed": 0,
        "identity expands dropped": 0,
        "reshapes rewired": 2,
        "negations folded": 0,
        "duplicates merged": 0,
        "nodes removed": 4,
    }
    ops = [n.op for n in b.graph.nodes]
    assert ops == ["MPSView", "MPSAdd", "MPSReLU", "MPSView"]
    assert b.graph.nodes[0].fields["input1_id"] == b.graph.input_ids[0]  # view [4, 6] straight from x
    assert b.node_origin == ["view2", "add", "relu", "relu"]
    assert unused_w not in b.graph.constant_ids and unused_w not in b.constants
    after = write_blob(b.graph, b.constants)
    assert len(after) < len(before)
    x = torch.randn(2, 3, 4)
    for got, want in zip(execute(read_blob(after), [x]), execute(read_blob(before), [x])):
        assert torch.equal(got, want)


def test_graph_outputs_and_their_producers_stay():
    b = GraphBuilder(use_fp16=False)
    x = b.new_value(torch.float32, [2, 3])
    b.graph.input_ids = [x]
    b.current = None
    v1 = b.emit_value("MPSView", torch.float32, [3, 2], input1_id=x, num_dims=2, shape=[3, 2])
    v2 = b.emit_value("MPSView", torch.float32, [6], input1_id=v1, num_dims=1, shape=[6])
    b.graph.output_ids = [v1, v2]  # the intermediate view is itself an output
    simplify(b)
    assert [n.op for n in b.graph.nodes] == ["MPSView", "MPSView"]
    assert b.graph.nodes[1].fields["input1_id"] == x
    out = execute(read_blob(write_blob(b.graph, b.constants)), [torch.arange(6.0).reshape(2, 3)])
    assert out[0].shape == (3, 2) and torch.equal(out[1], torch.arange(6.0))


def test_expand_and_squeeze_consumers_are_not_rewired():
    b = GraphBuilder(use_fp16=False)
    x = b.new_value(torch.float32, [3])
    b.graph.input_ids = [x]
    b.current = None
    v = b.emit_value("MPSView", torch.float32, [1, 3], input1_id=x, num_dims=2, shape=[1, 3])
    s = b.emit_value("MPSSqueeze", torch.float32, [3], input1_id=v, dims=[0])
    e = b.emit_value("MPSExpand", torch.float32, [2, 3], input1_id=v, num_dims=2, shape=[2, 3])
    b.graph.output_ids = [s, e]
    assert simplify(b) == {
        "permutes composed": 0,
        "identity expands dropped": 0,
        "reshapes rewired": 0,
        "negations folded": 0,
        "duplicates merged": 0,
        "nodes removed": 0,
    }
    assert b.graph.nodes[1].fields["input1_id"] == v and b.graph.nodes[2].fields["input1_id"] == v


def test_identity_expand_is_bypassed():
    b = GraphBuilder(use_fp16=False)
    x = b.new_value(torch.float32, [2, 3])
    b.graph.input_ids = [x]
    b.current = None
    e = b.emit_value("MPSExpand", torch.float32, [2, 3], input1_id=x, num_dims=2, shape=[2, 3])
    y = b.emit_value("MPSExp", torch.float32, [2, 3], input1_id=e)
    b.graph.output_ids = [y]
    assert simplify(b)["identity expands dropped"] == 1
    assert [n.op for n in b.graph.nodes] == ["MPSExp"] and b.graph.nodes[0].fields["input1_id"] == x
    x0 = torch.randn(2, 3)
    assert torch.equal(execute(read_blob(write_blob(b.graph, b.constants)), [x0])[0], torch.exp(x0))


def _negation_graph(fold_input_dtype=torch.bool):
    """SDPA's guard: keep = not(s == -inf); rows = any-like flag; out = where(not(flag), 0, p)."""
    b = GraphBuilder(use_fp16=False)
    s = b.new_value(torch.float32, [2, 4])
    flag = b.new_value(fold_input_dtype, [2, 1])
    b.graph.input_ids = [s, flag]
    b.current = None
    eq = b.emit_value("MPSEq", torch.bool, [2, 4], input1_id=s, input2_id=b.scalar(float("-inf"), torch.float32))
    keep = b.emit_value("MPSLogicalNot", torch.bool, [2, 4], input1_id=eq)
    no_flag = b.emit_value("MPSLogicalNot", torch.bool, [2, 1], input1_id=flag)
    zero = b.scalar(0.0, torch.float32)
    out = b.emit_value("MPSWhere", torch.float32, [2, 4], input1_id=no_flag, input2_id=zero, input3_id=s)
    b.graph.output_ids = [keep, out]
    return b


def test_negations_fold_into_comparisons_and_where():
    b = _negation_graph()
    before = write_blob(copy.deepcopy(b.graph), dict(b.constants))
    stats = simplify(b)
    assert stats["negations folded"] == 2 and stats["nodes removed"] == 2
    assert [n.op for n in b.graph.nodes] == ["MPSNe", "MPSWhere"]
    where = b.graph.nodes[1].fields
    assert where["input1_id"] == 1 and where["input2_id"] == 0  # flag, branches swapped
    s = torch.tensor([[0.0, float("-inf"), float("nan"), 2.0], [float("-inf")] * 4])
    flag = torch.tensor([[True], [False]])
    after = write_blob(b.graph, b.constants)
    for got, want in zip(execute(read_blob(after), [s, flag]), execute(read_blob(before), [s, flag])):
        assert torch.equal(got, want) or torch.allclose(got, want, equal_nan=True)
    assert torch.equal(execute(read_blob(after), [s, flag])[0], ~(s == float("-inf")))


def test_where_of_a_non_bool_negation_is_left_alone():
    b = _negation_graph(fold_input_dtype=torch.float32)
    simplify(b)
    assert [n.op for n in b.graph.nodes] == ["MPSNe", "MPSLogicalNot", "MPSWhere"]


def test_duplicate_nodes_and_small_constants_merge():
    b = GraphBuilder(use_fp16=False)
    x = b.new_value(torch.float32, [2, 3])
    b.graph.input_ids = [x]
    b.current = None
    one_a = b.constant(torch.tensor([1.0]))
    one_b = b.constant(torch.tensor([1.0]))  # same bytes: one constant
    two = b.constant(torch.tensor([2.0]))
    s1 = b.emit_value("MPSSub", torch.float32, [2, 3], input1_id=x, input2_id=one_a, alpha=1.0)
    s2 = b.emit_value("MPSSub", torch.float32, [2, 3], input1_id=x, input2_id=one_b, alpha=1.0)  # = s1
    s3 = b.emit_value("MPSSub", torch.float32, [2, 3], input1_id=x, input2_id=two, alpha=1.0)
    c1 = b.emit_value("MPSClamp", torch.float32, [2, 3], min_max=(0.0, 1.0), input1_id=s1)
    c2 = b.emit_value("MPSClamp", torch.float32, [2, 3], min_max=(0.0, 2.0), input1_id=s2)  # other bounds
    e1 = b.emit_value("MPSExp", torch.float32, [2, 3], input1_id=s2)  # reads s1 after the merge
    e2 = b.emit_value("MPSExp", torch.float32, [2, 3], input1_id=s1)  # same as e1 but a graph output
    b.graph.output_ids = [c1, c2, s3, e1, e2]
    before = write_blob(copy.deepcopy(b.graph), dict(b.constants))
    stats = simplify(b)
    assert stats["duplicates merged"] == 1 and stats["nodes removed"] == 0
    assert [n.op for n in b.graph.nodes] == ["MPSSub", "MPSSub", "MPSClamp", "MPSClamp", "MPSExp", "MPSExp"]
    assert b.graph.nodes[3].fields["input1_id"] == s1 and b.graph.nodes[4].fields["input1_id"] == s1
    assert one_b not in b.graph.constant_ids and {one_a, two} <= set(b.graph.constant_ids)
    x_in = torch.randn(2, 3)
    for got, want in zip(execute(read_blob(write_blob(b.graph, b.constants)), [x_in]), execute(read_blob(before), [x_in])):
        assert torch.equal(got, want)
