"""Typed node emission: a lowering that forgets, misspells or mistypes a field fails where it builds the
node (the error names the fx node, the member and the field), not in the writer; the generated classes
mirror the schema."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from executorch.exir import to_edge

from mps_backend import backend
from mps_backend.backend import LoweringBug, build_graph
from mps_backend.operators import registry as reg
from mps_backend.serialization.device_facts import NEUTRAL_FIELDS, NULLABLE
from mps_backend.serialization.generated import nodes as N
from mps_backend.serialization.model import UNION_MEMBERS, member_fields


@pytest.fixture(scope="module")
def relu_program():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1.0

    return to_edge(torch.export.export(M(), (torch.randn(2, 3),))).exported_program()


BROKEN = {
    # (fields the broken lowering passes, words the error must contain)
    "missing": (dict(input1_id=0, output_id=1), ["MPSReLU", "input2_id", "missing"]),
    "misspelled": (dict(input1_id=0, input_2_id=-1, output_id=1), ["MPSReLU", "input_2_id", "unexpected"]),
    "mistyped": (dict(input1_id=0, input2_id=-1.0, output_id=1), ["MPSReLU.input2_id", "must be int", "float"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_lowering_with_a_bad_field_fails_at_its_call(case, relu_program, monkeypatch):
    fields, words = BROKEN[case]
    registered = reg.default_registry()
    relu = registered.lowering(torch.ops.aten.relu.default)

    def broken_relu(node, b):
        b.out(node)
        b.emit(N.MPSReLU(**fields))

    unique = {id(low): low for low in registered._table.values()}.values()
    lowerings = [dataclasses.replace(relu, lower=broken_relu) if low is relu else low for low in unique]
    monkeypatch.setattr(backend, "default_registry", lambda: reg.Registry(lowerings))
    with pytest.raises(LoweringBug) as err:
        build_graph(relu_program, precision=False)
    message = str(err.value)
    assert "aten_relu_default" in message, message
    for word in words:
        assert word in message, message
    assert isinstance(err.value.__cause__, TypeError)
    # the failure happened in the lowering's own frame, before anything reached the graph or the writer
    assert "broken_relu" in [code.co_name for code in _frames(err.value.__cause__)]


def _frames(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame.f_code
        tb = tb.tb_next


def test_node_classes_mirror_the_schema():
    assert list(N.KINDS) == list(UNION_MEMBERS)
    for member, cls in N.KINDS.items():
        assert cls.KIND == member and cls.TABLE == UNION_MEMBERS[member]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert list(fields) == member_fields(member) == [name for name, _ in cls.FIELDS]
        for name, f in fields.items():
            assert f.kw_only
            neutral = NEUTRAL_FIELDS.get((member, name), dataclasses.MISSING)
            assert f.default == neutral or (f.default is neutral), (member, name)
            assert ("str?" == dict(cls.FIELDS)[name]) == ((member, name) in NULLABLE and f.type == "str | None")
    with pytest.raises(TypeError, match="table _MPSNode2x1, not a node kind"):
        N.MPSNode2x1Table(input1_id=0, input2_id=1, output_id=2)
    with pytest.raises(TypeError, match=r"MPSView.shape must be a list of int, got tuple"):
        N.MPSView(input1_id=0, output_id=1, num_dims=2, shape=(2, 3))
    with pytest.raises(TypeError, match=r"MPSGELU.approximate must be str, got NoneType"):  # the device reads it
        N.MPSGELU(input1_id=0, output_id=1, approximate=None)
    assert N.MPSDiv(input1_id=0, input2_id=1, output_id=2).fields() == {
        "input1_id": 0,
        "input2_id": 1,
        "output_id": 2,
        "rounding_mode": None,
    }
