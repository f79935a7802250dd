"""Issue #26 item 6: every ``.pte`` that ``export`` writes loads in the emulated runtime. A model with nodes
the partitioner leaves on CPU, exported the way users export (:func:`mps_backend.export.export_model`,
defaults: fp16, target runtime executorch 1.0), must be refused at export with one typed line naming the
missing kernel or operator, or give a program that loads and runs (``run_pte``) with eager's outputs.

The op table's CPU rows (``cpu_reason``) are swept by ``tests/ops/harness.py::check_cpu`` on their cached
lowering. Here: the cases of ExecuTorch's backend operator suite that are not fully delegated
(docs/operator-suite.md, "Expected CPU fallback": no case is partially delegated, 7 per flow have nothing
delegated), all of their kinds, with the suite's own model classes: ``median.dim`` values only and with
indices (5 cases in the suite, one model class each here: the same operator and refusal; the second by
the refusal test below), and ``mean`` to float64 (both suite cases). Plus the op table's CPU topk through
``export_model``: it ended in an untyped ``NotImplementedError`` in ``to_executorch`` (torch's named result
tuple as the output), and its out-of-bounds ``as_strided_copy`` (a program that loaded, then failed at run).
"""

from __future__ import annotations

import pytest
import torch
from executorch.backends.test.suite.operators.test_mean import MeanModel
from executorch.backends.test.suite.operators.test_median import MedianModel, MedianValueOnlyModel

from mps_backend.export import TOLERANCE, InvalidModelError, UnsupportedOperatorError, export_model

from .ops.harness import check_exported_program_runs


class _TopkUnsorted(torch.nn.Module):
    def forward(self, x):
        return torch.topk(x, 3, sorted=False)  # a torch.return_types.topk


CASES = {
    "suite-median-dim-values": (lambda: MedianValueOnlyModel(dim=1), (5, 10), "refused"),
    "suite-mean-float64": (lambda: MeanModel(dtype=torch.float64), (5, 10), "ran"),
    "suite-mean-dim-float64": (lambda: MeanModel(dim=1, dtype=torch.float64), (5, 10), "ran"),
    "table-topk-unsorted": (_TopkUnsorted, (3, 8), "ran"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_export_is_refused_or_loads_and_runs(name):
    make, shape, expected = CASES[name]
    torch.manual_seed(0)
    model, inputs = make().eval(), (torch.randn(*shape),)
    verdict = check_exported_program_runs(lambda: export_model(model, inputs).pte, model, inputs, TOLERANCE[True])
    assert verdict == expected


def test_not_core_operator_refusal_names_the_operator_and_node():
    """``median.dim`` (values and indices, a named result tuple): not core ATen, no decomposition, no MPS
    lowering: executorch's edge verifier raised an untyped ``SpecViolationError`` in ``export_model``."""
    with pytest.raises(UnsupportedOperatorError, match=r"^aten\.median\.dim \(node median\): no MPS lowering"):
        export_model(MedianModel(dim=0), (torch.randn(5, 10),))


def test_out_of_bounds_as_strided_is_refused_at_export():
    """The op table's ``as_strided_copy`` reading element 15 of a 12-element input: the partitioner leaves it on
    CPU and the program loaded, then failed at run time ("out of bounds for storage", as eager does)."""

    class Overrun(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.as_strided_copy(x, (4, 4), (4, 1))

    with pytest.raises(InvalidModelError, match=r"^node \S+: as_strided_copy reading element 15 of a 12-element input"):
        export_model(Overrun(), (torch.randn(3, 4),))
