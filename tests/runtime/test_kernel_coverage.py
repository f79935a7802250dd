"""Every MPSNodeUnion member has a device-model kernel; exactly MPSMin, MPSMax and MPSAtan2 (no
dispatch case in the runtime, semantics §2.7) map to kernels that raise DeviceError."""

from __future__ import annotations

import pytest
import torch

from mps_backend.runtime.core import DeviceError, KernelContext
from mps_backend.runtime.kernels import KERNELS, MODULES, build_kernels
from mps_backend.serialization import device_facts
from mps_backend.serialization.model import UNION_MEMBERS, Node, member_fields

NOT_DISPATCHED = tuple(sorted(device_facts.NOT_DISPATCHED))


def test_every_union_member_has_a_kernel():
    missing = [op for op in UNION_MEMBERS if op not in KERNELS]
    assert not missing, f"no kernel for {missing}"
    assert set(KERNELS) <= set(UNION_MEMBERS)


@pytest.mark.parametrize("op", NOT_DISPATCHED)
def test_not_dispatched_members_raise(op):
    fields = dict.fromkeys(member_fields(op), 0) | {"input2_id": 1, "output_id": 2}
    for mode in ("faithful", "aten"):
        ctx = KernelContext(values={0: torch.ones(2), 1: torch.ones(2)}, mode=mode)
        with pytest.raises(DeviceError, match="not dispatched"):
            KERNELS[op](ctx, Node(op, fields))
        assert 2 not in ctx.values


def test_only_those_members_share_the_not_dispatched_kernel():
    raisers = {op for op, fn in KERNELS.items() if fn is KERNELS["MPSMin"]}
    assert raisers == set(NOT_DISPATCHED)


def test_table_is_read_only_and_rebuilt_identically():
    with pytest.raises(TypeError):
        KERNELS["MPSAdd"] = None  # type: ignore[index]
    assert dict(build_kernels()) == dict(KERNELS)
    assert len(set(MODULES)) == len(MODULES)
