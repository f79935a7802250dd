"""Device facts live in one module (serialization/device_facts.py) and every layer uses it."""

from __future__ import annotations

import pytest
import torch

from mps_backend.builder import GraphBuilder
from mps_backend.serialization import device_facts, reader
from mps_backend.serialization.generated import nodes as N
from mps_backend.serialization.model import Node


def test_builder_refuses_node_kinds_the_runtime_cannot_dispatch():
    b = GraphBuilder(use_fp16=False)
    x = b.new_value(torch.float32, [2])
    for op in sorted(device_facts.NOT_DISPATCHED):
        with pytest.raises(ValueError, match="never dispatched"):
            b.emit(N.KINDS[op](input1_id=x, input2_id=x, output_id=b.new_value(torch.float32, [2])))
    b.emit(N.MPSMinimum(input1_id=x, input2_id=x, output_id=b.new_value(torch.float32, [2])))
    assert [n.op for n in b.graph.nodes] == ["MPSMinimum"]


def test_one_source_for_reader_and_tools():
    assert reader.NOT_DISPATCHED is device_facts.NOT_DISPATCHED
    assert reader.OUTPUT_FIELDS is device_facts.OUTPUT_FIELDS
    node = Node("MPSConv2D", {"input1_id": 0, "input2_id": 1, "input3_id": -1, "output_id": 3, "groups": 1})
    assert device_facts.node_value_ids(node.fields, outputs=False) == [0, 1, -1]
    assert device_facts.node_value_ids(node.fields, outputs=True) == [3]
