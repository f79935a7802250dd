"""The op table: every row of every ``rows_*.py`` file of this folder, per precision (see harness.py)."""

from __future__ import annotations

import importlib
import pathlib

import pytest

from . import harness

_FILES = sorted(p.stem for p in pathlib.Path(__file__).parent.glob("rows_*.py"))
ROWS = [r for name in _FILES for r in importlib.import_module(f"{__package__}.{name}").ROWS]


def _params():
    for r in ROWS:
        marks = [pytest.mark.xfail(reason=r.xfail, strict=True)] if r.xfail else []
        if r.cpu_reason:
            yield pytest.param(r, None, id=f"{r.id}-cpu", marks=marks)
        else:
            for p in r.precisions:
                yield pytest.param(r, p, id=f"{r.id}-{p}", marks=marks)


@pytest.mark.parametrize(("row", "precision"), list(_params()))
def test_op(row, precision):
    if precision is None:
        harness.check_cpu(row)
    else:
        harness.check_row(row, precision)


def test_rows_are_well_formed():
    ids = [r.id for r in ROWS]  # <target>-<case>
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    for r in ROWS:
        assert not r.kinds & harness.BANNED, r.id
        assert not (r.cpu_reason and r.kinds), f"{r.id}: a CPU row expects no node kinds"


#: union members no row has to emit, and why
NOT_EMITTED = {
    "MPSMin": "never emitted: the runtime has no dispatch case",
    "MPSMax": "never emitted: the runtime has no dispatch case",
    "MPSAtan2": "never emitted: the runtime has no dispatch case",
    "MPSLogSoftmax": "never emitted: the device computes log(softmax(x)), which underflows in f16",
    "MPSDequantizePerChannelGroup": "emitted by the quantized lowerings, proven in tests/test_quant.py",
}


def test_every_dispatched_union_member_is_emitted_by_some_row():
    from mps_backend.serialization.model import UNION_MEMBERS

    emitted = set().union(*(r.kinds for r in ROWS if not r.xfail and not r.cpu_reason))
    missing = set(UNION_MEMBERS) - emitted - set(NOT_EMITTED)
    assert not missing, f"union members no op-table row proves emitted: {sorted(missing)}"


#: registered targets without a row of their own, and why (a target registered later needs a row)
NO_ROW = {
    **dict.fromkeys(
        [
            "aten._to_copy.default",
            "aten._unsafe_view.default",
            "aten._upsample_nearest_exact2d.default",
            "aten.arange.default",
            "aten.arange.start",
            "aten.bitwise_or.Tensor",
            "aten.clamp_max.default",
            "aten.clamp_min.default",
            "aten.clone.default",
            "aten.detach_copy.default",
            "aten.div.Scalar",
            "aten.div.Scalar_mode",
            "aten.empty.memory_format",
            "aten.empty_like.default",
            "aten.floor_divide.Scalar",
            "aten.floor_divide.default",
            "aten.ones.default",
            "aten.ones_like.default",
            "aten.replication_pad3d.default",
            "aten.rsub.Scalar",
            "aten.rsub.Tensor",
            "aten.squeeze_copy.default",
            "aten.squeeze_copy.dim",
            "aten.sum.default",
            "aten.unfold.default",
            "aten.upsample_bilinear2d.default",
            "aten.upsample_nearest2d.default",
            "aten.zeros.default",
            "aten.zeros_like.default",
            "dim_order_ops._clone_dim_order.default",
        ],
        "open (#25): no row's edge graph holds it as its target (the edge decompositions rewrite it, or it "
        "only appears beside another row's target)",
    ),
    "<built-in function getitem>": "not an operator: multi-output nodes, in every max/topk/batch-norm row",
    **dict.fromkeys(
        [
            "quantized_decomposed.choose_qparams_per_token.default",
            "quantized_decomposed.choose_qparams_per_token_asymmetric.default",
            "quantized_decomposed.dequantize_per_channel_group.default",
            "quantized_decomposed.dequantize_per_token.default",
            "quantized_decomposed.quantize_per_token.default",
            "torchao.choose_qparams_affine.default",
            "torchao.dequantize_affine.default",
            "torchao.quantize_affine.default",
        ],
        "quantized lowerings: proven in tests/test_quant.py",
    ),
}


def test_every_registered_target_has_a_row():
    from mps_backend.operators.registry import default_registry

    registered = {str(t) for t in default_registry().targets}
    missing = registered - {str(r.target) for r in ROWS} - set(NO_ROW)
    assert not missing, f"registered targets without an op-table row: {sorted(missing)}"
    stale = set(NO_ROW) & ({str(r.target) for r in ROWS} | (set(NO_ROW) - registered))
    assert not stale, f"NO_ROW lists targets that have a row or are not registered: {sorted(stale)}"
