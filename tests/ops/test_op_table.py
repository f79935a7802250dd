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
    ids = [r.id for r in ROWS]
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
